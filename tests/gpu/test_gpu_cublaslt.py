"""Dot epilogues fused by cuBLASLt (`codegen/gpu/lt_epilogue.py`, `cublaslt.py`), and the
host synchronizations of a GPU launch, without a GPU.

Which kOutput fusions cuBLASLt takes (bias along the output's minor dimensions, relu,
both; f16/bf16/f32) and why the others are not taken, in the plan and its text; the
fused ones run as one `cublasLtMatmul` on `fake_cublaslt`'s model (reached through the
binding's own ctypes prototypes; the model computes the epilogue from the descriptor's
attributes), against the NumPy evaluator and, through `tfxla_lite.function`, against
TF; the fallback to cuBLAS + the loop kernel where cuBLASLt offers no algorithm, on the
emulator; the switch; and the launch's waits counted on `fake_cupy`.
"""

from __future__ import annotations

import ctypes
import sys

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from gpu_checks import assert_matches
from gpu_modules import finish, new_module
from hlo_builders import flatten, random_arguments

from tfxla_lite.codegen.gpu import compile_module, cublaslt, emit_module, lt_epilogue
from tfxla_lite.codegen.gpu.inspection import launch_text, why
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape

needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")


def epilogue_module(kind: str, element_type: str = "f32", lhs: tuple[int, ...] = (6, 5),
                    rhs: tuple[int, ...] = (5, 7), **numbers: tuple[int, ...]) -> HloModule:
    """One dot of two parameters with the epilogue `kind`: bias_relu, bias, relu,
    row_bias (a bias along the output's rows), update (w - 0.5 * dot), scale (dot * 3)."""
    module, comp = new_module(f"lt_{kind}_{element_type}")
    a = comp.add_parameter(0, Shape(element_type, lhs))
    b = comp.add_parameter(1, Shape(element_type, rhs))
    numbers = {"lhs_contracting_dims": (len(lhs) - 1,), "rhs_contracting_dims": (0,),
               **numbers}
    product = comp.create("dot", [a, b], **numbers)
    shape = product.shape

    def scalar(value: float) -> object:
        return comp.create("broadcast", [comp.add_constant(value, element_type)],
                           shape=shape, dimensions=())

    root = product
    if kind in ("bias_relu", "bias", "row_bias"):
        dims = (0,) if kind == "row_bias" else (shape.rank - 1,)
        bias = comp.add_parameter(2, Shape(element_type, (shape.dims[dims[0]],)))
        root = comp.create("add", [root, comp.create("broadcast", [bias], shape=shape,
                                                     dimensions=dims)])
    if kind in ("bias_relu", "relu"):
        root = comp.create("maximum", [scalar(0.0), root])  # zero first: either order
    if kind == "update":
        w = comp.add_parameter(2, shape)
        root = comp.create("subtract", [w, comp.create("multiply", [scalar(0.5), root])])
    if kind == "scale":
        root = comp.create("multiply", [root, scalar(3.0)])
    finish(comp, [root])
    return module


BATCHED = {"lhs": (2, 6, 5), "rhs": (2, 5, 7), "lhs_batch_dims": (0,),
           "rhs_batch_dims": (0,), "lhs_contracting_dims": (2,), "rhs_contracting_dims": (1,)}
TRANSPOSED = {"lhs": (5, 6), "rhs": (7, 5), "lhs_contracting_dims": (0,),
              "rhs_contracting_dims": (1,)}
# Heads in [b, s, h, d] (no common batch stride: looped over b, one call per index).
HEADS = {"lhs": (2, 4, 3, 6), "rhs": (2, 5, 3, 6), "lhs_batch_dims": (0, 2),
         "rhs_batch_dims": (0, 2), "lhs_contracting_dims": (3,), "rhs_contracting_dims": (3,)}
# Two contracting dimensions around a free one: the lhs is copied first.
COPIED = {"lhs": (3, 4, 5), "rhs": (3, 5, 2), "lhs_contracting_dims": (0, 2),
          "rhs_contracting_dims": (0, 1)}

