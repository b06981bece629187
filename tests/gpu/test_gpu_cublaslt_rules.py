"""The rules the cuBLASLt binding (`codegen/gpu/cublaslt.py`) keeps from public sources,
without a GPU, on `fake_cublaslt`'s model of the library (docs/gpu.md, "cuBLASLt: the
facts the binding relies on", gives each rule's source).

- The heuristic picks its algorithm for the bias pointer the descriptor holds (cublasLt.h),
  so an algorithm found for one bias alignment is not reused for a less aligned bias.
- A bias less than 16 bytes aligned runs unfused (Marian, llm.c: misaligned-address
  failures below that).
- The workspace must be 256-byte aligned (cuBLAS's documentation of cublasLtMatmul): a
  misaligned one is refused before the call, so it does not poison the algorithm cache.
- A GEMM with a dimension of 1 is refused by the heuristic (PyTorch's observation): the
  call runs unfused.
- PyTorch's pre-12.1 limits (dimensions below 65535 * 32; 16-bit operands dense) are kept
  for every version (`cublaslt.refusal`).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import fake_cupy
import numpy as np
from gpu_checks import assert_matches
from hlo_builders import flatten, random_arguments
from test_gpu_cublaslt import HEADS, epilogue_module

from tfxla_lite.codegen.gpu import compile_module, cublaslt
from tfxla_lite.codegen.gpu.gemm import plan_gemm
from tfxla_lite.hlo.evaluator import evaluate


def _placed(array: np.ndarray, shift: int) -> fake_cupy.FakeArray:
    """`array` on the fake device, `shift` bytes after a 256-byte boundary."""
    raw = fake_cupy._aligned_zeros((array.nbytes + shift,), np.uint8)
    view = raw[shift:shift + array.nbytes].view(array.dtype).reshape(array.shape)
    view[...] = array
    return fake_cupy.FakeArray(view, raw, shift)


def _run_placed(executable: Any, args: list[np.ndarray],
                shifts: tuple[int, ...]) -> list[np.ndarray]:
    inputs = [_placed(a, s) for a, s in zip(args, shifts, strict=True)]
    return [np.asarray(o.array) for o in executable.run_checked(sys.modules["cupy"], inputs)]


def _matmul(executable: Any) -> cublaslt.LtMatmul:
    return executable._calls_plan[0][3][0]  # noqa: SLF001 - the fusion's cuBLASLt call


def test_an_algorithm_is_not_reused_for_a_less_aligned_bias(
        fake_gpu: fake_cupy.Recorder, fake_lt: Any) -> None:
    """Both calls' pointers are 16-byte aligned at least; the first has a 256-byte aligned
    bias, the second a 16-byte aligned one: the heuristic is asked again, and both run
    fused with the evaluator's values (an algorithm reused for the second bias is one the
    model refuses, and the fake GPU does not run the fallback's loop kernel)."""
    args = random_arguments(epilogue_module("bias_relu"), seed=7)
    expected = flatten(evaluate(epilogue_module("bias_relu"), *args))
    executable = compile_module(epilogue_module("bias_relu"))
    for shifts in ((16, 0, 0), (0, 0, 16)):
        assert_matches(_run_placed(executable, args, shifts), expected, f"shifts {shifts}")
    matmul = _matmul(executable)
    assert len(fake_lt.calls) == 2 and matmul.failures == [] and matmul.refused == 0
    assert fake_lt.heuristic_queries == 2


def test_a_bias_less_than_16_bytes_aligned_runs_unfused(fake_gpu: fake_cupy.Recorder,
                                                        fake_lt: Any) -> None:
    """An f32 bias 8 bytes off a boundary: cuBLASLt is not called (the model records a
    misaligned-address fault when it is), the cuBLAS product and the loop kernel run."""
    executable = compile_module(epilogue_module("bias"))
    _run_placed(executable, random_arguments(epilogue_module("bias")), (0, 0, 8))
    assert fake_lt.calls == [] and fake_lt.heuristic_queries == 0
    assert _matmul(executable).refused == 1
    assert len(fake_gpu.gemms) == 1 and len(fake_gpu.launches) == 1


