"""Lowering rules of TF's convolutions: Conv2D, Conv3D and DepthwiseConv2dNative, forward
(their gradients: `rules_conv_grad.py`).

Registered into `registry.OP_RULES` on import. Each becomes one HLO `convolution`, as
TF's XLA bridge builds it (tf2xla/kernels/conv_op_helpers.cc, MakeXlaForwardConvOp):
the window from strides, dilations and padding (SAME pads `max(0, (out-1)·stride +
(k-1)·dilation + 1 - in)`, the odd element at the end; EXPLICIT takes the op's pairs);
a grouped convolution (input depth a multiple k of the filter's) has
feature_group_count k (TF's CPU kernels have none: the `tf_kernels` gate never leaves
it to them, `rules_conv_cost.py`); a
depthwise filter [H, W, C, M] is reshaped to [H, W, 1, C·M] with feature_group_count C
(output channel c·M + m, TF's order). Channels-first inputs (NCHW/NCDHW) are
transposed to channels-last around a channels-last convolution, as XLA's CPU backend
canonicalizes them, so every convolution the backend sees has the layout its GEMM
path reads (`codegen/cpu/convolution_gemm.py`). 2-byte floats convert to f32 for the
convolution and round once, as `LoweringContext.dot` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfxla_lite.clustering.registry import (
    DATA_FORMATS,
    FLOAT,
    HALF_ELEMENT_TYPES,
    LoweringContext,
    LoweringError,
    attribute,
    register,
)
from tfxla_lite.hlo import Instruction
from tfxla_lite.hlo.attributes import Window, WindowDimension
from tfxla_lite.hlo.convolution import ConvolutionDimensions

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]


def _check_convolution(op: tf.Operation) -> str | None:
    data_format = attribute(op, "data_format", "NHWC")
    if data_format not in DATA_FORMATS:
        return f"data_format {data_format}"
    rank = len(data_format)
    channels_last = data_format.endswith("C")
    spatial = range(1, rank - 1) if channels_last else range(2, rank)
    for name in ("strides", "dilations"):
        values = list(attribute(op, name, [1] * rank)) or [1] * rank
        if len(values) != rank or any(values[d] != 1 for d in range(rank) if d not in spatial):
            return f"{name} {values} on the batch or channel dimension"
        if any(v < 1 for v in values):
            return f"{name} {values}"
    padding = attribute(op, "padding", "VALID")
    if padding not in ("SAME", "VALID", "EXPLICIT"):
        return f"padding {padding}"
    return None


def _spatial_window(op: tf.Operation, input_dims: tuple[int, ...],
                    kernel_dims: tuple[int, ...]) -> Window:
    """The window of a channels-last convolution over `input_dims` (N, spatial..., C)."""
    data_format = attribute(op, "data_format", "NHWC")
    rank = len(data_format)
    channels_last = data_format.endswith("C")
    spatial = list(range(1, rank - 1)) if channels_last else list(range(2, rank))
    strides = list(attribute(op, "strides", [1] * rank)) or [1] * rank
    dilations = list(attribute(op, "dilations", [1] * rank)) or [1] * rank
    padding = attribute(op, "padding", "VALID")
    explicit = list(attribute(op, "explicit_paddings", []))
    dims = []
    for i, d in enumerate(spatial):
        size, kernel = input_dims[1 + i], kernel_dims[i]
        stride, dilation = int(strides[d]), int(dilations[d])
        if padding == "SAME":
            out = -(-size // stride)
            needed = max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - size)
            low, high = needed // 2, needed - needed // 2
        elif padding == "EXPLICIT":
            if len(explicit) != 2 * rank:
                raise LoweringError(f"explicit_paddings {explicit} for rank {rank}")
            low, high = int(explicit[2 * d]), int(explicit[2 * d + 1])
        else:
            low = high = 0
        dims.append(WindowDimension(kernel, stride, low, high, dilation))
    return Window(tuple(dims))


def _channels_last(ctx: LoweringContext, x: Instruction, data_format: str) -> Instruction:
    if data_format.endswith("C"):
        return x
    rank = x.shape.rank
    perm = (0, *range(2, rank), 1)
    return ctx.emit("transpose", [x], shape=x.shape.with_dims(tuple(x.shape.dims[p]
                                                                    for p in perm)),
                    dimensions=perm)


def _channels_first(ctx: LoweringContext, x: Instruction, data_format: str) -> Instruction:
    if data_format.endswith("C"):
        return x
    rank = x.shape.rank
    perm = (0, rank - 1, *range(1, rank - 1))
    return ctx.emit("transpose", [x], shape=x.shape.with_dims(tuple(x.shape.dims[p]
                                                                    for p in perm)),
                    dimensions=perm)


def convolution(ctx: LoweringContext, lhs: Instruction, rhs: Instruction, window: Window,
                feature_groups: int = 1, batch_groups: int = 1,
                dnums: ConvolutionDimensions | None = None) -> Instruction:
    """A convolution, channels-last (`b01f_01io->b01f`) unless `dnums` says otherwise;
    2-byte floats in f32, rounded once."""
    etype = lhs.shape.element_type
    dnums = dnums or ConvolutionDimensions.channels_last(lhs.shape.rank - 2)
    attributes: dict[str, Any] = {"window": window, "dim_labels": dnums}
    if feature_groups != 1:
        attributes["feature_group_count"] = feature_groups
    if batch_groups != 1:
        attributes["batch_group_count"] = batch_groups
    if etype not in HALF_ELEMENT_TYPES:
        return ctx.emit("convolution", [lhs, rhs], **attributes)
    wide = ctx.emit("convolution", [ctx.convert(lhs, "f32"), ctx.convert(rhs, "f32")],
                    **attributes)
    return ctx.convert(wide, etype)


# The convolutions and their gradients (`rules_conv_grad.py`), each of which stays on
# TF's kernel where `rules_conv_cost.py` expects oneDNN faster for its shape, unless
# `Options.compile_convolutions`.
CONVOLUTION_OPS = frozenset({
    "Conv2D", "Conv3D", "DepthwiseConv2dNative",
    "Conv2DBackpropInput", "Conv3DBackpropInputV2", "DepthwiseConv2dNativeBackpropInput",
    "Conv2DBackpropFilter", "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropFilter",
})


def feature_groups(depth: int, filter_depth: int) -> int:
    """How many groups an input of `depth` channels forms for a filter of `filter_depth`
    input channels (1 but for a grouped convolution)."""
    if filter_depth == 0 or depth % filter_depth:
        raise LoweringError(f"input depth {depth} is not a multiple of the filter's "
                            f"{filter_depth}")
    return depth // filter_depth


@register("Conv2D", "Conv3D", dtypes=FLOAT, check=_check_convolution,
          note="strides, dilations, SAME/VALID/EXPLICIT padding, NHWC/NCHW (NDHWC/NCDHW), "
               "grouped; 2-byte floats accumulate in float32")
def _lower_conv(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    data_format = attribute(op, "data_format", "NHWC")
    x = _channels_last(ctx, operands[0], data_format)
    w = operands[1]
    groups = feature_groups(x.shape.dims[-1], w.shape.dims[-2])
    window = _spatial_window(op, x.shape.dims, w.shape.dims[:-2])
    result = convolution(ctx, x, w, window, groups)
    return [_channels_first(ctx, result, data_format)]


@register("DepthwiseConv2dNative", dtypes=FLOAT, check=_check_convolution,
          note="strides, dilations, SAME/VALID/EXPLICIT padding, NHWC/NCHW; 2-byte floats "
               "accumulate in float32")
def _lower_depthwise(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    data_format = attribute(op, "data_format", "NHWC")
    x = _channels_last(ctx, operands[0], data_format)
    w = operands[1]
    height, width, channels, multiplier = w.shape.dims
    if channels == 0:
        raise LoweringError("a depthwise convolution of no channels")
    w = ctx.reshape(w, (height, width, 1, channels * multiplier))
    window = _spatial_window(op, x.shape.dims, (height, width))
    result = convolution(ctx, x, w, window, channels)
    return [_channels_first(ctx, result, data_format)]
