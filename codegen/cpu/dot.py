"""CPU code for `dot`: GEMM-shaped dots by units (library GEMM or emitted loops), with
their kOutput epilogue; the element generator otherwise.

An f32/f64 dot whose operands sit in buffers is a batch of row-major GEMMs: the
lhs's free dimensions flatten to M and its contracting ones to K, the rhs's to K
and N, and each flattened group must have one stride in memory (then the
transpose flag and leading dimension express it, as `cpu/dot_op_emitter.cc`
does). Such a dot, alone or as the dot of a kOutput fusion (`passes/output_fusion`),
is cut into units fixed by its shape (`schedule`): output tiles, or groups of batch
elements. Each unit is computed by the strategy chosen per shape (`choose_strategy`):
one call of OpenBLAS's GEMM (NumPy's, kept to one thread: the units are the kernel's parallel
parts, `parallel.py`), emitted register blocks (sums of 8 rows × 32 columns held in
vector registers over the whole K, read straight from A and B; `dot_blocks.py`) for
products up to 512³, at least 32 columns wide (16 when batched), whose B rows are
contiguous or, at a short K, copied so (`dot_blocks.fits`), an emitted
packed GEMM for f32 products of 2^32 flops or more on AVX-512 hosts (`gemm_packed.py`: B
packed once for all units, a K block ahead, its bits independent of the units), or
emitted row-by-row axpy loops for small dots and vector × matrix products; the epilogue
then runs over the tile just computed while it is in cache, or on each sum in registers
as the axpy loop finishes it.
Anything else (integer dots, layouts GEMM cannot express, dots fed by fused
producers) uses the element generator: a loop over the contracting dimensions, the
epilogue applied in registers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llvmlite import ir

from tfxla_lite.codegen.cpu import dot_blocks, engine, gemm_packed, parallel
from tfxla_lite.codegen.cpu.elementwise import binary_op, convert
from tfxla_lite.codegen.cpu.emitter import (
    I32,
    I64,
    PTR,
    VOID,
    Index,
    KernelContext,
    constant,
    declare,
    i64,
    minimum,
    register,
    row_major_strides,
    storage_type,
    value_type,
)
from tfxla_lite.hlo.ir import Instruction

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


@dataclass(frozen=True)
class DotDims:
    """A dot's dimension numbers, with each operand's free dimensions spelled out."""

    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contracting: tuple[int, ...]
    rhs_contracting: tuple[int, ...]
    lhs_free: tuple[int, ...]
    rhs_free: tuple[int, ...]

    @staticmethod
    def of(inst: Instruction) -> DotDims:
        attrs = inst.attributes
        lb = tuple(attrs.get("lhs_batch_dims", ()))
        rb = tuple(attrs.get("rhs_batch_dims", ()))
        lc = tuple(attrs.get("lhs_contracting_dims", ()))
        rc = tuple(attrs.get("rhs_contracting_dims", ()))
        lhs_rank, rhs_rank = inst.operand(0).shape.rank, inst.operand(1).shape.rank
        lf = tuple(d for d in range(lhs_rank) if d not in lb and d not in lc)
        rf = tuple(d for d in range(rhs_rank) if d not in rb and d not in rc)
        return DotDims(lb, rb, lc, rc, lf, rf)


def _accumulator_type(element_type: str) -> str:
    return "f32" if element_type == "f16" else element_type


@register("dot")
def emit_dot(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    lhs, rhs = inst.operands
    element_type = inst.shape.element_type
    if element_type == "pred":
        raise NotImplementedError(f"CPU backend: dot of pred (%{inst.name})")
    dims = DotDims.of(inst)
    b = ctx.builder
    multi = index.get_multi(b)
    n_batch, n_lhs_free = len(dims.lhs_batch), len(dims.lhs_free)
    batch, lhs_free, rhs_free = (multi[:n_batch], multi[n_batch:n_batch + n_lhs_free],
                                 multi[n_batch + n_lhs_free:])
    accumulate = _accumulator_type(element_type)
    accumulator = ctx.alloca(value_type(accumulate), name="dot.accumulator")
    b.store(constant(accumulate, 0), accumulator)
    contracting = tuple(lhs.shape.dims[d] for d in dims.lhs_contracting)
    with ctx.loop_nest(contracting, name="k") as k:
        lhs_multi = _operand_multi(lhs.shape.rank, [(dims.lhs_batch, batch),
                                                    (dims.lhs_contracting, k),
                                                    (dims.lhs_free, lhs_free)])
        rhs_multi = _operand_multi(rhs.shape.rank, [(dims.rhs_batch, batch),
                                                    (dims.rhs_contracting, k),
                                                    (dims.rhs_free, rhs_free)])
        x = convert(ctx, ctx.value(lhs, Index(lhs.shape.dims, lhs_multi)), element_type,
                    accumulate)
        y = convert(ctx, ctx.value(rhs, Index(rhs.shape.dims, rhs_multi)), element_type,
                    accumulate)
        product = binary_op(ctx, "multiply", accumulate, x, y, inst)
        b.store(binary_op(ctx, "add", accumulate, b.load(accumulator), product, inst),
                accumulator)
    return convert(ctx, b.load(accumulator), accumulate, element_type)


def _operand_multi(rank: int, parts: list[tuple[tuple[int, ...], list[ir.Value]]]
                   ) -> list[ir.Value]:
    multi: list[ir.Value] = [i64(0)] * rank
    for dimensions, values in parts:
        for d, value in zip(dimensions, values):
            multi[d] = value
    return multi


# -- GEMM ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmPlan:
    """One GEMM per batch element: C[M,N] = op(A)[M,K] @ op(B)[K,N], row-major."""

    m: int
    n: int
    k: int
    transpose_a: bool
    lda: int
    transpose_b: bool
    ldb: int
    batch_sizes: tuple[int, ...]
    lhs_batch_strides: tuple[int, ...]
    rhs_batch_strides: tuple[int, ...]
    element_bytes: int = 4


def _group_stride(dims: tuple[int, ...], strides: list[int], group: tuple[int, ...]
                  ) -> int | None | str:
    """The element stride of `group` flattened in order; 'any' when it has one element."""
    nontrivial = [d for d in group if dims[d] != 1]
    if not nontrivial:
        return "any"
    for outer, inner in itertools.pairwise(nontrivial):
        if strides[outer] != strides[inner] * dims[inner]:
            return None
    return strides[nontrivial[-1]]


def _matrix(dims: tuple[int, ...], rows: tuple[int, ...], cols: tuple[int, ...]
            ) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a row-major rows×cols view, if one exists."""
    strides = row_major_strides(dims)
    n_rows = math.prod(dims[d] for d in rows)
    n_cols = math.prod(dims[d] for d in cols)
    row_stride = _group_stride(dims, strides, rows)
    col_stride = _group_stride(dims, strides, cols)
    if row_stride is None or col_stride is None:
        return None
    if col_stride in ("any", 1):
        lead = row_stride if isinstance(row_stride, int) else max(1, n_cols)
        if lead >= max(1, n_cols):
            return False, lead
    if row_stride in ("any", 1):
        lead = col_stride if isinstance(col_stride, int) else max(1, n_rows)
        if lead >= max(1, n_rows):
            return True, lead
    return None


