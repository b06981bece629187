"""Lowering rules of TF's pooling ops and their gradients: MaxPool, AvgPool (2-D and
3-D, MaxPoolV2), AvgPoolGrad, MaxPoolGrad and MaxPoolGradGrad.

Registered into `registry.OP_RULES` on import. A window is an HLO `Window` over every
dimension in the input's own layout, so NHWC and NCHW lower alike. Pools are
`reduce-window`s with TF's CPU reducers; AvgPoolGrad is tf2xla's. MaxPoolGrad and
MaxPoolGradGrad are primitive HLO rather than `select-and-scatter`, which differs from
TF's kernel around NaN: each window offset is a strided slice, compares and selects keep
the winning offset (`_window_argmax`, one kernel), and one interior-padded `pad` per
offset sends the gradient back, data movement the loop fusion takes whole. Each op's
values against TF's: docs/supported_ops.md. Auto-clustering leaves MaxPoolGrad of a
large window to TF's kernel (`tf_max_pool_grad_faster`, mark.py's `tf_kernels` gate).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.clustering.registry import (
    DATA_FORMATS,
    FLOAT,
    HALF_ELEMENT_TYPES,
    LoweringContext,
    LoweringError,
    attribute,
    constant_value,
    register,
    value_range,
)
from tfxla_lite.hlo import Computation, Instruction, Shape
from tfxla_lite.hlo.attributes import PaddingConfig, Window, WindowDimension

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]


def _sizes(op: tf.Operation, name: str, input_index: int | None) -> list[int]:
    """ksize or strides: an attribute, or for the V2 ops a constant input."""
    if input_index is None:
        return [int(v) for v in attribute(op, name, [])]
    value = constant_value(op.inputs[input_index])
    if value is None:
        raise LoweringError(f"{name} of {op.name} must be a constant")
    return [int(v) for v in np.asarray(value).reshape(-1)]


# Which inputs hold ksize and strides in the V2 ops.
_SIZE_INPUTS = {"MaxPoolV2": (1, 2), "MaxPoolGradV2": (3, 4), "MaxPoolGradGradV2": (3, 4)}


@dataclass(frozen=True)
class Pooling:
    """A pooling op's window over every dimension of its input (in the op's layout)."""

    window: Window

    @property
    def spatial(self) -> list[int]:
        return [d for d, w in enumerate(self.window.dimensions)
                if (w.size, w.stride, w.padding_low, w.padding_high) != (1, 1, 0, 0)]


def _geometry(op: tf.Operation, input_dims: tuple[int, ...]) -> Pooling:
    """The op's window over an input of `input_dims`: sizes and strides per dimension,
    padding from SAME (the odd element at the end, as TF pads), VALID or EXPLICIT."""
    data_format = attribute(op, "data_format", "NHWC")
    rank = len(data_format)
    inputs = _SIZE_INPUTS.get(op.type, (None, None))
    ksize, strides = _sizes(op, "ksize", inputs[0]), _sizes(op, "strides", inputs[1])
    if len(ksize) != rank or len(strides) != rank or len(input_dims) != rank:
        raise LoweringError(f"ksize {ksize} / strides {strides} for a rank-{len(input_dims)} "
                            f"{data_format} input")
    padding = attribute(op, "padding", "VALID")
    explicit = [int(v) for v in attribute(op, "explicit_paddings", [])]
    dims = []
    for d, (size, k, s) in enumerate(zip(input_dims, ksize, strides)):
        if padding == "SAME":
            out = -(-size // s)
            needed = max(0, (out - 1) * s + k - size)
            low, high = needed // 2, needed - needed // 2
        elif padding == "EXPLICIT":
            low, high = explicit[2 * d], explicit[2 * d + 1]
        else:
            low = high = 0
        dims.append(WindowDimension(k, s, low, high))
    return Pooling(Window(tuple(dims)))


def _check_pool(op: tf.Operation) -> str | None:
    data_format = attribute(op, "data_format", "NHWC")
    if data_format not in DATA_FORMATS:
        return f"data_format {data_format}"
    rank = len(data_format)
    channel = rank - 1 if data_format.endswith("C") else 1
    padding = attribute(op, "padding", "VALID")
    if padding not in ("SAME", "VALID", "EXPLICIT"):
        return f"padding {padding}"
    inputs = _SIZE_INPUTS.get(op.type, (None, None))
    try:
        ksize, strides = _sizes(op, "ksize", inputs[0]), _sizes(op, "strides", inputs[1])
    except LoweringError as error:
        return str(error)
    if len(ksize) != rank or len(strides) != rank:
        return f"ksize {ksize} / strides {strides} for {data_format}"
    if any(v < 1 for v in ksize + strides):
        return f"ksize {ksize} / strides {strides}"
    if any(ksize[d] != 1 or strides[d] != 1 for d in (0, channel)):
        return "pooling over the batch or channel dimension"
    if padding == "EXPLICIT":
        explicit = [int(v) for v in attribute(op, "explicit_paddings", [])]
        if len(explicit) != 2 * rank or any(v < 0 for v in explicit):
            return f"explicit_paddings {explicit}"
        if any(explicit[2 * d] or explicit[2 * d + 1] for d in (0, channel)):
            return "padding on the batch or channel dimension"
        if any(explicit[2 * d] >= ksize[d] or explicit[2 * d + 1] >= ksize[d]
               for d in range(rank)):
            return "explicit padding as wide as the window"
    return None


def _wide(ctx: LoweringContext, x: Instruction) -> Instruction:
    """2-byte floats widened to f32 for sums (XLA's SumAccumulationType)."""
    return ctx.convert(x, "f32") if x.shape.element_type in HALF_ELEMENT_TYPES else x


def _valid_counts(pooling: Pooling, input_dims: tuple[int, ...],
                  output_dims: tuple[int, ...]) -> np.ndarray:
    """The number of real (unpadded) input elements in each window, shaped to broadcast
    against the output (size 1 on the dimensions without a window)."""
    counts = np.ones((1,) * len(input_dims), dtype=np.float64)
    for d in pooling.spatial:
        w, n = pooling.window.dimensions[d], input_dims[d]
        start = np.arange(output_dims[d]) * w.stride - w.padding_low
        per_dim = np.minimum(start + w.size, n) - np.maximum(start, 0)
        counts = counts * per_dim.reshape([-1 if k == d else 1 for k in range(len(input_dims))])
    return counts


def _divide_by_counts(ctx: LoweringContext, total: Instruction, counts: np.ndarray
                      ) -> Instruction:
    etype = total.shape.element_type
    if np.all(counts == counts.reshape(-1)[0]) if counts.size else True:
        divisor = ctx.full(float(counts.reshape(-1)[0]) if counts.size else 1.0, total.shape)
    else:
        divisor = ctx.broadcast_to(ctx.constant(counts, etype), total.shape.dims)
    return ctx.emit("divide", [total, divisor])


# -- forward ---------------------------------------------------------------------------------

_MAX_NOTE = ("SAME/VALID/EXPLICIT (2-D), NHWC/NCHW (NDHWC/NCDHW); TF's values: NaN never "
             "wins and a window of -inf gives the lowest finite value")


@register("MaxPool", "MaxPool3D", dtypes=FLOAT, check=_check_pool, note=_MAX_NOTE)
def _lower_max_pool(ctx: LoweringContext, op: tf.Operation, operands: Operands
                    ) -> list[Instruction]:
    x = operands[0]
    pooling = _geometry(op, x.shape.dims)
    return [max_pool(ctx, x, pooling.window)]


register("MaxPoolV2", dtypes=FLOAT, static_inputs=(1, 2), check=_check_pool,
         note=_MAX_NOTE)(_lower_max_pool)


def max_pool(ctx: LoweringContext, x: Instruction, window: Window) -> Instruction:
    """TF's CPU max pool: NaN skipped, folded from the lowest finite value."""
    etype = x.shape.element_type
    lowest = value_range(etype)[0]
    return ctx.emit("reduce-window", [x, ctx.constant(lowest, etype)],
                    called_computations=[_greater_of(ctx, etype)], window=window)


def _greater_of(ctx: LoweringContext, etype: str) -> Computation:
    """TF's max-pool reducer `x > acc ? x : acc` as a scalar computation: a NaN never
    replaces the accumulator, and of two zeros the first stays (one `maxps` on x86,
    where HLO `maximum` propagates NaN at several instructions' cost)."""
    def build(comp: Computation) -> None:
        scalar = Shape(etype, ())
        accumulator = comp.add_parameter(0, scalar, name="x")
        element = comp.add_parameter(1, scalar, name="y")
        greater = comp.create("compare", [element, accumulator], direction="GT")
        comp.root = comp.create("select", [greater, element, accumulator])

    return ctx.module.shared_computation(f"greater_of_{etype}", build)


@register("AvgPool", "AvgPool3D", dtypes=FLOAT, check=_check_pool,
          note="SAME/VALID, NHWC/NCHW (NDHWC/NCDHW); each window divided by its number of "
               "unpadded elements, as TF; 2-byte floats sum in float32")
def _lower_avg_pool(ctx: LoweringContext, op: tf.Operation, operands: Operands
                    ) -> list[Instruction]:
    x = operands[0]
    etype = x.shape.element_type
    pooling = _geometry(op, x.shape.dims)
    wide = _wide(ctx, x)
    wtype = wide.shape.element_type
    total = ctx.emit("reduce-window", [wide, ctx.constant(0, wtype)],
                     called_computations=[ctx.module.reduction_computation("add", wtype)],
                     window=pooling.window)
    counts = _valid_counts(pooling, x.shape.dims, total.shape.dims)
    return [ctx.convert(_divide_by_counts(ctx, total, counts), etype)]


# -- gradients -------------------------------------------------------------------------------
@register("AvgPoolGrad", "AvgPool3DGrad", dtypes=FLOAT,
          static_inputs=(0,), check=_check_pool,
          note="SAME/VALID, NHWC/NCHW (NDHWC/NCDHW); the input shape constant")
def _lower_avg_pool_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                         ) -> list[Instruction]:
    grad = operands[1]
    etype = grad.shape.element_type
    input_dims = tuple(int(d) for d in ctx.static_input(0).reshape(-1))
    result_shape = Shape(etype, input_dims)
    if grad.shape.num_elements == 0 or result_shape.num_elements == 0:
        return [ctx.full(0, result_shape)]
    pooling = _geometry(op, input_dims)
    wide = _wide(ctx, grad)
    wtype = wide.shape.element_type
    counts = _valid_counts(pooling, input_dims, grad.shape.dims)
    scaled = _divide_by_counts(ctx, wide, counts)
    # Input element i gets the windows o with o·s - low <= i < o·s - low + k: a window of
    # k over the gradient dilated by s and padded by k - 1 - low in front.
    dims = []
    for w, n, o in zip(pooling.window.dimensions, input_dims, grad.shape.dims):
        low = w.size - 1 - w.padding_low
        high = n - 1 + w.padding_low - (o - 1) * w.stride
        dims.append(WindowDimension(w.size, 1, low, high, 1, w.stride))
    summed = ctx.emit("reduce-window", [scaled, ctx.constant(0, wtype)],
                      called_computations=[ctx.module.reduction_computation("add", wtype)],
                      window=Window(tuple(dims)))
    return [ctx.convert(summed, etype)]


