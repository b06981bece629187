"""GPU clusters with unknown dimensions, compiled per input signature at run time, with TF.

As on the CPU (tests/dynamic), a cluster whose dimensions are unknown at trace time (a
`None` batch dimension) compiles for each concrete signature at its first launch, here
with the GPU backend (`GpuDynamicLaunch`, runtime/gpu_launch.py, calling the cluster's
`DynamicCluster`); in auto mode at most `max_specializations` signatures, then the
cluster's TF ops run; must-compile mode compiles every signature and raises the compile's
error. TF has no GPU here: `emulated_gpu` (conftest.py) says it has GPU:0 and the kernels
run on the CPU emulator, so shapes stay small and launches few.
"""

from __future__ import annotations

import logging

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from tolerances import assert_close

tf = pytest.importorskip("tensorflow", reason="no TensorFlow: the TF entry is not tested")

import tfxla_lite as tl  # noqa: E402
from tfxla_lite.driver import build_program  # noqa: E402
from tfxla_lite.options import Options  # noqa: E402
from tfxla_lite.original_function import original_tf_function  # noqa: E402
from tfxla_lite.program import Program  # noqa: E402
from tfxla_lite.runtime import gpu_launch, loader  # noqa: E402

pytestmark = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")

SPECS = (tf.TensorSpec([None, 8], tf.float32), tf.TensorSpec([8], tf.float32))
# The CPU path's words (tfxla_lite/dynamic.py), the same for a GPU cluster.
LIMIT_MESSAGE = "distinct input shapes (the limit); new shapes run in TensorFlow from now on"