def plan_gemm(inst: Instruction) -> GemmPlan | None:
    """How to run `inst` as GEMM calls, or None when GEMM cannot express it."""
    lhs, rhs = inst.operands
    if engine.gemm(inst.shape.element_type) is None:
        return None
    if lhs.shape.element_type != inst.shape.element_type:
        return None
    dims = DotDims.of(inst)
    a = _matrix(lhs.shape.dims, dims.lhs_free, dims.lhs_contracting)
    b = _matrix(rhs.shape.dims, dims.rhs_contracting, dims.rhs_free)
    if a is None or b is None:
        return None
    lhs_strides = row_major_strides(lhs.shape.dims)
    rhs_strides = row_major_strides(rhs.shape.dims)
    return GemmPlan(
        m=math.prod(lhs.shape.dims[d] for d in dims.lhs_free),
        n=math.prod(rhs.shape.dims[d] for d in dims.rhs_free),
        k=math.prod(lhs.shape.dims[d] for d in dims.lhs_contracting),
        transpose_a=a[0], lda=a[1], transpose_b=b[0], ldb=b[1],
        batch_sizes=tuple(lhs.shape.dims[d] for d in dims.lhs_batch),
        lhs_batch_strides=tuple(lhs_strides[d] for d in dims.lhs_batch),
        rhs_batch_strides=tuple(rhs_strides[d] for d in dims.rhs_batch),
        element_bytes=inst.shape.numpy_dtype.itemsize,
    )


# -- strategy and schedule -----------------------------------------------------------------

