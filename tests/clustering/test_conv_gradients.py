"""The convolution gradients (Conv2DBackpropInput/Filter, Conv3DBackpropInputV2/FilterV2,
DepthwiseConv2dNativeBackpropInput/Filter) lowered to HLO `convolution`, against TF:
each op directly (tf.raw_ops) and through tf.GradientTape of tf.nn.conv2d,
depthwise_conv2d and conv3d, over strides, SAME/VALID/EXPLICIT padding, dilations, odd
sizes, 1×1 and wide kernels, batch 1, one channel, edge values, NHWC and NCHW,
f32/f64/f16/bf16; through the evaluator and the CPU backend, and through `tl.function`
in both modes. ShapeN and ConcatOffset, which the gradients read their sizes and
offsets from, fold to constants. TF's kernels are the oracle; where TF's CPU kernels
refuse (channels-first layouts) TF's XLA is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, sample, tf_result, trace
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.clustering import cluster_graph, lower_cluster
from tfxla_lite.clustering.mark import MarkOptions, mark
from tfxla_lite.clustering.registry import constant_value
from tfxla_lite.clustering.rules_conv import CONVOLUTION_OPS
from tfxla_lite.options import Options

F16, BF16, F32, F64 = np.float16, tf.bfloat16.as_numpy_dtype, np.float32, np.float64


def _compare(actual: np.ndarray, expected: np.ndarray, op_type: str, where: str) -> None:
    # Every gradient is a convolution: the convolutions' accumulation tolerance.
    assert_close(actual, expected, "convolution", f"{op_type}: {where}")


def _check(fn: Callable[..., Any], args: list[np.ndarray], op_type: str,
           reference_xla: bool = False) -> None:
    """Against TF's XLA where asked (the channels-first layouts TF's CPU kernels lack) or
    where TF's CPU kernel refuses; against TF's kernels otherwise."""
    check_against_tf(fn, args, op_type, compare=_compare,
                     expected=tf_result(fn, args, xla=reference_xla))


def _padding_attrs(padding: str | list[list[int]]) -> dict[str, Any]:
    if isinstance(padding, list):
        return {"padding": "EXPLICIT", "explicit_paddings": sum(padding, [])}
    return {"padding": padding}


def _forward_output_dims(x_shape: tuple[int, ...], k_shape: tuple[int, ...], out_depth: int,
                         strides: tuple[int, ...], padding: Any,
                         dilations: tuple[int, ...]) -> tuple[int, ...]:
    dims = [x_shape[0]]
    for i, (size, k, s, d) in enumerate(zip(x_shape[1:-1], k_shape, strides, dilations)):
        effective = (k - 1) * d + 1
        if padding == "SAME":
            dims.append(-(-size // s))
        elif padding == "VALID":
            dims.append((size - effective) // s + 1)
        else:
            low, high = padding[1 + i]
            dims.append((size + low + high - effective) // s + 1)
    return (*dims, out_depth)


CONV2D_CASES = [
    # (input NHWC, filter HWIO, strides, padding, dilations)
    ((2, 7, 6, 3), (3, 3, 3, 4), (1, 1), "SAME", (1, 1)),
    ((2, 7, 6, 3), (3, 3, 3, 4), (2, 2), "SAME", (1, 1)),
    ((1, 9, 8, 4), (3, 2, 4, 5), (2, 3), "VALID", (1, 1)),
    ((1, 8, 8, 2), (3, 3, 2, 3), (3, 3), "VALID", (1, 1)),  # input elements never read
    ((1, 10, 9, 2), (3, 3, 2, 3), (1, 1), "SAME", (2, 3)),
    ((1, 10, 9, 2), (2, 3, 2, 3), (1, 1), "VALID", (2, 1)),
    ((2, 5, 5, 6), (1, 1, 6, 7), (1, 1), "VALID", (1, 1)),
    ((2, 5, 5, 6), (1, 1, 6, 7), (2, 2), "SAME", (1, 1)),
    ((3, 1, 1, 1), (1, 1, 1, 1), (1, 1), "SAME", (1, 1)),
    ((1, 4, 4, 3), (5, 5, 3, 2), (1, 1), "SAME", (1, 1)),  # window wider than the input
    ((1, 7, 7, 1), (4, 4, 1, 2), (2, 2), "SAME", (1, 1)),  # kernel larger than stride
    ((1, 6, 7, 3), (3, 3, 3, 4), (1, 1), [[0, 0], [2, 0], [1, 3], [0, 0]], (1, 1)),
    ((1, 6, 7, 3), (2, 2, 3, 4), (2, 1), [[0, 0], [0, 1], [3, 2], [0, 0]], (1, 2)),
    ((1, 8, 7, 2), (2, 2, 2, 2), (3, 3), [[0, 0], [1, 0], [2, 0], [0, 0]], (1, 1)),
    ((1, 9, 8, 2), (3, 3, 2, 3), (2, 2), "SAME", (2, 2)),  # phases no tap reaches
    ((1, 11, 10, 2), (2, 3, 2, 2), (2, 3), "VALID", (3, 2)),
]


def _conv2d_case(case: int, dtype: Any = F32, edges: bool = False
                 ) -> tuple[dict[str, Any], list[np.ndarray], tuple[int, ...]]:
    x_shape, w_shape, strides, padding, dilations = CONV2D_CASES[case]
    out = _forward_output_dims(x_shape, w_shape[:2], w_shape[3], strides, padding, dilations)
    attrs = {"strides": [1, *strides, 1], "dilations": [1, *dilations, 1],
             **_padding_attrs(padding)}
    # Weights stay finite: TF's kernels multiply a weight by a padded zero (0·inf = NaN)
    # where XLA's semantics skip the position.
    args = [sample(x_shape, dtype, seed=case, edges=False),
            sample(w_shape, dtype, seed=case + 1, edges=False),
            sample(out, dtype, seed=case + 2, edges=edges)]
    return attrs, args, x_shape


@pytest.mark.parametrize("case", range(len(CONV2D_CASES)))
def test_conv2d_backprop_input(case: int) -> None:
    attrs, (_, w, grad), x_shape = _conv2d_case(case, edges=case % 4 == 0)

    def fn(w: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.Conv2DBackpropInput(input_sizes=tf.constant(x_shape), filter=w,
                                              out_backprop=grad, **attrs)

    _check(fn, [w, grad], "Conv2DBackpropInput")


def test_strided_backprop_input_by_phases() -> None:
    """A stride-2 gradient is four stride-1 convolutions over the undilated gradient, one
    per phase of the input positions (taps 2×2, 2×1, 1×2, 1×1 of a 3×3 filter), each
    one the CPU backend's GEMM path takes (`b01f_01io->b01f`, no lhs_dilate)."""
    attrs, (_, w, grad), x_shape = _conv2d_case(1)

    def fn(w: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.Conv2DBackpropInput(input_sizes=tf.constant(x_shape), filter=w,
                                              out_backprop=grad, **attrs)

    concrete = trace(fn, [w, grad])
    (cluster,) = cluster_graph(concrete.graph, min_cluster_size=1).clusters
    instructions = [i for c in lower_cluster(concrete.graph, cluster).computations
                    for i in c.instructions]
    convolutions = [i for i in instructions if i.opcode == "convolution"]
    assert sorted(tuple(d.size for d in c.attributes["window"].dimensions)
                  for c in convolutions) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for conv in convolutions:
        assert str(conv.attributes["dim_labels"]) == "b01f_01io->b01f"
        assert all(d.base_dilation == 1 and d.stride == 1
                   for d in conv.attributes["window"].dimensions)


@pytest.mark.parametrize("case", range(len(CONV2D_CASES)))
def test_conv2d_backprop_filter(case: int) -> None:
    attrs, (x, w, grad), _ = _conv2d_case(case)
    x = sample(x.shape, F32, seed=case, edges=case % 4 == 1)
    w_shape = w.shape

    def fn(x: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=tf.constant(w_shape),
                                               out_backprop=grad, **attrs)

    _check(fn, [x, grad], "Conv2DBackpropFilter")


def _tape(forward: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
          ) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], list[tf.Tensor]]:
    """The forward's value and the gradients of sum(forward(x, w) · upstream)."""

    def fn(x: tf.Tensor, w: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = forward(x, w)
        return [y, *tape.gradient(y, [x, w], output_gradients=upstream)]

    return fn


@pytest.mark.parametrize("case", [0, 1, 4, 8, 10, 12])
def test_conv2d_gradient_tape(case: int) -> None:
    attrs, args, _ = _conv2d_case(case)
    padding = CONV2D_CASES[case][3]

    def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, w, attrs["strides"], padding, dilations=attrs["dilations"])

    fn = _tape(forward)
    concrete = trace(fn, args)
    (shape_n,) = [op for op in concrete.graph.get_operations() if op.type == "ShapeN"]
    assert [list(constant_value(t)) for t in shape_n.outputs] == [
        list(args[0].shape), list(args[1].shape)]
    _check(fn, args, "Conv2DBackpropInput")


