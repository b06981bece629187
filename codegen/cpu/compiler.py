"""The CPU backend's driver: an optimized, buffer-assigned HLO module → an `Executable`.

Every entry instruction that computes (a fusion, a dot, or an unfused op treated
as a fusion of one) becomes one LLVM function, a *kernel*, taking its output
pointer then one pointer per operand. The exported `entry` function of the ABI
(see `tfxla_lite.codegen.executable`) computes each buffer's address from the
`BufferAssignment` (a parameter, an output, the temp arena plus an offset, or a
read-only constant global) and calls the kernels in the entry's order. Kernels
keep no state: the generated code is reentrant.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from llvmlite import ir

from tfxla_lite.codegen import cache as stage_cache

# Importing the emitter modules fills the EMITTERS registry.
from tfxla_lite.codegen.cpu import (  # noqa: F401
    bit_ops,
    calls,
    column_reduction,
    control_flow,
    data_movement,
    elementwise,
    engine,
    kernel_cache,
    linalg,
    module_split,
    multi_output,
    parallel,
    random_bits,
    reduction,
    row_kernel,
    sort,
    streaming,
    tiers,
)
from tfxla_lite.codegen.cpu import dot as dot_codegen
from tfxla_lite.codegen.cpu.convolution_gemm import emit_convolution_kernel
from tfxla_lite.codegen.cpu.donation import output_donations
from tfxla_lite.codegen.cpu.dot import emit_dot_kernel
from tfxla_lite.codegen.cpu.emitter import (
    ENTRY_NAME,
    I8,
    I64,
    KERNEL_EMITTERS,
    OWN_KERNELS,
    PTR,
    VOID,
    ConstantPool,
    Index,
    KernelContext,
    i64,
    kernel_name,
    new_kernel_function,
    value_type,
)
from tfxla_lite.codegen.cpu.partition import (
    FLAT_ALIGN,
    SPLIT_CHUNK,
    SPLIT_MAX_CHUNKS,
    Partition,
)
from tfxla_lite.codegen.executable import Executable
from tfxla_lite.hlo.ir import HloModule, Instruction
from tfxla_lite.hlo.opcodes import is_flat
from tfxla_lite.passes.buffer_assignment import entry_values, leaves, updated_operand

# Opcodes of the entry computation that own a buffer but emit no kernel.
_NO_KERNEL = frozenset({"parameter", "constant"})
# Partitions whose range functions can store their output with streaming stores.
_STREAMED_KINDS = frozenset({"flat", "rows", "dimension"})


def _kernel_body(inst: Instruction) -> tuple[Instruction, list[Instruction]]:
    """The instruction a kernel stores (its root) and its computed instructions."""
    if inst.opcode == "fusion":
        computation = inst.fused_computation
        assert computation.root is not None
        if computation.root.shape.is_tuple:
            raise NotImplementedError(f"CPU backend: multi-output fusion %{inst.name}")
        return computation.root, list(computation.instructions)
    return inst, [inst]


# Ops that read only part of their first operand: as much as their result holds.
_PART_READERS = frozenset({"dynamic-slice", "slice", "gather"})


def read_elements(inst: Instruction, number: int) -> int:
    """How many elements of operand `number` the kernel of `inst` reads: the whole
    operand, except where only dynamic-slices, slices and gathers read it (a loop body's
    row of a TensorList), whose results say how much. A big operand read a row at a time
    must not make a small kernel parallel (each launch costs more than the row)."""
    operand = inst.operand(number)
    if inst.opcode in _PART_READERS and number == 0:
        return inst.shape.num_elements
    if inst.opcode != "fusion":
        return operand.shape.num_elements
    parameter = inst.fused_computation.parameter(number)
    users = parameter.users
    if users and all(u.opcode in _PART_READERS and u.operand(0) is parameter
                     and parameter not in u.operands[1:] for u in users):
        return min(operand.shape.num_elements, sum(u.shape.num_elements for u in users))
    return operand.shape.num_elements


def loop_team(inst: Instruction, team: int) -> int:
    """The team size of `inst`'s kernel inside a loop (`control_flow.loop_kernel_team`):
    by a GEMM-shaped dot's flops, other kernels' largest array read or written."""
    dot = dot_codegen.kernel_dot(inst)
    plan = dot_codegen.plan_gemm(dot) if dot is not None else None
    if plan is not None:
        return control_flow.loop_kernel_team(team, 0, dot_codegen.schedule(plan).flops)
    work = max([leaf.num_elements for _, leaf in leaves(inst.shape)]
               + [read_elements(inst, n) for n in range(len(inst.operands))])
    return control_flow.loop_kernel_team(team, work, None)


def plan_partition(inst: Instruction) -> Partition:
    """The partition of entry instruction `inst`'s kernel (not a GEMM)."""
    root, computed = _kernel_body(inst)
    shape = root.shape
    work = max([shape.num_elements] + [read_elements(inst, n) for n in range(len(inst.operands))])
    if row_kernel.is_row_fusion(inst):
        return Partition("rows", row_kernel.row_count(inst), work)
    if root.opcode == "reduce":
        operand_size = root.operand(0).shape.num_elements
        if shape.num_elements == 1 and operand_size >= parallel.PARALLEL_MIN_WORK:
            chunks = min(SPLIT_MAX_CHUNKS, -(-operand_size // SPLIT_CHUNK))
            chunk = -(-operand_size // chunks)
            chunk = -(-chunk // FLAT_ALIGN) * FLAT_ALIGN
            return Partition("split", -(-operand_size // chunk), work, chunk=chunk)
        if not reduction.is_row_reduction(root):
            columns = column_reduction.plan([root])
            if columns is not None:
                return Partition("columns", columns.units, work, dim=-1, chunk=columns.chunks)
            dim = reduction.column_partition_dimension(root)
            if dim is None:
                return Partition("column", 1, work, dim=-1)
            return Partition("column", root.operand(0).shape.dims[dim], work, dim=dim)
    elif is_flat(computed):
        return Partition("flat", shape.num_elements, work)
    for dim, size in enumerate(shape.dims):
        if size > 1:
            return Partition("dimension", size, work, dim=dim)
    return Partition("dimension", 1, work, dim=-1)  # one element: no loop to split


def emit_kernel(module: ir.Module, pool: ConstantPool, inst: Instruction,
                noalias_output: bool, threads: int = 1,
                in_place_operand: int | None = None, always_in_place: bool = False
                ) -> ir.Function:
    """The kernel function of entry instruction `inst`: `void kernel(out, in0, in1, ...)`.

    The kernel is a launcher of its range function (see `parallel.py`; a dot's range
    function computes units of its product, `dot.py`), which it runs on `threads`
    threads when the work is big enough. With `in_place_operand` n, the output is
    either operand n's very buffer or disjoint from every operand (a donation,
    `donation.py`): the launcher compares the two pointers and runs a range function
    that reads operand n through the output pointer (same-index reads and writes of
    one pointer, which LLVM vectorizes without alias checks) or the `noalias` one.
    `always_in_place`: the output is operand n's buffer on every call (buffer
    assignment's own reuse of a dying temp), so only the in-place variant is emitted
    (LLVM would fold the check once inlined into `entry`, but only after optimizing
    the dead variant, and not at all when `entry` is optimized in another part).
    """
    for operand in inst.operands:
        if operand.shape.is_tuple:
            raise NotImplementedError(f"CPU backend: tuple-shaped operand %{operand.name} "
                                      f"of %{inst.name}")
    root, _ = _kernel_body(inst)
    if root.shape.is_tuple:
        raise NotImplementedError(f"CPU backend: variadic {root.opcode} (%{inst.name}) returns "
                                  "a tuple; kernels with several outputs are not supported")
    if in_place_operand is not None and (inst.opcode in KERNEL_EMITTERS or root.opcode == "dot"):
        noalias_output = False  # no in-place variant of these: plain aliasing rules
        in_place_operand = None
    # A GEMM-shaped dot, alone or with its kOutput epilogue: units of tiles (dot.py).
    dot_kernel = emit_dot_kernel(module, pool, inst, kernel_name(inst), noalias_output,
                                 threads, _new_kernel)
    if dot_kernel is not None:
        return dot_kernel
    # A GEMM-shaped convolution: blocks of patch rows and a GEMM call each.
    conv_kernel = emit_convolution_kernel(module, pool, inst, kernel_name(inst),
                                          noalias_output, threads, _new_kernel)
    if conv_kernel is not None:
        return conv_kernel
    if inst.opcode in KERNEL_EMITTERS:  # a whole-kernel emitter (scatter: indexing.py)
        ctx, output, _ = _new_kernel(module, pool, inst, kernel_name(inst), noalias_output)
        KERNEL_EMITTERS[inst.opcode](ctx, inst, output)
        ctx.builder.ret_void()
        return ctx.function
    if inst.opcode == "fusion" and updated_operand(inst) is not None:
        # XLA's dynamic-update-slice fusion: the update's elements computed in the
        # kernel and stored in place, as a top-level dynamic-update-slice (indexing.py).
        ctx, output, _ = _new_kernel(module, pool, inst, kernel_name(inst), False)
        KERNEL_EMITTERS["dynamic-update-slice"](ctx, root, output)
        ctx.builder.ret_void()
        return ctx.function
    partition = plan_partition(inst)
    # Whole-line streaming stores for outputs beyond the last-level cache (streaming.py).
    run = None if partition.kind == "flat" else (root.shape.dims or (1,))[-1]
    stream = partition.kind in _STREAMED_KINDS and root.opcode != "reduce" and \
        streaming.should_stream(inst, row_fusion=partition.kind == "rows", run_elements=run)
    only_in_place = always_in_place and in_place_operand is not None
    range_function = None if only_in_place else _emit_range_function(
        module, pool, inst, noalias_output, partition, stream=stream)
    ctx, output, inputs = _new_kernel(module, pool, inst, kernel_name(inst) + ".launch",
                                      noalias_output and in_place_operand is None)
    pointers = [output, *inputs]
    partials = None
    if partition.kind == "split":
        element = value_type(root.shape.element_type)
        partials = ctx.alloca(element, name="partials", count=partition.total)
        pointers.append(partials)
    columns = column_reduction.plan([root]) if partition.kind == "columns" else None
    if columns is not None and partition.has_partials:
        element = value_type(reduction.Accumulation(ctx, root).element_type)
        partials = ctx.alloca(element, name="partials", count=columns.partial_count)
        pointers.append(partials)
    if partition.work < parallel.PARALLEL_MIN_WORK:
        threads = 1
    if range_function is None:
        in_place = _emit_range_function(module, pool, inst, False, partition, in_place_operand,
                                        stream=stream)
        parallel.emit_launch(ctx, in_place, pointers, partition.total, threads, partition.align)
    elif in_place_operand is not None:
        in_place = _emit_range_function(module, pool, inst, False, partition, in_place_operand,
                                        stream=stream)
        b = ctx.builder
        same = b.icmp_unsigned("==", b.ptrtoint(output, I64),
                               b.ptrtoint(inputs[in_place_operand], I64))
        with b.if_else(same) as (then, otherwise):
            with then:
                parallel.emit_launch(ctx, in_place, pointers, partition.total, threads,
                                     partition.align)
            with otherwise:
                parallel.emit_launch(ctx, range_function, pointers, partition.total, threads,
                                     partition.align)
    else:
        parallel.emit_launch(ctx, range_function, pointers, partition.total, threads,
                             partition.align)
    if columns is not None and partials is not None:
        column_reduction.emit_combine(
            ctx, columns, [column_reduction.Target(root, [output], partials)])
    elif partials is not None:
        _combine_partials(ctx, root, output, partials, partition.total)
    ctx.builder.ret_void()
    return ctx.function


def _new_kernel(module: ir.Module, pool: ConstantPool, inst: Instruction, name: str,
                noalias_output: bool, extra: list[ir.Type] | None = None
                ) -> tuple[KernelContext, ir.Value, list[ir.Value]]:
    """A function `void name(out, in..., *extra)` and a context whose buffers are its
    pointer arguments."""
    ctx, (output,), inputs = new_kernel_function(module, pool, inst, name, 1, extra or [])
    output.name = "output"
    output.attributes.add("captures(none)")
    if noalias_output:
        output.attributes.add("noalias")
    return ctx, output, inputs


def _emit_range_function(module: ir.Module, pool: ConstantPool, inst: Instruction,
                         noalias_output: bool, partition: Partition,
                         in_place_operand: int | None = None, stream: bool = False
                         ) -> ir.Function:
    """`void kernel(out, in..., [partials,] i64 begin, i64 end)`: units [begin, end) of
    the partition; with `in_place_operand` n, operand n is read through `out`; with
    `stream`, a flat or row kernel stores its output with streaming stores."""
    root, _ = _kernel_body(inst)
    extra = ([PTR] if partition.has_partials else []) + [I64, I64]
    name = kernel_name(inst) + (".in_place" if in_place_operand is not None else "")
    ctx, output, _ = _new_kernel(module, pool, inst, name, noalias_output, extra)
    if in_place_operand is not None:
        operand = (inst.fused_computation.parameters[in_place_operand]
                   if inst.opcode == "fusion" else inst.operand(in_place_operand))
        ctx.buffers[id(operand)] = output
    begin, end = ctx.function.args[-2:]
    begin.name, end.name = "begin", "end"
    shape = root.shape
    restrict = (partition.dim, begin, end) if partition.dim >= 0 else None
    if partition.kind == "split":
        partials = ctx.function.args[-3]
        partials.name = "partials"
        _emit_partials(ctx, root, partials, partition, begin, end)
    elif partition.kind == "columns":
        columns = column_reduction.plan([root])
        assert columns is not None
        partials = ctx.function.args[-3] if partition.has_partials else None
        target = column_reduction.Target(root, [output], partials)
        column_reduction.emit_units(ctx, columns, [target], [], begin, end)
    elif shape.num_elements == 0:
        pass  # nothing to compute
    elif partition.kind == "rows":
        row_kernel.emit_row_kernel(ctx, inst, output, begin, end, stream)
    elif root.opcode == "reduce":
        reduction.emit_reduction_kernel(ctx, root, output, restrict)
    elif partition.kind == "flat" and stream:
        streaming.emit_streamed_range(ctx, output, shape, begin, end, streaming.fill_inline(
            ctx, shape, lambda linear: ctx.value(root, Index(shape.dims, linear=linear))))
    elif partition.kind == "flat":
        # Pure elementwise: one flat loop, the simplest shape for the vectorizer.
        with ctx.loop(end, name="i", start=begin) as linear:
            index = Index(shape.dims, linear=linear)
            ctx.store(ctx.value(root, index), output, shape, index)
    elif stream:
        _emit_streamed_rows(ctx, root, output, partition, begin, end)
    else:
        data_movement.emit_element_loops(ctx, root, output, restrict)
    if stream:
        streaming.emit_fence(ctx)
    ctx.builder.ret_void()
    return ctx.function


def _emit_streamed_rows(ctx: KernelContext, root: Instruction, output: ir.Value,
                        partition: Partition, begin: ir.Value, end: ir.Value) -> None:
    """A `dimension` kernel's part with streaming stores: a loop nest over the outer
    dimensions, each innermost row (or, when the partition splits the last dimension,
    its part of the row) one streamed range (`streaming.py`)."""
    b = ctx.builder
    dims = root.shape.dims
    last = len(dims) - 1
    outer = (partition.dim, begin, end) if partition.dim < last else None
    first, stop = (begin, end) if partition.dim == last else (i64(0), i64(dims[last]))
    with ctx.loop_nest(dims[:last], name="i", restrict=outer) as multi:
        base = Index(dims, [*multi, i64(0)]).get_linear(b)

        def compute(linear: ir.Value) -> ir.Value:
            column = b.sub(linear, base, flags=["nuw", "nsw"])
            return ctx.value(root, Index(dims, [*multi, column], linear))

        streaming.emit_streamed_range(ctx, output, root.shape,
                                      b.add(base, first, flags=["nuw", "nsw"]),
                                      b.add(base, stop, flags=["nuw", "nsw"]),
                                      streaming.fill_inline(ctx, root.shape, compute))


def _emit_partials(ctx: KernelContext, root: Instruction, partials: ir.Value,
                   partition: Partition, begin: ir.Value, end: ir.Value) -> None:
    """partials[c] = the fold of chunk c, for the chunks c in [begin, end)."""
    b = ctx.builder
    size = root.operand(0).shape.num_elements
    last = size - (partition.total - 1) * partition.chunk
    element = value_type(root.shape.element_type)
    with ctx.loop(end, name="chunk", start=begin) as chunk:
        start = b.mul(chunk, i64(partition.chunk), flags=["nuw", "nsw"])

        def fold(length: int) -> Callable[[], ir.Value]:
            return lambda: reduction.fold_range(ctx, root, start, length)

        if last == partition.chunk:
            value = fold(last)()
        else:
            is_last = b.icmp_signed("==", chunk, i64(partition.total - 1))
            value = ctx.branch_value(is_last, fold(last), fold(partition.chunk), name="last")
        b.store(value, b.gep(partials, [chunk], inbounds=True, source_etype=element))


def _combine_partials(ctx: KernelContext, root: Instruction, output: ir.Value,
                      partials: ir.Value, count: int) -> None:
    """output = init folded with partials[0], partials[1], ... in order."""
    b = ctx.builder
    element = value_type(root.shape.element_type)
    accumulator = ctx.alloca(element, name="accumulator")
    b.store(ctx.value(root.operand(1), Index.scalar()), accumulator)
    with ctx.loop(count, name="combine") as chunk:
        partial = b.load(b.gep(partials, [chunk], inbounds=True, source_etype=element),
                         typ=element)
        combined = ctx.apply_computation(root.called_computations[0],
                                         [b.load(accumulator), partial])
        b.store(combined, accumulator)
    shape = root.shape
    ctx.store(b.load(accumulator), output, shape, Index(shape.dims, linear=i64(0)))


def compile(module: HloModule, assignment: Any, hlo_text: str = "",
            optimized_hlo_text: str = "", threads: int | None = None,
            cache: bool | str | None = None, donate: Collection[int] = (),
            background: bool = False, tiered: bool = False) -> Executable:
    """Emit, optimize and JIT-compile `module` under `assignment`.

    `donate`: parameter numbers whose buffers outputs may take over (TF's input
    forwarding, `donation.py`); each donated kernel gets an in-place variant, which
    costs compile time, so callers name only inputs that TF might forward.

    `threads` is the team size of parallel kernels (None: every CPU this process may
    use; 1: all kernels serial). `cache` chooses the compile caches (`kernel_cache.py`;
    None: as `TFXLA_LITE_CACHE` says): a hit reuses machine code and emits nothing.

    `background` and `tiered` (which takes precedence): on a cache miss, LLVM's O3 work
    goes on in the background and the result is a `tiers.BackgroundExecutable`, whose
    readers wait for the code (`background`) or which runs quick-tier code until the O3
    code is swapped in (`tiered`). Only O3 code goes into the caches.
    """
    team = parallel.effective_threads(threads)
    entry = module.entry
    assert entry is not None and entry.root is not None
    root = entry.root
    outputs = list(root.operands) if root.opcode == "tuple" else [root]
    optimized_hlo_text = optimized_hlo_text or module.to_text()
    assignment_text = assignment.to_text()
    caches = stage_cache.policy(cache)
    donations = output_donations(module, assignment, frozenset(donate))
    key = kernel_cache.kernel_fingerprint(optimized_hlo_text, assignment_text, donations, team,
                                          kernel_cache.constants_digest(module))
    signature = {"entry": ENTRY_NAME, "temp_bytes": int(assignment.temp_bytes),
                 "parameters": [str(p.shape) for p in entry.parameters],
                 "outputs": [str(o.shape) for o in outputs]}
    # What an executable says of its module, whether its machine code is ready or pending.
    described = dict(
        module=module, assignment=assignment,
        parameter_shapes=[p.shape for p in entry.parameters],
        output_shapes=[o.shape for o in outputs], temp_bytes=int(assignment.temp_bytes),
        hlo_text=hlo_text or module.to_text(), optimized_hlo_text=optimized_hlo_text,
        assignment_text=assignment_text, donations=donations)
    code = kernel_cache.lookup(key, signature, caches)
    if code is None and (tiered or background):
        emitted = _emit_code(module, assignment, team, donations, tiered=tiered)
        quick = None
        if tiered:
            quick_split = emitted.quick_split or emitted.split
            quick = tiers.quick_code(quick_split.parts, ENTRY_NAME, quick_split.exported,
                                     o3_last=quick_split.apart)
        executable = tiers.BackgroundExecutable(
            **described, kernel_count=emitted.kernel_count, llvm_ir=emitted.split.text,
            llvm_ir_optimized=None, entry_address=quick and quick.entry_address,
            engine=quick and quick.engine, compiled_from="llvm", quick=quick)
        stage_cache.count("llvm_compilations")  # its O3 compile, certain to be tried
        # A tiered compile's O3 code takes one thread beside the launches running quick code.
        executable.start(functools.partial(_finish_code, emitted, key, signature, caches,
                                           1 if tiered else None),
                         kernel_cache.MEMORY.job_key(key) if caches.memory else None)
        return executable
    if code is None:
        stage_cache.count("llvm_compilations")
        code = _finish_code(_emit_code(module, assignment, team, donations), key, signature,
                            caches)
    return Executable(
        **described, kernel_count=code.kernel_count, llvm_ir=code.llvm_ir,
        llvm_ir_optimized=code.llvm_ir_optimized, entry_address=code.entry_address,
        engine=code.engine, compiled_from=code.source)


@dataclass(frozen=True)
class EmittedModule:
    """A module's LLVM IR as emitted (`_emit_code`), cut into the parts LLVM compiles."""

    split: module_split.SplitModule
    kernel_count: int
    # The quick tier's parts, when they differ from `split`'s: the functions it compiles
    # at O3 all the same set apart in the last part (`tiers.o3_even_when_quick`).
    quick_split: module_split.SplitModule | None = None


def _finish_code(emitted: EmittedModule, key: str, signature: dict[str, Any],
                 caches: stage_cache.CachePolicy, threads: int | None = None
                 ) -> kernel_cache.CompiledCode:
    """LLVM's part of a compile (`_machine_code`, on at most `threads` threads), then the
    kernel caches' writes."""
    code = _machine_code(emitted, threads)
    kernel_cache.store(key, signature, code, caches)
    return code


def _machine_code(emitted: EmittedModule, threads: int | None = None
                  ) -> kernel_cache.CompiledCode:
    """Optimize and compile the emitted parts (one object each) and load them."""
    split = emitted.split
    parts = engine.compile_parts(split.parts, threads=threads)
    execution_engine = engine.load_objects(parts.objects)
    return kernel_cache.CompiledCode(
        execution_engine, execution_engine.get_function_address(ENTRY_NAME),
        emitted.kernel_count, split.text,
        kernel_cache.optimized_text(parts.bitcode, split.exported), parts.objects,
        parts.bitcode, split.exported)


def _emit_code(module: HloModule, assignment: Any, team: int,
               donations: tuple[tuple[int, int], ...] = (),
               tiered: bool = False) -> EmittedModule:
    """The module's LLVM IR (kernels and `entry`), cut into parts (`module_split`);
    `tiered`: also the quick tier's parts, if any function must be set apart."""
    entry = module.entry
    assert entry is not None and entry.root is not None
    llvm_module = ir.Module(name=module.name)
    pool = ConstantPool(llvm_module)
    kernels = KernelMerger(llvm_module)
    _, kernel_count = emit_function(llvm_module, pool, kernels, entry, assignment, team,
                                    ENTRY_NAME, donations)

    engine.half_runtime()  # f16 code may call libgcc's conversions
    # Big modules are optimized and compiled in parts, one thread and one object each
    # (module_split.py); one engine links the objects.
    split = module_split.split_module(llvm_module, ENTRY_NAME, engine.optimizer_threads(),
                                      engine.PARALLEL_IR_BYTES, kernels.texts)
    apart = tiers.o3_even_when_quick(llvm_module.globals) if tiered else []
    quick_split = None
    if apart:
        quick_split = module_split.split_module(
            llvm_module, ENTRY_NAME, engine.optimizer_threads(), engine.PARALLEL_IR_BYTES,
            kernels.texts, apart=apart)
    return EmittedModule(split, kernel_count, quick_split)


def emit_function(llvm_module: ir.Module, pool: ConstantPool, kernels: KernelMerger,
                  computation: Any, assignment: Any, team: int, name: str,
                  donations: tuple[tuple[int, int], ...] = (), in_loop: bool = False
                  ) -> tuple[ir.Function, int]:
    """`void name(void** params, void** outputs, void* temp)`, the ABI's entry function
    (`executable.py`) of `computation` under `assignment`: the entry, or a computation a
    loop or a conditional calls (internal, called by its caller's function,
    `control_flow.py`); and how many kernel launches it holds. `in_loop`: it runs once
    per iteration of a loop, so its kernels use the team only when big
    (`control_flow.loop_kernel_team`)."""
    root = computation.root
    assert root is not None
    outputs = list(root.operands) if root.opcode == "tuple" else [root]
    function = ir.Function(llvm_module, ir.FunctionType(VOID, [PTR, PTR, PTR]), name=name)
    function.attributes.add("nounwind")
    if name != ENTRY_NAME:
        function.linkage = "internal"
    params_arg, outputs_arg, temp_arg = function.args
    params_arg.name, outputs_arg.name, temp_arg.name = "params", "outputs", "temp"
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    pointers: dict[tuple[int, tuple[int, ...]], ir.Value] = {}
    functions: dict[str, ir.Function] = {}

    def called_function(callee: Any, plan: Any, looped: bool) -> ir.Function:
        """The function of a computation a loop or conditional calls, emitted once."""
        nonlocal kernel_count
        if callee.name not in functions:
            functions[callee.name], count = emit_function(
                llvm_module, pool, kernels, callee, plan, team,
                f"{name}.{re.sub(r'[^A-Za-z0-9_.]', '_', callee.name)}",
                in_loop=in_loop or looped)
            kernel_count += count
        return functions[callee.name]

    # Forwarding names (tuples, get-tuple-elements, a loop's unchanged leaves) resolve
    # to the instruction and leaf that define the value (a constant's pointer is its own).
    value_at = entry_values(computation)

    def pointer_of(inst: Instruction, index: tuple[int, ...] = ()) -> ir.Value:
        value = value_at.get((id(inst), index))
        if value is not None:
            inst, index = value.instruction, value.index
        if (id(inst), index) not in pointers:
            pointers[(id(inst), index)] = _buffer_pointer(builder, pool, assignment, inst,
                                                          params_arg, outputs_arg, temp_arg,
                                                          index)
        return pointers[(id(inst), index)]

    kernel_count = 0
    # Kernels whose output may be a parameter's own buffer: the operand number it reads
    # that parameter as (donation.py).
    donated = {id(outputs[j]): [o.opcode == "parameter" and o.parameter_number == i
                                for o in outputs[j].operands].index(True)
               for j, i in donations}
    for inst in computation.instructions:
        if inst.opcode in _NO_KERNEL or (inst is root and inst.opcode == "tuple"):
            continue
        if inst.opcode in ("tuple", "get-tuple-element"):
            continue  # names for its operands' buffers (buffer assignment aliases them)
        if inst.opcode in control_flow.OPCODES:  # a loop or branches calling functions
            looped = inst.opcode == "while"
            control_flow.emit(builder, inst, assignment.control_flow[inst.name], pointer_of,
                              temp_arg, lambda c, p, looped=looped: called_function(c, p, looped))
            continue
        # One output pointer per leaf: a tuple-shaped kernel (a multi-output fusion, a
        # variadic reduce) writes each leaf to its own slice (multi_output.py).
        indices = [index for index, _ in leaves(inst.shape)]
        in_slices = [assignment.slice_of(o) for o in inst.operands if not o.shape.is_tuple]
        noalias = [all(not _leaf_slice(assignment, inst, index).may_overlap(s)
                       for s in in_slices) for index in indices]
        mark = kernels.mark()
        kernel_team = loop_team(inst, team) if in_loop else team
        if inst.opcode in OWN_KERNELS:  # sort and topk, rng-bit-generator, linalg
            kernel = OWN_KERNELS[inst.opcode](llvm_module, pool, inst, kernel_team)
        elif inst.shape.is_tuple:
            kernel = multi_output.emit_kernel(
                llvm_module, pool, inst, noalias, kernel_team,
                [_reused_operand(assignment, inst, index) for index in indices])
        else:
            in_place = donated.get(id(inst), _reused_operand(assignment, inst))
            kernel = emit_kernel(llvm_module, pool, inst, noalias[0], kernel_team, in_place,
                                 always_in_place=id(inst) not in donated)
        kernel = kernels.unique(kernel, mark)
        kernel_count += 1
        builder.call(kernel, [pointer_of(inst, index) for index in indices]
                     + [pointer_of(o) for o in inst.operands])

    # Outputs whose value lives elsewhere (a parameter, a constant, an earlier output)
    # are copied; after the `add-output-copies` pass the entry has none. A called
    # computation's output may be its parameter's own buffer (a loop's unchanged state).
    for j, (index, shape) in enumerate(leaves(root.shape)):
        value = value_at[(id(root), index)]
        out_slice = _leaf_slice(assignment, value.instruction, value.index)
        if (out_slice.kind == "output" and out_slice.index == j) or not shape.byte_size:
            continue
        destination = builder.load(builder.gep(outputs_arg, [I64(j)], source_etype=PTR), typ=PTR)
        source = pointer_of(value.instruction, value.index)
        control_flow.emit_copy(builder, destination, source, shape.byte_size,
                               maybe_same=out_slice.kind == "parameter")
    builder.ret_void()
    return function, kernel_count


class KernelMerger:
    """The kernels of one LLVM module, each emitted once: a kernel whose code is another's
    is dropped and its launch site calls the other.

    Two kernels are the same when the functions emitted for them print the same text
    once their own names are replaced by their order of definition: the text holds
    everything the code depends on, and leaves out only what a launch site passes (the
    buffers' addresses), so the test is exact (docs/architecture.md, section 4). A kernel
    launched from several sites is `noinline`; `texts` keeps each kept function's
    printed text for `module_split` (printing is a large part of a compile's Python time).
    """

    def __init__(self, module: ir.Module) -> None:
        self.module = module
        self.texts: dict[str, str] = {}
        self.merged = 0  # kernels dropped as copies of an earlier one
        self._by_code: dict[str, ir.Function] = {}

    def mark(self) -> int:
        """Where the module's globals stand before a kernel is emitted."""
        return len(self.module.globals)

    def unique(self, kernel: ir.Function, mark: int) -> ir.Function:
        """`kernel` (emitted since `mark`), or the earlier kernel with the same code, in
        which case the functions emitted since `mark` are removed from the module."""
        emitted = [value for value in itertools.islice(self.module.globals.values(), mark, None)
                   if isinstance(value, ir.Function) and not value.is_declaration]
        if kernel not in emitted:  # not made by this emission: nothing to compare
            return kernel
        texts = [str(function) for function in emitted]
        # llvmlite quotes every global's name (`@"kernel.fusion.3"`), so the references
        # to a function are exactly this string; an unmatched form keeps its name and
        # only makes the kernels look different.
        code = "\n".join(texts)
        for number, function in enumerate(emitted):
            code = code.replace(f'@"{function.name}"', f"@#{number}")
        code = f"{emitted.index(kernel)}\n{code}"
        earlier = self._by_code.get(code)
        if earlier is None:
            self._by_code[code] = kernel
            self.texts.update((f.name, text) for f, text in zip(emitted, texts))
            return kernel
        for function in emitted:  # they reference no global made since `mark` but themselves
            del self.module.globals[function.name]
        self.merged += 1
        # LLVM would inline the launcher at every site and optimize `entry`'s copies
        # again (serial kernels' loops included); called instead, it is optimized once.
        if "noinline" not in earlier.attributes:
            earlier.attributes.add("noinline")
            self.texts[earlier.name] = str(earlier)
        return earlier


def _leaf_slice(assignment: Any, inst: Instruction, index: tuple[int, ...]) -> Any:
    """The slice of `inst`'s leaf at shape `index` (the whole value for `()`)."""
    return assignment.slice_of(inst, index) if index else assignment.slice_of(inst)


def _reused_operand(assignment: Any, inst: Instruction, index: tuple[int, ...] = ()
                    ) -> int | None:
    """The operand whose very buffer the plan has `inst` (its leaf at `index`) write
    (in-place reuse of a dying operand, buffer_assignment.py), so its kernel reads it
    through the output pointer and vectorizes without runtime alias checks; None when
    there is none."""
    out = _leaf_slice(assignment, inst, index)
    for number, operand in enumerate(inst.operands):
        if operand.shape.is_tuple:
            continue
        source = assignment.slice_of(operand)
        if (source.kind, source.index, source.offset) == (out.kind, out.index, out.offset) \
                and out.kind == "temp":
            return number
    return None


def _buffer_pointer(builder: ir.IRBuilder, pool: ConstantPool, assignment: Any,
                    inst: Instruction, params: ir.Value, outputs: ir.Value,
                    temp: ir.Value, index: tuple[int, ...] = ()) -> ir.Value:
    buffer = _leaf_slice(assignment, inst, index)
    if buffer.kind == "parameter":
        slot = builder.gep(params, [I64(buffer.index)], source_etype=PTR)
        return builder.load(slot, typ=PTR, name=f"param.{buffer.index}")
    if buffer.kind == "output":
        slot = builder.gep(outputs, [I64(buffer.index)], source_etype=PTR)
        return builder.load(slot, typ=PTR, name=f"output.{buffer.index}")
    if buffer.kind == "temp":
        return builder.gep(temp, [I64(buffer.offset)], source_etype=I8, name="temp.slice")
    if buffer.kind == "constant":
        return pool.global_for(inst.literal, inst.shape.element_type)
    raise ValueError(f"unknown buffer kind {buffer.kind!r} of %{inst.name}")
