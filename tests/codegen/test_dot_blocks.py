"""Register blocks (`codegen/cpu/dot_blocks.py`, dot.py's "blocked" strategy) against the
HLO evaluator: row and column remainders (single rows, single vectors, a masked last
vector), f32 and f64, a transposed A, a batch, with epilogues; results that do not depend
on the units; which plans it takes and how they are cut; the emitted loop's shape."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_dot_fusion import BATCHED, LHS_T, MATMUL, RHS_T, _check, _dense, forced_strategy
from test_dot_fusion import gemm_plan as plan

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu import dot as dot_codegen
from tfxla_lite.codegen.cpu import dot_blocks, gemm_packed
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.shape import Shape

# (lhs, rhs, dimension numbers): 13 rows = a block of 8 and 5 single rows; 53 columns =
# a block of two vectors, a single vector and a masked one of 5 lanes (f32 on AVX-512);
# 7 columns: only the masked vector; a transposed A (a weight gradient's layout); a batch;
# many rows at a short K (517 = 64 blocks of 8 and 5 single rows).
SHAPES = {
    "remainders": ((13, 300), (300, 53), MATMUL),
    "tall": ((517, 64), (64, 80), MATMUL),
    "narrow": ((40, 500), (500, 7), MATMUL),
    "wide": ((64, 200), (200, 96), MATMUL),
    "lhs_t": ((300, 21), (300, 80), LHS_T),
    "batched": ((3, 24, 100), (3, 100, 40), BATCHED),
}


def _plan(lhs: Shape, rhs: Shape, dims: dict[str, tuple[int, ...]]) -> dot_codegen.GemmPlan:
    module, _ = _dense(lhs, rhs, dims, None)
    plan = dot_codegen.plan_gemm(module.entry.root.operand(0))
    assert plan is not None
    return plan


@pytest.mark.parametrize("layout", list(SHAPES))
@pytest.mark.parametrize("element_type", ["f32", "f64"])
@pytest.mark.parametrize("epilogue", [None, "bias_relu", "gelu"])
def test_blocks_match_the_evaluator(layout: str, element_type: str, epilogue: str | None,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    lhs, rhs, dims = SHAPES[layout]
    lhs_shape, rhs_shape = Shape(element_type, lhs), Shape(element_type, rhs)
    chosen = dot_codegen.choose_strategy(_plan(lhs_shape, rhs_shape, dims))
    assert chosen == ("library" if layout == "narrow" else "blocked")  # narrow: forced
    monkeypatch.setattr(dot_codegen, "choose_strategy", forced_strategy("blocked"))
    _, executable = _check(lhs_shape, rhs_shape, dims, epilogue, threads=2, seed=4)
    assert "gemm" not in executable.llvm_ir and "llvm.fmuladd.v" in executable.llvm_ir


@pytest.mark.parametrize("layout", ["remainders", "lhs_t"])
def test_blocks_of_avx2_width_match_the_evaluator(layout: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Hosts without AVX-512 get 256-bit vectors and blocks of 4 rows (run here on any
    x86 host: the narrower vectors are legal everywhere)."""
    monkeypatch.setattr(dot_blocks, "_vector_bits", lambda: 256)
    assert (dot_blocks._lanes(4), dot_blocks._rows()) == (8, 4)
    lhs, rhs, dims = SHAPES[layout]
    for element_type in ("f32", "f64"):
        _, executable = _check(Shape(element_type, lhs), Shape(element_type, rhs), dims,
                               "bias_relu", threads=2, seed=5)
        lanes = 8 if element_type == "f32" else 4
        assert f"llvm.fmuladd.v{lanes}f{element_type[1:]}" in executable.llvm_ir


