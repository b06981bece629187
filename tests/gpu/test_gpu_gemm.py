"""Dots through cuBLAS's strided-batched GEMM (`codegen/gpu/gemm.py`), without a GPU.

Two halves, each checked against NumPy: `fake_cupy.gemm_strided_batched_ex`, the model of
`cublasGemmStridedBatchedEx` the other GPU tests run dots on, against cuBLAS's definition
spelled out element by element (column-major, op N/T, leading dimensions, batch strides,
compute type); and `plan_gemm`/`run_gemm` on that model, for dots of random dimension
numbers, against the NumPy evaluator. On a GPU, `test_gpu_executable.py` runs the same
plans (`dot_layouts_*`) on the real cuBLAS.
"""

from __future__ import annotations

import itertools
import sys

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from gpu_modules import one_dot, random_dot_cases
from hlo_builders import flatten

from tfxla_lite.codegen.gpu import compile_module
from tfxla_lite.codegen.gpu.gemm import plan_gemm
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.shape import Shape

# cudaDataType -> NumPy type (bf16 where ml_dtypes is installed).
TYPE_CODES = dict(fake_cupy.CUDA_TYPES)


def _definition(transa: int, transb: int, m: int, n: int, k: int, a: np.ndarray, lda: int,
                stride_a: int, b: np.ndarray, ldb: int, stride_b: int, c: np.ndarray,
                ldc: int, stride_c: int, batch: int, alpha: float, beta: float) -> np.ndarray:
    """cuBLAS's GEMM, one element at a time from flat memory (float64 sums of exact
    products: the inputs below are small integers, so every order gives the same)."""
    out = c.astype(np.float64).copy()
    for p, i, j in itertools.product(range(batch), range(m), range(n)):
        total = 0.0
        for q in range(k):
            a_at = i + q * lda if transa == 0 else q + i * lda  # op(A)[i, q]
            b_at = q + j * ldb if transb == 0 else j + q * ldb  # op(B)[q, j]
            total += float(a[p * stride_a + a_at]) * float(b[p * stride_b + b_at])
        at = p * stride_c + i + j * ldc
        out[at] = alpha * total + (beta * float(c[at]) if beta else 0.0)
    return out


@pytest.mark.parametrize("code", sorted(TYPE_CODES),
                         ids=lambda c: np.dtype(TYPE_CODES[c]).name)
