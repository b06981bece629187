"""Generated kernels computed on the CPU emulator (`cuda_emulator`), through the whole
`GpuExecutable` (with `fake_cupy` standing in for CuPy), against the NumPy evaluator.

No GPU needed: g++ compiles each program against a shim of the CUDA built-ins the
kernels use, and every block runs with one OS thread per CUDA thread, real barriers and
warp shuffles. A representative module per template runs by default (each costs a g++
compile and thousands of thread switches); `-m slow` runs every module.
"""

from __future__ import annotations

import cuda_emulator
import fake_cupy
import gpu_corpus
import pytest
from emulated_runs import assert_same_bits_on_one_and_three_blocks
from gpu_checks import assert_matches, edge_arguments
from gpu_modules import MODULES, NOT_RUN
from hlo_builders import flatten, random_arguments

from tfxla_lite.codegen.gpu import compile_module
from tfxla_lite.hlo.evaluator import evaluate

pytestmark = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")

# One module per template (and the semantics most easily got wrong: conversions at the
# edges of every type, half precision, variadic reductions, indexing ops).
REPRESENTATIVE = ("softmax_warp_rows", "layer_norm", "reduce_sum_split", "row_reduce_block",
                  "column_reduce", "multi_output_rows_warp", "multi_output_columns",
                  "argmax_rows", "dot_epilogue", "data_movement_f16", "convert_all_pairs",
                  "elementwise_vectorized", "scatter_add_rows", "binary_s8", "unary_bf16")
EVERY = sorted(set(MODULES) - NOT_RUN - set(REPRESENTATIVE))
EDGE_CASES = frozenset({"convert_all_pairs", "binary_s8", "unary_bf16"})


def _check(name: str) -> None:
    module = MODULES[name]()
    args = edge_arguments(module) if name in EDGE_CASES else random_arguments(module)
    expected = flatten(evaluate(MODULES[name](), *args))
    executable = compile_module(MODULES[name](), verify=True)
    assert_matches(executable.run_numpy(*args), expected, f"{name} (emulated)")


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_gpu_emulated_kernels_match_the_evaluator(emulated: fake_cupy.Recorder,
                                                  name: str) -> None:
    _check(name)
    assert emulated.launches or emulated.gemms


@pytest.mark.slow
@pytest.mark.parametrize("name", EVERY)
def test_gpu_every_module_emulated_matches_the_evaluator(emulated: fake_cupy.Recorder,
                                                         name: str) -> None:
    _check(name)


def test_gpu_emulated_results_do_not_depend_on_the_grid(
        emulated: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Grid-stride loops and fixed fold trees: one block or three, the same bits."""
    assert_same_bits_on_one_and_three_blocks("row_reduce_block", monkeypatch)


@pytest.mark.parametrize(("rows", "width"), [(20, 100), (6, 600)])
def test_gpu_emulated_row_group_matches_the_evaluator(emulated: fake_cupy.Recorder, rows: int,
                                                      width: int) -> None:
    """Softmax's stages left as separate kernels (no `fuse-rows`), merged by the GPU
    backend into one row-group kernel: warp teams and block teams."""
    from gpu_modules import softmax

    pipeline = "simplify,constant-folding,cse,simplify,dce,fuse,dce,add-output-copies"
    args = random_arguments(softmax(rows, width))
    expected = flatten(evaluate(softmax(rows, width), *args))
    executable = compile_module(softmax(rows, width), pipeline=pipeline)
    assert [t.plan.kind for t in executable.program.thunks] == ["row-group"]
    assert_matches(executable.run_numpy(*args), expected, "softmax as a row group")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(gpu_corpus.corpus()))
def test_gpu_tf_corpus_emulated_matches_the_evaluator(emulated: fake_cupy.Recorder,
                                                      name: str) -> None:
    """The TF-printed corpus (both stages) computed by the emulator."""
    gpu_corpus.check(name)



COLUMN_CASES = {
    "fewer_rows_than_slices": lambda m: m.reduction((3, 50), (0,)),  # slices 3..7 empty
    "middle_partial_tile": lambda m: m.reduction((7, 70, 5), (1,)),  # 35 outputs: 32 + 3
    "around_a_kept_dim": lambda m: m.reduction((40, 9, 33), (0, 2)),
    "maximum": lambda m: m.reduction((70, 40), (0,), kind="maximum"),
    "bf16_in_f32": lambda m: m.reduction((100, 30), (0,), "bf16"),
    "argmax_f64": lambda m: m.argmax((300, 20), 0, "f64"),
    "multi_output": lambda m: m.row_statistics(500, 40, (0,)),
}


@pytest.mark.parametrize("case", sorted(COLUMN_CASES))
def test_gpu_emulated_column_tiles_reuse_shared_memory(
        emulated: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Column reductions' 32x8 tiles, their slices combined through shared memory: with
    one block, the block strides over every tile and reuses the shared arrays (the
    barrier closing each tile keeps the next tile's writes behind the last reads);
    partial tiles, empty slices, two reduced dimensions around a kept one, variadic and
    multi-output tiles. Same bits on one block as on three, and the evaluator's values."""
    import gpu_modules

    build = COLUMN_CASES[case]
    args = random_arguments(build(gpu_modules))
    expected = flatten(evaluate(build(gpu_modules), *args))
    results = []
    for blocks in (1, 3):
        monkeypatch.setattr(cuda_emulator, "MAX_BLOCKS", blocks)
        executable = compile_module(build(gpu_modules), verify=True)
        kinds = {thunk.plan.kind for thunk in executable.program.thunks}
        assert kinds & {"column-reduction", "multi-output"}, kinds
        results.append(executable.run_numpy(*args))
        assert_matches(results[-1], expected, f"{case} on {blocks} block(s)")
    for one, three in zip(*results, strict=True):
        assert one.tobytes() == three.tobytes()


@pytest.mark.parametrize("name", ["multi_output_rows_warp", "multi_output_rows_block",
                                  "multi_output_columns"])
def test_gpu_emulated_sibling_reduces_fold_in_one_phase(emulated: fake_cupy.Recorder,
                                                        name: str) -> None:
    """A multi-output kernel folds its sibling reduces (sum of exp, sum of squares, max)
    in one pass over the input, each in the order its own kernel folds it: the same bits
    as the three reduction kernels the pipeline makes without `multi-output-fusion`,
    and the evaluator's values."""
    separate = "call-inliner,simplify,constant-folding,cse,simplify,dce,fuse,dce," \
        "add-output-copies,schedule"
    args = random_arguments(MODULES[name]())
    fused = compile_module(MODULES[name](), verify=True)
    alone = compile_module(MODULES[name](), pipeline=separate)
    assert [t.plan.kind for t in fused.program.thunks] == ["multi-output"]
    assert len(alone.program.thunks) == 4
    results = fused.run_numpy(*args)
    assert_matches(results, flatten(evaluate(MODULES[name](), *args)), name)
    for one, other in zip(results, alone.run_numpy(*args), strict=True):
        assert one.tobytes() == other.tobytes()
