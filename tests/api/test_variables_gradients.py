"""Gradients through launches that write variables (TfxlaLiteVariableLaunch,
tfxla_lite/gradients.py): a tape inside another tf.function, `tf.gradients` in a graph and
an eager tape differentiate a compiled program whose cluster reads and writes variables
with TF's numbers (values, gradients, variable state after every call), its writes
running once a call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.rewrite import ORIGINAL_OUTPUTS_ATTR, VARIABLE_LAUNCH_OP_TYPE
from tfxla_lite.runtime import loader

MODES = [pytest.param(True, id="jit_compile"), pytest.param(None, id="auto")]


def _launches() -> int:
    return loader.launch_timing().launches


def _statistics_update() -> tuple[Callable[..., Any], list[tf.Variable]]:
    """BatchNorm's shape in training: the output needs the weights, the moving statistic
    is read only for its own update."""
    v = tf.Variable(tf.linspace(-1.0, 1.0, 4))
    moving = tf.Variable(tf.zeros((4,)))

    def forward(x):
        y = tf.tanh(x * v)
        moving.assign(moving * 0.9 + y * 0.1)
        return tf.reduce_sum(y * y)

    return forward, [v, moving]


def _read_then_written() -> tuple[Callable[..., Any], list[tf.Variable]]:
    """A training step's shape: the loss reads the weight that the step then writes."""
    w = tf.Variable(tf.linspace(0.5, -0.5, 6))
    count = tf.Variable(0.0)

    def step(x):
        y = tf.sin(x * w) * w
        w.assign_sub(0.1 * y)
        count.assign_add(1.0)
        return tf.reduce_sum(y * y), count.read_value()

    return step, [w, count]


def _written_then_read() -> tuple[Callable[..., Any], list[tf.Variable]]:
    """The output reads the variable after its write: the written value, whose
    gradient goes to the variable (the assign itself has none)."""
    v = tf.Variable(tf.linspace(-1.0, 1.0, 6))

    def step(x):
        v.assign(v * 0.5 + x)
        return tf.reduce_sum(tf.exp(v.read_value() * x))

    return step, [v]


def _gathered_then_scattered() -> tuple[Callable[..., Any], list[tf.Variable]]:
    """An embedding lookup before a scatter update of the same table."""
    table = tf.Variable(tf.reshape(tf.linspace(-1.0, 1.0, 12), (6, 2)))
    ids = tf.constant([4, 1, 1])

    def step(x):
        rows = tf.gather(table, ids)
        table.scatter_sub(tf.IndexedSlices(rows * 0.1, ids))
        return tf.reduce_sum(tf.tanh(rows * x[:, None]))

    return step, [table]


def _read_only() -> tuple[Callable[..., Any], list[tf.Variable]]:
    """No write: a TfxlaLiteLaunch whose variable the tape must watch on every call."""
    v = tf.Variable(tf.linspace(-1.0, 1.0, 4))

    def forward(x):
        return tf.reduce_sum(tf.sin(x * v))

    return forward, [v]


def _read_between_writes() -> tuple[Callable[..., Any], list[tf.Variable]]:
    """The output needs the value the first write made, which only the launch holds
    (the launch outputs that read for the gradient): its gradient goes to the variable,
    the assign's operands get none."""
    v = tf.Variable(tf.linspace(-1.0, 1.0, 3))
    w = tf.Variable(tf.linspace(0.5, 1.5, 3))

    def step(x):
        v.assign(v * x + w)
        middle = tf.reduce_sum(tf.square(v.read_value()) * w)
        v.assign_add(x)
        w.assign_sub(0.1 * x)
        return middle + tf.reduce_sum(tf.sin(w * x))

    return step, [v, w]


def _gathered_between_writes() -> tuple[Callable[..., Any], list[tf.Variable]]:
    """The same with an embedding table: an add, a gather, a scatter."""
    table = tf.Variable(tf.reshape(tf.linspace(-1.0, 1.0, 12), (6, 2)))
    ids = tf.constant([4, 1, 1])

    def step(x):
        table.assign_add(tf.fill((6, 2), 0.25))
        rows = tf.gather(table, ids)
        table.scatter_sub(tf.IndexedSlices(rows * 0.1, ids))
        return tf.reduce_sum(tf.tanh(rows * x[:, None]))

    return step, [table]


