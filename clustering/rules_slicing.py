"""Lowering rules of TF's slicing and tiling ops: StridedSlice (and its gradient), Pad,
Tile, Split, SplitV, Unpack, IdentityN, Roll (slices and a concatenate) and MatrixBandPart
(iotas, compares and a select).

Registered into `registry.OP_RULES` on import. Pads are concatenations with broadcast
constant blocks, strided gradients interleave zero blocks before padding, and slices
with negative strides reverse their axes, then slice forward (their gradients build
the same in reversed coordinates, then reverse). Every begin, end, stride, padding,
multiple and split size is a compile-time constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.clustering.registry import (
    ALL,
    LoweringContext,
    LoweringError,
    constant_value,
    known_dims,
    register,
)
from tfxla_lite.hlo import Instruction

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]
SliceSpec = list[tuple[int, int, int]]


@register("IdentityN", dtypes=ALL)
def _lower_identity_n(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    return list(operands)


# -- padding ------------------------------------------------------------------------------------
def pad_axis(ctx: LoweringContext, x: Instruction, axis: int, low: int, high: int,
             value: Instruction) -> Instruction:
    """`x` with `low` and `high` elements of the scalar `value` before and after on `axis`."""

    def block(count: int) -> Instruction:
        return ctx.emit("broadcast", [value], shape=x.shape.with_dims(
            _replace(x.shape.dims, axis, count)), dimensions=())

    pieces = ([block(low)] if low else []) + [x] + ([block(high)] if high else [])
    if len(pieces) == 1:
        return x
    return ctx.emit("concatenate", pieces, dimensions=(axis,))


def _check_pad(op: tf.Operation) -> str | None:
    paddings = constant_value(op.inputs[1])
    if paddings is not None and (paddings < 0).any():
        return "negative paddings"
    return None


@register("Pad", "PadV2", dtypes=ALL, static_inputs=(1,), check=_check_pad,
          note="constant paddings")
def _lower_pad(ctx: LoweringContext, op: tf.Operation, operands: Operands
               ) -> list[Instruction]:
    x = operands[0]
    paddings = ctx.static_input(1).reshape(-1, 2)
    etype = x.shape.element_type
    value = operands[2] if op.type == "PadV2" else ctx.constant(0, etype)
    for axis, (low, high) in enumerate(paddings):
        x = pad_axis(ctx, x, axis, int(low), int(high), value)
    return [x]


def _check_mirror_pad(op: tf.Operation) -> str | None:
    paddings, dims = constant_value(op.inputs[1]), known_dims(op.inputs[0])
    if paddings is None or dims is None:
        return None  # marking reports non-constant paddings and unknown shapes itself
    mode = op.get_attr("mode")
    reflect = (mode.decode() if isinstance(mode, bytes) else mode) == "REFLECT"
    for (low, high), size in zip(paddings.reshape(-1, 2), dims):
        if min(low, high) < 0 or max(low, high) > size - (1 if reflect else 0):
            return f"paddings {low}, {high} out of range for size {size}"
    return None


@register("MirrorPad", dtypes=ALL, static_inputs=(1,), check=_check_mirror_pad,
          note="constant paddings; REFLECT and SYMMETRIC")
def _lower_mirror_pad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    # Per axis: the mirrored edge slices, reversed, on both sides (REFLECT leaves out
    # the edge element itself, SYMMETRIC repeats it).
    x = operands[0]
    mode = op.get_attr("mode")
    skip = 1 if (mode.decode() if isinstance(mode, bytes) else mode) == "REFLECT" else 0
    for axis, (low, high) in enumerate(ctx.static_input(1).reshape(-1, 2)):
        low, high, size = int(low), int(high), x.shape.dims[axis]
        pieces = []
        for begin, count in ((skip, low), (None, None), (size - skip - high, high)):
            if begin is None:
                pieces.append(x)
            elif count:
                spec = [(0, d, 1) for d in x.shape.dims]
                spec[axis] = (begin, begin + count, 1)
                edge = ctx.emit("slice", [x], slice=tuple(spec))
                pieces.append(ctx.emit("reverse", [edge], dimensions=(axis,)))
        if len(pieces) > 1:
            x = ctx.emit("concatenate", pieces, dimensions=(axis,))
    return [x]


# -- tiles and splits ----------------------------------------------------------------------------
@register("Tile", dtypes=ALL, static_inputs=(1,))
def _lower_tile(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    # [d0, d1] tiled [m0, m1] = broadcast to [m0, d0, m1, d1], then merge pairs.
    x = operands[0]
    multiples = [int(m) for m in ctx.static_input(1).reshape(-1)]
    interleaved = [size for pair in zip(multiples, x.shape.dims) for size in pair]
    spread = ctx.emit("broadcast", [x], shape=x.shape.with_dims(interleaved),
                      dimensions=tuple(range(1, 2 * x.shape.rank, 2)))
    return [ctx.reshape(spread, ctx.output_shape().dims)]


def _split(ctx: LoweringContext, x: Instruction, axis: int, sizes: Sequence[int]
           ) -> list[Instruction]:
    pieces, start = [], 0
    for size in sizes:
        spec = [(0, d, 1) for d in x.shape.dims]
        spec[axis] = (start, start + size, 1)
        pieces.append(ctx.emit("slice", [x], slice=tuple(spec)))
        start += size
    return pieces


@register("Split", dtypes=ALL, static_inputs=(0,))
def _lower_split(ctx: LoweringContext, op: tf.Operation, operands: Operands
                 ) -> list[Instruction]:
    x = operands[1]
    axis = int(ctx.static_input(0)) % x.shape.rank
    count = int(op.get_attr("num_split"))
    return _split(ctx, x, axis, [x.shape.dims[axis] // count] * count)


@register("SplitV", dtypes=ALL, static_inputs=(1, 2))
def _lower_split_v(ctx: LoweringContext, op: tf.Operation, operands: Operands
                   ) -> list[Instruction]:
    x = operands[0]
    axis = int(ctx.static_input(2)) % x.shape.rank
    sizes = [ctx.output_shape(i).dims[axis] for i in range(len(op.outputs))]
    return _split(ctx, x, axis, sizes)


@register("Unpack", dtypes=ALL)
def _lower_unpack(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    x = operands[0]
    axis = int(op.get_attr("axis")) % x.shape.rank
    pieces = _split(ctx, x, axis, [1] * x.shape.dims[axis])
    return [ctx.reshape(p, ctx.output_shape(i).dims) for i, p in enumerate(pieces)]


# -- strided slices ------------------------------------------------------------------------------
def strided_slice_spec(dims: Sequence[int], begin: np.ndarray, end: np.ndarray,
                       strides: np.ndarray, op: tf.Operation) -> SliceSpec:
    """Per input dim (start, limit, stride) of a StridedSlice, after TF's masks: ellipsis
    and new axes expand the sparse spec to the input's dims, begin/end masks take whole
    ranges, shrink takes one element. A negative stride gives the bounds of the same
    elements in the reversed axis (see `_forward`). Raises LoweringError otherwise."""
    masks = {name: int(op.get_attr(name)) for name in (
        "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}

    def bit(name: str, i: int) -> bool:
        return bool(masks[name] >> i & 1)

    entries = len(begin)
    if bin(masks["ellipsis_mask"]).count("1") > 1:
        raise LoweringError("more than one ellipsis")
    ellipsis = [bit("ellipsis_mask", i) for i in range(entries)]
    new_axis = [bit("new_axis_mask", i) and not ellipsis[i] for i in range(entries)]
    if not any(ellipsis):  # TF reads a missing ellipsis as one at the end
        ellipsis.append(True)
        new_axis.append(False)
    real = sum(1 for i in range(len(ellipsis)) if not ellipsis[i] and not new_axis[i])
    spec: SliceSpec = []
    for i in range(len(ellipsis)):
        if ellipsis[i]:
            spec.extend((0, d, 1) for d in dims[len(spec):len(spec) + len(dims) - real])
            continue
        if new_axis[i]:
            continue
        if len(spec) >= len(dims):
            raise LoweringError("slice spec longer than the input's rank")
        size = dims[len(spec)]
        stride = int(strides[i])
        if stride == 0:
            raise LoweringError("zero stride")
        if bit("shrink_axis_mask", i):
            index = int(begin[i]) + (size if begin[i] < 0 else 0)
            if not 0 <= index < size:
                raise LoweringError(f"index {begin[i]} out of bounds for size {size}")
            spec.append((index, index + 1, 1))
            continue
        if stride < 0:
            # TF's canonical bounds for a backward slice: begin in [-1, size - 1] (masked:
            # size - 1), end likewise (masked: -1, before the first element); then the
            # same slice in the axis reversed, position p at size - 1 - p.
            first = size - 1 if bit("begin_mask", i) else _backward_bound(int(begin[i]), size)
            last = -1 if bit("end_mask", i) else _backward_bound(int(end[i]), size)
            start, limit = size - 1 - first, size - 1 - last
            spec.append((start, max(start, limit), stride))
            continue
        start = 0 if bit("begin_mask", i) else int(begin[i])
        limit = size if bit("end_mask", i) else int(end[i])
        start = min(max(start + size if start < 0 else start, 0), size)
        limit = min(max(limit + size if limit < 0 else limit, 0), size)
        spec.append((start, max(start, limit), stride))
    if len(spec) != len(dims):
        raise LoweringError(f"slice spec covers {len(spec)} of {len(dims)} dims")
    return spec


def _backward_bound(index: int, size: int) -> int:
    index = index + size if index < 0 else index
    return min(max(index, -1), size - 1)


def _forward(spec: SliceSpec) -> tuple[SliceSpec, tuple[int, ...]]:
    """The spec with every stride positive, and the axes to reverse first (those whose
    stride was negative: their bounds are already in reversed coordinates)."""
    reversed_axes = tuple(d for d, (_, _, stride) in enumerate(spec) if stride < 0)
    return [(start, limit, abs(stride)) for start, limit, stride in spec], reversed_axes


def _spec_of(op: tf.Operation, dims: Sequence[int], first: int) -> SliceSpec:
    values = [constant_value(op.inputs[first + k]) for k in range(3)]
    if any(v is None for v in values):
        raise LoweringError("begin, end and strides must be constants")
    begin, end, strides = (np.asarray(v).reshape(-1) for v in values)
    return strided_slice_spec(dims, begin, end, strides, op)


def _check_strided_slice(op: tf.Operation) -> str | None:
    try:
        dims = known_dims(op.inputs[0])
        assert dims is not None
        _spec_of(op, dims, 1)
    except LoweringError as error:
        return str(error)
    return None


def _sliced_dims(spec: SliceSpec) -> list[int]:
    return [(limit - start + stride - 1) // stride for start, limit, stride in spec]


@register("StridedSlice", dtypes=ALL, static_inputs=(1, 2, 3), check=_check_strided_slice,
          note="constant begin/end/strides, all masks; negative strides reverse first")
def _lower_strided_slice(ctx: LoweringContext, op: tf.Operation, operands: Operands
                         ) -> list[Instruction]:
    x = operands[0]
    spec, reversed_axes = _forward(_spec_of(op, x.shape.dims, 1))
    if reversed_axes:
        x = ctx.emit("reverse", [x], dimensions=reversed_axes)
    if any(s != (0, d, 1) for s, d in zip(spec, x.shape.dims)):
        x = ctx.emit("slice", [x], slice=tuple(spec))
    # Shrunk axes go and new axes come: TF's static result shape says where.
    return [ctx.reshape(x, ctx.output_shape().dims)]


def _check_strided_slice_grad(op: tf.Operation) -> str | None:
    shape = constant_value(op.inputs[0])
    if shape is None:  # shape-determined (dynamic marking): checked for each shape
        return None
    try:
        _spec_of(op, [int(d) for d in shape.reshape(-1)], 1)
    except LoweringError as error:
        return str(error)
    return None


@register("StridedSliceGrad", dtypes=ALL, static_inputs=(0, 1, 2, 3),
          check=_check_strided_slice_grad, note="as StridedSlice")
def _lower_strided_slice_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                              ) -> list[Instruction]:
    # dy spread back into zeros: each axis gets stride-1 zero gaps between its elements,
    # then zero blocks before and after.
    dims = [int(d) for d in ctx.static_input(0).reshape(-1)]
    spec, reversed_axes = _forward(_spec_of(op, dims, 1))
    dy = operands[4]
    x = ctx.reshape(dy, _sliced_dims(spec))
    zero = ctx.constant(0, x.shape.element_type)
    for axis, ((start, _, stride), size) in enumerate(zip(spec, dims)):
        count = x.shape.dims[axis]
        if count == 0:
            x = ctx.full(0, x.shape.with_dims(_replace(x.shape.dims, axis, size)))
            continue
        if stride > 1:
            x = _interleave_zeros(ctx, x, axis, stride, zero)
        span = x.shape.dims[axis]
        x = pad_axis(ctx, x, axis, start, size - start - span, zero)
    if reversed_axes:  # built in the reversed coordinates of backward slices
        x = ctx.emit("reverse", [x], dimensions=reversed_axes)
    return [x]


def _replace(dims: Sequence[int], axis: int, size: int) -> tuple[int, ...]:
    return tuple(size if i == axis else d for i, d in enumerate(dims))


def _interleave_zeros(ctx: LoweringContext, x: Instruction, axis: int, stride: int,
                      zero: Instruction) -> Instruction:
    """[a, b, c] → [a, 0, 0, b, 0, 0, c] for stride 3: no gap after the last element."""
    dims = x.shape.dims
    count = dims[axis]
    column = ctx.reshape(x, dims[:axis + 1] + (1,) + dims[axis + 1:])
    gaps = ctx.emit("broadcast", [zero],
                    shape=x.shape.with_dims(dims[:axis + 1] + (stride - 1,) + dims[axis + 1:]),
                    dimensions=())
    rows = ctx.emit("concatenate", [column, gaps], dimensions=(axis + 1,))
    flat = ctx.reshape(rows, _replace(dims, axis, count * stride))
    spec = [(0, d, 1) for d in flat.shape.dims]
    spec[axis] = (0, (count - 1) * stride + 1, 1)
    return ctx.emit("slice", [flat], slice=tuple(spec))


# -- roll ---------------------------------------------------------------------------------------
def _check_roll(op: tf.Operation) -> str | None:
    rank = op.inputs[0].shape.rank
    axes = constant_value(op.inputs[2])
    if rank is None or axes is None:
        return None  # marking reports the missing constant or shape itself
    if any(not -rank <= int(a) < rank for a in np.ravel(axes)):
        return f"axis {np.ravel(axes).tolist()} out of range for rank {rank}"
    return None


@register("Roll", dtypes=ALL, static_inputs=(1, 2), check=_check_roll,
          note="constant shift and axis")
def _lower_roll(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    # output[i] = input[(i - shift) mod n] on each axis: the last `shift` elements moved to
    # the front, a slice pair and a concatenate (XLA's roll with a constant shift). Shifts
    # of one axis named twice add up, as in TF's kernel.
    x = operands[0]
    dims = x.shape.dims
    shifts = np.ravel(ctx.static_input(1)).astype(np.int64)
    axes = np.ravel(ctx.static_input(2)).astype(np.int64)
    if shifts.size != axes.size:
        shifts, axes = np.broadcast_arrays(shifts, axes)
    total: dict[int, int] = {}
    for shift, axis in zip(shifts.tolist(), axes.tolist()):
        axis %= len(dims)
        total[axis] = total.get(axis, 0) + shift
    for axis, shift in sorted(total.items()):
        n = dims[axis]
        if n == 0 or shift % n == 0:
            continue
        split = n - shift % n
        head = _slice_axis(ctx, x, axis, split, n)
        tail = _slice_axis(ctx, x, axis, 0, split)
        x = ctx.emit("concatenate", [head, tail], dimensions=(axis,))
    return [x]


def _slice_axis(ctx: LoweringContext, x: Instruction, axis: int, start: int, limit: int
                ) -> Instruction:
    spec = [(0, d, 1) for d in x.shape.dims]
    spec[axis] = (start, limit, 1)
    return ctx.emit("slice", [x], slice=tuple(spec))


# -- band part ----------------------------------------------------------------------------------
@register("MatrixBandPart", dtypes=ALL,
          note="runtime num_lower and num_upper; a bound past the matrix keeps the whole band "
               "(TF raises)")
def _lower_matrix_band_part(ctx: LoweringContext, op: tf.Operation, operands: Operands
                            ) -> list[Instruction]:
    # As XLA's: iotas of row m and column n over the last two dims; an element stays where
    # (num_lower < 0 or m - n <= num_lower) and (num_upper < 0 or n - m <= num_upper).
    x, num_lower, num_upper = operands
    dims = x.shape.dims
    if len(dims) < 2:
        raise LoweringError(f"MatrixBandPart of rank {len(dims)} (needs at least 2)")
    index_shape = x.shape.with_element_type(num_lower.shape.element_type)
    rows = ctx.emit("iota", [], shape=index_shape, iota_dimension=len(dims) - 2)
    columns = ctx.emit("iota", [], shape=index_shape, iota_dimension=len(dims) - 1)

    def within(bound: Instruction, distance: Instruction) -> Instruction:
        bound = ctx.broadcast_to(bound, dims)
        unbounded = ctx.emit("compare", [bound, ctx.full(0, index_shape)], direction="LT")
        near = ctx.emit("compare", [distance, bound], direction="LE")
        return ctx.emit("or", [unbounded, near])

    below = within(num_lower, ctx.emit("subtract", [rows, columns]))
    above = within(num_upper, ctx.emit("subtract", [columns, rows]))
    keep = ctx.emit("and", [below, above])
    return [ctx.emit("select", [keep, x, ctx.full(0, x.shape)])]
