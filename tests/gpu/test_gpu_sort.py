"""The GPU kernels of HLO `sort` and `topk` (codegen/gpu/sort.py): their CUDA compiles with
nvcc, and on the CPU emulator (`cuda_emulator`, through the whole `GpuExecutable`) their
results are the evaluator's bit for bit, the same permutation included: over shapes
(empty and 1-sized rows, odd lengths, several rows, a non-last sorted dimension), element
types, NaN and -0.0, k = 0, a comparator that is no strict weak order, and long rows
whose index arrays live in scratch memory."""

from __future__ import annotations

import sys
from pathlib import Path

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from hlo_builders import flatten

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.codegen.gpu import sort as gpu_sort
from tfxla_lite.codegen.gpu.nvcc import DEFAULT_ARCHES, batch_source, check_ptx, find_nvcc
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.shape import numpy_dtype

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from test_sort_kernel import _module, _topk_module  # noqa: E402  (the CPU tests' modules)

needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")


def _top_k_order_module(dims: tuple[int, ...], etype: str) -> str:
    """sort(x, iota) under TopKV2's comparator (clustering/rules_nn.py `_top_k_order`):
    largest first, NaN above numbers, ties by index; a total order."""
    shape = f"[{','.join(map(str, dims))}]"
    last = len(dims) - 1
    return f"""HloModule top_k_order

%order (lhs: {etype}[], rhs: {etype}[], lhs_index: s32[], rhs_index: s32[]) -> pred[] {{
  %lhs = {etype}[] parameter(0)
  %rhs = {etype}[] parameter(1)
  %lhs_index = s32[] parameter(2)
  %rhs_index = s32[] parameter(3)
  %greater = pred[] compare({etype}[] %lhs, {etype}[] %rhs), direction=GT
  %equal = pred[] compare({etype}[] %lhs, {etype}[] %rhs), direction=EQ
  %nan_lhs = pred[] compare({etype}[] %lhs, {etype}[] %lhs), direction=NE
  %nan_rhs = pred[] compare({etype}[] %rhs, {etype}[] %rhs), direction=NE
  %number_rhs = pred[] not(pred[] %nan_rhs)
  %nan_first = pred[] and(pred[] %nan_lhs, pred[] %number_rhs)
  %ahead = pred[] or(pred[] %greater, pred[] %nan_first)
  %both_nan = pred[] and(pred[] %nan_lhs, pred[] %nan_rhs)
  %same = pred[] or(pred[] %equal, pred[] %both_nan)
  %earlier = pred[] compare(s32[] %lhs_index, s32[] %rhs_index), direction=LT
  %tie = pred[] and(pred[] %same, pred[] %earlier)
  ROOT %before = pred[] or(pred[] %ahead, pred[] %tie)
}}

ENTRY %main (x: {etype}{shape}) -> ({etype}{shape}, s32{shape}) {{
  %x = {etype}{shape} parameter(0)
  %iota = s32{shape} iota(), iota_dimension={last}
  ROOT %sort = ({etype}{shape}, s32{shape}) sort(%x, %iota), dimensions={{{last}}},
    is_stable=true, to_apply=%order
}}
"""


def _values(dims: tuple[int, ...], etype: str, seed: int = 0) -> np.ndarray:
    """Few distinct values (many ties); floats with NaN and -0.0 among them."""
    rng = np.random.default_rng(seed)
    if etype.startswith("u"):
        return rng.integers(0, 9, dims).astype(numpy_dtype(etype))
    if etype.startswith("s"):
        return rng.integers(-4, 4, dims).astype(numpy_dtype(etype))
    wide = rng.integers(-4, 4, dims).astype(np.float32)
    wide.flat[::7] = np.nan
    wide.flat[3::11] = -0.0
    wide.flat[5::13] = np.inf
    return wide.astype(numpy_dtype(etype))


