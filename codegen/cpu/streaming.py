"""Streaming (non-temporal) stores for the outputs of kernels too big for the caches.

`compiler.py` asks `should_stream(inst)` for each loop kernel; a streamed kernel's range
function (and a row fusion's rows, `row_kernel.py`) stores through `emit_streamed_range`.
A non-temporal store writes whole lines without first reading them from memory (an
ordinary store's read-for-ownership doubles the DRAM traffic) and without filling the
cache. The rule: stream when a kernel's traffic reaches the last-level cache, except in
arithmetic-bound loop kernels (`COMPUTE_BOUND_OPCODES`) and rows under `MIN_RUN_BYTES`.
The range is computed block by block into a stack buffer by the ordinary vectorized
loop, then stored out; a fence ends it. docs/architecture.md, "Streaming stores".
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Callable

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import (
    I1,
    I32,
    I64,
    PTR,
    Index,
    KernelContext,
    i64,
    storage_type,
)
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.opcodes import OPCODES, is_transcendental
from tfxla_lite.hlo.shape import Shape

# One cache line, one AVX-512 vector: the unit of a streaming store.
LINE_BYTES = 64
# Elements computed into the stack buffer per block: 4 KiB stays in L1 next to the inputs.
BLOCK_BYTES = 4096
# Used when the host does not say how big its caches are.
_DEFAULT_CACHE_BYTES = 32 << 20


@functools.cache
def last_level_cache_bytes() -> int:
    """The size of the host's largest cache (Linux sysfs), else 32 MiB."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KkMmGg")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    if not sizes:
        try:
            sizes.append(int(os.sysconf("SC_LEVEL3_CACHE_SIZE")))
        except (ValueError, OSError, AttributeError):
            pass
    largest = max(sizes, default=0)
    return largest if largest > 0 else _DEFAULT_CACHE_BYTES


def kernel_bytes(inst: Instruction) -> int:
    """The bytes kernel `inst` moves: each array operand read once, its output written once."""
    return inst.shape.byte_size + sum(o.shape.byte_size for o in inst.operands
                                      if not o.shape.is_tuple)


def streamable(shape: Shape) -> bool:
    """Whether an array of `shape` can be stored in whole lines of whole elements."""
    if shape.is_tuple or shape.num_elements == 0:
        return False
    return LINE_BYTES % element_bytes(shape) == 0


# A loop kernel computing a transcendental (a polynomial in `math.py`, or a libm call) is
# bound by its arithmetic, not by memory: the block buffer's extra store, load and copy
# cost more than the line reads streaming saves (docs/benchmarks.md, "The 80% bandwidth
# goal and streaming stores"). sqrt and rsqrt are one instruction each.
COMPUTE_BOUND_OPCODES = frozenset(
    op for op in OPCODES if is_transcendental(op) and op not in ("sqrt", "rsqrt"))


# The shortest contiguous run of output (a row) worth streaming: four lines, so that
# most of a run is whole lines even when it does not start on a line boundary.
MIN_RUN_BYTES = 4 * LINE_BYTES


def should_stream(inst: Instruction, row_fusion: bool = False, run_elements: int | None = None,
                  cache_bytes: int | None = None) -> bool:
    """The cost rule: stream `inst`'s output when the kernel moves at least as many bytes
    as the last-level cache holds (`cache_bytes`; None: this host's) and writes runs
    (`run_elements`, contiguous elements; None: all of them) of `MIN_RUN_BYTES` or more,
    unless it is a loop kernel (not a `row_fusion`, whose rows stream at any cost of
    their math) that computes one of `COMPUTE_BOUND_OPCODES`."""
    limit = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    if not streamable(inst.shape) or kernel_bytes(inst) < limit:
        return False
    if run_elements is not None and run_elements * element_bytes(inst.shape) < MIN_RUN_BYTES:
        return False
    if row_fusion or inst.opcode != "fusion":
        return row_fusion or inst.opcode not in COMPUTE_BOUND_OPCODES
    return not any(i.opcode in COMPUTE_BOUND_OPCODES
                   for i in inst.fused_computation.instructions)


