"""Dot kernels by units, with kOutput epilogues: every strategy, layout and epilogue
against the HLO evaluator, kernel counts, and results that do not depend on threads.

Tolerance for dot reassociation: the evaluator (NumPy's matmul) and the kernel sum
the K products in different orders (OpenBLAS's blocking, or the emitted row loop's
ascending order). Each is within K·u·(|A|·|B|) of the exact sum (u the unit
roundoff), so they differ by at most 2·K·u·(|A|·|B|); an epilogue whose slope is at
most L scales that by L (L ≤ 2 for the epilogues here: bias, relu, tanh, logistic,
gelu pieces, scale by 0.5) and adds a few ulps of its own. `_assert_dot_close`
checks exactly that, with |A|·|B| computed by the evaluator on |A| and |B|.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from codegen_helpers import build
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu import dot as dot_codegen
from tfxla_lite.codegen.cpu import gemm_packed
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape

Epilogue = Callable[[Computation, Instruction, list[Instruction]], Instruction]


def _broadcast_scalar(c: Computation, value: float, like: Instruction) -> Instruction:
    return c.create("broadcast", [c.add_constant(value, like.shape.element_type)],
                    shape=like.shape, dimensions=())


def _bias(c: Computation, product: Instruction, extra: list[Instruction]) -> Instruction:
    last = product.shape.rank - 1
    return c.create("add", [product, c.create("broadcast", [extra[0]], shape=product.shape,
                                              dimensions=(last,))])


def _bias_relu(c: Computation, product: Instruction, extra: list[Instruction]) -> Instruction:
    return c.create("maximum", [_bias(c, product, extra), _broadcast_scalar(c, 0.0, product)])


def _bias_tanh(c: Computation, product: Instruction, extra: list[Instruction]) -> Instruction:
    return c.create("tanh", [_bias(c, product, extra)])


def _scaled_logistic(c: Computation, product: Instruction, extra: list[Instruction]
                     ) -> Instruction:
    scaled = c.create("multiply", [product, _broadcast_scalar(c, 0.5, product)])
    return c.create("logistic", [scaled])


def _gelu(c: Computation, product: Instruction, extra: list[Instruction]) -> Instruction:
    # 0.5·x·(1 + erf(x/√2)): reads the product three times at one index.
    half = c.create("multiply", [product, _broadcast_scalar(c, 0.5, product)])
    scaled = c.create("multiply", [product, _broadcast_scalar(c, 1 / math.sqrt(2), product)])
    one_plus = c.create("add", [_broadcast_scalar(c, 1.0, product), c.create("erf", [scaled])])
    return c.create("multiply", [half, one_plus])


def _residual(c: Computation, product: Instruction, extra: list[Instruction]) -> Instruction:
    return c.create("add", [product, extra[1]])


EPILOGUES: dict[str, Epilogue] = {"bias_relu": _bias_relu, "bias_tanh": _bias_tanh,
                                  "scaled_logistic": _scaled_logistic, "gelu": _gelu,
                                  "residual": _residual}


def _dense(lhs: Shape, rhs: Shape, dims: dict[str, tuple[int, ...]], epilogue: str | None
           ) -> tuple[HloModule, HloModule]:
    """(the dot with `epilogue`, the dot alone): the second gives |A|·|B| for the bound."""
    def product(c: Computation, ps: list[Instruction]) -> Instruction:
        return c.create("dot", ps[:2], **dims)

    plain = build("dot", [lhs, rhs], lambda c, ps: [product(c, ps)])
    out = plain.entry.root.operand(0).shape
    bias = Shape(out.element_type, (out.dims[-1],))
    with_epilogue = build("dense", [lhs, rhs, bias, out], lambda c, ps: [
        EPILOGUES[epilogue](c, product(c, ps), ps[2:]) if epilogue else product(c, ps)])
    return with_epilogue, plain


def _arguments(module: HloModule, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, p.shape.dims).astype(p.shape.numpy_dtype)
            for p in module.entry.parameters]


def _assert_dot_close(actual: np.ndarray, expected: np.ndarray, magnitude: np.ndarray,
                      k: int) -> None:
    """|actual - expected| ≤ 2·L·K·u·(|A|·|B|) + 8 ulp(|expected|), L = 2 (see above)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    unit_roundoff = np.finfo(actual.dtype).eps / 2
    bound = 2 * 2 * max(k, 1) * unit_roundoff * magnitude + 8 * np.spacing(
        np.abs(expected).astype(actual.dtype))
    error = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    worst = np.unravel_index(np.argmax(error - bound), error.shape) if error.size else ()
    assert (error <= bound).all(), (f"at {worst}: {actual[worst]} vs {expected[worst]}, "
                                    f"bound {bound[worst]}")