def test_units_do_not_change_the_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sum runs over k ascending in one register whatever the tile: the product cut
    in many small uneven tiles gives the bits of one unit (a library GEMM does not
    promise this: its blocking can change with the tile's bounds)."""
    lhs, rhs = Shape("f32", (45, 333)), Shape("f32", (333, 70))
    plan = _plan(lhs, rhs, MATMUL)
    assert dot_codegen.schedule(plan).units == 1
    (whole,), _ = _check(lhs, rhs, MATMUL, "bias_relu", threads=1, seed=9)
    monkeypatch.setattr(dot_codegen, "MIN_UNIT_FLOPS", 64)
    sched = dot_codegen.schedule(plan)
    assert sched.tiles_m > 1 and sched.tiles_n > 1 and plan.n % sched.block_n
    (tiled,), _ = _check(lhs, rhs, MATMUL, "bias_relu", threads=2, seed=9)
    np.testing.assert_array_equal(tiled, whole)


def test_which_plans_take_blocks() -> None:
    # mlp_infer_b64's hidden layers, a weight gradient over 64 rows (A transposed), 64
    # rows at the MACs limit, and any rows of a row-major A with K up to SHORT_K (the
    # Transformer's 1024-token Dense layers and projections): blocks; more rows than
    # MAX_ROWS with a longer K (the MLP step's weight gradient, 512³, and its 128×784
    # by 784×512 layer) or with A transposed (a 256×1024 by 1024×64 weight gradient,
    # and even at a short K), more MACs than MAX_MACS, B transposed (no vector loads
    # along its rows), K beyond MAX_K, fewer columns than a block (a 10-class output
    # layer): the library, 1024³ too; 1536³ and 2048³ the packed GEMM where it is
    # available (tests/codegen/test_gemm_packed.py); M = 1 and tiny dots keep the axpy
    # loops.
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(64, 784, 512), plan(64, 512, 512), plan(64, 128, 512, transpose_a=True),
        plan(64, 2048, 1024), plan(1024, 64, 256), plan(1024, 256, 64),
        plan(1024, 64, 64), plan(2048, 256, 256))] == ["blocked"] * 8
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(784, 128, 512, transpose_a=True), plan(65, 784, 512), plan(512, 512, 512),
        plan(128, 784, 512), plan(256, 1024, 64, transpose_a=True),
        plan(1024, 64, 256, transpose_a=True), plan(4096, 256, 256),
        plan(1024, 256, 64, transpose_b=True), plan(64, 128, 512, True, True),
        plan(16, 4096, 64), plan(64, 512, 10))
    ] == ["library"] * 11
    # B transposed, few rows of a row-major A and a long K: dot-product blocks (an
    # LSTM's dh = dg·Wᵀ); a short K with B small enough to copy (COPY_BYTES): blocks over
    # a transposed copy (attention's scores over a head's 16 features, batched; the
    # Transformer's 1024×64 by 64×64 input gradients); a longer K with a batch, or a
    # bigger B at a short K: the library
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(32, 512, 128, transpose_b=True), plan(64, 512, 784, transpose_b=True))
    ] == ["blocked"] * 2
    copies = (plan(64, 64, 64, transpose_b=True), plan(64, 16, 64, transpose_b=True, batch=(16, 4)),
              plan(1024, 64, 64, transpose_b=True))
    assert [dot_codegen.choose_strategy(p) for p in copies] == ["blocked"] * 3
    assert all(dot_blocks.fits_copy(p) and not dot_blocks.fits_products(p) for p in copies)
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(32, 128, 128, transpose_b=True), plan(64, 512, 64, transpose_b=True, batch=(16,)),
        plan(1024, 64, 256, transpose_b=True), plan(1024, 256, 64, transpose_b=True))
    ] == ["library"] * 4
    assert dot_blocks.COPY_BYTES == 16 << 10
    # Narrower than a block, whole vectors, batched at least NARROW_BATCH times with A's
    # rows contiguous (attention's probabilities times values): blocks; unbatched (an
    # output layer), a smaller batch, A transposed, or not whole vectors: the library
    lanes = dot_blocks._lanes(4)
    assert dot_codegen.choose_strategy(plan(64, 64, lanes, batch=(16, 4))) == "blocked"
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(64, 64, lanes), plan(64, 64, lanes, batch=(dot_blocks.NARROW_BATCH - 1,)),
        plan(64, 64, lanes, transpose_a=True, batch=(16, 4)),
        plan(64, 64, lanes + 3, batch=(16, 4)))] == ["library"] * 4
    # A transposed over a very short K (an LSTM step's weight gradient hᵀ·dg, K = batch
    # 32) with up to TRANSPOSED_ROWS rows: blocks; more rows, or K = 128: the library
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(128, 32, 512, transpose_a=True), plan(256, 64, 512, transpose_a=True))
    ] == ["blocked"] * 2
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(257, 32, 512, transpose_a=True), plan(128, 128, 512, transpose_a=True))
    ] == ["library"] * 2
    assert (dot_blocks.TRANSPOSED_K, dot_blocks.TRANSPOSED_ROWS) == (64, 256)
    large = "packed" if gemm_packed.available() else "library"
    assert dot_codegen.choose_strategy(plan(1024, 1024, 1024)) == "library"
    assert [dot_codegen.choose_strategy(p) for p in (
        plan(1536, 1536, 1536), plan(2048, 2048, 2048))] == [large] * 2
    assert dot_codegen.choose_strategy(plan(1, 784, 512)) == "emitted"
    assert dot_codegen.choose_strategy(plan(8, 16, 8)) == "emitted"
    assert dot_blocks.MAX_MACS == 512 ** 3 and not dot_blocks.fits(plan(64, 2048, 1025))
    assert dot_blocks.MAX_ROWS == 64 and dot_blocks.SHORT_K == 256