def _check(text: str, *args: np.ndarray) -> list[np.ndarray]:
    """The emulated GPU's results against the evaluator's, byte for byte."""
    got = compile_module(parse_module(text), verify=True, cache=False).run_numpy(*args)
    want = flatten(evaluate(parse_module(text), *args))
    assert len(got) == len(want)
    for n, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.ascontiguousarray(g), np.ascontiguousarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, n
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8), err_msg=f"output {n}")
    return got


SORT_SHAPES = [((5,), 0), ((3, 7), 1), ((3, 7), 0), ((2, 5, 4), 1), ((1, 1), 1), ((0, 4), 1),
               ((4, 0), 1), ((2, 1, 3), 1), ((2, 67), 1)]
SORT_TYPES = ["f16", "bf16", "s32", "u8"]
TOPK_CASES = [((2, 6), 3, "f32", True), ((3, 50), 7, "f32", False), ((4, 9), 0, "f32", True),
              ((0, 5), 2, "f32", True), ((5, 1), 1, "s32", True), ((3, 100), 10, "bf16", True),
              ((3, 100), 10, "f16", False), ((2, 64), 5, "u8", True), ((2, 3, 40), 40, "f32", True),
              ((3, 33), 33, "f32", False), ((2, 150), 100, "f32", True),
              ((3, 700), 64, "f32", True), ((2, 300), 9, "f64", False)]


def _texts() -> dict[str, str]:
    """Every module these tests run, for the nvcc check."""
    texts = {f"sort_{dims}_{d}": _module(dims, d) for dims, d in SORT_SHAPES}
    texts.update({f"sort_{t}": _module((3, 11), 1, t, "LT") for t in SORT_TYPES})
    texts["sort_mixed"] = _module((4, 9), 1, extra="pred")
    texts["sort_long"] = _module((2, gpu_sort.SHARED_ELEMENTS + 3), 1)
    texts["top_k_order"] = _top_k_order_module((3, 29), "f32")
    texts["one_operand"] = ONE_OPERAND
    texts.update({f"topk_{dims}_{k}_{t}_{largest}": _topk_module(dims, k, t, largest)
                  for dims, k, t, largest in TOPK_CASES})
    return texts


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit)")
def test_gpu_sort_and_topk_kernels_compile_with_nvcc() -> None:
    bodies = {}
    for name, text in _texts().items():
        program, _, _ = emit_module(parse_module(text), verify=True)
        kinds = {t.plan.kind for t in program.thunks}
        assert kinds & {"sort", "topk"}, name
        bodies[name] = program.body
    source = batch_source(bodies, {"f16", "bf16"})
    for arch in DEFAULT_ARCHES:
        result = check_ptx({"batch": source}, arch)
        assert result.ok, f"nvcc -arch={arch}:\n{result.output[:8000]}"


def test_gpu_sort_plans_and_scratch() -> None:
    program, _, _ = emit_module(parse_module(_module((3, 7), 1)))
    (thunk,) = [t for t in program.thunks if t.plan.kind == "sort"]
    assert thunk.plan.rows == 3 and thunk.plan.width == 7 and thunk.plan.launch.block == (32, 1)
    assert program.scratch_bytes == 0 and "__shared__ int order[14]" in program.body
    n = gpu_sort.SHARED_ELEMENTS + 3
    program, _, _ = emit_module(parse_module(_module((5, n), 1)))
    (thunk,) = [t for t in program.thunks if t.plan.kind == "sort"]
    assert thunk.plan.extra["blocks"] == 5 and program.scratch_bytes == 5 * 2 * n * 4
    assert "void* __restrict__ scratch" in program.body and "__shared__" not in program.body
    assert thunk.plan.launch.block == (gpu_sort.SORT_MAX_THREADS, 1)
    assert gpu_sort.scratch_blocks(10**6, n) == gpu_sort.SCRATCH_MAX_BLOCKS
    assert gpu_sort.scratch_blocks(3, 1 << 30) == 1  # one block's, over the budget