PROGRAMS = {"read_only": (_read_only, lambda: tf.linspace(0.5, 2.0, 4)),
            "statistics": (_statistics_update, lambda: tf.linspace(0.5, 2.0, 4)),
            "read_then_written": (_read_then_written, lambda: tf.linspace(-1.0, 1.0, 6)),
            "written_then_read": (_written_then_read, lambda: tf.linspace(-0.5, 0.5, 6)),
            "gathered": (_gathered_then_scattered, lambda: tf.constant([0.5, -1.0, 2.0])),
            "between_writes": (_read_between_writes, lambda: tf.constant([0.5, -1.0, 2.0])),
            "gathered_between_writes": (_gathered_between_writes,
                                        lambda: tf.constant([0.5, -1.0, 2.0]))}


def _dense(value: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(tf.convert_to_tensor(value))


def _check(ours: list[Any], theirs: list[Any], context: str) -> None:
    for n, (a, b) in enumerate(zip(ours, theirs)):
        a, b = _dense(a), _dense(b)
        if b is None or a is None:
            # TF's None (unconnected) may come back as zeros through a function call.
            assert not np.any(a if a is not None else b), f"{context}: gradient {n}"
            continue
        assert_close(a, b, "model gradient", f"{context}: value {n}")


def _run_both(build: Callable[[Callable[..., Any], list[tf.Variable]], Callable[..., Any]],
              program: str, jit_compile: bool | None, calls: int = 3) -> None:
    """`build(inner, variables)` makes the differentiating function around `inner`, a plain
    tf.function or the compiled one; every call's results and the variables after it
    must agree."""
    make, argument = PROGRAMS[program]
    results = []
    for compiled in (False, True):
        forward, variables = make()
        inner = (tl.function(forward, jit_compile=jit_compile) if compiled
                 else tf.function(forward))
        outer = build(inner, variables)
        runs = []
        for _ in range(calls):
            before = _launches()
            values = outer(argument())
            if compiled:
                assert _launches() > before, "the compiled program ran"
            runs.append((tf.nest.flatten(values), [v.numpy() for v in variables]))
        results.append(runs)
    for n, ((ours, ours_state), (theirs, theirs_state)) in enumerate(zip(*reversed(results))):
        _check(ours, theirs, f"call {n}")
        _check(ours_state, theirs_state, f"variables after call {n}")


def _graph_tape(inner: Callable[..., Any], variables: list[tf.Variable]) -> Callable[..., Any]:
    return tf.function(_eager_tape(inner, variables))


def _graph_gradients(inner: Callable[..., Any], variables: list[tf.Variable]
                     ) -> Callable[..., Any]:
    @tf.function
    def outer(x):
        loss = tf.nest.flatten(inner(x))[0] * 2.0
        return loss, tf.gradients(loss, [x, *variables])

    return outer


def _eager_tape(inner: Callable[..., Any], variables: list[tf.Variable]) -> Callable[..., Any]:
    def outer(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.nest.flatten(inner(x))[0]
        return loss, tape.gradient(loss, [x, *variables])

    return outer


def _graph_tape_then_written(inner: Callable[..., Any], variables: list[tf.Variable]
                             ) -> Callable[..., Any]:
    """A tape in a graph whose variables change between the forward and the backward:
    the backward must use the values the launch read, not the variables' later ones."""
    @tf.function
    def outer(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.nest.flatten(inner(x))[0]
        for v in variables:
            v.assign_add(tf.ones_like(v) * 3.0)
        return loss, tape.gradient(loss, [x, *variables])

    return outer


def _nested(inner: Callable[..., Any], variables: list[tf.Variable]) -> Callable[..., Any]:
    """A tape inside a compiled function (its own tfxla-lite trace) around the call."""
    traced = _graph_tape(inner, variables).python_function
    return tl.function(traced) if isinstance(inner, tl.Function) else tf.function(traced)


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize("jit_compile", MODES)
def test_graph_mode_tape_through_a_writing_launch_matches_tf(program, jit_compile) -> None:
    _run_both(_graph_tape, program, jit_compile)


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_tf_gradients_in_a_graph_through_a_writing_launch_matches_tf(program) -> None:
    _run_both(_graph_gradients, program, True)


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_eager_tape_through_a_writing_launch_matches_tf(program) -> None:
    _run_both(_eager_tape, program, True)


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize("jit_compile", MODES)
def test_backward_after_a_later_write_uses_the_launch_values(program, jit_compile) -> None:
    _run_both(_graph_tape_then_written, program, jit_compile, calls=2)


@pytest.mark.parametrize("program", ["statistics", "read_then_written", "between_writes"])
def test_tape_in_a_compiled_function_around_a_compiled_call_matches_tf(program) -> None:
    _run_both(_nested, program, True, calls=2)


def test_taped_call_runs_the_launch_and_writes_in_place_when_it_can() -> None:
    """A taped eager call runs the compiled program: its launch, then the backward's. A
    value before the write is read only where the gradient needs one: the moving
    statistic, which the loss does not need, is written in place, taped or not."""
    w = tf.Variable(tf.linspace(-1.0, 1.0, 256))
    moving = tf.Variable(tf.zeros((256,)))

    @tl.function(jit_compile=True)
    def compiled(x):
        moving.assign(moving * 0.9 + x * 0.1)
        return tf.reduce_sum(tf.sin(x * w))

    x = tf.linspace(0.5, 2.0, 256)
    compiled(x)  # compiles
    before, in_place = _launches(), loader.variables_in_place()
    compiled(x)
    assert (_launches() - before, loader.variables_in_place() - in_place) == (1, 1)
    before, in_place = _launches(), loader.variables_in_place()
    with tf.GradientTape() as tape:
        loss = compiled(x)
    assert (_launches() - before, loader.variables_in_place() - in_place) == (1, 1)
    assert_close(tape.gradient(loss, w).numpy(), (tf.cos(x * w) * x).numpy(), "model gradient")


def test_read_between_two_writes_is_a_launch_output_and_differentiates() -> None:
    """A value that exists only inside the launch (between two of its writes) is one of
    the launch's outputs, as TF's XLA keeps a differentiated function's intermediates:
    the writes stay in the one launch and the gradient is TF's."""
    results = []
    for compiled in (False, True):
        v = tf.Variable(tf.ones((3,)))
        inner = (tl.function(jit_compile=True) if compiled else tf.function)(
            lambda x, v=v: _between_writes(v, x))

        @tf.function
        def outer(x, inner=inner, v=v):
            with tf.GradientTape() as tape:
                loss = inner(x)
            return loss, tape.gradient(loss, v)

        results.append([[*outer(tf.constant([1.0, 2.0, 3.0])), v.numpy()] for _ in range(2)])
        if compiled:
            graph = inner.get_concrete_function(tf.constant([1.0, 2.0, 3.0])).graph
            launches = [op for op in graph.get_operations()
                        if op.type == VARIABLE_LAUNCH_OP_TYPE]
            assert len(launches) == 1
            outputs = [n.decode() for n in launches[0].get_attr(ORIGINAL_OUTPUTS_ATTR)]
            assert any("ReadVariableOp" in name for name in outputs), outputs
    for n, (ours, theirs) in enumerate(zip(*reversed(results))):
        _check(ours, theirs, f"call {n}")


def _between_writes(v: tf.Variable, x: tf.Tensor) -> tf.Tensor:
    v.assign(v * x)
    middle = tf.reduce_sum(tf.square(v.read_value()))
    v.assign_add(x)
    return middle


def test_keras_batch_normalization_under_a_graph_mode_tape_matches_tf() -> None:
    """Keras' BatchNormalization in training mode inside a compiled call updates its
    moving statistics in the launch; a tape in the caller's graph differentiates it."""
    data = np.random.default_rng(3).standard_normal((8, 5)).astype(np.float32)
    results = []
    for compiled in (False, True):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4),
                                  keras.layers.BatchNormalization(momentum=0.8),
                                  keras.layers.Dense(1)])

        def forward(x, model=model):
            return tf.reduce_mean(tf.square(model(x, training=True)))

        inner = tl.function(forward, jit_compile=True) if compiled else tf.function(forward)

        @tf.function
        def outer(x, inner=inner, model=model):
            with tf.GradientTape() as tape:
                loss = inner(x)
            return loss, tape.gradient(loss, model.trainable_variables)

        runs = []
        for n in range(3):
            loss, grads = outer(tf.constant(data * (n + 1)))
            runs.append(([loss, *grads], [v.numpy() for v in model.variables]))
        results.append((runs, inner))
    (ours, compiled_inner), (theirs, _) = results[1], results[0]
    graph = compiled_inner.get_concrete_function(tf.constant(data)).graph
    assert any(op.type == VARIABLE_LAUNCH_OP_TYPE for op in graph.get_operations()), \
        "the moving statistics' writes are in the launch"
    for n, ((values, state), (tf_values, tf_state)) in enumerate(zip(ours, theirs)):
        _check(values, tf_values, f"call {n}")
        _check(state, tf_state, f"variables after call {n}")
