"""GPU placement in `tfxla_lite.function`, end to end with TF, on the CPU emulator.

A cluster TF places on a GPU compiles with the GPU backend and runs through a launch
node (EagerPyFunc → EnsureShape → IdentityN, `tfxla_lite/runtime/gpu_launch.py`) that
hands TF's tensors to the `GpuExecutable` by DLPack. Here TF has no GPU (tensorflow-cpu):
`EmulatedGpuBackend` says it has GPU:0, `fake_cupy` stands in for CuPy and the kernels
run on `cuda_emulator`. Everything else is the code a GPU runs: placement, lowering, the
GPU backend, the graph rewrite, the launch node, the argument and result order, the
checks, DLPack, the fallback to TF. The last test needs a real GPU and skips without one.
"""

from __future__ import annotations

import sys

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from tolerances import assert_close

# The lent GPU machines have CuPy but no TensorFlow: everything here needs TF.
tf = pytest.importorskip("tensorflow", reason="no TensorFlow: the TF entry is not tested")

from emulated_backend import EmulatedGpuBackend  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from tfxla_lite.runtime import gpu_launch  # noqa: E402

needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")


# `emulated_gpu` (tests/gpu/conftest.py): TF 'has' GPU:0, CuPy is the emulating stand-in.


def _model(x: tf.Tensor, n: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """Three inputs and three outputs of different dtypes and shapes, so that any mix-up
    of argument or result order shows."""
    h = tf.nn.softmax(x * 2.0 + y, axis=-1)
    count = tf.cast(tf.reduce_sum(tf.cast(h > 0.1, tf.int32), axis=1), tf.int32) + n
    return h, count, tf.reduce_max(x, axis=0) - y


def _arguments() -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(7)
    return (tf.constant(rng.standard_normal((4, 8)).astype(np.float32)),
            tf.constant(np.arange(4, dtype=np.int32)),
            tf.constant(rng.standard_normal(8).astype(np.float32)))


def _placed(device: str | None, **options: object) -> tl.Function:
    """The model with its ops placed on `device` (None: TF's placement), compiled with
    `options` (default: must-compile, its two independent clusters kept apart, so that
    each is a launch node of its own: test_independent_gpu_clusters_share_one_launch
    merges them)."""
    def placed(x: tf.Tensor, n: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, ...]:
        if device is None:
            return _model(x, n, y)
        with tf.device(device):
            return _model(x, n, y)

    return tl.function(placed, **(options or {"jit_compile": True, "options": tl.Options(
        merge_independent_clusters=False)}))


def _ops(function: tl.Function, *args: tf.Tensor) -> list[tf.Operation]:
    return function.get_concrete_function(*args).graph.get_operations()


def _assert_matches_tf(outputs: tuple[tf.Tensor, ...], args: tuple[tf.Tensor, ...]) -> None:
    expected = _model(*args)
    assert len(outputs) == len(expected)
    for got, wanted, op in zip(outputs, expected, ("Softmax", "Sum", "Max")):
        assert got.dtype == wanted.dtype and got.shape == wanted.shape
        assert_close(got.numpy(), wanted.numpy(), op)


def test_gpu_placement_follows_tf() -> None:
    two = EmulatedGpuBackend(gpus=(0, 1))
    assert gpu_launch.placed_gpu("/job:localhost/replica:0/task:0/device:GPU:1", two) == 1
    assert gpu_launch.placed_gpu("/device:GPU:0", two) == 0
    assert gpu_launch.placed_gpu("/device:GPU:*", two) == 0
    assert gpu_launch.placed_gpu("", two) == 0  # TF's default placement: the first GPU
    assert gpu_launch.placed_gpu("/device:CPU:0", two) is None
    assert gpu_launch.placed_gpu("/device:GPU:3", two) is None  # TF soft-places it
    none = EmulatedGpuBackend(gpus=())
    assert gpu_launch.placed_gpu("", none) is None
    assert gpu_launch.placed_gpu("/device:GPU:0", none) is None
    # This TF (tensorflow-cpu on the development machines) has no GPU: CPU as before.
    if not tf.config.list_logical_devices("GPU"):
        assert gpu_launch.placed_gpu("/device:GPU:0") is None
        assert gpu_launch.placed_gpu("") is None


@needs_gxx
@pytest.mark.parametrize("device", ["/GPU:0", None])
def test_gpu_cluster_runs_through_the_gpu_launch_node(emulated_gpu: fake_cupy.Recorder,
                                                      device: str | None) -> None:
    """Explicit `tf.device('/GPU:0')` and TF's default placement (TF has a GPU)."""
    function = _placed(device)
    args = _arguments()
    outputs = function(*args)
    _assert_matches_tf(outputs, args)

    ops = _ops(function, *args)
    report = function.explain(*args)
    # Two clusters (softmax and count; max and subtract), one launch node each.
    assert [c.compiled for c in report.clusters] == [True, True]
    assert all(c.kernel_count >= 1 for c in report.clusters)
    calls = [op for op in ops if op.type == "EagerPyFunc"]
    assert len(calls) == 2 and all(c.device.endswith("device:GPU:0") for c in calls)
    assert not [op for op in ops if op.type in ("TfxlaLiteLaunch", "Softmax", "Max")]
    assert [o.shape.as_list() for o in function.get_concrete_function(*args).outputs] == [
        [4, 8], [4], [8]]
    assert emulated_gpu.launches  # the kernels ran (on the emulator)
    launches = len(emulated_gpu.launches)
    _assert_matches_tf(function(*args), args)  # the second call reuses the program
    assert len(emulated_gpu.launches) == 2 * launches


@needs_gxx
def test_independent_gpu_clusters_share_one_launch(emulated_gpu: fake_cupy.Recorder) -> None:
    """By default the model's two clusters, which no path joins, are one launch node."""
    function = _placed("/GPU:0", jit_compile=True)
    args = _arguments()
    _assert_matches_tf(function(*args), args)
    assert [c.compiled for c in function.explain(*args).clusters] == [True]
    calls = [op for op in _ops(function, *args) if op.type == "EagerPyFunc"]
    assert len(calls) == 1 and calls[0].device.endswith("device:GPU:0")


@needs_gxx
def test_gpu_clusters_in_a_loop_body_and_around_variables(emulated_gpu: fake_cupy.Recorder
                                                          ) -> None:
    """GPU launches inside a While body (a function of its own), and between a variable
    read and write (captures and control outputs re-bound around the launch)."""
    x = tf.constant(np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8))

    @tl.function(min_cluster_size=1)
    def loop(x: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, acc: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            with tf.device("/GPU:0"):
                return i + 1, tf.tanh(acc * 0.5 + x)

        return tf.while_loop(lambda i, acc: i < 3, body, (tf.constant(0), x))[1]

    expected = x
    for _ in range(3):
        expected = tf.tanh(expected * 0.5 + x)
    assert_close(loop(x).numpy(), expected.numpy(), "Tanh")
    report = loop.explain(x)
    assert any(c.compiled and c.name.startswith("while_body") for c in report.clusters)

    variable = tf.Variable(np.full((4, 8), 2.0, np.float32))

    @tl.function(min_cluster_size=1)
    def step(x: tf.Tensor) -> tf.Tensor:
        with tf.device("/GPU:0"):
            y = tf.nn.relu(variable * x + 1.0)
            variable.assign(y * 0.5)
            return tf.reduce_sum(y)

    y = tf.nn.relu(2.0 * x + 1.0)
    assert_close(step(x).numpy(), tf.reduce_sum(y).numpy(), "Sum")
    assert_close(variable.numpy(), (y * 0.5).numpy(), "Mul")  # the write ran, once
    assert [c.compiled for c in step.explain(x).clusters] == [True]
    assert emulated_gpu.launches


@needs_gxx
def test_gpu_cpu_placement_is_unchanged(emulated_gpu: fake_cupy.Recorder) -> None:
    function = _placed("/CPU:0")
    args = _arguments()
    _assert_matches_tf(function(*args), args)
    types = [op.type for op in _ops(function, *args)]
    assert "TfxlaLiteLaunch" in types and "EagerPyFunc" not in types
    assert not emulated_gpu.launches


def test_gpu_cluster_without_cupy_falls_back_to_tf_on_the_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TF has a GPU, CuPy is missing: the cluster stays in TF, on the GPU, and the
    report says why; in must-compile mode that is an error naming the cause."""
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    with gpu_launch.use_backend(EmulatedGpuBackend()):
        function = _placed("/GPU:0", min_cluster_size=1)
        args = _arguments()
        _assert_matches_tf(function(*args), args)
        report = function.explain(*args)
        assert report.clusters and not any(c.compiled for c in report.clusters)
        assert all("needs CuPy" in c.error and "GPU:0" in c.error for c in report.clusters)
        assert any("needs CuPy" in f.reason for f in report.fallbacks)
        ops = _ops(function, *args)
        softmax = [op for op in ops if op.type == "Softmax"]
        assert softmax and softmax[0].device.endswith("device:GPU:0")
        assert not [op for op in ops if op.type in ("EagerPyFunc", "TfxlaLiteLaunch")]

        # Strict: otherwise jit_compile=True runs such a trace on TF's XLA.
        must = _placed("/GPU:0", jit_compile=True, options=tl.Options(strict_jit_compile=True))
        with pytest.raises(tl.CompilationError, match="needs CuPy"):
            must(*args)


@needs_gxx
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
def test_gpu_dots_read_operands_in_place_through_tf(emulated_gpu: fake_cupy.Recorder,
                                                   dtype: tf.DType) -> None:
    """Dots of a GPU cluster through the launch node against TF's own results: a Dense
    layer's weight gradient (x^T . dy: op T, no copy) and attention scores over a
    [b, s, h, d] layout (heads as cuBLAS's batch, b looped or the operands copied, as
    `gemm.plan_gemm` chooses), f16 accumulating in f32."""

    @tl.function(jit_compile=True)
    def dots(x: tf.Tensor, dy: tf.Tensor, q: tf.Tensor, k: tf.Tensor) -> tuple[tf.Tensor, ...]:
        with tf.device("/GPU:0"):
            gradient = tf.matmul(x, dy, transpose_a=True)
            scores = tf.einsum("bshd,bthd->bhst", q, k)
            return gradient * 0.5, scores + 1.0

    rng = np.random.default_rng(11)
    shapes = [(16, 8), (16, 4), (2, 5, 3, 8), (2, 6, 3, 8)]
    args = [tf.constant(rng.standard_normal(s).astype(dtype.as_numpy_dtype)) for s in shapes]
    got = dots(*args)
    gradient = tf.matmul(args[0], args[1], transpose_a=True) * 0.5
    scores = tf.einsum("bshd,bthd->bhst", args[2], args[3]) + 1.0
    assert_close(got[0].numpy(), gradient.numpy(), "MatMul")
    assert_close(got[1].numpy(), scores.numpy(), "Einsum")
    assert emulated_gpu.gemms
    assert {g.compute_type for g in emulated_gpu.gemms} == {fake_cupy.CUBLAS_COMPUTE_32F}
    # x^T . dy reads x through op T (in cuBLAS's column-major terms: no copy of x).
    assert any(g.transb == fake_cupy.CUBLAS_OP_T and g.batch == 1 for g in emulated_gpu.gemms)


@needs_gxx
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.int32])  # bf16: no NumPy DLPack
def test_gpu_transposes_tiled_through_tf(emulated_gpu: fake_cupy.Recorder,
                                         dtype: tf.DType) -> None:
    """Transposes that move the minor dimension, tiled through shared memory (the
    `transpose` kernel), against TF's own results: a plain one (exact), a batched one
    with elementwise work on both sides, odd sizes (edge tiles); the Transformer's
    [b, s, h, d] -> [b, h, s, d] keeps its minor dimension: a loop kernel."""

    @tl.function(jit_compile=True)
    def moved(x: tf.Tensor, y: tf.Tensor, z: tf.Tensor, q: tf.Tensor) -> tuple[tf.Tensor, ...]:
        with tf.device("/GPU:0"):
            return (tf.transpose(x), tf.transpose(y * y + x[:1, :1], [0, 2, 1]) - z,
                    tf.transpose(q, [0, 2, 1, 3]))

    rng = np.random.default_rng(13)
    shapes = [(33, 40), (2, 20, 36), (2, 36, 20), (2, 5, 3, 8)]
    args = [tf.constant((rng.standard_normal(s) * 8).astype(dtype.as_numpy_dtype))
            for s in shapes]
    got = moved(*args)
    x, y, z, q = args
    assert got[0].numpy().tobytes() == tf.transpose(x).numpy().tobytes()
    assert_close(got[1].numpy(), (tf.transpose(y * y + x[:1, :1], [0, 2, 1]) - z).numpy(),
                 "Sub")
    assert got[2].numpy().tobytes() == tf.transpose(q, [0, 2, 1, 3]).numpy().tobytes()
    compiled = moved._program(*moved._canonical(tuple(args), {})).compiled  # noqa: SLF001
    programs = [c.gpu_launch.executable.program for c in compiled if c.gpu_launch is not None]
    kinds = sorted(t.plan.kind for program in programs for t in program.thunks)
    assert kinds == ["loop", "transpose", "transpose"], [p.plan_text() for p in programs]


class CompileException(Exception):
    """What `cupy.RawModule` raises when NVRTC refuses a source (CuPy's own class)."""


@needs_gxx
def test_gpu_cluster_nvrtc_refuses_falls_back_to_tf_on_the_gpu(
        emulated_gpu: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy and the GPU are there but NVRTC refuses the program (an unsupported
    architecture, a toolkit bug): the build fails at trace time, the cluster stays in TF
    on the GPU with the compiler's message in the report, nothing is launched; with
    `jit_compile=True` the same message is a `CompilationError`."""
    cupy = sys.modules["cupy"]

    def refuse(self: object, name: str) -> None:
        raise CompileException(f"nvrtc: error: invalid value for --gpu-architecture ({name})")

    monkeypatch.setattr(cupy.RawModule, "get_function", refuse)

    function = _placed("/GPU:0", min_cluster_size=1)
    args = _arguments()
    _assert_matches_tf(function(*args), args)
    report = function.explain(*args)
    assert report.clusters and not any(c.compiled for c in report.clusters)
    assert all(c.error.startswith("GPU:0: CompileException: nvrtc: error")
               for c in report.clusters), [c.error for c in report.clusters]
    ops = _ops(function, *args)
    assert not [op for op in ops if op.type in ("EagerPyFunc", "TfxlaLiteLaunch")]
    assert [op for op in ops if op.type == "Softmax"][0].device.endswith("device:GPU:0")
    assert not emulated_gpu.launches and not emulated_gpu.gemms
    with pytest.raises(tl.CompilationError, match="CompileException: nvrtc: error"):
        _placed("/GPU:0", jit_compile=True, options=tl.Options(strict_jit_compile=True))(*args)


@needs_gxx
def test_gpu_cluster_with_unknown_dimensions_compiles_at_run_time(
        emulated_gpu: fake_cupy.Recorder) -> None:
    """A dimension known only at run time: the GPU cluster compiles for the shape it meets
    (tests/gpu/test_gpu_dynamic_tf.py covers the run-time specialization)."""
    @tl.function(min_cluster_size=1)
    def unknown(x: tf.Tensor) -> tf.Tensor:
        positive = tf.boolean_mask(x, x > 0.0)  # a dimension known only at run time
        with tf.device("/GPU:0"):
            return tf.nn.relu(positive * 2.0 - 1.0)

    x = tf.constant(np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8))
    expected = tf.nn.relu(tf.boolean_mask(x, x > 0.0) * 2.0 - 1.0)
    np.testing.assert_array_equal(unknown(x).numpy(), expected.numpy())
    report = unknown.explain(x)
    assert [c.compiled for c in report.clusters] == [True, True, True]
    # `x > 0`, unplaced, is on the default GPU: its static cluster compiles there; so do,
    # at run time, boolean_mask's gather after TF's Where (12 elements) and the Relu.
    (program,) = [p for p in unknown._programs.values()
                  if any(c.gpu_launch is not None and c.gpu_launch.calls for c in p.compiled)]
    kinds = [type(c.gpu_launch).__name__ for c in program.compiled]
    assert kinds == ["GpuLaunch", "GpuDynamicLaunch", "GpuDynamicLaunch"]
    assert all(c.gpu_launch.calls == 1 for c in program.compiled)
    assert [c.gpu_launch.stats().compiled for c in program.compiled[1:]] == [1, 1]


@needs_gxx
def test_gpu_launch_node_carries_int32_as_uint32(emulated_gpu: fake_cupy.Recorder) -> None:
    """TF's EagerPyFunc has no GPU kernel for int32 (py_func.cc): an int32 input or output
    would put the launch node on the CPU. They cross it as uint32 between Bitcasts on the
    GPU, and the results are still the int32 values TF computes."""
    function = _placed("/GPU:0")
    args = _arguments()
    _assert_matches_tf(function(*args), args)  # `n` in and `count` out are int32
    ops = _ops(function, *args)
    calls = [op for op in ops if op.type == "EagerPyFunc"]
    for call in calls:
        assert tf.int32 not in [*call.get_attr("Tin"), *call.get_attr("Tout")]
    casts = [op for op in ops if op.type == "Bitcast"]
    assert len(casts) == 2 and all(op.device.endswith("device:GPU:0") for op in casts)
    assert {(op.get_attr("T"), op.get_attr("type")) for op in casts} == {
        (tf.int32, tf.uint32), (tf.uint32, tf.int32)}


@needs_gxx
def test_gpu_launch_node_checks_its_inputs(emulated_gpu: fake_cupy.Recorder) -> None:
    """The launch node's function, called by TF with tensors the cluster was not
    compiled for: InvalidArgumentError naming the input (never a wrong result)."""
    function = _placed("/GPU:0")
    args = _arguments()
    expected = function(*args)
    (call,) = [op for op in _ops(function, *args)
               if op.type == "EagerPyFunc" and len(op.inputs) == 3]
    token, out_types = call.get_attr("token"), call.get_attr("Tout")
    by_name = {f"args_{i}": a for i, a in enumerate(args)}  # the rewritten trace's arguments

    def wired(t: tf.Tensor) -> tf.Tensor:  # int32 reaches the node as uint32 (a Bitcast)
        if t.op.type == "Bitcast":
            return tf.bitcast(by_name[t.op.inputs[0].op.name], t.dtype)
        return by_name[t.op.name]

    inputs = [wired(t) for t in call.inputs]

    def run(*tensors: tf.Tensor) -> list[tf.Tensor]:
        from tensorflow.python.ops import gen_script_ops

        @tf.function(autograph=False)
        def graph() -> list[tf.Tensor]:
            return gen_script_ops.eager_py_func(list(tensors), token, out_types)

        return graph()

    results = run(*inputs)  # the node's own function, called right
    assert len(results) == 2
    for got in results:
        got = tf.bitcast(got, tf.int32) if got.dtype == tf.uint32 else got
        (wanted,) = [e for e in expected if e.dtype == got.dtype and e.shape == got.shape]
        assert_close(got.numpy(), wanted.numpy(), "Softmax")
    wrong_shape = tf.zeros([*inputs[0].shape, 2], inputs[0].dtype)
    dims = ",".join(str(d) for d in wrong_shape.shape)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"input 0 is {inputs[0].dtype.name}\[{dims}\], compiled for"):
        run(wrong_shape, *inputs[1:])
    k = [t.dtype for t in inputs].index(tf.uint32)
    wrong_type = [tf.cast(t, tf.int64) if i == k else t for i, t in enumerate(inputs)]
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"input {k} is int64\[4\]"):
        run(*wrong_type)
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 inputs expected, got 2"):
        run(*inputs[:2])


def test_gpu_dlpack_hands_over_memory_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """TF tensor → device array → TF tensor: the same bytes each way (host memory here,
    the same code as on a GPU)."""
    cupy = fake_cupy.module()
    with tf.device("/CPU:0"):  # host memory, which NumPy (the stand-in) can read
        tensor = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    array = gpu_launch.to_device_array(tensor, 0, cupy)
    np.testing.assert_array_equal(array.array, tensor.numpy())
    again = gpu_launch.to_device_array(tensor, 0, cupy)
    assert again.array.ctypes.data == array.array.ctypes.data  # TF's buffer, not copies

    result = cupy.empty((2, 5), np.int32)
    result.array[...] = np.arange(10).reshape(2, 5)
    back = gpu_launch.to_tensor(result)
    assert back.dtype == tf.int32 and back.shape == (2, 5)
    assert gpu_launch.to_device_array(back, 0, cupy).array.ctypes.data == \
        result.array.ctypes.data
    np.testing.assert_array_equal(back.numpy(), result.array)


def test_gpu_function_on_a_real_gpu(cuda_device: object) -> None:
    """On a GPU machine: the launch node receives the inputs on the GPU (no copies),
    its outputs stay there, and the values match TF."""
    if not tf.config.list_logical_devices("GPU"):
        pytest.skip("no GPU: TensorFlow sees no GPU device (tensorflow-cpu, or no driver)")
    function = _placed("/GPU:0")
    with tf.device("/GPU:0"):
        args = tuple(tf.identity(a) for a in _arguments())
    outputs = function(*args)
    assert all("GPU:0" in o.backing_device for o in outputs)
    _assert_matches_tf(outputs, args)
    compiled = function._program(*function._canonical(args, {})).compiled  # noqa: SLF001
    (launch,) = [c.gpu_launch for c in compiled if c.gpu_launch is not None]
    # Float tensors are handed over in place; only one TF holds in host memory (int32)
    # may be copied, should TF pass it to the launch there.
    in_host = sum("GPU" not in a.backing_device for a in args)
    assert launch.calls == 1 and launch.copied_inputs <= in_host <= 1


def test_gpu_launch_checks_the_executables_outputs_once() -> None:
    """The outputs' static shapes are checked against the executable when the launch is
    built (a call then checks its inputs only), and a mismatch names both."""
    from types import SimpleNamespace

    from tfxla_lite.hlo.shape import Shape

    executable = SimpleNamespace(output_shapes=[Shape("f32", (4, 8)), Shape("s32", (4,))])
    launch = gpu_launch.GpuLaunch("ok", executable, 0, [(tf.float32, (4, 8))],
                                  [(tf.float32, (4, 8)), (tf.int32, (4,))])
    assert launch.output_specs == [(tf.float32, (4, 8)), (tf.int32, (4,))]
    with pytest.raises(ValueError, match=r"makes \['float32\[4,8\]', 'int32\[4\]'\], the "
                                         r"graph expects \['float32\[4,8\]', 'int32\[5\]'\]"):
        gpu_launch.GpuLaunch("bad", executable, 0, [(tf.float32, (4, 8))],
                             [(tf.float32, (4, 8)), (tf.int32, (5,))])