FUSED = [("bias_relu", "f32", {}, "RELU_BIAS"), ("bias", "f32", {}, "BIAS"),
         ("relu", "f32", {}, "RELU"), ("bias_relu", "f16", {}, "RELU_BIAS"),
         ("bias_relu", "bf16", {}, "RELU_BIAS"), ("bias_relu", "f32", BATCHED, "RELU_BIAS"),
         ("bias", "f32", TRANSPOSED, "BIAS"), ("bias_relu", "f32", HEADS, "RELU_BIAS"),
         ("bias", "f16", COPIED, "BIAS")]
NOT_FUSED = [("bias_relu", "f64", {}, "f64 dot"), ("row_bias", "f32", {}, "D's rows"),
             ("update", "f32", {}, "(multiply, subtract) is not one cuBLASLt computes"),
             ("scale", "f32", {}, "(multiply) is not one cuBLASLt computes")]


def _build(kind: str, element_type: str, layout: dict) -> HloModule:
    numbers = dict(layout)
    lhs, rhs = numbers.pop("lhs", (6, 5)), numbers.pop("rhs", (5, 7))
    return epilogue_module(kind, element_type, lhs, rhs, **numbers)


def _epilogue_plan(module: HloModule) -> object:
    program, _, _ = emit_module(module)
    (thunk,) = program.thunks
    assert thunk.plan.kind == "dot-epilogue"
    return thunk.plan


@pytest.mark.parametrize(("kind", "element_type", "layout", "name"), FUSED)
def test_fused_epilogues_are_planned(kind: str, element_type: str, layout: dict,
                                     name: str) -> None:
    plan = _epilogue_plan(_build(kind, element_type, layout))
    lt = plan.extra["lt"]
    assert isinstance(lt, lt_epilogue.LtEpilogue) and lt.name == name
    assert (lt.bias_operand is None) == (name == "RELU")
    text = plan_text(_build(kind, element_type, layout))
    assert f"fused by cuBLASLt: one cublasLtMatmul with CUBLASLT_EPILOGUE_{name}" in text
    assert "one cublasLtMatmul (no generated kernel); fallback:" in text


@pytest.mark.parametrize(("kind", "element_type", "layout", "reason"), NOT_FUSED)
def test_other_epilogues_say_why_not(kind: str, element_type: str, layout: dict,
                                     reason: str) -> None:
    plan = _epilogue_plan(_build(kind, element_type, layout))
    assert isinstance(plan.extra["lt"], str) and reason in plan.extra["lt"]
    assert f"not fused by cuBLASLt: {plan.extra['lt']}" in plan_text(
        _build(kind, element_type, layout))


def plan_text(module: HloModule) -> str:
    """The kernel plan's words for each thunk: launch and why."""
    program, _, _ = emit_module(module)
    return "\n".join(f"{launch_text(t.plan)} {why(t.plan)}" for t in program.thunks)


def test_switch_turns_the_fusion_off(monkeypatch: pytest.MonkeyPatch,
                                     fake_gpu: fake_cupy.Recorder, fake_lt: object) -> None:
    monkeypatch.setenv(lt_epilogue.SWITCH, "0")
    module = epilogue_module("bias_relu")
    assert "switched off" in _epilogue_plan(epilogue_module("bias_relu")).extra["lt"]
    executable = compile_module(module)
    executable.run_numpy(*random_arguments(epilogue_module("bias_relu")))
    assert len(fake_gpu.gemms) == 1 and len(fake_gpu.launches) == 1
    assert fake_lt.calls == []  # type: ignore[attr-defined]
    assert "switched off" in next(iter(executable.lt_status.values()))


