"""GPU benchmark: tfxla-lite's fused CUDA kernels against unfused CuPy and JAX's XLA:GPU.

Run on a machine with a CUDA GPU and CuPy (`pip install -e '.[gpu]'`, plus `jax[cuda12]`
for the third column):

    python benchmarks/gpu.py [--repeat 50] [--json gpu.json] [--markdown gpu.md]
    python benchmarks/gpu.py --dlpack dlpack.json   # only the TF-free DLPack round trip
    python benchmarks/gpu.py --cublaslt-ab lt.json  # only dot epilogues: cuBLASLt vs
                                                    # cuBLAS + loop kernel

(`scripts/gpu_check.sh` runs it with the GPU tests and keeps the results.) Each workload
is built once as an HLO module, compiled by `tfxla_lite.codegen.gpu`, written the
obvious way in CuPy (one kernel per operation, as eager TF or NumPy code runs), and in
`jax.numpy` under `jax.jit` when JAX sees a GPU (XLA:GPU gets the same computation,
traced by JAX into its own HLO; f32 dots at "highest" precision, no TF32, as CuPy's
cuBLAS calls). When TensorFlow sees a GPU too, a second table times the same functions
in TF: `tfxla_lite.function` (the GPU launch node: EagerPyFunc, DLPack both ways),
`tf.function` and `tf.function(jit_compile=True)` (TF's XLA:GPU). Device times are
medians of `--repeat` runs by CUDA events after warm-up (JAX and TF: host clock around
a call that waits for its result); every contender's outputs are checked against
unfused CuPy first. Never run on hardware yet: written without a GPU (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

try:
    import tfxla_lite  # noqa: F401 - installed, or on PYTHONPATH (scripts/gpu_check.sh)
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction  # noqa: E402
from tfxla_lite.hlo.shape import Shape  # noqa: E402


def _module(name: str) -> tuple[HloModule, Computation]:
    module = HloModule(name)
    return module, module.new_computation("main", entry=True)


def _scalar(comp: Computation, value: float, shape: Shape) -> Instruction:
    return comp.create("broadcast", [comp.add_constant(value, shape.element_type)],
                       shape=shape, dimensions=())


def _reduce(comp: Computation, x: Instruction, dims: tuple[int, ...], kind: str,
            init: float) -> Instruction:
    assert comp.module is not None
    return comp.create("reduce", [x, comp.add_constant(init, x.shape.element_type)],
                       called_computations=[comp.module.reduction_computation(
                           kind, x.shape.element_type)], dimensions=dims)


def reduce_sum_module(n: int) -> HloModule:
    module, comp = _module("reduce_sum_x_plus_y_times_z")
    shape = Shape("f32", (n,))
    x, y, z = (comp.add_parameter(i, shape) for i in range(3))
    total = comp.create("add", [x, comp.create("multiply", [y, z])])
    comp.root = _reduce(comp, total, (0,), "add", 0.0)
    return module


def gelu_module(n: int) -> HloModule:
    module, comp = _module("gelu")
    shape = Shape("f32", (n,))
    x = comp.add_parameter(0, shape)
    cube = comp.create("multiply", [x, comp.create("multiply", [x, x])])
    inner = comp.create("add", [x, comp.create("multiply", [_scalar(comp, 0.044715, shape),
                                                            cube])])
    scaled = comp.create("multiply", [_scalar(comp, math.sqrt(2 / math.pi), shape), inner])
    one_plus = comp.create("add", [_scalar(comp, 1.0, shape), comp.create("tanh", [scaled])])
    comp.root = comp.create("multiply", [comp.create("multiply", [_scalar(comp, 0.5, shape),
                                                                 x]), one_plus])
    return module


def softmax_module(rows: int, width: int) -> HloModule:
    module, comp = _module("softmax")
    shape = Shape("f32", (rows, width))
    x = comp.add_parameter(0, shape)
    largest = _reduce(comp, x, (1,), "maximum", float("-inf"))
    e = comp.create("exponential", [comp.create("subtract", [x, comp.create(
        "broadcast", [largest], shape=shape, dimensions=(0,))])])
    total = _reduce(comp, e, (1,), "add", 0.0)
    comp.root = comp.create("divide", [e, comp.create("broadcast", [total], shape=shape,
                                                      dimensions=(0,))])
    return module


def layer_norm_module(rows: int, width: int) -> HloModule:
    module, comp = _module("layer_norm")
    shape, rows_shape = Shape("f32", (rows, width)), Shape("f32", (rows,))
    x = comp.add_parameter(0, shape)
    mean = comp.create("multiply", [_reduce(comp, x, (1,), "add", 0.0),
                                    _scalar(comp, 1.0 / width, rows_shape)])
    centered = comp.create("subtract", [x, comp.create("broadcast", [mean], shape=shape,
                                                       dimensions=(0,))])
    variance = comp.create("multiply", [_reduce(comp, comp.create(
        "multiply", [centered, centered]), (1,), "add", 0.0), _scalar(comp, 1.0 / width,
                                                                       rows_shape)])
    inverse = comp.create("rsqrt", [comp.create("add", [variance, _scalar(comp, 1e-5,
                                                                           rows_shape)])])
    comp.root = comp.create("multiply", [centered, comp.create("broadcast", [inverse],
                                                               shape=shape, dimensions=(0,))])
    return module


def dense_module(m: int, k: int, n: int, relu: bool = True,
                 element_type: str = "f32") -> HloModule:
    module, comp = _module("dense_bias_relu" if relu else "dense_bias")
    x = comp.add_parameter(0, Shape(element_type, (m, k)))
    w = comp.add_parameter(1, Shape(element_type, (k, n)))
    b = comp.add_parameter(2, Shape(element_type, (n,)))
    product = comp.create("dot", [x, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    biased = comp.create("add", [product, comp.create("broadcast", [b], shape=product.shape,
                                                      dimensions=(1,))])
    comp.root = comp.create("maximum", [biased, _scalar(comp, 0.0, product.shape)]) \
        if relu else biased
    return module


def transpose_add_module(side: int) -> HloModule:
    module, comp = _module("transpose_add")
    shape = Shape("f32", (side, side))
    x, y = comp.add_parameter(0, shape), comp.add_parameter(1, shape)
    comp.root = comp.create("add", [comp.create("transpose", [x], dimensions=(1, 0)), y])
    return module


def argmax_module(n: int) -> HloModule:
    """TF's ArgMax over n floats as TF's XLA prints it: a variadic reduce of (values,
    iota) whose reducer keeps the larger value, on ties the smaller index (the GPU
    backend splits it over blocks from 65536 elements)."""
    module, comp = _module("argmax")
    reducer = module.new_computation("argmax_reducer")
    scalar, index = Shape("f32", ()), Shape("s32", ())
    lhs, lhs_index = reducer.add_parameter(0, scalar), reducer.add_parameter(1, index)
    rhs, rhs_index = reducer.add_parameter(2, scalar), reducer.add_parameter(3, index)
    keep = reducer.create("compare", [lhs, rhs], direction="GE")
    tie = reducer.create("compare", [lhs, rhs], direction="EQ")
    reducer.root = reducer.create("tuple", [
        reducer.create("select", [keep, lhs, rhs]),
        reducer.create("select", [tie, reducer.create("minimum", [lhs_index, rhs_index]),
                                  reducer.create("select", [keep, lhs_index, rhs_index])])])
    x = comp.add_parameter(0, Shape("f32", (n,)))
    positions = comp.create("iota", shape=Shape("s32", (n,)), iota_dimension=0)
    pair = comp.create("reduce", [x, positions, comp.add_constant(float("-inf"), "f32"),
                                  comp.add_constant(0, "s32")],
                       called_computations=[reducer], dimensions=(0,))
    comp.root = comp.create("get-tuple-element", [pair], index=1)
    return module


def column_sum_module(rows: int, width: int) -> HloModule:
    """Column sums: the column template, 4 columns a thread by 16-byte loads."""
    module, comp = _module("column_sum")
    x = comp.add_parameter(0, Shape("f32", (rows, width)))
    comp.root = _reduce(comp, x, (0,), "add", 0.0)
    return module


@dataclass
class Workload:
    name: str
    build: Callable[[], HloModule]
    # Unfused: one CuPy operation per HLO op; also traced by jax.jit with jax.numpy.
    array_fn: Callable[..., Any]
    bytes_moved: int  # the least memory traffic: inputs read once, outputs written once
    tf_fn: Callable[..., Any] | None = None  # the same in TensorFlow ops


def _tf_functions() -> dict[str, Callable[..., Any]]:
    """The workloads in TF ops, built only where TF is imported."""
    import tensorflow as tf

    def layer_norm(x: Any) -> Any:
        centered = x - tf.reduce_mean(x, axis=1, keepdims=True)
        variance = tf.reduce_mean(centered * centered, axis=1, keepdims=True)
        return centered * tf.math.rsqrt(variance + 1e-5)

    def gelu(x: Any) -> Any:
        return 0.5 * x * (1 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))

    return {
        "reduce_sum(x+y*z) 4M": lambda x, y, z: tf.reduce_sum(x + y * z),
        "GELU 4M": gelu,
        "softmax 4096x1024": lambda x: tf.nn.softmax(x, axis=1),
        "layer norm 4096x1024": layer_norm,
        "dense+bias+relu 2048^3": lambda x, w, b: tf.nn.relu(tf.matmul(x, w) + b),
        "transpose(x)+y 4096^2": lambda x, y: tf.transpose(x) + y,
        "argmax 4M": lambda x: tf.argmax(x, output_type=tf.int32),
        "column sum 4096x1024": lambda x: tf.reduce_sum(x, axis=0),
    }


def workloads(small: bool = False) -> list[Workload]:
    """The benchmark's workloads; `small` shrinks them for tests (the names keep the
    full sizes)."""
    n, rows, width, side = (1 << 22, 4096, 1024, 2048) if not small else (4096, 8, 128, 64)
    square = 4096 if not small else 80  # 80: edge tiles

    def softmax(xp: Any, x: Any) -> Any:
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def layer_norm(xp: Any, x: Any) -> Any:
        mean = x.mean(axis=1, keepdims=True)
        centered = x - mean
        return centered / xp.sqrt((centered * centered).mean(axis=1, keepdims=True) + 1e-5)

    def gelu(xp: Any, x: Any) -> Any:
        return 0.5 * x * (1 + xp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))

    return [
        Workload("reduce_sum(x+y*z) 4M", lambda: reduce_sum_module(n),
                 lambda xp, x, y, z: (x + y * z).sum(), 12 * n),
        Workload("GELU 4M", lambda: gelu_module(n), gelu, 8 * n),
        Workload("softmax 4096x1024", lambda: softmax_module(rows, width), softmax,
                 8 * rows * width),
        Workload("layer norm 4096x1024", lambda: layer_norm_module(rows, width), layer_norm,
                 8 * rows * width),
        Workload("dense+bias+relu 2048^3", lambda: dense_module(side, side, side),
                 lambda xp, x, w, b: xp.maximum(x @ w + b, 0), 4 * 3 * side * side),
        # The tiled transpose kernel; unfused CuPy reads x.T strided in one elementwise
        # kernel, the access pattern of the loop kernel transposes had before tiling.
        Workload("transpose(x)+y 4096^2", lambda: transpose_add_module(square),
                 lambda xp, x, y: x.T + y, 12 * square * square),
        # A variadic reduction split over blocks (it ran on one block before), and a
        # column reduction reading 4 columns a thread by 16-byte loads.
        Workload("argmax 4M", lambda: argmax_module(n),
                 lambda xp, x: xp.argmax(x).astype(np.int32), 4 * n),
        Workload("column sum 4096x1024", lambda: column_sum_module(rows, width),
                 lambda xp, x: x.sum(axis=0), 4 * rows * width),
    ]


def time_gpu(cupy: Any, fn: Callable[[], Any], repeat: int) -> float:
    """Median milliseconds of `fn` by CUDA events, after three warm-up calls."""
    for _ in range(3):
        fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def time_host(fn: Callable[[], Any], repeat: int) -> float:
    """Median milliseconds of `fn` (which waits for its device work) by the host clock:
    JAX runs on streams of its own, which CuPy's events do not see."""
    import time

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(cupy: Any, workload: Workload, rng: np.random.Generator, repeat: int,
            has_jax: bool) -> dict[str, Any]:
    """One workload's row: outputs checked against unfused CuPy, then timed."""
    from tfxla_lite.codegen.gpu import compile_module

    executable = compile_module(workload.build())
    inputs = [cupy.asarray(rng.standard_normal(s.dims).astype(np.float32))
              for s in executable.parameter_shapes]
    ours = executable(*inputs)[0]
    theirs = workload.array_fn(cupy, *inputs)
    np.testing.assert_allclose(cupy.asnumpy(ours), cupy.asnumpy(theirs), rtol=2e-3,
                               atol=2e-3, err_msg=workload.name)
    fused = time_gpu(cupy, lambda: executable(*inputs), repeat)
    unfused = time_gpu(cupy, lambda: workload.array_fn(cupy, *inputs), repeat)
    jax_ms = None
    if has_jax:
        import jax
        import jax.numpy as jnp

        with jax.default_matmul_precision("highest"):
            jitted = jax.jit(lambda *xs: workload.array_fn(jnp, *xs))
            jax_inputs = [jnp.asarray(cupy.asnumpy(x)) for x in inputs]
            np.testing.assert_allclose(np.asarray(jitted(*jax_inputs)), cupy.asnumpy(theirs),
                                       rtol=2e-3, atol=2e-3, err_msg=f"{workload.name} (JAX)")
            jax_ms = time_host(lambda: jitted(*jax_inputs).block_until_ready(), repeat)
    return {"workload": workload.name, "tfxla_lite_ms": fused,
            "kernels": executable.kernel_count, "cupy_unfused_ms": unfused, "jax_ms": jax_ms,
            "gb_per_s": workload.bytes_moved / (fused * 1e-3) / 1e9}


