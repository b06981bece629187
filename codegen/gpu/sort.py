"""GPU kernels of HLO `sort` and `topk`: whole-row kernels, not element generators.

Where it sits: `kernels.plan_instruction` hands every entry `sort` and `topk` to
`plan_sort` (fusion never takes one), `compiler.emit_plan` to `sort_template.emit_sort`;
the kernel takes the output pointers, the input pointers, then (long sort rows only) a scratch
pointer (`sort_scratch_bytes`, placed by the executable as split reductions' partials).
The semantics and the order are `tfxla_lite/hlo/sort.py`'s, and the results are the
evaluator's bit for bit (elements are copied in their storage type, never converted).

`sort`: a block per row (grid-stride over rows; a row is the `n` elements along the
sorted dimension at one index of the others). The block sorts a permutation of the row,
two int arrays of `n` entries (in shared memory up to `SHARED_ELEMENTS`, else in the
block's own region of the scratch area), by exactly the bottom-up merge of
`merge_sort_order`: passes over runs of 1, 2, 4..., each pair of runs merged left to
right by one thread, the right run's head taken only when the comparator (its device
function, `ModuleTables.function_of`) puts it before the left's. The threads of a block
merge different pairs of a pass, with a barrier between passes, so every comparison is
the evaluator's and the CPU kernel's: the permutation is theirs even for a comparator
that is no strict weak order (a plain LT of floats with NaN). The price: a pass merges
at most `n / 2w` pairs at once, so the last passes of a long row run on few threads
(the last on one: about 2n comparisons one after another per row). A merge-path split
of each merge across threads would lift that, exact only for a strict weak order.

`topk`: every thread streams elements once, as the CPU kernel does, into a buffer of
its k best so far, best first: an element enters when it beats the last (one compare
for most elements), shifting the worse ones down; an equal element never beats those
already in (lower indices). Where a block's buffers fit in shared memory
(`topk_team`: k up to 64 for 4-byte types), a block per row: thread t streams elements
t, t + T, ... into its own buffer, then the block merges the buffers pairwise in a tree
(log2 T rounds) under topk's total order (value, NaN above numbers, then index), so any
merge tree gives the one result. Otherwise (large k) one thread per row streams the
whole row into the output row itself.
"""

from __future__ import annotations

from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan, Launch
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.shape import numpy_dtype
from tfxla_lite.hlo.sort import sort_dimension

WHOLE_ROW_OPCODES = frozenset({"sort", "topk"})  # the opcodes `plan_sort` takes
SHARED_ELEMENTS = 4096  # rows up to this long keep both index arrays in shared memory (32 KiB)
SORT_MAX_THREADS = 256
TOPK_THREADS = 128  # threads of a block of the thread-per-row topk
TOPK_SHARED_BYTES = 32768  # the two buffer sets of a block-per-row topk, at most
# Long sort rows: each block its own 2n ints of scratch, at most this many bytes in all
# (at least one block's, however long the row).
SCRATCH_BUDGET = 1 << 28
SCRATCH_MAX_BLOCKS = 1024
INT_INDEX_LIMIT = 1 << 30  # below this many elements, element positions are 32-bit


def plan_sort(inst: Instruction, name: str) -> KernelPlan:
    """The plan of an entry `sort` or `topk`: kind, rows, row length, launch geometry."""
    dims = inst.operand(0).shape.dims
    if inst.opcode == "topk":
        n = dims[-1]
        rows = inst.operand(0).shape.num_elements // n if n else 0
        k = int(inst.attributes["k"])
        team = topk_team(k, inst.operand(0).shape.element_type)
        if team:
            return KernelPlan("topk", name, [inst], Launch((team, 1), rows, 1), team=team,
                              rows=rows, width=n, extra={"k": k})
        return KernelPlan("topk", name, [inst], Launch((TOPK_THREADS, 1), rows, TOPK_THREADS),
                          rows=rows, width=n, extra={"k": k})
    dimension = sort_dimension(inst.attributes, len(dims))
    n = dims[dimension]
    if n >= 1 << 31:
        raise NotImplementedError(f"GPU backend: sort rows of {n} elements (%{inst.name})")
    rows = inst.operand(0).shape.num_elements // n if n else 0
    # Pass 1 merges ceil(n / 2) pairs: threads for those, in whole warps.
    pairs = (n + 1) // 2
    threads = min(SORT_MAX_THREADS, max(32, (pairs + 31) // 32 * 32))
    blocks = scratch_blocks(rows, n)
    per_block = -(-rows // blocks) if blocks else 1
    return KernelPlan("sort", name, [inst], Launch((threads, 1), rows, per_block), team=threads,
                      rows=rows, width=n,
                      extra={"dimension": dimension, "blocks": blocks})


def topk_team(k: int, element_type: str) -> int:
    """Threads of a block-per-row topk (a power of two, 32 to 256): as many as can keep
    two buffers of k (value, index) pairs each in `TOPK_SHARED_BYTES`; 0 when fewer than
    32 can (a large k): one thread per row then."""
    if k <= 0:
        return 0
    pair = numpy_dtype(element_type).itemsize + 4
    team = 256
    while team >= 32 and 2 * team * k * pair > TOPK_SHARED_BYTES:
        team //= 2
    return team if team >= 32 else 0


def scratch_blocks(rows: int, n: int) -> int:
    """Blocks of a sort of `rows` rows of `n` elements whose index arrays live in scratch
    memory (0: they fit in shared memory): the launch never has more."""
    if n <= SHARED_ELEMENTS or not rows:
        return 0
    return max(1, min(rows, SCRATCH_MAX_BLOCKS, SCRATCH_BUDGET // (8 * n)))


def sort_scratch_bytes(plan: KernelPlan) -> int:
    """Scratch bytes a `sort` plan's kernel takes (0: none, no scratch parameter)."""
    if plan.kind != "sort":
        return 0
    return plan.extra["blocks"] * 2 * plan.width * 4


__all__ = ["SHARED_ELEMENTS", "WHOLE_ROW_OPCODES", "plan_sort", "scratch_blocks",
           "sort_scratch_bytes", "topk_team"]