def test_gpu_topk_plans_a_block_per_row_where_the_buffers_fit() -> None:
    # Two sets of 256 buffers of k (4-byte value, index) pairs in 32 KiB: k <= 8.
    assert gpu_sort.topk_team(8, "f32") == 256 and gpu_sort.topk_team(9, "f32") == 128
    assert gpu_sort.topk_team(64, "f32") == 32 and gpu_sort.topk_team(64, "f16") == 32
    assert gpu_sort.topk_team(65, "f32") == 0 and gpu_sort.topk_team(0, "f32") == 0
    for (k, team) in ((10, 128), (100, 0)):
        program, _, _ = emit_module(parse_module(_topk_module((4, 300), k, "f32", True)))
        (plan,) = [t.plan for t in program.thunks if t.plan.kind == "topk"]
        assert plan.team == team
        assert plan.launch.block == ((team, 1) if team else (gpu_sort.TOPK_THREADS, 1))
        assert ("__shared__" in program.body) == bool(team)


@needs_gxx
@pytest.mark.parametrize(("dims", "dimension"), SORT_SHAPES)
def test_gpu_sort_shapes_match_the_evaluator(emulated: fake_cupy.Recorder,
                                             dims: tuple[int, ...], dimension: int) -> None:
    _check(_module(dims, dimension), _values(dims, "f32", 1))


@needs_gxx
@pytest.mark.parametrize("etype", SORT_TYPES)
def test_gpu_sort_element_types_match_the_evaluator(emulated: fake_cupy.Recorder,
                                                    etype: str) -> None:
    _check(_module((3, 11), 1, etype, "LT"), _values((3, 11), etype, 2))


@needs_gxx
def test_gpu_sort_moves_operands_of_mixed_types_together(emulated: fake_cupy.Recorder) -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 4, (4, 9)).astype(np.float32)
    y = rng.integers(0, 2, (4, 9)).astype(np.bool_)
    _, indices, moved = _check(_module((4, 9), 1, extra="pred"), x, y)
    np.testing.assert_array_equal(moved, np.take_along_axis(y, indices, 1))


@needs_gxx
def test_gpu_sort_under_a_comparator_that_is_no_order(emulated: fake_cupy.Recorder) -> None:
    # Plain GT leaves NaN unordered: the GPU runs the evaluator's merge, comparison for
    # comparison, so even this permutation is the same (a stable sort by another
    # algorithm would differ here).
    x = np.array([[1, np.nan, 3, -np.inf, np.nan, 0.0, -0.0, np.inf, 3, 2, np.nan, 5, np.nan,
                   -1]], np.float32)
    _check(_module(x.shape, 1), x)


# One operand (an array, not a tuple), sorted down its columns, read by kernels after it.
ONE_OPERAND = """HloModule one_operand

%less (x: s32[], y: s32[]) -> pred[] {
  %x = s32[] parameter(0)
  %y = s32[] parameter(1)
  ROOT %lt = pred[] compare(s32[] %x, s32[] %y), direction=LT
}

ENTRY %main (a: s32[9,3]) -> (s32[9,3], s32[3,3]) {
  %a = s32[9,3]{1,0} parameter(0)
  %twice = s32[9,3]{1,0} add(%a, %a)
  %sort = s32[9,3]{1,0} sort(s32[9,3]{1,0} %twice), dimensions={0}, to_apply=%less
  %head = s32[3,3]{1,0} slice(%sort), slice={[0:3], [0:3]}
  %negated = s32[3,3]{1,0} negate(%head)
  ROOT %out = (s32[9,3], s32[3,3]) tuple(%sort, %negated)
}
"""


@needs_gxx
def test_gpu_sort_of_one_operand_between_other_kernels(emulated: fake_cupy.Recorder) -> None:
    program, _, _ = emit_module(parse_module(ONE_OPERAND))
    assert "sort" in [t.plan.kind for t in program.thunks] and len(program.thunks) >= 3
    _check(ONE_OPERAND, _values((9, 3), "s32", 7))


