"""Every registered TF op against TF itself: trace, mark, cluster, lower, evaluate (and
compile when the CPU backend is there), over shapes with broadcasting, size-1 and zero-size
dims, and edge values (NaN, ±inf, -0.0). Each test traces once for all its shapes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, inputs, over_shapes, sample
from tolerances import assert_close

from tfxla_lite.clustering import OP_RULES
from tfxla_lite.clustering.rules_variables import VARIABLE_OPS

F32, F64, I32, BOOL = np.float32, np.float64, np.int32, np.bool_


# -- unary ------------------------------------------------------------------------------------
UNARY_SHAPES = [[()], [(0,)], [(1,)], [(3, 1, 5)], [(2, 0, 3)], [(4, 7)]]

UNARY = [
    ("Neg", tf.negative, (F32, F64, I32)),
    ("Abs", tf.abs, (F32, I32)),
    ("Exp", tf.exp, (F32, F64)),
    ("Log", tf.math.log, (F32, F64)),
    ("Tanh", tf.tanh, (F32,)),
    ("Sigmoid", tf.sigmoid, (F32, F64)),
    ("Relu", tf.nn.relu, (F32, I32)),
    ("Erf", tf.math.erf, (F32,)),
    ("Sqrt", tf.sqrt, (F32, F64)),
    ("Rsqrt", tf.math.rsqrt, (F32,)),
    ("Square", tf.square, (F32, I32)),
    ("Relu6", tf.nn.relu6, (F32,)),
    ("LeakyRelu", lambda x: tf.nn.leaky_relu(x, alpha=0.3), (F32,)),
    ("Softplus", tf.nn.softplus, (F32,)),
    ("Elu", tf.nn.elu, (F32,)),
    ("Sign", tf.sign, (F32, I32)),
    ("Floor", tf.floor, (F32,)),
    ("Ceil", tf.math.ceil, (F32,)),
    ("Round", tf.round, (F32,)),
    ("Expm1", tf.math.expm1, (F32,)),
    ("Log1p", tf.math.log1p, (F32,)),
    ("Sin", tf.sin, (F32,)),
    ("Cos", tf.cos, (F32,)),
    ("Reciprocal", tf.math.reciprocal, (F32,)),
    ("ZerosLike", lambda x: tf.raw_ops.ZerosLike(x=x), (F32, I32)),
    ("OnesLike", lambda x: tf.raw_ops.OnesLike(x=x), (F32, BOOL)),
    ("LogicalNot", tf.logical_not, (BOOL,)),
]


@pytest.mark.parametrize("op_type, fn, dtype",
                         [pytest.param(o, f, d, id=f"{o}-{np.dtype(d).name}")
                          for o, f, dtypes in UNARY for d in dtypes])
def test_unary(op_type: str, fn: Callable[..., Any], dtype: Any) -> None:
    check_against_tf(over_shapes(fn, 1), inputs(UNARY_SHAPES, [dtype]), op_type)


# -- binary -----------------------------------------------------------------------------------
BINARY_SHAPES = [
    [(), ()], [(3, 4), (3, 4)], [(3, 1), (1, 4)], [(2, 3, 4), (4,)], [(0, 3), (1, 3)],
    [(5,), ()], [(1,), (2, 0, 1)],
]

BINARY = [
    ("AddV2", tf.add, (F32, F64, I32)),
    ("Add", lambda x, y: tf.raw_ops.Add(x=x, y=y), (F32,)),
    ("Sub", tf.subtract, (F32, I32)),
    ("Mul", tf.multiply, (F32, F64, I32)),
    ("RealDiv", tf.truediv, (F32, F64)),
    ("Div", lambda x, y: tf.raw_ops.Div(x=x, y=y), (F32,)),
    ("Maximum", tf.maximum, (F32, I32)),
    ("Minimum", tf.minimum, (F32, I32)),
    ("Pow", tf.pow, (F32,)),
    ("SquaredDifference", tf.math.squared_difference, (F32,)),
    ("Less", tf.less, (F32, I32)),
    ("LessEqual", tf.less_equal, (F32,)),
    ("Greater", tf.greater, (F32, I32)),
    ("GreaterEqual", tf.greater_equal, (F32,)),
    ("Equal", tf.equal, (F32, I32, BOOL)),
    ("NotEqual", tf.not_equal, (F32, BOOL)),
    ("LogicalAnd", tf.logical_and, (BOOL,)),
    ("LogicalOr", tf.logical_or, (BOOL,)),
    ("Atan2", tf.math.atan2, (F32, F64)),
    ("Xlogy", tf.math.xlogy, (F32, F64)),
    ("Xlog1py", tf.math.xlog1py, (F32,)),
    ("Xdivy", tf.math.xdivy, (F32, F64)),
]


@pytest.mark.parametrize("op_type, fn, dtype",
                         [pytest.param(o, f, d, id=f"{o}-{np.dtype(d).name}")
                          for o, f, dtypes in BINARY for d in dtypes])
def test_binary(op_type: str, fn: Callable[..., Any], dtype: Any) -> None:
    check_against_tf(over_shapes(fn, 2), inputs(BINARY_SHAPES, [dtype, dtype]), op_type)


def test_add_n() -> None:
    shapes = [[(), (), ()], [(3, 4)] * 3, [(0, 2)] * 3]
    check_against_tf(over_shapes(lambda a, b, c: tf.add_n([a, b, c]), 3),
                     inputs(shapes, [F32] * 3), "AddN")


# -- casts ------------------------------------------------------------------------------------
CASTS = [(F32, I32), (F32, BOOL), (BOOL, F32), (I32, F32), (F32, F64), (I32, BOOL),
         (BOOL, I32), (F64, F32)]


@pytest.mark.parametrize("source, target", CASTS,
                         ids=[f"{np.dtype(s).name}-{np.dtype(t).name}" for s, t in CASTS])
def test_cast(source: Any, target: Any) -> None:
    # Float → int of NaN, inf or out-of-range values is undefined in TF (C++ cast): finite
    # values only there.
    edges = not (np.dtype(source).kind == "f" and np.dtype(target).kind == "i")
    args = inputs(UNARY_SHAPES, [source], edges=edges)
    check_against_tf(over_shapes(lambda x: tf.cast(x, tf.as_dtype(target)), 1), args, "Cast")


# -- selects ----------------------------------------------------------------------------------
def test_select_v2() -> None:
    shapes = [[(3, 4)] * 3, [(3, 1), (1, 4), ()], [(2, 0, 3), (3,), (1,)], [(), (2, 2), (2, 2)]]
    check_against_tf(over_shapes(tf.where, 3), inputs(shapes, [BOOL, F32, F32]), "SelectV2")


def test_select_v1() -> None:
    shapes = [[(3, 4)] * 3, [(3,), (3, 2), (3, 2)], [(), (2, 2), (2, 2)], [(0,), (0, 4), (0, 4)]]
    fn = over_shapes(lambda c, x, y: tf.raw_ops.Select(condition=c, x=x, y=y), 3)
    check_against_tf(fn, inputs(shapes, [BOOL, I32, I32]), "Select")


# -- dots -------------------------------------------------------------------------------------
MATMUL_CASES = [((3, 4), (4, 5), False, False), ((4, 3), (4, 5), True, False),
                ((3, 4), (5, 4), False, True), ((4, 3), (5, 4), True, True),
                ((1, 1), (1, 1), False, False), ((0, 3), (3, 2), False, False),
                ((2, 0), (0, 3), False, False)]


@pytest.mark.parametrize("dtype", [F32, F64, I32], ids=["float32", "float64", "int32"])
def test_matmul(dtype: Any) -> None:
    args = inputs([[a, b] for a, b, _, _ in MATMUL_CASES], [dtype, dtype])

    def fn(*xs: Any) -> list[Any]:
        return [tf.linalg.matmul(xs[2 * i], xs[2 * i + 1], transpose_a=ta, transpose_b=tb)
                for i, (_, _, ta, tb) in enumerate(MATMUL_CASES)]

    check_against_tf(fn, args, "MatMul")


BATCH_MATMUL_CASES = [((2, 3, 4), (2, 4, 5), False, False), ((1, 3, 4), (2, 4, 5), False, False),
                      ((3, 4), (2, 4, 5), False, False), ((2, 4, 3), (2, 5, 4), True, True),
                      ((2, 1, 3, 4), (5, 6, 4), False, True), ((0, 2, 3), (3, 2), False, False)]


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_batch_matmul(dtype: Any) -> None:
    args = inputs([[a, b] for a, b, _, _ in BATCH_MATMUL_CASES], [dtype, dtype])

    def fn(*xs: Any) -> list[Any]:
        return [tf.raw_ops.BatchMatMulV2(x=xs[2 * i], y=xs[2 * i + 1], adj_x=ax, adj_y=ay)
                for i, (_, _, ax, ay) in enumerate(BATCH_MATMUL_CASES)]

    check_against_tf(fn, args, "BatchMatMulV2")


def test_bias_add() -> None:
    cases = [((2, 3, 4), (4,), "NHWC"), ((2, 4, 3, 3), (4,), "NCHW"), ((0, 5), (5,), "NHWC"),
             ((1, 1), (1,), "NHWC")]
    args = inputs([[v, b] for v, b, _ in cases], [F32, F32])

    def fn(*xs: Any) -> list[Any]:
        return [tf.nn.bias_add(xs[2 * i], xs[2 * i + 1], data_format=f)
                for i, (_, _, f) in enumerate(cases)]

    check_against_tf(fn, args, "BiasAdd")


# -- reductions -------------------------------------------------------------------------------
REDUCTION_CASES = [((3, 4), 1, False), ((3, 4), [0, 1], True), ((2, 3, 4), [-1, 0], False),
                   ((2, 0, 3), 1, False), ((2, 0, 3), [0, 2], True), ((5,), [], False),
                   ((), [], True), ((1, 1), 0, True)]
REDUCTIONS = [
    ("Sum", tf.reduce_sum, (F32, F64, I32)),
    ("Mean", tf.reduce_mean, (F32, I32)),
    ("Max", tf.reduce_max, (F32, I32)),
    ("Min", tf.reduce_min, (F32, I32)),
    ("Prod", tf.reduce_prod, (F32,)),
    ("Any", tf.reduce_any, (BOOL,)),
    ("All", tf.reduce_all, (BOOL,)),
]


@pytest.mark.parametrize("op_type, reduce_fn, dtype",
                         [pytest.param(o, f, d, id=f"{o}-{np.dtype(d).name}")
                          for o, f, dtypes in REDUCTIONS for d in dtypes])
def test_reduction(op_type: str, reduce_fn: Callable[..., Any], dtype: Any) -> None:
    cases = REDUCTION_CASES
    if op_type == "Mean" and np.dtype(dtype).kind == "i":  # TF divides by zero there
        cases = [c for c in cases if 0 not in c[0]]
    args = inputs([[shape] for shape, _, _ in cases], [dtype])

    def fn(*xs: Any) -> list[Any]:
        return [reduce_fn(x, axis=axis, keepdims=keep) for x, (_, axis, keep) in zip(xs, cases)]

    check_against_tf(fn, args, op_type)


# -- shapes and layouts -----------------------------------------------------------------------
def _per_case(cases: Sequence[tuple[Any, ...]], apply: Callable[..., Any]
              ) -> Callable[..., list[Any]]:
    def fn(*xs: Any) -> list[Any]:
        return [apply(x, *case[1:]) for x, case in zip(xs, cases)]

    return fn


SHAPE_OPS: list[tuple[str, Callable[..., Any], list[tuple[Any, ...]]]] = [
    ("Reshape", lambda x, s: tf.reshape(x, s),
     [((2, 3, 4), [6, -1]), ((0, 3), [3, 0, 1]), ((1,), []), ((), [1, 1]), ((4, 1), [-1])]),
    ("Transpose", lambda x, p: tf.transpose(x, p),
     [((3, 4), [1, 0]), ((2, 3, 4), [2, 0, 1]), ((5,), [0]), ((0, 3), [1, 0]),
      ((2, 1, 3), [-1, 0, 1])]),
    ("ExpandDims", lambda x, a: tf.expand_dims(x, a),
     [((3, 4), 0), ((3, 4), -1), ((0,), 1), ((), 0)]),
    ("Squeeze", lambda x, a: tf.squeeze(x, a),
     [((1, 3, 1), None), ((1, 3, 1), [0]), ((1,), None), ((2, 1, 0), [1])]),
    ("Slice", lambda x, b, s: tf.slice(x, b, s),
     [((4, 5), [1, 0], [2, -1]), ((3,), [0], [0]), ((2, 3, 4), [1, 1, 1], [1, 2, 3])]),
    ("BroadcastTo", lambda x, s: tf.broadcast_to(x, s),
     [((3, 1), [2, 3, 4]), ((), [2, 2]), ((1,), [0]), ((2, 3), [2, 3])]),
    ("Softmax", tf.nn.softmax, [((3, 4),), ((1, 1),), ((2, 3, 5),), ((0, 4),), ((4, 0),)]),
    ("LogSoftmax", tf.nn.log_softmax, [((3, 4),), ((1, 1),), ((2, 3, 5),), ((0, 4),)]),
]


def _softmax_compare(actual: np.ndarray, expected: np.ndarray, op_type: str, context: str
                     ) -> None:
    """TF's CPU softmax (oneDNN) returns 0, not NaN, beside a NaN or inf in a row; XLA and
    we give NaN for the whole row. Compare finite rows exactly; elsewhere require NaN
    wherever TF has NaN."""
    finite_rows = np.isfinite(expected).all(axis=-1) & np.isfinite(actual).all(axis=-1)
    assert_close(actual[finite_rows], expected[finite_rows], op_type, context)
    assert np.isnan(actual[np.isnan(expected)]).all(), context


@pytest.mark.parametrize("op_type, apply, cases",
                         [pytest.param(*spec, id=spec[0]) for spec in SHAPE_OPS])
def test_shape_ops(op_type: str, apply: Callable[..., Any], cases: list[tuple[Any, ...]]
                   ) -> None:
    args = inputs([[case[0]] for case in cases], [F32])
    compare = _softmax_compare if "Softmax" in op_type else None
    check_against_tf(_per_case(cases, apply), args, op_type, compare=compare)


def test_concat_and_pack() -> None:
    shapes = [[(2, 3), (2, 4)], [(0, 3), (2, 3)], [(1,), (1,)], [(), ()]]
    args = inputs(shapes, [F32, F32])

    def fn(*xs: Any) -> list[Any]:
        return [tf.concat([xs[0], xs[1], xs[1]], axis=1), tf.concat([xs[2], xs[3]], axis=0),
                tf.concat([xs[4], xs[5]], axis=-1), tf.stack([xs[6], xs[7]]),
                tf.stack([xs[0], xs[0]], axis=-1), tf.stack([xs[2]], axis=1)]

    check_against_tf(fn, args, "ConcatV2")
    check_against_tf(fn, args, "Pack")


def test_fill_and_shape() -> None:
    args = inputs([[(), (2, 0, 3)]], [F32, I32])

    def fn(v: Any, x: Any) -> list[Any]:
        return [tf.fill([2, 3], v), tf.fill([0], v), tf.raw_ops.Shape(input=x),
                tf.raw_ops.Shape(input=x, out_type=tf.int64) + 1]

    check_against_tf(fn, args, "Fill")
    check_against_tf(fn, args, "Shape")


def test_composite_graph_is_one_cluster() -> None:
    """A GELU-like dense layer with Identity, Const and StopGradient inside one cluster."""
    args = [sample((4, 8), F32, seed=1, edges=False), sample((8, 3), F32, seed=2, edges=False),
            sample((3,), F32, seed=3, edges=False)]

    def fn(x: Any, w: Any, b: Any) -> Any:
        h = tf.nn.bias_add(tf.matmul(x, tf.identity(w)), tf.stop_gradient(b))
        gelu = 0.5 * h * (1.0 + tf.math.erf(h / np.sqrt(2.0).astype(np.float32)))
        return tf.reduce_mean(gelu, axis=-1, keepdims=True) - tf.reduce_max(gelu)

    check_against_tf(fn, args, "Erf", compare=lambda a, e, o, c: assert_close(a, e, "Mean", c))


# TF emits these forms where a branch holds a stateful op; the raw ops build them here.
STATEFUL_BRANCHES = ("If", "Case")


@pytest.mark.parametrize("op_type", STATEFUL_BRANCHES)
def test_stateful_branches(op_type: str) -> None:
    """If and Case in float32 through the evaluator and both modes, with the 2-byte-float
    audit's cases (the stateless forms: test_control_flow_lowering.py)."""
    from half_float_cases_more import CASES as MORE_CASES
    from test_half_float_ops_tf import _check_lowering, _check_mode, _expected

    (case,) = [c for c in MORE_CASES if c.op_type == op_type]
    args = case.make(F32)
    expected = _expected(case, args)
    _check_lowering(case, args, expected)
    for jit_compile in (True, None):
        _check_mode(case, args, expected, jit_compile)


