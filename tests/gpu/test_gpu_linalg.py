"""The GPU kernels of HLO `cholesky` and `triangular-solve` (codegen/gpu/linalg.py): their
CUDA compiles with nvcc, and on the CPU emulator (`cuda_emulator`, through the whole
`GpuExecutable`) their results are the evaluator's: both triangles, batches (none, one,
two dimensions), empty and 1x1 matrices, f32 and f64, a matrix that is not positive
definite (NaN throughout, its neighbours unharmed), junk in the triangle not read, every
side, triangle, transpose and unit-diagonal combination of a solve, and a zero pivot."""

from __future__ import annotations

import itertools

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from gpu_checks import assert_matches
from hlo_builders import flatten

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.codegen.gpu.nvcc import DEFAULT_ARCHES, batch_source, check_ptx, find_nvcc
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")


def _dims(dims: tuple[int, ...]) -> str:
    return ",".join(map(str, dims))


def _cholesky(etype: str, batch: tuple[int, ...], n: int, lower: bool) -> str:
    shape = f"{etype}[{_dims((*batch, n, n))}]"
    return f"""HloModule cholesky
ENTRY %main (a: {shape}) -> {shape} {{
  %a = {shape} parameter(0)
  ROOT %c = {shape} cholesky({shape} %a), lower={str(lower).lower()}
}}
"""


def _solve(etype: str, batch: tuple[int, ...], k: int, other: int, left: bool, lower: bool,
           unit: bool, transpose: str) -> str:
    a = f"{etype}[{_dims((*batch, k, k))}]"
    b = f"{etype}[{_dims((*batch, k, other) if left else (*batch, other, k))}]"
    return f"""HloModule solve
ENTRY %main (a: {a}, b: {b}) -> {b} {{
  %a = {a} parameter(0)
  %b = {b} parameter(1)
  %s = {b} triangular-solve({a} %a, {b} %b), left_side={str(left).lower()},
    lower={str(lower).lower()}, unit_diagonal={str(unit).lower()}, transpose_a={transpose}
  ROOT %twice = {b} add({b} %s, {b} %s)
}}
"""


def _spd(batch: tuple[int, ...], n: int, dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*batch, n, n))
    return (x @ np.swapaxes(x, -1, -2) + n * np.eye(n)).astype(dtype)


CHOLESKY_CASES = [("f32", (), 4, True), ("f32", (3,), 5, False), ("f64", (2, 2), 7, True),
                  ("f64", (), 1, False), ("f32", (2,), 0, True), ("f32", (0,), 3, True)]
SOLVE_CASES = [("f32", (2,), 4, 3, left, lower, unit, transpose)
               for left, lower, unit, transpose in itertools.product(
                   (True, False), (True, False), (False, True),
                   ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"))
               if not (unit and transpose == "ADJOINT")]
SOLVE_CASES += [("f64", (), 6, 5, True, False, False, "TRANSPOSE"),
                ("f64", (3, 2), 3, 1, False, True, True, "NO_TRANSPOSE"),
                ("f32", (), 1, 4, True, True, False, "NO_TRANSPOSE"),
                ("f32", (2,), 0, 3, True, True, False, "NO_TRANSPOSE")]


def _check(text: str, *args: np.ndarray) -> None:
    expected = flatten(evaluate(parse_module(text), *args))
    got = compile_module(parse_module(text), verify=True).run_numpy(*args)
    assert_matches(got, expected, text.splitlines()[-3])


@needs_gxx
@pytest.mark.parametrize(("etype", "batch", "n", "lower"), CHOLESKY_CASES)
def test_gpu_cholesky_matches_the_evaluator(emulated: fake_cupy.Recorder, etype: str,
                                            batch: tuple[int, ...], n: int, lower: bool) -> None:
    a = _spd(batch, n, np.float32 if etype == "f32" else np.float64)
    # Junk in the triangle the factorization does not read.
    junk = np.triu(np.full((n, n), 1e3), 1) if lower else np.tril(np.full((n, n), 1e3), -1)
    _check(_cholesky(etype, batch, n, lower), (a + junk).astype(a.dtype))


@needs_gxx
def test_gpu_cholesky_of_a_matrix_not_positive_definite(emulated: fake_cupy.Recorder) -> None:
    a = _spd((3,), 4, np.float32)
    a[1, 2, 2] = -50.0  # the second matrix fails at its third pivot
    a[1, 3, 2] = a[1, 2, 3] = 0.0
    text = _cholesky("f32", (3,), 4, True)
    got = compile_module(parse_module(text)).run_numpy(a)[0]
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2]]).any()
    _check(text, a)


@needs_gxx
@pytest.mark.parametrize(("etype", "batch", "k", "other", "left", "lower", "unit", "transpose"),
                         SOLVE_CASES)
def test_gpu_triangular_solve_matches_the_evaluator(
        emulated: fake_cupy.Recorder, etype: str, batch: tuple[int, ...], k: int, other: int,
        left: bool, lower: bool, unit: bool, transpose: str) -> None:
    dtype = np.float32 if etype == "f32" else np.float64
    rng = np.random.default_rng(k * 7 + other)
    # Well-conditioned: a strong diagonal; the other triangle holds junk nobody reads.
    a = (rng.standard_normal((*batch, k, k)) + 4 * np.eye(k)).astype(dtype)
    b = rng.standard_normal((*batch, k, other) if left else (*batch, other, k)).astype(dtype)
    _check(_solve(etype, batch, k, other, left, lower, unit, transpose), a, b)


@needs_gxx
def test_gpu_triangular_solve_with_a_zero_pivot(emulated: fake_cupy.Recorder) -> None:
    a = np.tril(np.ones((3, 3), np.float32))
    a[1, 1] = 0.0
    b = np.array([[1, 1], [2, 2], [1, 1]], np.float32)  # x = (1, inf, -inf), doubled
    text = _solve("f32", (), 3, 2, True, True, False, "NO_TRANSPOSE")
    got = compile_module(parse_module(text)).run_numpy(a, b)[0]
    assert got.tolist() == [[2, 2], [np.inf, np.inf], [-np.inf, -np.inf]]
    _check(text, a, b)


def test_gpu_linalg_plans_a_thread_per_matrix_or_right_hand_side() -> None:
    program, _, _ = emit_module(parse_module(_cholesky("f32", (5,), 4, True)))
    (plan,) = [t.plan for t in program.thunks if t.plan.kind == "linalg"]
    assert plan.launch is not None and plan.launch.units == 5
    program, _, _ = emit_module(parse_module(
        _solve("f32", (2,), 4, 3, False, True, False, "NO_TRANSPOSE")))
    (plan,) = [t.plan for t in program.thunks if t.plan.kind == "linalg"]
    assert plan.launch is not None and plan.launch.units == 2 * 3
    assert "__fmul_rn" in program.body  # no FMA contraction the reference lacks


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit)")
def test_gpu_linalg_kernels_compile_with_nvcc() -> None:
    texts = {f"cholesky_{n}": _cholesky(*case) for n, case in enumerate(CHOLESKY_CASES)}
    texts.update({f"solve_{n}": _solve(*case) for n, case in enumerate(SOLVE_CASES)})
    bodies = {name: emit_module(parse_module(text), verify=True)[0].body
              for name, text in texts.items()}
    source = batch_source(bodies, set())
    for arch in DEFAULT_ARCHES:
        result = check_ptx({"batch": source}, arch)
        assert result.ok, f"nvcc -arch={arch}:\n{result.output[:8000]}"