def measure_tf(workload: Workload, rng: np.random.Generator, repeat: int) -> dict[str, Any]:
    """One workload in TF on GPU:0: tfxla-lite's GPU launch, tf.function, TF's XLA."""
    import tensorflow as tf

    import tfxla_lite

    tf.config.experimental.enable_tensor_float_32_execution(False)
    shapes = [s.dims for s in workload.build().entry.parameters]  # type: ignore[union-attr]
    with tf.device("/GPU:0"):
        inputs = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    contenders = {
        "tfxla_lite_ms": tfxla_lite.function(workload.tf_fn, jit_compile=True),
        "tf_function_ms": tf.function(workload.tf_fn),
        "tf_xla_ms": tf.function(workload.tf_fn, jit_compile=True),
    }
    sync = getattr(tf.test.experimental, "sync_devices", None)

    def call(function: Any) -> Any:
        result = function(*inputs)
        if sync is not None:
            sync()
        else:
            result.numpy()
        return result

    reference = call(contenders["tf_function_ms"]).numpy()
    row: dict[str, Any] = {"workload": workload.name}
    for name, function in contenders.items():
        np.testing.assert_allclose(call(function).numpy(), reference, rtol=2e-3, atol=2e-3,
                                   err_msg=f"{workload.name} ({name})")
        row[name] = time_host(lambda f=function: call(f), repeat)
    compiled = contenders["tfxla_lite_ms"]
    program = compiled._program(*compiled._canonical(tuple(inputs), {}))  # noqa: SLF001
    launches = [c.gpu_launch for c in program.compiled if c.gpu_launch is not None]
    row["gpu_launch_nodes"] = len(launches)
    row["inputs_copied"] = sum(launch.copied_inputs for launch in launches)
    return row


