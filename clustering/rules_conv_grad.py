"""Lowering rules of the convolution gradients TF's autodiff emits: Conv2DBackpropInput,
Conv2DBackpropFilter, Conv3DBackpropInputV2, Conv3DBackpropFilterV2 and the depthwise
DepthwiseConv2dNativeBackpropInput / DepthwiseConv2dNativeBackpropFilter.

Registered into `registry.OP_RULES` on import, beside the forward rules of
`rules_conv.py` whose window, layout and 2-byte-float helpers they share. Each is one
HLO `convolution`, as TF's XLA bridge builds it (tf2xla/kernels/conv_op_helpers.cc):

- backprop-input (MakeXlaBackpropInputConvOp): the output gradient convolved with the
  filter mirrored in its spatial dims and its input/output features swapped; the
  gradient is base-dilated by the forward stride (`lhs_dilate`), the window keeps the
  forward dilation, and the padding is `k_eff - 1 - pad_low` before and what brings the
  result to the input's size after (`k_eff = (k-1)·dilation + 1`). A strided one is
  then split by the phase of the input position (`_backprop_input_by_phases`): s^rank
  stride-1 convolutions over the undilated gradient, each with the taps that reach its
  phase, interleaved; none multiplies the zeros a base dilation inserts, and the CPU
  backend's GEMM path, which reads no base dilation, takes each. A depthwise one
  (multiplier 1) keeps the dilated gradient instead: the CPU backend's depthwise loops
  skip the holes.
- backprop-filter (MakeXlaBackpropFilterConvOp): the input convolved with the output
  gradient as the kernel, batch as the contracted feature; the window is the gradient's
  spatial size dilated by the forward stride, striding by the forward dilation, padded
  by the forward's low padding (negative at the end where the forward never read the
  input's last elements).

Backprop-filter keeps XLA's dimension numbers (`f01b_i01o->01bf`: the input and the
gradient read in place, the result a filter), which the CPU backend runs as the
forward's patches transposed times the gradient (`codegen/cpu/convolution_filter.py`).
An unstrided ungrouped backprop-input keeps XLA's kernel `01oi` (the filter as it is,
`rhs_reversal` flipping it), which the GEMM path runs as one GEMM per window position
with that position's filter slice transposed (`codegen/cpu/convolution_gemm.py`); a
strided or grouped one's filter is transposed (and reversed) into a channels-last
`b01f_01io->b01f` convolution, as the phases and groups need it. A
depthwise filter [H, W, C, M] is the grouped filter [H, W, 1, C·M] with C groups, so
one formula serves both: backprop-input has `feature_group_count` G and backprop-filter
`batch_group_count` G (XLA's form for depthwise filter gradients).

The sizes input (`input_sizes` / `filter_sizes`, usually a ShapeN of static shapes) must
be a compile-time constant and agree with the static output shape.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.clustering.registry import (
    FLOAT,
    LoweringContext,
    LoweringError,
    attribute,
    register,
)
from tfxla_lite.clustering.rules_conv import (
    _channels_first,
    _channels_last,
    _check_convolution,
    _spatial_window,
    convolution,
    feature_groups,
)
from tfxla_lite.hlo import Instruction
from tfxla_lite.hlo.attributes import PaddingConfig, Window, WindowDimension
from tfxla_lite.hlo.convolution import ConvolutionDimensions

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]

BACKPROP_INPUT_OPS = ("Conv2DBackpropInput", "Conv3DBackpropInputV2",
                      "DepthwiseConv2dNativeBackpropInput")
BACKPROP_FILTER_OPS = ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2",
                       "DepthwiseConv2dNativeBackpropFilter")


def _transpose(ctx: LoweringContext, x: Instruction, perm: tuple[int, ...]) -> Instruction:
    if perm == tuple(range(len(perm))):
        return x
    dims = tuple(x.shape.dims[p] for p in perm)
    return ctx.emit("transpose", [x], shape=x.shape.with_dims(dims), dimensions=perm)


def _channels_last_dims(dims: tuple[int, ...], data_format: str) -> tuple[int, ...]:
    if data_format.endswith("C"):
        return dims
    return (dims[0], *dims[2:], dims[1])


def _check_sizes(ctx: LoweringContext, op: tf.Operation, index: int) -> None:
    """The sizes input must say what the static output shape says."""
    sizes = tuple(int(v) for v in np.asarray(ctx.static_input(index)).reshape(-1))
    dims = ctx.output_shape().dims
    if sizes != dims:
        raise LoweringError(f"{op.type} {op.name}: sizes input {list(sizes)} disagrees "
                            f"with its output shape {list(dims)}")


def _transposed_filter(spatial_rank: int) -> ConvolutionDimensions:
    """`b01f_01oi->b01f`: channels-last, the filter's features swapped (its `o` is the
    forward's input feature)."""
    return dataclasses.replace(ConvolutionDimensions.channels_last(spatial_rank),
                               kernel_input_feature=spatial_rank + 1,
                               kernel_output_feature=spatial_rank)