@needs_gxx
def test_gpu_sort_under_topkv2s_comparator(emulated: fake_cupy.Recorder) -> None:
    x = _values((3, 29), "f32", 4)
    values, indices = _check(_top_k_order_module(x.shape, "f32"), x)
    wanted = flatten(evaluate(parse_module(_topk_module(x.shape, 29, "f32", True)), x))
    np.testing.assert_array_equal(indices, wanted[1])


@needs_gxx
def test_gpu_sort_long_rows_in_scratch_on_one_and_three_blocks(
        emulated: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows past shared memory: index arrays in each block's scratch region, fewer blocks
    than rows (grid-stride); the grid does not change the bits."""
    monkeypatch.setattr(gpu_sort, "SHARED_ELEMENTS", 32)
    monkeypatch.setattr(gpu_sort, "SCRATCH_BUDGET", 2 * 2 * 45 * 4)  # two blocks' worth
    x = _values((5, 45), "f32", 5)
    text = _module(x.shape, 1)
    program, _, _ = emit_module(parse_module(text))
    assert "scratch" in program.body and program.scratch_bytes == 2 * 2 * 45 * 4
    results = []
    for blocks in (1, 3):
        monkeypatch.setattr(cuda_emulator, "MAX_BLOCKS", blocks)
        results.append(_check(text, x))
    for one, three in zip(*results):
        assert one.tobytes() == three.tobytes()


@needs_gxx
@pytest.mark.parametrize(("dims", "k", "etype", "largest"), TOPK_CASES)
def test_gpu_topk_matches_the_evaluator(emulated: fake_cupy.Recorder, dims: tuple[int, ...],
                                        k: int, etype: str, largest: bool) -> None:
    _check(_topk_module(dims, k, etype, largest), _values(dims, etype, 6))


@needs_gxx
def test_gpu_topk_of_an_ascending_row(emulated: fake_cupy.Recorder) -> None:
    x = np.arange(300, dtype=np.float32).reshape(1, 300)
    values, indices = _check(_topk_module(x.shape, 16, "f32", True), x)
    np.testing.assert_array_equal(indices[0], np.arange(299, 283, -1))


@needs_gxx
def test_gpu_top_k_through_tf_compiles_and_matches_tf(emulated_gpu: fake_cupy.Recorder) -> None:
    """tf.math.top_k of long rows on GPU:0 compiles (it stayed in TF before these
    kernels): k <= 64 through HLO `topk`, more through `sort`; TF's values and indices
    exactly, ties (and -0.0 against 0.0) by index."""
    tf = pytest.importorskip("tensorflow")
    import tfxla_lite as tl

    @tl.function(jit_compile=True)
    def top(x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        with tf.device("/GPU:0"):
            small = tf.math.top_k(x, k=5)
            large = tf.math.top_k(x, k=100)
            return small.values, small.indices, large.values, large.indices

    x = np.random.default_rng(8).integers(-20, 20, (3, 400)).astype(np.float32)
    x[x == 3] = -0.0
    x[x == 4] = 0.0
    got = top(tf.constant(x))
    for n, k in enumerate((5, 100)):
        want = tf.math.top_k(tf.constant(x), k=k)
        assert got[2 * n].numpy().tobytes() == want.values.numpy().tobytes()
        np.testing.assert_array_equal(got[2 * n + 1].numpy(), want.indices.numpy())
    compiled = top._program(*top._canonical((tf.constant(x),), {})).compiled  # noqa: SLF001
    programs = [c.gpu_launch.executable.program for c in compiled if c.gpu_launch is not None]
    kinds = {t.plan.kind for program in programs for t in program.thunks}
    assert {"topk", "sort"} <= kinds, [p.plan_text() for p in programs]
    assert emulated_gpu.launches
