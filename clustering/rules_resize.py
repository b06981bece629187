"""Lowering rules of TF's 2-D image resizes: ResizeBilinear, ResizeNearestNeighbor,
ResizeBicubic and their gradients (Keras UpSampling2D and Resizing, `tf.image.resize`).

Registered into `registry.OP_RULES` on import. The output size is static, so where each
output row and column reads from, and with which weights, is worked out at compile
time in TF's CPU float32 arithmetic (`image_resizer_state.h`): the HLO gathers by
constant indices (strided slices where the tables are periodic,
`periodic_progressions`) and blends in TF's order. Gradients are scatter-free.
Auto-clustering leaves downsampling bilinear and bicubic gradients to TF's faster
kernels (`tf_resize_faster`). Each op against TF: docs/supported_ops.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.clustering.registry import (
    FLOAT,
    NUMERIC,
    LoweringContext,
    attribute,
    known_dims,
    register,
)
from tfxla_lite.hlo import Instruction
from tfxla_lite.hlo.attributes import PaddingConfig

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]
# (source index, weight) pairs: for each output position, where it reads and how much.
Taps = list[list[tuple[int, float]]]

_ROWS, _COLUMNS = 1, 2


# -- TF's index arithmetic, in float32 ---------------------------------------------------------
def _scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    """CalculateResizeScale: a float32 quotient of the sizes. From a size of 1, TF's
    kernels scale as without align_corners (visible only in which zero weights its
    gradient multiplies: an infinite gradient gives NaN there)."""
    if align_corners and out_size > 1 and in_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def _coordinates(in_size: int, out_size: int, align_corners: bool, half_pixel: bool,
                 offset: float) -> np.ndarray:
    """Each output position's source coordinate in float32: `(i + 0.5) * scale - offset`
    with half-pixel centers, else `i * scale`."""
    scale = _scale(in_size, out_size, align_corners)
    positions = np.arange(out_size, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if half_pixel:
            return (positions + np.float32(0.5)) * scale - np.float32(offset)
        return positions * scale


def bilinear_taps(in_size: int, out_size: int, align_corners: bool, half_pixel: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower, upper, lerp) per output position, as TF's compute_interpolation_weights."""
    where = _coordinates(in_size, out_size, align_corners, half_pixel, 0.5)
    floor = np.floor(where)
    lower = np.maximum(floor.astype(np.int64), 0)
    upper = np.minimum(np.ceil(where).astype(np.int64), in_size - 1)
    return lower, upper, (where - floor).astype(np.float32)


def nearest_taps(in_size: int, out_size: int, align_corners: bool, half_pixel: bool
                 ) -> np.ndarray:
    """The source index per output position, as TF's nearest-neighbor compute_indices."""
    where = _coordinates(in_size, out_size, align_corners, half_pixel, 0.0).astype(np.float64)
    # roundf rounds halves away from zero; the float32 value is exact in float64.
    index = np.sign(where) * np.floor(np.abs(where) + 0.5) if align_corners else np.floor(where)
    index = np.minimum(index.astype(np.int64), in_size - 1)
    return np.maximum(index, 0) if half_pixel else index


# -- checks ----------------------------------------------------------------------------------
def _check_resize(op: tf.Operation) -> str | None:
    """TF's ImageResizerState: 4-D, positive sizes and channels, not both pixel rules."""
    if op.get_attr("half_pixel_centers") and op.get_attr("align_corners"):
        return "half_pixel_centers and align_corners both set (TF raises)"
    image = op.inputs[0]
    if image.shape.rank != 4:
        return f"image of rank {image.shape.rank}, not 4"
    dims = known_dims(op.outputs[0])
    if dims is None:
        return None
    in_dims = image.shape.as_list()
    if any(d == 0 for d in (*in_dims[1:], *dims[1:3])):
        return "an image or output size of 0, or no channels (TF raises)"
    return None


def _check_resize_grad(op: tf.Operation) -> str | None:
    if op.get_attr("half_pixel_centers") and op.get_attr("align_corners"):
        return "half_pixel_centers and align_corners both set (TF raises)"
    grads, original = op.inputs[0].shape, op.inputs[1].shape
    if grads.rank != 4 or original.rank != 4:
        return "gradient or original image not 4-D"
    if any(d == 0 for d in (*grads.as_list()[1:3], *original.as_list()[1:3])):
        return "a resized or original size of 0 (TF raises)"
    return None