@dataclass(frozen=True)
class _Windows:
    """Every window offset of a pooling as a strided slice of the padded input."""

    padded_dims: tuple[int, ...]  # the padded input's extent
    output_dims: tuple[int, ...]
    offsets: tuple[tuple[int, ...], ...]  # the offsets some window holds a real element at

    def slice_spec(self, offset: tuple[int, ...], window: Window) -> tuple[Any, ...]:
        return tuple((w, w + (o - 1) * d.stride + 1, d.stride)
                     for w, o, d in zip(offset, self.output_dims, window.dimensions))


def _offsets(window: Window, input_dims: tuple[int, ...],
             output_dims: tuple[int, ...]) -> tuple[_Windows, dict[tuple[int, ...], Any]]:
    """The window offsets and, per offset, where its element is real: None everywhere,
    else a bool array over the output (size 1 on dimensions where it does not vary)."""
    padded = tuple(max(d.padding_low + n, (o - 1) * d.stride + d.size)
                   for d, n, o in zip(window.dimensions, input_dims, output_dims))
    offsets, masks = [], {}
    for offset in itertools.product(*(range(d.size) for d in window.dimensions)):
        mask = np.ones((1,) * len(input_dims), dtype=bool)
        for k, (w, d, n, o) in enumerate(zip(offset, window.dimensions, input_dims,
                                             output_dims)):
            position = np.arange(o) * d.stride + w - d.padding_low
            inside = (position >= 0) & (position < n)
            if not inside.all():
                mask = mask & inside.reshape([-1 if j == k else 1
                                              for j in range(len(input_dims))])
        if not mask.any():
            continue
        offsets.append(offset)
        masks[offset] = None if mask.all() else mask
    return _Windows(padded, output_dims, tuple(offsets)), masks