def _model(x: tf.Tensor, b: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    with tf.device("/GPU:0"):
        y = tf.nn.relu(x * 2.0 + b) - 0.5
        return y, tf.reduce_sum(y, axis=1)


def _build(jit_compile: bool | None = None, max_specializations: int | None = None,
           function: object = _model, specs: tuple = SPECS, dump_to: str | None = None
           ) -> Program:
    concrete = tf.function(function).get_concrete_function(*specs)
    options = Options(min_cluster_size=1, verify=True, dump_to=dump_to)
    return build_program(concrete, jit_compile, options, dynamic=True,
                         max_specializations=max_specializations)


def _inputs(rows: int) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(rows)
    return (tf.constant(rng.standard_normal((rows, 8)).astype(np.float32)),
            tf.constant(rng.standard_normal(8).astype(np.float32)))


def _check(program: Program, rows: int) -> None:
    args = _inputs(rows)
    got, wanted = program.run(*args), _model(*args)
    for g, w, op in zip(got, wanted, ("Relu", "Sum")):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert_close(g.numpy(), w.numpy(), op)


def _launch(program: Program) -> gpu_launch.GpuDynamicLaunch:
    (launch,) = [c.gpu_launch for c in program.compiled
                 if isinstance(c.gpu_launch, gpu_launch.GpuDynamicLaunch)]
    return launch


def test_none_batch_compiles_once_per_batch_size(emulated_gpu: fake_cupy.Recorder) -> None:
    program = _build()
    assert len(program.dynamic_clusters) == 1 and not program.clusters
    assert program.dynamic_clusters[0].gpu == 0
    launch = _launch(program)
    _check(program, 2)
    per_call = len(emulated_gpu.launches)
    assert per_call >= 1
    for rows in (3, 2):
        _check(program, rows)
    assert launch.stats() == loader.DynamicStats(2, 0, False)
    assert len(program.dynamic_clusters[0].specializations) == 2
    assert len(emulated_gpu.launches) == 3 * per_call and launch.fallback_calls == 0
    # One module per compiled shape, in the order met; their CUDA, as for a static cluster.
    hlo = program.compiler_ir("hlo")
    assert hlo.count("ENTRY") == 2 and "f32[2,8]" in hlo and "f32[3,8]" in hlo
    assert program.compiler_ir("cuda").count('extern "C" __global__') >= 2
    # The GPU launch nodes, no launch op, no CPU-side compile op or If.
    ops = program.run.get_concrete_function(*SPECS).graph.get_operations()
    calls = [op for op in ops if op.type == "EagerPyFunc"]
    assert len(calls) == 1 and calls[0].device.endswith("device:GPU:0")
    assert not [op for op in ops if op.type in ("TfxlaLiteLaunch", "TfxlaLiteCompile",
                                                "StatelessIf", "Relu")]
    shapes = [tf.TensorShape(op.get_attr("shape")).as_list() for op in ops
              if op.type == "EnsureShape"]
    assert sorted(shapes, key=len) == [[None], [None, 8]]
    report = program.report
    assert [c.compiled for c in report.clusters] == [True]


def test_bound_in_auto_mode_runs_tf_on_the_gpu(emulated_gpu: fake_cupy.Recorder,
                                               caplog: pytest.LogCaptureFixture) -> None:
    program = _build(max_specializations=1)
    launch = _launch(program)
    assert launch.fallback is not None
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        _check(program, 1)
        per_call = len(emulated_gpu.launches)
        for rows in (2, 3, 1):
            _check(program, rows)
    assert launch.stats() == loader.DynamicStats(1, 1, True)
    assert launch.fallback_calls == 2 and len(emulated_gpu.launches) == 2 * per_call
    limit = [r.getMessage() for r in caplog.records if LIMIT_MESSAGE in r.getMessage()]
    assert limit == [f"tfxla-lite: {launch.key} met 1 {LIMIT_MESSAGE}"]


def test_compile_failure_runs_tf_in_auto_mode(emulated_gpu: fake_cupy.Recorder,
                                              monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    _fail_on_five_rows(monkeypatch)
    program = _build()
    launch = _launch(program)
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        for rows in (5, 4, 5):
            _check(program, rows)
    assert launch.stats() == loader.DynamicStats(1, 1, False)
    assert launch.fallback_calls == 2
    assert sum("no kernel for five rows" in r.getMessage() for r in caplog.records) == 1


def test_must_compile_has_no_bound_and_raises_the_compile_error(
        emulated_gpu: fake_cupy.Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    program = _build(jit_compile=True, max_specializations=1)
    launch = _launch(program)
    assert launch.fallback is None
    for rows in (1, 2):
        _check(program, rows)
    assert launch.stats() == loader.DynamicStats(2, 0, False)
    _fail_on_five_rows(monkeypatch)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="compiling for these input shapes failed: RuntimeError: GPU:0: "
                             "RuntimeError: no kernel for five rows"):
        program.run(*_inputs(5))
    assert launch.fallback_calls == 0


def _fail_on_five_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU backend refuses modules of five rows (as NVRTC refusing the source)."""
    compile_cluster = gpu_launch.compile_cluster

    def refuse_five(module, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if "f32[5,8]" in module.to_text():
            raise RuntimeError("GPU:0: RuntimeError: no kernel for five rows")
        return compile_cluster(module, *args, **kwargs)

    monkeypatch.setattr(gpu_launch, "compile_cluster", refuse_five)


def _mixed(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    with tf.device("/GPU:0"):
        return tf.nn.relu(x * 2.0 - 1.0), tf.nn.softmax(w * 3.0)


def test_static_and_dynamic_gpu_clusters_side_by_side(emulated_gpu: fake_cupy.Recorder
                                                      ) -> None:
    specs = (tf.TensorSpec([None, 8], tf.float32), tf.TensorSpec([4, 4], tf.float32))
    program = _build(function=_mixed, specs=specs)
    kinds = sorted(type(c.gpu_launch).__name__ for c in program.compiled)
    assert kinds == ["GpuDynamicLaunch", "GpuLaunch"]
    (static,) = [c.gpu_launch for c in program.compiled
                 if type(c.gpu_launch) is gpu_launch.GpuLaunch]
    w = tf.constant(np.linspace(-2, 2, 16, dtype=np.float32).reshape(4, 4))
    for rows in (2, 3):
        x = _inputs(rows)[0]
        got, wanted = program.run(x, w), _mixed(x, w)
        for g, e, op in zip(got, wanted, ("Relu", "Softmax")):
            assert g.shape == e.shape
            assert_close(g.numpy(), e.numpy(), op)
    assert static.calls == 2 and _launch(program).stats() == loader.DynamicStats(2, 0, False)
    assert len(program.clusters) == 1 and len(program.dynamic_clusters) == 1


def test_launch_node_refuses_other_ranks_and_dtypes(emulated_gpu: fake_cupy.Recorder) -> None:
    """The node's function called by TF with tensors no signature of the cluster fits:
    InvalidArgumentError naming the input and the partial shape, never a compile."""
    from tensorflow.python.ops import gen_script_ops

    program = _build()
    launch = _launch(program)
    x, b = _inputs(2)

    def run(*tensors: tf.Tensor) -> list[tf.Tensor]:
        @tf.function(autograph=False)
        def graph() -> list[tf.Tensor]:
            return gen_script_ops.eager_py_func(list(tensors), launch.token,
                                                [tf.float32, tf.float32])

        return graph()

    y, total = run(x, b)  # right: compiles for [2, 8]
    assert_close(total.numpy(), _model(x, b)[1].numpy(), "Sum")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input 0 is float32\[2,8,1\], compiled for float32\[\?,8\]"):
        run(x[..., None], b)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input 1 is float32\[9\], compiled for float32\[8\]"):
        run(x, tf.zeros([9]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input 0 is float64\[2,8\], compiled for float32\[\?,8\]"):
        run(tf.cast(x, tf.float64), b)
    assert launch.stats() == loader.DynamicStats(1, 0, False)


def test_none_batch_through_tfxla_lite_function(emulated_gpu: fake_cupy.Recorder) -> None:
    """The user's path, as Keras takes it: a `tfxla_lite.function` called while TF traces
    a function whose batch dimension is None (its input_signature); one trace, one
    program, a compile per batch size, each matching TF. (Called eagerly, a
    `tfxla_lite.function` traces each concrete shape: static clusters.)"""
    inner = tl.function(_model, min_cluster_size=1)
    outer = original_tf_function()(lambda x, b: inner(x, b), input_signature=list(SPECS))
    for rows in (3, 1, 3):
        args = _inputs(rows)
        for g, w, op in zip(outer(*args), _model(*args), ("Relu", "Sum")):
            assert g.shape == w.shape
            assert_close(g.numpy(), w.numpy(), op)
    (program,) = inner._programs.values()
    assert _launch(program).stats() == loader.DynamicStats(2, 0, False)
    assert [c.compiled for c in program.report.clusters] == [True]


def _reshaped(x: tf.Tensor) -> tf.Tensor:
    with tf.device("/CPU:0"):
        rows = tf.shape(x)[0]  # an int32 computed outside the GPU cluster
    with tf.device("/GPU:0"):
        pairs = tf.reshape(tf.nn.relu(x * 2.0 + 1.0), [rows, 4, 2])
        return tf.reduce_sum(pairs * 0.5, axis=2)


@pytest.mark.parametrize("bound", [2, 1])
def test_value_keyed_int32_input_crosses_as_uint32(emulated_gpu: fake_cupy.Recorder,
                                                   bound: int) -> None:
    """A Reshape target computed outside (on the CPU) is a value-keyed input: its value
    picks the signature and is embedded in the code. int32 crosses the node as uint32;
    the launch reads its value as int32, and the fallback (bound 1) gets int32 back."""
    program = _build(max_specializations=bound, function=_reshaped,
                     specs=(tf.TensorSpec([None, 8], tf.float32),))
    launch = _launch(program)
    assert len(launch.value_inputs) == 1
    assert launch.input_specs[launch.value_inputs[0]][0] == tf.int32
    for rows in (2, 3):
        x = _inputs(rows)[0]
        got, wanted = program.run(x), _reshaped(x)
        assert got.shape == wanted.shape == (rows, 4)
        assert_close(got.numpy(), wanted.numpy(), "Sum")
    assert launch.stats() == loader.DynamicStats(bound, 2 - bound, bound == 1)
    assert launch.fallback_calls == 2 - bound
    ops = program.run.get_concrete_function(tf.TensorSpec([None, 8])).graph.get_operations()
    (call,) = [op for op in ops if op.type == "EagerPyFunc"]
    assert call.get_attr("Tin") == [tf.float32, tf.uint32]
    # The value is embedded: the executable takes x alone.
    (planned,) = [d for d in program.dynamic_clusters if d.gpu == 0]
    assert planned.param_inputs == (0,) and launch.value_inputs == (1,)
    entry = planned.specializations[0].hlo_text.split("ENTRY")[1].split("\n")[0]
    assert "f32[2,8]" in entry and "s32" not in entry


def test_each_signature_is_dumped_with_its_cuda(emulated_gpu: fake_cupy.Recorder,
                                               tmp_path: object) -> None:
    """Dumps: a GPU cluster's files (no .ll) for each signature as it compiles."""
    program = _build(dump_to=str(tmp_path))
    assert not list(tmp_path.glob("*.cu"))  # nothing compiled at trace time
    for rows in (2, 3):
        _check(program, rows)
    cuda = sorted(tmp_path.glob("module_*.cu"))
    assert len(cuda) == 2 and not list(tmp_path.glob("*.ll"))
    assert len(list(tmp_path.glob("module_*.kernel-plan.txt"))) == 2
    texts = [c.executable.cuda_source for c in program.dynamic_clusters[0].specializations]
    assert [f.read_text() for f in cuda] == texts
    # Titled as a static GPU cluster is, with the signature.
    report = (tmp_path / "report.html").read_text()
    assert "cluster_0 ([2, 8], [8]) on GPU:0" in report
    assert "cluster_0 ([3, 8], [8]) on GPU:0" in report


def _sgd_step(seed: int):  # noqa: ANN202
    """A Dense layer's SGD step and its variables; unplaced, so on TF's default device,
    the (emulated) GPU."""
    rng = np.random.default_rng(seed)
    variables = (tf.Variable(rng.standard_normal((4, 3)).astype(np.float32)),
                 tf.Variable(np.zeros(3, np.float32)))

    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.tanh(tf.matmul(x, variables[0]) +
                                                    variables[1]) - y))
        for variable, gradient in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(0.1 * gradient)
        return loss

    return step, variables


