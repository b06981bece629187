"""The 2-byte-float audit: every registered op that accepts float16 or bfloat16, run in
both against TF's own kernels, through the NumPy evaluator, the CPU backend, and
`tl.function` in both modes (auto-clustering and `jit_compile=True`), with NaN, ±inf,
-0.0 and shapes with 0- and 1-size dims, within the per-dtype tolerance of
tests/tolerances.py. The cases are in half_float_cases.py and half_float_cases_more.py,
one per op.

The default run takes every op in bfloat16 through the evaluator and `jit_compile=True`,
and a representative few in float16 and in auto-clustering mode too (which lowers the
same rules through the same backend); the whole matrix runs under `slow`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from half_float_cases import CASES, Case
from half_float_cases_more import CASES as MORE_CASES
from tf_harness import run_clusters, trace
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.clustering import OP_RULES
from tfxla_lite.clustering.registry import HALF
from tfxla_lite.options import Options

HALVES = {"float16": np.float16, "bfloat16": tf.bfloat16.as_numpy_dtype}
BY_OP = {case.op_type: case for case in CASES + MORE_CASES}
# Lowerings that emit no instruction of their own (the operand passes through; a variable
# read is the value the variable holds, an assign replaces it), so no HLO metadata names them.
PASS_THROUGH = frozenset({"Identity", "Snapshot", "StopGradient", "PreventGradient",
                          "IdentityN", "Const", "ReadVariableOp", "AssignVariableOp"})
# One of each lowering family: run in float16 and in auto-clustering mode by default too.
REPRESENTATIVE = frozenset({"FloorDiv", "FloorMod", "Exp", "Erfc", "Sum", "ArgMax", "MatMul",
                          "Softmax", "Cast", "Cumsum", "UnsortedSegmentMax", "Pow"})


def _compare(case: Case, actual: np.ndarray, expected: np.ndarray, context: str) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    op_type = case.compare_as or case.op_type
    if case.finite_rows and actual.ndim:
        # oneDNN's softmax gives 0 beside a NaN or inf, XLA and tfxla-lite NaN: compare
        # the rows both find finite, and require NaN wherever TF has one.
        a64, e64 = actual.astype(np.float64), expected.astype(np.float64)
        finite = np.isfinite(a64) & np.isfinite(e64)
        rows = finite if actual.ndim == 1 else finite.all(axis=-1)
        assert_close(actual[rows], expected[rows], op_type, context)
        assert np.isnan(a64[np.isnan(e64)]).all(), context
        return
    assert_close(actual, expected, op_type, context)


def _expected(case: Case, args: list[np.ndarray]) -> list[np.ndarray]:
    """TF's kernels' results; TF's XLA's where TF has no CPU kernel for the dtype (Rint,
    TruncateMod, float16 BatchMatMulV3), since TF's XLA is what must-compile mirrors."""
    tensors = [tf.constant(a) for a in args]
    try:
        results = case.fn(*tensors)
    except tf.errors.NotFoundError:
        results = tf.function(case.fn, jit_compile=True)(*tensors)
    return [t.numpy() for t in tf.nest.flatten(results)]


def _returned(tensor: tf.Tensor, evaluated: dict[str, np.ndarray]) -> tf.Tensor:
    """The value an output Identity returns where that Identity stays in TF: tf.function
    gives a returned tensor's Identity control inputs on the stateful ops run before it
    (variable writes, While/If/Case), which keep it out of the cluster that made its input."""
    op = tensor.op
    if tensor.name not in evaluated and op.type == "Identity" and op.control_inputs:
        return op.inputs[0]
    return tensor


def _check_lowering(case: Case, args: list[np.ndarray], expected: list[np.ndarray]) -> None:
    """The rule itself: lowered, verified and evaluated in NumPy."""
    concrete = trace(case.fn, args)
    types = {op.type for op in concrete.graph.get_operations()}
    assert case.op_type in types, f"{case.op_type} not in traced graph: {sorted(types)}"
    # The backend's side is the jit_compile=True run: compiling here too would double it.
    evaluated, _ = run_clusters(concrete, args, compiled=False)
    for i, (tensor, want) in enumerate(zip(concrete.graph.outputs, expected)):
        tensor = _returned(tensor, evaluated)
        assert tensor.name in evaluated, f"output {tensor.name} not made by a cluster"
        _compare(case, evaluated[tensor.name], want, f"output {i}, evaluator")


