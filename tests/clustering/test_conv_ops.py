"""Conv2D, Conv3D and DepthwiseConv2dNative lowered to HLO `convolution`, against TF:
strides, dilations, SAME/VALID/EXPLICIT padding, NHWC/NCHW, grouped and depthwise, odd
and 1-size dims, f32/f64/f16/bf16, through the evaluator and the CPU backend, and
through `tl.function` in both modes. TF's own kernels are the oracle; where TF's CPU
kernels refuse (channels-first layouts, some dilations) TF's XLA is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from test_conv_gradients import TESTED_OPS as GRADIENT_OPS
from tf_harness import check_against_tf, sample, tf_result, trace
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.clustering.mark import MarkOptions, mark
from tfxla_lite.clustering.rules_conv import CONVOLUTION_OPS
from tfxla_lite.options import Options

F16, BF16, F32, F64 = np.float16, tf.bfloat16.as_numpy_dtype, np.float32, np.float64


def _check(fn: Callable[..., Any], args: list[np.ndarray], op_type: str) -> None:
    check_against_tf(fn, args, op_type, expected=tf_result(fn, args))


def _operands(x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: Any, seed: int = 0,
              edges: bool = False) -> list[np.ndarray]:
    # Weights stay finite: where a window overlaps the padding, TF's kernels multiply
    # the weight by a padded zero (0·inf = NaN) while XLA's semantics skip the position.
    return [sample(x_shape, dtype, seed=seed, edges=edges),
            sample(w_shape, dtype, seed=seed + 1, edges=False)]


CONV2D_CASES = [
    # (input NHWC, filter HWIO, strides, padding, dilations)
    ((2, 7, 6, 3), (3, 3, 3, 4), (1, 1), "SAME", (1, 1)),
    ((2, 7, 6, 3), (3, 3, 3, 4), (1, 1), "VALID", (1, 1)),
    ((1, 9, 8, 4), (3, 2, 4, 5), (2, 3), "SAME", (1, 1)),
    ((1, 9, 8, 4), (3, 3, 4, 2), (2, 2), "VALID", (1, 1)),
    ((1, 10, 9, 2), (3, 3, 2, 3), (1, 1), "SAME", (2, 3)),
    ((1, 10, 9, 2), (2, 3, 2, 3), (1, 1), "VALID", (2, 1)),
    ((2, 5, 5, 6), (1, 1, 6, 7), (1, 1), "VALID", (1, 1)),
    ((2, 5, 5, 6), (1, 1, 6, 7), (2, 2), "SAME", (1, 1)),
    ((3, 1, 1, 2), (1, 1, 2, 1), (1, 1), "SAME", (1, 1)),
    ((1, 4, 4, 3), (5, 5, 3, 2), (1, 1), "SAME", (1, 1)),  # window wider than the input
    ((1, 6, 7, 3), (3, 3, 3, 4), (1, 1), [[0, 0], [2, 0], [1, 3], [0, 0]], (1, 1)),
    ((1, 6, 7, 3), (2, 2, 3, 4), (2, 1), [[0, 0], [0, 1], [3, 2], [0, 0]], (1, 2)),
    ((2, 6, 6, 8), (3, 3, 8, 6), (1, 1), "SAME", (1, 1)),
]


@pytest.mark.parametrize("case", range(len(CONV2D_CASES)))
def test_conv2d_nhwc(case: int) -> None:
    x_shape, w_shape, strides, padding, dilations = CONV2D_CASES[case]

    def fn(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, w, strides=strides, padding=padding, dilations=dilations)

    _check(fn, _operands(x_shape, w_shape, F32, seed=case, edges=case % 3 == 0), "Conv2D")


@pytest.mark.parametrize("case", [0, 2, 4, 10, 11])
def test_conv2d_nchw(case: int) -> None:
    x_shape, w_shape, strides, padding, dilations = CONV2D_CASES[case]
    if isinstance(padding, list):
        padding = [padding[0], padding[3], padding[1], padding[2]]

    def fn(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, w, strides=strides, padding=padding, dilations=dilations,
                            data_format="NCHW")

    x_nchw = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    _check(fn, _operands(x_nchw, w_shape, F32, seed=case), "Conv2D")


@pytest.mark.parametrize("dtype", [F64, F16, BF16], ids=["f64", "f16", "bf16"])
@pytest.mark.parametrize("case", [0, 3, 12])
def test_conv2d_dtypes(dtype: Any, case: int) -> None:
    x_shape, w_shape, strides, padding, dilations = CONV2D_CASES[case]

    def fn(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, w, strides=strides, padding=padding, dilations=dilations)

    _check(fn, _operands(x_shape, w_shape, dtype, seed=case), "Conv2D")


DEPTHWISE_CASES = [
    # (input NHWC, filter [H, W, C, multiplier], strides, padding, dilations)
    ((2, 6, 5, 3), (3, 3, 3, 1), (1, 1), "SAME", (1, 1)),
    ((1, 7, 7, 4), (3, 3, 4, 2), (2, 2), "VALID", (1, 1)),
    ((1, 8, 6, 2), (2, 3, 2, 3), (1, 2), "SAME", (1, 1)),
    ((1, 9, 9, 2), (3, 3, 2, 1), (1, 1), "SAME", (2, 2)),
    ((1, 6, 6, 3), (3, 3, 3, 2), (1, 1), [[0, 0], [1, 2], [0, 1], [0, 0]], (1, 1)),
]


@pytest.mark.parametrize("case", range(len(DEPTHWISE_CASES)))
def test_depthwise_conv2d(case: int) -> None:
    x_shape, w_shape, strides, padding, dilations = DEPTHWISE_CASES[case]

    def fn(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.DepthwiseConv2dNative(
            input=x, filter=w, strides=[1, *strides, 1], padding="EXPLICIT"
            if isinstance(padding, list) else padding,
            explicit_paddings=sum(padding, []) if isinstance(padding, list) else [],
            dilations=[1, *dilations, 1])

    _check(fn, _operands(x_shape, w_shape, F32, seed=case, edges=case == 0),
           "DepthwiseConv2dNative")


def test_depthwise_conv2d_nchw_f16() -> None:
    def fn(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 1, 2, 2],
                                                padding="SAME", data_format="NCHW")

    _check(fn, _operands((1, 3, 7, 6), (3, 3, 3, 2), F16), "DepthwiseConv2dNative")


@pytest.mark.parametrize("strides, padding", [((1, 1, 1), "SAME"), ((2, 1, 2), "VALID")])
def test_conv3d(strides: tuple[int, ...], padding: str) -> None:
    def fn(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv3d(x, w, strides=[1, *strides, 1], padding=padding)

    _check(fn, _operands((1, 5, 6, 4, 2), (2, 3, 3, 2, 3), F32), "Conv3D")


@pytest.mark.parametrize("x_shape, w_shape, strides, padding", [
    ((1, 5, 5, 4), (3, 3, 2, 6), 1, "SAME"),  # 2 groups of 2 inputs and 3 outputs
    ((2, 7, 6, 32), (3, 3, 8, 16), 2, "VALID"),  # 4 groups, 4 outputs each
    ((2, 6, 6, 32), (1, 1, 16, 32), 1, "VALID"),  # 2 wide groups: the GEMM path
])
def test_grouped_conv2d(x_shape: tuple[int, ...], w_shape: tuple[int, ...], strides: int,
                        padding: str) -> None:
    """TF's CPU kernels have no grouped convolution (TF's XLA is the oracle): it compiles,
    and the cost rule never leaves it to TF (rules_conv_cost.py)."""

    def fn(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, w, strides, padding)

    args = _operands(x_shape, w_shape, F32)
    _check(fn, args, "Conv2D")
    concrete = trace(fn, args)
    decisions = mark(concrete.graph, MarkOptions(tf_kernels=CONVOLUTION_OPS))
    (conv,) = [op for op in concrete.graph.get_operations() if op.type == "Conv2D"]
    assert decisions[conv.name].compilable, decisions[conv.name].reason


def test_grouped_conv2d_compiles_by_default_in_both_modes() -> None:
    """Without compile_convolutions, a grouped conv joins the cluster (TF could not run
    it), in auto and must-compile mode, nothing on TF's XLA."""
    x, w = (tf.constant(a) for a in _operands((2, 6, 6, 16), (3, 3, 8, 16), F32))

    def fn(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME"))

    (expected,) = tf_result(fn, [x.numpy(), w.numpy()], xla=True)
    for jit_compile in (None, True):
        compiled = tl.function(fn, jit_compile=jit_compile,
                               options=Options(min_cluster_size=1, verify=True,
                                               strict_jit_compile=bool(jit_compile)))
        assert_close(compiled(x, w).numpy(), expected, "Conv2D", f"jit_compile={jit_compile}")
        report = compiled.explain(x, w)
        assert not report.runs_on_xla
        assert not [f for f in report.fallbacks if f.op_type == "Conv2D"], report.fallbacks


def test_conv_in_both_modes() -> None:
    """A small CNN layer (conv, bias, relu) through tl.function, auto and must-compile."""
    x, w = _operands((2, 8, 8, 3), (3, 3, 3, 4), F32)
    bias = sample((4,), F32, seed=5, edges=False)

    def fn(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b))

    tensors = [tf.constant(a) for a in (x, w, bias)]
    expected = fn(*tensors).numpy()
    for jit_compile in (None, True):
        compiled = tl.function(fn, jit_compile=jit_compile,
                               options=Options(min_cluster_size=1, verify=True,
                                               compile_convolutions=True))
        assert_close(compiled(*tensors).numpy(), expected, "Conv2D",
                     f"jit_compile={jit_compile}")
        assert 'op_type="Conv2D"' in compiled.experimental_get_compiler_ir(*tensors)(
            stage="hlo")


