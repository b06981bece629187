"""Which convolutions stay on TF's kernels (oneDNN) by default: a cost rule by shape.

`clustering/mark.py` leaves an op of `rules_conv.CONVOLUTION_OPS` to TF's kernel when
`tf_kernel_faster(op)` says TF's is expected faster than tfxla-lite's for its shapes
(unless `Options.compile_convolutions` asks for every convolution compiled). The rule
follows from how the CPU kernels work (`codegen/cpu/convolution_gemm.py`,
`convolution_filter.py`): each is a library GEMM over patches, whose packing is paid
per block of the GEMM's narrow side, while oneDNN's direct kernels pay none; so ours
are at least as fast only where the GEMM is wide in its feature dimensions:

- forward: the output features (the GEMM's columns) at least FORWARD_FEATURES for a
  1×1 window (the input is the patch matrix, or one copy per pixel), at least
  WINDOW_FEATURES for larger windows (K·Cin copied per output pixel);
- backprop-input: the narrower of input and output features at least WINDOW_FEATURES
  (its GEMM is a forward convolution of the gradient, the filter transposed per tap);
- backprop-filter: the narrower of input and output features at least
  FILTER_FEATURES (the GEMM's rows are taps × input features, its columns the output
  features, the pixels its long K).

Depthwise convolutions (multiplier 1) and their gradients run direct loops over the
channels (`convolution_depthwise.py`), ahead of oneDNN on small images only: compiled
where the output has at most DEPTHWISE_PIXELS pixels per image, except a strided
backprop-input (cut into phases, each a convolution of its own). A grouped convolution
(input depth a multiple of the filter's) is always compiled: TF's CPU kernels cannot
run it at all.
Shapes not known statically leave the op on TF. docs/benchmarks.md has the
measurements these thresholds come from (`benchmarks/convolution.py`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tfxla_lite.clustering.registry import attribute

if TYPE_CHECKING:
    import tensorflow as tf

FORWARD_FEATURES = 144
WINDOW_FEATURES = 512
FILTER_FEATURES = 128
DEPTHWISE_PIXELS = 256

_FORWARD = ("Conv2D", "Conv3D")
_BACKPROP_INPUT = ("Conv2DBackpropInput", "Conv3DBackpropInputV2")
_BACKPROP_FILTER = ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2")


def _dims(tensor: tf.Tensor) -> list[int] | None:
    if tensor.shape.rank is None:
        return None
    dims = tensor.shape.as_list()
    return None if any(d is None for d in dims) else dims


def tf_kernel_faster(op: tf.Operation) -> bool:
    """Whether TF's kernel is expected faster than tfxla-lite's for `op`, a convolution
    or convolution gradient (the module's rule); False for a grouped convolution."""
    if op.type.startswith("Depthwise"):
        return _depthwise_on_tf(op)
    if op.type in _FORWARD:
        activation, weights = op.inputs[0], op.inputs[1]
    elif op.type in _BACKPROP_INPUT:
        activation, weights = op.outputs[0], op.inputs[1]
    elif op.type in _BACKPROP_FILTER:
        activation, weights = op.inputs[0], op.outputs[0]
    else:
        return True
    x, w = _dims(activation), _dims(weights)
    if x is None or w is None or len(w) < 3:
        return True
    channels_last = str(attribute(op, "data_format", "NHWC")).endswith("C")
    depth = x[-1] if channels_last else x[1]
    *window, group_inputs, outputs = w
    if group_inputs and depth != group_inputs:
        return False  # grouped: no TF CPU kernel
    one_by_one = all(k == 1 for k in window)
    if op.type in _FORWARD:
        return outputs < (FORWARD_FEATURES if one_by_one else WINDOW_FEATURES)
    narrower = min(group_inputs, outputs)
    if op.type in _BACKPROP_INPUT:
        return narrower < WINDOW_FEATURES
    return narrower < FILTER_FEATURES


def _depthwise_on_tf(op: tf.Operation) -> bool:
    channels_last = str(attribute(op, "data_format", "NHWC")).endswith("C")
    weights = op.outputs[0] if op.type.endswith("BackpropFilter") else op.inputs[1]
    result = op.outputs[0] if op.type == "DepthwiseConv2dNative" else op.inputs[2]
    w, y = _dims(weights), _dims(result)
    if w is None or y is None or len(y) < 3 or w[-1] != 1:
        return True
    if op.type.endswith("BackpropInput"):
        strides = list(attribute(op, "strides", [1] * len(y))) or [1] * len(y)
        if any(s != 1 for s in strides):
            return True
    spatial = y[1:-1] if channels_last else y[2:]
    return math.prod(spatial) > DEPTHWISE_PIXELS