def _pad_to(ctx: LoweringContext, x: Instruction, window: Window,
            padded_dims: tuple[int, ...]) -> Instruction:
    config = [(d.padding_low, p - d.padding_low - n)
              for d, n, p in zip(window.dimensions, x.shape.dims, padded_dims)]
    if all(c == (0, 0) for c in config):
        return x
    return ctx.emit("pad", [x, ctx.constant(0, x.shape.element_type)],
                    padding=PaddingConfig.of(*config))


def _window_argmax(ctx: LoweringContext, x: Instruction, window: Window,
                   output_dims: tuple[int, ...]) -> tuple[_Windows, Instruction]:
    """Per window, the number (into `_Windows.offsets`) of the element TF's CPU kernel
    picks: the first real one, then any strictly greater one, in row-major order."""
    windows, masks = _offsets(window, x.shape.dims, output_dims)
    padded = _pad_to(ctx, x, window, windows.padded_dims)
    index_shape = Shape("s32", output_dims)
    best: Instruction | None = None
    index: Instruction | None = None
    found: Instruction | bool = False  # whether a real element was seen, per window
    for number, offset in enumerate(windows.offsets):
        element = ctx.emit("slice", [padded], slice=windows.slice_spec(offset, window))
        mask = masks[offset]
        real = None if mask is None else ctx.broadcast_to(ctx.constant(mask, "pred"),
                                                          output_dims)
        if best is None:
            take = real
        else:
            greater = ctx.emit("compare", [element, best], direction="GT")
            if found is not True:
                greater = ctx.emit("or", [greater, ctx.emit("not", [found])])
            take = greater if real is None else ctx.emit("and", [real, greater])
        if take is None or best is None:
            best, index = element, ctx.full(number, index_shape)
        else:
            best = ctx.emit("select", [take, element, best])
            index = ctx.emit("select", [take, ctx.full(number, index_shape), index])
        if real is None or found is True:
            found = True
        elif found is False:
            found = real
        else:
            found = ctx.emit("or", [found, real])
    assert index is not None
    return windows, index