# Wide enough for the CPU backend's direct register blocks (codegen/cpu/
# convolution_direct.py): the forward, and backprop-input as a `01oi` convolution or as
# stride-1 phases.
DIRECT_CASES = [
    ((2, 9, 8, 16), (3, 3, 16, 32), (1, 1), "SAME", (1, 1)),
    ((2, 9, 8, 16), (3, 3, 16, 48), (2, 2), "SAME", (1, 1)),
    ((2, 7, 6, 32), (1, 1, 32, 64), (1, 1), "VALID", (1, 1)),
    ((1, 10, 9, 16), (3, 3, 16, 32), (1, 1), "SAME", (2, 2)),
]


@pytest.mark.parametrize("case", range(len(DIRECT_CASES)))
def test_conv2d_gradient_tape_wide(case: int) -> None:
    x_shape, w_shape, strides, padding, dilations = DIRECT_CASES[case]
    out = _forward_output_dims(x_shape, w_shape[:2], w_shape[3], strides, padding, dilations)
    rng = np.random.default_rng(case)
    # Integers: every sum exact in any order, so the comparison is bit for bit.
    args = [rng.integers(-3, 4, shape).astype(F32) for shape in (x_shape, w_shape, out)]

    def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, w, [1, *strides, 1], padding, dilations=[1, *dilations, 1])

    _check(_tape(forward), args, "Conv2DBackpropInput")


