"""Multi-output kernels store their elementwise results from the reduction loop (issue #7):
each thread that reads an input element for the fold also computes and stores the loop
results at that index, so the inputs are read once and the fusion is one launch.

Plans and CUDA text need nothing; the emulated runs (`cuda_emulator`, through
`fake_cupy`) check the values against the NumPy evaluator and, bit for bit, against
the kernels the pipeline makes without `multi-output-fusion`.
"""

from __future__ import annotations

import re

import cuda_emulator
import fake_cupy
import pytest
from gpu_checks import assert_matches
from gpu_modules import MODULES
from hlo_builders import flatten, random_arguments

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.codegen.gpu.kernels import plan_multi_output

ONE_PASS = sorted(n for n in MODULES if n.startswith("loops_") and n != "loops_apart")
SEPARATE = "call-inliner,simplify,constant-folding,cse,simplify,dce,fuse,dce," \
    "add-output-copies,schedule"
# Folds that read x by 16-byte groups (the width, or the kept minor dimension, a multiple
# of 4 floats or 8 halves): their loop results of x's type are stored by 16-byte vectors.
VECTOR_STORES = {"loops_rows_warp_f32_two": 4, "loops_rows_block_f32_two": 4,
                 "loops_columns_f16_two": 8}
needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")


def _kernel_text(source: str, name: str) -> str:
    return source.split(f" {name}(")[1].split('extern "C"')[0]


@pytest.mark.parametrize("name", ONE_PASS)
def test_gpu_loop_results_are_stored_by_the_reduction_loop(name: str) -> None:
    """One multi-output thunk, one kernel (`_reduce`; before, a second loop kernel read
    the inputs again), and every loop result's pointer is stored inside the fold loop."""
    program, _, _ = emit_module(MODULES[name](), verify=True)
    (thunk,) = program.thunks
    plan = thunk.plan
    assert plan.kind == "multi-output"
    assert thunk.functions == [plan.name + "_reduce"] and program.kernel_count == 1
    assert plan.extra["loops"] == [] and plan.extra["apart"] == {}
    (written,) = plan.extra["phase_loops"].values()
    assert len(written) == (2 if name.endswith("_two") else 1)
    assert "loops in reduction: " in program.plan_text()
    text = _kernel_text(program.source, plan.name + "_reduce")
    loop_outputs = [f"out{n}" for n in written]
    fold = text.split("for (int offset = 16")[0] if "columns" not in name and \
        "middle" not in name else text.split("shared_acc1[ty][tx] =")[0]
    for pointer in loop_outputs:  # element stores, or 16-byte stores of a vector group
        assert re.search(rf"({pointer}\[[^\]]+\] = |tl_store_vector<\d>\({pointer} \+ )",
                         fold), (pointer, text)
        assert ("tl_store_vector" in fold) == (name in VECTOR_STORES)
    # x is read in one place (a vector load's element fallback, or the element load),
    # for the reduces and the loop results alike.
    assert text.count("in0[") == 1, text


def test_gpu_loop_results_the_reduction_loop_cannot_store_keep_the_second_kernel() -> None:
    """A result of the output shape, one reading a reduce of its fusion, and one beside a
    full reduction (one block) stay in the `<name>` loop kernel, and the plan says why."""
    program, _, _ = emit_module(MODULES["loops_apart"](), verify=True)
    reasons = {}
    for thunk in program.thunks:
        plan = thunk.plan
        assert plan.kind == "multi-output"
        assert thunk.functions == [plan.name + "_reduce", plan.name]
        assert plan.extra["phase_loops"] == {} and plan.extra["loops"] == [1]
        reasons[plan.members[0].name] = plan.extra["apart"][1]
    assert reasons == {"first": "not of a reduction's input shape",
                       "second": "reads a reduce of the fusion",
                       "third": "its reduction runs on one block"}
    assert program.kernel_count == 6
    assert "loop 1 apart: reads a reduce of the fusion" in program.plan_text()


def test_gpu_loop_result_written_in_place_of_an_input_keeps_the_second_kernel() -> None:
    """A loop result whose buffer overlaps an input of the kernel (buffer assignment's
    in-place reuse) would overwrite elements other threads of the fold still read: the
    second kernel computes it, after the fold has read everything."""
    program, assignment, _ = emit_module(MODULES["loops_rows_warp_f32"]())
    (thunk,) = program.thunks
    (inst,) = thunk.plan.members
    leaves = list(inst.fused_computation.root.operands)
    (loop,) = thunk.plan.extra["phase_loops"][0]

    class InPlace:
        def slice_of(self, value: object, index: tuple[int, ...] = ()) -> object:
            if value is inst and index == (loop,):
                return assignment.slice_of(inst.operand(0))
            return assignment.slice_of(value, index)

    plan = plan_multi_output(inst, "k", leaves, InPlace())
    assert plan.extra["apart"] == {loop: "written in place of an input"}
    assert plan.extra["loops"] == [loop] and plan.extra["phase_loops"] == {}


@needs_gxx
@pytest.mark.parametrize("name", [*ONE_PASS, "loops_apart"])
def test_gpu_emulated_loop_results_from_the_reduction_loop(
        emulated: fake_cupy.Recorder, name: str) -> None:
    """Emulated: the evaluator's values, and the same bits as the separate kernels of the
    pipeline without `multi-output-fusion` (each reduce folded in its own kernel's order,
    each loop result computed by its own loop)."""
    args = random_arguments(MODULES[name]())
    expected = flatten(evaluate_module(name, args))
    fused = compile_module(MODULES[name](), verify=True)
    cuda_emulator.vector_accesses()
    results = fused.run_numpy(*args)
    assert_matches(results, expected, name)
    _, stores, misaligned = cuda_emulator.vector_accesses()
    elements = MODULES[name]().entry.parameters[0].shape.num_elements
    # Both loop results by 16-byte stores, each element once; none misaligned.
    assert stores == (2 * elements // VECTOR_STORES[name] if name in VECTOR_STORES else 0)
    assert misaligned == 0
    launches = [launch for launch in emulated.launches]
    assert len(launches) == fused.kernel_count
    if name == "loops_apart":
        return
    alone = compile_module(MODULES[name](), pipeline=SEPARATE)
    assert alone.kernel_count >= 3
    for n, (one, other) in enumerate(zip(results, alone.run_numpy(*args), strict=True)):
        assert one.tobytes() == other.tobytes(), (name, n)


@needs_gxx
def test_gpu_emulated_loop_results_do_not_depend_on_the_grid(
        emulated: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Column tiles and block rows on one block (striding over every tile and row) and
    on three: the same bits."""
    for name in ("loops_columns_f16_two", "loops_rows_block_f32_two"):
        args = random_arguments(MODULES[name]())
        results = []
        for blocks in (1, 3):
            monkeypatch.setattr(cuda_emulator, "MAX_BLOCKS", blocks)
            results.append(compile_module(MODULES[name]()).run_numpy(*args))
        for one, three in zip(*results, strict=True):
            assert one.tobytes() == three.tobytes(), name


def evaluate_module(name: str, args: list) -> object:
    from tfxla_lite.hlo.evaluator import evaluate

    return evaluate(MODULES[name](), *args)
