"""The StableHLO export read by an outside consumer: JAX's MLIR bindings parse and verify
each exported module, and JAX's XLA compiles and runs it on the inputs the NumPy
evaluator ran the HLO on; the results must agree. Modules: the lowered TF clusters of
stablehlo_corpus/ (convolution, pooling, gather, scatter, sort, topk, cumsum, softmax,
dot, pad, erf, cholesky, triangular-solve, bitcast, slices, integer ops), the JAX- and
XLA-printed modules of xla_dump_texts.py, the JAX control flow of jax_control_flow/
(while and conditional with tuple state), and the opcodes of issue #23.

JAX runs in a Python of its own (TFXLA_LITE_JAX_PYTHON, default /tmp/jaxvenv/bin/python;
make one with `python3 -m venv /tmp/jaxvenv && /tmp/jaxvenv/bin/pip install jax`): the
test skips, saying why, where there is none, and never installs anything."""
# ruff: noqa: E501  (XLA prints each instruction on one line, however long)

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from test_linalg_and_bit_ops import XLA_TEXT
from tolerances import assert_close
from xla_dump_texts import JAX_LOWERED, XLA_SCHEDULED

from tfxla_lite.cli import random_inputs
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.stablehlo import module_to_stablehlo

HERE = Path(__file__).resolve().parent

# The 2-byte floats and narrow integers: constants, converts, bits and a reduce.
HALF_TEXT = """\
HloModule halves

%max (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %m = bf16[] maximum(bf16[] %a, bf16[] %b)
}

ENTRY %main (x: f16[3,4], y: bf16[3,4], z: u8[3,4]) -> (f16[3,4], bf16[3], u16[3,4], s8[3,4], f32[6], f32[6]) {
  %x = f16[3,4]{1,0} parameter(0)
  %y = bf16[3,4]{1,0} parameter(1)
  %z = u8[3,4]{1,0} parameter(2)
  %c = f16[] constant(0.1)
  %cb = f16[3,4]{1,0} broadcast(f16[] %c), dimensions={}
  %sum = f16[3,4]{1,0} add(f16[3,4]{1,0} %x, f16[3,4]{1,0} %cb)
  %rounded = f16[3,4]{1,0} reduce-precision(f16[3,4]{1,0} %sum), exponent_bits=4, mantissa_bits=3
  %low = bf16[] constant(-inf)
  %top = bf16[3]{0} reduce(bf16[3,4]{1,0} %y, bf16[] %low), dimensions={1}, to_apply=%max
  %bits = u16[3,4]{1,0} bitcast-convert(bf16[3,4]{1,0} %y)
  %signed = s8[3,4]{1,0} convert(u8[3,4]{1,0} %z)
  %special = f32[6]{0} constant({nan, -nan, inf, 65520, 1e-05, 1.5})
  %no_mantissa = f32[6]{0} reduce-precision(f32[6]{0} %special), exponent_bits=5, mantissa_bits=0
  %some = f32[6]{0} reduce-precision(f32[6]{0} %special), exponent_bits=5, mantissa_bits=10
  ROOT %out = (f16[3,4]{1,0}, bf16[3]{0}, u16[3,4]{1,0}, s8[3,4]{1,0}, f32[6]{0}, f32[6]{0}) tuple(%rounded, %top, %bits, %signed, %no_mantissa, %some)
}
"""
RUNNER = HERE / "stablehlo_jax_runner.py"
JAX_PYTHON = os.environ.get("TFXLA_LITE_JAX_PYTHON", "/tmp/jaxvenv/bin/python")


def _jax_python() -> str:
    if not Path(JAX_PYTHON).exists():
        pytest.skip(f"no Python with JAX at {JAX_PYTHON} (set TFXLA_LITE_JAX_PYTHON, or "
                    "`python3 -m venv /tmp/jaxvenv && /tmp/jaxvenv/bin/pip install jax`)")
    found = subprocess.run([JAX_PYTHON, "-c", "import jax"], capture_output=True, text=True)
    if found.returncode:
        pytest.skip(f"{JAX_PYTHON} cannot import jax: {found.stderr.strip()[-200:]}")
    return JAX_PYTHON


def _cases() -> dict[str, tuple[str, list[np.ndarray]]]:
    cases: dict[str, tuple[str, list[np.ndarray]]] = {}
    for hlo in sorted((HERE / "stablehlo_corpus").glob("*.hlo")):
        stored = np.load(hlo.with_suffix(".npz"))
        cases[hlo.stem] = (hlo.read_text(), [stored[f"arr_{i}"] for i in range(len(stored))])
    texts = {"jax_lowered": JAX_LOWERED, "xla_scheduled": XLA_SCHEDULED, "halves": HALF_TEXT}
    for path in sorted((HERE / "jax_control_flow").glob("*.hlo")):
        texts[path.stem] = path.read_text()
    for name, text in texts.items():
        cases[name] = (text, random_inputs(parse_module(text), seed=0))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 3)).astype(np.float32)
    spd = x @ np.swapaxes(x, 1, 2) + 3 * np.eye(3, dtype=np.float32)
    cases["issue_23_opcodes"] = (XLA_TEXT, [spd, rng.standard_normal((2, 3, 4)).astype(np.float32),
                                            np.array([7, 2**64 - 1, 3], np.uint64)])
    return cases


@pytest.mark.slow
def test_jax_parses_verifies_and_runs_the_export(tmp_path: Path) -> None:
    python = _jax_python()
    cases = _cases()
    stored: dict[str, np.ndarray] = {"count": np.array(len(cases))}
    expected = {}
    for k, (name, (text, inputs)) in enumerate(cases.items()):
        module = parse_module(text)
        stored[f"text_{k}"] = np.array(module_to_stablehlo(module))
        for i, value in enumerate(inputs):
            value = np.asarray(value)
            if value.dtype == ml_dtypes.bfloat16:  # .npz holds no bfloat16: its bits
                stored[f"bf16_input_{k}_{i}"] = np.array(True)
                value = value.view(np.uint16)
            stored[f"input_{k}_{i}"] = value
        result = evaluate(parse_module(text), *inputs)
        expected[k] = (name, list(result) if isinstance(result, tuple) else [result])
    np.savez(tmp_path / "cases.npz", **stored)
    subprocess.run([python, str(RUNNER), str(tmp_path / "cases.npz"),
                    str(tmp_path / "results.npz")], check=True, timeout=600)
    results = np.load(tmp_path / "results.npz")
    failures = [f"{name}: {results[f'error_{k}']}" for k, (name, _) in expected.items()
                if f"error_{k}" in results]
    assert not failures, "\n".join(failures)
    for k, (name, outputs) in expected.items():
        for j, want in enumerate(outputs):
            got = results[f"output_{k}_{j}"]
            if f"bf16_output_{k}_{j}" in results:
                got = got.view(ml_dtypes.bfloat16)
            want = np.asarray(want)
            # The rng state and bits, sorts, integer results: the same bits; floats as
            # the evaluator and XLA may sum and approximate differently.
            op_type = "dot" if want.dtype.kind == "f" else "copy"
            assert_close(got.astype(want.dtype), want, op_type, f"{name}, output {j}")
    assert len(expected) >= 30