def _filter_as_grouped(ctx: LoweringContext, op: tf.Operation, w: Instruction
                       ) -> Instruction:
    """The filter as [spatial..., Cin/G, Cout]: a depthwise [H, W, C, M] as [H, W, 1, C·M]."""
    if not op.type.startswith("Depthwise"):
        return w
    *spatial, channels, multiplier = w.shape.dims
    return ctx.reshape(w, (*spatial, 1, channels * multiplier))


def _backprop_input_kernel(ctx: LoweringContext, w: Instruction, groups: int) -> Instruction:
    """Filter [k..., Cin/G, Cout] mirrored spatially, as [k..., Cout/G, Cin]: output
    feature g·Cin/G + c of group g reads gradient features [g·Cout/G, (g+1)·Cout/G)."""
    *spatial, group_inputs, outputs = w.shape.dims
    rank = len(spatial)
    if any(spatial):
        w = ctx.emit("reverse", [w], dimensions=tuple(range(rank)))
    w = ctx.reshape(w, (*spatial, group_inputs, groups, outputs // groups))
    w = _transpose(ctx, w, (*range(rank), rank + 2, rank + 1, rank))
    return ctx.reshape(w, (*spatial, outputs // groups, groups * group_inputs))


def _backprop_input_window(forward: Window, input_dims: tuple[int, ...],
                           grad_dims: tuple[int, ...]) -> Window:
    dims = []
    for i, d in enumerate(forward.dimensions):
        effective = (d.size - 1) * d.window_dilation + 1
        expanded = (grad_dims[1 + i] - 1) * d.stride + 1 if grad_dims[1 + i] else 0
        before = effective - 1 - d.padding_low
        after = input_dims[1 + i] + effective - 1 - expanded - before
        dims.append(WindowDimension(d.size, 1, before, after, d.window_dilation, d.stride))
    return Window(tuple(dims))


@dataclass(frozen=True)
class _Phase:
    """The input positions φ, φ+s, φ+2s, ... of one spatial dim of a strided gradient:
    the taps t0, t0+step, ... of the mirrored kernel reach them, each through gradient
    elements spaced `dilation` apart, with `window` padding that gives `size` outputs."""

    size: int
    first_tap: int
    taps: int
    step: int
    dilation: int
    low: int
    high: int


def _phases(d: WindowDimension, input_size: int, grad_size: int) -> list[_Phase | None]:
    """Per phase φ of the stride s = d.base_dilation: the sub-convolution over the
    undilated gradient that makes input positions φ + s·m (None where no tap reaches)."""
    stride, dilation = d.base_dilation, d.window_dilation
    step = stride // math.gcd(stride, dilation)
    phases: list[_Phase | None] = []
    for phase in range(stride):
        size = max(0, -(-(input_size - phase) // stride))
        first = next((t for t in range(min(d.size, step))
                      if (phase + t * dilation - d.padding_low) % stride == 0), None)
        if first is None or size == 0:
            phases.append(None)
            continue
        taps = len(range(first, d.size, step))
        sub_dilation = step * dilation // stride
        low = -((phase + first * dilation - d.padding_low) // stride)
        high = size - grad_size - low + (taps - 1) * sub_dilation
        phases.append(_Phase(size, first, taps, step, sub_dilation, low, high))
    return phases


def _backprop_input_by_phases(ctx: LoweringContext, grad: Instruction, kernel: Instruction,
                              window: Window, input_dims: tuple[int, ...], groups: int
                              ) -> Instruction:
    """A strided gradient (base dilation s) as s^rank stride-1 convolutions over the
    undilated gradient, one per phase of the input positions, interleaved: the products
    of the zeros a base dilation inserts are never made, and every convolution is one
    the CPU backend's GEMM path takes (it reads no base dilation)."""
    rank = len(window.dimensions)
    batch, channels = input_dims[0], input_dims[-1]
    per_dim = [_phases(d, input_dims[1 + i], grad.shape.dims[1 + i])
               for i, d in enumerate(window.dimensions)]
    strides = [d.base_dilation for d in window.dimensions]
    blocks = [-(-input_dims[1 + i] // strides[i]) for i in range(rank)]
    etype = grad.shape.element_type
    # Each phase's result, padded to the block counts, as [N, M1, 1, M2, 1, ..., C].
    spread = (batch, *[v for m in blocks for v in (m, 1)], channels)
    parts: dict[tuple[int, ...], Instruction] = {}
    for key in itertools.product(*[range(s) for s in strides]):
        phases = [per_dim[i][p] for i, p in enumerate(key)]
        if any(p is None for p in phases):
            parts[key] = ctx.full(0, grad.shape.with_dims(spread))
            continue
        chosen = [p for p in phases if p is not None]
        spec = [(p.first_tap, p.first_tap + p.step * (p.taps - 1) + 1, p.step)
                for p in chosen] + [(0, n, 1) for n in kernel.shape.dims[rank:]]
        sub_kernel = ctx.emit("slice", [kernel], slice=tuple(spec))
        sub_window = Window(tuple(WindowDimension(p.taps, 1, p.low, p.high, p.dilation)
                                  for p in chosen))
        part = convolution(ctx, grad, sub_kernel, sub_window, feature_groups=groups)
        config = [(0, 0), *((0, m - p.size) for m, p in zip(blocks, chosen)), (0, 0)]
        if any(c != (0, 0) for c in config):
            part = ctx.emit("pad", [part, ctx.constant(0, etype)],
                            padding=PaddingConfig.of(*config))
        parts[key] = ctx.reshape(part, spread)
    # Interleave, last spatial dim first: [.., Mi, 1, ..] of each phase → [.., Mi, si, ..].
    for i in reversed(range(rank)):
        merged: dict[tuple[int, ...], Instruction] = {}
        for key in itertools.product(*[range(s) for s in strides[:i]]):
            pieces = [parts[(*key, p)] for p in range(strides[i])]
            merged[key] = pieces[0] if len(pieces) == 1 else ctx.emit(
                "concatenate", pieces, dimensions=(2 + 2 * i,))
        parts = merged
    whole = ctx.reshape(parts[()], (batch, *[m * s for m, s in zip(blocks, strides)],
                                    channels))
    if whole.shape.dims == input_dims:
        return whole
    return ctx.emit("slice", [whole], slice=tuple((0, n, 1) for n in input_dims))


@register(*BACKPROP_INPUT_OPS, dtypes=FLOAT, static_inputs=(0,), check=_check_convolution,
          note="strides, dilations, SAME/VALID/EXPLICIT padding, NHWC/NCHW (NDHWC/NCDHW), "
               "grouped; input_sizes a compile-time constant; 2-byte floats "
               "accumulate in float32")
def _lower_backprop_input(ctx: LoweringContext, op: tf.Operation, operands: Operands
                          ) -> list[Instruction]:
    _check_sizes(ctx, op, 0)
    data_format = attribute(op, "data_format", "NHWC")
    input_dims = _channels_last_dims(ctx.output_shape().dims, data_format)
    w = _filter_as_grouped(ctx, op, operands[1])
    grad = _channels_last(ctx, operands[2], data_format)
    groups = feature_groups(input_dims[-1], w.shape.dims[-2])
    forward = _spatial_window(op, input_dims, w.shape.dims[:-2])
    window = _backprop_input_window(forward, input_dims, grad.shape.dims)
    unstrided = all(d.base_dilation == 1 for d in window.dimensions)
    if unstrided and groups == 1:
        # The filter as it is, `01oi` and flipped (XLA's form): no transposed copy of it.
        flipped = Window(tuple(dataclasses.replace(d, window_reversal=True)
                               for d in window.dimensions))
        result = convolution(ctx, grad, w, flipped,
                             dnums=_transposed_filter(len(window.dimensions)))
    elif unstrided or (groups == input_dims[-1] and w.shape.dims[-1] == groups):
        # A depthwise one (multiplier 1) keeps the dilated gradient: the CPU backend's
        # depthwise loops skip its holes, where the phases were convolutions of their own.
        result = convolution(ctx, grad, _backprop_input_kernel(ctx, w, groups), window,
                             feature_groups=groups)
    else:
        result = _backprop_input_by_phases(ctx, grad, _backprop_input_kernel(ctx, w, groups),
                                           window, input_dims, groups)
    if result.shape.dims != input_dims:
        raise LoweringError(f"{op.type} {op.name}: gradient of shape {result.shape.dims}, "
                            f"the input's is {input_dims}")
    return [_channels_first(ctx, result, data_format)]


@register(*BACKPROP_FILTER_OPS, dtypes=FLOAT, static_inputs=(1,), check=_check_convolution,
          note="strides, dilations, SAME/VALID/EXPLICIT padding, NHWC/NCHW (NDHWC/NCDHW), "
               "grouped; filter_sizes a compile-time constant; 2-byte floats "
               "accumulate in float32")
def _lower_backprop_filter(ctx: LoweringContext, op: tf.Operation, operands: Operands
                           ) -> list[Instruction]:
    _check_sizes(ctx, op, 1)
    data_format = attribute(op, "data_format", "NHWC")
    x = _channels_last(ctx, operands[0], data_format)
    grad = _channels_last(ctx, operands[2], data_format)
    filter_dims = ctx.output_shape().dims
    if op.type.startswith("Depthwise"):
        *spatial, channels, multiplier = filter_dims
        grouped_dims = (*spatial, 1, channels * multiplier)
    else:
        grouped_dims = filter_dims
    spatial_rank = x.shape.rank - 2
    groups = feature_groups(x.shape.dims[-1], grouped_dims[-2])
    forward = _spatial_window(op, x.shape.dims, grouped_dims[:-2])
    dims = []
    for i, d in enumerate(forward.dimensions):
        out = grad.shape.dims[1 + i]
        expanded = (out - 1) * d.stride + 1 if out else 0
        total = expanded + (d.size - 1) * d.window_dilation - x.shape.dims[1 + i]
        dims.append(WindowDimension(out, d.window_dilation, d.padding_low,
                                    total - d.padding_low, d.stride))
    # XLA's form, read in place: the input's C is the batch and N the contracted
    # feature, the gradient the kernel (N its input feature), the result [k..., Cin/G, Cout].
    result = convolution(ctx, x, grad, Window(tuple(dims)), batch_groups=groups,
                         dnums=ConvolutionDimensions.filter_gradient(spatial_rank))
    if result.shape.dims != grouped_dims:
        raise LoweringError(f"{op.type} {op.name}: gradient of shape {result.shape.dims}, "
                            f"the filter's is {grouped_dims}")
    return [ctx.reshape(result, filter_dims)]
