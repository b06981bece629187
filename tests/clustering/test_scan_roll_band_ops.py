"""Lowerings of ops TF's XLA compiles that the fuzzing found refused under
`jit_compile=True` (issue 18 item 7): Roll, MatrixBandPart, CumulativeLogsumexp, Pow on
integers, ArgMax/ArgMin on bools. Each against TF over shapes with 0- and 1-size dims,
dtypes (the 2-byte floats are in test_half_float_ops_tf.py too) and edge values, through
the evaluator and the CPU backend, and through `tl.function` in both modes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, inputs, sample
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.options import Options

F16, BF16 = np.float16, tf.bfloat16.as_numpy_dtype
F32, F64, I32, I64, BOOL = np.float32, np.float64, np.int32, np.int64, np.bool_
ALL_DTYPES = [F32, F64, I32, I64, BOOL, F16, BF16]
FLOATS = [F32, F64, F16, BF16]


def _ids(dtypes: list[Any]) -> list[str]:
    return [np.dtype(d).name for d in dtypes]


def _per_case(cases: list[tuple[Any, ...]], apply: Callable[..., Any]) -> Callable[..., Any]:
    def fn(*xs: Any) -> list[Any]:
        return [apply(x, *case[1:]) for x, case in zip(xs, cases)]

    return fn


def _both_modes(fn: Callable[..., Any], args: list[np.ndarray], op_type: str) -> None:
    """`tl.function` in auto-clustering and must-compile modes against TF; the op compiled."""
    tensors = [tf.constant(a) for a in args]
    expected = [t.numpy() for t in tf.nest.flatten(fn(*tensors))]
    for jit_compile in (None, True):
        compiled = tl.function(fn, jit_compile=jit_compile,
                               options=Options(min_cluster_size=1, verify=True))
        actual = tf.nest.flatten(compiled(*tensors))
        for i, (got, want) in enumerate(zip(actual, expected)):
            assert_close(got.numpy(), want, op_type, f"output {i}, jit_compile={jit_compile}")
        hlo = compiled.experimental_get_compiler_ir(*tensors)(stage="hlo")
        assert f'op_type="{op_type}"' in hlo


ROLL_CASES = [((3, 4), 1, 0), ((3, 4), [-5, 2], [1, 0]), ((3, 4), [1, 2], [1, 1]),
              ((0, 3), 2, 1), ((1,), 3, 0), ((2, 1, 5), [7, -1], [-1, 0]), ((4,), 0, 0)]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_ids(ALL_DTYPES))
def test_roll(dtype: Any) -> None:
    fn = _per_case(ROLL_CASES, lambda x, s, a: tf.roll(x, s, a))
    args = inputs([[c[0]] for c in ROLL_CASES], [dtype])
    check_against_tf(fn, args, "Roll")
    if dtype in (F32, I64):
        _both_modes(fn, args, "Roll")


BAND_CASES = [((3, 4), 0, -1), ((3, 4), -1, 0), ((2, 4, 3), 1, 2), ((0, 2), -1, 1),
              ((1, 1), 0, 0), ((2, 0, 3), -1, 3), ((5, 5), -1, -1), ((3, 3), 3, 0)]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_ids(ALL_DTYPES))
def test_matrix_band_part(dtype: Any) -> None:
    fn = _per_case(BAND_CASES, lambda x, lo, hi: tf.linalg.band_part(x, lo, hi))
    args = inputs([[c[0]] for c in BAND_CASES], [dtype])
    check_against_tf(fn, args, "MatrixBandPart")


@pytest.mark.parametrize("index_dtype", [I32, I64], ids=["int32", "int64"])
def test_matrix_band_part_with_runtime_bounds(index_dtype: Any) -> None:
    # num_lower/num_upper as runtime inputs: XLA reads them at run time too.
    x = sample((2, 5, 4), F32, seed=3)
    bounds = [np.array(1, index_dtype), np.array(-1, index_dtype), np.array(0, index_dtype)]
    fn = lambda x, a, b, c: [tf.linalg.band_part(x, a, b),  # noqa: E731
                             tf.linalg.band_part(x, c, a)]
    check_against_tf(fn, [x, *bounds], "MatrixBandPart")
    _both_modes(fn, [x, *bounds], "MatrixBandPart")


SCAN_CASES = [((3, 4), 1, False, False), ((3, 4), 0, True, False), ((3, 4), 1, False, True),
              ((3, 4), -1, True, True), ((0, 2), 1, False, False), ((2, 0), 1, True, True),
              ((1,), 0, False, False), ((2, 1, 5), 2, False, False)]


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
def test_cumulative_logsumexp(dtype: Any) -> None:
    fn = _per_case(SCAN_CASES, lambda x, a, e, r: tf.math.cumulative_logsumexp(
        x, a, exclusive=e, reverse=r))
    args = inputs([[c[0]] for c in SCAN_CASES], [dtype])
    # Runs of -inf, +inf and NaN at every position of a row, where TF's reducer has its
    # special cases (hi = -inf; inf - inf; NaN in either argument).
    edges = np.array([[-np.inf, -np.inf, 1.0, np.inf], [np.nan, 2.0, np.inf, np.inf],
                      [3.0, np.nan, -np.inf, 0.5]], dtype)
    args[0] = edges
    check_against_tf(fn, args, "CumulativeLogsumexp",
                     compare=lambda a, e, o, c: assert_close(a, e, "Sum", c))
    if dtype == F32:
        _both_modes(fn, args, "CumulativeLogsumexp")


def test_large_cumulative_logsumexp_does_not_overflow() -> None:
    x = np.array([[80.0, 90.0, 100.0, -1e30]], np.float32)
    check_against_tf(lambda v: tf.math.cumulative_logsumexp(v, 1), [x], "CumulativeLogsumexp")


POW_SHAPES = [[(), ()], [(3, 4), (3, 4)], [(3, 1), (1, 4)], [(0, 3), (1, 3)], [(1,), (5,)]]


@pytest.mark.parametrize("dtype", [I32, I64], ids=["int32", "int64"])
def test_integer_pow(dtype: Any) -> None:
    # Non-negative exponents (TF raises on negative ones; test_semantics_vs_tf has those),
    # bases whose powers wrap around too.
    rng = np.random.default_rng(5)
    args = []
    for base_shape, exponent_shape in POW_SHAPES:
        args += [rng.integers(-40, 41, base_shape).astype(dtype),
                 rng.integers(0, 25, exponent_shape).astype(dtype)]

    def fn(*xs: Any) -> list[Any]:
        return [tf.pow(xs[i], xs[i + 1]) for i in range(0, len(xs), 2)]

    check_against_tf(fn, args, "Pow")
    _both_modes(fn, args, "Pow")


ARG_CASES = [((3, 4), 1), ((3, 4), 0), ((2, 3, 4), -1), ((5,), 0), ((1, 1), 0), ((4, 0), 0)]


@pytest.mark.parametrize("op_type, reduce_fn", [("ArgMax", tf.math.argmax),
                                                ("ArgMin", tf.math.argmin)])
def test_arg_reductions_of_bools(op_type: str, reduce_fn: Callable[..., Any]) -> None:
    args = inputs([[c[0]] for c in ARG_CASES], [BOOL])
    args[0] = np.zeros((3, 4), bool)  # all ties: index 0
    args[1] = np.ones((3, 4), bool)

    def fn(*xs: Any) -> list[Any]:
        return [reduce_fn(x, axis=axis) for x, (_, axis) in zip(xs, ARG_CASES)]

    check_against_tf(fn, args, op_type)
    _both_modes(fn, args, op_type)


TESTED_OPS = {"Roll", "MatrixBandPart", "CumulativeLogsumexp"}