@pytest.mark.parametrize(("kind", "element_type", "layout", "name"), FUSED)
def test_fused_epilogues_match_the_evaluator(kind: str, element_type: str, layout: dict,
                                             name: str, fake_gpu: fake_cupy.Recorder,
                                             fake_lt: object) -> None:
    """One cuBLASLt call per GEMM the plan makes (per looped batch index), no kernel, no
    cuBLAS GEMM; the model's epilogue code and transposes are the plan's."""
    args = random_arguments(_build(kind, element_type, layout), seed=3)
    expected = flatten(evaluate(_build(kind, element_type, layout), *args))
    executable = compile_module(_build(kind, element_type, layout))
    got = executable.run_numpy(*args)
    assert_matches(got, expected, f"{kind} {element_type} {layout}")
    plan = executable.program.thunks[0].plan
    gemm = executable._calls_plan[0][1][0]  # noqa: SLF001 - the plan the call used
    calls = fake_lt.calls  # type: ignore[attr-defined]
    assert len(calls) == gemm.calls and not fake_gpu.launches and not fake_gpu.gemms
    assert {c.epilogue for c in calls} == {lt_epilogue.EPILOGUES[name]}
    assert {(c.transa, c.transb, c.m, c.n, c.k, c.batch) for c in calls} == {
        (int(gemm.rhs.transpose), int(gemm.lhs.transpose), gemm.n, gemm.m, gemm.k,
         gemm.batch)}
    assert executable.lt_status[plan.name] == f"cuBLASLt (CUBLASLT_EPILOGUE_{name})"
    assert fake_gpu.operand_copies == (1 if layout is COPIED else 0)


def test_a_wrong_epilogue_attribute_fails(monkeypatch: pytest.MonkeyPatch,
                                          fake_gpu: fake_cupy.Recorder,
                                          fake_lt: object) -> None:
    """The model computes what the descriptor says: RELU_BIAS sent as BIAS leaves the
    negative values in, which the evaluator's relu does not."""
    monkeypatch.setitem(lt_epilogue.EPILOGUES, "RELU_BIAS", lt_epilogue.EPILOGUES["BIAS"])
    args = random_arguments(epilogue_module("bias_relu"), seed=5)
    expected = flatten(evaluate(epilogue_module("bias_relu"), *args))
    got = compile_module(epilogue_module("bias_relu")).run_numpy(*args)
    with pytest.raises(AssertionError):
        assert_matches(got, expected, "relu dropped")
    assert (got[0] < 0).any()


def test_attribute_sizes_are_checked(fake_gpu: fake_cupy.Recorder, fake_lt: object) -> None:
    """cuBLASLt refuses an attribute of the wrong size (TRANSA is an int32_t): so does
    the model, and the binding raises on the status."""
    library, _ = cublaslt.library(sys.modules["cupy"])
    assert library is not None
    desc = library.create("cublasLtMatmulDescCreate", cublaslt.CUBLAS_COMPUTE_32F,
                          cublaslt.CUDA_R_32F)
    with pytest.raises(RuntimeError, match="cublasStatus_t 7"):
        cublaslt.set_attribute(library, "cublasLtMatmulDescSetAttribute", desc,
                               cublaslt.MATMUL_DESC_TRANSA, ctypes.c_int64(1))
    library.call("cublasLtMatmulDescDestroy", desc)
    assert ctypes.sizeof(cublaslt.HeuristicResult) == 96  # cublasLt.h's layout on x86-64


def test_descriptors_are_destroyed(fake_gpu: fake_cupy.Recorder, fake_lt: object) -> None:
    executable = compile_module(epilogue_module("bias_relu", **{}))
    (matmul, _) = executable._calls_plan[0][3]  # noqa: SLF001
    assert fake_lt.live("layout") == 3 and fake_lt.live("desc") == 1  # type: ignore[attr-defined]
    matmul.close()
    assert fake_lt.live("layout") == 0 and fake_lt.live("desc") == 0  # type: ignore[attr-defined]
    assert fake_lt.live("preference") == 0  # type: ignore[attr-defined]


@needs_gxx
def test_no_algorithm_falls_back_to_cublas_and_the_loop_kernel(
        emulated: fake_cupy.Recorder, fake_lt: object) -> None:
    """Where cuBLASLt offers no algorithm for the pointers' alignment, the call runs the
    unfused path (cuBLAS product, then the loop kernel on the emulator), with the same
    values; the heuristic is asked once per alignment, not per call."""
    fake_lt.min_alignment = 512  # type: ignore[attr-defined]
    module = epilogue_module("bias_relu", lhs=(9, 33), rhs=(33, 20))
    args = random_arguments(epilogue_module("bias_relu", lhs=(9, 33), rhs=(33, 20)), seed=1)
    expected = flatten(evaluate(epilogue_module("bias_relu", lhs=(9, 33), rhs=(33, 20)),
                                *args))
    executable = compile_module(module)
    for _ in range(2):
        assert_matches(executable.run_numpy(*args), expected, "fallback")
    assert not fake_lt.calls and len(emulated.gemms) == 2  # type: ignore[attr-defined]
    assert [launch.name for launch in emulated.launches] == \
        [executable.program.thunks[0].functions[0]] * 2
    matmul = executable._calls_plan[0][3][0]  # noqa: SLF001
    assert matmul.refused == 2 and fake_lt.heuristic_queries == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("refusing", ["heuristic_status", "matmul_status"])
