"""HLO as TF's own XLA prints it: parsed, evaluated, compiled and checked against TF.

For every case of `tf_functions.CASES` and both stages TF prints (`'hlo'`, as
lowered; `'optimized_hlo'`, fused and scheduled, with layouts), the module must
parse and print back to a fixed point. Modules whose opcodes the registry knows
are evaluated (NumPy reference) and compiled for the CPU, and both results must
match what TF's XLA computes within the tolerance table. Modules with opcodes
tfxla-lite lacks must fail with errors naming them, and are marked xfail so the
coverage gap shows in every test run; so are known CPU-backend gaps.

The corpus is generated once per session (about 3 s of XLA compiles).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tf_functions import CASES, Case
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.opcodes import OPCODES
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.printer import module_to_text
from tfxla_lite.hlo.verifier import VerificationError, verify

STAGES = ("hlo", "optimized_hlo")
CASE_NAMES = [case.name for case in CASES]

# Cases that lower to opcodes the registry lacks, with those opcodes (both stages).
# reverse, pad, gather and reduce-window (cumsum) have landed: none is left.
EXPECTED_UNSUPPORTED: dict[str, set[str]] = {}

# Known CPU-backend gaps: a fragment of the backend's error, and why it happens.
# Tuples in the entry, variadic reduces (argmax) and multi-output fusions have
# landed: none is left.
CODEGEN_GAPS: dict[str, str] = {}


@dataclass(frozen=True)
class CorpusModule:
    case: Case
    stage: str
    text: str
    inputs: tuple[np.ndarray, ...]
    expected: tuple[np.ndarray, ...]  # TF's XLA results, flattened


def _inputs(case: Case, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    arrays = []
    for dtype, shape in case.inputs:
        if dtype == "bool":
            arrays.append(rng.random(shape) < 0.5)
        elif dtype == "int32":
            arrays.append(rng.integers(-5, 6, size=shape).astype(np.int32))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return tuple(arrays)


@pytest.fixture(scope="module")
def corpus() -> dict[tuple[str, str], CorpusModule]:
    modules = {}
    for case in CASES:
        inputs = _inputs(case)
        function = tf.function(case.fn, jit_compile=True)
        expected = tuple(np.asarray(t) for t in tf.nest.flatten(function(*inputs)))
        for stage in STAGES:
            text = function.experimental_get_compiler_ir(*inputs)(stage=stage)
            modules[(case.name, stage)] = CorpusModule(case, stage, text, inputs, expected)
    return modules


def _opcodes(module: HloModule) -> set[str]:
    return {inst.opcode for comp in module.computations for inst in comp.instructions}


def _flatten(value: object) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [array for element in value for array in _flatten(element)]
    return [np.asarray(value)]


def _assert_matches(actual: list[np.ndarray], entry: CorpusModule, what: str) -> None:
    assert len(actual) == len(entry.expected), what
    for n, (got, wanted) in enumerate(zip(actual, entry.expected, strict=True)):
        assert_close(got, wanted, entry.case.tolerance,
                     f"{entry.case.name} {entry.stage} output {n}, {what}")


def test_corpus_is_large_enough(corpus: dict[tuple[str, str], CorpusModule]) -> None:
    assert len(corpus) >= 40


def test_unsupported_opcodes_are_exactly_the_known_gaps(
        corpus: dict[tuple[str, str], CorpusModule]) -> None:
    missing: dict[str, set[str]] = {}
    for (name, _stage), entry in corpus.items():
        unknown = _opcodes(parse_module(entry.text)) - set(OPCODES)
        if unknown:
            missing.setdefault(name, set()).update(unknown)
    assert missing == EXPECTED_UNSUPPORTED


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_parses_and_prints_to_a_fixed_point(corpus: dict[tuple[str, str], CorpusModule],
                                            name: str, stage: str) -> None:
    entry = corpus[(name, stage)]
    module = parse_module(entry.text)
    assert module.entry is not None
    assert len(module.entry.parameters) == len(entry.inputs)
    if name not in EXPECTED_UNSUPPORTED:
        verify(module)
    text = module_to_text(module, print_large_constants=True)
    assert module_to_text(parse_module(text), print_large_constants=True) == text


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_evaluates_and_compiles_to_tf_results(corpus: dict[tuple[str, str], CorpusModule],
                                              name: str, stage: str) -> None:
    entry = corpus[(name, stage)]
    module = parse_module(entry.text)
    if name in EXPECTED_UNSUPPORTED:
        opcode = sorted(EXPECTED_UNSUPPORTED[name])[0]
        with pytest.raises(VerificationError, match=f"unknown opcode '{opcode}'"):
            verify(module)
        with pytest.raises(NotImplementedError, match=f"'{opcode}'"):
            evaluate(module, *entry.inputs)
        with pytest.raises(VerificationError, match=f"unknown opcode '{opcode}'"):
            compile_module(parse_module(entry.text), verify=True)
        pytest.xfail(f"unsupported opcode {opcode}")
    verify(module)
    _assert_matches(_flatten(evaluate(module, *entry.inputs)), entry, "evaluator")
    try:
        executable = compile_module(parse_module(entry.text), verify=True)
    except (NotImplementedError, ValueError) as error:
        gap = next((why for fragment, why in CODEGEN_GAPS.items() if fragment in str(error)),
                   None)
        if gap is None:
            raise
        pytest.xfail(f"CPU backend: {gap}")
    _assert_matches(executable(*entry.inputs), entry, "compiled")


_DUMP_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf

table = np.linspace(-2, 2, 96, dtype=np.float32).reshape(8, 12)  # printed only in full

@tf.function(jit_compile=True)
def f(x, w):
    return tf.nn.relu(x @ w + table[:1]), tf.reduce_sum(x * table[:4, :8])

x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
w = np.random.default_rng(1).standard_normal((8, 12)).astype(np.float32)
np.savez(sys.argv[1], x=x, w=w, *[np.asarray(t) for t in f(x, w)])
"""


def test_xla_dump_files_parse_and_compute(tmp_path: Path) -> None:
    """What `--xla_dump_to` writes, large constants included, before and after XLA's passes."""
    dump = tmp_path / "dump"
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text "
                                     "--xla_dump_large_constants", TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run([sys.executable, "-c", _DUMP_SCRIPT, str(tmp_path / "io.npz")], env=env,
                   check=True, capture_output=True)
    saved = np.load(tmp_path / "io.npz")
    expected = [saved["arr_0"], saved["arr_1"]]
    files = sorted(dump.glob("*before_optimizations.txt")) + \
        sorted(dump.glob("*after_optimizations.txt"))
    assert len(files) >= 2
    for path in files:
        module = parse_module(path.read_text())
        verify(module)
        if "before" in path.name:  # XLA's passes may fold the table into other constants
            assert max(inst.literal.size for comp in module.computations
                       for inst in comp.instructions if inst.opcode == "constant") > 10
        results = _flatten(evaluate(module, saved["x"], saved["w"]))
        for got, wanted in zip(results, expected, strict=True):
            assert_close(got, wanted, "MatMul", path.name)