def _check_mode(case: Case, args: list[np.ndarray], expected: list[np.ndarray],
                jit_compile: bool | None) -> None:
    compiled = tl.function(case.fn, jit_compile=jit_compile,
                           options=Options(min_cluster_size=1, verify=True,
                                           compile_convolutions=True))
    tensors = [tf.constant(a) for a in args]
    actual = tf.nest.flatten(compiled(*tensors))
    mode = "jit_compile=True" if jit_compile else "auto-clustering"
    assert len(actual) == len(expected)
    for i, (got, want) in enumerate(zip(actual, expected)):
        _compare(case, got.numpy(), want, f"output {i}, {mode}")
    if case.op_type not in PASS_THROUGH:  # compiled, not left to TF
        hlo = compiled.experimental_get_compiler_ir(*tensors)(stage="hlo")
        assert f'op_type="{case.op_type}"' in hlo, f"{case.op_type} not compiled ({mode})"


def _inputs(op_type: str, dtype_name: str) -> tuple[Case, list[np.ndarray], list[np.ndarray]]:
    case = BY_OP[op_type]
    args = case.make(HALVES[dtype_name])
    return case, args, _expected(case, args)


HALF_OPS = sorted(op for op, rule in OP_RULES.items() if rule.dtypes & HALF)
# Each op in each 2-byte dtype its rule accepts.
OP_DTYPES = [(op, name) for op in HALF_OPS for name in HALVES if name in OP_RULES[op].dtypes]


def test_every_half_float_op_has_a_case() -> None:
    assert set(HALF_OPS) - set(BY_OP) == set(), "registered for f16/bf16 without a case"
    assert set(BY_OP) - set(HALF_OPS) == set(), "a case for an op not registered for f16/bf16"


def _audit(op_type: str, dtype_name: str, modes: tuple[bool | None, ...]) -> None:
    case, args, expected = _inputs(op_type, dtype_name)
    _check_lowering(case, args, expected)
    for jit_compile in modes:
        _check_mode(case, args, expected, jit_compile)


# By default: every op in bfloat16 (the lowering, and jit_compile=True), and the
# representative few in float16 and in auto-clustering mode; the rest under `slow`.
DEFAULT = [(op, name) for op, name in OP_DTYPES
           if name == "bfloat16" or op in REPRESENTATIVE]


@pytest.mark.parametrize("op_type, dtype_name", DEFAULT)
def test_half_float_op_matches_tf(op_type: str, dtype_name: str) -> None:
    _audit(op_type, dtype_name, (True, None) if op_type in REPRESENTATIVE else (True,))


@pytest.mark.slow
@pytest.mark.parametrize("op_type, dtype_name", OP_DTYPES)
def test_half_float_op_matches_tf_in_both_modes(op_type: str, dtype_name: str) -> None:
    _audit(op_type, dtype_name, (True, None))


def test_bfloat16_floor_div_is_floored() -> None:
    """Issue 18: bf16 FloorDiv took the integer path (bf16 does not start with "f"): the
    quotient stepped down where the remainder's sign differs, never floored."""
    bf16 = tf.bfloat16

    def floor_div(x: Any, y: Any) -> Any:
        return tf.math.floordiv(x, y)

    x = tf.constant([0.8359375, -0.171875, 7.5, -7.5, -1.0, 1.0], bf16)
    y = tf.constant([3.0, 3.0, 3.0, 3.0, np.inf, np.inf], bf16)
    expected = floor_div(x, y).numpy().astype(np.float32)
    np.testing.assert_array_equal(expected, [0, -1, 2, -3, -0.0, 0])
    for jit_compile in (None, True):
        compiled = tl.function(floor_div, jit_compile=jit_compile,
                               options=Options(min_cluster_size=1, verify=True))
        actual = compiled(x, y).numpy().astype(np.float32)
        np.testing.assert_array_equal(actual, expected)
        np.testing.assert_array_equal(np.signbit(actual), np.signbit(expected))
