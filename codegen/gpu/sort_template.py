"""The CUDA text of the `sort` and `topk` kernels (`sort.py` plans them and says how they
work): `emit_sort`, the template of both plan kinds.
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.cuda_source import (
    Writer,
    compute_type,
    is_float,
    load,
    storage_type,
)
from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.sort import INT_INDEX_LIMIT, sort_scratch_bytes
from tfxla_lite.codegen.gpu.templates import KernelSource, _header, _output_names, _signature
from tfxla_lite.hlo.ir import Instruction


def emit_sort(plan: KernelPlan, assignment: Any, tables: Any) -> KernelSource:
    """The CUDA text of a `sort` or `topk` plan."""
    (inst,) = plan.members
    scratch = sort_scratch_bytes(plan) > 0
    params, names = _signature(plan, assignment, scratch=scratch)
    inputs = [names[id(o)] for o in inst.operands]
    outputs = _output_names(inst, names)
    sizes = [inst.operand(0).shape.num_elements, *(s.num_elements for s in (
        inst.shape.tuple_shapes or (inst.shape,)))]
    idx = "int" if max(sizes) < INT_INDEX_LIMIT else "long long"
    w = Writer()
    assert plan.launch is not None
    w.open(_header(plan.name, params, plan.launch.block[0]))
    if plan.kind == "topk":
        _topk_body(w, inst, plan, inputs, outputs, idx)
    else:
        _sort_body(w, inst, plan, inputs, outputs, idx, tables)
    w.close()
    return KernelSource(plan, [plan.name], w.text())


def _sort_body(w: Writer, inst: Instruction, plan: KernelPlan, inputs: list[str],
               outputs: list[str], idx: str, tables: Any) -> None:
    n, rows = plan.width, plan.rows
    if not rows or n == 0:
        return
    dims = inst.operand(0).shape.dims
    inner = 1
    for size in dims[plan.extra["dimension"] + 1:]:
        inner *= size
    if sort_scratch_bytes(plan):
        w.line(f"int* const order = static_cast<int*>(scratch) + (long long)blockIdx.x * "
               f"{2 * n};")
    else:
        w.line(f"__shared__ int order[{2 * n}];")
    comparator = tables.function_of(inst.called_computations[0])
    types = [o.shape.element_type for o in inst.operands]

    def at(element: str) -> str:
        return f"base + ({idx}){element}" + (f" * {inner}" if inner != 1 else "")

    w.open(f"for ({idx} row = blockIdx.x; row < {rows}; row += gridDim.x)")
    if inner == 1:
        w.line(f"const {idx} base = row * {n};")
    else:
        w.line(f"const {idx} base = row / {inner} * {n * inner} + row % {inner};")
    w.line("int* from = order;")
    w.line(f"int* to = order + {n};")
    w.line(f"for (int e = threadIdx.x; e < {n}; e += blockDim.x) from[e] = e;")
    w.line("__syncthreads();")
    # The passes of merge_sort_order: pairs of runs of `width`, one thread a pair.
    w.open(f"for (long long width = 1; width < {n}; width *= 2)")
    w.open(f"for (long long low = threadIdx.x * 2 * width; low < {n}; "
           "low += blockDim.x * 2 * width)")
    w.line(f"const int middle = (int)min(low + width, {n}LL);")
    w.line(f"const int high = (int)min(low + 2 * width, {n}LL);")
    w.line("int i = (int)low, j = middle, k = (int)low;")
    w.open("while (i < middle && j < high)")
    w.line("const int left = from[i], right = from[j];")
    args = []
    for pointer, element_type in zip(inputs, types):
        args.append(load(element_type, pointer, at("right")))
        args.append(load(element_type, pointer, at("left")))
    w.line(f"const bool take_right = {comparator}({', '.join(args)});")
    w.line("to[k++] = take_right ? right : left;")
    w.line("if (take_right) ++j; else ++i;")
    w.close()
    w.line("while (i < middle) to[k++] = from[i++];")
    w.line("while (j < high) to[k++] = from[j++];")
    w.close()
    w.line("__syncthreads();")
    w.line("int* const merged = to;")
    w.line("to = from;")
    w.line("from = merged;")
    w.close()
    # Every operand's row permuted alike, copied in its storage type (bits kept).
    w.open(f"for (int p = threadIdx.x; p < {n}; p += blockDim.x)")
    w.line(f"const {idx} source = {at('from[p]')};")
    w.line(f"const {idx} target = {at('p')};")
    for output, pointer in zip(outputs, inputs):
        w.line(f"{output}[target] = {pointer}[source];")
    w.close()
    w.line("__syncthreads();  // the index arrays serve the next row")
    w.close()


def _topk_body(w: Writer, inst: Instruction, plan: KernelPlan, inputs: list[str],
               outputs: list[str], idx: str) -> None:
    n, rows, k = plan.width, plan.rows, plan.extra["k"]
    if not rows or not k:
        return
    element_type = inst.operand(0).shape.element_type
    largest = bool(inst.attributes.get("largest", True))
    c_type = compute_type(element_type)
    (x,) = inputs
    values, indices = outputs

    def better(a: str, b: str) -> str:
        """Whether value `a` ranks strictly above value `b` (NaN above numbers for
        largest, below them otherwise)."""
        ahead = ">" if largest else "<"
        if not is_float(element_type):
            return f"({a} {ahead} {b})"
        nan_wins = f"({a} != {a} && {b} == {b})" if largest else f"({b} != {b} && {a} == {a})"
        return f"({a} {ahead} {b} || {nan_wins})"

    team = plan.team
    if team:
        w.line(f"__shared__ {storage_type(element_type)} tk_values[2][{team * k}];")
        w.line(f"__shared__ int tk_indices[2][{team * k}];")
        w.line(f"__shared__ int tk_count[2][{team}];")
        w.open(f"for ({idx} row = blockIdx.x; row < {rows}; row += gridDim.x)")
        w.line(f"const {idx} in_base = row * {n};")
        w.line(f"const {idx} out_base = row * {k};")
        w.line(f"{storage_type(element_type)}* const best = tk_values[0] + threadIdx.x * {k};")
        w.line(f"int* const best_index = tk_indices[0] + threadIdx.x * {k};")
        _stream(w, element_type, c_type, k, x, "best", "best_index", "0",
                f"for (int j = threadIdx.x; j < {n}; j += {team})", better)
        w.line("tk_count[0][threadIdx.x] = filled;")
        w.line("__syncthreads();")
        # Merge the buffers pairwise: after the round of `step`, thread t (a multiple of
        # 2 step) holds the k best of threads t .. t + 2 step - 1.
        w.line("int from = 0;")
        w.open(f"for (int step = 1; step < {team}; step *= 2)")
        w.open("if (threadIdx.x % (2 * step) == 0)")
        w.line(f"const int a = threadIdx.x * {k}, b = (threadIdx.x + step) * {k};")
        w.line("const int a_count = tk_count[from][threadIdx.x];")
        w.line("const int b_count = tk_count[from][threadIdx.x + step];")
        w.line(f"const int count = min(a_count + b_count, {k});")
        w.line("int i = 0, j = 0;")
        w.open("for (int e = 0; e < count; ++e)")
        w.line("bool take_b = i == a_count;")
        w.open("if (!take_b && j < b_count)")
        w.line(f"const {c_type} va = {load(element_type, 'tk_values[from]', 'a + i')};")
        w.line(f"const {c_type} vb = {load(element_type, 'tk_values[from]', 'b + j')};")
        # topk's total order: by value, then the lower index first.
        w.line(f"take_b = {better('vb', 'va')} || (!{better('va', 'vb')} && "
               "tk_indices[from][b + j] < tk_indices[from][a + i]);")
        w.close()
        w.line("const int pick = take_b ? b + j++ : a + i++;")
        w.line("tk_values[1 - from][a + e] = tk_values[from][pick];")
        w.line("tk_indices[1 - from][a + e] = tk_indices[from][pick];")
        w.close()
        w.line("tk_count[1 - from][threadIdx.x] = count;")
        w.close()
        w.line("from = 1 - from;")
        w.line("__syncthreads();")
        w.close()
        w.open(f"for (int p = threadIdx.x; p < {k}; p += {team})")
        w.line(f"{values}[out_base + p] = tk_values[from][p];")
        w.line(f"{indices}[out_base + p] = tk_indices[from][p];")
        w.close()
        w.line("__syncthreads();  // the buffers serve the next row")
        w.close()
        return
    w.open(f"for ({idx} row = blockIdx.x * blockDim.x + threadIdx.x; row < {rows}; "
           "row += gridDim.x * blockDim.x)")
    w.line(f"const {idx} in_base = row * {n};")
    w.line(f"const {idx} out_base = row * {k};")
    _stream(w, element_type, c_type, k, x, values, indices, "out_base",
            f"for (int j = 0; j < {n}; ++j)", better)
    w.close()


def _stream(w: Writer, element_type: str, c_type: str, k: int, x: str, values: str,
            indices: str, base: str, loop: str, better) -> None:
    """Stream the elements `loop` visits (`j`) into the buffer of the k best at
    `values`/`indices` + `base`, best first; leaves `filled`, the buffer's count."""
    w.line("int filled = 0;")
    w.open(loop)
    w.line(f"const {c_type} v = {load(element_type, x, 'in_base + j')};")
    w.open(f"if (filled == {k})")
    w.line(f"const {c_type} c = {load(element_type, values, f'{base} + {k - 1}')};")
    w.line(f"if (!{better('v', 'c')}) continue;")
    w.close()
    w.line(f"int at = filled == {k} ? {k - 1} : filled;")
    # Shift the worse ones down while v beats the one above.
    w.open("while (at > 0)")
    w.line(f"const {c_type} c = {load(element_type, values, f'{base} + at - 1')};")
    w.line(f"if (!{better('v', 'c')}) break;")
    w.line(f"{values}[{base} + at] = {values}[{base} + at - 1];")
    w.line(f"{indices}[{base} + at] = {indices}[{base} + at - 1];")
    w.line("--at;")
    w.close()
    w.line(f"{values}[{base} + at] = {x}[in_base + j];")
    w.line(f"{indices}[{base} + at] = j;")
    w.line(f"if (filled < {k}) ++filled;")
    w.close()


__all__ = ["emit_sort"]
