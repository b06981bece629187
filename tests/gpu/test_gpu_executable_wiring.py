"""`GpuExecutable` without a GPU: its Python side against a NumPy stand-in for CuPy.

Kernels do not run (`fake_cupy`), but every launch is checked against the kernel's
parameter list in the generated source, the launch order against the thunk list, and
dots (`fake_cupy`'s model of cuBLAS's strided-batched GEMM, reading the raw pointers,
leading dimensions and strides it is given) against the evaluator: the arena, the
views, the GEMM plans of `gemm.py` and the thunk wiring are exercised for real.
"""

from __future__ import annotations

import fake_cupy
import numpy as np
import pytest
from gpu_modules import MODULES, NOT_RUN
from hlo_builders import flatten, random_arguments

from tfxla_lite.codegen.gpu import compile_module
from tfxla_lite.codegen.gpu.gemm import plan_gemm
from tfxla_lite.hlo.evaluator import evaluate


def _expected_launches(executable: object) -> list[str]:
    names = []
    for thunk in executable.program.thunks:  # type: ignore[attr-defined]
        if thunk.plan.vectorized:
            names.append(thunk.functions[1])  # the fake's arrays are 16-byte aligned
        else:
            names.extend(thunk.functions)
    return names


def _cublas_calls(plan: object) -> int:
    """How many GEMMs a plan's dot makes: an empty product or one with no contracting
    elements is filled without cuBLAS (`gemm.run_gemm`); batch dimensions of no common
    stride are looped over, one GEMM per index."""
    if plan.kind not in ("dot", "dot-epilogue"):  # type: ignore[attr-defined]
        return 0
    dot = plan.extra["dot"] if plan.kind == "dot-epilogue" else plan.members[0]  # type: ignore
    lhs = dot.operand(0).shape
    contracting = 1
    for d in dot.attributes.get("lhs_contracting_dims", ()):
        contracting *= lhs.dims[d]
    if dot.shape.num_elements == 0 or contracting == 0:
        return 0
    return plan_gemm(dot).calls


@pytest.mark.parametrize("name", sorted(set(MODULES) - NOT_RUN))
def test_gpu_executable_launches_every_kernel_as_declared(fake_gpu: fake_cupy.Recorder,
                                                          name: str) -> None:
    executable = compile_module(MODULES[name](), verify=True)
    outputs = executable.run_numpy(*random_arguments(MODULES[name]()))
    assert [launch.name for launch in fake_gpu.launches] == _expected_launches(executable)
    assert len(fake_gpu.gemms) == sum(_cublas_calls(t.plan) for t in executable.program.thunks)
    assert len(outputs) == len(executable.output_shapes)
    for output, shape in zip(outputs, executable.output_shapes, strict=True):
        assert output.shape == shape.dims and output.dtype == shape.numpy_dtype


@pytest.mark.parametrize("name", ["dot", "dot_batched", "dot_f16"])
def test_gpu_library_dots_match_the_evaluator(fake_gpu: fake_cupy.Recorder, name: str) -> None:
    args = random_arguments(MODULES[name]())
    expected = flatten(evaluate(MODULES[name](), *args))
    got = compile_module(MODULES[name]()).run_numpy(*args)
    tolerance = 1e-2 if got[0].dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got[0].astype(np.float64), expected[0].astype(np.float64),
                               rtol=tolerance, atol=tolerance)


def test_gpu_epilogue_reads_the_product_from_scratch(fake_gpu: fake_cupy.Recorder) -> None:
    args = random_arguments(MODULES["dot_epilogue"]())
    executable = compile_module(MODULES["dot_epilogue"]())
    executable.run_numpy(*args)
    (launch,) = fake_gpu.launches
    product = launch.arguments[-1].array
    np.testing.assert_allclose(product, args[0] @ args[1], rtol=1e-5, atol=1e-5)
    # The inputs follow the output, in the kernel's order; the product comes last.
    assert len(launch.arguments) == 1 + len(executable.program.thunks[0].plan.inputs) + 1


def test_gpu_split_reduction_hands_both_kernels_the_scratch(fake_gpu: fake_cupy.Recorder) -> None:
    executable = compile_module(MODULES["reduce_sum_split"]())
    executable.run_numpy(*random_arguments(MODULES["reduce_sum_split"]()))
    partials, final = fake_gpu.launches
    assert partials.grid[0] == executable.program.thunks[0].plan.chunks
    assert final.grid == (1,)
    assert partials.arguments[-1].data.ptr == final.arguments[-1].data.ptr


def test_gpu_temps_live_in_one_arena(fake_gpu: fake_cupy.Recorder) -> None:
    """Kernels reading a temp get a view at the offset buffer assignment chose."""
    executable = compile_module(MODULES["layer_norm"]())
    executable.run_numpy(*random_arguments(MODULES["layer_norm"]()))
    assignment = executable.assignment
    for launch, thunk in zip(fake_gpu.launches, executable.program.thunks, strict=False):
        for (member, index), argument in zip(thunk.plan.outputs, launch.arguments):
            buffer = assignment.slice_of(member, index)
            if buffer.kind == "temp":
                assert argument.data.offset == buffer.offset


@pytest.mark.parametrize("name", ["layer_norm", "dot_epilogue", "reduce_sum_split",
                                  "multi_output_columns"])
def test_gpu_call_works_out_its_buffers_once(fake_gpu: fake_cupy.Recorder,
                                             monkeypatch: pytest.MonkeyPatch,
                                             name: str) -> None:
    """Where each kernel's arrays live is worked out once (at build); calls
    neither ask buffer assignment again nor recompute the plans' operand lists, and
    launch the same kernels with arrays at the same arena offsets."""
    executable = compile_module(MODULES[name]())
    args = random_arguments(MODULES[name]())
    first = executable.run_numpy(*args)
    launches = len(fake_gpu.launches)
    lookups = []
    original = executable.assignment.slice_of
    monkeypatch.setattr(executable.assignment, "slice_of",
                        lambda *a, **k: lookups.append(a) or original(*a, **k))
    again = executable.run_numpy(*args)
    assert lookups == []
    assert [launch.name for launch in fake_gpu.launches[launches:]] == \
        [launch.name for launch in fake_gpu.launches[:launches]]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