def _check_nearest_grad(op: tf.Operation) -> str | None:
    """ResizeNearestNeighborGrad takes both pixel rules together (its kernel does not
    check); it needs a positive target size."""
    if op.inputs[0].shape.rank != 4:
        return "gradient not 4-D"
    dims = known_dims(op.outputs[0])
    if dims is not None and (dims[1] == 0 or dims[2] == 0):
        return "a target size of 0 (TF raises)"
    return None


def _pixel_rules(op: tf.Operation) -> tuple[bool, bool]:
    return (bool(attribute(op, "align_corners", False)),
            bool(attribute(op, "half_pixel_centers", False)))


# -- gathers along one axis -------------------------------------------------------------------
def _take(ctx: LoweringContext, x: Instruction, axis: int, indices: np.ndarray
          ) -> Instruction:
    """`x` gathered at the constant `indices` (any shape) along `axis`: the indices' dims
    replace that axis. A 1-D table with structure (`periodic_progressions`) becomes
    slices instead of a gather."""
    if indices.ndim == 1:
        structured = _structured_take(ctx, x, axis, indices)
        if structured is not None:
            return structured
    index_dims = indices.shape
    vectors = ctx.constant(indices.reshape(*index_dims, 1).astype(np.int32), "s32")
    sizes = tuple(1 if d == axis else n for d, n in enumerate(x.shape.dims))
    out_rank = x.shape.rank - 1 + len(index_dims)
    offset_dims = tuple(range(axis)) + tuple(range(axis + len(index_dims), out_rank))
    return ctx.emit("gather", [x, vectors], offset_dims=offset_dims,
                    collapsed_slice_dims=(axis,), start_index_map=(axis,),
                    index_vector_dim=len(index_dims), slice_sizes=sizes)


_MAX_PERIOD = 8


def periodic_progressions(indices: np.ndarray, max_period: int = _MAX_PERIOD
                          ) -> tuple[int, list[tuple[int, int]]] | None:
    """The smallest period p (dividing the length, at most `max_period`) such that each
    residue class `indices[c::p]` is an arithmetic progression with a step >= 0, and
    each class's (start, step); None when there is none. Integer-factor resizes have
    one: a x2 nearest upsampling reads 0, 0, 1, 1, ... (p = 2, steps 1), a x4
    downsampling 1, 5, 9, ... (p = 1, step 4)."""
    n = len(indices)
    for period in range(1, min(n, max_period) + 1):
        if n % period:
            continue
        classes = []
        for c in range(period):
            values = indices[c::period].astype(np.int64)
            step = int(values[1] - values[0]) if len(values) > 1 else 0
            if step < 0 or np.any(np.diff(values) != step):
                break
            classes.append((int(values[0]), step))
        else:
            return period, classes
    return None


_MAX_EDGE = 2


def _structured_take(ctx: LoweringContext, x: Instruction, axis: int, indices: np.ndarray,
                     zero_index: int | None = None, weights: np.ndarray | None = None
                     ) -> Instruction | None:
    """`_structured_run` of `indices`, or of its middle with up to `_MAX_EDGE` positions
    at each end taken one by one and concatenated around it (the clamped edges of a
    half-pixel resize break the period there); None when neither has structure."""
    n = len(indices)
    for trimmed in range(2 * _MAX_EDGE + 1):
        for head in range(min(trimmed, _MAX_EDGE) + 1):
            tail = trimmed - head
            if tail > _MAX_EDGE or trimmed >= n:
                continue
            runs = ([(i, i + 1) for i in range(head)] + [(head, n - tail)]
                    + [(i, i + 1) for i in range(n - tail, n)])
            if not all(_has_structure(indices[a:b], zero_index) for a, b in runs):
                continue
            pieces = [_structured_run(ctx, x, axis, indices[a:b], zero_index,
                                      None if weights is None else weights[a:b])
                      for a, b in runs]
            if len(pieces) == 1:
                return pieces[0]
            return ctx.emit("concatenate", pieces, dimensions=(axis,))
    return None


