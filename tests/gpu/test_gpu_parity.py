"""Parity of the GPU backend with the CPU backend: what the current pipeline hands the CPU
backend (the benchmark workloads' clusters, Keras training steps included; dots as
`dot-folding` leaves them; 2-byte float sums accumulating in f32) compiles to CUDA and
computes, on the CPU emulator, what the NumPy evaluator computes.

No GPU needed (g++ and the emulator of `cuda_emulator`). The workloads' modules come from
`workload_hlo.json` (`gpu_workloads.py`): the "quick" set runs by default, the benchmark
sizes with `-m slow`; nvcc compiles both sets in `test_gpu_nvcc.py`.
"""

from __future__ import annotations

import sys

import cuda_emulator
import fake_cupy
import gpu_workloads
import numpy as np
import pytest
from gpu_modules import MODULES
from hlo_builders import flatten

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.codegen.gpu.elemental import accumulates_in_f32
from tfxla_lite.hlo.evaluator import evaluate

pytestmark = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")

QUICK = sorted(gpu_workloads.corpus("quick"))
FULL = sorted(gpu_workloads.corpus("full"))


def test_gpu_workload_snapshot_covers_the_suite() -> None:
    """Both sets hold every workload of the benchmark, the training steps included."""
    names = {key.split(".")[1] for key in QUICK}
    assert {"mlp_train_b8", "transformer_train_b2", "softmax_64x128", "layer_norm_64x128",
            "reduce_sum_fma", "mlp", "gelu", "self_attention"} <= names
    from_full = {key.split(".")[1] for key in FULL}
    assert {"mlp_train_b128", "transformer_train_b8", "softmax_4096x1024",
            "reduce_sum_fma", "mlp_infer_b64"} <= from_full


@pytest.mark.parametrize("name", QUICK)
def test_gpu_workload_clusters_emulated_match_the_evaluator(emulated: fake_cupy.Recorder,
                                                            name: str) -> None:
    gpu_workloads.check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL)
def test_gpu_full_size_workload_clusters_emulated(emulated: fake_cupy.Recorder,
                                                  name: str) -> None:
    gpu_workloads.check(name)


def test_gpu_training_step_reaches_every_fusion_kind() -> None:
    """The Transformer step at benchmark size exercises every kind of kernel the
    pipeline makes (so the tests above cover all of them; at test size it makes no
    multi-output kernel). Its bias gradients are column reductions inside multi-output
    kernels (with the reshapes of what they reduce); a column-reduction kernel of its own
    is exercised by gpu_modules' column_reduce, middle_reduce and argmax_columns."""
    from tfxla_lite.hlo.parser import parse_module

    entry = gpu_workloads.corpus("full")["full.transformer_train_b8.0"]
    program, _, _ = emit_module(parse_module(entry["hlo"]))
    kinds = {thunk.plan.kind for thunk in program.thunks}
    assert {"dot", "dot-epilogue", "loop", "multi-output", "row-fusion"} <= kinds


@pytest.mark.parametrize("element_type", ["f32", "f16", "bf16", "s32"])
def test_gpu_dot_dimension_numbers_emulated(emulated: fake_cupy.Recorder,
                                            element_type: str) -> None:
    """Contracting dimensions first or last, batch dimensions in the middle or two of
    them, two contracting dimensions around a free one, vectors, empty operands."""
    module = MODULES[f"dot_layouts_{element_type}"]
    rng = np.random.default_rng(3)
    args = [rng.integers(-3, 4, size=p.shape.dims).astype(p.shape.numpy_dtype)
            for p in module().entry.parameters]
    expected = flatten(evaluate(module(), *args))
    executable = compile_module(module(), verify=True)
    outputs = executable.run_numpy(*args)
    assert bool(emulated.gemms) == (element_type != "s32")  # cuBLAS's types
    for n, (got, wanted) in enumerate(zip(outputs, expected, strict=True)):
        # Small integers: every product and sum is exact in every type, in any order.
        np.testing.assert_array_equal(np.asarray(got).astype(np.float64),
                                      np.asarray(wanted).astype(np.float64),
                                      err_msg=f"dot {n}")