@pytest.mark.parametrize("case", [0, 1, 4, 11])
def test_conv2d_gradient_nchw(case: int) -> None:
    attrs, (x, w, grad), _ = _conv2d_case(case)
    padding = CONV2D_CASES[case][3]
    if isinstance(padding, list):
        padding = [padding[0], padding[3], padding[1], padding[2]]
    strides = [1, 1, *attrs["strides"][1:3]]
    dilations = [1, 1, *attrs["dilations"][1:3]]

    def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, w, strides, padding, dilations=dilations, data_format="NCHW")

    args = [x.transpose(0, 3, 1, 2), w, grad.transpose(0, 3, 1, 2)]
    _check(_tape(forward), args, "Conv2DBackpropFilter", reference_xla=True)


@pytest.mark.parametrize("dtype", [F64, F16, BF16], ids=["f64", "f16", "bf16"])
@pytest.mark.parametrize("case", [1, 4])
def test_conv2d_gradient_dtypes(dtype: Any, case: int) -> None:
    attrs, args, _ = _conv2d_case(case, dtype)

    def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, w, attrs["strides"], CONV2D_CASES[case][3],
                            dilations=attrs["dilations"])

    # TF's CPU kernels accumulate 2-byte floats in their own type, TF's XLA in float32
    # as the lowering does: where terms cancel, only the latter agree within tolerance.
    _check(_tape(forward), args, "Conv2DBackpropInput", reference_xla=dtype != F64)