def _has_structure(indices: np.ndarray, zero_index: int | None) -> bool:
    """Whether `_structured_run` takes `indices` (see there)."""
    found = periodic_progressions(indices) if len(indices) else None
    if found is None:
        return False
    period, classes = found
    if zero_index is None:
        return period == 1
    count = len(indices) // period
    return all(not step or zero_index not in (start, start + step * (count - 1))
               for start, step in classes)


def _structured_run(ctx: LoweringContext, x: Instruction, axis: int, indices: np.ndarray,
                    zero_index: int | None = None, weights: np.ndarray | None = None
                    ) -> Instruction:
    """`x` at `indices` along `axis` without a gather (`_has_structure` holds). Each
    residue class of `periodic_progressions` is a strided slice (a broadcast row for a
    step of 0), spread to its positions by a pad with interior padding, and the classes
    are added; a class
    of only `zero_index` is left out (zeros). Adding the other classes' zeros is exact
    but for -0.0, so with no `zero_index` (a forward read) only a single class (period
    1: a plain strided slice) is taken; no class may mix `zero_index` with rows of
    `x`. `weights` (per index) multiply each class before it is spread, so
    that a fused loop multiplies only the values read. A fused loop computes these with
    constant index arithmetic, where a gather loads and clamps an index per element."""
    found = periodic_progressions(indices)
    assert found is not None
    period, classes = found
    count = len(indices) // period
    dims = x.shape.dims
    part_dims = dims[:axis] + (count,) + dims[axis + 1:]
    total = None
    for c, (start, step) in enumerate(classes):
        last = start + step * (count - 1)
        if zero_index is not None and zero_index in (start, last):
            continue  # only the zero row
        spec = [(0, n, 1) for n in dims]
        if step == 0:
            spec[axis] = (start, start + 1, 1)
            row = ctx.emit("slice", [x], slice=tuple(spec))
            part = ctx.emit("broadcast", [ctx.reshape(row, dims[:axis] + dims[axis + 1:])],
                            shape=x.shape.with_dims(part_dims),
                            dimensions=tuple(d for d in range(len(dims)) if d != axis))
        else:
            spec[axis] = (start, last + 1, step)
            part = ctx.emit("slice", [x], slice=tuple(spec))
        if weights is not None:
            weight = _along(ctx, weights[c::period], part_dims, (axis,), x.shape.element_type)
            part = ctx.emit("multiply", [part, weight])
        if period > 1:
            config = [(0, 0, 0)] * len(dims)
            config[axis] = (c, period - 1 - c, period - 1)
            part = ctx.emit("pad", [part, ctx.constant(0, x.shape.element_type)],
                            padding=PaddingConfig.of(*config))
        total = part if total is None else ctx.emit("add", [total, part])
    if total is None:
        return ctx.full(0, x.shape.with_dims(dims[:axis] + (len(indices),) + dims[axis + 1:]))
    return total


def _along(ctx: LoweringContext, values: np.ndarray, dims: tuple[int, ...], axes: tuple[int, ...],
           etype: str) -> Instruction:
    """The constant `values` broadcast to `dims`, its own dims landing on `axes`."""
    constant = ctx.constant(values.astype(np.float32), "f32")
    constant = ctx.convert(constant, etype)
    return ctx.emit("broadcast", [constant], shape=constant.shape.with_dims(dims),
                    dimensions=axes)


# -- forward resizes -----------------------------------------------------------------------
@register("ResizeBilinear", dtypes=NUMERIC, unused_inputs=(1,), check=_check_resize,
          note="NHWC, constant size; TF's float32 indices, weights and blend (its NaN and "
               "inf results)")
def _lower_resize_bilinear(ctx: LoweringContext, op: tf.Operation, operands: Operands
                           ) -> list[Instruction]:
    out = ctx.output_shape()
    image = ctx.convert(operands[0], "f32")
    batch, in_h, in_w, channels = image.shape.dims
    out_h, out_w = out.dims[1], out.dims[2]
    if (out_h, out_w) == (in_h, in_w):  # TF's kernel casts and returns
        return [image]
    align, half = _pixel_rules(op)
    y_low, y_high, y_lerp = bilinear_taps(in_h, out_h, align, half)
    x_low, x_high, x_lerp = bilinear_taps(in_w, out_w, align, half)

    def blend(a: Instruction, b: Instruction, lerp: Instruction) -> Instruction:
        difference = ctx.emit("subtract", [b, a])
        return ctx.emit("add", [a, ctx.emit("multiply", [difference, lerp])])

    top, bottom = _take(ctx, image, _ROWS, y_low), _take(ctx, image, _ROWS, y_high)
    x_weight = _along(ctx, x_lerp, out.dims, (_COLUMNS,), "f32")
    rows = [blend(_take(ctx, row, _COLUMNS, x_low), _take(ctx, row, _COLUMNS, x_high),
                  x_weight) for row in (top, bottom)]
    return [blend(rows[0], rows[1], _along(ctx, y_lerp, out.dims, (_ROWS,), "f32"))]


