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

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
    texts = {"jax_lowered": JAX_LOWERED, "xla_scheduled": XLA_SCHEDULED}
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
            stored[f"input_{k}_{i}"] = np.asarray(value)
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
            want = np.asarray(want)
            # The rng state and bits, sorts, integer results: the same bits; floats as
            # the evaluator and XLA may sum and approximate differently.
            op_type = "dot" if want.dtype.kind == "f" else "copy"
            assert_close(got.astype(want.dtype), want, op_type, f"{name}, output {j}")
    assert len(expected) >= 30