@pytest.mark.parametrize(("transa", "transb"), [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_fake_gemm_is_cublas_definition(fake_gpu: fake_cupy.Recorder, code: int,
                                        transa: int, transb: int) -> None:
    """Padded leading dimensions, a broadcast operand (batch stride 0), an output with
    gaps between matrices; beta 0 never reads C (NaN there stays out), beta 2 does."""
    cupy = sys.modules["cupy"]
    dtype = TYPE_CODES[code]
    rng = np.random.default_rng(transa * 2 + transb)
    m, n, k, batch = 3, 4, 5, 3
    lda, ldb, ldc = (m if transa == 0 else k) + 2, (k if transb == 0 else n) + 1, m + 3
    stride_a, stride_b, stride_c = lda * 6, 0, ldc * n + 5
    compute = np.float64 if dtype is np.float64 else np.float32
    for alpha, beta in ((1.0, 0.0), (0.5, 2.0)):
        a = cupy.asarray(rng.integers(-4, 5, stride_a * batch).astype(dtype))
        b = cupy.asarray(rng.integers(-4, 5, ldb * 6).astype(dtype))
        c = cupy.asarray(np.full(stride_c * batch, np.nan if beta == 0 else 3.0, dtype))
        before = np.array(c.array)
        scalars = np.array([alpha, beta], compute)
        fake_cupy.gemm_strided_batched_ex(
            1, transa, transb, m, n, k, scalars[0:].ctypes.data, a.data.ptr, code, lda,
            stride_a, b.data.ptr, code, ldb, stride_b, scalars[1:].ctypes.data, c.data.ptr,
            code, ldc, stride_c, batch, 70 if dtype is np.float64 else 68, -1)
        wanted = _definition(transa, transb, m, n, k, a.array, lda, stride_a, b.array, ldb,
                             stride_b, before, ldc, stride_c, batch, alpha, beta)
        written = np.zeros(before.shape, bool)
        for p, i, j in itertools.product(range(batch), range(m), range(n)):
            written[p * stride_c + i + j * ldc] = True
        np.testing.assert_array_equal(c.array[written].astype(np.float64), wanted[written])
        # Elements between the matrices are not touched (NaN compares unequal: bytes).
        assert c.array[~written].tobytes() == before[~written].tobytes()


def test_fake_gemm_accumulates_half_floats_in_f32(fake_gpu: fake_cupy.Recorder) -> None:
    """4096 ones: an f16 running sum stops at 2048 (2048 + 1 rounds back); cuBLAS's
    CUBLAS_COMPUTE_32F sums in f32 and rounds once, 4096."""
    cupy = sys.modules["cupy"]
    ones = cupy.asarray(np.ones(4096, np.float16))
    out = cupy.asarray(np.zeros(1, np.float16))
    scalars = np.array([1.0, 0.0], np.float32)
    fake_cupy.gemm_strided_batched_ex(1, 0, 0, 1, 1, 4096, scalars.ctypes.data, ones.data.ptr,
                                      2, 1, 0, ones.data.ptr, 2, 4096, 0,
                                      scalars[1:].ctypes.data, out.data.ptr, 2, 1, 0, 1, 68, -1)
    assert out.array[0] == 4096


def test_fake_gemm_refuses_what_cublas_refuses(fake_gpu: fake_cupy.Recorder) -> None:
    cupy = sys.modules["cupy"]
    a = cupy.asarray(np.zeros(12, np.float32))
    scalars = np.array([1.0, 0.0], np.float32)
    one, zero, p = scalars.ctypes.data, scalars[1:].ctypes.data, a.data.ptr
    with pytest.raises(fake_cupy.CublasError, match="invalid value"):  # lda < m
        fake_cupy.gemm_strided_batched_ex(1, 0, 0, 3, 2, 2, one, p, 0, 2, 0, p, 0, 2, 0,
                                          zero, p, 0, 3, 0, 1, 68, -1)
    with pytest.raises(fake_cupy.CublasError, match="outside any allocation"):  # batch 2 reads 24
        fake_cupy.gemm_strided_batched_ex(1, 0, 0, 3, 2, 2, one, p, 0, 3, 12, p, 0, 2, 0,
                                          zero, p, 0, 3, 0, 2, 68, -1)
    with pytest.raises(fake_cupy.CublasError, match="compute type"):  # f32 data, 64F compute
        fake_cupy.gemm_strided_batched_ex(1, 0, 0, 3, 2, 2, one, p, 0, 3, 0, p, 0, 2, 0,
                                          zero, p, 0, 3, 0, 1, 70, -1)


def test_plan_reads_attention_heads_in_place() -> None:
    """q.k^T over [b, s, h, d]: the heads (stride d) are cuBLAS's batch, b a loop of two
    GEMMs at stride s*h*d; rows of s at stride h*d (op N, ld h*d); k^T by op T."""
    module = one_dot((2, 5, 3, 6), (2, 7, 3, 6), "f32", lhs_batch_dims=(0, 2),
                         rhs_batch_dims=(0, 2), lhs_contracting_dims=(3,),
                         rhs_contracting_dims=(3,))
    (dot,) = [i for i in module.entry.instructions if i.opcode == "dot"]
    plan = plan_gemm(dot)
    assert (plan.batch, plan.m, plan.k, plan.n, plan.outer) == (3, 5, 6, 7, (2,))
    assert (plan.lhs.transpose, plan.lhs.ld, plan.lhs.batch_stride) == (False, 18, 6)
    assert (plan.rhs.transpose, plan.rhs.ld, plan.rhs.batch_stride) == (True, 18, 6)
    assert plan.lhs.outer_strides == (90,) and plan.rhs.outer_strides == (126,)
    assert plan.out_outer_strides == (3 * 5 * 7,) and plan.copies == 0


@pytest.mark.parametrize("element_type", ["f32", "f16", "bf16", "f64"])
def test_random_dots_through_strided_gemm_match_the_evaluator(
        fake_gpu: fake_cupy.Recorder, element_type: str) -> None:
    """60 random dots per type on the cuBLAS model, exactly (small integers): every
    operand read in place or copied as planned, every access inside its allocation
    (`fake_cupy` checks), 2-byte floats accumulated in f32."""
    in_place = 0
    for label, module, args in random_dot_cases(element_type, 60):
        (expected,) = flatten(evaluate(module, *args))
        before = (len(fake_gpu.gemms), fake_gpu.operand_copies)
        (got,) = compile_module(module).run_numpy(*args)
        np.testing.assert_array_equal(np.asarray(got).astype(np.float64),
                                      np.asarray(expected).astype(np.float64), err_msg=label)
        (dot,) = [i for i in module.entry.instructions if i.opcode == "dot"]
        plan = plan_gemm(dot)
        calls = 0 if 0 in (plan.m, plan.n, plan.k, plan.batch) or not plan.calls \
            else plan.calls
        assert len(fake_gpu.gemms) - before[0] == calls, (label, plan)
        assert fake_gpu.operand_copies - before[1] == (plan.copies if calls else 0)
        in_place += calls > 0 and plan.copies == 0
        compute = 70 if element_type == "f64" else 68
        assert all(g.compute_type == compute for g in fake_gpu.gemms[before[0]:])
    assert in_place >= 30  # most random layouts need no copy


def test_dot_beyond_cublas_sizes_fails_the_build(fake_gpu: fake_cupy.Recorder) -> None:
    """cuBLAS takes 32-bit m, n, k and leading dimensions: a dot beyond them fails when
    the executable is built (where a GPU cluster falls back to TF), not at a call."""
    module = one_dot((2**31, 1), (1, 2), "f32", lhs_contracting_dims=(1,),
                     rhs_contracting_dims=(0,))
    with pytest.raises(NotImplementedError, match="32-bit sizes"):
        compile_module(module)
    assert not fake_gpu.gemms


def test_operand_copies_live_in_the_arena(fake_gpu: fake_cupy.Recorder,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An operand the plan copies (two contracting dimensions around a free one) is copied
    into the executable's scratch area, after an epilogue's product, not into a fresh
    allocation from CuPy's pool: the whole call stays on the one arena."""
    module = one_dot((3, 4, 5), (3, 5, 2), "f32", lhs_contracting_dims=(0, 2),
                     rhs_contracting_dims=(0, 1))
    rng = np.random.default_rng(8)
    args = [rng.integers(-3, 4, d).astype(np.float32) for d in ((3, 4, 5), (3, 5, 2))]
    (expected,) = flatten(evaluate(module, *args))
    executable = compile_module(module)
    assert executable._dot_scratch_bytes == 256  # 60 floats, aligned
    cupy = sys.modules["cupy"]
    inputs = [cupy.asarray(a) for a in args]
    monkeypatch.setattr(cupy, "ascontiguousarray",
                        lambda _: pytest.fail("a pool allocation for a dot operand"))
    (got,) = executable.run_checked(cupy, inputs)
    np.testing.assert_array_equal(cupy.asnumpy(got), expected)
    assert fake_gpu.operand_copies == 1 and len(fake_gpu.gemms) == 1


@pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")
def test_epilogue_product_and_operand_copy_share_the_scratch_area(
        emulated: fake_cupy.Recorder) -> None:
    """A dot-epilogue whose dot copies an operand: the copy lands after the product in
    the scratch area (neither overwrites the other) and the epilogue kernel, run on the
    emulator, reads the product: the evaluator's values exactly."""
    from gpu_modules import finish, new_module

    def build() -> object:
        module, comp = new_module("dot_copy_epilogue")
        a = comp.add_parameter(0, Shape("f32", (3, 4, 5)))
        b = comp.add_parameter(1, Shape("f32", (3, 5, 2)))
        c = comp.add_parameter(2, Shape("f32", (4, 2)))
        product = comp.create("dot", [a, b], lhs_contracting_dims=(0, 2),
                              rhs_contracting_dims=(0, 1))
        finish(comp, [comp.create("add", [product, c])])
        return module

    rng = np.random.default_rng(9)
    args = [rng.integers(-3, 4, d).astype(np.float32) for d in ((3, 4, 5), (3, 5, 2), (4, 2))]
    (expected,) = flatten(evaluate(build(), *args))
    executable = compile_module(build())
    assert [t.plan.kind for t in executable.program.thunks] == ["dot-epilogue"]
    assert executable._dot_scratch_bytes == 2 * 256  # the product, then the copy
    (got,) = executable.run_numpy(*args)
    np.testing.assert_array_equal(got, expected)
    assert emulated.operand_copies == 1 and emulated.launches
