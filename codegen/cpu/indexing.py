"""CPU element generators of the HLO opcodes that compute operand indices at run time
or per window: reverse, pad, dynamic-slice, dynamic-update-slice, gather, scatter,
reduce-window.

Like `data_movement.py`, each maps its result index to operand indices, as XLA's
elemental IR emitter, start indices clamped as XLA clamps them. A scatter or
dynamic-update-slice at a kernel's root is a serial kernel of its own (copy unless in
place, then the updates in order). Semantics match `tfxla_lite.hlo.evaluator`.
"""

from __future__ import annotations

import itertools
import math

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import (
    I64,
    PTR,
    Index,
    KernelContext,
    i64,
    is_signed,
    register,
    register_kernel,
    value_type,
)
from tfxla_lite.hlo.attributes import ScatterDimensions
from tfxla_lite.hlo.ir import Instruction


def _to_i64(ctx: KernelContext, value: ir.Value, element_type: str) -> ir.Value:
    """An index value of an integer element type, widened to i64 by its signedness."""
    width = value.type.width
    if width == 64:
        return value
    if is_signed(element_type):
        return ctx.builder.sext(value, I64)
    return ctx.builder.zext(value, I64)


def _clamp(ctx: KernelContext, value: ir.Value, high: int) -> ir.Value:
    """min(max(value, 0), high) in signed i64; `high` >= 0."""
    b = ctx.builder
    value = b.select(b.icmp_signed("<", value, i64(0)), i64(0), value)
    return b.select(b.icmp_signed(">", value, i64(high)), i64(high), value)