def test_refusals_fall_back_to_the_unfused_path(fake_gpu: fake_cupy.Recorder, fake_lt: object,
                                                refusing: str) -> None:
    """cuBLASLt answering NOT_SUPPORTED (15) to the heuristic or to the matmul is a
    refusal: the call runs cuBLAS + the loop kernel, the status is kept, and this
    alignment is not asked again."""
    setattr(fake_lt, refusing, 15)
    executable = compile_module(epilogue_module("bias"))
    args = random_arguments(epilogue_module("bias"))
    for _ in range(2):
        executable.run_numpy(*args)
    matmul = executable._calls_plan[0][3][0]  # noqa: SLF001
    assert len(fake_gpu.gemms) == 2 and len(fake_gpu.launches) == 2 and matmul.calls == 0
    assert matmul.refused == 2 and len(matmul.failures) == 1
    assert "cublasStatus_t 15" in matmul.failures[0]
    assert fake_lt.heuristic_queries == 1  # type: ignore[attr-defined]


# -- through TF, and the launch's waits ----------------------------------------------------

def _dense(x: object, w: object, b: object) -> object:
    import tensorflow as tf

    return tf.nn.relu(tf.matmul(x, w) + b)


@needs_gxx
def test_dense_layer_through_tf_matches_tf_and_waits_twice(emulated_gpu: fake_cupy.Recorder,
                                                           fake_lt: object) -> None:
    """`relu(x @ w + b)` (a Dense layer) in `tfxla_lite.function` on the emulated GPU: one
    cuBLASLt call (RELU_BIAS) per call, TF's results; per call one wait for the whole
    device (TF's writes) and one for CuPy's stream (ours), nothing else."""
    tf = pytest.importorskip("tensorflow")
    from tolerances import assert_close

    import tfxla_lite as tl

    rng = np.random.default_rng(11)
    x, w, b = (tf.constant(rng.standard_normal(dims).astype(np.float32))
               for dims in ((8, 16), (16, 12), (12,)))
    compiled = tl.function(_dense, jit_compile=True)
    for call in range(2):
        syncs = (emulated_gpu.device_syncs, emulated_gpu.stream_syncs)
        outputs = compiled(x, w, b)
        assert (emulated_gpu.device_syncs - syncs[0], emulated_gpu.stream_syncs - syncs[1]) \
            == (1, 1), call
        assert_close(np.asarray(outputs), _dense(x, w, b).numpy(), "MatMul")
    assert [c.epilogue for c in fake_lt.calls] == \
        [lt_epilogue.EPILOGUES["RELU_BIAS"]] * 2  # type: ignore[attr-defined]
    assert not emulated_gpu.gemms and not emulated_gpu.launches


def test_benchmark_ab_shapes_are_fused() -> None:
    """Every dot of `benchmarks/gpu.py --cublaslt-ab` plans a cuBLASLt epilogue (else the
    A/B would time the same path twice), at small sizes of the same forms."""
    from benchmarks.gpu import LT_SHAPES, dense_module

    for _, _, _, relu, element_type in LT_SHAPES:
        lt = _epilogue_plan(dense_module(4, 8, 4, relu, element_type)).extra["lt"]
        assert isinstance(lt, lt_epilogue.LtEpilogue)
        assert lt.name == ("RELU_BIAS" if relu else "BIAS")