# Gradients left to TF's kernel in auto mode where that is faster (mark.py's `tf_kernels`
# gate; jit_compile=True compiles them all).
MAX_POOL_GRAD_TF_KERNEL_OPS = frozenset({"MaxPoolGrad", "MaxPoolGradV2"})
# Spreading the gradient back branches once per window offset for every input element,
# so past this many window elements TF's kernel (one pass over the windows) is faster.
LARGEST_COMPILED_GRAD_WINDOW = 16


def tf_max_pool_grad_faster(op: tf.Operation) -> bool:
    """Whether TF's kernel beats the compiled MaxPoolGrad: a window of more than
    LARGEST_COMPILED_GRAD_WINDOW elements (ksize an input the rule cannot read: TF's)."""
    inputs = _SIZE_INPUTS.get(op.type, (None, None))
    try:
        elements = int(np.prod(_sizes(op, "ksize", inputs[0])))
    except LoweringError:
        return True
    return elements > LARGEST_COMPILED_GRAD_WINDOW


_MAX_GRAD_NOTE = ("SAME/VALID/EXPLICIT, NHWC/NCHW; each window's gradient goes to its "
                  "first maximum (TF's CPU kernel; a NaN only when first); auto-clustering "
                  "leaves windows of more than 16 elements to TF's faster kernel")