@register("ResizeNearestNeighbor", dtypes=NUMERIC, unused_inputs=(1,), check=_check_resize,
          note="NHWC, constant size; TF's float32 indices")
def _lower_resize_nearest(ctx: LoweringContext, op: tf.Operation, operands: Operands
                          ) -> list[Instruction]:
    out = ctx.output_shape()
    image = operands[0]
    align, half = _pixel_rules(op)
    for axis in (_ROWS, _COLUMNS):
        in_size, out_size = image.shape.dims[axis], out.dims[axis]
        if in_size == out_size and not half and not align:
            continue  # the identity: i * 1.0 is i
        image = _take(ctx, image, axis, nearest_taps(in_size, out_size, align, half))
    return [image]


# -- gradients -------------------------------------------------------------------------------
def _spread(taps: Taps, in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Invert `taps` (per output position) into a table per input position: the output
    positions that read it and their weights, padded with `out_size` (a zero row) and 0."""
    readers: list[list[tuple[int, float]]] = [[] for _ in range(in_size)]
    for position, reads in enumerate(taps):
        for source, weight in reads:
            readers[source].append((position, weight))
    width = max((len(r) for r in readers), default=0)
    width = max(width, 1)
    table = np.full((in_size, width), out_size, np.int64)
    weights = np.zeros((in_size, width), np.float32)
    for source, reads in enumerate(readers):
        for k, (position, weight) in enumerate(reads):
            table[source, k] = position
            weights[source, k] = weight
    return table, weights


def _gather_back(ctx: LoweringContext, gradient: Instruction, axis: int, taps: Taps,
                 in_size: int, weighted: bool, summed: bool = True) -> Instruction:
    """The gradient taken back along `axis` onto `in_size` positions through `taps`:
    [..., in_size, k, ...] terms (weighted where asked), summed over k unless not
    `summed`."""
    out_size = gradient.shape.dims[axis]
    table, weights = _spread(taps, in_size, out_size)
    etype = gradient.shape.element_type
    if summed:
        columns = _columns_back(ctx, gradient, axis, table, weights if weighted else None)
        if columns is not None:
            return columns
    config = [(0, 0)] * gradient.shape.rank
    config[axis] = (0, 1)
    padded = ctx.emit("pad", [gradient, ctx.constant(0, etype)],
                      padding=PaddingConfig.of(*config))
    gathered = _take(ctx, padded, axis, table)
    if weighted:
        weight = _along(ctx, weights, gathered.shape.dims, (axis, axis + 1), etype)
        gathered = ctx.emit("multiply", [gathered, weight])
    return ctx.reduce(gathered, [axis + 1], "add", 0) if summed else gathered


def _columns_back(ctx: LoweringContext, gradient: Instruction, axis: int, table: np.ndarray,
                  weights: np.ndarray | None) -> Instruction | None:
    """`_gather_back`'s sum without the gather, when every column of `table` has structure
    (`_structured_take`, the zero row as zeros): each column weighted, then added from a
    zero in column order (the reduce's order; 2-byte floats in float32). None otherwise."""
    etype = gradient.shape.element_type
    out_size = gradient.shape.dims[axis]
    terms = []
    for k in range(table.shape[1]):
        term = _structured_take(ctx, gradient, axis, table[:, k], zero_index=out_size,
                                weights=None if weights is None else weights[:, k])
        if term is None:
            return None
        terms.append(term)
    wide = "f32" if etype in ("f16", "bf16") else etype
    total = ctx.full(0, terms[0].shape.with_element_type(wide))
    for term in terms:
        total = ctx.emit("add", [total, ctx.convert(term, wide)])
    return ctx.convert(total, etype)


def _bilinear_reads(in_size: int, out_size: int, align: bool, half: bool) -> Taps:
    lower, upper, lerp = bilinear_taps(in_size, out_size, align, half)
    inverse = np.float32(1) - lerp
    return [[(int(lo), float(w_lo)), (int(hi), float(w_hi))]
            for lo, hi, w_lo, w_hi in zip(lower, upper, inverse, lerp)]


@register("ResizeBilinearGrad", dtypes=FLOAT, check=_check_resize_grad, unused_inputs=(1,),
          note="NHWC; weights multiplied as TF's (row, then column, in float32), summed in "
               "another order; auto-clustering leaves one of a downsampling resize to TF's "
               "kernel (faster), jit_compile=True compiles it")
def _lower_resize_bilinear_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                                ) -> list[Instruction]:
    out = ctx.output_shape()
    gradient = operands[0]
    align, half = _pixel_rules(op)
    rows = _bilinear_reads(out.dims[_ROWS], gradient.shape.dims[_ROWS], align, half)
    columns = _bilinear_reads(out.dims[_COLUMNS], gradient.shape.dims[_COLUMNS], align, half)
    if out.element_type != "f64":
        gradient = _gather_back(ctx, gradient, _ROWS, rows, out.dims[_ROWS], weighted=True)
        gradient = _gather_back(ctx, gradient, _COLUMNS, columns, out.dims[_COLUMNS],
                                weighted=True)
        return [ctx.convert(gradient, out.element_type)]
    # TF rounds each product (gradient * row weight * column weight) to float32 and sums
    # in float64: the products [n, h, k_rows, w, k_columns, c] are kept apart until then.
    terms = _gather_back(ctx, gradient, _ROWS, rows, out.dims[_ROWS], weighted=True,
                         summed=False)
    terms = _gather_back(ctx, terms, _COLUMNS + 1, columns, out.dims[_COLUMNS], weighted=True,
                         summed=False)
    return [ctx.reduce(ctx.convert(terms, "f64"), [_ROWS + 1, _COLUMNS + 2], "add", 0)]


@register("ResizeNearestNeighborGrad", dtypes=NUMERIC, unused_inputs=(1,),
          check=_check_nearest_grad, note="NHWC, constant size; 2-byte floats sum in float32")
def _lower_resize_nearest_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                               ) -> list[Instruction]:
    out = ctx.output_shape()
    gradient = operands[0]
    align, half = _pixel_rules(op)
    for axis in (_ROWS, _COLUMNS):
        in_size, out_size = out.dims[axis], gradient.shape.dims[axis]
        sources = nearest_taps(in_size, out_size, align, half) if out_size else []
        reads = [[(int(s), 1.0)] for s in sources]
        gradient = _gather_back(ctx, gradient, axis, reads, in_size, weighted=False)
    return [gradient]


