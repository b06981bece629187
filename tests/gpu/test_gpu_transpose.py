"""Transposes tiled through shared memory (`kernels.transpose_tiling`, the `transpose`
template): which fusions get the tiled kernel, the shape of its CUDA, and its values on
the CPU emulator against the NumPy evaluator (a pure transpose bit for bit).

The nvcc test compiles the same modules (`gpu_modules`' `transpose_*`). Shapes stay small
(a few 32x32 tiles, edge tiles in most): each block runs 256 OS threads on the emulator.
"""

from __future__ import annotations

import re

import cuda_emulator
import fake_cupy
import gpu_modules
import pytest
from gpu_checks import assert_matches
from gpu_modules import MODULES, finish, new_module
from hlo_builders import flatten, random_arguments

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.codegen.gpu.kernels import normalized_transpose, tiling_pays
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.shape import Shape

TILED = sorted(name for name in MODULES if name.startswith("transpose_")
               and name not in ("transpose_minor_kept", "transpose_tiny"))
PURE = ("transpose_2d", "transpose_edges_f16", "transpose_edges_bf16", "transpose_edges_s32",
        "transpose_batched", "transpose_rotate", "transpose_heads_merged")


def _plans(name: str) -> list:
    program, _, _ = emit_module(MODULES[name](), verify=True)
    return [thunk.plan for thunk in program.thunks]


@pytest.mark.parametrize(("dims", "permutation", "expected"), [
    ((64, 96), (1, 0), (1, 64, 96)),
    ((3, 40, 50), (0, 2, 1), (3, 40, 50)),
    ((5, 20, 34), (2, 0, 1), (1, 100, 34)),  # [5*20, 34] -> [34, 5*20]
    ((5, 20, 34), (1, 2, 0), (1, 5, 680)),
    ((40, 1, 70), (2, 1, 0), (1, 40, 70)),  # size-1 dimensions dropped
    ((2, 2, 20, 18), (0, 3, 1, 2), (2, 40, 18)),  # heads merged before the transpose
    ((2, 5, 3, 8), (0, 2, 1, 3), None),  # [b, s, h, d] -> [b, h, s, d]: minor kept
    ((4, 5, 6), (2, 1, 0), None),  # a full reversal is no [A, B, C] -> [A, C, B]
    ((4, 5, 6, 7), (1, 0, 3, 2), None),
])
def test_gpu_transpose_normalized_shape(dims: tuple[int, ...], permutation: tuple[int, ...],
                                        expected: tuple[int, int, int] | None) -> None:
    assert normalized_transpose(dims, permutation) == expected


def test_gpu_transpose_tiling_pays_by_xla_rule() -> None:
    assert tiling_pays(16, 16) and tiling_pays(33, 70)
    assert not tiling_pays(4, 4) and not tiling_pays(20, 10) and not tiling_pays(15, 500)
    assert tiling_pays(8, 1024) and not tiling_pays(8, 1023) and not tiling_pays(7, 4096)