def test_every_registered_op_is_tested() -> None:
    from test_batch_norm import TESTED_OPS as BATCH_NORM_OPS
    from test_control_flow_lowering import TESTED_OPS as CONTROL_FLOW_OPS
    from test_conv_ops import TESTED_OPS as CONV_OPS
    from test_indexing_lowerings import TESTED_OPS as INDEXING_OPS
    from test_pooling import TESTED_OPS as POOLING_OPS
    from test_random_ops import TESTED_OPS as RANDOM_OPS
    from test_resize import TESTED_OPS as RESIZE_OPS
    from test_rules_linalg import TESTED_OPS as LINALG_OPS
    from test_scan_roll_band_ops import TESTED_OPS as SCAN_ROLL_BAND_OPS
    from test_slicing_ops import TESTED_OPS as SLICING_OPS
    from test_space_to_batch import TESTED_OPS as SPACE_OPS
    from test_training_ops import TESTED_OPS as TRAINING_OPS

    tested = (SLICING_OPS | TRAINING_OPS | INDEXING_OPS | SCAN_ROLL_BAND_OPS | CONV_OPS
              | POOLING_OPS | BATCH_NORM_OPS | RANDOM_OPS | RESIZE_OPS | SPACE_OPS
              | CONTROL_FLOW_OPS | LINALG_OPS | set(STATEFUL_BRANCHES)
              | {o for o, _, _ in UNARY}
              | {o for o, _, _ in BINARY}
              | {o for o, _, _ in REDUCTIONS} | {o for o, _, _ in SHAPE_OPS}
              | {"AddN", "Cast", "SelectV2", "Select", "MatMul", "BatchMatMulV2", "BiasAdd",
                 "ConcatV2", "Pack", "Fill", "Shape", "Const", "Identity", "StopGradient"}
              | VARIABLE_OPS)  # in tests/runtime/test_variables.py (state across calls)
    assert tested <= set(OP_RULES), f"tested but not registered: {tested - set(OP_RULES)}"
    # Aliases and legacy forms lowered by a tested rule.
    aliases = {"Snapshot", "PreventGradient", "Inv", "Rint", "BatchMatMul", "BiasAddV1"}
    untested = set(OP_RULES) - tested - aliases
    assert untested == set(), f"registered but untested: {sorted(untested)}"