def test_a_misaligned_workspace_is_refused_before_the_call(fake_gpu: fake_cupy.Recorder,
                                                          fake_lt: Any) -> None:
    """A workspace 128 bytes off a 256-byte boundary: refused without calling cuBLASLt,
    so a later call with an aligned workspace still finds its algorithm."""
    executable = compile_module(epilogue_module("relu"))
    matmul = _matmul(executable)
    rng = np.random.default_rng(2)
    lhs, rhs = (_placed(rng.standard_normal(dims).astype(np.float32), 0)
                for dims in ((6, 5), (5, 7)))
    out = _placed(np.zeros((6, 7), np.float32), 0)
    workspace = _placed(np.zeros(cublaslt.WORKSPACE_BYTES + 256, np.uint8), 0)
    pointers = [int(x.data.ptr) for x in (lhs, rhs, out, workspace)]
    assert not matmul.run(*pointers[:3], None, pointers[3] + 128, 0)
    assert fake_lt.calls == []
    assert matmul.run(*pointers[:3], None, pointers[3], 0)
    np.testing.assert_allclose(out.array, np.maximum(lhs.array @ rhs.array, 0), rtol=1e-5)
    assert matmul.failures == []


def test_one_row_products_are_refused_by_the_heuristic(fake_gpu: fake_cupy.Recorder,
                                                       fake_lt: Any) -> None:
    """m = 1 (one row of activations): the heuristic answers INVALID_VALUE, the call runs
    cuBLAS + the loop kernel, and the status is kept; asked once, not per call."""
    executable = compile_module(epilogue_module("bias_relu", lhs=(1, 5), rhs=(5, 7)))
    args = random_arguments(epilogue_module("bias_relu", lhs=(1, 5), rhs=(5, 7)))
    for _ in range(2):  # placed as CuPy places them: the same alignment both times
        _run_placed(executable, args, (0, 0, 0))
    matmul = _matmul(executable)
    assert fake_lt.calls == [] and matmul.refused == 2 and fake_lt.heuristic_queries == 1
    assert matmul.failures == ["cublasLtMatmulAlgoGetHeuristic: cublasStatus_t 7"]
    assert len(fake_gpu.gemms) == 2 and len(fake_gpu.launches) == 2


def test_16_bit_operands_read_with_a_long_leading_dimension_run_unfused(
        fake_gpu: fake_cupy.Recorder, fake_lt: Any) -> None:
    """Attention's heads read in place ([b, s, h, d]: leading dimension h*d over d rows):
    f16 keeps cuBLAS + the loop kernel (the build says why), f32 is fused (FUSED)."""
    numbers = dict(HEADS)
    lhs, rhs = numbers.pop("lhs"), numbers.pop("rhs")
    executable = compile_module(epilogue_module("bias_relu", "f16", lhs, rhs, **numbers))
    (status,) = executable.lt_status.values()
    assert status.startswith("cuBLAS + loop kernel: the f16 ") and "leading dimension 18" \
        in status, status
    assert executable._calls_plan[0][3] is None  # noqa: SLF001


def test_dimensions_from_65535_times_32_are_refused() -> None:
    """PyTorch's pre-12.1 limit, on a plan (no memory): each of m, n, k below it."""
    module = epilogue_module("relu")
    gemm = plan_gemm(next(i for i in module.entry.instructions if i.opcode == "dot"))
    assert cublaslt.refusal(gemm) is None
    for name in ("m", "n", "k"):
        assert "65535 * 32" in (cublaslt.refusal(
            dataclasses.replace(gemm, **{name: cublaslt.MAX_DIMENSION})) or ""), name
        assert cublaslt.refusal(
            dataclasses.replace(gemm, **{name: cublaslt.MAX_DIMENSION - 1})) is None, name