# B transposed: 13 rows = 3 strips of 4 and a single row; 7 columns = a block of 4 and
# 3 single columns; K = 37: two whole vectors (f32, AVX-512) and a masked step of 5
# lanes; K = 5: the masked step alone; K = 64: no masked step.
PRODUCT_SHAPES = {
    "remainders": ((13, 37), (7, 37)),
    "short_k": ((6, 5), (9, 5)),
    "whole_vectors": ((8, 64), (12, 64)),
}


@pytest.mark.parametrize("layout", list(PRODUCT_SHAPES))
@pytest.mark.parametrize("element_type", ["f32", "f64"])
@pytest.mark.parametrize("epilogue", [None, "bias_relu"])
def test_product_blocks_match_the_evaluator(layout: str, element_type: str,
                                            epilogue: str | None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """C = A·Bᵀ by dot-product blocks (`dot_blocks.fits_products`), remainders of rows,
    columns and K, against the evaluator; NaN and infinities propagate as in a sum."""
    lhs, rhs = PRODUCT_SHAPES[layout]
    monkeypatch.setattr(dot_codegen, "choose_strategy", forced_strategy("blocked"))
    _, executable = _check(Shape(element_type, lhs), Shape(element_type, rhs), RHS_T,
                           epilogue, threads=2, seed=6)
    assert "gemm" not in executable.llvm_ir
    assert f"dot_block.{element_type}.product." in executable.llvm_ir


def test_product_blocks_of_avx2_width_match_the_evaluator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dot_blocks, "_vector_bits", lambda: 256)
    monkeypatch.setattr(dot_codegen, "choose_strategy", forced_strategy("blocked"))
    assert dot_blocks._product_rows() == 2
    for element_type in ("f32", "f64"):
        _, executable = _check(Shape(element_type, (13, 37)), Shape(element_type, (7, 37)),
                               RHS_T, "bias_relu", threads=2, seed=7)
        assert f"dot_block.{element_type}.product.2x4" in executable.llvm_ir