def _batch(lhs: tuple[int, ...], rhs: tuple[int, ...], lc: tuple[int, ...],
           rc: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    return {"lhs_batch_dims": lhs, "rhs_batch_dims": rhs, "lhs_contracting_dims": lc,
            "rhs_contracting_dims": rc}


@pytest.mark.parametrize(("lhs_dims", "rhs_dims", "numbers", "copies", "calls"), [
    ((64, 32), (64, 16), _batch((), (), (0,), (0,)), 0, 1),  # x^T . dy
    ((64, 32), (16, 32), _batch((), (), (1,), (1,)), 0, 1),  # dy . w^T
    # a weight gradient summed over the batch (dot-folding's "reduced batch"): [b, s, f]
    ((4, 8, 32), (4, 8, 16), _batch((), (), (0, 1), (0, 1)), 0, 1),
    # batched with the contracting dimension first: op T, no copy (CuPy's matmul copied)
    ((3, 16, 8), (3, 16, 4), _batch((0,), (0,), (1,), (1,)), 0, 1),
    # the batch dimension in the middle of the lhs: one batch stride of 8
    ((4, 3, 8), (3, 8, 5), _batch((1,), (0,), (2,), (1,)), 0, 1),
    # attention's heads in [b, s, h, d]: heads at stride d are cuBLAS's batch, b a loop
    ((2, 5, 3, 6), (2, 7, 3, 6), _batch((0, 2), (0, 2), (3,), (3,)), 0, 2),
    # 20 looped batch indices: `gemm._launch_cost` prefers copying both and one call
    ((20, 2, 3, 4), (20, 5, 3, 4), _batch((0, 2), (0, 2), (3,), (3,)), 2, 1),
    # contracting pairs listed against the strides: summed in the order that reads both
    ((4, 3, 5), (3, 5, 2), _batch((), (), (2, 1), (1, 0)), 0, 1),
    # two contracting dimensions around a free one: no stride reads the lhs, copied
    ((3, 4, 5), (3, 5, 2), _batch((), (), (0, 2), (0, 1)), 1, 1),
])
def test_gpu_dot_reads_operands_in_place(
        emulated: fake_cupy.Recorder, lhs_dims: tuple[int, ...], rhs_dims: tuple[int, ...],
        numbers: dict[str, tuple[int, ...]], copies: int, calls: int) -> None:
    """cuBLAS's strided-batched GEMM reads an operand where it lies whenever its groups
    (batch, free, contracting) each collapse to one stride and the matrix has a unit
    stride (op N or op T): copies and GEMM calls counted by `fake_cupy`, whose GEMM reads
    the raw pointers, leading dimensions and strides it is given."""
    from gpu_modules import finish, new_module

    from tfxla_lite.hlo.shape import Shape

    module, comp = new_module("one_dot")
    lhs = comp.add_parameter(0, Shape("f32", lhs_dims))
    rhs = comp.add_parameter(1, Shape("f32", rhs_dims))
    finish(comp, [comp.create("dot", [lhs, rhs], **numbers)])
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(d).astype(np.float32) for d in (lhs_dims, rhs_dims)]
    (expected,) = flatten(evaluate(module, *args))
    (got,) = compile_module(module).run_numpy(*args)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert len(emulated.gemms) == calls
    assert emulated.operand_copies == copies


@pytest.mark.parametrize("element_type", ["f16", "bf16"])
def test_gpu_half_sums_accumulate_in_f32(emulated: fake_cupy.Recorder,
                                         element_type: str) -> None:
    """Inputs on a grid of 2^-6 in [-1, 1]: every f32 partial sum is exact, so folding in
    f32 and rounding once gives the evaluator's bits in any order, in every template;
    rounding to 2-byte precision after each step would not (sums reach hundreds)."""
    module = MODULES[f"half_sums_{element_type}"]
    rng = np.random.default_rng(5)
    args = []
    for p in module().entry.parameters:
        values = rng.integers(-64, 65, size=p.shape.dims) / 64.0
        if p.shape.dims == (8, 40):  # the product: factors near one, |product| stays small
            values = 1.0 + rng.integers(-2, 3, size=p.shape.dims) / 64.0
        args.append(values.astype(p.shape.numpy_dtype))
    expected = flatten(evaluate(module(), *args))
    executable = compile_module(module(), verify=True)
    source = executable.cuda_source
    assert "_f32(" in source  # the widened reducer
    kinds = {thunk.plan.kind for thunk in executable.program.thunks}
    assert {"split-reduction", "multi-output", "loop"} <= kinds, kinds
    for n, (got, wanted) in enumerate(zip(executable.run_numpy(*args), expected, strict=True)):
        if n == 4:  # the product: exact f32 products of 2^-6 steps only for a few factors
            np.testing.assert_allclose(got.astype(np.float64), wanted.astype(np.float64),
                                       rtol=1e-2)
            continue
        assert np.asarray(got).tobytes() == np.asarray(wanted).tobytes(), f"output {n}"


def test_gpu_only_half_sums_and_products_widen() -> None:
    """The rule both backends and the evaluator share (`widened_reduce_op`): one-input
    f16/bf16 add or multiply reducers widen; a 2-byte max, f32 sums and a variadic
    argmax do not."""
    widened = {name: [accumulates_in_f32(inst) for inst in MODULES[name]().entry.instructions
                      if inst.opcode == "reduce"]
               for name in ("half_sums_f16", "half_sums_bf16", "row_reduce_max_f16",
                            "column_reduce_bf16", "reduce_sum_split", "argmax_wide_rows")}
    assert widened == {"half_sums_f16": [True] * 6, "half_sums_bf16": [True] * 6,
                       "row_reduce_max_f16": [False], "column_reduce_bf16": [True],
                       "reduce_sum_split": [False], "argmax_wide_rows": [False]}


def test_gpu_check_dlpack_round_trip_on_the_emulator(emulated: fake_cupy.Recorder) -> None:
    """`benchmarks/gpu.py --dlpack` (the TF-free hand-over `scripts/gpu_check.sh` runs on
    a GPU machine) passes its own checks here, with NumPy memory behind the protocol."""
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.append(root)
    from benchmarks import gpu as benchmark

    found = benchmark.dlpack_round_trip(sys.modules["cupy"], repeat=3)
    assert found["checks"] and all(found["checks"].values()), found["checks"]
    assert set(found["host_us"]) >= {"device.synchronize() on an idle GPU",
                                     "executable.run_checked: launches, no wait"}
