"""Sibling full (and few-row) reductions of a multi-output fusion on many blocks.

`multi-output-fusion` merges reductions over the same elements (sum of squares and max of
x) into one fusion; its phase ran on one block when the reductions were full ones. Now
such a fusion of reductions only, of rows that would split alone (`kernels.splits`: at
most 64 rows of at least 65536 elements), takes the split template with every sibling
folded per chunk in one pass (`kernels._sibling_split`, `extra["siblings"]`). Checked: the
plan, nvcc's PTX, and on the emulator the evaluator's values, the same bits as each
sibling's own split kernel (the pipeline without `multi-output-fusion`) and the same bits
on one block and on three.
"""

from __future__ import annotations

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from gpu_checks import assert_matches
from gpu_modules import finish, new_module
from hlo_builders import flatten, random_arguments

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.codegen.gpu.inspection import why
from tfxla_lite.codegen.gpu.nvcc import check_ptx, find_nvcc
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape

needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")
SEPARATE = "call-inliner,simplify,constant-folding,cse,simplify,dce,fuse,dce," \
    "add-output-copies,schedule"


def siblings(dims: tuple[int, ...], element_type: str = "f32") -> HloModule:
    """sum(x * x) and max(x) over the minor dimension (all of x for a vector)."""
    module, comp = new_module(f"siblings_{'x'.join(map(str, dims))}_{element_type}")
    x = comp.add_parameter(0, Shape(element_type, dims))
    reduced = (len(dims) - 1,)
    square = comp.create("multiply", [x, x])
    total = comp.create("reduce", [square, comp.add_constant(0.0, element_type)],
                        called_computations=[module.reduction_computation("add",
                                                                          element_type)],
                        dimensions=reduced)
    largest = comp.create("reduce", [x, comp.add_constant(float("-inf"), element_type)],
                          called_computations=[module.reduction_computation(
                              "maximum", element_type)], dimensions=reduced)
    finish(comp, [total, largest])
    return module


CASES = [((70001,), "f32"), ((3, 66000), "f32"), ((70001,), "f16")]


@pytest.mark.parametrize(("dims", "element_type"), CASES)
def test_sibling_reductions_plan_a_split(dims: tuple[int, ...], element_type: str) -> None:
    program, _, _ = emit_module(siblings(dims, element_type), verify=True)
    (thunk,) = program.thunks
    plan = thunk.plan
    assert plan.kind == "split-reduction" and len(plan.extra["siblings"]) == 2
    assert len(thunk.functions) == 2 and thunk.functions[0].endswith("_partials")
    rows = 1 if len(dims) == 1 else dims[0]
    assert (plan.rows, plan.width, plan.chunks) == (rows, dims[-1], 5)
    assert program.scratch_bytes == 256 + rows * 5 * 8  # two partial arrays
    assert why(plan).startswith("2 sibling reductions of a multi-output fusion")


def test_short_siblings_keep_the_multi_output_phase() -> None:
    program, _, _ = emit_module(siblings((20480,)))
    assert [t.plan.kind for t in program.thunks] == ["multi-output"]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit)")
def test_sibling_split_compiles_with_nvcc() -> None:
    sources = {f"{dims}{t}": emit_module(siblings(dims, t))[0].source for dims, t in CASES}
    result = check_ptx(sources, "sm_80")
    assert result.ok, result.output[:8000]


@needs_gxx
@pytest.mark.parametrize(("dims", "element_type"), CASES)
def test_sibling_split_on_the_emulator(emulated: fake_cupy.Recorder,
                                       monkeypatch: pytest.MonkeyPatch,
                                       dims: tuple[int, ...], element_type: str) -> None:
    args = random_arguments(siblings(dims, element_type), seed=2)
    expected = flatten(evaluate(siblings(dims, element_type), *args))
    results = []
    for blocks in (1, 3):
        monkeypatch.setattr(cuda_emulator, "MAX_BLOCKS", blocks)
        results.append(compile_module(siblings(dims, element_type), verify=True)
                       .run_numpy(*args))
    assert_matches(results[1], expected, f"siblings {dims} {element_type}")
    alone = compile_module(siblings(dims, element_type), pipeline=SEPARATE)
    assert [t.plan.kind for t in alone.program.thunks] == ["split-reduction"] * 2
    separate = alone.run_numpy(*args)
    for one, three, own in zip(*results, separate, strict=True):
        assert one.tobytes() == three.tobytes() == np.asarray(own).tobytes()
