"""What dumps, `experimental_get_compiler_ir` and the HTML report show of a GPU program.

Where it sits: after `compiler.emit_program` (the CUDA text and thunk list) and
`GpuExecutable.build`; read by `tfxla_lite/dump.py` (the `.cu` and `.kernel-plan.txt`
files of a GPU cluster), by `tfxla_lite/program.py` (`Program.compiler_ir`: stages
'cuda' and 'kernel_plan') and by the report. Pure Python: no CuPy, no GPU.

The kernel plan says, per thunk in launch order, what `kernels.describe` says (name,
template, members, geometry), then the launch shape in full (threads per block, work
units, units per block, how the grid follows), why this template was chosen (the rule
of `kernels.plan_instruction` that decided it, with the sizes it compared), and the
CUDA functions the thunk launches. PTX is not part of it: making it is one more CUDA
compile per cluster (NVRTC needs CuPy, nvcc a CUDA toolkit), so a dump says how to get
it instead (`PTX_NOTE`).
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.kernels import (
    LOOP_ROW_MAX,
    SPLIT_MAX_ROWS,
    SPLIT_MIN,
    TILED_MIN_ELEMENTS,
    TILED_MIN_SIDE,
    TILED_MIN_SIDE_SMALL,
    WARP,
    WARP_ROW_MAX,
    describe,
    is_row_reduction,
    kernel_body,
)
from tfxla_lite.codegen.gpu.lt_epilogue import describe as describe_lt

# The stages of a GPU cluster in `experimental_get_compiler_ir`, in pipeline order.
STAGES = ("hlo", "optimized_hlo", "buffer_assignment", "cuda", "kernel_plan")

PTX_NOTE = ("PTX: not written (it would take one more CUDA compile of the module per "
            "cluster: NVRTC needs CuPy, nvcc a CUDA toolkit). To make it from the dumped "
            "source: nvcc -ptx -arch=sm_80 --std=c++17 {cu}")


def kernel_plan_text(program: Any, temp_bytes: int, device: str = "GPU",
                     cu_name: str = "<module>.cu") -> str:
    """The kernel plan of `program` (a `GpuProgram`) as text: a header, then one block
    per thunk in launch order."""
    thunks = program.thunks
    lines = [f"Kernel plan of {program.module_name} for {device}: {len(thunks)} thunk(s), "
             f"{program.kernel_count} launch(es) per run (library calls included)",
             f"temp arena {temp_bytes} bytes (buffer assignment), scratch "
             f"{program.scratch_bytes} bytes after it (split-reduction partials; cuBLAS "
             "epilogue products and copied dot operands are added at build)",
             "grid = min(ceil(units / units per block), 32 blocks per multiprocessor); "
             "every kernel strides over its units, so any grid is correct",
             PTX_NOTE.format(cu=cu_name), ""]
    for number, thunk in enumerate(thunks):
        plan = thunk.plan
        lines.append(f"#{number} {describe([plan]).rstrip()}")
        lines.append(f"   launch: {launch_text(plan)}")
        lines.append(f"   why: {why(plan)}")
        functions = ", ".join(thunk.functions) or "none (a cuBLAS call)"
        lines.append(f"   CUDA functions: {functions}")
    return "\n".join(lines) + "\n"


def launch_text(plan: KernelPlan) -> str:
    """Threads per block and work units of every kernel a plan launches."""
    if plan.kind == "dot":
        return "cuBLAS (no generated kernel)"
    parts = []
    if plan.kind == "multi-output":
        reduce_launch = plan.extra["reduce_launch"]
        if plan.extra["reduces"]:
            parts.append(f"{plan.name}_reduce block={reduce_launch.block[0]}x"
                         f"{reduce_launch.block[1]} units={reduce_launch.units} blocks")
        if plan.extra["loops"]:
            parts.append(f"{plan.name} block={plan.launch.block[0]} units="
                         f"{plan.launch.units} elements, {plan.launch.units_per_block} "
                         "per block")
        return "; ".join(parts)
    launch = plan.launch
    assert launch is not None
    text = (f"block={launch.block[0]}x{launch.block[1]} units={launch.units} "
            f"({_unit(plan)}), {launch.units_per_block} per block")
    if plan.kind == "split-reduction":
        text += (f"; then {plan.name} folds each row's {plan.chunks} partials, a block of "
                 f"256 per row ({plan.rows} blocks)")
    if plan.kind == "dot-epilogue":
        text = "cuBLAS product to scratch; then " + text
        if not isinstance(plan.extra.get("lt", ""), str):
            text = "one cublasLtMatmul (no generated kernel); fallback: " + text
    return text


def _unit(plan: KernelPlan) -> str:
    return {"loop": "elements", "dot-epilogue": "elements", "transpose": "32x32 tiles",
            "row-reduction": "rows", "row-fusion": "rows", "row-group": "rows",
            "split-reduction": "row chunks", "column-reduction": "outputs",
            "sort": "rows", "topk": "rows", "linalg": "matrices or right-hand sides",
            "random": "counters"
            }.get(plan.kind, "units")


def _team(plan: KernelPlan) -> str:
    if plan.team == WARP:
        return f"a warp per row (rows of {plan.width} <= {WARP_ROW_MAX} elements)"
    return (f"a block of {plan.team} per row (rows of {plan.width} > {WARP_ROW_MAX} "
            f"elements{'; 512 from 16384' if plan.team == 512 else ''})")


def why(plan: KernelPlan) -> str:
    """The rule that gave `plan` its template, with the sizes it compared."""
    inst = plan.members[0]
    kind = plan.kind
    if kind == "dot":
        return _why_dot(inst)
    if kind == "dot-epilogue":
        dot = plan.extra["dot"]
        lt = plan.extra.get("lt", "not planned")
        unfused = ("cuBLAS writes the product to scratch, one loop kernel applies the "
                   "epilogue reading it once per element")
        head = f"a dot ({_gemm_text(dot)}) with an elementwise epilogue (kOutput fusion): "
        if isinstance(lt, str):
            return f"{head}{unfused}; {describe_lt(lt)}"
        return f"{head}{describe_lt(lt)}; fallback: {unfused}"
    if kind == "row-fusion":
        return (f"a row fusion of fuse-rows (softmax, layer norm): {plan.rows} rows of "
                f"{plan.width} elements, every reduce folded in order by {_team(plan)}; "
                "wide values between stages recomputed, not stored")
    if kind == "row-group":
        members = ", ".join(m.name for m in plan.members)
        return (f"consecutive kernels over the same {plan.rows} rows ({members}) merged "
                f"into one team per row, {_team(plan)}; each member stores its result "
                "and later ones read it back after the team synchronizes")
    if kind == "multi-output":
        extra = plan.extra
        if not extra["reduces"]:
            return ("a multi-output fusion of loop results only: one loop kernel computes "
                    f"all {len(extra['loops'])} at an index before storing any")
        text = (f"a multi-output fusion: {len(extra['reduces'])} reduce result(s) folded in "
                f"{len(extra['column_groups'])} phase(s) of one kernel (siblings over the "
                "same elements share one pass)")
        written = sorted(n for loops in extra["phase_loops"].values() for n in loops)
        if written:
            text += f"; loop results {written} stored by the reduction loop"
        for n, reason in sorted(extra["apart"].items()):
            text += f"; loop result {n} in a second kernel: {reason}"
        return text
    if kind == "split-reduction":
        siblings = plan.extra.get("siblings")
        what = "" if not siblings else (
            f"{len(siblings)} sibling reductions of a multi-output fusion, folded together "
            "(each in its own split kernel's order), over ")
        return (f"{what}{plan.rows} row(s) of {plan.width} elements: at least {SPLIT_MIN} "
                f"elements and at most {SPLIT_MAX_ROWS} rows, too few rows to fill a GPU "
                f"with a block each, so {plan.chunks} chunk(s) of {plan.chunk} elements a "
                "row fold into partials, then a second kernel folds each row's partials "
                "in chunk order")
    if kind == "sort":
        where = "scratch memory" if plan.extra["blocks"] else "shared memory"
        return (f"a sort of {plan.rows} row(s) of {plan.width} elements: a block of "
                f"{plan.team} per row merges a permutation of it in {where}, pairs of runs "
                "of 1, 2, 4... one thread a pair (the evaluator's merge order)")
    if kind == "topk":
        head = f"a topk (k={plan.extra['k']}) of {plan.rows} row(s) of {plan.width} elements: "
        if plan.team:
            return (head + f"a block of {plan.team} per row, each thread streams a strided "
                    "slice into its k best in shared memory, then the block merges them")
        return head + "one thread per row streams it into its k best (k too large for shared)"
    if kind == "linalg":
        per = "matrix" if inst.opcode == "cholesky" else "right-hand side"
        return (f"a {inst.opcode} of {plan.rows} independent {per}(s): one thread each "
                "substitutes in the reference's order (codegen/gpu/linalg.py)")
    if kind == "random":
        return (f"an rng-bit-generator ({inst.attributes.get('algorithm', 'rng_default')}): "
                f"one thread per counter, {plan.rows} of them, hashes it and writes the "
                "elements it gives (codegen/gpu/random_bits.py)")
    root, computed = kernel_body(inst)
    if kind == "row-reduction":
        variadic = " (variadic: values and indices)" if root.shape.is_tuple else ""
        return (f"a reduce{variadic} whose reduced dimensions are innermost: {plan.rows} "
                f"rows of {plan.width} contiguous elements, {_team(plan)}; rows are read "
                "by 16-byte vector loads where the width allows (tl_load_vector in the "
                "CUDA)")
    if kind == "column-reduction":
        group = plan.extra.get("group", 1)
        reads = (f"{group} consecutive outputs a thread, read by 16-byte vector loads"
                 if group > 1 else "one output a thread (the kept minor dimension does "
                 "not allow 16-byte vector loads)")
        return (f"a reduce whose reduced dimensions are not all innermost "
                f"({list(root.dimensions)} of {list(root.operand(0).shape.dims)}): "
                f"{plan.rows} outputs, 32 x {group} outputs and 8 slices of the reduced "
                f"elements per block, combined in shared memory in a fixed order; {reads}")
    if kind == "transpose":
        tiling = plan.extra["tiling"]
        a, b, c = tiling.shape
        heroes = ", ".join(h.name for h in tiling.heroes)
        return (f"transposes moving the minor dimension ({heroes}), seen as [{a}, {b}, {c}] "
                f"-> [{a}, {c}, {b}]: both swapped sides >= {TILED_MIN_SIDE}, or >= "
                f"{TILED_MIN_SIDE_SMALL} with >= {TILED_MIN_ELEMENTS} elements (XLA's rule), "
                "so 32x32 tiles go through shared memory, read and written coalesced")
    return _why_loop(plan, root, computed)


def _why_loop(plan: KernelPlan, root: Any, computed: list[Any]) -> str:
    if root.opcode == "reduce" and is_row_reduction(root):
        width = root.operand(0).shape.num_elements // max(root.shape.num_elements, 1)
        return (f"a row reduction of rows of {width} <= {LOOP_ROW_MAX} elements: one "
                "thread folds each row")
    text = (f"elementwise work and data movement: one thread per output element "
            f"({plan.members[0].shape.num_elements}), grid-stride")
    if any(i.opcode == "transpose" for i in computed):
        text += ("; its transpose is not tiled (too small for XLA's rule, the minor "
                 "dimension kept, read at another index than the output's, or a full "
                 "reversal)")
    if plan.vectorized:
        text += (f"; a float4 variant {plan.name}_v4 (flat f32, a size divisible by 4) "
                 "runs when every pointer is 16-byte aligned")
    return text


def _gemm_text(dot: Any) -> str:
    from tfxla_lite.codegen.gpu.gemm import plan_gemm

    try:
        gemm = plan_gemm(dot)
    except NotImplementedError as error:
        return str(error)
    copies = [side for side, operand in (("lhs", gemm.lhs), ("rhs", gemm.rhs))
              if operand.copy_order is not None]
    text = f"{gemm.element_type} batch={gemm.batch} m={gemm.m} n={gemm.n} k={gemm.k}"
    text += "".join(f" {side}={'T' if o.transpose else 'N'}(ld={o.ld})"
                    for side, o in (("lhs", gemm.lhs), ("rhs", gemm.rhs)))
    if gemm.outer:
        text += f", looped over batch {list(gemm.outer)} in Python"
    if copies:
        text += f", {' and '.join(copies)} copied dense first"
    return text


def _why_dot(inst: Any) -> str:
    return (f"a library dot: cuBLAS's strided-batched GEMM ({_gemm_text(inst)}); operands "
            "not said to be copied are read where they lie")


__all__ = ["PTX_NOTE", "STAGES", "kernel_plan_text", "launch_text", "why"]
