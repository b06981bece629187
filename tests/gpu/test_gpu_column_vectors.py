"""16-byte vector loads in column kernels (column reductions and the column phases of
multi-output kernels; `kernels.column_group`, `columns.fold_columns`): where the kept
minor dimension is a multiple of G (4 floats, 8 halves), each thread folds G consecutive
outputs and reads them from every reduced row with one 16-byte load per 16 bytes. Each
output's fold order is the one of the element-per-thread kernel, so the bits are the
same; the emulator counts the vector loads and those at misaligned addresses.
"""

from __future__ import annotations

import re

import cuda_emulator
import fake_cupy
import pytest
from emulated_runs import assert_same_bits_on_one_and_three_blocks, run_placed
from gpu_checks import assert_matches
from gpu_modules import MODULES
from hlo_builders import flatten, random_arguments

from tfxla_lite.codegen.gpu import compile_module, emit_module, kernels
from tfxla_lite.codegen.gpu.nvcc import check_ptx, find_nvcc
from tfxla_lite.hlo.evaluator import evaluate

# name -> outputs a thread (1: one element per load)
CASES = {"column_vector_sum_f32": 4, "column_vector_sum_f16": 8, "column_vector_max_bf16": 8,
         "column_vector_partial_tile": 4, "column_vector_argmax_f32": 4,
         "column_vector_odd_f32": 1, "multi_output_columns": 4, "loops_columns_f16_two": 8}
needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")


def _column_plan(program: object) -> object:
    (plan,) = [t.plan for t in program.thunks  # type: ignore[attr-defined]
               if t.plan.kind in ("column-reduction", "multi-output")]
    return plan


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_column_kernels_read_by_vector_where_the_minor_dimension_allows(name: str) -> None:
    group = CASES[name]
    program, _, _ = emit_module(MODULES[name](), verify=True)
    plan = _column_plan(program)
    if plan.kind == "column-reduction":
        assert plan.extra["group"] == group
        assert plan.launch.units_per_block == 32 * group
    else:
        assert list(plan.extra["column_groups"].values()) == [group]
    loads = re.findall(r"tl_load_vector<(\d+)>\(in0 \+ first\d+\)", program.body)
    if group == 1:
        assert not loads and "o = base + threadIdx.x;" in program.body
        return
    assert loads == ["4" if group == 4 else "8"]  # x: one load per 16 bytes of a group
    assert re.search(rf"o = base \+ (threadIdx.x|tx) \* {group};", program.body)
    # Shared memory holds 32·G outputs a slice, output e of thread tx at 32·e + tx.
    assert re.search(rf"\[8\]\[{32 * group + 1}\];", program.body)
    assert re.search(rf"\[{32 * (group - 1)} \+ (threadIdx.x|tx)\]", program.body)
    # A parameter: its alignment is tested at run time (element loads otherwise).
    assert "(reinterpret_cast<unsigned long long>(in0) & 15) == 0" in program.body


@needs_gxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_emulated_column_vectors_match_the_evaluator_and_the_element_kernel(
        emulated: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The evaluator's values; every input element loaded by vector once, none from a
    misaligned address; with the parameters 2 bytes off no vector load runs; and the
    same bits as the one-output-a-thread kernel (`column_group` forced to 1)."""
    group = CASES[name]
    args = random_arguments(MODULES[name]())
    expected = flatten(evaluate(MODULES[name](), *args))
    cuda_emulator.vector_accesses()
    aligned = run_placed(name, args)
    assert_matches(aligned, expected, name)
    loads, _, misaligned = cuda_emulator.vector_accesses()
    assert misaligned == 0
    elements = MODULES[name]().entry.parameters[0].shape.num_elements
    lanes = 4 if MODULES[name]().entry.parameters[0].shape.element_type == "f32" else 8
    assert loads == (elements // lanes if group > 1 else 0)
    shifted = run_placed(name, args, misalign=True)
    assert cuda_emulator.vector_accesses()[0] == 0
    monkeypatch.setattr(kernels, "column_group", lambda inst, reduces: 1)
    one = compile_module(MODULES[name](), verify=True)
    assert "tl_load_vector" not in one.program.body
    elementwise = one.run_numpy(*args)
    for a, b, c in zip(aligned, shifted, elementwise, strict=True):
        assert a.tobytes() == b.tobytes() == c.tobytes()


@needs_gxx
def test_gpu_emulated_column_vectors_do_not_depend_on_the_grid(
        emulated: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tiles (128 + 8 outputs) on one block, which strides over both and reuses the
    shared arrays, and on three: the same bits."""
    assert_same_bits_on_one_and_three_blocks("column_vector_partial_tile", monkeypatch)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit)")
def test_gpu_column_vector_loads_are_16_byte_loads_in_ptx() -> None:
    """nvcc (sm_80) turns each `tl_load_vector` of a column kernel into `ld.global.nc.v4`
    and leaves the odd width without one."""
    sources = {name: emit_module(MODULES[name](), verify=True)[0].source for name in CASES}
    result = check_ptx(sources, "sm_80")
    assert result.ok, result.output[:8000]
    for name in CASES:
        vector = re.findall(r"ld\.global(?:\.nc)?\.v4\.\w+", result.ptx[name])
        assert bool(vector) == (CASES[name] > 1), name