# A GEMM-shaped dot runs as *units*: tiles of its output, or groups of whole batch
# elements, each computed over the full K by one call. Units depend on the shape alone,
# never on the thread count, so every element is summed in the same order however many
# threads share them. More units balance the team (a late thread leaves at most one
# unit's time at the join); each extra tile re-packs its rows of A and columns of B and
# costs one more library call, so the split stops when that extra CPU time would exceed
# the budget (`split_overhead`, `split_budget`). The constants are fitted to OpenBLAS on
# the development machine with `benchmarks/matmul.py --split-cost` (docs/benchmarks.md,
# "Large dots").
MIN_UNIT_FLOPS = 1 << 22
MAX_UNITS = 16
# Below this many units the budget does not apply: a K-heavy product with a small output
# (a weight gradient) would otherwise run on one thread while the others idle.
MIN_SPLIT_UNITS = 2
# The time one re-packed element costs, in flops, while its operand fits in a core's L2
# and once it does not; an operand of exactly L2_BYTES counts as beyond it (the packed
# panels and C's tile need room beside it).
PACKING_FLOPS = 17.0
PACKING_FLOPS_BEYOND_L2 = 36.0
TILE_CALL_FLOPS = 5e5  # the fixed cost of one more library call, in flops' time
L2_BYTES = 1 << 20
SPLIT_BUDGET = 0.02
# A late thread's delay does not grow with the dot while the split's cost does, so above
# BALANCE_FLOPS the budget shrinks with the flops; such a dot still gets BALANCED_UNITS
# units where MIN_UNIT_FLOPS allows, to keep a machine with more cores busy.
BALANCE_FLOPS = 1 << 30  # about 10 ms of one thread's GEMM
BALANCED_UNITS = 4
TILE_ALIGN = 16  # tile bounds at multiples of 16 elements: whole cache lines for f32
# Below this many flops a dot runs on the calling thread: a parallel region costs a
# few microseconds to start and join.
PARALLEL_MIN_FLOPS = 1 << 21
# Up to this many multiply-adds per GEMM, emitted loops beat a library call, whose
# argument checks, dispatch and packing cost about a microsecond.
SMALL_DOT_MACS = 1 << 15


@dataclass(frozen=True)
class DotSchedule:
    """How a GEMM-shaped dot is computed: `strategy` ("library": the BLAS GEMM per unit;
    "blocked": generated register blocks; "packed": the generated packed GEMM, units of
    whole-width row panels; "emitted": generated axpy loops) over `units`
    units, each a `block_m`×`block_n` tile of one of `batch_per_unit` consecutive batch
    elements (tiles vary fastest)."""

    strategy: str
    block_m: int
    block_n: int
    tiles_m: int
    tiles_n: int
    batch_per_unit: int
    units: int
    flops: int

    @property
    def tiles(self) -> int:
        return self.tiles_m * self.tiles_n


def choose_strategy(plan: GemmPlan) -> str:
    """Emitted loops for small dots and vector × matrix products, register blocks for
    products up to dot_blocks.MAX_MACS whose B rows are contiguous (`dot_blocks.fits`),
    the packed GEMM for f32 products of at least gemm_packed.MIN_FLOPS on AVX-512
    (`gemm_packed.fits`: below that size the library's tiles led), the library GEMM
    otherwise.

    A vector × matrix product (M = 1) with B's rows contiguous is a sequence of
    `axpy`s over those rows, which the emitted loop streams once through B at memory
    speed, with the epilogue on the hot row; a library GEMM would pack B first. Register
    blocks ("blocked") beat the library where its packing is a large share of the
    work: few rows of A, or products that fit in the caches (`dot_blocks.py`).
    """
    if plan.m * plan.n * plan.k <= SMALL_DOT_MACS:
        return "emitted"
    if plan.m == 1 and not plan.transpose_b:
        return "emitted"
    if dot_blocks.fits(plan):
        return "blocked"
    if gemm_packed.fits(plan):
        return "packed"
    return "library"