# -- bicubic -----------------------------------------------------------------------------------
_TABLE_SIZE = 1024


def _cubic_table(a: float) -> np.ndarray:
    """TF's InitCoeffsTable: [kTableSize + 1, 2] float32 weights of the cubic kernel at
    distances i / 1024 and 1 + i / 1024, computed in double from a float position."""
    table = np.zeros((_TABLE_SIZE + 1, 2), np.float32)
    for i in range(_TABLE_SIZE + 1):
        x = float(np.float32(i * 1.0 / _TABLE_SIZE))
        table[i, 0] = ((a + 2) * x - (a + 3)) * x * x + 1
        x = float(np.float32(x + 1.0))
        table[i, 1] = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return table


def bicubic_taps(in_size: int, out_size: int, align_corners: bool, half_pixel: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(indices [out, 4], float32 weights [out, 4]) as TF's GetWeightsAndIndices: Keys'
    kernel (a = -0.5) with out-of-image taps zeroed and the rest renormalized for
    half-pixel centers, else a = -0.75 with the edge pixel repeated."""
    table = _cubic_table(-0.5 if half_pixel else -0.75)
    where = _coordinates(in_size, out_size, align_corners, half_pixel, 0.5)
    floor = np.floor(where)
    offset = np.rint((where - floor).astype(np.float32) * np.float32(_TABLE_SIZE)
                     ).astype(np.int64)  # lrintf: to nearest, ties to even
    start = floor.astype(np.int64)
    wanted = start[:, None] + np.arange(-1, 3)[None, :]
    indices = np.clip(wanted, 0, in_size - 1)
    weights = np.stack([table[offset, 1], table[offset, 0], table[_TABLE_SIZE - offset, 0],
                        table[_TABLE_SIZE - offset, 1]], axis=1)
    if half_pixel:
        weights = np.where(indices == wanted, weights, np.float32(0))
        total = ((weights[:, 0] + weights[:, 1]) + weights[:, 2]) + weights[:, 3]
        scale = np.float32(1) / np.where(total == 0, np.float32(1), total)
        keep = np.abs(total) >= np.float32(1000) * np.finfo(np.float32).tiny
        weights = np.where(keep[:, None], weights * scale[:, None], weights)
    return indices, weights.astype(np.float32)


def _cubic_along(ctx: LoweringContext, x: Instruction, axis: int, indices: np.ndarray,
                 weights: np.ndarray) -> Instruction:
    """TF's Interpolate1D along `axis`: ((v0 * w0 + v1 * w1) + v2 * w2) + v3 * w3."""
    total = None
    for tap in range(4):
        value = _take(ctx, x, axis, indices[:, tap])
        weight = _along(ctx, weights[:, tap], value.shape.dims, (axis,), "f32")
        term = ctx.emit("multiply", [value, weight])
        total = term if total is None else ctx.emit("add", [total, term])
    assert total is not None
    return total


@register("ResizeBicubic", dtypes=NUMERIC, unused_inputs=(1,), check=_check_resize,
          note="NHWC, constant size; TF's quantized cubic weights (Keys' with half-pixel "
               "centers) and its float32 sums")
def _lower_resize_bicubic(ctx: LoweringContext, op: tf.Operation, operands: Operands
                          ) -> list[Instruction]:
    out = ctx.output_shape()
    image = ctx.convert(operands[0], "f32")
    align, half = _pixel_rules(op)
    # Rows first, then columns, as TF's kernel interpolates.
    for axis in (_ROWS, _COLUMNS):
        indices, weights = bicubic_taps(image.shape.dims[axis], out.dims[axis], align, half)
        image = _cubic_along(ctx, image, axis, indices, weights)
    return [image]


@register("ResizeBicubicGrad", dtypes=frozenset({"float32", "float64"}),
          check=_check_resize_grad, unused_inputs=(1,),
          note="NHWC; weights multiplied as TF's (row, then column), summed in another "
               "order; auto-clustering leaves one of a downsampling resize to TF's kernel "
               "(faster), jit_compile=True compiles it")
def _lower_resize_bicubic_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                               ) -> list[Instruction]:
    out = ctx.output_shape()
    # A float64 result takes the gradient in float64 first, as TF's kernel does.
    gradient = ctx.convert(operands[0], out.element_type)
    align, half = _pixel_rules(op)
    for axis in (_ROWS, _COLUMNS):
        indices, weights = bicubic_taps(out.dims[axis], gradient.shape.dims[axis], align,
                                        half)
        reads = [[(int(i), float(w)) for i, w in zip(row_indices, row_weights)]
                 for row_indices, row_weights in zip(indices, weights)]
        gradient = _gather_back(ctx, gradient, axis, reads, out.dims[axis], weighted=True)
    return [gradient]


# -- auto-clustering's shape rule ----------------------------------------------------------------
# Gradients left to TF's kernels in auto mode where those are faster (mark.py's `tf_kernels`
# gate; jit_compile=True compiles them all).
RESIZE_TF_KERNEL_OPS = frozenset({"ResizeBilinearGrad", "ResizeBicubicGrad"})


def tf_resize_faster(op: tf.Operation) -> bool:
    """Whether TF's kernel beats the compiled gradient of a downsampling resize: the
    original image is larger than the resized one along an axis. Each input row then
    takes the gradient of at most a few output rows, which TF's kernel adds into a
    zeroed image, while the compiled loop works out every element of the image (most of
    them zeros) through the row and column interpolations. Unknown image sizes: TF's (a
    batch known only at run time does not matter)."""
    gradient, original = op.inputs[0].shape, op.outputs[0].shape
    if gradient.rank != 4 or original.rank != 4:
        return True
    sizes = [gradient[_ROWS], gradient[_COLUMNS], original[_ROWS], original[_COLUMNS]]
    if any(size is None for size in sizes):
        return True
    return sizes[2] > sizes[0] or sizes[3] > sizes[1]