@register("MaxPoolGrad", dtypes=FLOAT, unused_inputs=(1,), check=_check_pool,
          note=_MAX_GRAD_NOTE)
def _lower_max_pool_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                         ) -> list[Instruction]:
    x, grad = operands[0], operands[2]
    if x.shape.num_elements == 0 or grad.shape.num_elements == 0:
        return [ctx.full(0, x.shape.with_element_type(grad.shape.element_type))]
    window = _geometry(op, x.shape.dims).window
    windows, index = _window_argmax(ctx, x, window, grad.shape.dims)
    # Each offset's `pad` reads the index at other windows than its neighbours', so a
    # fused index would be recomputed per offset (k^2 windows per element): the
    # bitcast-convert, no loop-fusion candidate, makes it one kernel's buffer.
    index = ctx.emit("bitcast-convert", [index], shape=Shape("u32", index.shape.dims))

    def chosen(number: int, offset: tuple[int, ...]) -> Instruction:
        return ctx.emit("compare", [index, ctx.full(number, index.shape)], direction="EQ")

    return [_scatter_back(ctx, x, grad, window, windows, chosen)]


register("MaxPoolGradV2", dtypes=FLOAT, static_inputs=(3, 4), unused_inputs=(1,),
         check=_check_pool, note=_MAX_GRAD_NOTE)(_lower_max_pool_grad)


@register("MaxPool3DGrad", dtypes=FLOAT, check=_check_pool,
          note="SAME/VALID, NDHWC/NCDHW; each window's gradient goes to every element equal "
               "to the forward output (TF's CPU kernel: all of equal maxima, never a NaN)")
def _lower_max_pool_3d_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                            ) -> list[Instruction]:
    x, pooled, grad = operands[:3]
    if x.shape.num_elements == 0 or grad.shape.num_elements == 0:
        return [ctx.full(0, x.shape.with_element_type(grad.shape.element_type))]
    window = _geometry(op, x.shape.dims).window
    windows, masks = _offsets(window, x.shape.dims, grad.shape.dims)
    padded = _pad_to(ctx, x, window, windows.padded_dims)
    pooled = ctx.convert(pooled, x.shape.element_type)

    def chosen(number: int, offset: tuple[int, ...]) -> Instruction:
        element = ctx.emit("slice", [padded], slice=windows.slice_spec(offset, window))
        # TF's kernel credits an element whose difference from the output is 0, so never
        # an infinity (inf - inf is NaN).
        difference = ctx.emit("subtract", [element, pooled])
        equal = ctx.emit("compare", [difference, ctx.full(0, difference.shape)],
                         direction="EQ")
        mask = masks[offset]
        if mask is None:
            return equal
        return ctx.emit("and", [ctx.broadcast_to(ctx.constant(mask, "pred"), pooled.shape.dims),
                                equal])

    return [_scatter_back(ctx, x, grad, window, windows, chosen)]


