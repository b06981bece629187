"""Which convolutions stay on TF's kernels (oneDNN) by default: a cost rule by shape.

`clustering/mark.py` leaves an op of `rules_conv.CONVOLUTION_OPS` to TF's kernel when
`tf_kernel_faster(op)` says TF's is expected faster than tfxla-lite's for its shapes
(unless `Options.compile_convolutions` asks for every convolution compiled, or the
function is must-compile: `driver.mark_graph`). The rule follows from which CPU kernel
runs the op:

- The direct register blocks (`codegen/cpu/convolution_direct.py`,
  `convolution_filter_direct.py`; AVX-512 hosts, f32 or a 2-byte float convolved in
  f32) take a forward convolution with at least DIRECT_INPUTS input features per group,
  a patch (window positions × input features) of at least DIRECT_DEPTH and output
  features a multiple of 16; an unstrided backprop-input with a window whose forward
  would qualify with its features swapped (its filter transposed once per call); and a
  filter gradient with at least DIRECT_INPUTS input features and output features a
  multiple of 16. Such a forward or backprop-input is compiled; such a filter gradient
  with a window when the narrower of its features is at least DIRECT_FILTER_FEATURES.
- A forward convolution of fewer than DIRECT_INPUTS input features per group (a first
  layer reading an image's channels) is compiled: its patches and one GEMM per block ran
  at 0.96-2.85 of oneDNN (MobileNetV2's and ResNet50's stems, small_cnn's 28×28×1),
  whose kernels are slow on so few channels; its gradients stay on TF (the filter's
  0.66-0.83, the input's, which training prunes, 0.76-1.35).
- A 1×1 backprop-input is one library GEMM reading the filter transposed in place
  (`convolution_gemm.py`): compiled (0.88-3.20 of oneDNN over ResNet50's and
  MobileNetV2's). A 1×1 filter gradient is compiled when the narrower of its features
  is at least ONE_BY_ONE_FILTER_FEATURES (1.08-2.85 there; 0.68-1.18 below).
- Everything else runs as library GEMMs over patches (`convolution_gemm.py`,
  `convolution_filter.py`), whose packing is paid per block of the GEMM's narrow side,
  so they are compiled only where the GEMM is wide: a 1×1 forward with at least
  FORWARD_FEATURES output features or FORWARD_INPUTS input features, one with a larger
  window from WINDOW_FEATURES outputs; other backprop-inputs when their narrower
  features are at least WINDOW_FEATURES; other filter gradients from FILTER_FEATURES.

Depthwise convolutions (multiplier 1) and their gradients run direct loops over the
channels (`convolution_depthwise.py`): the forward and the backprop-input are compiled
(1.03-4.1 of oneDNN on MobileNetV2's, 24×24 to 48×48 images; a strided one's loops skip
the dilated gradient's holes: 1.21-1.66), a filter gradient where the output has at
most DEPTHWISE_PIXELS pixels per image (0.17-1.36 on larger ones, by the load). A
grouped convolution (input depth a multiple of the filter's) is always compiled: TF's
CPU kernels cannot run it at all.
Shapes not known statically leave the op on TF. docs/benchmarks.md has the
measurements these thresholds come from (`benchmarks/convolution.py`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tfxla_lite.clustering.registry import attribute
from tfxla_lite.codegen.cpu import gemm_packed

if TYPE_CHECKING:
    import tensorflow as tf

FORWARD_FEATURES = 144
FORWARD_INPUTS = 32
WINDOW_FEATURES = 512
FILTER_FEATURES = 128
ONE_BY_ONE_FILTER_FEATURES = 32
DEPTHWISE_PIXELS = 256
DIRECT_INPUTS = 8
DIRECT_DEPTH = 64
DIRECT_FILTER_FEATURES = 64
_DIRECT_LANES = 16
_DIRECT_TYPES = ("float32", "float16", "bfloat16")

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
    w = _dims(weights)
    if w is None or len(w) < 3 or activation.shape.rank is None:
        return True
    channels_last = str(attribute(op, "data_format", "NHWC")).endswith("C")
    depth = activation.shape[-1] if channels_last else activation.shape[1]
    *window, group_inputs, outputs = w
    # Grouped: no TF CPU kernel, so compiled even where the batch or image dims are unknown.
    if depth is not None and group_inputs and depth != group_inputs:
        return False
    if _dims(activation) is None:
        return True
    one_by_one = all(k == 1 for k in window)
    direct = (op.outputs[0].dtype.name in _DIRECT_TYPES and gemm_packed.available()
              and group_inputs >= DIRECT_INPUTS and outputs % _DIRECT_LANES == 0)
    if op.type in _FORWARD:
        if group_inputs < DIRECT_INPUTS:
            return False  # a first layer reading an image's channels
        if direct and math.prod(window) * group_inputs >= DIRECT_DEPTH:
            return False
        if one_by_one:
            return outputs < FORWARD_FEATURES and group_inputs < FORWARD_INPUTS
        return outputs < WINDOW_FEATURES
    narrower = min(group_inputs, outputs)
    if op.type in _BACKPROP_INPUT:
        if narrower < DIRECT_INPUTS:
            return True  # a first layer's input gradient
        if one_by_one or _direct_backprop_input(op, window, group_inputs, outputs):
            return False
        return narrower < WINDOW_FEATURES
    if one_by_one:
        return narrower < ONE_BY_ONE_FILTER_FEATURES
    if direct:
        return narrower < DIRECT_FILTER_FEATURES
    return narrower < FILTER_FEATURES


def _direct_backprop_input(op: tf.Operation, window: list[int], inputs: int, outputs: int
                           ) -> bool:
    """Whether the direct blocks run backprop-input `op` (forward filter `window` ×
    `inputs` × `outputs`): unstrided, as a convolution of the output gradient's
    `outputs` features into `inputs` ones."""
    strides = list(attribute(op, "strides", [])) or [1]
    return (op.outputs[0].dtype.name in _DIRECT_TYPES and gemm_packed.available()
            and all(s == 1 for s in strides) and outputs >= DIRECT_INPUTS
            and math.prod(window) * outputs >= DIRECT_DEPTH and inputs % _DIRECT_LANES == 0)


def _depthwise_on_tf(op: tf.Operation) -> bool:
    channels_last = str(attribute(op, "data_format", "NHWC")).endswith("C")
    weights = op.outputs[0] if op.type.endswith("BackpropFilter") else op.inputs[1]
    result = op.outputs[0] if op.type == "DepthwiseConv2dNative" else op.inputs[2]
    w, y = _dims(weights), _dims(result)
    if w is None or y is None or len(y) < 3 or w[-1] != 1:
        return True
    if not op.type.endswith("BackpropFilter"):
        return False
    spatial = y[1:-1] if channels_last else y[2:]
    return math.prod(spatial) > DEPTHWISE_PIXELS
