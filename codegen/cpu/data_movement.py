"""CPU element generators of the data-movement and source HLO opcodes.

Each maps its result index to an operand index (XLA's index mapping): broadcast
drops the new dimensions, reshape and bitcast keep the linear index, transpose
permutes, slice scales and shifts, concatenate branches to the operand that holds
the element. Sources (constant, iota) compute the element from the index alone.

A branch per element keeps LLVM from vectorizing a loop, so kernels that loop over a
concatenate's dimension split that loop where its operands meet
(`last_dimension_pieces`: the kLoop nest, `emit_element_loops`, and column reductions,
`column_reduction.py`): within each piece the branch folds away.
"""

from __future__ import annotations

from llvmlite import ir

from tfxla_lite.codegen.cpu.elementwise import convert
from tfxla_lite.codegen.cpu.emitter import Index, KernelContext, constant, i64, register
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.opcodes import is_elementwise

# The most loops a kernel's innermost loop is split into at concatenate boundaries.
MAX_PIECES = 8


@register("parameter")
def emit_parameter(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    # Parameters are read from the kernel's buffers (KernelContext.buffers) or bound as
    # scalars; reaching this generator means the kernel builder missed one.
    raise AssertionError(f"parameter %{inst.name} has no buffer in this kernel")


@register("constant")
def emit_constant(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    element_type = inst.shape.element_type
    if inst.shape.num_elements == 1:  # an immediate, which LLVM folds and vectorizes
        return constant(element_type, inst.literal.reshape(-1)[0])
    pointer = ctx.pool.global_for(inst.literal, element_type)
    return ctx.load(pointer, inst.shape, index)


@register("iota")
def emit_iota(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    position = index.get_multi(ctx.builder)[int(inst.attributes["iota_dimension"])]
    return convert(ctx, position, "s64", inst.shape.element_type)


@register("broadcast")
def emit_broadcast(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand = inst.operand(0)
    if not operand.shape.dims:
        return ctx.value(operand, Index.scalar())
    multi = index.get_multi(ctx.builder)
    operand_multi = [multi[d] for d in inst.dimensions]
    return ctx.value(operand, Index(operand.shape.dims, operand_multi))


@register("reshape", "bitcast")
def emit_reshape(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand = inst.operand(0)
    if operand.shape.dims == inst.shape.dims:
        return ctx.value(operand, index)
    return ctx.value(operand, Index(operand.shape.dims, linear=index.get_linear(ctx.builder)))


@register("transpose")
def emit_transpose(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand = inst.operand(0)
    multi = index.get_multi(ctx.builder)
    operand_multi: list[ir.Value] = [i64(0)] * len(multi)
    # Result dimension i is operand dimension dimensions[i].
    for i, d in enumerate(inst.dimensions):
        operand_multi[d] = multi[i]
    return ctx.value(operand, Index(operand.shape.dims, operand_multi))


@register("slice")
def emit_slice(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    operand = inst.operand(0)
    b = ctx.builder
    multi = index.get_multi(b)
    operand_multi = []
    for value, (start, _limit, stride) in zip(multi, inst.attributes["slice"]):
        if stride != 1:
            value = b.mul(value, i64(stride), flags=["nuw", "nsw"])
        if start != 0:
            value = b.add(value, i64(start), flags=["nuw", "nsw"])
        operand_multi.append(value)
    return ctx.value(operand, Index(operand.shape.dims, operand_multi))


@register("concatenate")
def emit_concatenate(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    (axis,) = inst.dimensions
    multi = index.get_multi(ctx.builder)
    # Empty operands hold no element; the last non-empty one needs no bounds check.
    pieces = []
    offset = 0
    for operand in inst.operands:
        if operand.shape.dims[axis] > 0:
            pieces.append((operand, offset))
        offset += operand.shape.dims[axis]
    return _concatenate_from(ctx, pieces, axis, multi)


def _concatenate_from(ctx: KernelContext, pieces: list[tuple[Instruction, int]], axis: int,
                      multi: list[ir.Value]) -> ir.Value:
    b = ctx.builder
    operand, offset = pieces[0]

    def element() -> ir.Value:
        shifted = list(multi)
        if offset:
            shifted[axis] = b.sub(multi[axis], i64(offset), flags=["nuw", "nsw"])
        return ctx.value(operand, Index(operand.shape.dims, shifted))

    if len(pieces) == 1:
        return element()
    end = offset + operand.shape.dims[axis]
    inside = b.icmp_signed("<", multi[axis], i64(end))
    return ctx.branch_value(inside, element,
                            lambda: _concatenate_from(ctx, pieces[1:], axis, multi),
                            name="concatenate")


def last_dimension_pieces(values: list[Instruction]) -> list[tuple[int, int]]:
    """The ranges [begin, end) of the last dimension within which every concatenate
    along it that `values` read at their own index (through elementwise ops of their
    shape) takes one operand: a loop over that dimension split at these bounds runs a
    concatenate without its branch (LLVM folds the compare of the loop's counter with a
    constant bound), so the loop vectorizes. One range, the whole dimension, when no
    such concatenate exists or it would take more than MAX_PIECES loops."""
    dims = values[0].shape.dims if values else ()
    if not dims:
        return [(0, 0)]
    last = len(dims) - 1
    bounds: set[int] = set()
    stack, seen = list(values), set()
    while stack:
        inst = stack.pop()
        if id(inst) in seen or inst.shape.is_tuple or inst.shape.dims != dims:
            continue
        seen.add(id(inst))
        if inst.opcode == "concatenate" and tuple(inst.dimensions) == (last,):
            offset = 0
            for operand in inst.operands:
                offset += operand.shape.dims[last]
                bounds.add(offset)
            stack.extend(inst.operands)
        elif is_elementwise(inst.opcode):
            stack.extend(inst.operands)
    cuts = sorted(b for b in bounds if 0 < b < dims[last])
    if not cuts or len(cuts) >= MAX_PIECES:
        return [(0, dims[last])]
    return list(zip([0, *cuts], [*cuts, dims[last]], strict=True))


def emit_element_loops(ctx: KernelContext, root: Instruction, output: ir.Value,
                       restrict: tuple[int, ir.Value, ir.Value] | None) -> None:
    """Store `root` at every index of its shape into `output`: a loop nest, the last
    dimension innermost (`restrict`: one dimension over [begin, end) only), that
    innermost loop split at `last_dimension_pieces` unless `restrict` cuts it."""
    dims = root.shape.dims
    b = ctx.builder
    pieces = last_dimension_pieces([root])
    if len(pieces) == 1 or (restrict is not None and restrict[0] == len(dims) - 1):
        with ctx.loop_nest(dims, name="i", restrict=restrict) as multi:
            index = Index(dims, multi, Index(dims, multi).get_linear(b))
            ctx.store(ctx.value(root, index), output, root.shape, index)
        return
    with ctx.loop_nest(dims[:-1], name="i", restrict=restrict) as outer:
        for begin, end in pieces:
            with ctx.loop(end, name="piece", start=begin) as column:
                multi = [*outer, column]
                index = Index(dims, multi, Index(dims, multi).get_linear(b))
                ctx.store(ctx.value(root, index), output, root.shape, index)