def _scatter_back(ctx: LoweringContext, x: Instruction, grad: Instruction, window: Window,
                  windows: _Windows, chosen: Any) -> Instruction:
    """The input's gradient: per window offset, the output gradient where `chosen(number,
    offset)` holds, spread back to that offset of every window and summed."""
    etype = grad.shape.element_type
    zero = ctx.full(0, grad.shape)
    # TF adds into each input element from zero, in its own type, in row-major order of
    # the windows; a later offset is an earlier window, so offsets go in reverse.
    total = ctx.full(0, Shape(etype, windows.padded_dims))
    for number, offset in reversed(list(enumerate(windows.offsets))):
        part = ctx.emit("select", [chosen(number, offset), grad, zero])
        # Output o's element at this offset sits at o·stride + offset of the padded input.
        config = [(w, p - w - (o - 1) * d.stride - 1, d.stride - 1)
                  for w, p, o, d in zip(offset, windows.padded_dims, windows.output_dims,
                                        window.dimensions)]
        spread = ctx.emit("pad", [part, ctx.constant(0, etype)],
                          padding=PaddingConfig.of(*config))
        total = ctx.emit("add", [total, spread])
    spec = tuple((d.padding_low, d.padding_low + n, 1)
                 for d, n in zip(window.dimensions, x.shape.dims))
    if any(s != (0, p, 1) for s, p in zip(spec, windows.padded_dims)):
        total = ctx.emit("slice", [total], slice=spec)
    return total


_GRAD_GRAD_NOTE = ("SAME/VALID/EXPLICIT, NHWC/NCHW (NDHWC/NCDHW); reads the gradient at "
                   "each window's first element equal to the forward output, as TF's "
                   "CPU kernel (0 where none is)")


# MaxPool3DGradGrad: neither TF's CPU kernels nor TF's XLA take float16, so nothing could
# say what its float16 result is; it stays in TF, which refuses it as plain TF does.
@register("MaxPool3DGradGrad", dtypes=FLOAT - {"float16"}, check=_check_pool,
          note=_GRAD_GRAD_NOTE)
@register("MaxPoolGradGrad", dtypes=FLOAT, check=_check_pool, note=_GRAD_GRAD_NOTE)
def _lower_max_pool_grad_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                              ) -> list[Instruction]:
    x, pooled, grad = operands[:3]
    if pooled.shape.num_elements == 0:
        return [ctx.full(0, pooled.shape)]
    if x.shape.num_elements == 0:
        raise LoweringError("max pool windows over an empty input")
    window = _geometry(op, x.shape.dims).window
    windows, masks = _offsets(window, x.shape.dims, pooled.shape.dims)
    padded_x = _pad_to(ctx, x, window, windows.padded_dims)
    padded_grad = _pad_to(ctx, grad, window, windows.padded_dims)
    # TF's kernel reads the gradient at the first element equal to the forward output (so
    # never at a NaN), and gives 0 where none is: later offsets first, earlier ones win.
    result = ctx.full(0, pooled.shape)
    for offset in reversed(windows.offsets):
        spec = windows.slice_spec(offset, window)
        element = ctx.emit("slice", [padded_x], slice=spec)
        equal = ctx.emit("compare", [element, pooled], direction="EQ")
        mask = masks[offset]
        if mask is not None:
            real = ctx.broadcast_to(ctx.constant(mask, "pred"), pooled.shape.dims)
            equal = ctx.emit("and", [real, equal])
        result = ctx.emit("select", [equal, ctx.emit("slice", [padded_grad], slice=spec),
                                     result])
    return [result]


register("MaxPoolGradGradV2", dtypes=FLOAT, static_inputs=(3, 4), check=_check_pool,
         note=_GRAD_GRAD_NOTE)(_lower_max_pool_grad_grad)