def _pointer(array: Any) -> int:
    return int(array.data.ptr)


def dlpack_round_trip(cupy: Any, repeat: int) -> dict[str, Any]:
    """The hand-over the TF launch relies on, without TF (the lent GPU machines have
    none): arrays in and out by DLPack with no copy, a `GpuExecutable` between, and what
    a launch costs on the host. JAX, when it sees the GPU, plays TF's part (a framework
    with its own streams and allocator); CuPy's own capsules otherwise.

    Returns {"checks": {name: bool}, "host_us": {name: median microseconds}}."""
    import time

    from tfxla_lite.codegen.gpu import compile_module

    checks: dict[str, bool] = {}
    host: dict[str, float] = {}
    rng = np.random.default_rng(1)
    executable = compile_module(softmax_module(8, 128))
    host_x = rng.standard_normal((8, 128)).astype(np.float32)
    x = cupy.asarray(host_x)
    again = cupy.from_dlpack(x)  # the protocol: __dlpack__ / __dlpack_device__
    checks["cupy: from_dlpack shares the producer's memory"] = _pointer(again) == _pointer(x)
    (ours,) = executable.run_checked(cupy, [again])
    expected = workloads(small=True)[2].array_fn(np, host_x.astype(np.float64))
    checks["cupy: softmax on the handed-over array"] = bool(np.allclose(
        cupy.asnumpy(ours), expected, rtol=1e-5, atol=1e-6))
    try:
        import jax
        import jax.dlpack
        import jax.numpy as jnp

        has_jax = any(d.platform == "gpu" for d in jax.devices())
    except Exception:  # noqa: BLE001 - JAX absent or without a GPU
        has_jax = False
    if has_jax:
        produced = jnp.asarray(host_x) * 1.0  # computed on JAX's stream
        borrowed = cupy.from_dlpack(produced)
        checks["jax -> cupy: no copy"] = _pointer(borrowed) == produced.unsafe_buffer_pointer()
        cupy.cuda.Device().synchronize()  # as the launch does: JAX's writes are done
        (result,) = executable.run_checked(cupy, [borrowed])
        cupy.cuda.get_current_stream().synchronize()  # ours are (CuPy's stream)
        back = jax.dlpack.from_dlpack(result)
        checks["cupy -> jax: no copy"] = back.unsafe_buffer_pointer() == _pointer(result)
        checks["jax sees the softmax"] = bool(np.allclose(np.asarray(back), expected,
                                                          rtol=1e-5, atol=1e-6))

    def median_us(fn: Callable[[], Any]) -> float:
        for _ in range(5):
            fn()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)

    device = cupy.cuda.Device()
    device.synchronize()
    host["device.synchronize() on an idle GPU"] = median_us(device.synchronize)
    stream = cupy.cuda.get_current_stream()
    host["stream.synchronize() on an idle GPU (the launch's second wait)"] = median_us(
        stream.synchronize)
    host["cupy.from_dlpack(array)"] = median_us(lambda: cupy.from_dlpack(x))
    host["executable(x): checks + launches, no wait"] = median_us(lambda: executable(x))
    device.synchronize()
    host["executable.run_checked: launches, no wait"] = median_us(
        lambda: executable.run_checked(cupy, [x]))
    device.synchronize()
    host["executable(x) + synchronize"] = median_us(
        lambda: (executable(x), device.synchronize()))
    return {"checks": checks, "host_us": host}