def _check(lhs: Shape, rhs: Shape, dims: dict[str, tuple[int, ...]], epilogue: str | None,
           threads: int | None = None, seed: int = 0) -> tuple[list[np.ndarray], object]:
    module, plain = _dense(lhs, rhs, dims, epilogue)
    args = _arguments(module, seed)
    expected = evaluate(module, *args)[0]
    magnitude = evaluate(plain, *[np.abs(a) for a in args[:2]])[0].astype(np.float64)
    executable = compile_module(module, threads=threads, cache=False)
    (actual,) = executable(*args)
    k = math.prod(lhs.dims[d] for d in dims.get("lhs_contracting_dims", ()))
    _assert_dot_close(actual, expected, magnitude, k)
    return [actual], executable


MATMUL = {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)}
LHS_T = {"lhs_contracting_dims": (0,), "rhs_contracting_dims": (0,)}  # a weight gradient's
RHS_T = {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (1,)}
BATCHED = {"lhs_batch_dims": (0,), "rhs_batch_dims": (0,), "lhs_contracting_dims": (2,),
           "rhs_contracting_dims": (1,)}


def gemm_plan(m: int, k: int, n: int, transpose_a: bool = False, transpose_b: bool = False,
              element_bytes: int = 4, batch: tuple[int, ...] = ()) -> dot_codegen.GemmPlan:
    """The plan of a dense m × k by k × n product (`batch` elements of them), either
    operand transposed, for strategy and schedule tests."""
    return dot_codegen.GemmPlan(m, n, k, transpose_a, m if transpose_a else k,
                                transpose_b, k if transpose_b else n, batch,
                                (m * k,) * len(batch), (k * n,) * len(batch), element_bytes)

# (lhs, rhs, dimension numbers): plain, transposed either side, batched with the batch
# dimension in the middle of the rhs, a vector times a matrix, sizes that leave
# partial tiles (and several units: more than MIN_UNIT_FLOPS).
LAYOUTS = {
    "small": ((5, 7), (7, 3), MATMUL),
    "lhs_t": ((33, 20), (33, 40), LHS_T),
    "rhs_t": ((20, 33), (40, 33), RHS_T),
    "batched": ((3, 9, 17), (17, 3, 11), {"lhs_batch_dims": (0,), "rhs_batch_dims": (1,),
                                          "lhs_contracting_dims": (2,),
                                          "rhs_contracting_dims": (0,)}),
    "vector_matrix": ((1, 300), (300, 70), MATMUL),
    "tiles": ((300, 200), (200, 270), MATMUL),
}


def forced_strategy(name: str) -> Callable[[dot_codegen.GemmPlan], str]:
    """`name` for every plan, except that register blocks need B's rows contiguous or,
    with B transposed, A's: "blocked" leaves both transposed to the library."""
    if name == "blocked":
        return lambda plan: "library" if plan.transpose_a and plan.transpose_b else "blocked"
    return lambda plan: name


@pytest.fixture(params=["library", "emitted", "blocked"])
def strategy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(dot_codegen, "choose_strategy", forced_strategy(request.param))
    return request.param


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("epilogue", [None, "bias_relu", "gelu"])
def test_dot_strategies_and_layouts(strategy: str, layout: str, epilogue: str | None) -> None:
    lhs, rhs, dims = LAYOUTS[layout]
    _, executable = _check(Shape("f32", lhs), Shape("f32", rhs), dims, epilogue)
    assert executable.kernel_count == 1  # the epilogue runs inside the dot's kernel
    assert ("kOutput" in executable.optimized_hlo_text) == (epilogue is not None)
    assert ("gemm" in executable.llvm_ir) == (strategy == "library")
    assert ("llvm.fmuladd.v" in executable.llvm_ir) == (strategy == "blocked")
    # B transposed: dot-product blocks, or blocks over a transposed copy at a short K
    assert ("dot_block.f32.product" in executable.llvm_ir
            or "dot.b_copy" in executable.llvm_ir) == (strategy == "blocked"
                                                        and layout == "rhs_t")