@pytest.mark.parametrize("name", TILED)
def test_gpu_transpose_kernel_kind_tiled(name: str) -> None:
    (plan,) = _plans(name)
    assert plan.kind == "transpose", plan
    a_size, b_size, c_size = plan.extra["tiling"].shape
    assert plan.launch.block == (32, 8)
    assert plan.launch.units == a_size * -(-b_size // 32) * -(-c_size // 32)
    heroes = 2 if "fused" in name else 1
    assert len(plan.extra["tiling"].heroes) == heroes


@pytest.mark.parametrize("name", ["transpose_minor_kept", "transpose_tiny"])
def test_gpu_transpose_stays_a_loop(name: str) -> None:
    """The Transformer's [b, s, h, d] -> [b, h, s, d] reads and writes its minor
    dimension in order; a 4x4 transpose is too small for a tile."""
    assert [plan.kind for plan in _plans(name)] == ["loop"]


def _rotated_sum():  # type: ignore[no-untyped-def]
    """t + t rotated by a row (t = transpose(x)): the fusion reads t at another index
    than the output's, so t's tile element cannot stand for it: a loop kernel."""
    module, comp = new_module("transpose_read_twice")
    x = comp.add_parameter(0, Shape("f32", (40, 64)))
    moved = comp.create("transpose", [x], dimensions=(1, 0))
    rotated = comp.create("concatenate", [
        comp.create("slice", [moved], slice=((1, 64, 1), (0, 40, 1))),
        comp.create("slice", [moved], slice=((0, 1, 1), (0, 40, 1)))], dimensions=(0,))
    finish(comp, [comp.create("add", [moved, rotated])])
    return module


def _reduced_after():  # type: ignore[no-untyped-def]
    """A transpose feeding a reduce: an input fusion, not a transpose kernel."""
    module, comp = new_module("transpose_then_reduce")
    x = comp.add_parameter(0, Shape("f32", (64, 96)))
    moved = comp.create("transpose", [comp.create("multiply", [x, x])], dimensions=(1, 0))
    finish(comp, [gpu_modules.reduce(comp, moved, (1,))])
    return module


def test_gpu_transpose_read_elsewhere_stays_a_loop(emulated: fake_cupy.Recorder) -> None:
    args = random_arguments(_rotated_sum())
    assert_matches(compile_module(_rotated_sum()).run_numpy(*args),
                   flatten(evaluate(_rotated_sum(), *args)), "transpose read twice")
    program, _, _ = emit_module(_rotated_sum(), verify=True)
    assert [t.plan.kind for t in program.thunks] == ["loop"], program.plan_text()
    program, _, _ = emit_module(_reduced_after(), verify=True)
    assert "transpose" not in [t.plan.kind for t in program.thunks], program.plan_text()


def test_gpu_transpose_source_shape() -> None:
    """Shared tiles padded to 33 columns (a column spans 32 banks), reads at consecutive
    c (the operand's minor dimension), writes at consecutive b (the output's), a barrier
    between the phases and one closing each tile."""
    program, _, _ = emit_module(MODULES["transpose_fused_f16"](), verify=True)
    body = program.body
    assert body.count("__shared__ float tile") == 2
    assert re.findall(r"tile\d\[32\]\[(\d+)\]", body) == ["33", "33"]
    assert "const int c = c0 + threadIdx.x;" in body
    assert "const int ob = b0 + threadIdx.x;" in body
    assert re.search(r"lin\d+ = \(a \* 40 \+ b\) \* 17 \+ c;", body)  # [A, B, C] read
    assert re.search(r"lin\d+ = \(a \* 17 \+ oc\) \* 40 \+ ob;", body)  # [A, C, B] written
    assert re.search(r"tile\d\[k\]\[threadIdx.x\] = ", body)
    assert re.search(r"tile\d\[threadIdx.x\]\[k\]", body)
    assert body.count("__syncthreads();") == 2
    assert "__launch_bounds__(256)" in body


def _run(name: str, blocks: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    args = random_arguments(MODULES[name]())
    monkeypatch.setattr(cuda_emulator, "MAX_BLOCKS", blocks)
    executable = compile_module(MODULES[name](), verify=True)
    assert [t.plan.kind for t in executable.program.thunks] == ["transpose"]
    return executable.run_numpy(*args), flatten(evaluate(MODULES[name](), *args))


@pytest.mark.parametrize("name", TILED)
def test_gpu_transpose_emulated_matches_the_evaluator(
        emulated: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Edge tiles, batches, fused producers and consumers, two heroes, f32/f16/bf16/s32:
    the evaluator's values (a pure transpose: its bits), on one block (which strides over
    every tile, reusing the shared tiles) as on two, bit for bit."""
    results, expected = _run(name, 1, monkeypatch)
    if name in PURE:
        for got, want in zip(results, expected, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes(), name
    else:
        assert_matches(results, expected, f"{name} (emulated)")
    again, _ = _run(name, 2, monkeypatch)
    for one, two in zip(results, again, strict=True):
        assert one.tobytes() == two.tobytes()
