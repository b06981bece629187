"""The default per-op choice between TF's convolution kernels (oneDNN) and tfxla-lite's
(`clustering/rules_conv_cost.py`, applied by mark.py's `tf_kernels` gate): by shape and
the CPU kernel that would run it (direct register blocks or GEMMs), grouped
convolutions always compiled, depthwise filter gradients by their output's pixels,
unknown shapes left to TF."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import trace

from tfxla_lite.clustering.mark import TF_KERNEL_REASON, MarkOptions, mark
from tfxla_lite.clustering.rules_conv import CONVOLUTION_OPS
from tfxla_lite.clustering.rules_conv_cost import (
    DEPTHWISE_PIXELS,
    DIRECT_FILTER_FEATURES,
    FILTER_FEATURES,
    FORWARD_FEATURES,
    FORWARD_INPUTS,
    ONE_BY_ONE_FILTER_FEATURES,
    WINDOW_FEATURES,
    tf_kernel_faster,
)
from tfxla_lite.codegen.cpu import gemm_packed

GATED = MarkOptions(tf_kernels=CONVOLUTION_OPS)


def _op(fn: Callable[..., Any], shapes: list[tuple[int, ...]], op_type: str
        ) -> tuple[tf.Operation, Any]:
    concrete = trace(fn, [np.zeros(s, np.float32) for s in shapes])
    (op,) = [op for op in concrete.graph.get_operations() if op.type == op_type]
    return op, concrete.graph


def _forward(x: tuple[int, ...], w: tuple[int, ...]) -> tf.Operation:
    return _op(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), [x, w], "Conv2D")[0]


def _backprop(op_type: str, x: tuple[int, ...], w: tuple[int, ...], strides: int = 1
              ) -> tf.Operation:
    def fn(x: tf.Tensor, w: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = tf.nn.conv2d(x, w, strides, "SAME")
        return tape.gradient(y, [x, w])

    return _op(fn, [x, w], op_type)[0]


@pytest.mark.parametrize("window, outputs, faster", [
    (1, FORWARD_FEATURES, False), (1, FORWARD_FEATURES - 1, True),
    (3, WINDOW_FEATURES, False), (3, WINDOW_FEATURES - 1, True),
])
def test_forward_by_output_features(window: int, outputs: int, faster: bool) -> None:
    assert tf_kernel_faster(_forward((2, 4, 4, 8), (window, window, 8, outputs))) is faster


def test_one_by_one_forward_by_input_features() -> None:
    # Too short a patch for the direct blocks, outputs not a multiple of 16: the GEMM
    # path, compiled from FORWARD_INPUTS input features.
    assert not tf_kernel_faster(_forward((2, 4, 4, FORWARD_INPUTS), (1, 1, FORWARD_INPUTS, 24)))
    assert tf_kernel_faster(_forward((2, 4, 4, FORWARD_INPUTS - 8),
                                     (1, 1, FORWARD_INPUTS - 8, 24)))


@pytest.mark.skipif(not gemm_packed.available(), reason="direct register blocks: AVX-512")
def test_direct_register_blocks_compile() -> None:
    # A forward the direct blocks take: compiled whatever its width.
    assert not tf_kernel_faster(_forward((2, 4, 4, 16), (3, 3, 16, 64)))
    assert not tf_kernel_faster(_forward((2, 4, 4, 64), (1, 1, 64, 16)))
    # Too short a patch, outputs not a multiple of 16: the GEMM path's thresholds.
    assert tf_kernel_faster(_forward((2, 4, 4, 8), (3, 3, 8, 60)))
    assert tf_kernel_faster(_forward((2, 4, 4, 16), (1, 1, 16, 64)))
    assert tf_kernel_faster(_forward((2, 4, 4, 16), (3, 3, 16, 72)))
    # Filter gradients with a window: from DIRECT_FILTER_FEATURES.
    features = DIRECT_FILTER_FEATURES
    assert not tf_kernel_faster(_backprop("Conv2DBackpropFilter", (1, 3, 3, features),
                                          (3, 3, features, features)))
    assert tf_kernel_faster(_backprop("Conv2DBackpropFilter", (1, 3, 3, features - 8),
                                      (3, 3, features - 8, features)))
    # An unstrided backprop-input with a window: compiled (its filter transposed once),
    # unless the result's features are not a multiple of 16 or it is strided.
    assert not tf_kernel_faster(_backprop("Conv2DBackpropInput", (1, 3, 3, 32),
                                          (3, 3, 32, 64)))
    assert tf_kernel_faster(_backprop("Conv2DBackpropInput", (1, 3, 3, 24), (3, 3, 24, 64)))
    assert tf_kernel_faster(_backprop("Conv2DBackpropInput", (1, 6, 6, 32), (3, 3, 32, 64),
                                      strides=2))


def test_one_by_one_gradients() -> None:
    # Backprop-input: one library GEMM reading the filter transposed, compiled from 8
    # features, strided too; a first layer's (3 channels) stays on TF.
    for x, w, strides in [((1, 4, 4, 8), (1, 1, 8, 24), 1), ((1, 6, 6, 24), (1, 1, 24, 8), 2),
                          ((1, 4, 4, 512), (1, 1, 512, 96), 1)]:
        assert not tf_kernel_faster(_backprop("Conv2DBackpropInput", x, w, strides))
    assert tf_kernel_faster(_backprop("Conv2DBackpropInput", (1, 4, 4, 3), (1, 1, 3, 64)))
    # Filter gradient: from ONE_BY_ONE_FILTER_FEATURES, direct blocks or not.
    features = ONE_BY_ONE_FILTER_FEATURES
    for outputs in (24, 64):
        assert not tf_kernel_faster(_backprop("Conv2DBackpropFilter", (1, 3, 3, features),
                                              (1, 1, features, outputs + features)))
        assert tf_kernel_faster(_backprop("Conv2DBackpropFilter", (1, 3, 3, features - 8),
                                          (1, 1, features - 8, outputs)))


@pytest.mark.parametrize("op_type, threshold", [
    ("Conv2DBackpropInput", WINDOW_FEATURES), ("Conv2DBackpropFilter", FILTER_FEATURES)])
def test_gradients_by_the_narrower_features(op_type: str, threshold: int) -> None:
    wide = _backprop(op_type, (1, 3, 3, threshold), (3, 3, threshold, threshold + 5))
    narrow = _backprop(op_type, (1, 3, 3, threshold + 5), (3, 3, threshold + 5,
                                                            threshold - 1))
    assert not tf_kernel_faster(wide)
    assert tf_kernel_faster(narrow)


def test_first_layers_compile() -> None:
    # Fewer than 8 input features (an image's channels): the forward is compiled, its
    # filter gradient stays on TF.
    assert not tf_kernel_faster(_forward((2, 8, 8, 3), (7, 7, 3, 64)))
    assert not tf_kernel_faster(_forward((2, 8, 8, 1), (3, 3, 1, 30)))
    assert tf_kernel_faster(_backprop("Conv2DBackpropFilter", (1, 8, 8, 3), (3, 3, 3, 32)))


def test_grouped_convolutions_are_never_left_to_tf() -> None:
    op, graph = _op(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), [(1, 5, 5, 4), (3, 3, 2, 6)],
                    "Conv2D")
    assert not tf_kernel_faster(op)
    assert mark(graph, GATED)[op.name].compilable


@pytest.mark.parametrize("rank", [2, 3])
def test_grouped_convolutions_with_unknown_dims_are_never_left_to_tf(rank: int) -> None:
    # Keras's fit traces with an unknown batch: a grouped Conv3D left to TF failed there
    # ("input and filter must have the same depth").
    conv = tf.nn.conv2d if rank == 2 else tf.nn.conv3d
    strides = [1] * (rank + 2)
    concrete = tf.function(lambda x, w: conv(x, w, strides, "SAME")).get_concrete_function(
        tf.TensorSpec([None, *[5] * rank, 4]), tf.TensorSpec([*[2] * rank, 2, 6]))
    (op,) = [op for op in concrete.graph.get_operations() if op.type.startswith("Conv")]
    assert not tf_kernel_faster(op)
    dynamic = MarkOptions(tf_kernels=CONVOLUTION_OPS, dynamic_shapes=True)
    assert mark(concrete.graph, dynamic)[op.name].compilable


def _depthwise(side: int, strides: int = 1, multiplier: int = 1) -> tuple[tf.Operation, ...]:
    def fn(x: tf.Tensor, w: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = tf.nn.depthwise_conv2d(x, w, [1, strides, strides, 1], "SAME")
        return [y, *tape.gradient(y, [x, w])]

    concrete = trace(fn, [np.zeros((2, side, side, 32), np.float32),
                          np.zeros((3, 3, 32, multiplier), np.float32)])
    return tuple(next(op for op in concrete.graph.get_operations() if op.type == op_type)
                 for op_type in ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                                 "DepthwiseConv2dNativeBackpropFilter"))


def test_depthwise_filter_gradients_by_output_pixels() -> None:
    # The forward and an unstrided backprop-input compile whatever the image's size.
    side = int(DEPTHWISE_PIXELS ** 0.5)
    assert [tf_kernel_faster(op) for op in _depthwise(side)] == [False] * 3
    assert [tf_kernel_faster(op) for op in _depthwise(side + 1)] == [False, False, True]
    # Strided: compiled (the backprop-input skips its gradient's holes); multipliers
    # above 1 stay on TF.
    assert [tf_kernel_faster(op) for op in _depthwise(side, 2)] == [False] * 3
    assert [tf_kernel_faster(op) for op in _depthwise(4, 1, 2)] == [True] * 3


def test_depthwise_on_tf_gets_the_reason_and_unknown_shapes_stay_on_tf() -> None:
    op = _depthwise(int(DEPTHWISE_PIXELS ** 0.5) + 1)[2]
    assert tf_kernel_faster(op)
    decision = mark(op.graph, GATED)[op.name]
    assert not decision.compilable and TF_KERNEL_REASON in decision.reason

    @tf.function(input_signature=[tf.TensorSpec([None, 4, 4, 8]),
                                  tf.TensorSpec([1, 1, 8, 1024])])
    def fn(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, w, 1, "SAME")

    (conv,) = [op for op in fn.get_concrete_function().graph.get_operations()
               if op.type == "Conv2D"]
    assert tf_kernel_faster(conv)


def test_the_gate_follows_the_rule_and_compile_convolutions_lifts_it() -> None:
    wide, graph = _op(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"),
                      [(2, 4, 4, 8), (1, 1, 8, 256)], "Conv2D")
    assert mark(graph, GATED)[wide.name].compilable
    narrow, graph = _op(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"),
                        [(2, 4, 4, 8), (3, 3, 8, 60)], "Conv2D")
    assert not mark(graph, GATED)[narrow.name].compilable
    assert mark(graph, MarkOptions())[narrow.name].compilable  # compile_convolutions
