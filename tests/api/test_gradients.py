"""Gradients through compiled functions, against TF's own (issue 17).

A `tfxla_lite.function` differentiated as TF differentiates a `tf.function`: under an
eager `GradientTape`, inside another `tf.function`, to higher orders, with variables,
`tf.custom_gradient`, `tf.stop_gradient`, `tape.jacobian` and `ForwardAccumulator`.
The launch op's registered gradient compiles the backward pass too
(tfxla_lite/gradients.py): the tests count launch nodes in the backward graphs.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite import api
from tfxla_lite.rewrite import LAUNCH_OP_TYPE

MODES = {"jit": {"jit_compile": True}, "auto": {"min_cluster_size": 1}}


def _x(shape: tuple[int, ...] = (3, 4), seed: int = 0) -> tf.Tensor:
    return tf.constant(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


def _close(actual: object, expected: object, what: str) -> None:
    flat_actual, flat_expected = tf.nest.flatten(actual), tf.nest.flatten(expected)
    assert len(flat_actual) == len(flat_expected), what
    for a, e in zip(flat_actual, flat_expected):
        assert (a is None) == (e is None), f"{what}: None where TF has a gradient, or back"
        if a is not None:
            assert_close(np.asarray(a), np.asarray(e), "model gradient", what)


def _launch_count(graph_def: tf.compat.v1.GraphDef) -> int:
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return sum(node.op == LAUNCH_OP_TYPE for node in nodes)


def _compiled_gradients() -> int:
    """Launch nodes in the programs of every compiled launch-op gradient so far."""
    return sum(_launch_count(p.concrete_run.graph.as_graph_def())
               for f in api._GRADIENT_FUNCTIONS.values() for p in f._programs.values()
               if p.concrete_run is not None)


def _value_and_gradient(fn, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """fn(x) and its gradient, under an eager tape."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y, tape.gradient(y, x)


def _gradient_inside(fn, input_signature=None):
    """A tf.function that takes fn's gradient with a tape inside its own trace."""
    @tf.function(input_signature=input_signature)
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x)

    return gradient


def layer(x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.tanh(x * 1.5 + 0.25) * tf.sin(x))


@pytest.mark.parametrize("mode", MODES)
def test_eager_tape_matches_tf_and_compiles_the_backward(mode: str) -> None:
    api._GRADIENT_FUNCTIONS.clear()
    x = _x()
    results = [_value_and_gradient(fn, x)
               for fn in (tf.function(layer), tl.function(layer, **MODES[mode]))]
    _close(results[1], results[0], "value and gradient")
    assert _compiled_gradients() >= 1


@pytest.mark.parametrize("mode", MODES)
def test_gradient_inside_another_tf_function(mode: str) -> None:
    x = _x()
    compiled = _gradient_inside(tl.function(layer, **MODES[mode]))
    _close(compiled(x), _gradient_inside(tf.function(layer))(x), "nested gradient")
    # The forward launch and the backward's, both in the outer function's library.
    assert _launch_count(compiled.get_concrete_function(x).graph.as_graph_def()) >= 2


def test_variables_several_outputs_and_integer_inputs() -> None:
    v = tf.Variable(_x((4,), seed=1))
    w = tf.Variable(_x((4, 2), seed=2))

    def fn(x, n):
        h = tf.nn.relu(tf.matmul(x * v, w))
        scaled = h * tf.cast(n, tf.float32)
        return {"loss": tf.reduce_mean(scaled ** 2), "unused": tf.reduce_max(h, axis=0),
                "count": n + 1}

    x, n = _x(), tf.constant(3)
    results = []
    for f in (tf.function(fn), tl.function(fn, jit_compile=True)):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = f(x, n)
        results.append(tape.gradient(out["loss"], [x, v, w]))
    _close(results[1], results[0], "gradients of x and the variables")


@pytest.mark.parametrize("mode", MODES)
def test_higher_orders_jacobian_and_forward_mode(mode: str) -> None:
    x = _x((5,), seed=3)

    def derivatives(fn):
        with tf.GradientTape(persistent=True) as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = fn(x)
            first = inner.gradient(y, x)
            second = outer.gradient(first, x)
        jacobian = outer.jacobian(first, x)
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as accumulator:
            z = fn(x)
        return first, second, jacobian, accumulator.jvp(z)

    _close(derivatives(tl.function(layer, **MODES[mode])), derivatives(tf.function(layer)),
           "first, second, jacobian, jvp")


