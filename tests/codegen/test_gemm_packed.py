"""The packed GEMM (`codegen/cpu/gemm_packed.py`, dot.py's "packed" strategy) against the
HLO evaluator: edge tiles in M, N and K (several K blocks), a transposed A or B, a batch,
with epilogues; bits that do not depend on the units, the blocking or the threads; which
plans take it and how they are cut."""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import numpy as np
import pytest
from codegen_helpers import build
from test_dot_fusion import (
    BATCHED,
    LHS_T,
    MATMUL,
    RHS_T,
    _arguments,
    _assert_dot_close,
    _check,
    _dense,
    forced_strategy,
)
from test_dot_fusion import gemm_plan as plan

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu import dot as dot_codegen
from tfxla_lite.codegen.cpu import gemm_packed
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.shape import Shape

pytestmark = pytest.mark.skipif(not gemm_packed.available(), reason="no AVX-512")

# Small shapes forced to the packed strategy: M, N, K of no multiple (edge slivers of
# fewer than MR rows, an edge strip of fewer than NR columns, a last K block shorter than
# KC), a transposed A (a weight gradient's layout) or B, a batch.
SHAPES = {
    "edges": ((203, 1100), (1100, 97), MATMUL),
    "lhs_t": ((531, 203), (531, 97), LHS_T),
    "rhs_t": ((203, 531), (97, 531), RHS_T),
    "batched": ((3, 77, 600), (3, 600, 65), BATCHED),
}


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dot_codegen, "choose_strategy", forced_strategy("packed"))


@pytest.mark.parametrize("layout", list(SHAPES))
@pytest.mark.parametrize("epilogue", [None, "bias_relu", "gelu"])
def test_packed_matches_the_evaluator(packed: None, layout: str, epilogue: str | None) -> None:
    lhs, rhs, dims = SHAPES[layout]
    _, executable = _check(Shape("f32", lhs), Shape("f32", rhs), dims, epilogue, threads=2,
                           seed=6)
    assert "gemm_packed.kernel" in executable.llvm_ir
    assert executable.kernel_count == 1  # the epilogue runs inside the dot's kernel


_NULL_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
    lambda alignment, size: None)


def test_without_scratch_the_library_tiles_compute_it(packed: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An allocator that answers null (memory exhausted): the launcher takes the library's
    tiles instead of writing through the null pointer, and the result is right."""
    llvm.add_symbol("tfxla_test_null_alloc", ctypes.cast(_NULL_ALLOC, ctypes.c_void_p).value)
    monkeypatch.setattr(gemm_packed, "ALLOCATOR", "tfxla_test_null_alloc")
    lhs, rhs, dims = SHAPES["edges"]
    _, executable = _check(Shape("f32", lhs), Shape("f32", rhs), dims, "bias_relu", threads=2,
                           seed=7)
    assert "tfxla_test_null_alloc" in executable.llvm_ir
    assert "gemm_packed.kernel" in executable.llvm_ir and "cblas_sgemm" in executable.llvm_ir


@pytest.mark.parametrize(("m", "k", "n"), [(1300, 1400, 1290), (2049, 2051, 2047)])
def test_large_dots_take_the_packed_gemm(m: int, k: int, n: int) -> None:
    """Shapes of no multiple above MIN_FLOPS, by the default strategy: fails if the packed
    GEMM is not chosen or is wrong."""
    _, executable = _check(Shape("f32", (m, k)), Shape("f32", (k, n)), MATMUL, "bias_relu",
                           seed=m)
    assert "gemm_packed.kernel" in executable.llvm_ir


def _compiled_bits(lhs: Shape, rhs: Shape, threads: int) -> np.ndarray:
    module, _ = _dense(lhs, rhs, MATMUL, "bias_relu")
    rng = np.random.default_rng(11)
    args = [rng.uniform(-1, 1, p.shape.dims).astype(np.float32)
            for p in module.entry.parameters]
    executable = compile_module(module, threads=threads, cache=False)
    assert "gemm_packed.kernel" in executable.llvm_ir
    (out,) = executable(*args)
    return out


def test_bits_do_not_depend_on_units_blocking_or_threads(
        packed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each element is one chain of fused multiply-adds over k ascending, continued from
    the partial sum stored in C at each K block: the same bits for one unit or many,
    other MR, NR, MC and KC, one thread or two (a library GEMM does not promise this)."""
    lhs, rhs = Shape("f32", (301, 1500)), Shape("f32", (1500, 133))
    plan = dot_codegen.plan_gemm(_dense(lhs, rhs, MATMUL, None)[1].entry.root.operand(0))
    assert plan is not None and dot_codegen.schedule(plan).units == 4
    reference = _compiled_bits(lhs, rhs, threads=2)
    for setting in ({"MAX_UNITS": 1}, {"MC": 40, "KC": 96, "MAX_A_ROWS": 24},
                    {"MR": 6, "VECTORS": 2, "KC": 700},
                    {"MR": 5, "VECTORS": 4, "MC": 100, "KC": 1500}):
        with monkeypatch.context() as patch:
            for name, value in setting.items():
                patch.setattr(dot_codegen if name == "MAX_UNITS" else gemm_packed, name, value)
            units = dot_codegen.schedule(plan).units
            assert units == 1 if "MAX_UNITS" in setting else units > 1
            np.testing.assert_array_equal(_compiled_bits(lhs, rhs, threads=1), reference,
                                          err_msg=str(setting))


def test_which_plans_take_the_packed_gemm() -> None:
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(1536, 1536, 1536), plan(2048, 2048, 2048), plan(3072, 3072, 3072),
        plan(2048, 2048, 2048, transpose_a=True), plan(2048, 2048, 2048, transpose_b=True),
        plan(1536, 1024, 1536, batch=(4,)))] == ["packed"] * 6
    # Below MIN_FLOPS (every dot of the benchmark workloads: at most 0.27 GFLOP), f64,
    # and dots narrower than a strip or shorter than a sliver keep their strategies.
    assert gemm_packed.MIN_FLOPS > 0.27e9
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(512, 512, 512), plan(1024, 1024, 1024), plan(1024, 512, 1024, batch=(4,)),
        plan(2048, 2048, 2048, element_bytes=8), plan(4, 1 << 20, 4096),
        plan(1 << 20, 1024, 16))] == ["library"] * 6
    assert dot_codegen.choose_strategy(plan(64, 2048, 1024)) == "blocked"