def _halve(size: int) -> int:
    half = -(-size // 2)
    return -(-half // TILE_ALIGN) * TILE_ALIGN


def split_overhead(m: int, n: int, k: int, tiles_m: int, tiles_n: int,
                   element_bytes: int = 4) -> float:
    """The extra CPU time of a tiles_m × tiles_n split of an m×k by k×n product relative
    to one library call (see PACKING_FLOPS): each extra column of tiles packs A (m×k)
    again, each extra row of tiles B (k×n), relative to the flops the K cancels; and
    each extra tile is one more call (TILE_CALL_FLOPS)."""
    def per_element(rows: int, cols: int) -> float:
        fits = rows * cols * element_bytes < L2_BYTES
        return PACKING_FLOPS if fits else PACKING_FLOPS_BEYOND_L2
    return (per_element(m, k) * (tiles_n - 1) / (2 * n)
            + per_element(k, n) * (tiles_m - 1) / (2 * m)
            + TILE_CALL_FLOPS * (tiles_m * tiles_n - 1) / (2 * m * n * max(k, 1)))


def split_budget(flops: int) -> float:
    """The extra CPU time a dot of `flops` may spend on splitting (see BALANCE_FLOPS)."""
    return SPLIT_BUDGET * min(1.0, BALANCE_FLOPS / max(flops, 1))


def schedule(plan: GemmPlan, strategy: str | None = None) -> DotSchedule:
    """The units of `plan`, fixed by its shape (see MIN_UNIT_FLOPS), for `strategy`
    (default: `choose_strategy`'s)."""
    batch = math.prod(plan.batch_sizes)
    m, n = max(plan.m, 1), max(plan.n, 1)
    per_gemm = 2 * plan.m * plan.n * max(plan.k, 1)
    strategy = strategy or choose_strategy(plan)
    flops = per_gemm * batch
    if strategy == "packed":
        return _packed_schedule(plan, batch, flops)
    if per_gemm < MIN_UNIT_FLOPS:  # whole matrices, several batch elements per unit
        per_unit = max(1, min(batch, MIN_UNIT_FLOPS // max(per_gemm, 1)))
        return DotSchedule(strategy, m, n, 1, 1, per_unit, -(-batch // per_unit), flops)
    block_m, block_n = m, n
    budget = split_budget(flops)
    min_units = BALANCED_UNITS if flops > BALANCE_FLOPS else MIN_SPLIT_UNITS
    while batch * -(-m // block_m) * -(-n // block_n) < MAX_UNITS:
        half_m, half_n = _halve(block_m), _halve(block_n)
        can_m = half_m < block_m
        can_n = half_n < block_n
        if can_m and (block_m >= block_n or not can_n):
            candidate = half_m, block_n
        elif can_n:
            candidate = block_m, half_n
        else:
            break
        tiles = -(-m // candidate[0]), -(-n // candidate[1])
        if 2 * candidate[0] * candidate[1] * plan.k < MIN_UNIT_FLOPS:
            break
        split_enough = batch * -(-m // block_m) * -(-n // block_n) >= min_units
        overhead = (0.0 if strategy == "blocked"  # nothing is packed
                    else split_overhead(m, n, max(plan.k, 1), *tiles, plan.element_bytes))
        if split_enough and overhead > budget:
            break
        block_m, block_n = candidate
    tiles_m, tiles_n = -(-m // block_m), -(-n // block_n)
    return DotSchedule(strategy, block_m, block_n, tiles_m, tiles_n, 1,
                       batch * tiles_m * tiles_n, flops)


def _packed_schedule(plan: GemmPlan, batch: int, flops: int) -> DotSchedule:
    """Row panels of the whole width for the packed GEMM: B is packed once for all of
    them and they partition A, so more units pack nothing twice; at most MAX_UNITS per
    batch element, at least gemm_packed.MC rows each (whole slivers of MR rows)."""
    tiles_m = max(1, min(MAX_UNITS, plan.m // gemm_packed.MC))
    block_m = -(-plan.m // tiles_m)
    block_m = -(-block_m // gemm_packed.MR) * gemm_packed.MR
    tiles_m = -(-plan.m // block_m)
    return DotSchedule("packed", block_m, plan.n, tiles_m, 1, 1, batch * tiles_m, flops)


def kernel_dot(inst: Instruction) -> Instruction | None:
    """The dot a kernel computes as GEMM units: `inst` itself, or the dot of a kOutput
    fusion (whose root, the epilogue, then runs on each unit); None otherwise."""
    if inst.opcode == "dot":
        return inst
    if inst.opcode != "fusion" or inst.attributes.get("kind") != "kOutput":
        return None
    dots = [i for i in inst.fused_computation.instructions if i.opcode == "dot"]
    if len(dots) != 1 or any(o.opcode != "parameter" for o in dots[0].operands):
        return None
    if dots[0].shape != inst.shape:  # the product lives in the output buffer first
        return None
    return dots[0]


# -- GEMM kernels --------------------------------------------------------------------------

NewKernel = Callable[..., tuple[KernelContext, ir.Value, list[ir.Value]]]


def emit_dot_kernel(module: ir.Module, pool: Any, inst: Instruction, name: str,
                    noalias_output: bool, threads: int, new_kernel: NewKernel
                    ) -> ir.Function | None:
    """The kernel of a dot or kOutput fusion whose dot GEMM can express, or None.

    A range function computes units [begin, end) of the schedule: per unit and batch
    element, the tile of the product (a library GEMM call or emitted loops) into the
    output buffer, then the epilogue over that tile while it is in cache (emitted loops
    apply it in registers as each sum is finished). The launcher runs it on `threads`
    threads when the dot is big.
    `new_kernel(module, pool, inst, name, noalias, extra)` makes a kernel function.
    """
    dot = kernel_dot(inst)
    plan = plan_gemm(dot) if dot is not None else None
    if dot is None or plan is None:
        return None
    sched = schedule(plan)
    if sched.strategy == "packed" and inst.shape.num_elements:
        return _emit_packed_kernel(module, pool, inst, dot, plan, sched, name, noalias_output,
                                   threads, new_kernel)
    return _emit_tiled_kernel(module, pool, inst, dot, plan, sched, name, noalias_output,
                              threads, new_kernel)


def _emit_tiled_kernel(module: ir.Module, pool: Any, inst: Instruction, dot: Instruction,
                       plan: GemmPlan, sched: DotSchedule, name: str, noalias_output: bool,
                       threads: int, new_kernel: NewKernel) -> ir.Function:
    """The launcher of `sched`'s units (library, emitted or blocked tiles) and their
    range function."""
    ctx, output, _ = new_kernel(module, pool, inst, name, noalias_output, [I64, I64])
    begin, end = ctx.function.args[-2:]
    begin.name, end.name = "begin", "end"
    if inst.shape.num_elements:
        _emit_units(ctx, inst, dot, plan, sched, output, begin, end)
    ctx.builder.ret_void()
    range_function = ctx.function

    launcher, output, inputs = new_kernel(module, pool, inst, name + ".launch", noalias_output)
    if sched.flops < PARALLEL_MIN_FLOPS:
        threads = 1
    parallel.emit_launch(launcher, range_function, [output, *inputs], sched.units, threads)
    launcher.builder.ret_void()
    return launcher.function


def _emit_packed_kernel(module: ir.Module, pool: Any, inst: Instruction, dot: Instruction,
                        plan: GemmPlan, sched: DotSchedule, name: str, noalias_output: bool,
                        threads: int, new_kernel: NewKernel) -> ir.Function:
    """The packed GEMM's launcher (`gemm_packed.py`): one aligned scratch allocation (a
    header, two packed K blocks of B, one packed-A slot per row panel); a parallel phase
    packing the first K block of B by strips; then per batch element and K block one
    parallel phase whose units compute the row panels' share of the block (the epilogue
    over each panel after the last block) and, as its last units, pack the next block
    into the other buffer; the scratch freed. Both threads work on the same K block of B
    at a time, so it stays in the shared L3 rather than each panel streaming all of B
    from memory; packing shares the block's phase, so each block costs one join (under
    load a late thread holds every join up)."""
    batch = math.prod(plan.batch_sizes)
    strips = gemm_packed.strips(plan.n)
    k_block = gemm_packed.k_block(plan)
    blocks = batch * gemm_packed.k_blocks(plan)
    last_pc = (plan.k - 1) // k_block * k_block

    ctx, _, _ = new_kernel(module, pool, inst, name + ".pack", noalias_output,
                           [PTR, I64, I64])
    rhs = ctx.buffers[id(dot.operand(1))]  # a fusion's parameters may come in any order
    scratch, begin, end = ctx.function.args[-3:]
    scratch.name, begin.name, end.name = "scratch", "begin", "end"
    b = ctx.builder
    element, pc, kc, packed_b, present = gemm_packed.block_of(b, scratch, plan, 1)
    with b.if_then(present):
        offset = b.mul(pc, i64(1 if plan.transpose_b else plan.ldb))
        for value, stride in zip(_unflatten(b, element, plan.batch_sizes),
                                 plan.rhs_batch_strides):
            offset = b.add(offset, b.mul(value, i64(stride)))
        b.call(gemm_packed.pack_b(module, plan.transpose_b), [
            b.gep(rhs, [offset], inbounds=True, source_etype=gemm_packed.F32),
            i64(plan.ldb), kc, i64(plan.n), packed_b, begin, end])
    b.ret_void()
    pack_function = ctx.function
    # Both halves of a phase stay functions of their own: inlined into the phase's task
    # with the panel they made one large function, 60-100 ms more of LLVM's O3.
    pack_function.attributes.add("noinline")

    ctx, output, _ = new_kernel(module, pool, inst, name + ".compute", noalias_output,
                                [PTR, I64, I64])
    scratch, begin, end = ctx.function.args[-3:]
    scratch.name, begin.name, end.name = "scratch", "begin", "end"
    b = ctx.builder
    element, pc, _, _, _ = gemm_packed.block_of(b, scratch, plan, 0)
    base = b.mul(element, i64(sched.tiles))
    _emit_units(ctx, inst, dot, plan, sched, output, b.add(begin, base), b.add(end, base),
                scratch, b.icmp_signed("==", pc, i64(last_pc)))
    ctx.builder.ret_void()
    compute_function = ctx.function
    compute_function.attributes.add("noinline")

    # A phase's units: the row panels first, then the next block's strips in as many
    # groups as there are panels, which the team claims last (they fill the wait at the
    # join). With a unit per strip (64 at 3072³) the runtime handed out 3 panels per
    # claim, and the join waited for up to three: 3072³ on two free cores ran at 88% of
    # tf.matmul's rate with 4% less CPU than the library's 93%.
    per_group = -(-strips // sched.tiles)
    groups = -(-strips // per_group)
    ctx, _, _ = new_kernel(module, pool, inst, name, noalias_output, [PTR, I64, I64])
    begin, end = ctx.function.args[-2:]
    begin.name, end.name = "begin", "end"
    b = ctx.builder
    arguments = list(ctx.function.args[:-2])
    tiles = i64(sched.tiles)
    compute_end = minimum(b, end, tiles)
    computing = gemm_packed.block_of(b, arguments[-1], plan, 0)[4]
    with b.if_then(b.and_(computing, b.icmp_signed("<", begin, compute_end))):
        b.call(compute_function, [*arguments, begin, compute_end])
    pack_begin = b.sub(b.select(b.icmp_signed(">", begin, tiles), begin, tiles), tiles)
    pack_begin = b.mul(pack_begin, i64(per_group))
    pack_end = minimum(b, b.mul(b.sub(end, tiles), i64(per_group)), i64(strips))
    with b.if_then(b.icmp_signed("<", pack_begin, pack_end)):
        b.call(pack_function, [*arguments, pack_begin, pack_end])
    b.ret_void()
    phase_function = ctx.function

    launcher, output, inputs = new_kernel(module, pool, inst, name + ".launch", noalias_output)
    b = launcher.builder
    floats = gemm_packed.scratch_floats(plan, sched.tiles, sched.block_m)
    size = -(-4 * floats // gemm_packed.ALIGN)
    allocate = declare(module, gemm_packed.ALLOCATOR,
                                  ir.FunctionType(PTR, [I64, I64]))
    release = declare(module, "free", ir.FunctionType(VOID, [PTR]))
    buffer = b.call(allocate, [i64(gemm_packed.ALIGN), i64(size * gemm_packed.ALIGN)],
                    name="scratch")
    # Where the scratch cannot be had (aligned_alloc answers null), the same product by
    # the library's tiles: slower, never a write through a null pointer.
    fallback = _emit_tiled_kernel(module, pool, inst, dot, plan, schedule(plan, "library"),
                                  name + ".unpacked", noalias_output, threads, new_kernel)
    with b.if_else(b.icmp_unsigned("==", buffer, ir.Constant(PTR, None))) as (missing, found):
        with missing:
            b.call(fallback, [output, *inputs])
        with found:
            pointers = [output, *inputs, buffer]
            # Phase q computes block q - 1 and packs block q: the first only packs, the
            # last only computes (one launch site: the runtime's task is named after its
            # function).
            with launcher.loop(blocks + 1, name="phase") as phase:
                gemm_packed.set_blocks(b, buffer, b.sub(phase, i64(1)), b.select(
                    b.icmp_signed("<", phase, i64(blocks)), phase, i64(-1)))
                parallel.emit_launch(launcher, phase_function, pointers, sched.tiles + groups,
                                     threads)
            b.call(release, [buffer])
    b.ret_void()
    return launcher.function


def _unflatten(b: ir.IRBuilder, value: ir.Value, sizes: tuple[int, ...]) -> list[ir.Value]:
    """The row-major multi-index over `sizes` of linear `value`."""
    multi = []
    strides = row_major_strides(sizes)
    for d, size in enumerate(sizes):
        if size == 1:
            multi.append(i64(0))
            continue
        part = value if d == 0 else b.urem(value, i64(strides[d - 1]))
        multi.append(part if strides[d] == 1 else b.udiv(part, i64(strides[d])))
    return multi


def _emit_units(ctx: KernelContext, inst: Instruction, dot: Instruction, plan: GemmPlan,
                sched: DotSchedule, output: ir.Value, begin: ir.Value, end: ir.Value,
                scratch: ir.Value | None = None, last_block: ir.Value | None = None) -> None:
    """Units [begin, end) of `sched`; for the packed GEMM, the current K block's share
    (`scratch`'s header), the epilogue only where `last_block` holds."""
    b = ctx.builder
    lhs_pointer = ctx.buffers[id(dot.operand(0))]
    rhs_pointer = ctx.buffers[id(dot.operand(1))]
    epilogue = None
    if inst.opcode == "fusion":
        ctx.buffers[id(dot)] = output  # the epilogue reads the product where it was stored
        epilogue = inst.fused_computation.root
    dims = dot.shape.dims
    n_batch, n_lhs_free = len(plan.batch_sizes), len(DotDims.of(dot).lhs_free)
    m_sizes, n_sizes = dims[n_batch:n_batch + n_lhs_free], dims[n_batch + n_lhs_free:]
    batch = math.prod(plan.batch_sizes)
    # Every tile's row and column counts: the full block and the last one.
    heights = {sched.block_m, plan.m - (sched.tiles_m - 1) * sched.block_m}
    widths = {sched.block_n, plan.n - (sched.tiles_n - 1) * sched.block_n}
    with ctx.loop(end, name="unit", start=begin) as unit:
        group = b.udiv(unit, i64(sched.tiles))
        tile = b.urem(unit, i64(sched.tiles))
        row0 = b.mul(b.udiv(tile, i64(sched.tiles_n)), i64(sched.block_m))
        row1 = minimum(b, b.add(row0, i64(sched.block_m)), i64(plan.m))
        col0 = b.mul(b.urem(tile, i64(sched.tiles_n)), i64(sched.block_n))
        col1 = minimum(b, b.add(col0, i64(sched.block_n)), i64(plan.n))
        first = b.mul(group, i64(sched.batch_per_unit))
        last = minimum(b, b.add(first, i64(sched.batch_per_unit)), i64(batch))
        with ctx.loop(last, name="batch", start=first) as element:
            batch_multi = _unflatten(b, element, plan.batch_sizes)
            lhs_offset, rhs_offset = i64(0), i64(0)
            for value, ls, rs in zip(batch_multi, plan.lhs_batch_strides,
                                     plan.rhs_batch_strides):
                lhs_offset = b.add(lhs_offset, b.mul(value, i64(ls)))
                rhs_offset = b.add(rhs_offset, b.mul(value, i64(rs)))
            out_offset = b.mul(element, i64(plan.m * plan.n))
            tile_ = Tile(plan, dot.shape.element_type, lhs_pointer, rhs_pointer, output,
                         lhs_offset, rhs_offset, out_offset, row0, row1, col0, col1)

            def index_of(row: ir.Value, col: ir.Value) -> Index:
                multi = batch_multi + _unflatten(b, row, m_sizes) + _unflatten(b, col, n_sizes)
                return Index(dims, multi, b.add(b.add(out_offset, b.mul(row, i64(plan.n))),
                                                col))

            def finish_in_register(row: ir.Value) -> Finish:
                def finish(col: ir.Value, total: ir.Value, pointer: ir.Value) -> None:
                    if epilogue is None:
                        b.store(total, pointer)
                        return
                    index = index_of(row, col)
                    ctx.scalars[id(dot)] = total  # the epilogue reads the sum, not memory
                    value = ctx.value(epilogue, index)
                    del ctx.scalars[id(dot)]
                    ctx.store(value, output, epilogue.shape, index)
                return finish

            def finish_row(row: ir.Value) -> None:
                if epilogue is None:
                    return
                row_multi = _unflatten(b, row, m_sizes)
                row_start = b.add(out_offset, b.mul(row, i64(plan.n)))
                with ctx.loop(col1, name="epilogue.j", start=col0) as col:
                    multi = batch_multi + row_multi + _unflatten(b, col, n_sizes)
                    index = Index(dims, multi, b.add(row_start, col))
                    ctx.store(ctx.value(epilogue, index), output, epilogue.shape, index)

            if plan.k == 0:  # an empty sum: zeros, then the epilogue
                with ctx.loop(row1, name="row", start=row0) as row:
                    _zero_row(ctx, tile_, row)
                    finish_row(row)
            elif sched.strategy == "emitted":
                with ctx.loop(row1, name="row", start=row0) as row:
                    _emit_row(ctx, tile_, row, finish_in_register(row))
            else:
                if sched.strategy == "blocked":
                    dot_blocks.emit_tile(ctx, tile_, heights, widths)
                elif sched.strategy == "packed":
                    assert scratch is not None
                    gemm_packed.emit_tile(ctx, tile_, scratch, tile, sched.block_m)
                else:
                    _call_gemm(ctx, tile_)
                if epilogue is not None and last_block is not None:
                    with b.if_then(last_block), ctx.scope(), \
                            ctx.loop(row1, name="row", start=row0) as row:
                        finish_row(row)
                elif epilogue is not None:  # over the tile just written
                    with ctx.loop(row1, name="row", start=row0) as row:
                        finish_row(row)


@dataclass(frozen=True)
class Tile:
    """Rows [row0, row1) × columns [col0, col1) of one batch element's product."""

    plan: GemmPlan
    element_type: str
    lhs: ir.Value
    rhs: ir.Value
    out: ir.Value
    lhs_offset: ir.Value
    rhs_offset: ir.Value
    out_offset: ir.Value
    row0: ir.Value
    row1: ir.Value
    col0: ir.Value
    col1: ir.Value


def library_gemm(ctx: KernelContext, element_type: str, transpose_a: bool, transpose_b: bool,
                 m: ir.Value | int, n: ir.Value | int, k: ir.Value | int, a: ir.Value,
                 lda: ir.Value | int, b_matrix: ir.Value, ldb: ir.Value | int, c: ir.Value,
                 ldc: ir.Value | int, beta: ir.Value | float = 0.0) -> None:
    """C[m, n] = op(A) · op(B) + beta · C, row major, by one call of the library's GEMM
    (declared in the module once); i64 sizes are narrowed to the library's integer width.
    `beta` 0.0 overwrites C (NaN in it included), as BLAS specifies."""
    routine = engine.gemm(element_type)
    assert routine is not None
    blas_int = ir.IntType(routine.int_bits)
    scalar = value_type(element_type)
    function = ctx.module.globals.get(routine.symbol)
    if function is None:
        signature = ir.FunctionType(VOID, [I32, I32, I32, blas_int, blas_int, blas_int, scalar,
                                           PTR, blas_int, PTR, blas_int, scalar, PTR, blas_int])
        function = ir.Function(ctx.module, signature, name=routine.symbol)
    b = ctx.builder

    def integer(value: ir.Value | int) -> ir.Value:
        if isinstance(value, int):
            return ir.Constant(blas_int, value)
        return value if routine.int_bits == 64 else b.trunc(value, blas_int)

    b.call(function, [
        ir.Constant(I32, _ROW_MAJOR),
        ir.Constant(I32, _TRANS if transpose_a else _NO_TRANS),
        ir.Constant(I32, _TRANS if transpose_b else _NO_TRANS),
        integer(m), integer(n), integer(k), ir.Constant(scalar, 1.0),
        a, integer(lda), b_matrix, integer(ldb),
        ir.Constant(scalar, beta) if isinstance(beta, float) else beta, c, integer(ldc),
    ])


def _call_gemm(ctx: KernelContext, tile: Tile) -> None:
    """C[tile] = A[rows] @ B[:, columns] by one library call."""
    plan = tile.plan
    b = ctx.builder
    etype = storage_type(tile.element_type)
    lhs_start = tile.row0 if plan.transpose_a else b.mul(tile.row0, i64(plan.lda))
    rhs_start = b.mul(tile.col0, i64(plan.ldb)) if plan.transpose_b else tile.col0
    out_start = b.add(b.mul(tile.row0, i64(plan.n)), tile.col0)
    library_gemm(
        ctx, tile.element_type, plan.transpose_a, plan.transpose_b,
        b.sub(tile.row1, tile.row0), b.sub(tile.col1, tile.col0), plan.k,
        b.gep(tile.lhs, [b.add(tile.lhs_offset, lhs_start)], source_etype=etype), plan.lda,
        b.gep(tile.rhs, [b.add(tile.rhs_offset, rhs_start)], source_etype=etype), plan.ldb,
        b.gep(tile.out, [b.add(tile.out_offset, out_start)], source_etype=etype),
        max(1, plan.n))


# Multiply-adds per element per pass of the emitted row loop: the row of C is loaded and
# stored once per this many k, and the sum keeps its order (k ascending) exactly.
_K_UNROLL = 4


Finish = Callable[[ir.Value, ir.Value, ir.Value], None]


def _zero_row(ctx: KernelContext, tile: Tile, row: ir.Value) -> None:
    b = ctx.builder
    etype = storage_type(tile.element_type)
    row_start = b.add(tile.out_offset, b.mul(row, i64(tile.plan.n)))
    with ctx.loop(tile.col1, name="zero.j", start=tile.col0) as col:
        pointer = b.gep(tile.out, [b.add(row_start, col)], inbounds=True, source_etype=etype)
        b.store(constant(tile.element_type, 0), pointer)


def _emit_row(ctx: KernelContext, tile: Tile, row: ir.Value, finish: Finish) -> None:
    """C[row, columns] = sum over k, ascending, of A[row, k] * B[k, columns], by axpys
    over B's rows (vectorized along the columns, contiguous unless B is transposed).
    K ≥ 1; `finish(column, sum, pointer)` stores each finished sum (through the
    epilogue, if any) to `pointer`."""
    plan, element_type = tile.plan, tile.element_type
    b = ctx.builder
    etype = storage_type(element_type)
    zero = constant(element_type, 0)

    def at(base: ir.Value, offset: ir.Value, linear: ir.Value) -> ir.Value:
        return b.gep(base, [b.add(offset, linear)], inbounds=True, source_etype=etype)

    def lhs(k: ir.Value) -> ir.Value:
        linear = (b.add(b.mul(k, i64(plan.lda)), row) if plan.transpose_a
                  else b.add(b.mul(row, i64(plan.lda)), k))
        return b.load(at(tile.lhs, tile.lhs_offset, linear), typ=etype)

    def rhs(k: ir.Value, col: ir.Value) -> ir.Value:
        linear = (b.add(b.mul(col, i64(plan.ldb)), k) if plan.transpose_b
                  else b.add(b.mul(k, i64(plan.ldb)), col))
        return b.load(at(tile.rhs, tile.rhs_offset, linear), typ=etype)

    row_start = b.add(tile.out_offset, b.mul(row, i64(plan.n)))

    def out(col: ir.Value) -> ir.Value:
        return b.gep(tile.out, [b.add(row_start, col)], inbounds=True, source_etype=etype)

    with ctx.loop(tile.col1, name="zero.j", start=tile.col0) as col:
        b.store(zero, out(col))
    # All k but the last in passes of _K_UNROLL (then single ones); the last k is peeled,
    # so that its pass hands each finished sum to `finish` in a register.
    body = plan.k - 1
    passes = body // _K_UNROLL
    for start, stop, step in ((0, passes, _K_UNROLL), (passes * _K_UNROLL, body, 1)):
        if stop <= start:
            continue
        with ctx.loop(stop, name=f"k{step}", start=start) as outer:
            k0 = b.mul(outer, i64(step)) if step > 1 else outer
            ks = [b.add(k0, i64(u)) for u in range(step)]
            coefficients = [lhs(k) for k in ks]
            with ctx.loop(tile.col1, name=f"axpy{step}.j", start=tile.col0) as col:
                accumulator = b.load(out(col), typ=etype)
                for k, a in zip(ks, coefficients):
                    accumulator = b.fadd(accumulator, b.fmul(a, rhs(k, col)))
                b.store(accumulator, out(col))
    last = i64(plan.k - 1)
    coefficient = lhs(last)
    with ctx.loop(tile.col1, name="last.j", start=tile.col0) as col:
        total = b.fadd(b.load(out(col), typ=etype), b.fmul(coefficient, rhs(last, col)))
        finish(col, total, out(col))