def test_product_blocks_keep_their_edge_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN, ±inf and -0.0 operands give the evaluator's NaN, infinities and zeros."""
    monkeypatch.setattr(dot_codegen, "choose_strategy", forced_strategy("blocked"))
    lhs = np.zeros((5, 20), np.float32)
    rhs = np.ones((6, 20), np.float32)
    lhs[0, 3], lhs[1, 19], lhs[2, 0], lhs[3, :] = np.nan, np.inf, -np.inf, -0.0
    rhs[4, 19] = -np.inf
    _, module = _dense(Shape("f32", lhs.shape), Shape("f32", rhs.shape), RHS_T, None)
    expected = evaluate(module, lhs, rhs)[0]
    executable = compile_module(module, cache=False)
    assert "dot_block.f32.product." in executable.llvm_ir
    got = executable(lhs, rhs)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(got[finite], expected[finite])


def test_blocked_units_are_cut_to_the_minimum_unit() -> None:
    """No packing to repeat: a 64×784×512 layer is cut into 8 units of 64×64 (6.4 MFLOP
    each), where the library's split model stops at 2 units of 64×256."""
    plan = dot_codegen.GemmPlan(64, 512, 784, False, 784, False, 512, (), (), ())
    sched = dot_codegen.schedule(plan)
    assert (sched.strategy, sched.units, sched.block_m, sched.block_n) == ("blocked", 8, 64, 64)
    assert dot_codegen.schedule(plan, "library").units == 2
    gradient = dot_codegen.GemmPlan(784, 512, 128, True, 784, False, 512, (), (), ())
    assert dot_codegen.schedule(gradient, "blocked").units == dot_codegen.MAX_UNITS


def test_golden_llvm_of_a_blocked_kernel() -> None:
    """Each shape of block is one internal function of the module, called per block: the
    8 × 2 one (AVX-512) carries 16 sums as vector phis of its k loop and multiply-adds a
    broadcast element of A by vectors of B's row; the last 5 columns load and store
    through a mask, the last 5 rows go one at a time; the range function calls them,
    then runs the epilogue over the tile; no library call."""
    _, executable = _check(Shape("f32", (13, 300)), Shape("f32", (300, 53)), MATMUL,
                           "bias_relu")
    text = executable.llvm_ir
    lanes, rows = dot_blocks._lanes(4), dot_blocks._rows()
    vector = f"<{lanes} x float>"
    assert "gemm" not in text
    names = re.findall(r'define internal void @"(dot_block\.[\w.]+)"', text)
    assert sorted(names) == sorted(f"dot_block.f32.{r}x{v}{m}" for r in (rows, 1)
                                   for v, m in ((2, ""), (1, ""), (1, ".masked")))
    wide = text[text.index(f'define internal void @"dot_block.f32.{rows}x2"'):]
    wide = wide[:wide.index("\n}\n")]
    header = wide.index("block.k.header:")
    body = wide.index("block.k.body:", header)
    phis = re.findall(rf'%"sum\.\d\.\d" = phi\s+{re.escape(vector)}', wide[header:body])
    assert len(phis) == rows * dot_blocks.BLOCK_VECTORS
    assert wide.count(f'call {vector} @"llvm.fmuladd.v{lanes}f32"') == len(phis)
    masked = text[text.index(f'define internal void @"dot_block.f32.{rows}x1.masked"'):]
    assert f'@"llvm.masked.load.v{lanes}f32.p0"' in masked[:masked.index("\n}\n")]
    assert f'@"llvm.masked.store.v{lanes}f32.p0"' in masked[:masked.index("\n}\n")]
    kernel = text[text.index('define internal void @"kernel.'):]
    assert kernel.index(f'call void @"dot_block.f32.{rows}x2"') < kernel.index(
        "epilogue.j.header:")


