"""Streaming (non-temporal) stores for the outputs of kernels too big for the caches.

Where it sits: `compiler.py` asks `should_stream(inst)` for each loop kernel, and a
streamed kernel's range function stores its output through `emit_streamed_range`
instead of one ordinary store per element: a flat kernel its whole part, a kernel
split over a dimension each innermost row; row fusions (`row_kernel.py`) store each
row the same way. An ordinary store to a line that is not in the cache first reads
the line from memory (read-for-ownership), so a kernel writing N bytes makes DRAM move
2N; a non-temporal store writes whole lines without reading them and without filling
the caches with data the kernel will not read again.

The cost rule (`should_stream`): stream when the bytes a kernel moves (every operand
read once, the output written once) reach the host's last-level cache size, except in
loop kernels bound by their arithmetic (`COMPUTE_BOUND_OPCODES`) and in kernels whose
rows are shorter than `MIN_RUN_BYTES`. Below that size,
inputs and outputs of repeated calls stay in the cache, which a streaming store would
bypass and empty (measured on the 2-core development VM, 32 MiB L3, a C copy on 2
threads: with 16 MiB arrays ordinary stores ran 1.7x faster than streaming ones; with
24 MiB and more, streaming ran 1.25x to 2x faster), and a small output read by the
next kernel should stay in cache.

The store path never looks at what it stores: the range is computed block by block,
each block of `BLOCK_BYTES` by a plain loop into an aligned stack buffer (the loop
LLVM vectorizes whole, whatever math produces the values; it stays in L1), then the
block's whole 64-byte lines are copied to the output with aligned vector stores
marked `!nontemporal` (`vmovntps zmm` on AVX-512), the rest with ordinary stores.
Elements before the first 64-byte boundary of the range (a thread's part or a row
need not start at one) go through the buffer too and are copied one by one,
ordinarily. Streaming stores are weakly
ordered: the range function ends with a fence, so every store is visible before the
parallel team joins or the kernel returns.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Callable

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import I32, I64, Index, KernelContext, i64, storage_type
from tfxla_lite.hlo.ir import Instruction
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


# Functions computed by polynomial approximations (`math.py`): a loop kernel computing one
# is bound by its arithmetic, not by memory, on the development machine (GELU's erf:
# 0.6 ns an element a core); there the block buffer's extra store, load and copy (about
# 0.05 ns an element) cost more than the line reads they save (measured: GELU over 4M
# and 16M floats 5-15% slower streamed, one or two threads; the same with the fill loop
# out of line, its constants then in registers, 46 instructions a vector instead of 66).
# Re-measured with erf 1.3x and tanh 1.5x cheaper (4M floats, best of 200): GELU still
# 10-20% slower streamed on one and two threads, a lone tanh 15-25% (docs/benchmarks.md).
COMPUTE_BOUND_OPCODES = frozenset({
    "exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic", "erf",
    "cbrt", "sine", "cosine", "tan", "power", "atan2",
})


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
                        start: ir.Value, stop: ir.Value, fill: Fill) -> None:
    """Store the output's elements [start, stop), which `fill` computes into a stack
    buffer a block at a time, to `output`: whole 64-byte lines with streaming stores,
    the elements before the first line boundary and after the last with ordinary ones."""
    b = ctx.builder
    size = element_bytes(shape)
    storage = storage_type(shape.element_type)
    block = BLOCK_BYTES // size
    scratch = ctx.alloca(storage, name="stream.block", count=block)
    scratch.align = LINE_BYTES

    def copy(first: ir.Value, source: ir.Value, count: ir.Value) -> None:
        """Ordinary stores of `count` elements from `source` to output[first...] (a loop:
        a call of `memcpy` per row costs more than a row's few head and tail elements)."""
        target = b.gep(output, [first], inbounds=True, source_etype=storage)
        with ctx.loop(count, name="stream.copy") as n:
            value = b.load(b.gep(source, [n], inbounds=True, source_etype=storage), typ=storage)
            b.store(value, b.gep(target, [n], inbounds=True, source_etype=storage))

    # The elements before the first line boundary at or after `start` (none when
    # the output is not aligned to its element size: then no line is streamed).
    address = b.add(b.ptrtoint(output, I64), b.mul(start, i64(size), flags=["nuw", "nsw"]))
    streamed = b.icmp_unsigned("==", b.and_(address, i64(size - 1)), i64(0))
    misaligned = b.and_(b.sub(i64(0), address), i64(LINE_BYTES - 1))
    aligned = b.add(start, b.udiv(misaligned, i64(size)), flags=["nuw", "nsw"])
    aligned = b.select(b.icmp_signed("<", aligned, stop), aligned, stop)
    aligned = b.select(streamed, aligned, start)
    with b.if_then(b.icmp_signed("<", start, aligned)):
        head_count = b.sub(aligned, start)
        fill(scratch, start, head_count)
        copy(start, scratch, head_count)

    # Blocks of `block` elements from the aligned start: computed into the stack buffer,
    # then copied out.
    count = b.sub(stop, aligned)
    blocks = b.udiv(b.add(count, i64(block - 1)), i64(block))
    lanes = LINE_BYTES // size
    vector = ir.VectorType(storage, lanes)
    nontemporal = ctx.module.add_metadata([ir.Constant(I32, 1)])
    with ctx.loop(blocks, name="stream.block") as number:
        first = b.add(aligned, b.mul(number, i64(block), flags=["nuw", "nsw"]),
                      flags=["nuw", "nsw"])
        left = b.sub(stop, first)
        length = b.select(b.icmp_signed("<", left, i64(block)), left, i64(block))
        fill(scratch, first, length)
        lines = b.select(streamed, b.udiv(length, i64(lanes)), i64(0))
        target = b.gep(output, [first], inbounds=True, source_etype=storage)
        with ctx.loop(lines, name="stream.line") as line:
            position = b.mul(line, i64(lanes), flags=["nuw", "nsw"])
            source = b.gep(scratch, [position], inbounds=True, source_etype=storage)
            data = b.load(source, typ=vector, align=LINE_BYTES)
            stored = b.store(data, b.gep(target, [position], inbounds=True,
                                         source_etype=storage), align=LINE_BYTES)
            stored.set_metadata("nontemporal", nontemporal)
        # The elements after the last whole line: ordinary stores.
        done = b.mul(lines, i64(lanes), flags=["nuw", "nsw"])
        copy(b.add(first, done, flags=["nuw", "nsw"]),
             b.gep(scratch, [done], inbounds=True, source_etype=storage),
             b.sub(length, done))


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

