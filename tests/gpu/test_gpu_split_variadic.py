"""Variadic reductions (ArgMax/ArgMin over all elements, or over a few long rows) split over
blocks (issue #7): blocks fold fixed chunks of each row into (value, index) partials, a
second kernel folds each row's partials in chunk order, then the init pair.

XLA's ArgMax reducer (`minmax_func`, as TF's XLA prints it) keeps the larger value and,
on equal values, the smaller index: without NaN it is associative and commutative, so
any fixed tree gives the sequential fold's answer, the first index of the extreme. With
NaN it is not (`docs/gpu.md`, "Variadic reductions and NaN"): those inputs are checked
for determinism only. TF's own ArgMax (NaN never wins), which tfxla-lite lowers without a
variadic reduce, is checked through `tfxla_lite.function` on the emulated GPU against
TF's result.
"""

from __future__ import annotations

import sys

import cuda_emulator
import fake_cupy
import ml_dtypes
import numpy as np
import pytest
from gpu_checks import assert_matches
from gpu_modules import MODULES, arg_reduce
from hlo_builders import flatten

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.hlo.evaluator import evaluate

SPLIT = ["argmax_full_split", "argmin_full_split_f16", "argmax_few_rows_split",
         "argmin_few_rows_split_bf16"]
needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")


def tie_arguments(name: str, seed: int = 0) -> list[np.ndarray]:
    """Small integers (the extreme occurs in many chunks of every row), the extreme put
    first in some chunks, at chunk ends and as a row's last element; one row all equal."""
    module = MODULES[name]()
    shape = module.entry.parameters[0].shape
    rng = np.random.default_rng(seed)
    values = rng.integers(-3, 4, size=shape.dims).astype(np.float64)
    rows = values.reshape(-1, shape.dims[-1])
    plan = emit_module(MODULES[name]())[0].thunks[0].plan
    for r, row in enumerate(rows):
        row[row == 3] = 2  # no extreme yet: place it where it is easy to get wrong
        row[row == -3] = -2
        extreme = 3 if "argmax" in name else -3
        if r == 0:
            row[-1] = extreme  # the last element only
        elif r == 1:
            row[:] = 1  # all equal: index 0
        else:
            for c in range(1, plan.chunks):
                row[c * plan.chunk - 1] = row[c * plan.chunk] = extreme  # across a border
    dtype = shape.numpy_dtype
    return [values.astype(dtype)]