# B transposed at a short K, copied transposed per tile (`dot_blocks.fits_copy`): rows and
# columns with remainders (29 rows = 3 blocks of 8 and 5 single rows; 53 columns = a
# block, a vector and a masked 5 lanes on AVX-512), K = 2 (at K = 1 B is not
# transposed), a batch (attention's scores),
# and the narrow batched product. Each above dot.SMALL_DOT_MACS (smaller ones are emitted).
COPY_SHAPES = {
    "remainders": ((29, 37), (53, 37), RHS_T),
    "k2": ((200, 2), (170, 2), RHS_T),
    "scores": ((8, 64, 16), (8, 64, 16), {"lhs_batch_dims": (0,), "rhs_batch_dims": (0,),
                                          "lhs_contracting_dims": (2,),
                                          "rhs_contracting_dims": (2,)}),
    "narrow_batched": ((8, 64, 64), (8, 64, 16), BATCHED),
}


@pytest.mark.parametrize("layout", list(COPY_SHAPES))
@pytest.mark.parametrize("element_type", ["f32", "f64"])
@pytest.mark.parametrize("epilogue", [None, "bias_relu"])
def test_copied_blocks_match_the_evaluator(layout: str, element_type: str,
                                           epilogue: str | None) -> None:
    """Chosen by the shape, not forced: the copy (or, for the narrow product, one-vector
    blocks) against the evaluator, on two threads."""
    lhs, rhs, dims = COPY_SHAPES[layout]
    lhs_shape, rhs_shape = Shape(element_type, lhs), Shape(element_type, rhs)
    assert dot_codegen.choose_strategy(_plan(lhs_shape, rhs_shape, dims)) == "blocked"
    _, executable = _check(lhs_shape, rhs_shape, dims, epilogue, threads=2, seed=11)
    text = executable.llvm_ir
    assert "gemm" not in text and f"dot_block.{element_type}.product" not in text
    assert ("dot.b_copy" in text) == (layout != "narrow_batched")


def test_copied_blocks_of_avx2_width_match_the_evaluator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dot_blocks, "_vector_bits", lambda: 256)
    for element_type in ("f32", "f64"):
        _, executable = _check(Shape(element_type, (29, 37)), Shape(element_type, (53, 37)),
                               RHS_T, "bias_relu", threads=2, seed=12)
        assert "dot.b_copy" in executable.llvm_ir


def test_copied_blocks_do_not_depend_on_units_or_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles that start past column 0 read their own columns of the copy: the product cut
    into many uneven tiles, on one thread and on two, gives the bits of one unit."""
    lhs, rhs = Shape("f32", (45, 40)), Shape("f32", (70, 40))
    plan = _plan(lhs, rhs, RHS_T)
    assert dot_codegen.schedule(plan).units == 1 and dot_blocks.fits_copy(plan)
    (whole,), _ = _check(lhs, rhs, RHS_T, "bias_relu", threads=1, seed=13)
    monkeypatch.setattr(dot_codegen, "MIN_UNIT_FLOPS", 64)
    sched = dot_codegen.schedule(plan)
    assert sched.tiles_m > 1 and sched.tiles_n > 1 and plan.n % sched.block_n
    for threads in (1, 2):
        (tiled,), executable = _check(lhs, rhs, RHS_T, "bias_relu", threads=threads, seed=13)
        assert "dot.b_copy" in executable.llvm_ir
        np.testing.assert_array_equal(tiled, whole)


def test_copied_blocks_keep_their_edge_values() -> None:
    """NaN, ±inf and -0.0 through the copy give the evaluator's NaN, infinities and
    zeros (a sum of -0.0 products stays -0.0 only where every term is)."""
    lhs = np.zeros((40, 16), np.float32)
    rhs = np.ones((60, 16), np.float32)
    lhs[0, 3], lhs[1, 15], lhs[2, 0], lhs[3, :] = np.nan, np.inf, -np.inf, -0.0
    rhs[4, 15], rhs[59, :] = -np.inf, 0.0
    _, module = _dense(Shape("f32", lhs.shape), Shape("f32", rhs.shape), RHS_T, None)
    expected = evaluate(module, lhs, rhs)[0]
    executable = compile_module(module, cache=False)
    assert "dot.b_copy" in executable.llvm_ir
    got = executable(lhs, rhs)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(got[finite], expected[finite])
    np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(expected[finite]))
