"""The kernel plan a GPU cluster's dump and `experimental_get_compiler_ir(stage=
'kernel_plan')` show (`codegen/gpu/inspection.py`): one block per thunk in launch order,
with the launch shape, the rule that chose the template and the CUDA functions launched.
No TF, no CuPy, no GPU: the plans are checked against the planner's own `KernelPlan`s
and the generated CUDA text.
"""

from __future__ import annotations

import re

import gpu_modules
import pytest

from tfxla_lite.codegen.gpu import emit_module
from tfxla_lite.codegen.gpu.inspection import PTX_NOTE, kernel_plan_text

# Modules that together give every template a plan can have but `row-group` (which none
# of the hand-written modules makes: `test_row_groups_name_their_members`).
COVERING = ("binary_f32", "elementwise_vectorized", "row_reduce_short", "row_reduce_warp",
            "row_reduce_block", "reduce_sum_split", "column_reduce", "softmax",
            "multi_output_rows_warp", "loops_apart", "dot_layouts_f32", "dot_epilogue",
            "transpose_batched", "argmax_full_split")
KINDS = {"loop", "transpose", "row-reduction", "split-reduction", "column-reduction",
         "row-fusion", "multi-output", "dot", "dot-epilogue"}
KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(')


def _plan(name: str) -> tuple[object, str]:
    program, assignment, _ = emit_module(gpu_modules.MODULES[name]())
    return program, kernel_plan_text(program, assignment.temp_bytes, "GPU:0", "m.cu")


def _blocks(text: str) -> list[list[str]]:
    """The lines of each thunk's block (from its `#n` line)."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("#"):
            blocks.append([line])
        elif blocks and line.startswith("   "):
            blocks[-1].append(line.strip())
    return blocks


@pytest.mark.parametrize("name", COVERING)
def test_every_thunk_and_cuda_function_is_listed_in_launch_order(name: str) -> None:
    program, text = _plan(name)
    assert text.startswith(f"Kernel plan of {program.module_name} for GPU:0: "
                           f"{len(program.thunks)} thunk(s), {program.kernel_count} launch")
    assert PTX_NOTE.format(cu="m.cu") in text
    blocks = _blocks(text)
    assert len(blocks) == len(program.thunks)
    listed = []
    for number, (block, thunk) in enumerate(zip(blocks, program.thunks)):
        assert block[0].startswith(f"#{number} {thunk.plan.name}: {thunk.plan.kind}")
        assert block[1].startswith("launch: ") and block[2].startswith("why: ")
        functions = block[3].removeprefix("CUDA functions: ")
        if thunk.plan.kind == "dot":
            assert functions == "none (a cuBLAS call)" and "cuBLAS" in block[1]
        else:
            listed += functions.split(", ")
    # Exactly the kernels the CUDA defines, each once, in the order the thunks launch.
    assert listed == program.kernel_names
    assert sorted(listed) == sorted(KERNEL.findall(program.source))


def test_the_plans_cover_every_template_but_row_groups() -> None:
    kinds = {t.plan.kind for name in COVERING for t in _plan(name)[0].thunks}
    assert kinds == KINDS


def _why(name: str, number: int = 0) -> tuple[object, str, str]:
    program, text = _plan(name)
    block = _blocks(text)[number]
    return program.thunks[number].plan, block[1], block[2]


def test_the_launch_line_is_the_plans_geometry() -> None:
    plan, launch, _ = _why("row_reduce_warp")
    assert launch == (f"launch: block={plan.launch.block[0]}x{plan.launch.block[1]} "
                      f"units={plan.launch.units} (rows), {plan.launch.units_per_block} "
                      "per block")
    assert (plan.launch.block, plan.launch.units) == ((32, 8), 300)
    plan, launch, _ = _why("reduce_sum_split")
    assert f"units={plan.rows * plan.chunks} (row chunks)" in launch
    assert f"folds each row's {plan.chunks} partials" in launch


@pytest.mark.parametrize("name, number, says", [
    ("row_reduce_short", 0, "rows of 8 <= 16 elements: one thread folds each row"),
    ("row_reduce_warp", 0, "300 rows of 100 contiguous elements, a warp per row"),
    ("row_reduce_block", 0, "30 rows of 3000 contiguous elements, a block of 256 per row"),
    ("column_reduce", 0, "([0] of [1000, 64]): 64 outputs"),
    ("softmax", 0, "a row fusion of fuse-rows (softmax, layer norm): 64 rows of 1000 "
                   "elements, every reduce folded in order by a block of 256 per row"),
    ("reduce_sum_split", 0, "1 row(s) of 524288 elements"),
    ("elementwise_vectorized", 0, "a float4 variant"),
    ("transpose_batched", 0, "seen as ["),
    ("dot_epilogue", 0, "a dot (f32 batch=1 m=16 n=8 k=32"),
    ("loops_apart", 0, "loop result 1 in a second kernel: not of a reduction's input shape"),
    ("loops_apart", 1, "loop result 1 in a second kernel: reads a reduce of the fusion"),
    ("dot_layouts_f32", 14, "lhs and rhs copied dense first"),
])
def test_why_names_the_rule_and_its_sizes(name: str, number: int, says: str) -> None:
    plan, _, why = _why(name, number)
    assert says in why, why


def test_why_differs_where_the_rule_differs() -> None:
    """Warp rows and block rows, tiled and loop transposes: the text follows the plan,
    not the module's name."""
    assert "a warp per row" in _why("softmax_warp_rows")[2]
    assert "a block of 256 per row" in _why("softmax")[2]
    plan, _, why = _why("transpose_minor_kept")  # [b, s, h, d] -> [b, h, s, d]: a loop
    assert plan.kind == "loop" and "its transpose is not tiled" in why


def test_row_groups_name_their_members() -> None:
    """The stored Transformer training step (test size) has row groups."""
    import gpu_workloads

    from tfxla_lite.hlo import parse_module

    stored = gpu_workloads.corpus().get("quick.transformer_train_b2.0")
    if stored is None:
        pytest.skip("no stored workload modules (tests/gpu/workload_hlo.json)")
    program, assignment, _ = emit_module(parse_module(stored["hlo"]))
    text = kernel_plan_text(program, assignment.temp_bytes)
    groups = [(t.plan, block) for t, block in zip(program.thunks, _blocks(text))
              if t.plan.kind == "row-group"]
    assert groups
    for plan, block in groups:
        members = ", ".join(m.name for m in plan.members)
        assert f"consecutive kernels over the same {plan.rows} rows ({members}) merged" \
            in block[2]