DEPTHWISE_CASES = [
    # (input NHWC, filter [H, W, C, multiplier], strides, padding, dilations)
    ((2, 6, 5, 3), (3, 3, 3, 1), (1, 1), "SAME", (1, 1)),
    ((1, 7, 7, 4), (3, 3, 4, 2), (2, 2), "VALID", (1, 1)),
    ((1, 8, 6, 2), (2, 3, 2, 3), (1, 2), "SAME", (1, 1)),
    ((1, 9, 9, 2), (3, 3, 2, 1), (1, 1), "SAME", (2, 2)),
    ((1, 6, 6, 3), (3, 3, 3, 2), (1, 1), [[0, 0], [1, 2], [0, 1], [0, 0]], (1, 1)),
    ((1, 5, 5, 1), (1, 1, 1, 3), (2, 2), "SAME", (1, 1)),
]


def _depthwise_case(case: int, dtype: Any = F32
                    ) -> tuple[dict[str, Any], list[np.ndarray], tuple[int, ...]]:
    x_shape, w_shape, strides, padding, dilations = DEPTHWISE_CASES[case]
    out = _forward_output_dims(x_shape, w_shape[:2], w_shape[2] * w_shape[3], strides,
                               padding, dilations)
    attrs = {"strides": [1, *strides, 1], "dilations": [1, *dilations, 1],
             **_padding_attrs(padding)}
    args = [sample(x_shape, dtype, seed=case, edges=False),
            sample(w_shape, dtype, seed=case + 1, edges=False),
            sample(out, dtype, seed=case + 2, edges=case == 0)]
    return attrs, args, x_shape


@pytest.mark.parametrize("case", range(len(DEPTHWISE_CASES)))
def test_depthwise_backprops(case: int) -> None:
    attrs, (x, w, grad), x_shape = _depthwise_case(case)
    w_shape = w.shape

    def fn(x: tf.Tensor, w: tf.Tensor, grad: tf.Tensor) -> list[tf.Tensor]:
        return [tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
                    input_sizes=tf.constant(x_shape), filter=w, out_backprop=grad, **attrs),
                tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
                    input=x, filter_sizes=tf.constant(w_shape), out_backprop=grad, **attrs)]

    # TF's CPU kernels of the depthwise gradients ignore dilations (they return the
    # undilated gradient); TF's XLA is the oracle there.
    dilated = DEPTHWISE_CASES[case][4] != (1, 1)
    _check(fn, [x, w, grad], "DepthwiseConv2dNativeBackpropFilter", reference_xla=dilated)


# tf.nn.depthwise_conv2d builds a dilated convolution from SpaceToBatchND, which has no
# lowering yet: the raw ops above cover the dilations.
@pytest.mark.parametrize("case", [0, 1, 2, 4])
def test_depthwise_gradient_tape(case: int) -> None:
    attrs, args, _ = _depthwise_case(case)

    def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.depthwise_conv2d(x, w, attrs["strides"], DEPTHWISE_CASES[case][3],
                                      dilations=attrs["dilations"][1:3])

    _check(_tape(forward), args, "DepthwiseConv2dNativeBackpropInput")


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_depthwise_gradient_nchw_half(dtype: Any) -> None:
    _, (x, w, grad), _ = _depthwise_case(1, dtype)

    def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 1, 2, 2],
                                                padding="VALID", data_format="NCHW")

    args = [x.transpose(0, 3, 1, 2), w, grad.transpose(0, 3, 1, 2)]
    _check(_tape(forward), args, "DepthwiseConv2dNativeBackpropFilter", reference_xla=True)


@pytest.mark.parametrize("strides, padding, dilations", [
    ((1, 1, 1), "SAME", (1, 1, 1)), ((2, 1, 2), "VALID", (1, 1, 1)),
    ((1, 1, 1), "SAME", (1, 2, 1))])