# cublasLt.h's declarations of the functions the binding calls, transcribed (the CUDA
# toolkit here ships no cuBLAS headers): typedefs as the header has them.
_HEADER = r"""
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUDA_R_32F = 0 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
typedef enum { DESC_COMPUTE_TYPE = 0 } cublasLtMatmulDescAttributes_t;
typedef enum { LAYOUT_TYPE = 0 } cublasLtMatrixLayoutAttribute_t;
typedef enum { PREF_SEARCH_MODE = 0 } cublasLtMatmulPreferenceAttributes_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct { uint64_t data[8]; } cublasLtMatrixLayoutOpaque_t;
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct { uint64_t data[12]; } cublasLtMatmulDescOpaque_t;
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;
typedef struct { uint64_t data[10]; } cublasLtMatmulPreferenceOpaque_t;
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;
typedef struct {
  cublasLtMatmulAlgo_t algo; size_t workspaceSize; cublasStatus_t state;
  float wavesCount; int reserved[4];
} cublasLtMatmulHeuristicResult_t;
extern "C" {
cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
    cublasComputeType_t computeType, cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
    cublasLtMatmulDescAttributes_t attr, const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout,
    cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
    cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
    cublasLtMatmulPreferenceAttributes_t attr, const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
    cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
    const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
    cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
    cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
    const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes,
    cudaStream_t stream);
}
template <typename F> struct Args;
template <typename R, typename... A> struct Args<R (*)(A...)> {
  using type = std::tuple<A...>;
  static constexpr bool int_result = sizeof(R) == sizeof(int);
};
template <typename T> constexpr bool is_signed_int() {
  if constexpr (std::is_enum<T>::value) return true;  // int-sized enumerators
  else return std::is_signed<T>::value;
}
template <typename H, typename B> constexpr bool same_abi() {
  return sizeof(H) == sizeof(B) && std::is_pointer<H>::value == std::is_pointer<B>::value &&
         std::is_floating_point<H>::value == std::is_floating_point<B>::value &&
         (std::is_pointer<H>::value || is_signed_int<H>() == is_signed_int<B>());
}
template <typename H, typename B> constexpr bool same_pointee() {
  return sizeof(std::remove_pointer_t<H>) == sizeof(std::remove_pointer_t<B>);
}
"""

_C_TYPES = {ctypes.c_void_p: "void*", ctypes.c_int: "int", ctypes.c_size_t: "size_t",
            ctypes.c_uint64: "uint64_t", ctypes.c_int64: "int64_t"}


@needs_gxx
def test_binding_prototypes_match_the_header(tmp_path: object) -> None:
    """g++ checks each argument the binding declares (`cublaslt.PROTOTYPES`) against the
    header's declaration: count, size, pointer or not, signedness; structs passed by
    pointer (the heuristic result, the algorithm) of the header's size."""
    import subprocess
    from pathlib import Path

    lines = [_HEADER]
    for name, args in cublaslt.PROTOTYPES.items():
        sig = f"Args<decltype(&{name})>"
        lines.append(f"static_assert({sig}::int_result, \"{name} result\");")
        lines.append(f"static_assert(std::tuple_size<{sig}::type>::value == {len(args)}, "
                     f"\"{name} arity\");")
        for i, arg in enumerate(args):
            header_type = f"std::tuple_element_t<{i}, {sig}::type>"
            pointee = getattr(arg, "_type_", None)
            if pointee is not None and isinstance(pointee, type) and \
                    issubclass(pointee, ctypes.Structure):
                lines.append(f"static_assert(std::is_pointer<{header_type}>::value && "
                             f"sizeof(std::remove_pointer_t<{header_type}>) == "
                             f"{ctypes.sizeof(pointee)}, \"{name} argument {i}\");")
                continue
            binding_type = "void**" if pointee is ctypes.c_void_p else \
                ("int*" if pointee is ctypes.c_int else _C_TYPES[arg])
            lines.append(f"static_assert(same_abi<{header_type}, {binding_type}>(), "
                         f"\"{name} argument {i}\");")
            if binding_type.endswith("**") or binding_type == "int*":
                lines.append(f"static_assert(same_pointee<{header_type}, {binding_type}>(), "
                             f"\"{name} argument {i} pointee\");")
    source = Path(str(tmp_path)) / "prototypes.cc"
    source.write_text("\n".join(lines) + "\n")
    done = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", str(source)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
