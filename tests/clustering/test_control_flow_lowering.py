"""TF's While/If/Case and TensorList ops lowered to HLO while/conditional
(clustering/rules_control_flow.py), checked against TF.

Each case is traced, clustered and lowered; the HLO is evaluated (the NumPy evaluator
runs while and conditional) on the function's arguments and compared with TF's result.
Where the CPU backend compiles HLO control flow, the same functions run end to end
through `tl.function` in auto and must-compile mode, counting the launch ops that run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import run_clusters, trace

import tfxla_lite as tl
from tfxla_lite import rewrite
from tfxla_lite.clustering import cluster_graph
from tfxla_lite.clustering.registry import OP_RULES
from tfxla_lite.clustering.rules_control_flow import backend_refusal, lowering_only

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerances import assert_close  # noqa: E402 - tests/tolerances.py, by path

F32 = np.float32
# Read by test_clustering_ops.test_every_registered_op_is_tested: the ops these tests lower
# and check against TF (While: the Keras recurrent steps' loops, which read variables;
# VariableShape: their gradients' zeros for a variable).
TESTED_OPS = frozenset({"While", "StatelessWhile", "StatelessIf", "StatelessCase",
                        "VariableShape", "EmptyTensorList", "TensorListReserve",
                        "TensorListFromTensor", "TensorListSetItem", "TensorListGetItem",
                        "TensorListPushBack", "TensorListPopBack", "TensorListStack",
                        "TensorListElementShape", "TensorListLength"})
# The launch op types (a cluster that writes variables has its own: rules_variables.py).
LAUNCHES = frozenset(getattr(rewrite, "LAUNCH_OP_TYPES", {rewrite.LAUNCH_OP_TYPE}))


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _tf(fn: Callable[..., Any], args: Sequence[Any]) -> list[np.ndarray]:
    out = tf.function(fn)(*[tf.constant(a) for a in args])
    return [np.asarray(t) for t in tf.nest.flatten(out)]


def _lowered(fn: Callable[..., Any], args: Sequence[Any], whole: Sequence[str]) -> None:
    """`fn` as one cluster holding its `whole` control-flow ops, evaluated against TF."""
    with lowering_only():
        concrete = trace(fn, args)
        result = cluster_graph(concrete.graph, min_cluster_size=1)
        clustered = {n for c in result.clusters for n in c.op_names}
        types = {concrete.graph.get_operation_by_name(n).type for n in clustered}
        missing = set(whole) - types
        refused = {d.op_type: d.reason for d in result.decisions.values()
                   if d.op_type in missing}
        assert not missing, f"not clustered: {refused}"
        evaluated, _ = run_clusters(concrete, args, compiled=False)
    for i, (tensor, want) in enumerate(zip(concrete.graph.outputs, _tf(fn, args),
                                           strict=True)):
        assert tensor.name in evaluated, f"output {tensor.name} not made by a cluster"
        assert_close(evaluated[tensor.name], want, "MatMul", f"output {i}")


def _recurrence(x: tf.Tensor, w: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return i + 1, tf.tanh(tf.matmul(h, w) + 0.5) * 0.9 + h * 0.1

    return tf.while_loop(lambda i, h: i < n, body, (tf.constant(0), x))[1]


def _recurrence_args(n: int) -> list[Any]:
    rng = _rng()
    return [rng.normal(size=(4, 8)).astype(F32), (rng.normal(size=(8, 8)) * 0.3).astype(F32),
            np.int32(n)]


@pytest.mark.parametrize("trips", [0, 1, 7])
def test_while_with_a_data_dependent_trip_count(trips: int) -> None:
    _lowered(_recurrence, _recurrence_args(trips), ["StatelessWhile"])


def test_while_with_maximum_iterations() -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.while_loop(lambda i, a: i < 100, lambda i, a: (i + 1, a * 1.5 - 0.25),
                             (0, x), maximum_iterations=5)[1]

    _lowered(fn, [np.linspace(-2, 2, 6).astype(F32)], ["StatelessWhile"])


def test_nested_loops_whose_inner_trip_count_is_the_outer_counter() -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:
        def outer(i: tf.Tensor, a: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            b = tf.while_loop(lambda j, b: j < i, lambda j, b: (j + 1, b * 0.5 + 1.0),
                              (0, a))[1]
            return i + 1, b

        return tf.while_loop(lambda i, a: i < 4, outer, (0, x))[1]

    _lowered(fn, [np.arange(5, dtype=F32)], ["StatelessWhile"])


def test_cond_takes_either_branch() -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.cond(tf.reduce_sum(x) > 0.0, lambda: tf.exp(x * 0.5), lambda: x * x - 1.0)

    x = _rng().normal(size=(3, 4)).astype(F32)
    _lowered(fn, [np.abs(x)], ["StatelessIf"])
    _lowered(fn, [-np.abs(x)], ["StatelessIf"])


@pytest.mark.parametrize("index", [0, 2, 7, -1])
def test_switch_case_runs_the_indexed_branch_or_the_last(index: int) -> None:
    def fn(x: tf.Tensor, i: tf.Tensor) -> tf.Tensor:
        return tf.switch_case(i, [lambda: x * 2.0, lambda: tf.sin(x), lambda: x + 5.0])

    _lowered(fn, [np.linspace(-1, 1, 4).astype(F32), np.int32(index)], ["StatelessCase"])


def test_scan_and_map_fn_lower_their_tensor_lists() -> None:
    x = _rng().normal(size=(6, 3)).astype(F32)
    _lowered(lambda x: tf.scan(lambda a, b: tf.tanh(a) * b + 1.0, x), [x],
             ["StatelessWhile", "TensorListFromTensor", "TensorListStack"])
    _lowered(lambda x: tf.map_fn(lambda r: tf.reduce_sum(r * r), x), [x],
             ["StatelessWhile", "TensorListReserve"])


def test_tensor_array_writes_reads_and_sizes() -> None:
    def fixed(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        ta = tf.TensorArray(tf.float32, size=4, element_shape=(3,)).unstack(x)
        ta = ta.write(2, ta.read(0) + ta.read(3))
        return ta.stack(), tf.cast(ta.size(), tf.float32)

    _lowered(fixed, [_rng().normal(size=(4, 3)).astype(F32)],
             ["TensorListSetItem", "TensorListGetItem", "TensorListStack"])


def test_gradient_of_a_loop_lowers_the_forward_and_gradient_loops() -> None:
    def fn(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            h = tf.while_loop(lambda i, h: i < 5,
                              lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                              (0, x), maximum_iterations=5)[1]
            y = tf.reduce_sum(h * h)
        gx, gw = tape.gradient(y, [x, w])
        return y, gx, gw

    args = _recurrence_args(0)[:2]
    # The forward loop pushes what its gradient loop pops (TensorListPushBack/PopBack).
    _lowered(fn, args, ["StatelessWhile", "EmptyTensorList"])


def test_gradients_of_scan_and_map_fn() -> None:
    """The gradient loops pop the forward loops' accumulators, reserve lists like the
    ones they flow back through (shape and length popped) and add lists (AddN)."""
    def fn(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            s = tf.scan(lambda a, b: tf.sin(a) * b + w, x)
            m = tf.map_fn(lambda r: tf.reduce_sum(tf.tanh(r * w)), x)
            y = tf.reduce_sum(s * s) + tf.reduce_sum(m)
        return tape.gradient(y, [x, w])

    rng = _rng()
    _lowered(fn, [rng.normal(size=(5, 3)).astype(F32), rng.normal(size=(3,)).astype(F32)],
             ["StatelessWhile", "EmptyTensorList", "AddN"])


def test_a_loop_whose_state_changes_shape_stays_in_tf() -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.while_loop(lambda a: tf.shape(a)[0] < 8, lambda a: tf.concat([a, a], 0),
                             (x,), shape_invariants=(tf.TensorShape([None]),))[0]

    with lowering_only():
        result = cluster_graph(trace(fn, [np.ones(1, F32)]).graph, min_cluster_size=1)
    (loop,) = [d for d in result.decisions.values() if d.op_type == "StatelessWhile"]
    assert not loop.compilable and "shape" in (loop.reason or ""), loop


def test_a_body_with_an_op_that_does_not_compile_stays_in_tf() -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.while_loop(lambda i, a: i < 3,
                             lambda i, a: (i + 1, tf.strings.to_number(
                                 tf.strings.as_string(a))), (0, x))[1]

    with lowering_only():
        result = cluster_graph(trace(fn, [np.ones(2, F32)]).graph, min_cluster_size=1)
    (loop,) = [d for d in result.decisions.values() if "While" in d.op_type]
    assert not loop.compilable and "AsString" in (loop.reason or ""), loop


# -- end to end, where the CPU backend compiles HLO control flow --------------------------
needs_backend = pytest.mark.skipif(backend_refusal() is not None,
                                   reason=str(backend_refusal()))


def launches(f: tl.Function, *args: Any) -> tuple[int, int]:
    """Launch ops in the rewritten graph itself, and in the functions it calls (loop
    bodies compiled one by one: a launch per iteration)."""
    graph = f.get_concrete_function(*args).graph.as_graph_def()
    return (sum(n.op in LAUNCHES for n in graph.node),
            sum(n.op in LAUNCHES for fd in graph.library.function for n in fd.node_def))


@needs_backend
@pytest.mark.parametrize("jit_compile", [None, True])
@pytest.mark.parametrize("trips", [0, 1, 7])
def test_while_runs_as_one_launch(jit_compile: bool | None, trips: int) -> None:
    args = _recurrence_args(trips)
    f = tl.function(_recurrence, jit_compile=jit_compile)
    assert_close(f(*args).numpy(), _tf(_recurrence, args)[0], "MatMul", f"{trips} trips")
    assert launches(f, *args) == (1, 0)


@needs_backend
@pytest.mark.parametrize("jit_compile", [None, True])
def test_scan_cond_and_gradient_run_as_one_launch(jit_compile: bool | None) -> None:
    def fn(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(w)
            h = tf.while_loop(lambda i, h: i < 4,
                              lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))), (0, x),
                              maximum_iterations=4)[1]
            y = tf.cond(tf.reduce_sum(h) > 0.0, lambda: tf.reduce_sum(h * h),
                        lambda: tf.reduce_sum(tf.abs(h)))
            y += tf.reduce_sum(tf.scan(lambda a, b: tf.sin(a) * 0.5 + b, h))
        return y, tape.gradient(y, w)

    args = _recurrence_args(0)[:2]
    f = tl.function(fn, jit_compile=jit_compile)
    for got, want in zip(f(*args), _tf(fn, args), strict=True):
        assert_close(got.numpy(), want, "MatMul")
    assert launches(f, *args) == (1, 0)


def _keras_step(layer: str, sequences: bool = False, seed: int = 0
                ) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """A training step (loss, gradients through the recurrent loop, SGD update) of a
    fresh model whose weights depend on `seed` only; `sequences`: the layer returns
    every step's output (a TensorList of them), averaged."""
    import keras

    keras.utils.set_random_seed(seed)
    recurrent = getattr(keras.layers, layer)(5, return_sequences=sequences)
    pooled = [keras.layers.GlobalAveragePooling1D()] if sequences else []
    model = keras.Sequential([keras.Input((6, 3)), recurrent, *pooled,
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1)

    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return step


@needs_backend
@pytest.mark.skipif("ReadVariableOp" not in OP_RULES,
                    reason="variables stay outside clusters (rules_variables.py)")
@pytest.mark.parametrize("jit_compile", [None, True])
@pytest.mark.parametrize("layer, sequences", [("LSTM", False), ("GRU", False), ("GRU", True)])
def test_keras_recurrent_training_step_is_one_launch(layer: str, sequences: bool,
                                                     jit_compile: bool | None) -> None:
    rng = _rng()
    x = tf.constant(rng.normal(size=(4, 6, 3)).astype(F32))
    y = tf.constant(rng.normal(size=(4, 1)).astype(F32))
    plain = tf.function(_keras_step(layer, sequences))
    ours = tl.function(_keras_step(layer, sequences), jit_compile=jit_compile)
    for number in range(3):  # each step starts from the weights the last one left
        want, got = plain(x, y).numpy(), ours(x, y).numpy()
        assert abs(got - want) <= 1e-5, (number, got, want)
    # The forward and the gradient loop are HLO loops of the one launch.
    assert launches(ours, x, y) == (1, 0)


def test_a_loop_tf_places_on_a_gpu_stays_in_tf() -> None:
    """The GPU backend compiles no HLO while: a loop TF runs on a GPU keeps its bodies
    compiled one by one (tfxla_lite/control_flow.py)."""
    from tfxla_lite.runtime import gpu_launch

    class OneGpu(gpu_launch.GpuBackend):
        def tf_gpus(self) -> list[int]:
            return [0]

    with gpu_launch.use_backend(OneGpu()):
        result = cluster_graph(trace(_recurrence, _recurrence_args(3)).graph,
                               min_cluster_size=1)
    (loop,) = [d for d in result.decisions.values() if d.op_type == "StatelessWhile"]
    assert not loop.compilable and "GPU" in (loop.reason or ""), loop