# (m, k, n, relu, element type): the benchmark's dense layer, the MLP workloads' layers
# (batch 256 and 8: cuBLASLt's heuristic refuses a dimension of 1, so batch 1 would time
# the unfused path twice), a bias without relu, and f16.
LT_SHAPES = [(2048, 2048, 2048, True, "f32"), (256, 512, 1024, True, "f32"),
             (256, 1024, 256, False, "f32"), (8, 512, 512, True, "f32"),
             (2048, 2048, 2048, True, "f16")]


def cublaslt_ab(cupy: Any, repeat: int, shapes: list[tuple[Any, ...]] | None = None
                ) -> list[dict[str, Any]]:
    """Each dot epilogue compiled twice, fused by cuBLASLt (TFXLA_LITE_CUBLASLT unset) and
    as a cuBLAS product plus a loop kernel (=0); both checked against unfused CuPy, then
    timed interleaved (CUDA events, rounds of both in turn), medians in ms."""
    import os

    from tfxla_lite.codegen.gpu import compile_module

    rows = []
    rng = np.random.default_rng(1)
    for m, k, n, relu, element_type in shapes or LT_SHAPES:
        built = {}
        for label, value in (("cublaslt", None), ("cublas+loop", "0")):
            saved = os.environ.pop("TFXLA_LITE_CUBLASLT", None)
            if value is not None:
                os.environ["TFXLA_LITE_CUBLASLT"] = value
            try:
                built[label] = compile_module(dense_module(m, k, n, relu, element_type))
            finally:
                os.environ.pop("TFXLA_LITE_CUBLASLT", None)
                if saved is not None:
                    os.environ["TFXLA_LITE_CUBLASLT"] = saved
        dtype = np.float16 if element_type == "f16" else np.float32
        x, w, b = (cupy.asarray(rng.standard_normal(dims).astype(dtype) / 8)
                   for dims in ((m, k), (k, n), (n,)))
        wanted = (x.astype(np.float32) @ w.astype(np.float32) + b.astype(np.float32))
        wanted = cupy.maximum(wanted, 0) if relu else wanted
        tolerance = 2e-2 if element_type == "f16" else 2e-3
        arrays = (x, w, b)
        times: dict[str, list[float]] = {label: [] for label in built}
        for label, executable in built.items():
            got = executable(x, w, b)[0]
            np.testing.assert_allclose(cupy.asnumpy(got).astype(np.float32),
                                       cupy.asnumpy(wanted), rtol=tolerance, atol=tolerance,
                                       err_msg=f"{label} {m}x{k}x{n}")
        for _ in range(max(1, repeat // 10)):  # interleaved rounds
            for label, executable in built.items():
                times[label].append(time_gpu(cupy, lambda e=executable, a=arrays: e(*a), 10))
        fused = built["cublaslt"]
        rows.append({"shape": f"{m}x{k}x{n}", "relu": relu, "type": element_type,
                     "cublaslt_ms": statistics.median(times["cublaslt"]),
                     "cublas_loop_ms": statistics.median(times["cublas+loop"]),
                     "how": list(fused.lt_status.values()),
                     "launches": [fused.kernel_count, built["cublas+loop"].kernel_count]})
    return rows


def _tf_sees_a_gpu() -> bool:
    try:
        import tensorflow as tf
    except Exception:  # noqa: BLE001 - no TF on this machine
        return False
    return bool(tf.config.list_logical_devices("GPU"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables here")
    parser.add_argument("--dlpack", type=Path, default=None,
                        help="only the TF-free DLPack round trip and host costs, to this "
                             "JSON file")
    parser.add_argument("--cublaslt-ab", type=Path, default=None,
                        help="only the dot-epilogue A/B (cuBLASLt against cuBLAS + loop "
                             "kernel), to this JSON file")
    args = parser.parse_args(argv)
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # noqa: BLE001
        print(f"needs CuPy and a CUDA GPU: {error}", file=sys.stderr)
        return 2
    try:
        import jax

        has_jax = any(d.platform == "gpu" for d in jax.devices())
    except Exception:  # noqa: BLE001 - JAX absent or without a GPU
        has_jax = False
    properties = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    device = properties["name"].decode()
    if args.dlpack is not None:
        found = dlpack_round_trip(cupy, args.repeat)
        found["device"] = device
        for name, ok in found["checks"].items():
            print(f"{'ok  ' if ok else 'FAIL'} {name}")
        for name, micros in found["host_us"].items():
            print(f"{micros:10.1f} us  {name}")
        args.dlpack.parent.mkdir(parents=True, exist_ok=True)
        args.dlpack.write_text(json.dumps(found, indent=2) + "\n")
        return 0 if all(found["checks"].values()) else 1
    if args.cublaslt_ab is not None:
        found_ab = cublaslt_ab(cupy, args.repeat)
        print(f"# {device}: dot epilogues, median ms (interleaved rounds)\n")
        print("| dot + epilogue | type | cuBLASLt | cuBLAS + loop kernel | ratio | how |")
        print("| --- | --- | ---: | ---: | ---: | --- |")
        for row in found_ab:
            print(f"| {row['shape']} {'bias+relu' if row['relu'] else 'bias'} | "
                  f"{row['type']} | {row['cublaslt_ms']:.3f} | {row['cublas_loop_ms']:.3f} | "
                  f"{row['cublas_loop_ms'] / row['cublaslt_ms']:.2f}x | "
                  f"{'; '.join(row['how'])} |")
        args.cublaslt_ab.parent.mkdir(parents=True, exist_ok=True)
        args.cublaslt_ab.write_text(json.dumps({"device": device, "rows": found_ab},
                                               indent=2) + "\n")
        return 0
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    emit(f"# {device}: median ms of {args.repeat} runs (CuPy {cupy.__version__})\n")
    emit("| workload | tfxla-lite | kernels | unfused CuPy | JAX XLA:GPU | GB/s (tfxla-lite) |")
    emit("| --- | ---: | ---: | ---: | ---: | ---: |")
    results: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    chosen = workloads()
    for workload in chosen:
        row = measure(cupy, workload, rng, args.repeat, has_jax)
        row["device"] = device
        jax_text = f"{row['jax_ms']:.3f}" if row["jax_ms"] is not None else "-"
        emit(f"| {workload.name} | {row['tfxla_lite_ms']:.3f} | {row['kernels']} | "
             f"{row['cupy_unfused_ms']:.3f} | {jax_text} | {row['gb_per_s']:.0f} |")
        results.append(row)
    if _tf_sees_a_gpu():
        tf_functions = _tf_functions()
        emit("\n## Through TensorFlow on GPU:0 (host clock per call, ms)\n")
        emit("| workload | tfxla_lite.function | tf.function | TF XLA (jit_compile) | "
             "launch nodes | inputs copied |")
        emit("| --- | ---: | ---: | ---: | ---: | ---: |")
        for workload in chosen:
            workload.tf_fn = tf_functions[workload.name]
            row = measure_tf(workload, rng, args.repeat)
            row["device"] = device
            emit(f"| {workload.name} | {row['tfxla_lite_ms']:.3f} | {row['tf_function_ms']:.3f}"
                 f" | {row['tf_xla_ms']:.3f} | {row['gpu_launch_nodes']} | "
                 f"{row['inputs_copied']} |")
            results.append(row)
    else:
        emit("\n(TensorFlow sees no GPU here: the TF comparison was not run.)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