@register("reverse")
def emit_reverse(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand = inst.operand(0)
    b = ctx.builder
    multi = list(index.get_multi(b))
    for d in inst.dimensions:
        multi[d] = b.sub(i64(inst.shape.dims[d] - 1), multi[d], flags=["nsw"])
    return ctx.value(operand, Index(operand.shape.dims, multi))


@register("pad")
def emit_pad(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand, padding_value = inst.operands
    b = ctx.builder
    multi = index.get_multi(b)
    inside: ir.Value = ir.Constant(ir.IntType(1), 1)
    operand_multi = []
    for value, size, d in zip(multi, operand.shape.dims, inst.attributes["padding"].dimensions):
        # Position in the interior-spread operand; it is an operand element when it
        # is in range and falls on a multiple of (interior + 1).
        position = b.sub(value, i64(d.low), flags=["nsw"]) if d.low else value
        step = d.interior + 1
        element = position
        checks = [b.icmp_signed(">=", position, i64(0)),
                  b.icmp_signed("<", position, i64((size - 1) * step + 1))]
        if step != 1:
            checks.append(b.icmp_signed("==", b.srem(position, i64(step)), i64(0)))
            element = b.sdiv(position, i64(step))
        for check in checks:
            inside = b.and_(inside, check)
        operand_multi.append(element)
    if operand.shape.num_elements == 0:
        return ctx.value(padding_value, Index.scalar())
    return ctx.branch_value(
        inside, lambda: ctx.value(operand, Index(operand.shape.dims, operand_multi)),
        lambda: ctx.value(padding_value, Index.scalar()), name="pad")


def _start_indices(ctx: KernelContext, starts: tuple[Instruction, ...],
                   dims: tuple[int, ...], sizes: tuple[int, ...]) -> list[ir.Value]:
    """Dynamic start indices, clamped to [0, dim - size] as XLA does."""
    values = []
    for start, dim, size in zip(starts, dims, sizes):
        raw = _to_i64(ctx, ctx.value(start, Index.scalar()), start.shape.element_type)
        values.append(_clamp(ctx, raw, dim - size))
    return values


@register("dynamic-slice")
def emit_dynamic_slice(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand, *starts = inst.operands
    b = ctx.builder
    begin = _start_indices(ctx, tuple(starts), operand.shape.dims, inst.shape.dims)
    multi = [b.add(v, s, flags=["nsw"]) for v, s in zip(index.get_multi(b), begin)]
    return ctx.value(operand, Index(operand.shape.dims, multi))


@register("dynamic-update-slice")
def emit_dynamic_update_slice(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand, update, *starts = inst.operands
    b = ctx.builder
    if update.shape.num_elements == 0:
        return ctx.value(operand, index)
    begin = _start_indices(ctx, tuple(starts), operand.shape.dims, update.shape.dims)
    multi = index.get_multi(b)
    inside: ir.Value = ir.Constant(ir.IntType(1), 1)
    update_multi = []
    for value, start, size in zip(multi, begin, update.shape.dims):
        offset = b.sub(value, start, flags=["nsw"])
        inside = b.and_(inside, b.icmp_signed(">=", offset, i64(0)))
        inside = b.and_(inside, b.icmp_signed("<", offset, i64(size)))
        update_multi.append(offset)
    return ctx.branch_value(inside, lambda: ctx.value(update, Index(update.shape.dims,
                                                                    update_multi)),
                            lambda: ctx.value(operand, index), name="update")


@register_kernel("dynamic-update-slice")
def emit_dynamic_update_slice_kernel(ctx: KernelContext, inst: Instruction,
                                     output: ir.Value) -> None:
    """A dynamic-update-slice as a kernel of its own: the operand copied to the output
    (skipped when the output is the operand's own buffer: a loop body's update of its
    loop-carried buffer, `control_flow.py`), then the update's elements stored at the
    clamped start. O(update) in place, where the element generator writes every element."""
    operand, update, *starts = inst.operands
    b = ctx.builder
    shape = inst.shape
    # The output may be the operand's buffer: no `noalias` (the in-place path reads
    # nothing through the operand's pointer, the copy path runs only when they differ).
    output.attributes.discard("noalias")
    source = ctx.buffers[id(operand)]
    if shape.byte_size:
        differ = b.icmp_unsigned("!=", b.ptrtoint(output, I64), b.ptrtoint(source, I64))
        with b.if_then(differ):
            memcpy = b.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
            b.call(memcpy, [output, source, i64(shape.byte_size), ir.IntType(1)(0)])
    if not update.shape.num_elements:
        return
    begin = _start_indices(ctx, tuple(starts), shape.dims, update.shape.dims)
    with ctx.loop_nest(update.shape.dims, name="update") as multi, ctx.scope():
        target = Index(shape.dims, [b.add(m, s, flags=["nsw"]) for m, s in zip(multi, begin)])
        value = ctx.value(update, Index(update.shape.dims, list(multi)))
        ctx.store(value, output, shape, target)


@register("gather")
def emit_gather(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand, indices = inst.operands
    attrs = inst.attributes
    b = ctx.builder
    offset_dims = tuple(attrs["offset_dims"])
    collapsed = set(attrs["collapsed_slice_dims"])
    vector_dim = int(attrs["index_vector_dim"])
    sizes = tuple(attrs["slice_sizes"])
    multi = index.get_multi(b)
    batch = [v for d, v in enumerate(multi) if d not in offset_dims]
    offsets = iter(v for d, v in enumerate(multi) if d in offset_dims)
    operand_multi: list[ir.Value] = [next(offsets) if d not in collapsed else i64(0)
                                     for d in range(operand.shape.rank)]
    for k, d in enumerate(attrs["start_index_map"]):
        position = list(batch)
        if vector_dim < indices.shape.rank:
            position.insert(vector_dim, i64(k))
        raw = ctx.value(indices, Index(indices.shape.dims, position))
        start = _clamp(ctx, _to_i64(ctx, raw, indices.shape.element_type),
                       operand.shape.dims[d] - sizes[d])
        operand_multi[d] = b.add(operand_multi[d], start, flags=["nsw"])
    return ctx.value(operand, Index(operand.shape.dims, operand_multi))


@register("scatter")
def emit_scatter(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    """The operand's element at `index`, combined with every update that lands there, in
    row-major order of the scatter indices: each output element reads all of them, so
    output elements are independent (a parallel loop may split them) and repeated indices
    combine in a fixed order."""
    operand, indices, updates = inst.operands
    b = ctx.builder
    rank = operand.shape.rank
    numbers = ScatterDimensions.of(inst.attributes, rank, updates.shape.dims)
    out_multi = index.get_multi(b)
    accumulator = ctx.alloca(value_type(inst.shape.element_type), name="scatter.accumulator")
    b.store(ctx.value(operand, index), accumulator)
    with ctx.loop_nest(tuple(updates.shape.dims[d] for d in numbers.scatter_dims),
                       name="scatter") as scatter_multi:
        starts: list[ir.Value] = [i64(0)] * rank
        for k, d in enumerate(numbers.to_operand):
            position = list(scatter_multi)
            if numbers.index_vector_dim < indices.shape.rank:
                position.insert(numbers.index_vector_dim, i64(k))
            raw = ctx.value(indices, Index(indices.shape.dims, position))
            starts[d] = _to_i64(ctx, raw, indices.shape.element_type)
        # The whole window must lie inside the operand (else XLA skips the update), and
        # this output element must fall inside it.
        inside: ir.Value = ir.Constant(ir.IntType(1), 1)
        offsets = []
        for d in range(rank):
            start, size = starts[d], numbers.window_sizes[d]
            offset = b.sub(out_multi[d], start)
            for check in (b.icmp_signed(">=", start, i64(0)),
                          b.icmp_signed("<=", start, i64(operand.shape.dims[d] - size)),
                          b.icmp_signed(">=", offset, i64(0)),
                          b.icmp_signed("<", offset, i64(size))):
                inside = b.and_(inside, check)
            offsets.append(offset)
        with b.if_then(inside), ctx.scope():
            update_multi: list[ir.Value] = [i64(0)] * updates.shape.rank
            for j, d in enumerate(numbers.scatter_dims):
                update_multi[d] = scatter_multi[j]
            for d, u in zip(numbers.window_operand_dims, numbers.window_dims):
                update_multi[u] = offsets[d]
            x = ctx.value(updates, Index(updates.shape.dims, update_multi))
            combined = ctx.apply_computation(inst.called_computations[0],
                                             [b.load(accumulator), x])
            b.store(combined, accumulator)
    return b.load(accumulator)


@register_kernel("scatter")
def emit_scatter_kernel(ctx: KernelContext, inst: Instruction, output: ir.Value) -> None:
    """A scatter as a kernel of its own: copy the operand to the output, then combine each
    update into its element, serially in row-major order of the updates (repeated
    indices combine in that order). O(output + updates), where the element generator
    above reads every update once per output element."""
    operand, indices, updates = inst.operands
    b = ctx.builder
    shape = inst.shape
    rank = shape.rank
    numbers = ScatterDimensions.of(inst.attributes, rank, updates.shape.dims)
    with ctx.loop(shape.num_elements, name="copy") as linear:
        index = Index(shape.dims, linear=linear)
        ctx.store(ctx.value(operand, index), output, shape, index)
    with ctx.loop_nest(updates.shape.dims, name="update") as update_multi:
        inside: ir.Value = ir.Constant(ir.IntType(1), 1)
        position: list[ir.Value] = [i64(0)] * rank
        for k, d in enumerate(numbers.to_operand):
            at = [update_multi[j] for j in numbers.scatter_dims]
            if numbers.index_vector_dim < indices.shape.rank:
                at.insert(numbers.index_vector_dim, i64(k))
            raw = ctx.value(indices, Index(indices.shape.dims, at))
            start = _to_i64(ctx, raw, indices.shape.element_type)
            inside = b.and_(inside, b.icmp_signed(">=", start, i64(0)))
            inside = b.and_(inside, b.icmp_signed(
                "<=", start, i64(shape.dims[d] - numbers.window_sizes[d])))
            position[d] = start
        for d, u in zip(numbers.window_operand_dims, numbers.window_dims):
            position[d] = b.add(position[d], update_multi[u], flags=["nsw"])
        with b.if_then(inside), ctx.scope():
            target = Index(shape.dims, position)
            x = ctx.value(updates, Index(updates.shape.dims, list(update_multi)))
            combined = ctx.apply_computation(inst.called_computations[0],
                                             [ctx.load(output, shape, target), x])
            ctx.store(combined, output, shape, target)


# Windows of at most this many elements are unrolled into straight-line code.
_UNROLLED_WINDOW = 64


@register("reduce-window")
def emit_reduce_window(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    if len(inst.operands) != 2 or inst.shape.is_tuple:
        raise NotImplementedError(
            f"CPU backend: variadic reduce-window (%{inst.name}, {len(inst.operands) // 2} "
            "inputs)")
    window = inst.attributes["window"].dimensions
    if math.prod(d.size for d in window) <= _UNROLLED_WINDOW:
        return _unrolled_reduce_window(ctx, inst, index)
    return _looped_reduce_window(ctx, inst, index)


def _unrolled_reduce_window(ctx: KernelContext, inst: Instruction, index: Index
                            ) -> ir.Value:
    """A small window as straight-line code without branches, so that the loop over
    output elements vectorizes (a pooling window over NHWC runs along the channels):
    each window element is read at a clamped, always valid position and folded in by a
    select where it is a real element. Which bounds a window element can cross is known
    per dimension at compile time; only those are checked."""
    operand, init = inst.operands
    b = ctx.builder
    window = inst.attributes["window"].dimensions
    out_multi = index.get_multi(b)
    out_dims = inst.shape.dims
    accumulator = ctx.value(init, Index.scalar())
    for offsets in itertools.product(*(range(d.size) for d in window)):
        inside: ir.Value | None = None
        operand_multi = []
        for out, offset, d, size, count in zip(out_multi, offsets, window,
                                               operand.shape.dims, out_dims):
            shift = offset * d.window_dilation - d.padding_low
            position = b.mul(out, i64(d.stride)) if d.stride != 1 else out
            if shift:
                position = b.add(position, i64(shift))
            checks = []
            if shift < 0:  # the first windows start in the low padding
                checks.append(b.icmp_signed(">=", position, i64(0)))
            element = position
            if d.base_dilation != 1:
                checks.append(b.icmp_signed("==", b.srem(position, i64(d.base_dilation)),
                                            i64(0)))
                element = b.sdiv(position, i64(d.base_dilation))
            last = (count - 1) * d.stride + shift
            if count and (last if d.base_dilation == 1 else last // d.base_dilation) >= size:
                checks.append(b.icmp_signed("<", element, i64(size)))
            if checks:  # read somewhere valid; the select below drops the value
                real = checks[0]
                for check in checks[1:]:
                    real = b.and_(real, check)
                inside = real if inside is None else b.and_(inside, real)
                element = b.select(real, element, i64(0))
            operand_multi.append(element)
        x = ctx.value(operand, Index(operand.shape.dims, operand_multi))
        combined = ctx.apply_computation(inst.called_computations[0], [accumulator, x])
        accumulator = combined if inside is None else b.select(inside, combined, accumulator)
    return accumulator


def _looped_reduce_window(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand, init = inst.operands
    b = ctx.builder
    window = inst.attributes["window"].dimensions
    out_multi = index.get_multi(b)
    accumulator = ctx.alloca(value_type(inst.shape.element_type), name="window.accumulator")
    b.store(ctx.value(init, Index.scalar()), accumulator)
    with ctx.loop_nest(tuple(d.size for d in window), name="window") as window_multi:
        inside: ir.Value = ir.Constant(ir.IntType(1), 1)
        operand_multi = []
        for out, offset, d, size in zip(out_multi, window_multi, window, operand.shape.dims):
            position = b.add(b.mul(out, i64(d.stride)), b.mul(offset, i64(d.window_dilation)))
            position = b.sub(position, i64(d.padding_low))
            element = position
            inside = b.and_(inside, b.icmp_signed(">=", position, i64(0)))
            if d.base_dilation != 1:
                inside = b.and_(inside, b.icmp_signed(
                    "==", b.srem(position, i64(d.base_dilation)), i64(0)))
                element = b.sdiv(position, i64(d.base_dilation))
            inside = b.and_(inside, b.icmp_signed("<", element, i64(size)))
            operand_multi.append(element)
        with b.if_then(inside), ctx.scope():
            x = ctx.value(operand, Index(operand.shape.dims, operand_multi))
            combined = ctx.apply_computation(inst.called_computations[0],
                                             [b.load(accumulator), x])
            b.store(combined, accumulator)
    return b.load(accumulator)