@pytest.mark.parametrize("epilogue", list(EPILOGUES))
@pytest.mark.parametrize("element_type", ["f32", "f64"])
def test_epilogues(epilogue: str, element_type: str) -> None:
    for layout in ("small", "tiles", "vector_matrix"):
        lhs, rhs, dims = LAYOUTS[layout]
        _check(Shape(element_type, lhs), Shape(element_type, rhs), dims, epilogue)


def test_integer_dot_epilogue_in_registers() -> None:
    """No GEMM for s32: the element generator computes the product, the epilogue inline."""
    lhs, rhs, out = Shape("s32", (6, 5)), Shape("s32", (5, 4)), Shape("s32", (6, 4))
    module = build("int", [lhs, rhs, out], lambda c, ps: [c.create("maximum", [
        c.create("dot", ps[:2], **MATMUL), ps[2]])])
    rng = np.random.default_rng(3)
    args = [rng.integers(-9, 10, s.dims).astype(np.int32) for s in (lhs, rhs, out)]
    expected = evaluate(module, *args)[0]
    executable = compile_module(module, cache=False)
    np.testing.assert_array_equal(executable(*args)[0], expected)
    assert executable.kernel_count == 1 and "gemm" not in executable.llvm_ir
    assert "kOutput" in executable.optimized_hlo_text


def test_zero_contracting_runs_the_epilogue() -> None:
    module, _ = _dense(Shape("f32", (3, 0)), Shape("f32", (0, 4)), MATMUL, "bias_tanh")
    args = _arguments(module, 1)
    (actual,) = compile_module(module, cache=False)(*args)
    assert_close(actual, np.tanh(np.broadcast_to(args[2], (3, 4))), "tanh")


def test_nan_in_a_row_reaches_only_that_row() -> None:
    module, _ = _dense(Shape("f32", (300, 200)), Shape("f32", (200, 270)), MATMUL, "bias_relu")
    args = _arguments(module, 2)
    args[0][7, 11] = np.nan
    (actual,) = compile_module(module, cache=False)(*args)
    assert np.isnan(actual[7]).all()
    assert not np.isnan(np.delete(actual, 7, axis=0)).any()


