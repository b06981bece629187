"""16-byte vector loads (and row fusions' vector stores) in row kernels
(`codegen/gpu/row_vectors.py`): where the kernel text has them and where not, their
alignment (proven from the buffer plan, tested at run time for parameters, refused for a
misaligned temp), the 16-byte loads in nvcc's PTX, and the values on the CPU emulator
against the NumPy evaluator, with the emulator counting the vector accesses it ran and
those at misaligned addresses.

The nvcc test compiles the same modules (`gpu_modules`' `row_vector_*`).
"""

from __future__ import annotations

import dataclasses
import re

import cuda_emulator
import fake_cupy
import pytest
from emulated_runs import run_placed
from gpu_checks import assert_matches
from gpu_modules import MODULES
from hlo_builders import flatten, random_arguments

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.codegen.gpu.compiler import emit_program
from tfxla_lite.codegen.gpu.nvcc import check_ptx, find_nvcc
from tfxla_lite.hlo.evaluator import evaluate

# name -> (kernel kind, lanes per vector load or None for the element-per-step order)
CASES = {
    "row_vector_sum_f32": ("row-reduction", 4),
    "row_vector_sum_f16": ("row-reduction", 8),
    "row_vector_sum_bf16": ("row-reduction", 8),
    "row_vector_max_block_f32": ("row-reduction", 4),
    "row_vector_sum_odd_f32": ("row-reduction", None),  # 37 columns
    "row_vector_sum_odd_f16": ("row-reduction", None),  # 44 columns: 4 halves over 8
    "row_vector_softmax_f32": ("row-fusion", 4),
    "row_vector_softmax_f16": ("row-fusion", 8),
    "row_vector_softmax_odd_f32": ("row-fusion", None),  # 30 columns
    "row_vector_layer_norm": ("row-fusion", 4),
}


def _kernels(body: str) -> dict[str, str]:
    """Each kernel's text by name."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"__launch_bounds__\(\d+\) (\w+)\(",
                                                           body)]
    ends = [start for start, _ in starts[1:]] + [len(body)]
    return {name: body[start:end] for (start, name), end in zip(starts, ends)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_row_kernels_load_rows_by_vector_where_the_width_allows(name: str) -> None:
    kind, lanes = CASES[name]
    program, _, _ = emit_module(MODULES[name](), verify=True)
    (plan,) = [t.plan for t in program.thunks]
    assert plan.kind == kind
    if lanes is None:
        assert "tl_load_vector" not in program.body
        assert re.search(r"for \(int j\d+ = lane; j\d+ < \d+;", program.body)
        return
    loads = re.findall(r"tl_load_vector<(\d+)>\(in0 \+ first\d+\)", program.body)
    stages = _stages(name)
    assert loads == [str(lanes)] * stages  # one load per stage's group of the row
    # A parameter's alignment is tested at run time, with element loads otherwise.
    assert program.body.count("(reinterpret_cast<unsigned long long>(in0) & 15) == 0") == \
        stages
    # A row fusion's output stage stores by vector too; the output needs no test.
    stores = re.findall(r"tl_store_vector<(\d+)>\(out0 \+ first\d+, ", program.body)
    assert stores == ([str(lanes)] if kind == "row-fusion" else [])
    assert "reinterpret_cast<unsigned long long>(out0)" not in program.body
    assert "tl_vector<" + ("float" if lanes == 4 else name.rsplit("_", 1)[1] == "f16"
                           and "__half" or "__nv_bfloat16") in program.body


def _stages(name: str) -> int:
    """The passes over each row of a row-vector module's kernel: one per reduce, and a
    row fusion's output stage."""
    return 3 if "softmax" in name or "layer_norm" in name else 1


def test_gpu_vector_loads_only_in_row_and_column_kernels() -> None:
    """An elementwise loop and a split reduction of the same f32 buffer keep their
    element loads; the row reduction and the column reduction (256 columns: 4 a thread,
    `test_gpu_column_vectors.py`) read by vector."""
    program, _, _ = emit_module(MODULES["row_vector_mixed"](), verify=True)
    assert sorted(t.plan.kind for t in program.thunks) == [
        "column-reduction", "loop", "row-reduction", "split-reduction"]
    kinds = {name: t.plan.kind for t in program.thunks for name in t.functions}
    texts = _kernels(program.body)
    assert sorted(texts) == sorted(kinds)
    for kernel, text in texts.items():
        assert ("tl_load_vector" in text) == (kinds[kernel] in ("row-reduction",
                                                               "column-reduction")), kernel


