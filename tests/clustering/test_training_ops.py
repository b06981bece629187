"""The ops training emits, against TF itself: gradient ops against TF's own gradient
kernels (tf.raw_ops), integer and floor division, float classification, losses,
ArgMax/ArgMin and OneHot, over shapes × dtypes with edge values; and whole gradients of
the seed models (GradientTape inside a tf.function) compiled end to end."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, inputs, over_shapes, run_clusters, sample, trace
from tolerances import assert_close

from tfxla_lite import examples
from tfxla_lite.clustering import PLUMBING_OPS, mark
from tfxla_lite.clustering.rules_gradients import broadcast_gradient_args

F32, F64, I32, I64, BOOL = np.float32, np.float64, np.int32, np.int64, np.bool_
raw = tf.raw_ops

# -- gradient ops against TF's gradient kernels -----------------------------------------------
SAME_SHAPES = [[(), ()], [(0,), (0,)], [(3, 4), (3, 4)], [(2, 1, 5), (2, 1, 5)]]

GRADIENTS = [
    ("ReluGrad", lambda g, x: raw.ReluGrad(gradients=g, features=x), (F32, F64, I32)),
    ("Relu6Grad", lambda g, x: raw.Relu6Grad(gradients=g, features=x * 3), (F32, F64)),
    ("LeakyReluGrad", lambda g, x: raw.LeakyReluGrad(gradients=g, features=x, alpha=0.2),
     (F32, F64)),
    ("SoftplusGrad", lambda g, x: raw.SoftplusGrad(gradients=g, features=x), (F32, F64)),
    ("EluGrad", lambda g, y: raw.EluGrad(gradients=g, outputs=y), (F32, F64)),
    ("SeluGrad", lambda g, y: raw.SeluGrad(gradients=g, outputs=y), (F32, F64)),
    ("SigmoidGrad", lambda dy, y: raw.SigmoidGrad(y=y, dy=dy), (F32, F64)),
    ("TanhGrad", lambda dy, y: raw.TanhGrad(y=y, dy=dy), (F32, F64)),
    ("SqrtGrad", lambda dy, y: raw.SqrtGrad(y=y, dy=dy), (F32, F64)),
    ("RsqrtGrad", lambda dy, y: raw.RsqrtGrad(y=y, dy=dy), (F32, F64)),
    ("ReciprocalGrad", lambda dy, y: raw.ReciprocalGrad(y=y, dy=dy), (F32, F64)),
    ("InvGrad", lambda dy, y: raw.InvGrad(y=y, dy=dy), (F32,)),
    ("SoftsignGrad", lambda g, x: raw.SoftsignGrad(gradients=g, features=x), (F32, F64)),
]


@pytest.mark.parametrize("op_type, fn, dtype",
                         [pytest.param(o, f, d, id=f"{o}-{np.dtype(d).name}")
                          for o, f, dtypes in GRADIENTS for d in dtypes])
def test_gradient_op(op_type: str, fn: Callable[..., Any], dtype: Any) -> None:
    check_against_tf(over_shapes(fn, 2), inputs(SAME_SHAPES, [dtype, dtype]), op_type)


@pytest.mark.parametrize("dtype", [F32, F64, I32], ids=["float32", "float64", "int32"])
def test_bias_add_grad(dtype: Any) -> None:
    cases = [((2, 3, 4), "NHWC"), ((2, 4, 3, 3), "NCHW"), ((0, 5), "NHWC"), ((3, 1), "NHWC"),
             ((2, 3, 0), "NCHW")]
    args = inputs([[shape] for shape, _ in cases], [dtype])

    def fn(*xs: Any) -> list[Any]:
        return [raw.BiasAddGrad(out_backprop=x, data_format=f) for x, (_, f) in zip(xs, cases)]

    check_against_tf(fn, args, "BiasAddGrad")


BROADCAST_PAIRS = [((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((1,), (2, 1, 1)), ((), (5,)),
                   ((2, 3), (2, 3)), ((1, 1), (1,)), ((0, 3), (1, 3))]


def test_broadcast_gradient_args_matches_tf() -> None:
    for s0, s1 in BROADCAST_PAIRS:
        r0, r1 = raw.BroadcastGradientArgs(s0=tf.constant(s0, tf.int32),
                                           s1=tf.constant(s1, tf.int32))
        assert broadcast_gradient_args(np.array(s0), np.array(s1)) == (
            r0.numpy().tolist(), r1.numpy().tolist()), (s0, s1)


def test_broadcast_gradient_args_folds_into_reductions() -> None:
    """Shape → BroadcastGradientArgs → Sum axes, as gradients of broadcasting ops build
    it: the axes are folded at compile time and the whole thing is one cluster."""
    pairs = BROADCAST_PAIRS[:5]
    args = inputs(pairs, [F32, F32])

    def fn(*xs: Any) -> list[Any]:
        results = []
        for a, b in zip(xs[::2], xs[1::2]):
            r0, r1 = raw.BroadcastGradientArgs(s0=tf.shape(a), s1=tf.shape(b))
            grad = a + b
            results += [tf.reshape(tf.reduce_sum(grad, r0), tf.shape(a)),
                        tf.reshape(tf.reduce_sum(grad, r1), tf.shape(b)), r0, r1]
        return results

    check_against_tf(fn, args, "BroadcastGradientArgs", compare=_accumulated)


# -- division and classification --------------------------------------------------------------
BINARY_SHAPES = [[(), ()], [(3, 4), (3, 4)], [(3, 1), (1, 4)], [(2, 3, 4), (4,)],
                 [(0, 3), (1, 3)]]


def _nonzero_divisors(args: list[np.ndarray]) -> list[np.ndarray]:
    """Integer divisors without zeros (TF raises there); floats keep their edge values."""
    out = []
    for k, a in enumerate(args):
        if k % 2 == 1 and a.dtype.kind == "i":
            a = np.where(a == 0, 7, a).astype(a.dtype)
        out.append(a)
    return out


DIVISIONS = [
    ("FloorDiv", tf.math.floordiv, (F32, F64, I32, I64)),
    ("FloorMod", tf.math.floormod, (F32, F64, I32, I64)),
    ("TruncateDiv", tf.truncatediv, (I32, I64)),
    ("TruncateMod", tf.truncatemod, (F32, I32, I64)),
    ("Div", lambda x, y: raw.Div(x=x, y=y), (I32, I64)),
    ("DivNoNan", tf.math.divide_no_nan, (F32, F64)),
    ("BitwiseAnd", tf.bitwise.bitwise_and, (I32, I64)),
    ("BitwiseOr", tf.bitwise.bitwise_or, (I32,)),
    ("BitwiseXor", tf.bitwise.bitwise_xor, (I64,)),
    ("SquaredDifference", tf.math.squared_difference, (F64, I32, I64)),
]


@pytest.mark.parametrize("op_type, fn, dtype",
                         [pytest.param(o, f, d, id=f"{o}-{np.dtype(d).name}")
                          for o, f, dtypes in DIVISIONS for d in dtypes])
def test_division_and_bitwise(op_type: str, fn: Callable[..., Any], dtype: Any) -> None:
    args = _nonzero_divisors(inputs(BINARY_SHAPES, [dtype, dtype]))
    check_against_tf(over_shapes(fn, 2), args, op_type)


UNARY_SHAPES = [[()], [(0,)], [(3, 1, 5)], [(4, 7)]]
UNARY = [
    ("IsFinite", tf.math.is_finite, (F32, F64)),
    ("IsNan", tf.math.is_nan, (F32, F64)),
    ("IsInf", tf.math.is_inf, (F32, F64)),
    ("Selu", tf.nn.selu, (F32, F64)),
    ("L2Loss", tf.nn.l2_loss, (F32, F64)),
    ("Softsign", tf.nn.softsign, (F32, F64)),
    ("Tan", tf.math.tan, (F32, F64)),
    ("Atan", tf.math.atan, (F32, F64)),
]


@pytest.mark.parametrize("op_type, fn, dtype",
                         [pytest.param(o, f, d, id=f"{o}-{np.dtype(d).name}")
                          for o, f, dtypes in UNARY for d in dtypes])
def test_unary(op_type: str, fn: Callable[..., Any], dtype: Any) -> None:
    check_against_tf(over_shapes(fn, 1), inputs(UNARY_SHAPES, [dtype]), op_type)


@pytest.mark.parametrize("dtype", [F32, I32, I64], ids=["float32", "int32", "int64"])
def test_clip_by_value(dtype: Any) -> None:
    shapes = [[(3, 4), (), ()], [(3, 4), (3, 4), (3, 4)], [(0, 2), (), ()], [(), (), ()]]
    args = inputs(shapes, [dtype] * 3)
    for k in range(0, len(args), 3):  # low <= high, as TF requires
        low, high = np.minimum(args[k + 1], args[k + 2]), np.maximum(args[k + 1], args[k + 2])
        args[k + 1], args[k + 2] = low, high
    check_against_tf(over_shapes(lambda x, lo, hi: raw.ClipByValue(
        t=x, clip_value_min=lo, clip_value_max=hi), 3), args, "ClipByValue")


# -- losses -----------------------------------------------------------------------------------
def _accumulated(actual: np.ndarray, expected: np.ndarray, op_type: str, context: str) -> None:
    assert_close(actual, expected, "Sum", context)


def _rows_finite_compare(actual: np.ndarray, expected: np.ndarray, op_type: str, context: str
                         ) -> None:
    """Rows whose logits hold NaN or inf differ between TF's kernels (oneDNN's softmax
    gives 0 beside them): compare the rows both sides find finite, and require NaN where
    TF has NaN."""
    if actual.ndim == 0:
        return assert_close(actual, expected, op_type, context)
    finite = np.isfinite(expected) & np.isfinite(actual)
    rows = finite if actual.ndim == 1 else finite.all(axis=-1)
    assert_close(actual[rows], expected[rows], op_type, context)
    assert np.isnan(actual[np.isnan(expected)]).all(), context


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_softmax_cross_entropy(dtype: Any) -> None:
    shapes = [[(4, 5), (4, 5)], [(1, 1), (1, 1)], [(0, 3), (0, 3)], [(3, 0), (3, 0)]]
    args = inputs(shapes, [dtype, dtype])
    for k in range(1, len(args), 2):  # labels: rows of probabilities
        labels = np.abs(np.nan_to_num(args[k], nan=0.0, posinf=1.0, neginf=1.0)) + 0.1
        args[k] = (labels / labels.sum(axis=-1, keepdims=True)).astype(dtype)
    fn = over_shapes(lambda x, y: raw.SoftmaxCrossEntropyWithLogits(features=x, labels=y), 2)
    check_against_tf(fn, args, "SoftmaxCrossEntropyWithLogits", compare=_rows_finite_compare)
    clean = inputs(shapes, [dtype, dtype], edges=False)
    clean[1::2] = args[1::2]
    check_against_tf(fn, clean, "SoftmaxCrossEntropyWithLogits")


@pytest.mark.parametrize("label_dtype", [I32, I64], ids=["int32", "int64"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_sparse_softmax_cross_entropy(dtype: Any, label_dtype: Any) -> None:
    shapes = [(4, 5), (1, 1), (0, 3), (6, 2)]
    rng = np.random.default_rng(7)
    args = []
    for k, shape in enumerate(shapes):
        args += [sample(shape, dtype, seed=k, edges=False),
                 rng.integers(0, shape[1], size=shape[:1]).astype(label_dtype)]
    args[0][1, 2] = 80.0  # a dominant logit
    args[0][2, :] = -30.0  # a flat row
    fn = over_shapes(lambda x, y: raw.SparseSoftmaxCrossEntropyWithLogits(features=x,
                                                                          labels=y), 2)
    check_against_tf(fn, args, "SparseSoftmaxCrossEntropyWithLogits")


# -- arg max / min and one-hot ----------------------------------------------------------------
ARG_CASES = [((3, 4), 1), ((3, 4), 0), ((2, 3, 4), -1), ((5,), 0), ((1, 1), 0), ((0, 3), 1),
             ((4, 6), -2)]


@pytest.mark.parametrize("output_type", [tf.int32, tf.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("op_type, reduce_fn", [("ArgMax", tf.math.argmax),
                                                ("ArgMin", tf.math.argmin)])
@pytest.mark.parametrize("dtype", [F32, F64, I32, I64],
                         ids=["float32", "float64", "int32", "int64"])
def test_arg_reductions(op_type: str, reduce_fn: Callable[..., Any], dtype: Any,
                        output_type: tf.DType) -> None:
    # Small integer ranges make ties: the first index must win. Floats carry NaN and ±inf.
    args = inputs([[shape] for shape, _ in ARG_CASES], [dtype], low=-1, high=1)
    if np.dtype(dtype).kind == "f":
        args = [np.round(a * 2) / 2 for a in args]  # ties among floats too

    def fn(*xs: Any) -> list[Any]:
        return [reduce_fn(x, axis=axis, output_type=output_type)
                for x, (_, axis) in zip(xs, ARG_CASES)]

    check_against_tf(fn, args, op_type)


@pytest.mark.parametrize("k", [0, 1, 2, 5, 9, -1])
@pytest.mark.parametrize("index_dtype", [I32, I64], ids=["int32", "int64"])
def test_in_top_k(index_dtype: Any, k: int) -> None:
    # Ties (halves), a NaN row, an infinite row, a flat row, targets out of range, and
    # empty shapes: TF's kernel says false for non-finite rows and bad targets.
    rng = np.random.default_rng(5)
    predictions = np.round(rng.standard_normal((7, 5)) * 2).astype(np.float32) / 2
    predictions[1, 3], predictions[2, 0], predictions[4, 2] = np.nan, np.inf, -np.inf
    predictions[3, :] = 1.0
    targets = np.array([0, 1, 2, 3, 4, 7, -1], index_dtype)
    args = [predictions, targets, np.zeros((0, 3), np.float32), np.zeros((0,), index_dtype),
            np.ones((2, 0), np.float32), np.zeros((2,), index_dtype)]

    def fn(*xs: Any) -> list[Any]:
        return [tf.raw_ops.InTopKV2(predictions=p, targets=t, k=tf.constant(k, index_dtype))
                for p, t in zip(xs[::2], xs[1::2])]

    check_against_tf(fn, args, "InTopKV2")


@pytest.mark.parametrize("value_dtype", [F32, I32, BOOL], ids=["float32", "int32", "bool"])
@pytest.mark.parametrize("index_dtype", [I32, I64], ids=["int32", "int64"])
def test_one_hot(index_dtype: Any, value_dtype: Any) -> None:
    shapes = [(5,), (2, 3), (), (0,)]
    rng = np.random.default_rng(3)
    args = [rng.integers(-1, 5, size=s).astype(index_dtype) for s in shapes]
    on, off = (np.array(True), np.array(False)) if value_dtype == BOOL else (
        np.array(5, value_dtype), np.array(-2, value_dtype))

    def fn(*xs: Any) -> list[Any]:
        return [tf.one_hot(x, 4, on_value=on, off_value=off, axis=axis)
                for x, axis in zip(xs, (-1, 0, -1, 0))] + [tf.one_hot(xs[1], 3, axis=1)]

    check_against_tf(fn, args, "OneHot")


# -- whole gradients of the seed models -------------------------------------------------------
def _layer_norm(x: Any, gamma: Any, beta: Any) -> Any:
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + 1e-5) * gamma + beta


def _cross_entropy(logits: Any, labels: Any) -> Any:
    return tf.nn.softmax_cross_entropy_with_logits(labels=tf.nn.softmax(labels), logits=logits)


def _sparse_cross_entropy(logits: Any) -> Any:
    labels = tf.constant([1, 2, 0, 3])
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


SEED_MODELS = {
    "mlp": (examples.mlp, [(8, 16), (16, 32), (32,), (32, 8), (8,)]),
    "gelu": (examples.gelu, [(4, 8)]),
    "gelu_tanh": (lambda x: tf.nn.gelu(x, approximate=True), [(4, 8)]),
    "softmax": (examples.softmax, [(4, 8)]),
    "self_attention": (examples.self_attention, [(2, 4, 8)] + [(8, 8)] * 4),
    "layer_norm": (_layer_norm, [(4, 8), (8,), (8,)]),
    "cross_entropy": (_cross_entropy, [(4, 5), (4, 5)]),
    "sparse_cross_entropy": (_sparse_cross_entropy, [(4, 5)]),
    "mse": (lambda a, b: tf.reduce_mean(tf.square(a - b)), [(4, 3), (4, 3)]),
    "activations": (lambda x: tf.nn.elu(x) + tf.nn.selu(x) + tf.sigmoid(x) + tf.nn.softplus(x)
                    + tf.nn.relu6(x) + tf.nn.leaky_relu(x) + tf.sqrt(tf.abs(x) + 1)
                    + tf.math.reciprocal(x * x + 1), [(3, 4)]),
    "slices": (lambda x: tf.reduce_sum(x[1:, ::2] * 2.0) + tf.reduce_sum(tf.tile(x, [2, 1]))
               + tf.reduce_sum(tf.pad(x, [[1, 0], [2, 1]]) ** 2), [(4, 6)]),
}
def _gradient_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
    def gradients(*xs: Any) -> Any:
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            loss = tf.reduce_sum(fn(*xs))
        return [loss] + list(tape.gradient(loss, xs))

    return gradients


def _model_compare(actual: np.ndarray, expected: np.ndarray, op_type: str, context: str
                   ) -> None:
    assert_close(actual, expected, "model gradient", context)


@pytest.mark.parametrize("name", sorted(SEED_MODELS))
def test_seed_model_gradients_compile(name: str) -> None:
    fn, shapes = SEED_MODELS[name]
    args = [sample(s, F32, seed=k, edges=False, low=-2, high=2) for k, s in enumerate(shapes)]
    gradients = _gradient_fn(fn)
    graph = trace(gradients, args).graph
    left_out = {d.op_type: d.reason for d in mark(graph).values()
                if not d.compilable and d.op_type not in PLUMBING_OPS}
    assert not left_out, f"{name}: compute ops left in TF: {left_out}"
    check_against_tf(gradients, args, "Sum", compare=_model_compare)


def test_gelu_gradient_uses_the_compiled_erf() -> None:
    x = sample((4, 8), F32, seed=1, edges=False)
    check_against_tf(_gradient_fn(lambda v: 0.5 * v * (1 + tf.math.erf(v / math.sqrt(2.0)))),
                     [x], "Erf", compare=_model_compare)


# -- Erfc: Keras' exact gelu ------------------------------------------------------------------
def _ordered_bits(values: np.ndarray) -> np.ndarray:
    """float32 bits as integers ordered like the floats, so differences count ulps."""
    bits = values.astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _erfc_sweep() -> np.ndarray:
    # Dense over [-12, 12] (erfc underflows past 10.05; 1 - erf(x) would be 0 from 3.9 on),
    # plus the branch points and the edges.
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, np.nextafter(1, 2), 2.0, -2.0,
             np.nextafter(2, 0), 9.194, 10.05, 10.06, 1e-30, -1e30]
    return np.concatenate([np.linspace(-12, 12, 120001), edges]).astype(F32)


def test_erfc_f32_accuracy() -> None:
    x = _erfc_sweep()
    concrete = trace(tf.math.erfc, [x])
    evaluated, executed = run_clusters(concrete, [x])
    exact = np.array([math.erfc(float(v)) if np.isfinite(v) else math.nan for v in x])
    exact[x == np.inf], exact[x == -np.inf] = 0.0, 2.0
    expected_tf = tf.math.erfc(x).numpy()
    normal = np.abs(exact) >= np.finfo(F32).tiny
    finite = np.isfinite(x)
    for where, actual in [("evaluator", *evaluated.values()), ("compiled", *executed.values())]:
        assert np.array_equal(np.isnan(actual), np.isnan(x)), where
        assert actual[x == np.inf] == 0 and actual[x == -np.inf] == 2, where
        # Where erfc is a normal float: within 8 ulp of the exact value (TF's own kernel
        # is 65 ulp off near x = 8.8, where exp(-x²) loses the rounding error of x²).
        error = np.abs(_ordered_bits(actual[normal]) - _ordered_bits(exact[normal]))
        assert error.max() <= 8, f"{where}: {error.max()} ulp at x={x[normal][error.argmax()]}"
        tf_error = np.abs(_ordered_bits(expected_tf[normal]) - _ordered_bits(exact[normal]))
        assert np.all(error <= tf_error + 8), where
        # Below FLT_MIN: TF flushes to zero; we are within one smallest normal of exact.
        tail = finite & ~normal
        assert np.abs(actual[tail] - exact[tail]).max() <= np.finfo(F32).tiny, where


def test_erfc_against_tf() -> None:
    check_against_tf(over_shapes(tf.math.erfc, 1), inputs([[(3, 4)], [(0,)], [(7,)]], [F32]),
                     "Erfc")


def test_erfc_f64_accuracy() -> None:
    """Cephes' float64 erfc (XLA's ErfcImpl64) with exp(-x²) taken without rounding x²:
    within a few ulp of the exact value wherever erfc is a normal double, as TF's kernel
    (glibc's erfc) is."""
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, np.nextafter(1, 0), 8.0,
             np.nextafter(8, 0), -8.0, 26.5, 26.7, 27.3, 1e-300, -1e300]
    x = np.concatenate([np.linspace(-28, 28, 56001), edges])
    concrete = trace(tf.math.erfc, [x])
    evaluated, executed = run_clusters(concrete, [x])
    exact = np.array([math.erfc(float(v)) if np.isfinite(v) else math.nan for v in x])
    exact[x == np.inf], exact[x == -np.inf] = 0.0, 2.0
    normal = np.abs(exact) >= np.finfo(F64).tiny
    for where, actual in [("evaluator", *evaluated.values()), ("compiled", *executed.values())]:
        assert np.array_equal(np.isnan(actual), np.isnan(x)), where
        assert actual[x == np.inf] == 0 and actual[x == -np.inf] == 2, where
        # 8 ulp at most on this sweep; TF's kernel is 489 ulp off near x = 26.1.
        error = np.abs(actual[normal] - exact[normal]) / np.spacing(exact[normal])
        assert error.max() <= 10, f"{where}: {error.max()} ulp at x={x[normal][error.argmax()]}"
        assert np.abs(actual[~normal & np.isfinite(x)]).max() <= np.finfo(F64).tiny, where
    check_against_tf(tf.math.erfc, [x], "Erfc")


def test_exact_gelu_gradient_compiles() -> None:
    # keras.activations.gelu(approximate=False): 0.5·x·erfc(-x/√2); its gradient is made of
    # Exp, Square, Neg and Mul, all compiled.
    x = sample((4, 8), F32, seed=2, edges=False) * 3
    gelu = _gradient_fn(lambda v: 0.5 * v * tf.math.erfc(-v / math.sqrt(2.0)))
    graph = trace(gelu, [x]).graph
    left_out = {d.op_type: d.reason for d in mark(graph).values()
                if not d.compilable and d.op_type not in PLUMBING_OPS}
    assert not left_out, left_out
    check_against_tf(gelu, [x], "Erfc", compare=_model_compare)


TESTED_OPS = ({o for o, _, _ in GRADIENTS} | {o for o, _, _ in DIVISIONS}
              | {o for o, _, _ in UNARY}
              | {"BiasAddGrad", "BroadcastGradientArgs", "ClipByValue",
                 "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits",
                 "ArgMax", "ArgMin", "OneHot", "Erfc", "InTopKV2"})
