"""GPU executables against the NumPy evaluator, on a CUDA device through CuPy.

Every test here needs a GPU and skips without one (the `cuda_device` fixture says why).
They were written without a GPU to run them: run `pytest tests/gpu` on a GPU machine
(docs/gpu.md) before trusting the backend's numerics.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gpu_corpus
import gpu_workloads
import numpy as np
import pytest
from gpu_checks import assert_matches, edge_arguments
from gpu_modules import MODULES, NOT_RUN
from hlo_builders import flatten, random_arguments

from tfxla_lite.codegen.gpu import compile_module
from tfxla_lite.hlo.evaluator import evaluate

EDGE_CASES = frozenset(name for name in MODULES if name.startswith("convert"))
RUNNABLE = sorted(set(MODULES) - NOT_RUN)
CORPUS = gpu_corpus.corpus()  # TF-printed HLO, stored: the GPU machines have no TF
WORKLOADS = gpu_workloads.corpus()  # the benchmark workloads' clusters, stored likewise


def _arguments(name: str) -> list[np.ndarray]:
    module = MODULES[name]()
    if name in EDGE_CASES:
        return edge_arguments(module)
    return random_arguments(module)  # out-of-range indices are clamped or skipped


@pytest.mark.parametrize("name", RUNNABLE)
def test_gpu_module_matches_the_evaluator(cuda_device: object, name: str) -> None:
    args = _arguments(name)
    expected = flatten(evaluate(MODULES[name](), *args))
    executable = compile_module(MODULES[name](), verify=True)
    assert_matches(executable.run_numpy(*args), expected, name)


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "reduce_sum_split", "column_reduce",
                                  "row_reduce_block", "dot_epilogue"])
def test_gpu_results_are_deterministic(cuda_device: object, name: str) -> None:
    args = _arguments(name)
    executable = compile_module(MODULES[name](), verify=True)
    first = executable.run_numpy(*args)
    for _ in range(3):
        for a, b in zip(first, executable.run_numpy(*args), strict=True):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_gpu_executable_checks_its_arguments(cuda_device: object) -> None:
    executable = compile_module(MODULES["elementwise_odd"]())
    with pytest.raises(ValueError, match="takes 2 arguments"):
        executable(np.zeros((3, 7), np.float32))
    with pytest.raises(ValueError, match="expected f32"):
        executable(np.zeros((3, 7), np.float64), np.zeros((3, 7), np.float64))


def test_gpu_second_compile_reuses_the_module(cuda_device: object) -> None:
    first = compile_module(MODULES["softmax"]())
    second = compile_module(MODULES["softmax"]())
    assert second.compiled_from == "memory"
    assert second.raw_module is first.raw_module


def test_gpu_float4_and_scalar_variants_agree(cuda_device: object) -> None:
    cupy = cuda_device
    executable = compile_module(MODULES["elementwise_vectorized"]())
    x, y = (np.random.default_rng(n).normal(size=(64, 256)).astype(np.float32) for n in (0, 1))
    aligned = executable.run_numpy(x, y)[0]
    # Arrays starting 4 bytes into an allocation are not 16-byte aligned: scalar kernel.
    buffers = [cupy.empty(64 * 256 + 1, np.float32) for _ in range(2)]  # type: ignore[attr-defined]
    views = []
    for buffer, host in zip(buffers, (x, y)):
        view = buffer[1:].reshape(64, 256)
        view[...] = cupy.asarray(host)  # type: ignore[attr-defined]
        views.append(view)
    unaligned = cupy.asnumpy(executable(*views)[0])  # type: ignore[attr-defined]
    np.testing.assert_array_equal(aligned, unaligned)


@pytest.mark.parametrize("element_type", ["f32", "f16", "bf16", "f64"])
def test_gpu_strided_gemm_random_dots_match_the_evaluator(cuda_device: object,
                                                          element_type: str) -> None:
    """`gemm.plan_gemm`'s transpose flags, leading dimensions and strides on the real
    cuBLAS (`test_gpu_gemm.py` runs the same dots on `fake_cupy`'s model of it): small
    integers, so every product and f32 sum is exact and the results are the evaluator's
    bits, 2-byte floats included (they accumulate in f32 and round once)."""
    from gpu_modules import random_dot_cases

    for label, module, args in random_dot_cases(element_type, 40):
        (expected,) = flatten(evaluate(module, *args))
        (got,) = compile_module(module).run_numpy(*args)
        np.testing.assert_array_equal(np.asarray(got).astype(np.float64),
                                      np.asarray(expected).astype(np.float64), err_msg=label)


def test_gpu_runs_on_tf_gpu_tensors_through_dlpack(cuda_device: object) -> None:
    tf = pytest.importorskip("tensorflow")
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU: TensorFlow sees no GPU device")
    from tfxla_lite.runtime.gpu_launch import run_on_tensors

    args = _arguments("softmax")
    expected = flatten(evaluate(MODULES["softmax"](), *args))
    executable = compile_module(MODULES["softmax"]())
    with tf.device("/GPU:0"):
        tensor = tf.constant(args[0])
    outputs = run_on_tensors(executable, [tensor], cuda_device)
    assert "GPU:0" in outputs[0].backing_device
    assert_matches([o.numpy() for o in outputs], expected, "softmax through DLPack")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_gpu_tf_corpus_matches_the_evaluator(cuda_device: object, name: str) -> None:
    gpu_corpus.check(name)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_gpu_workload_clusters_match_the_evaluator(cuda_device: object, name: str) -> None:
    """The benchmark workloads' clusters (training steps included), at test and at
    benchmark sizes."""
    gpu_workloads.check(name)


@pytest.mark.slow
def test_gpu_workload_snapshot_is_what_the_lowering_prints() -> None:
    """No GPU needed: the stored workload clusters are what tfxla-lite lowers now (else
    rerun `python tests/gpu/gpu_workloads.py`)."""
    pytest.importorskip("tensorflow")
    assert gpu_workloads.printed() == WORKLOADS, "stale: run python tests/gpu/gpu_workloads.py"


@pytest.mark.slow
def test_gpu_corpus_snapshot_is_what_tf_prints() -> None:
    """No GPU needed: the stored corpus is what this TF prints (else rerun
    `python tests/gpu/gpu_corpus.py`)."""
    pytest.importorskip("tensorflow")
    assert len(CORPUS) >= 40
    assert gpu_corpus.comparable(gpu_corpus.printed()) == gpu_corpus.comparable(CORPUS), \
        "stale: run python tests/gpu/gpu_corpus.py"



def test_gpu_benchmark_workloads_agree() -> None:
    """No GPU needed: each workload of benchmarks/gpu.py (small sizes) computes the same
    values as its HLO module (evaluator), its NumPy form and its TF form."""
    tf = pytest.importorskip("tensorflow")
    root = str(Path(__file__).resolve().parents[2])  # where the `benchmarks` package is
    if root not in sys.path:
        sys.path.append(root)
    from benchmarks import gpu as benchmark

    functions = benchmark._tf_functions()  # noqa: SLF001
    rng = np.random.default_rng(3)
    for workload in benchmark.workloads(small=True):
        module = workload.build()
        args = [rng.standard_normal(p.shape.dims).astype(np.float32)
                for p in module.entry.parameters]
        (expected,) = flatten(evaluate(module, *args))
        np.testing.assert_allclose(workload.array_fn(np, *args), expected, rtol=1e-4,
                                   atol=1e-4, err_msg=workload.name)
        got = functions[workload.name](*[tf.constant(a) for a in args]).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=workload.name)


def _lt_cases() -> list[tuple[str, str, dict, str]]:
    from test_gpu_cublaslt import FUSED

    return FUSED


@pytest.mark.parametrize("case", range(len(_lt_cases())))
def test_gpu_cublaslt_epilogues_match_the_evaluator(cuda_device: object, case: int) -> None:
    """Dot epilogues fused by the real cuBLASLt (`codegen/gpu/cublaslt.py`): the library
    must bind here, the result match the evaluator, also with the operands 4 bytes off
    256 (another alignment, asked of cuBLASLt's heuristic again, or the unfused path)."""
    from test_gpu_cublaslt import _build

    kind, element_type, layout, name = _lt_cases()[case]
    args = random_arguments(_build(kind, element_type, layout), seed=3)
    expected = flatten(evaluate(_build(kind, element_type, layout), *args))
    executable = compile_module(_build(kind, element_type, layout))
    assert list(executable.lt_status.values()) == [f"cuBLASLt (CUBLASLT_EPILOGUE_{name})"]
    assert_matches(executable.run_numpy(*args), expected, f"cuBLASLt {case}")
    matmul = executable._calls_plan[0][3][0]  # noqa: SLF001 - the fused call itself
    if not matmul.gemm.outer:  # pointers 256-byte aligned: cuBLASLt must have run it
        assert matmul.calls == 1 and matmul.refused == 0, matmul.failures
    if element_type == "bf16":  # CuPy allocates no bfloat16 arrays of its own
        return
    cupy = cuda_device
    shifted = []
    for array in args:
        flat = np.ascontiguousarray(array).reshape(-1)
        room = cupy.empty(flat.size + 8, dtype=flat.dtype)  # type: ignore[attr-defined]
        step = max(1, 4 // flat.dtype.itemsize)
        room[step:step + flat.size] = cupy.asarray(flat)  # type: ignore[attr-defined]
        shifted.append(room[step:step + flat.size].reshape(array.shape))
    got = [cupy.asnumpy(o) for o in executable(*shifted)]  # type: ignore[attr-defined]
    assert_matches(got, expected, f"cuBLASLt {case}, operands 4 bytes off")
