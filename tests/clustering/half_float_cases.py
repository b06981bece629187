"""One case per registered TF op that accepts float16/bfloat16: a function building the op
and the inputs it runs on, for the 2-byte-float audit (test_half_float_ops_tf.py).

Inputs are made in the 2-byte dtype itself, so that TF's kernel and the compiled code
see the same values; floats carry NaN, ±inf and -0.0 unless a case needs finite ones
(integer casts, Range bounds), and shapes include 0-size and 1-size dims.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tf_harness import over_shapes, sample

raw = tf.raw_ops
I32 = np.int32
Maker = Callable[[Any], list[np.ndarray]]


@dataclass(frozen=True)
class Case:
    """`fn` applied to `make(dtype)`'s arrays must build `op_type`; `compare_as` names the
    tolerance-table entry to compare with (the op's own by default)."""

    op_type: str
    fn: Callable[..., Any]
    make: Maker
    compare_as: str = ""
    # Outputs compared only on rows that TF finds finite (oneDNN's softmax gives 0 beside
    # a NaN or inf where XLA and tfxla-lite give NaN).
    finite_rows: bool = False


def _array(shape: tuple[int, ...], kind: str, dtype: Any, seed: int) -> np.ndarray:
    """kind: x (edges), f (finite), p (positive finite), b (bool), s (small ints -2..2)."""
    if kind == "b":
        return sample(shape, np.bool_, seed=seed)
    if kind == "s":
        return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(I32)
    low, high = (0.5, 3.0) if kind == "p" else (-3.0, 3.0)
    return sample(shape, np.float32, seed=seed, edges=kind == "x", low=low,
                  high=high).astype(dtype)


def arrays(groups: Sequence[Sequence[tuple[int, ...]]], kinds: str) -> Maker:
    """A maker of one array per (group, kind): the kinds string has one letter an input."""

    def make(dtype: Any) -> list[np.ndarray]:
        return [_array(tuple(shape), kind, dtype, seed=10 * g + k)
                for g, shapes in enumerate(groups) for k, (shape, kind) in
                enumerate(zip(shapes, kinds))]

    return make


UNARY_SHAPES = [[()], [(0,)], [(1,)], [(3, 1, 5)], [(2, 0, 3)], [(4, 7)]]
BINARY_SHAPES = [[(), ()], [(3, 4), (3, 4)], [(3, 1), (1, 4)], [(2, 3, 4), (4,)],
                 [(0, 3), (1, 3)], [(5,), ()], [(1,), (2, 0, 1)]]
SAME_SHAPES = [[(), ()], [(0,), (0,)], [(1,), (1,)], [(3, 4), (3, 4)], [(2, 1, 5), (2, 1, 5)]]


def unary(op_type: str, fn: Callable[..., Any], kind: str = "x") -> Case:
    return Case(op_type, over_shapes(fn, 1), arrays(UNARY_SHAPES, kind))


def binary(op_type: str, fn: Callable[..., Any], kinds: str = "xx",
           shapes: Sequence[Sequence[tuple[int, ...]]] = BINARY_SHAPES) -> Case:
    return Case(op_type, over_shapes(fn, 2), arrays(shapes, kinds))


def _per_case(cases: Sequence[tuple[Any, ...]], apply: Callable[..., Any]) -> Callable[..., Any]:
    """One input per case (its shape first); `apply(x, *rest)` for each."""

    def fn(*xs: Any) -> list[Any]:
        return [apply(x, *case[1:]) for x, case in zip(xs, cases)]

    return fn


def per_case(op_type: str, apply: Callable[..., Any], cases: Sequence[tuple[Any, ...]],
             kind: str = "x", **kwargs: Any) -> Case:
    return Case(op_type, _per_case(cases, apply), arrays([[c[0]] for c in cases], kind),
                **kwargs)


def _then_negate(fn: Callable[..., Any]) -> Callable[..., Any]:
    # A pass-through op alone forms no cluster: give it a neighbour to join.
    return lambda x: -fn(x)


REDUCTION_CASES = [((3, 4), 1, False), ((3, 4), [0, 1], True), ((2, 3, 4), [-1, 0], False),
                   ((2, 0, 3), 1, False), ((2, 0, 3), [0, 2], True), ((5,), [], False),
                   ((), [], True), ((1, 1), 0, True)]
ARG_CASES = [((3, 4), 1), ((3, 4), 0), ((2, 3, 4), -1), ((5,), 0), ((1, 1), 0), ((0, 3), 1)]
MATMUL_CASES = [((3, 4), (4, 5), False, False), ((4, 3), (4, 5), True, False),
                ((3, 4), (5, 4), False, True), ((1, 1), (1, 1), False, False),
                ((0, 3), (3, 2), False, False), ((2, 0), (0, 3), False, False)]
BATCH_CASES = [((2, 3, 4), (2, 4, 5), False, False), ((1, 3, 4), (2, 4, 5), False, False),
               ((2, 4, 3), (2, 5, 4), True, True), ((0, 2, 3), (3, 2), False, False)]


def _dots(apply: Callable[..., Any], cases: Sequence[tuple[Any, ...]]) -> Callable[..., Any]:
    def fn(*xs: Any) -> list[Any]:
        return [apply(xs[2 * i], xs[2 * i + 1], *case[2:]) for i, case in enumerate(cases)]

    return fn


def _dot_inputs(cases: Sequence[tuple[Any, ...]]) -> Maker:
    return arrays([[c[0], c[1]] for c in cases], "ff")


def _cross_entropy_inputs(dtype: Any) -> list[np.ndarray]:
    args = arrays([[(4, 5), (4, 5)], [(1, 1), (1, 1)], [(0, 3), (0, 3)], [(3, 0), (3, 0)]],
                  "xp")(dtype)
    for k in range(1, len(args), 2):  # labels: rows of probabilities
        labels = args[k].astype(np.float32)
        args[k] = (labels / np.maximum(labels.sum(axis=-1, keepdims=True), 1e-3)).astype(dtype)
    return args


def _sparse_cross_entropy_inputs(dtype: Any) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    args = []
    for k, shape in enumerate([(4, 5), (1, 1), (0, 3), (6, 2)]):
        args += [_array(shape, "f", dtype, seed=k),
                 rng.integers(0, shape[1], size=shape[:1]).astype(I32)]
    return args


def _with_ints(kinds: str, groups: Sequence[Sequence[tuple[int, ...]]],
               ints: Sequence[np.ndarray]) -> Maker:
    """Half arrays of `groups` (kinds per array), then the integer arrays `ints` as given."""

    def make(dtype: Any) -> list[np.ndarray]:
        return arrays(groups, kinds)(dtype) + [np.asarray(i, I32) for i in ints]

    return make


ROWS = np.array([[1], [3], [1]], I32)
CELLS = np.array([[0, 1], [5, 3], [0, 1]], I32)
SEGMENTS = np.array([0, 2, 0, 3, 3], I32)


def _scatters(x: Any, updates: Any, cell_updates: Any, rows: Any, cells: Any) -> list[Any]:
    return [tf.scatter_nd(rows, updates, [6, 4]), tf.scatter_nd(cells, cell_updates, [6, 4]),
            tf.tensor_scatter_nd_add(x, rows, updates),
            tf.tensor_scatter_nd_update(x, rows[:2], updates[:2]),
            tf.tensor_scatter_nd_max(x, cells, cell_updates),
            tf.tensor_scatter_nd_min(x, rows, updates)]


_SCATTER_INPUTS = _with_ints("fff", [[(6, 4), (3, 4), (3,)]], [ROWS, CELLS])


def _segments(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda d, e, s: [fn(d, s, 4), fn(e, s[:0], 2)]


_SEGMENT_INPUTS = _with_ints("xx", [[(5, 3), (0, 3)]], [SEGMENTS])


def _range(x: Any) -> list[Any]:
    # Constant bounds: runtime ones would give the result an unknown length.
    dtype = x.dtype
    return [x + tf.range(tf.constant(-1.5, dtype), tf.constant(2.0, dtype),
                         tf.constant(0.75, dtype)),
            tf.range(tf.constant(0.5, dtype), tf.constant(0.5, dtype), tf.constant(1.0, dtype))]


def _casts(x: Any, finite: Any) -> list[Any]:
    other = tf.bfloat16 if x.dtype == tf.float16 else tf.float16
    return [tf.cast(x, tf.float32), tf.cast(x, tf.float64), tf.cast(x, other),
            tf.cast(x, tf.bool), tf.cast(finite, tf.int32), tf.cast(finite, tf.int64),
            tf.cast(tf.cast(finite, tf.int32), x.dtype), tf.cast(tf.cast(x, tf.float32), x.dtype),
            tf.cast(x > 0, x.dtype)]


def _clip(x: Any, a: Any, b: Any) -> Any:
    return raw.ClipByValue(t=x, clip_value_min=tf.minimum(a, b), clip_value_max=tf.maximum(a, b))


def _gathers(p: Any, q: Any, i: Any) -> list[Any]:
    return [tf.gather(p, i), tf.gather(p, i, axis=1), tf.gather(q, i[:0])]


def _stitch(a: Any, b: Any) -> Any:
    return tf.dynamic_stitch([tf.constant([4, 1]), tf.constant([[0, 2], [3, 5]])], [a, b])


def _strided_slice_grad(dy: Any) -> Any:
    return raw.StridedSliceGrad(shape=[4, 6], begin=[1, 0], end=[4, 6], strides=[2, 3],
                                dy=dy)


CASES: list[Case] = [
    # -- element-wise unary --
    *[unary(op, fn) for op, fn in [
        ("Abs", tf.abs), ("Atan", tf.math.atan), ("Ceil", tf.math.ceil), ("Cos", tf.cos),
        ("Erf", tf.math.erf), ("Erfc", tf.math.erfc), ("Exp", tf.exp), ("Expm1", tf.math.expm1),
        ("Floor", tf.floor), ("Inv", lambda x: raw.Inv(x=x)), ("Log", tf.math.log),
        ("Log1p", tf.math.log1p), ("Neg", tf.negative), ("Reciprocal", tf.math.reciprocal),
        ("Relu", tf.nn.relu), ("Relu6", tf.nn.relu6), ("Rint", tf.math.rint),
        ("Round", tf.round), ("Rsqrt", tf.math.rsqrt), ("Selu", tf.nn.selu),
        ("Sigmoid", tf.sigmoid), ("Sign", tf.sign), ("Sin", tf.sin), ("Softplus", tf.nn.softplus),
        ("Softsign", tf.nn.softsign), ("Sqrt", tf.sqrt), ("Square", tf.square),
        ("Tan", tf.math.tan), ("Tanh", tf.tanh), ("Elu", tf.nn.elu),
        ("LeakyRelu", lambda x: tf.nn.leaky_relu(x, alpha=0.3)),
        ("IsFinite", tf.math.is_finite), ("IsInf", tf.math.is_inf), ("IsNan", tf.math.is_nan),
        ("ZerosLike", lambda x: raw.ZerosLike(x=x)), ("OnesLike", lambda x: raw.OnesLike(x=x)),
        ("Identity", _then_negate(tf.identity)),
        ("Snapshot", _then_negate(lambda x: raw.Snapshot(input=x))),
        ("StopGradient", _then_negate(tf.stop_gradient)),
        ("PreventGradient", _then_negate(lambda x: raw.PreventGradient(input=x))),
        ("IdentityN", _then_negate(lambda x: raw.IdentityN(input=[x, x])[1])),
        ("L2Loss", tf.nn.l2_loss)]],
    Case("Const", over_shapes(lambda x: x + tf.constant([1.5, -0.0, float("nan")], x.dtype), 1),
         arrays([[(3,)], [(2, 3)]], "x")),
    # -- element-wise binary --
    *[binary(op, fn) for op, fn in [
        ("Add", lambda x, y: raw.Add(x=x, y=y)), ("AddV2", tf.add), ("Atan2", tf.math.atan2),
        ("Div", lambda x, y: raw.Div(x=x, y=y)), ("DivNoNan", tf.math.divide_no_nan),
        ("Equal", tf.equal), ("FloorDiv", tf.math.floordiv), ("FloorMod", tf.math.floormod),
        ("Greater", tf.greater), ("GreaterEqual", tf.greater_equal), ("Less", tf.less),
        ("LessEqual", tf.less_equal), ("Maximum", tf.maximum), ("Minimum", tf.minimum),
        ("Mul", tf.multiply), ("NotEqual", tf.not_equal), ("Pow", tf.pow),
        ("RealDiv", tf.truediv), ("SquaredDifference", tf.math.squared_difference),
        ("Sub", tf.subtract), ("TruncateMod", tf.truncatemod), ("Xdivy", tf.math.xdivy),
        ("Xlog1py", tf.math.xlog1py), ("Xlogy", tf.math.xlogy)]],
    # -- gradient kernels (same shapes, no broadcasting) --
    *[binary(op, fn, shapes=SAME_SHAPES) for op, fn in [
        ("ReluGrad", lambda g, x: raw.ReluGrad(gradients=g, features=x)),
        ("Relu6Grad", lambda g, x: raw.Relu6Grad(gradients=g, features=x * 3)),
        ("LeakyReluGrad", lambda g, x: raw.LeakyReluGrad(gradients=g, features=x, alpha=0.2)),
        ("SoftplusGrad", lambda g, x: raw.SoftplusGrad(gradients=g, features=x)),
        ("EluGrad", lambda g, y: raw.EluGrad(gradients=g, outputs=y)),
        ("SeluGrad", lambda g, y: raw.SeluGrad(gradients=g, outputs=y)),
        ("SigmoidGrad", lambda dy, y: raw.SigmoidGrad(y=y, dy=dy)),
        ("TanhGrad", lambda dy, y: raw.TanhGrad(y=y, dy=dy)),
        ("SqrtGrad", lambda dy, y: raw.SqrtGrad(y=y, dy=dy)),
        ("RsqrtGrad", lambda dy, y: raw.RsqrtGrad(y=y, dy=dy)),
        ("ReciprocalGrad", lambda dy, y: raw.ReciprocalGrad(y=y, dy=dy)),
        ("InvGrad", lambda dy, y: raw.InvGrad(y=y, dy=dy)),
        ("SoftsignGrad", lambda g, x: raw.SoftsignGrad(gradients=g, features=x))]],
    # -- selects, clips, sums of tensors, casts --
    Case("ClipByValue", over_shapes(_clip, 3),
         arrays([[(3, 4), (), ()], [(3, 4), (3, 4), (3, 4)], [(0, 2), (), ()]], "xff")),
    Case("SelectV2", over_shapes(tf.where, 3),
         arrays([[(3, 4)] * 3, [(3, 1), (1, 4), ()], [(2, 0, 3), (3,), (1,)]], "bxx")),
    Case("Select", over_shapes(lambda c, x, y: raw.Select(condition=c, x=x, y=y), 3),
         arrays([[(3, 4)] * 3, [(3,), (3, 2), (3, 2)], [(0,), (0, 4), (0, 4)]], "bxx")),
    Case("AddN", over_shapes(lambda a, b, c: tf.add_n([a, b, c]), 3),
         arrays([[(), (), ()], [(3, 4)] * 3, [(0, 2)] * 3], "xxx")),
    Case("Cast", over_shapes(_casts, 2), arrays([[(), ()], [(0,), (0,)], [(3, 5), (3, 5)]],
                                                "xf")),
    # -- reductions --
    *[per_case(op, lambda x, axis, keep, f=fn: f(x, axis=axis, keepdims=keep), REDUCTION_CASES)
      for op, fn in [("Sum", tf.reduce_sum), ("Mean", tf.reduce_mean), ("Max", tf.reduce_max),
                     ("Min", tf.reduce_min), ("Prod", tf.reduce_prod)]],
    *[per_case(op, lambda x, axis, f=fn: f(x, axis=axis), ARG_CASES)
      for op, fn in [("ArgMax", tf.math.argmax), ("ArgMin", tf.math.argmin)]],
    # -- dots --
    Case("MatMul", _dots(lambda a, b, ta, tb: tf.linalg.matmul(a, b, transpose_a=ta,
                                                               transpose_b=tb), MATMUL_CASES),
         _dot_inputs(MATMUL_CASES)),
    *[Case(op, _dots(lambda a, b, ax, ay, f=fn: f(a, b, ax, ay), BATCH_CASES),
           _dot_inputs(BATCH_CASES)) for op, fn in [
        ("BatchMatMulV2", lambda a, b, ax, ay: raw.BatchMatMulV2(x=a, y=b, adj_x=ax, adj_y=ay)),
        ("BatchMatMulV3", lambda a, b, ax, ay: raw.BatchMatMulV3(x=a, y=b, Tout=a.dtype,
                                                                  adj_x=ax, adj_y=ay))]],
    Case("BatchMatMul", _dots(lambda a, b, *_: raw.BatchMatMul(x=a, y=b), BATCH_CASES[:1]),
         _dot_inputs(BATCH_CASES[:1])),
    # -- convolutions (finite inputs: a NaN or inf reaching a padded window is another
    # matter, test_conv_ops) --
    Case("Conv2D", lambda x, w, y, v: [tf.nn.conv2d(x, w, 1, "VALID"),
                                       tf.nn.conv2d(y, v, 2, "SAME", dilations=1)],
         arrays([[(1, 5, 5, 3), (3, 3, 3, 4), (2, 6, 5, 2), (2, 2, 2, 3)]], "ffff")),
    # Positive operands: TF's float16 Conv3D and depthwise kernels (Eigen's) sum in float16,
    # and cancellation left them 4-5% from the exact sum where the compiled one was within
    # 0.1%.
    Case("Conv3D", lambda x, w: tf.nn.conv3d(x, w, [1, 1, 1, 1, 1], "VALID"),
         arrays([[(1, 4, 4, 3, 2), (2, 2, 2, 2, 3)]], "pp")),
    Case("DepthwiseConv2dNative",
         lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "VALID"),
         arrays([[(1, 5, 4, 3), (2, 2, 3, 2)]], "pp")),
    Case("Einsum", lambda a, b, c: [tf.einsum("ij,jk->ik", a, b), tf.einsum("bij,bj->bi", c, a),
                                    tf.einsum("ij->ji", a)],
         arrays([[(2, 3), (3, 4), (2, 2, 3)]], "fff")),
    # -- biases, softmax, losses --
    Case("BiasAdd", over_shapes(lambda v, b, w, c: [tf.nn.bias_add(v, b),
                                                    tf.nn.bias_add(w, c, "NCHW")], 4),
         arrays([[(2, 3, 4), (4,), (2, 4, 3, 3), (4,)], [(0, 5), (5,), (1, 1, 1), (1,)]],
                "xxxx")),
    Case("BiasAddV1", over_shapes(lambda v, b: raw.BiasAddV1(value=v, bias=b), 2),
         arrays([[(2, 3, 4), (4,)], [(0, 5), (5,)]], "xx")),
    per_case("BiasAddGrad", lambda x, f: raw.BiasAddGrad(out_backprop=x, data_format=f),
             [((2, 3, 4), "NHWC"), ((2, 4, 3, 3), "NCHW"), ((0, 5), "NHWC"), ((3, 1), "NHWC")],
             kind="f"),
    per_case("Softmax", tf.nn.softmax, [((3, 4),), ((1, 1),), ((2, 3, 5),), ((0, 4),)],
             finite_rows=True),
    per_case("LogSoftmax", tf.nn.log_softmax, [((3, 4),), ((1, 1),), ((2, 3, 5),), ((0, 4),)],
             finite_rows=True),
    Case("SoftmaxCrossEntropyWithLogits", over_shapes(
        lambda x, y: raw.SoftmaxCrossEntropyWithLogits(features=x, labels=y), 2),
        _cross_entropy_inputs, finite_rows=True),
    Case("SparseSoftmaxCrossEntropyWithLogits", over_shapes(
        lambda x, y: raw.SparseSoftmaxCrossEntropyWithLogits(features=x, labels=y), 2),
        _sparse_cross_entropy_inputs),
    # -- shapes and layouts --
    per_case("Reshape", lambda x, s: tf.reshape(x, s),
             [((2, 3, 4), [6, -1]), ((0, 3), [3, 0, 1]), ((1,), []), ((), [1, 1])]),
    per_case("Transpose", lambda x, p: tf.transpose(x, p),
             [((3, 4), [1, 0]), ((2, 3, 4), [2, 0, 1]), ((0, 3), [1, 0])]),
    per_case("ExpandDims", lambda x, a: tf.expand_dims(x, a) * 2,
             [((3, 4), 0), ((0,), 1), ((), 0)]),
    per_case("Squeeze", lambda x, a: tf.squeeze(x, a) * 2,
             [((1, 3, 1), None), ((1,), None), ((2, 1, 0), [1])]),
    per_case("Slice", lambda x, b, s: tf.slice(x, b, s),
             [((4, 5), [1, 0], [2, -1]), ((3,), [0], [0]), ((2, 3, 4), [1, 1, 1], [1, 2, 3])]),
    per_case("BroadcastTo", lambda x, s: tf.broadcast_to(x, s),
             [((3, 1), [2, 3, 4]), ((), [2, 2]), ((1,), [0])]),
    per_case("StridedSlice", lambda x, s: x[s],
             [((5, 4), np.s_[1:4:2, ::-1]), ((3,), np.s_[2:0]), ((2, 3, 4), np.s_[..., 1])]),
    Case("StridedSliceGrad", _strided_slice_grad, arrays([[(2, 2)]], "x")),
    per_case("Pad", lambda x, p: tf.pad(x, p), [((2, 3), [[1, 0], [2, 1]]), ((0,), [[1, 1]])]),
    per_case("PadV2", lambda x, p: tf.pad(x, p, constant_values=-2.5),
             [((2, 3), [[1, 0], [2, 1]]), ((1,), [[0, 2]])]),
    per_case("MirrorPad", lambda x, p, m: tf.pad(x, p, mode=m),
             [((3, 4), [[1, 2], [2, 1]], "REFLECT"), ((3, 4), [[1, 0], [0, 3]], "SYMMETRIC")]),
    per_case("Tile", lambda x, m: tf.tile(x, m), [((2, 3), [2, 1]), ((1,), [0]), ((), [])]),
    per_case("ReverseV2", lambda x, a: tf.reverse(x, a), [((3, 4), [1]), ((2, 0, 3), [0, 2])]),
    Case("ConcatV2", lambda a, b, c: [tf.concat([a, b, a], 1), tf.concat([c, c[:0]], 0)],
         arrays([[(2, 3), (2, 1), (3,)]], "xxx")),
    Case("Pack", lambda a, b: [tf.stack([a, b]), tf.stack([a, a], axis=-1)],
         arrays([[(2, 3), (2, 3)]], "xx")),
    Case("Unpack", lambda a: tf.unstack(a, axis=1), arrays([[(2, 3)]], "x")),
    Case("Split", lambda a: tf.split(a, 3, axis=1), arrays([[(2, 6)]], "x")),
    Case("SplitV", lambda a: tf.split(a, [1, 0, 2], axis=1), arrays([[(2, 3)]], "x")),
    Case("Fill", lambda v: [tf.fill([2, 3], v), tf.fill([0], v)], arrays([[()]], "x")),
    Case("Range", _range, arrays([[()]], "x")),
    Case("OneHot", lambda on, off, i: [tf.one_hot(i, 4, on, off), tf.one_hot(i, 3, on, off,
                                                                          axis=0)],
         _with_ints("xx", [[(), ()]], [[0, 3, -1, 2]])),
    # -- gathers, scatters, segments, cumulative --
    Case("GatherV2", _gathers, _with_ints("xx", [[(4, 3), (0, 2)]], [[2, 0, 2]])),
    Case("Gather", lambda p, i: raw.Gather(params=p, indices=i),
         _with_ints("x", [[(4, 3)]], [[3, 1, 1]])),
    Case("GatherNd", lambda p, i: tf.gather_nd(p, i), _with_ints("x", [[(4, 3)]],
                                                                  [[[1, 2], [3, 0]]])),
    Case("DynamicStitch", _stitch, arrays([[(2, 3), (2, 2, 3)]], "xx")),
    Case("ScatterNd", _scatters, _SCATTER_INPUTS, compare_as="Sum"),
    *[Case(op, _scatters, _SCATTER_INPUTS, compare_as="Sum") for op in (
        "TensorScatterAdd", "TensorScatterUpdate", "TensorScatterMax", "TensorScatterMin")],
    *[Case(op, _segments(fn), _SEGMENT_INPUTS, compare_as="Sum") for op, fn in [
        ("UnsortedSegmentSum", tf.math.unsorted_segment_sum),
        ("UnsortedSegmentProd", tf.math.unsorted_segment_prod),
        ("UnsortedSegmentMax", tf.math.unsorted_segment_max),
        ("UnsortedSegmentMin", tf.math.unsorted_segment_min)]],
    per_case("Cumsum", lambda x, a, e, r: tf.cumsum(x, a, exclusive=e, reverse=r),
             [((3, 4), 1, False, False), ((3, 4), 0, True, True), ((0, 2), 1, False, True)],
             compare_as="Sum"),
    per_case("CumulativeLogsumexp", lambda x, a, e, r: tf.math.cumulative_logsumexp(
        x, a, exclusive=e, reverse=r),
        [((3, 4), 1, False, False), ((3, 4), 0, True, True), ((0, 2), 1, False, True),
         ((1,), 0, True, False)], compare_as="Sum"),
    per_case("Roll", lambda x, s, a: tf.roll(x, s, a),
             [((3, 4), 1, 0), ((3, 4), [-5, 2], [1, 0]), ((0, 3), 2, 1), ((1,), 3, 0)]),
    per_case("MatrixBandPart", lambda x, lo, hi: tf.linalg.band_part(x, lo, hi),
             [((3, 4), 0, -1), ((2, 4, 3), 1, 0), ((0, 2), -1, 1), ((1, 1), 0, 0)]),
    per_case("TopKV2", lambda x, k: tf.math.top_k(x, k), [((3, 5), 5), ((2, 1, 4), 2),
                                                         ((0, 3), 1), ((4,), 0)], kind="f"),
    per_case("Cumprod", lambda x, a, e, r: tf.math.cumprod(x, a, exclusive=e, reverse=r),
             [((3, 4), 1, False, False), ((3, 4), 0, True, True), ((1, 0), 1, False, False)],
             compare_as="Prod"),
]

# -- pooling, batch norm, convolution gradients, random draws (finite inputs: NaN and
# infinities in windows are test_pooling's, seeds and shapes test_random_ops') --
_POOL = dict(ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="VALID")
_POOL3 = dict(ksize=[1, 2, 2, 2, 1], strides=[1, 2, 2, 2, 1], padding="VALID")


def _max_pool_grads(x: Any, g: Any) -> list[Any]:
    y = raw.MaxPool(input=x, **_POOL)
    vector = dict(ksize=tf.constant(_POOL["ksize"]), strides=tf.constant(_POOL["strides"]),
                  padding="VALID")
    return [raw.MaxPoolGrad(orig_input=x, orig_output=y, grad=g, **_POOL),
            raw.MaxPoolGradV2(orig_input=x, orig_output=y, grad=g, **vector),
            raw.MaxPoolGradGrad(orig_input=x, orig_output=y, grad=x * 0.5, **_POOL),
            raw.MaxPoolGradGradV2(orig_input=x, orig_output=y, grad=x * 0.5, **vector)]


def _max_pool_3d_grad(x: Any, g: Any) -> Any:
    y = raw.MaxPool3D(input=x, **_POOL3)
    return raw.MaxPool3DGrad(orig_input=x, orig_output=y, grad=g, **_POOL3)


def _max_pool_3d_grad_grad(x: Any) -> Any:
    y = raw.MaxPool3D(input=x, **_POOL3)
    return raw.MaxPool3DGradGrad(orig_input=x, orig_output=y, grad=x * 0.5, **_POOL3)


def _batch_norms(x: Any, scale: Any, offset: Any) -> list[Any]:
    f32 = [tf.cast(v, tf.float32) for v in (scale, offset)]
    empty = tf.constant([], tf.float32)
    out = []
    for op in (raw.FusedBatchNormV2, raw.FusedBatchNormV3):
        out.extend(op(x=x, scale=f32[0], offset=f32[1], mean=empty, variance=empty,
                      epsilon=1e-3, is_training=True)[:3])
    return out


def _batch_norm_grads(dy: Any, x: Any, scale: Any) -> list[Any]:
    s = tf.cast(scale, tf.float32)
    mean, variance = tf.reduce_mean(tf.cast(x, tf.float32), [0, 1, 2]), tf.ones_like(s)
    out = []
    for op in (raw.FusedBatchNormGradV2, raw.FusedBatchNormGradV3):
        extra = {"reserve_space_3": tf.constant([], tf.float32)} \
            if op is raw.FusedBatchNormGradV3 else {}
        out.extend(op(y_backprop=dy, x=x, scale=s, reserve_space_1=mean,
                      reserve_space_2=variance, epsilon=1e-3, is_training=True, **extra)[:3])
    return out


def _conv_grads(x: Any, w: Any, dy: Any) -> list[Any]:
    sizes = dict(strides=[1, 1, 1, 1], padding="VALID")
    return [raw.Conv2DBackpropInput(input_sizes=tf.constant([1, 5, 5, 3]), filter=w,
                                    out_backprop=dy, **sizes),
            raw.Conv2DBackpropFilter(input=x, filter_sizes=tf.constant([3, 3, 3, 4]),
                                     out_backprop=dy, **sizes)]


def _depthwise_grads(x: Any, w: Any, dy: Any) -> list[Any]:
    sizes = dict(strides=[1, 1, 1, 1], padding="VALID")
    return [raw.DepthwiseConv2dNativeBackpropInput(input_sizes=tf.constant([1, 5, 4, 3]),
                                                   filter=w, out_backprop=dy, **sizes),
            raw.DepthwiseConv2dNativeBackpropFilter(input=x, filter_sizes=tf.constant(
                [2, 2, 3, 2]), out_backprop=dy, **sizes)]


def _conv3d_grads(x: Any, w: Any, dy: Any) -> list[Any]:
    sizes = dict(strides=[1, 1, 1, 1, 1], padding="VALID")
    return [raw.Conv3DBackpropInputV2(input_sizes=tf.constant([1, 4, 4, 3, 2]), filter=w,
                                      out_backprop=dy, **sizes),
            raw.Conv3DBackpropFilterV2(input=x, filter_sizes=tf.constant([2, 2, 2, 2, 3]),
                                       out_backprop=dy, **sizes)]


def _draws(x: Any) -> list[Any]:
    seed = tf.constant([7, -3])
    key, counter = raw.StatelessRandomGetKeyCounter(seed=seed)
    shape = tf.constant([3, 5])
    return [x + raw.StatelessRandomUniform(shape=shape, seed=seed, dtype=x.dtype),
            x + raw.StatelessRandomNormal(shape=shape, seed=seed, dtype=x.dtype),
            x + raw.StatelessRandomUniformV2(shape=shape, key=key, counter=counter, alg=1,
                                             dtype=x.dtype),
            x + raw.StatelessRandomNormalV2(shape=shape, key=key, counter=counter, alg=1,
                                            dtype=x.dtype)]


CASES += [
    Case("MaxPool", lambda x: tf.nn.max_pool2d(x, 2, 2, "SAME"), arrays([[(2, 5, 4, 3)]], "f")),
    Case("MaxPoolV2", lambda x: raw.MaxPoolV2(input=x, ksize=tf.constant([1, 3, 3, 1]),
                                              strides=tf.constant([1, 2, 2, 1]),
                                              padding="SAME"),
         arrays([[(2, 5, 4, 3)]], "f")),
    Case("MaxPool3D", lambda x: tf.nn.max_pool3d(x, 2, 2, "VALID"),
         arrays([[(1, 4, 4, 4, 2)]], "f")),
    Case("AvgPool", lambda x: tf.nn.avg_pool2d(x, 3, 2, "SAME"), arrays([[(2, 5, 4, 3)]], "f"),
         compare_as="Sum"),
    Case("AvgPool3D", lambda x: tf.nn.avg_pool3d(x, 2, 1, "VALID"),
         arrays([[(1, 3, 4, 3, 2)]], "f"), compare_as="Sum"),
    Case("AvgPoolGrad", lambda g: raw.AvgPoolGrad(orig_input_shape=tf.constant([2, 4, 4, 3]),
                                                  grad=g, **_POOL),
         arrays([[(2, 2, 2, 3)]], "f"), compare_as="Sum"),
    Case("AvgPool3DGrad", lambda g: raw.AvgPool3DGrad(
        orig_input_shape=tf.constant([1, 4, 4, 4, 2]), grad=g, **_POOL3),
        arrays([[(1, 2, 2, 2, 2)]], "f"), compare_as="Sum"),
    *[Case(op, _max_pool_grads, arrays([[(2, 4, 4, 3), (2, 2, 2, 3)]], "ff"), compare_as="Sum")
      for op in ("MaxPoolGrad", "MaxPoolGradV2", "MaxPoolGradGrad", "MaxPoolGradGradV2")],
    Case("MaxPool3DGrad", _max_pool_3d_grad, arrays([[(1, 4, 4, 4, 2), (1, 2, 2, 2, 2)]], "ff"),
         compare_as="Sum"),
    Case("MaxPool3DGradGrad", _max_pool_3d_grad_grad, arrays([[(1, 4, 4, 4, 2)]], "f"),
         compare_as="Sum"),
    *[Case(op, _batch_norms, arrays([[(4, 3, 3, 5), (5,), (5,)]], "fpf"),
           compare_as="FusedBatchNormV3") for op in ("FusedBatchNormV2", "FusedBatchNormV3")],
    *[Case(op, _batch_norm_grads, arrays([[(4, 3, 3, 5), (4, 3, 3, 5), (5,)]], "ffp"),
           compare_as="FusedBatchNormGradV3")
      for op in ("FusedBatchNormGradV2", "FusedBatchNormGradV3")],
    # Positive operands: TF's float16 gradients (Eigen's, where oneDNN lacks AVX-512 half
    # support) accumulate in float16, and cancellation would leave little of their sums.
    *[Case(op, _conv_grads, arrays([[(1, 5, 5, 3), (3, 3, 3, 4), (1, 3, 3, 4)]], "ppp"),
           compare_as="Conv2D") for op in ("Conv2DBackpropInput", "Conv2DBackpropFilter")],
    *[Case(op, _depthwise_grads, arrays([[(1, 5, 4, 3), (2, 2, 3, 2), (1, 4, 3, 6)]], "ppp"),
           compare_as="Conv2D")
      for op in ("DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter")],
    *[Case(op, _conv3d_grads, arrays([[(1, 4, 4, 3, 2), (2, 2, 2, 2, 3), (1, 3, 3, 2, 3)]],
                                     "ppp"), compare_as="Conv2D")
      for op in ("Conv3DBackpropInputV2", "Conv3DBackpropFilterV2")],
    *[Case(op, _draws, arrays([[(3, 5)]], "f"), compare_as="Add") for op in (
        "StatelessRandomUniform", "StatelessRandomNormal", "StatelessRandomUniformV2",
        "StatelessRandomNormalV2")],
    Case("TruncateDiv", over_shapes(tf.truncatediv, 2), arrays(SAME_SHAPES[1:], "fp")),
]