def test_convolutions_stay_on_tf_kernels_by_default() -> None:
    """Without `compile_convolutions`, auto-clustering runs a conv on TF's (faster)
    kernel, the rest of the layer compiled; must-compile compiles it, as TF's XLA
    would, so jit_compile=True takes no fallback."""
    # 8 input features: not a first layer; 4 outputs: no direct register blocks.
    x, w = _operands((2, 8, 8, 8), (3, 3, 8, 4), F32)
    bias = sample((4,), F32, seed=6, edges=False)

    def fn(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b) * 2.0 + 1.0)

    tensors = [tf.constant(a) for a in (x, w, bias)]
    expected = fn(*tensors).numpy()
    for jit_compile in (None, True):
        compiled = tl.function(fn, jit_compile=jit_compile,
                               options=Options(min_cluster_size=1, verify=True))
        assert_close(compiled(*tensors).numpy(), expected, "Conv2D",
                     f"jit_compile={jit_compile}")
        report = compiled.explain(*tensors)
        assert not report.runs_on_xla
        assert report.clusters, report
        convs = [f for f in report.fallbacks if f.op_type == "Conv2D"]
        if jit_compile:
            assert not convs and report.jit_compile_fallback is None, report
            assert 'op_type="Conv2D"' in compiled.experimental_get_compiler_ir(*tensors)(
                stage="hlo")
        else:
            (conv,) = convs
            assert "runs on TF's kernel" in conv.reason


# For test_clustering_ops.test_every_registered_op_is_tested; the gradients, ShapeN and
# ConcatOffset are tested in test_conv_gradients.py.
TESTED_OPS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative"}) | GRADIENT_OPS