def test_keras_style_step_generalized_by_reduce_retracing(emulated_gpu: fake_cupy.Recorder
                                                          ) -> None:
    """Keras's tf.function(step, reduce_retracing=True) retraces with a None batch
    dimension: the GPU clusters of that trace compile per batch size (the dot through the
    cuBLAS model), and the variables follow TF's."""
    step, variables = _sgd_step(0)
    keras_step = tf.function(step, reduce_retracing=True)
    concrete = keras_step.get_concrete_function(tf.TensorSpec([None, 4]),
                                                tf.TensorSpec([None, 3]))
    program = build_program(concrete, None, Options(min_cluster_size=4, verify=True),
                            dynamic=True)
    launches = [c.gpu_launch for c in program.compiled
                if isinstance(c.gpu_launch, gpu_launch.GpuDynamicLaunch)]
    assert launches and all(launch.device == 0 for launch in launches)
    reference, reference_variables = _sgd_step(0)
    rng = np.random.default_rng(1)
    for n in (5, 3, 5):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        y = rng.random((n, 3)).astype(np.float32)
        assert_close(program.run(x, y).numpy(), reference(x, y).numpy(), "Mean")
        for variable, wanted in zip(variables, reference_variables):
            assert_close(variable.numpy(), wanted.numpy(), "MatMul")
    assert all(launch.stats() == loader.DynamicStats(2, 0, False) for launch in launches)
    assert emulated_gpu.gemms