def test_packed_units_are_row_panels() -> None:
    """Whole-width row panels of whole slivers, at most MAX_UNITS per batch element: B is
    packed once for all of them, so their count costs no packing."""
    sched = dot_codegen.schedule(dot_codegen.GemmPlan(2048, 2048, 2048, False, 2048, False,
                                                      2048, (), (), ()))
    assert (sched.strategy, sched.units, sched.block_m, sched.tiles_n) == ("packed", 16, 128, 1)
    odd = dot_codegen.schedule(dot_codegen.GemmPlan(1300, 1290, 1400, False, 1400, False,
                                                    1290, (3,), (1820000,), (1806000,)))
    assert odd.strategy == "packed" and odd.block_m % gemm_packed.MR == 0
    assert odd.units == 3 * odd.tiles_m and odd.tiles_m * odd.block_m >= 1300
    assert (odd.tiles_m - 1) * odd.block_m < 1300


def test_fusion_with_the_bias_first_matches_the_evaluator(packed: None) -> None:
    """relu(bias + x @ w) with the bias as the first parameter: the kOutput fusion's
    parameters need not start with the dot's operands (phase one packs the dot's rhs,
    wherever it sits)."""
    lhs, rhs = Shape("f32", (150, 700)), Shape("f32", (700, 70))
    bias = Shape("f32", (70,))

    def dense(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        product = c.create("dot", [ps[1], ps[2]], **MATMUL)
        broadcast = c.create("broadcast", [ps[0]], shape=product.shape, dimensions=(1,))
        zero = c.create("broadcast", [c.add_constant(0.0, "f32")], shape=product.shape,
                        dimensions=())
        return [c.create("maximum", [c.create("add", [broadcast, product]), zero])]

    module = build("bias_first", [bias, lhs, rhs], dense)
    args = _arguments(module, 8)
    magnitude = np.abs(args[1]).astype(np.float64) @ np.abs(args[2]).astype(np.float64)
    executable = compile_module(module, threads=2, cache=False)
    assert "gemm_packed.kernel" in executable.llvm_ir and executable.kernel_count == 1
    expected = evaluate(module, *args)[0]
    _assert_dot_close(executable(*args)[0], expected, magnitude.astype(np.float32), 700)