def element_bytes(shape: Shape) -> int:
    """Bytes per element of an array of `shape` in memory."""
    return shape.byte_size // shape.num_elements


# fill(buffer, first, length): store the elements [first, first + length) of the output
# at buffer[0], buffer[1], ... (`length` at most a block).
Fill = Callable[[ir.Value, ir.Value, ir.Value], None]


def emit_streamed_range(ctx: KernelContext, output: ir.Value, shape: Shape,
                        start: ir.Value, stop: ir.Value, fill: Fill,
                        length: int | None = None) -> None:
    """Store the output's elements [start, stop), which `fill` computes into a stack
    buffer a block at a time, to `output`: whole 64-byte lines with streaming stores,
    the partial lines at either end with masked ordinary stores. `length`, when known
    (a row fusion's row), is stop - start: a range of at most a block, or of whole
    blocks, is then filled in blocks of that known length from `start`, a loop that
    LLVM vectorizes without a runtime remainder (other lengths take the line grid
    below: a second fill for the last, shorter block measured slower); one of whole
    lines besides (a row of 1024 floats) takes `_emit_whole_lines`: its lines streamed
    from a runtime offset in the buffer, its partial lines (none when it starts on a
    line, as in TF's 64-byte aligned outputs) copied with `memcpy`, no masked store.

    Without `length`, blocks lie on the output's line grid (the first starts at the
    line boundary at or before `start`, its elements before `start` left out), so that
    buffer lines and output lines coincide and `fill` is emitted once, with no loop
    beside it: a separate head fill, or element-by-element copy loops, each vectorized
    and unrolled by LLVM, doubled the range's optimized code and its compile time."""
    b = ctx.builder
    size = element_bytes(shape)
    storage = storage_type(shape.element_type)
    block = BLOCK_BYTES // size
    lanes = LINE_BYTES // size
    if length is not None and length % lanes == 0 and (length <= block or length % block == 0):
        _emit_whole_lines(ctx, output, shape, start, fill, length)
        return
    # (A range of known length starts up to a line into its buffer, and its last line
    # may be partial.)
    scratch = ctx.alloca(storage, name="stream.block",
                         count=block if length is None else min(length, block) + 2 * lanes)
    scratch.align = LINE_BYTES
    flags = ["nuw", "nsw"]

    # An output not aligned to its element size (then no line is streamed) starts its
    # grid at `start` and is copied out with `memcpy`.
    address = b.add(b.ptrtoint(output, I64), b.mul(start, i64(size), flags=flags))
    streamed = b.icmp_unsigned("==", b.and_(address, i64(size - 1)), i64(0))
    behind = b.select(streamed, b.udiv(b.and_(address, i64(LINE_BYTES - 1)), i64(size)), i64(0))
    grid = b.sub(start, behind)
    if length is not None and (length <= block or length % block == 0):
        # Blocks from `start`, every fill a known number of times, each into the
        # buffer's second line (its stores aligned; the copy's loads are not, where
        # the range does not start on a line boundary: a line-splitting load costs
        # less than a line-splitting store).
        def part(offset: ir.Value, count: int) -> None:
            first = b.add(start, offset, flags=flags)
            fill(b.gep(scratch, [i64(lanes)], inbounds=True, source_etype=storage), first,
                 i64(count))
            _store_block(ctx, output, shape, scratch, streamed, b.sub(first, behind), behind,
                         b.add(behind, i64(count), flags=flags),
                         shift=b.sub(i64(lanes), behind))

        if length <= block:
            part(i64(0), length)
        else:
            with ctx.loop(length // block, name="stream.block") as number:
                part(b.mul(number, i64(block), flags=flags), block)
        return
    blocks = b.udiv(b.add(b.sub(stop, grid), i64(block - 1)), i64(block))
    with ctx.loop(blocks, name="stream.block") as number:
        first = b.add(grid, b.mul(number, i64(block), flags=flags), flags=flags)
        low = b.select(b.icmp_signed("<", first, start), start, first)
        end = b.add(first, i64(block), flags=flags)
        high = b.select(b.icmp_signed("<", stop, end), stop, end)
        # The block's elements are buffer[begin, finish).
        begin, finish = b.sub(low, first), b.sub(high, first)
        fill(b.gep(scratch, [begin], inbounds=True, source_etype=storage), low,
             b.sub(finish, begin))
        _store_block(ctx, output, shape, scratch, streamed, first, begin, finish)


def _emit_whole_lines(ctx: KernelContext, output: ir.Value, shape: Shape, start: ir.Value,
                      fill: Fill, length: int) -> None:
    """`emit_streamed_range` for a range of known `length` in whole lines (a row fusion's
    row of 16 floats a line or more): each block is filled into the line-aligned buffer
    and copied out by `emit_lines`, its whole lines with streaming stores, the elements
    before the first and after the last line boundary with `memcpy` (none when the range
    starts on a line, as every row of a TF output does). No masked store and no shifted
    fill are emitted, which cost LLVM time (docs/benchmarks.md)."""
    b = ctx.builder
    size = element_bytes(shape)
    storage = storage_type(shape.element_type)
    lanes = LINE_BYTES // size
    count = min(length, BLOCK_BYTES // size)
    scratch = ctx.alloca(storage, name="stream.block", count=count)
    scratch.align = LINE_BYTES
    vector = ir.VectorType(storage, lanes)
    flags = ["nuw", "nsw"]

    def part(first: ir.Value) -> None:
        fill(scratch, first, i64(count))

        def line(position: ir.Value) -> ir.Value:
            return b.load(b.gep(scratch, [position], inbounds=True, source_etype=storage),
                          typ=vector, align=size)

        emit_lines(ctx, output, shape, first, count, line, scratch)

    if length <= count:
        part(start)
    else:
        with ctx.loop(length // count, name="stream.block") as number:
            part(b.add(start, b.mul(number, i64(count), flags=flags), flags=flags))


def emit_memcpy(ctx: KernelContext, destination: ir.Value, source: ir.Value,
                bytes_: ir.Value) -> None:
    """`llvm.memcpy` of `bytes_` bytes (ordinary stores), buffers that do not overlap."""
    memcpy = ctx.module.globals.get("llvm.memcpy.p0.p0.i64")
    if memcpy is None:
        memcpy = ir.Function(ctx.module, ir.FunctionType(
            ir.VoidType(), [PTR, PTR, I64, I1]), name="llvm.memcpy.p0.p0.i64")
    ctx.builder.call(memcpy, [destination, source, bytes_, ir.Constant(I1, 0)])


def emit_lines(ctx: KernelContext, output: ir.Value, shape: Shape, first: ir.Value,
               count: int, line: Callable[[ir.Value], ir.Value], source: ir.Value) -> None:
    """Store elements [first, first + count) of the output: the whole 64-byte lines among
    them with streaming stores of `line(position)` (the vector of elements position, ...,
    position + L - 1 of the range, L a line's elements; `position` at a runtime offset
    when the range does not start on a line), and the elements before the first line
    boundary and after the last copied from `source[position]` (a buffer holding the
    range's elements from position 0) with `memcpy`: both parts empty when the range
    starts on a line; the whole range when the output is not even aligned to its element
    size. One line loop serves every alignment, and the partial lines cost a `memcpy`
    each (a scalar loop there cost more LLVM time). `count` must be at
    least a line's elements (the head before the first line boundary is up to L - 1
    elements: a shorter range would make the line count wrap)."""
    b = ctx.builder
    size = element_bytes(shape)
    storage = storage_type(shape.element_type)
    lanes = LINE_BYTES // size
    if count < lanes:
        raise ValueError(f"emit_lines needs at least {lanes} elements (a 64-byte line), "
                         f"got {count}")
    flags = ["nuw", "nsw"]
    address = b.add(b.ptrtoint(output, I64), b.mul(first, i64(size), flags=flags))
    aligned = b.icmp_unsigned("==", b.and_(address, i64(size - 1)), i64(0))
    # Elements before the first line boundary: (L - offset) mod L.
    offset = b.udiv(b.and_(address, i64(LINE_BYTES - 1)), i64(size))
    head = b.and_(b.sub(i64(lanes), offset), i64(lanes - 1))
    head = b.select(aligned, head, i64(count))
    lines = b.udiv(b.sub(i64(count), head), i64(lanes))
    tail = b.add(head, b.mul(lines, i64(lanes), flags=flags), flags=flags)
    target = b.gep(output, [first], inbounds=True, source_etype=storage)

    def copy(low: ir.Value, high: ir.Value) -> None:  # positions [low, high), if any
        with b.if_then(b.icmp_unsigned("<", low, high), likely=False):
            emit_memcpy(ctx, b.gep(target, [low], inbounds=True, source_etype=storage),
                        b.gep(source, [low], inbounds=True, source_etype=storage),
                        b.mul(b.sub(high, low), i64(size)))

    copy(i64(0), head)
    nontemporal = ctx.module.add_metadata([ir.Constant(I32, 1)])
    with ctx.loop(lines, name="stream.line") as number:
        position = b.add(head, b.mul(number, i64(lanes), flags=flags), flags=flags)
        stored = b.store(line(position), b.gep(target, [position], inbounds=True,
                                                source_etype=storage), align=LINE_BYTES)
        stored.set_metadata("nontemporal", nontemporal)
    copy(tail, i64(count))


def _store_block(ctx: KernelContext, output: ir.Value, shape: Shape, scratch: ir.Value,
                 streamed: ir.Value, first: ir.Value, begin: ir.Value, finish: ir.Value,
                 shift: ir.Value | None = None) -> None:
    """Copy buffer[begin + shift, finish + shift) (`shift` None: 0, the buffer's lines
    then the output's) to output[first + begin, first + finish): when `streamed`
    (output + first on a line boundary), the partial line at the start, the whole
    lines (streaming stores), the partial line at the end; else with `memcpy`."""
    b = ctx.builder
    size = element_bytes(shape)
    storage = storage_type(shape.element_type)
    lanes = LINE_BYTES // size
    vector = ir.VectorType(storage, lanes)
    flags = ["nuw", "nsw"]
    target = b.gep(output, [first], inbounds=True, source_etype=storage)

    source_align = LINE_BYTES if shift is None else size

    def line_of(position: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The buffer elements and output line at element `position` of the block."""
        at = position if shift is None else b.add(position, shift, flags=flags)
        return (b.gep(scratch, [at], inbounds=True, source_etype=storage),
                b.gep(target, [position], inbounds=True, source_etype=storage))

    def store_partial(position: ir.Value, lower: ir.Value, upper: ir.Value) -> None:
        """Masked ordinary store of lanes [lower, upper) of the line at `position`."""
        source, destination = line_of(position)
        data = b.load(source, typ=vector, align=source_align)
        _masked_store(ctx, data, destination, _lane_mask(ctx, lanes, lower, upper))

    head = b.urem(begin, i64(lanes))
    head_line = b.sub(begin, head)
    whole = b.select(b.icmp_unsigned("==", head, i64(0)), head_line,
                     b.add(head_line, i64(lanes)))
    tail = b.urem(finish, i64(lanes))
    tail_line = b.sub(finish, tail)
    with b.if_then(b.and_(streamed, b.icmp_unsigned("!=", head, i64(0)))):
        upper = b.sub(finish, head_line)
        store_partial(head_line, head,
                      b.select(b.icmp_unsigned("<", upper, i64(lanes)), upper, i64(lanes)))
    lines = b.select(b.and_(streamed, b.icmp_signed("<", whole, tail_line)),
                     b.udiv(b.sub(tail_line, whole), i64(lanes)), i64(0))
    nontemporal = ctx.module.add_metadata([ir.Constant(I32, 1)])
    with ctx.loop(lines, name="stream.line") as line:
        position = b.add(whole, b.mul(line, i64(lanes), flags=flags), flags=flags)
        source, destination = line_of(position)
        data = b.load(source, typ=vector, align=source_align)
        stored = b.store(data, destination, align=LINE_BYTES)
        stored.set_metadata("nontemporal", nontemporal)
    with b.if_then(b.and_(streamed, b.and_(b.icmp_unsigned("!=", tail, i64(0)),
                                           b.icmp_signed(">=", tail_line, begin)))):
        store_partial(tail_line, i64(0), tail)
    # Not aligned to the element: the block's bytes with `memcpy` (none otherwise).
    copied = b.select(streamed, i64(0), b.mul(b.sub(finish, begin), i64(size)))
    with b.if_then(b.icmp_unsigned("!=", copied, i64(0)), likely=False):
        source, destination = line_of(begin)
        memcpy = ctx.module.globals.get("llvm.memcpy.p0.p0.i64")
        if memcpy is None:
            memcpy = ir.Function(ctx.module, ir.FunctionType(
                ir.VoidType(), [destination.type, source.type, I64, I1]),
                name="llvm.memcpy.p0.p0.i64")
        b.call(memcpy, [destination, source, copied, ir.Constant(I1, 0)])


def _lane_mask(ctx: KernelContext, lanes: int, lower: ir.Value, upper: ir.Value) -> ir.Value:
    """<lanes x i1>: lane n set when lower <= n < upper (i64 values)."""
    b = ctx.builder
    indices = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))

    def splat(value: ir.Value) -> ir.Value:
        single = b.insert_element(ir.Constant(ir.VectorType(I64, lanes), ir.Undefined),
                                  value, ir.Constant(I32, 0))
        return b.shuffle_vector(single, single, ir.Constant(ir.VectorType(I32, lanes),
                                                            [0] * lanes))

    return b.and_(b.icmp_unsigned(">=", indices, splat(lower)),
                  b.icmp_unsigned("<", indices, splat(upper)))


def _masked_store(ctx: KernelContext, data: ir.Value, pointer: ir.Value, mask: ir.Value) -> None:
    """`llvm.masked.store` of `data`'s set lanes to a line-aligned `pointer` (the lanes
    left out are not written: another thread's elements there are not touched)."""
    typ = data.type
    name = f"llvm.masked.store.v{typ.count}{_vector_suffix(typ.element)}.p0"
    function = ctx.module.globals.get(name)
    if function is None:
        function = ir.Function(ctx.module, ir.FunctionType(
            ir.VoidType(), [typ, pointer.type, I32, mask.type]), name=name)
    ctx.builder.call(function, [data, pointer, ir.Constant(I32, LINE_BYTES), mask])


def _vector_suffix(element: ir.Type) -> str:
    if isinstance(element, ir.IntType):
        return f"i{element.width}"
    return {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16"}[str(element)]


def fill_inline(ctx: KernelContext, shape: Shape,
                compute: Callable[[ir.Value], ir.Value]) -> Fill:
    """A `fill` whose loop is emitted in place, `compute(linear)` giving each element (a
    value of its register type, as `ctx.store` takes)."""
    b = ctx.builder

    def fill(buffer: ir.Value, first: ir.Value, length: ir.Value) -> None:
        with ctx.loop(length, name="stream.fill") as offset:
            value = compute(b.add(first, offset, flags=["nuw", "nsw"]))
            ctx.store(value, buffer, shape, Index(shape.dims, linear=offset))

    return fill


def emit_fence(ctx: KernelContext) -> None:
    """Order the streaming stores before every later store, so that the threads joining
    the team, and the kernel's caller, see them: `sfence` on x86 (LLVM lowers a
    `fence seq_cst` there to a locked `or`, which x86 manuals do not promise orders
    streaming stores), a `fence seq_cst` elsewhere."""
    if _is_x86():
        sfence = ctx.module.globals.get("llvm.x86.sse.sfence")
        if sfence is None:
            sfence = ir.Function(ctx.module, ir.FunctionType(ir.VoidType(), []),
                                 name="llvm.x86.sse.sfence")
        ctx.builder.call(sfence, [])
    else:
        ctx.builder.fence("seq_cst")


@functools.cache
def _is_x86() -> bool:
    import llvmlite.binding as llvm

    return llvm.get_process_triple().split("-")[0] in ("x86_64", "i386", "i686")