def test_schedule_is_fixed_by_shape() -> None:
    """The library's units, by its split model (`split_overhead`); each shape below that
    is now computed by register blocks (`dot_blocks.fits`) is scheduled here as the
    library's, which large or transposed-B products still use."""
    plan = dot_codegen.GemmPlan(m=64, n=512, k=784, transpose_a=False, lda=784,
                                transpose_b=False, ldb=512, batch_sizes=(),
                                lhs_batch_strides=(), rhs_batch_strides=())
    assert dot_codegen.choose_strategy(plan) == "blocked"
    sched = dot_codegen.schedule(plan, "library")
    assert sched.strategy == "library"
    # Splitting the columns in 4 would re-pack A's 64 rows 3 more times (5% of the
    # flops) and make 3 more calls (3% more): 1×4 tiles took 6-7% more CPU time than
    # one call, 1×2 tiles 2%.
    assert (sched.block_m, sched.block_n, sched.units) == (64, 256, 2)
    assert 2 * sched.block_m * 64 * plan.k >= dot_codegen.MIN_UNIT_FLOPS
    assert dot_codegen.split_overhead(64, 512, 784, 1, 4) > dot_codegen.SPLIT_BUDGET
    # A weight gradient with a short K (784×512 over K = 128) stays at 2×1 tiles: 2×2
    # re-pack and call for about 4% more CPU time, over the budget (with them the MLP
    # step took 1.13-1.20x the time on the quiet 2-core machine; dot.py, SPLIT_BUDGET).
    short_k = dot_codegen.schedule(dot_codegen.GemmPlan(784, 512, 128, True, 784, False, 512,
                                                        (), (), ()), "library")
    assert (short_k.tiles_m, short_k.tiles_n, short_k.units) == (2, 1, 2)
    assert (dot_codegen.split_overhead(784, 512, 128, 2, 2) > dot_codegen.SPLIT_BUDGET
            > dot_codegen.split_overhead(784, 512, 128, 2, 1))
    # A weight gradient, 128×128 over K = 512: two units although the split re-packs
    # more than the budget, since one unit would leave the team's other threads idle.
    gradient = dot_codegen.schedule(dot_codegen.GemmPlan(128, 128, 512, True, 128, False, 128,
                                                         (), (), ()), "library")
    assert (gradient.units, gradient.block_m, gradient.block_n) == (2, 64, 128)
    assert dot_codegen.split_overhead(128, 128, 512, 2, 1) > dot_codegen.SPLIT_BUDGET
    # Operands beyond L2 cost about twice as much to re-pack: a 768³ product stops at
    # 2×1 tiles, where 2×2 would re-pack more than the budget.
    square = dot_codegen.schedule(dot_codegen.GemmPlan(768, 768, 768, False, 768, False,
                                                       768, (), (), ()))
    assert (square.tiles_m, square.tiles_n, square.block_m, square.block_n) == (2, 1, 384, 768)
    assert dot_codegen.split_overhead(768, 768, 768, 2, 2) > dot_codegen.SPLIT_BUDGET
    # An operand of exactly L2_BYTES counts as beyond it: 512³ (two 1 MiB operands) in
    # 2×2 tiles took +6.8-8.6% CPU time on one thread, 2×1 +1.8-3.0% (medians), so it
    # stays at 2 row tiles; 448³ (784 KiB operands, 2×2 +3.4-3.8%) too since the budget
    # is 2%.
    def square_tiles(size: int) -> tuple[int, int]:
        sched = dot_codegen.schedule(dot_codegen.GemmPlan(size, size, size, False, size,
                                                          False, size, (), (), ()), "library")
        return sched.tiles_m, sched.tiles_n
    assert square_tiles(512) == (2, 1) and square_tiles(448) == (2, 1)
    assert (dot_codegen.split_overhead(512, 512, 512, 2, 2)
            > dot_codegen.split_overhead(448, 448, 448, 2, 2) > dot_codegen.SPLIT_BUDGET)
    # Above BALANCE_FLOPS the budget shrinks with the flops, down to BALANCED_UNITS
    # units: a 2048³ product, whose 2×2 tiles would re-pack within SPLIT_BUDGET, is cut
    # in 2×2 tiles, although they re-pack more than its shrunken budget.
    # (the library's schedule; such dots take the packed GEMM where it is available)
    large = dot_codegen.schedule(dot_codegen.GemmPlan(2048, 2048, 2048, False, 2048, False,
                                                      2048, (), (), ()), "library")
    assert (large.units, large.tiles_m, large.block_m, large.block_n) == (4, 2, 1024, 1024)
    assert dot_codegen.split_overhead(2048, 2048, 2048, 2, 2) < dot_codegen.SPLIT_BUDGET
    assert dot_codegen.split_budget(large.flops) < dot_codegen.split_overhead(
        2048, 2048, 2048, 2, 2)
    assert dot_codegen.split_budget(dot_codegen.BALANCE_FLOPS) == dot_codegen.SPLIT_BUDGET
    # A tall product: 8192 rows over K = 784 in 4 tiles of rows, not 16 as before.
    tall = dot_codegen.schedule(dot_codegen.GemmPlan(8192, 512, 784, False, 784, False, 512,
                                                     (), (), ()), "library")
    assert (tall.tiles_m, tall.tiles_n) == (4, 1)
    assert dot_codegen.split_overhead(8192, 512, 784, 8, 1) > dot_codegen.split_budget(
        tall.flops)
    # A 448³ product in f64: its 1.5 MiB operands do not fit in L2, and re-packing them
    # costs more than the f32 product's (784 KiB operands); both stop at two units.
    f64 = dot_codegen.GemmPlan(448, 448, 448, False, 448, False, 448, (), (), (), 8)
    assert dot_codegen.split_overhead(448, 448, 448, 2, 2, 8) > dot_codegen.split_overhead(
        448, 448, 448, 2, 2, 4)
    assert dot_codegen.schedule(f64, "library").units == 2
    batched = dot_codegen.schedule(dot_codegen.GemmPlan(64, 64, 32, False, 32, False, 64,
                                                        (32,), (2048,), (2048,)), "library")
    # 262144 flops per GEMM: 16 whole batch elements per unit
    assert (batched.batch_per_unit, batched.units, batched.tiles) == (16, 2, 1)
    vector = dot_codegen.schedule(dot_codegen.GemmPlan(1, 512, 784, False, 784, False, 512,
                                                       (), (), ()))
    assert vector.strategy == "emitted" and vector.units == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_large_product_in_balanced_units_matches_the_evaluator(
        threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A product above BALANCE_FLOPS with odd sizes, relu(x @ w + b): 2×2 tiles, the last
    row and column shorter, each one library call with its epilogue (the packed GEMM,
    which takes it where available, is off: tests/codegen/test_gemm_packed.py)."""
    monkeypatch.setattr(gemm_packed, "fits", lambda plan: False)
    lhs, rhs = Shape("f32", (1100, 1000)), Shape("f32", (1000, 1030))
    _, plain = _dense(lhs, rhs, MATMUL, "bias_relu")
    plan = dot_codegen.plan_gemm(plain.entry.root.operand(0))
    assert plan is not None and 2 * plan.m * plan.n * plan.k > dot_codegen.BALANCE_FLOPS
    sched = dot_codegen.schedule(plan)
    assert (sched.strategy, sched.units, sched.block_m, sched.block_n) == ("library", 4, 560,
                                                                            528)
    (actual,), _ = _check(lhs, rhs, MATMUL, "bias_relu", threads=threads, seed=3)
    assert (actual > 0).any() and (actual == 0).any()


# Odd sizes, both transposes and a batch dimension, cut into uneven tiles: with the
# unit and split limits lifted, every layout splits along both sides into a last row
# and column of tiles shorter than the others.
UNEVEN = {
    "odd": ((37, 23), (23, 53), MATMUL),
    "lhs_t": ((29, 45), (29, 34), LHS_T),
    "rhs_t": ((45, 29), (34, 29), RHS_T),
    "batched": ((2, 40, 17), (17, 2, 35), {"lhs_batch_dims": (0,), "rhs_batch_dims": (1,),
                                           "lhs_contracting_dims": (2,),
                                           "rhs_contracting_dims": (0,)}),
}


@pytest.mark.parametrize("layout", list(UNEVEN))
@pytest.mark.parametrize("epilogue", [None, "bias_relu"])
def test_uneven_tiles_match_the_evaluator(strategy: str, layout: str, epilogue: str | None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dot_codegen, "MIN_UNIT_FLOPS", 64)
    monkeypatch.setattr(dot_codegen, "SPLIT_BUDGET", float("inf"))
    lhs, rhs, dims = UNEVEN[layout]
    module, _ = _dense(Shape("f32", lhs), Shape("f32", rhs), dims, None)
    plan = dot_codegen.plan_gemm(module.entry.root.operand(0))
    assert plan is not None
    sched = dot_codegen.schedule(plan)
    assert sched.tiles_m > 1 and sched.tiles_n > 1
    assert plan.m % sched.block_m and plan.n % sched.block_n  # short last tiles
    assert sched.units == math.prod(plan.batch_sizes) * sched.tiles
    _check(Shape("f32", lhs), Shape("f32", rhs), dims, epilogue, threads=2, seed=7)


@pytest.mark.parametrize("strategy_name", ["library", "emitted", "blocked"])
def test_results_do_not_depend_on_the_thread_count(strategy_name: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dot_codegen, "choose_strategy", forced_strategy(strategy_name))
    lhs, rhs, dims = Shape("f32", (300, 512)), Shape("f32", (512, 400)), MATMUL
    results = []
    for threads in (1, 2, 3):
        (actual,), executable = _check(lhs, rhs, dims, "gelu", threads=threads, seed=5)
        assert "tfxla_lite_parallel" in executable.llvm_ir or threads == 1
        results.append(actual)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_golden_llvm_of_a_dense_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kOutput kernel: per unit one GEMM call, then the epilogue over the tile's rows,
    in the same range function; the launcher runs units on the team. (The product is
    small enough for register blocks: the library is forced.)"""
    import re

    monkeypatch.setattr(dot_codegen, "choose_strategy", forced_strategy("library"))

    _, executable = _check(Shape("f32", (300, 200)), Shape("f32", (200, 270)), MATMUL,
                           "bias_relu", threads=2)
    patterns = [
        r'^define void @"entry"',
        r'call void @"kernel.dot_maximum_fusion.launch"\(ptr %"output.0", ptr %"param.0", '
        r'ptr %"param.1", ptr %"param.2"\)',
        r'^define internal void @"kernel.dot_maximum_fusion"\(ptr captures\(none\) noalias '
        r'%"output", .* i64 %"begin", i64 %"end"\)',
        r'^unit.header:',
        r'call void @"scipy_cblas_sgemm64_"\(i32 101, i32 111, i32 111, i64 %"[.\w]+", '
        r'i64 %"[.\w]+", i64 200, float 0x3ff0000000000000, ptr %"[.\w]+", i64 200, '
        r'ptr %"[.\w]+", i64 270, float +0x0, ptr %"[.\w]+", i64 270\)',
        r'^epilogue.j.header:',
        r'call float @"llvm.maximum.f32"',
        r'^define internal void @"kernel.dot_maximum_fusion.launch"',
        r'call void @"tfxla_lite_parallel"\(.*@"kernel.dot_maximum_fusion.task", .*i32 2, i32 0\)',
    ]
    lines = executable.llvm_ir.splitlines()
    at = 0
    for pattern in patterns:
        at = next((n + 1 for n in range(at, len(lines)) if re.search(pattern, lines[n])), -1)
        assert at > 0, f"not found in order: {pattern}"


@pytest.mark.parametrize("strategy_name", ["library", "emitted", "blocked"])
def test_random_dot_layouts_property(strategy_name: str, monkeypatch: pytest.MonkeyPatch
                                     ) -> None:
    """Random sizes, transposes, batch dimensions and epilogues, by each strategy."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    monkeypatch.setattr(dot_codegen, "choose_strategy", forced_strategy(strategy_name))

    @settings(max_examples=12, deadline=None, derandomize=True)
    @given(st.integers(1, 40), st.integers(0, 40), st.integers(1, 40), st.booleans(),
           st.booleans(), st.integers(0, 2), st.sampled_from([None, *EPILOGUES]))
    def check_one(m: int, k: int, n: int, lhs_t: bool, rhs_t: bool, batch: int,
                  epilogue: str | None) -> None:
        prefix = tuple(range(2, 2 + batch))
        lhs = prefix + ((k, m) if lhs_t else (m, k))
        rhs = prefix + ((n, k) if rhs_t else (k, n))
        dims = {"lhs_batch_dims": tuple(range(batch)), "rhs_batch_dims": tuple(range(batch)),
                "lhs_contracting_dims": (batch if lhs_t else batch + 1,),
                "rhs_contracting_dims": (batch + 1 if rhs_t else batch,)}
        _check(Shape("f32", lhs), Shape("f32", rhs), dims, epilogue, seed=m * 41 + n)

    check_one()


def test_golden_llvm_of_an_emitted_vector_matrix_kernel() -> None:
    """M = 1: emitted row loops, no library call; the last k's pass applies the epilogue
    to each sum before its only store, so no separate epilogue pass reads it back."""
    _, executable = _check(Shape("f32", (1, 300)), Shape("f32", (300, 70)), MATMUL,
                           "bias_relu")
    text = executable.llvm_ir
    assert "gemm" not in text and "epilogue.j" not in text
    last = text.index("last.j.body:")
    assert text.index("axpy4.j.body:") < last
    assert "llvm.maximum.f32" in text[last:text.index("last.j.exit", last)]