@tf.custom_gradient
def _clipped(x: tf.Tensor):
    y = tf.identity(x)

    def gradient(dy):
        return tf.clip_by_value(dy, -0.1, 0.1) * y

    return y, gradient


def with_custom_gradient(x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(_clipped(tf.sin(x) * x) * 3.0 + tf.stop_gradient(x * x))


@pytest.mark.parametrize("mode", MODES)
def test_custom_gradient_and_stop_gradient(mode: str) -> None:
    x = _x(seed=4)
    compiled = tl.function(with_custom_gradient, **MODES[mode])
    results = [_value_and_gradient(fn, x) for fn in (tf.function(with_custom_gradient), compiled)]
    _close(results[1], results[0], "custom gradient under an eager tape")
    # Without a tape the call runs compiled.
    assert_close(compiled(x).numpy(), results[0][0].numpy(), "Sum")
    assert compiled.get_concrete_function(x).graph is not None

    _close(_gradient_inside(compiled)(x), results[0][1],
           "custom gradient inside another tf.function")


def _step_with_inner_custom_gradient(w: tf.Variable):
    """A train step as Keras's under a distribution strategy: the custom gradient (there
    the all-reduce) is differentiated inside the step and feeds only a variable update;
    the returned value does not depend on it."""
    def step(x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(_clipped(tf.sin(x) * w) ** 2)
        w.assign_sub(0.5 * tape.gradient(loss, w))
        return tf.reduce_sum(tf.cos(x) * x)
    return step


def test_custom_gradient_off_the_outputs_runs_compiled_inside_a_function() -> None:
    """Inside another tf.function (a graph TF may differentiate) a step whose custom
    gradient cannot reach its outputs runs its compiled program, not its TF trace; the
    outer gradient is TF's. One whose outputs do depend on it keeps its TF trace."""
    from tfxla_lite.runtime import loader

    x = _x(seed=5)
    results = []
    for make in (tf.function, functools.partial(tl.function, jit_compile=True)):
        w = tf.Variable(tf.ones((3, 4)))
        step = make(_step_with_inner_custom_gradient(w))
        outer = _gradient_inside(step)
        before = loader.launch_timing().launches
        results.append((outer(x), outer(x), w.numpy()))
        launched = loader.launch_timing().launches - before
    assert launched >= 2, "the compiled step did not run inside the outer function"
    _close(results[1], results[0], "outer gradient and variable of a compiled step")

    compiled = tl.function(with_custom_gradient, jit_compile=True)
    outer = _gradient_inside(compiled)
    before = loader.launch_timing().launches
    _close(outer(x), _value_and_gradient(tf.function(with_custom_gradient), x)[1],
           "custom gradient reaching the outputs, inside another tf.function")
    assert loader.launch_timing().launches == before  # its TF trace ran


def test_unknown_dimensions_take_the_fallback_branch_gradient() -> None:
    spec = [tf.TensorSpec([None, 4], tf.float32)]
    compiled = tl.function(layer, input_signature=spec, min_cluster_size=1)
    reference = tf.function(layer, input_signature=spec)

    step_of_compiled = _gradient_inside(compiled, spec)
    step_of_reference = _gradient_inside(reference, spec)
    for rows in (1, 3, 0):
        x = _x((rows, 4), seed=rows)
        _close(step_of_compiled(x), step_of_reference(x), f"{rows} rows")


def test_no_gradient_flows_through_integer_clusters() -> None:
    def fn(x, n):
        return tf.reduce_sum(x) * tf.cast(n * 2 + 1, tf.float32)

    x, n = _x(), tf.constant(4)
    compiled = tl.function(fn, jit_compile=True)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = compiled(x, n)
    _close(tape.gradient(y, x), tf.fill(x.shape, 9.0), "gradient through an integer cluster")


def test_gradient_through_a_compiled_loop_body() -> None:
    def loop(x):
        def body(i, h):
            return i + 1, tf.tanh(h * 1.1 + 0.2) * tf.sin(h)

        _, h = tf.while_loop(lambda i, h: i < 4, body, (tf.constant(0), x))
        return tf.reduce_sum(h)

    x = tf.constant(np.linspace(-1, 1, 6, dtype=np.float32))
    results = [_value_and_gradient(fn, x)
               for fn in (tf.function(loop), tl.function(loop, min_cluster_size=1))]
    _close(results[1], results[0], "while_v2 gradient of a rewritten body")