def test_conv3d_gradient_tape(strides: tuple[int, ...], padding: str,
                              dilations: tuple[int, ...]) -> None:
    x_shape, w_shape = (1, 5, 6, 4, 2), (2, 3, 3, 2, 3)
    out = _forward_output_dims(x_shape, w_shape[:3], 3, strides, padding, dilations)
    args = [sample(x_shape, F32, seed=1, edges=False), sample(w_shape, F32, seed=2,
                                                               edges=False),
            sample(out, F32, seed=3, edges=False)]

    def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv3d(x, w, [1, *strides, 1], padding, dilations=[1, *dilations, 1])

    _check(_tape(forward), args, "Conv3DBackpropFilterV2")


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_conv3d_gradient_ncdhw(dtype: Any) -> None:
    x_shape, w_shape = (1, 5, 6, 4, 2), (2, 3, 3, 2, 3)
    out = _forward_output_dims(x_shape, w_shape[:3], 3, (2, 1, 2), "SAME", (1, 1, 1))
    args = [sample(x_shape, dtype, seed=4, edges=False).transpose(0, 4, 1, 2, 3),
            sample(w_shape, dtype, seed=5, edges=False),
            sample(out, dtype, seed=6, edges=False).transpose(0, 4, 1, 2, 3)]

    def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv3d(x, w, [1, 1, 2, 1, 2], "SAME", data_format="NCDHW")

    _check(_tape(forward), args, "Conv3DBackpropInputV2", reference_xla=True)