def test_gpu_variadic_reductions_of_few_long_rows_split() -> None:
    """A split plan, two kernels, one partial array per accumulator in the scratch area
    (values and indices, 256-byte aligned), a block per row in the second kernel."""
    for name in SPLIT:
        program, _, _ = emit_module(MODULES[name](), verify=True)
        (thunk,) = program.thunks
        plan = thunk.plan
        rows = 1 if "full" in name else MODULES[name]().entry.parameters[0].shape.dims[0]
        assert plan.kind == "split-reduction" and plan.rows == rows and plan.chunks > 1
        assert plan.launch.units == rows * plan.chunks
        assert thunk.functions == [plan.name + "_partials", plan.name]
        assert program.kernel_count == 2
        slots = -(-rows * plan.chunks * 8 // 256) * 256
        assert program.scratch_bytes == slots + rows * plan.chunks * 8
        text = program.source
        assert f"static_cast<char*>(scratch) + {slots});" in text
        assert f"for (int row = blockIdx.x; row < {rows}; row += gridDim.x)" in text
    # Many rows stay a block (or warp) per row; a short full reduction stays one block.
    for dims, kind in (((65, 70000), "row-reduction"), ((60000,), "row-reduction")):
        program, _, _ = emit_module(arg_reduce(dims, len(dims) - 1))
        assert [t.plan.kind for t in program.thunks] == [kind], dims


def test_gpu_split_variadic_launches_a_block_per_row_for_the_partials(
        fake_gpu: fake_cupy.Recorder) -> None:
    executable = compile_module(MODULES["argmax_few_rows_split"]())
    executable.run_numpy(*tie_arguments("argmax_few_rows_split"))
    partials, final = fake_gpu.launches
    plan = executable.program.thunks[0].plan
    assert partials.grid[0] == plan.rows * plan.chunks and final.grid == (plan.rows,)
    assert partials.arguments[-1].data.ptr == final.arguments[-1].data.ptr


@needs_gxx
@pytest.mark.parametrize("name", SPLIT)
def test_gpu_emulated_split_variadic_matches_the_evaluator(
        emulated: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Ties everywhere (within chunks, across chunk borders, a whole row): the first index
    of the extreme, as the evaluator's sequential fold gives it, on one block and on
    three with the same bits."""
    args = tie_arguments(name)
    expected = flatten(evaluate(MODULES[name](), *args))
    results = []
    for blocks in (1, 3):
        monkeypatch.setattr(cuda_emulator, "MAX_BLOCKS", blocks)
        results.append(compile_module(MODULES[name](), verify=True).run_numpy(*args))
        assert_matches(results[-1], expected, f"{name} on {blocks} block(s)")
    for one, three in zip(*results, strict=True):
        assert one.tobytes() == three.tobytes()
    # The answer is where the test put it (not only what the evaluator says).
    indices = results[0][0].reshape(-1)
    values = args[0].reshape(len(indices), -1)
    for row, index in zip(values, indices):
        extreme = row.max() if "argmax" in name else row.min()
        assert index == int(np.flatnonzero(row == extreme)[0])


@needs_gxx
def test_gpu_emulated_split_variadic_with_nan_is_deterministic(
        emulated: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """XLA's reducer is not associative with NaN (a NaN pair loses to the next value
    folded into it), so no parallel order reproduces the sequential fold; the split's
    answer is still fixed by the shapes: the same bits on one block and on three."""
    name = "argmax_full_split"
    args = tie_arguments(name)
    args[0][::997] = np.nan
    results = []
    for blocks in (1, 3):
        monkeypatch.setattr(cuda_emulator, "MAX_BLOCKS", blocks)
        results.append(compile_module(MODULES[name]()).run_numpy(*args))
    for one, three in zip(*results, strict=True):
        assert one.tobytes() == three.tobytes()


# -- against TF ----------------------------------------------------------------------------

def _tf() -> object:
    return pytest.importorskip("tensorflow", reason="no TensorFlow")


@needs_gxx
@pytest.mark.parametrize(("kind", "dtype"), [("max", np.float32), ("min", np.float16)])
def test_gpu_emulated_split_of_tf_xla_argmax_matches_tf(
        emulated: fake_cupy.Recorder, kind: str, dtype: type) -> None:
    """The variadic reduce TF's XLA prints for ArgMax/ArgMin over 70000 elements, parsed,
    compiled by the GPU backend (a split plan) and run on the emulator: TF's own
    `tf.argmax`/`tf.argmin` result on tie-heavy data."""
    tf = _tf()
    from tfxla_lite.hlo.parser import parse_module

    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, size=70000).astype(dtype)
    x[[5, 16383, 16384, 40000]] = 9 if kind == "max" else -9
    op = tf.argmax if kind == "max" else tf.argmin
    function = tf.function(lambda v: op(v, output_type=tf.int32), jit_compile=True)
    text = function.experimental_get_compiler_ir(tf.constant(x))(stage="hlo")
    executable = compile_module(parse_module(text), verify=True)
    assert [t.plan.kind for t in executable.program.thunks] == ["split-reduction"]
    (got,) = executable.run_numpy(x)
    assert int(got) == int(op(x, output_type=tf.int32)) == 5


@needs_gxx
def test_gpu_full_argmax_through_tf_on_the_emulated_gpu(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """TF's ArgMax and ArgMin over all 70000 elements (NaN, ties) and over 3 long rows,
    in `tfxla_lite.function` on the emulated GPU (tfxla-lite lowers them to a max and a
    min reduction, split over blocks): TF's own results, NaN never winning."""
    tf = _tf()
    from emulated_backend import EmulatedGpuBackend

    import tfxla_lite as tl
    from tfxla_lite.codegen.gpu import executable as executable_module
    from tfxla_lite.runtime import gpu_launch

    if tf.config.list_logical_devices("GPU"):
        pytest.skip("TF has a real GPU, whose tensors the emulator cannot read")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy.module(emulate=True))
    monkeypatch.setattr(executable_module, "_modules", {})
    recorder = fake_cupy.Recorder()
    monkeypatch.setattr(fake_cupy, "RECORDER", recorder)

    def arg_extremes(x: object, rows: object) -> tuple[object, ...]:
        return (tf.argmax(tf.reshape(x, [-1]), output_type=tf.int32),
                tf.argmin(tf.reshape(x, [-1]), output_type=tf.int32),
                tf.argmax(rows, axis=1, output_type=tf.int32))

    rng = np.random.default_rng(5)
    x = rng.integers(-3, 4, size=70000).astype(np.float32)
    x[[0, 20000, 69999]] = np.nan
    x[[16384, 50000]] = 7.0
    x[[100, 65536]] = -7.0
    rows = rng.integers(-3, 4, size=(3, 66000)).astype(np.float32)
    rows[0, [3, 40000]] = np.nan
    rows[1, 65999] = 5.0
    with gpu_launch.use_backend(EmulatedGpuBackend()):
        function = tl.function(arg_extremes, jit_compile=True)
        got = function(tf.constant(x), tf.constant(rows))
    expected = arg_extremes(tf.constant(x), tf.constant(rows))
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g.numpy(), e.numpy())
    assert [int(v) for v in got[:2]] == [16384, 100]
    assert any(launch.name.endswith("_partials") for launch in recorder.launches)


def test_gpu_bf16_arguments_are_exact_small_integers() -> None:
    """The tie data survive bf16 and f16 exactly (small integers), so the ties are real."""
    for name in ("argmin_full_split_f16", "argmin_few_rows_split_bf16"):
        (x,) = tie_arguments(name)
        assert x.dtype in (np.float16, ml_dtypes.bfloat16)
        assert np.array_equal(x.astype(np.float64), np.round(x.astype(np.float64)))