def test_gpu_temp_alignment_is_proven_from_the_buffer_plan() -> None:
    """A row reduction of a temp (a dot's product): the arena is 256-byte aligned and the
    temp's offset a multiple of 16, so the load needs no run-time test; at an offset of
    4 bytes the vector load is refused (element loads, same grouped order)."""
    module = MODULES["row_vector_of_product"]()
    program, assignment, _ = emit_module(module, verify=True)  # optimizes `module` in place
    (row,) = [t for t in program.thunks if t.plan.kind == "row-reduction"]
    text = _kernels(program.body)[row.functions[0]]
    product = row.plan.inputs[0]
    assert assignment.slice_of(product).kind == "temp"
    assert assignment.slice_of(product).offset % 16 == 0
    assert re.search(r"const tl_vector<float, 4> vec\d+ = tl_load_vector<4>\(in0 \+", text)
    assert "reinterpret_cast<unsigned long long>" not in text

    class Shifted:
        """The same buffer plan with every temp 4 bytes further into the arena."""

        def __getattr__(self, attribute: str) -> object:
            return getattr(assignment, attribute)

        def slice_of(self, *args: object) -> object:
            found = assignment.slice_of(*args)
            if found.kind != "temp":
                return found
            return dataclasses.replace(found, offset=found.offset + 4)

    shifted_program = emit_program(module, Shifted())
    (row,) = [t for t in shifted_program.thunks if t.plan.kind == "row-reduction"]
    shifted = _kernels(shifted_program.body)[row.functions[0]]
    assert "tl_load_vector" not in shifted
    assert re.search(r"for \(int g\d+ = lane; g\d+ < \d+;", shifted)  # the same order


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_row_vector_kernels_match_the_evaluator(emulated: fake_cupy.Recorder,
                                                    name: str) -> None:
    """The evaluator's values for f32, f16 and bf16, widths with and without a multiple
    of the vector; the same bits whether the parameter is aligned (vector loads) or not
    (element loads: the run-time test refuses the vector), and no vector load ever from
    a misaligned address."""
    _, lanes = CASES[name]
    args = random_arguments(MODULES[name]())
    expected = flatten(evaluate(MODULES[name](), *args))
    cuda_emulator.vector_accesses()
    aligned = run_placed(name, args)
    assert_matches(aligned, expected, f"{name} (emulated)")
    loads, stores, misaligned = cuda_emulator.vector_accesses()
    assert misaligned == 0
    if lanes is None:
        assert loads == stores == 0
        return
    rows, width = MODULES[name]().entry.parameters[0].shape.dims[-2:]
    assert loads == _stages(name) * rows * width // lanes  # every element, by vector, once
    assert stores == (rows * width // lanes if _stages(name) == 3 else 0)
    shifted = run_placed(name, args, misalign=True)
    # in0 is 2 bytes off: its loads go element by element; the output is CuPy's, aligned.
    assert cuda_emulator.vector_accesses() == (0, stores, 0)
    for one, other in zip(aligned, shifted, strict=True):
        assert one.tobytes() == other.tobytes()


def test_gpu_row_vector_of_a_temp_matches_the_evaluator(emulated: fake_cupy.Recorder) -> None:
    """The row reduction of a dot's product (a temp in the arena): vector loads with no
    run-time test (every element of the 8x32 product once), none misaligned."""
    name = "row_vector_of_product"
    args = random_arguments(MODULES[name]())
    expected = flatten(evaluate(MODULES[name](), *args))
    cuda_emulator.vector_accesses()
    assert_matches(compile_module(MODULES[name](), verify=True).run_numpy(*args), expected,
                   name)
    assert cuda_emulator.vector_accesses() == (8 * 32 // 4, 0, 0)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit)")
def test_gpu_row_vector_loads_are_16_byte_loads_in_ptx() -> None:
    """nvcc compiles each row-vector module alone, with no warning, and its row kernel
    loads 16 bytes per instruction (`ld.global.nc.v4`) exactly where the text has
    `tl_load_vector` (the f32 kernels as 4 floats, the f16/bf16 ones as 4 words), and a
    row fusion's output stage stores 16 bytes per instruction (`st.global.v4`)."""
    sources = {name: emit_module(MODULES[name](), verify=True)[0].source
               for name in [*sorted(CASES), "row_vector_of_product"]}
    result = check_ptx(sources, "sm_80")
    assert result.ok, result.output[:8000]
    for name, source in sources.items():
        vector = re.findall(r"ld\.global(?:\.nc)?\.v4\.\w+", result.ptx[name])
        stores = re.findall(r"st\.global\.v4\.\w+", result.ptx[name])
        kind, lanes = CASES.get(name, ("row-reduction", 4))
        if lanes is None:
            assert not vector and not stores, name
        else:
            assert vector, name
            assert "tl_load_vector" in source
            assert bool(stores) == (kind == "row-fusion"), name