def test_concat_offset_folds() -> None:
    """The ConcatOffset of a concat's gradient is a constant (test_conv2d_gradient_tape
    checks ShapeN's), and the gradient of a concat clusters whole."""

    def fn(a: tf.Tensor, b: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            y = tf.concat([a, b], axis=1)
        return tape.gradient(y, [a, b], output_gradients=upstream)

    args = [sample((2, 3), F32, seed=1), sample((2, 5), F32, seed=2),
            sample((2, 8), F32, seed=3)]
    concrete = trace(fn, args)
    ops = {op.type: op for op in concrete.graph.get_operations()}
    assert "ConcatOffset" in ops, sorted(ops)
    offsets = [constant_value(t) for t in ops["ConcatOffset"].outputs]
    assert [list(v) for v in offsets] == [[0, 0], [0, 3]]
    check_against_tf(fn, args, "ConcatOffset")


@pytest.mark.parametrize("x_shape, w_shape, strides", [
    ((1, 5, 5, 4), (3, 3, 2, 6), 1),  # 2 groups: the element generator
    ((2, 6, 7, 32), (3, 3, 16, 24), 2),  # 2 wide groups, strided: phases, GEMM paths
])
def test_grouped_gradients(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                           strides: int) -> None:
    """A grouped convolution's gradients (TF's CPU has no kernel: TF's XLA is the
    oracle) compile, and the cost rule never leaves them to TF."""

    def fn(x: tf.Tensor, w: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = tf.nn.conv2d(x, w, strides, "SAME")
        return tape.gradient(y, [x, w], output_gradients=upstream)

    out_shape = (x_shape[0], -(-x_shape[1] // strides), -(-x_shape[2] // strides), w_shape[-1])
    args = [sample(x_shape, F32, seed=1, edges=False), sample(w_shape, F32, seed=2, edges=False),
            sample(out_shape, F32, seed=3, edges=False)]
    _check(fn, args, "Conv2DBackpropFilter", reference_xla=True)
    concrete = trace(fn, args)
    decisions = mark(concrete.graph, MarkOptions(tf_kernels=CONVOLUTION_OPS))
    ops = [op for op in concrete.graph.get_operations() if op.type.startswith("Conv2D")]
    assert {op.type for op in ops} >= {"Conv2DBackpropInput", "Conv2DBackpropFilter"}
    for op in ops:
        assert decisions[op.name].compilable, (op.type, decisions[op.name].reason)


def test_unknown_sizes_stay_in_tf() -> None:
    """A ShapeN of a tensor of unknown shape is no constant: the gradient stays in TF."""

    @tf.function(input_signature=[tf.TensorSpec([None, 6, 6, 2]), tf.TensorSpec([3, 3, 2, 2]),
                                  tf.TensorSpec([None, 6, 6, 2])])
    def fn(x: tf.Tensor, w: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = tf.nn.conv2d(x, w, 1, "SAME")
        return tape.gradient(y, [x, w], output_gradients=upstream)

    graph = fn.get_concrete_function().graph
    decisions = mark(graph)
    for op in graph.get_operations():
        if op.type in ("Conv2DBackpropInput", "Conv2DBackpropFilter"):
            assert not decisions[op.name].compilable


def _gradient_step(x: tf.Tensor, w: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = tf.nn.relu(tf.nn.conv2d(x, w, 2, "SAME"))
        d = tf.nn.depthwise_conv2d(y, tf.ones([3, 3, 4, 1]), [1, 1, 1, 1], "SAME")
    return [d, *tape.gradient(d, [x, w], output_gradients=upstream)]


def _gradient_step_run() -> tuple[list[tf.Tensor], list[np.ndarray]]:
    """The step's inputs and TF's results."""
    tensors = [tf.constant(sample(shape, F32, seed=seed, edges=False)) for seed, shape in
               enumerate([(2, 8, 8, 3), (3, 3, 3, 4), (2, 4, 4, 4)], start=1)]
    return tensors, [t.numpy() for t in _gradient_step(*tensors)]


def test_gradients_in_both_modes() -> None:
    """A conv, relu, depthwise step and its gradients through tl.function, auto and
    must-compile, with compile_convolutions: every convolution op compiled."""
    tensors, expected = _gradient_step_run()
    for jit_compile in (None, True):
        compiled = tl.function(_gradient_step, jit_compile=jit_compile,
                               options=Options(min_cluster_size=1, verify=True,
                                               compile_convolutions=True))
        for got, want in zip(compiled(*tensors), expected, strict=True):
            _compare(got.numpy(), want, "gradient step", f"jit_compile={jit_compile}")
        report = compiled.explain(*tensors)
        assert not report.runs_on_xla
        assert not [f for f in report.fallbacks if "Conv" in f.op_type or f.op_type
                    == "ShapeN"], report.fallbacks
        hlo = compiled.experimental_get_compiler_ir(*tensors)(stage="hlo")
        for op_type in ("Conv2DBackpropInput", "Conv2DBackpropFilter",
                        "DepthwiseConv2dNativeBackpropInput"):
            assert f'op_type="{op_type}"' in hlo, op_type


def test_gradients_stay_on_tf_kernels_by_default() -> None:
    """Without compile_convolutions, auto-clustering runs the gradients on TF's kernels;
    must-compile compiles them, as TF's XLA would."""
    tensors, expected = _gradient_step_run()
    for jit_compile in (None, True):
        compiled = tl.function(_gradient_step, jit_compile=jit_compile,
                               options=Options(min_cluster_size=1, verify=True))
        for got, want in zip(compiled(*tensors), expected, strict=True):
            _compare(got.numpy(), want, "gradient step", f"jit_compile={jit_compile}")
        report = compiled.explain(*tensors)
        assert not report.runs_on_xla
        reasons = {f.op_type: f.reason for f in report.fallbacks}
        for op_type in ("Conv2DBackpropInput", "Conv2DBackpropFilter"):
            if jit_compile:
                assert op_type not in reasons and report.jit_compile_fallback is None, reasons
            else:
                assert "runs on TF's kernel" in reasons[op_type], reasons


# For test_clustering_ops.test_every_registered_op_is_tested (via test_conv_ops).
TESTED_OPS = frozenset({
    "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3DBackpropInputV2",
    "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter", "ShapeN", "ConcatOffset"})
