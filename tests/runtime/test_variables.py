"""Resource variables inside compiled clusters (clustering/rules_variables.py, the launch op's
variable binding): values and variable state after every call against plain TF, one
launch op per call, writes in place only where no other tensor holds the old buffer, and
TF's order of reads and writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite import driver
from tfxla_lite.options import Options
from tfxla_lite.rewrite import LAUNCH_OP_TYPES
from tfxla_lite.runtime import loader

MODES = [pytest.param(True, id="jit_compile"), pytest.param(None, id="auto")]


def _launches() -> int:
    return loader.launch_timing().launches


def _launch_nodes(function: Any) -> int:
    """Launch nodes (TfxlaLiteLaunch, TfxlaLiteVariableLaunch) of the programs `function`
    (a tl.function) compiled."""
    count = 0
    for program in function._programs.values():
        graph_def = program.concrete_run.graph.as_graph_def()
        nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
        count += sum(node.op in LAUNCH_OP_TYPES for node in nodes)
    return count


def _compare(make: Callable[[], tuple[Callable[..., Any], list[tf.Variable]]],
             args: list[tuple[Any, ...]], jit_compile: bool | None, op_type: str = "Add",
             launches_per_call: int | None = 1) -> Any:
    """Run `make()`'s function under plain TF and compiled, on fresh variables each, for
    every argument tuple of `args` in turn; compare results and every variable after each
    call, and the launches each compiled call ran. Returns the compiled function."""
    plain, plain_variables = make()
    step, variables = make()
    plain = tf.function(plain)
    compiled = tl.function(step, jit_compile=jit_compile)
    for n, call_args in enumerate(args):
        expected = plain(*call_args)
        before = _launches()
        actual = compiled(*call_args)
        if launches_per_call is not None:
            assert _launches() - before == launches_per_call, f"call {n}"
        for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
            assert_close(np.asarray(a), np.asarray(e), op_type, f"result of call {n}")
        for v, w in zip(variables, plain_variables):
            assert_close(v.numpy(), w.numpy(), op_type, f"{v.name} after call {n}")
    return compiled


def _make_assigns():
    v = tf.Variable(np.arange(6, dtype=np.float32).reshape(3, 2))
    w = tf.Variable(tf.zeros((3, 2)))
    n = tf.Variable(0, dtype=tf.int64)

    def step(x):
        old = v.read_value()
        v.assign_add(x * 2.0)
        w.assign(v * 3.0 + old)
        w.assign_sub(x)
        n.assign_add(1)
        return v.read_value() + 1.0, w.read_value(), n.read_value()

    return step, [v, w, n]


@pytest.mark.parametrize("jit_compile", MODES)
def test_reads_and_assigns_match_tf_call_after_call(jit_compile) -> None:
    x = tf.constant(np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2))
    compiled = _compare(_make_assigns, [(x,), (x,), (x * 3.0,)], jit_compile)
    assert _launch_nodes(compiled) == 1


def test_function_without_outputs_still_writes() -> None:
    v = tf.Variable(tf.ones((4,)))

    @tl.function(jit_compile=True)
    def step(x):
        v.assign(v * x + 1.0)

    before = _launches()
    step(tf.fill((4,), 2.0))
    step(tf.fill((4,), 2.0))
    assert _launches() - before == 2
    np.testing.assert_array_equal(v.numpy(), np.full((4,), 7.0, np.float32))


def test_written_in_place_unless_another_tensor_holds_the_old_value() -> None:
    v = tf.Variable(tf.ones((256,)))

    @tl.function(jit_compile=True)
    def update(x):
        v.assign(v * 2.0 + x)

    @tf.function
    def update_holding_old(x):  # the old value, read before, is read again after
        old = v.read_value()
        with tf.control_dependencies([old]):
            new = update(x)
        with tf.control_dependencies([new] if new is not None else []):
            return tf.identity(old) + 0.0

    x = tf.ones((256,))
    update(x)  # compile
    before = loader.variables_in_place()
    update(x)
    assert loader.variables_in_place() - before == 1, "no other holder: written in place"
    np.testing.assert_array_equal(v.numpy(), np.full((256,), 7.0, np.float32))

    held = tf.identity(v)  # an eager tensor that shares the variable's buffer
    before = loader.variables_in_place()
    update(x)
    assert loader.variables_in_place() == before, "the old buffer is held: copy on write"
    np.testing.assert_array_equal(held.numpy(), np.full((256,), 7.0, np.float32))
    np.testing.assert_array_equal(v.numpy(), np.full((256,), 15.0, np.float32))

    old = update_holding_old(x)
    np.testing.assert_array_equal(old.numpy(), np.full((256,), 15.0, np.float32))
    np.testing.assert_array_equal(v.numpy(), np.full((256,), 31.0, np.float32))


@pytest.mark.parametrize("jit_compile", MODES)
def test_old_value_read_in_the_cluster_survives_the_write(jit_compile) -> None:
    def make():
        v = tf.Variable(tf.range(8, dtype=tf.float32))

        def step(x):
            old = tf.identity(v)
            v.assign(tf.sqrt(v + x))
            return old * 1.0, v.read_value()

        return step, [v]

    _compare(make, [(tf.ones((8,)),)] * 3, jit_compile, op_type="Sqrt")


@pytest.mark.parametrize("jit_compile", MODES)
def test_control_dependencies_order_reads_and_writes(jit_compile) -> None:
    def make():
        v = tf.Variable(tf.fill((5,), 2.0))

        def step(x):
            first = v.read_value() * x
            with tf.control_dependencies([first]):
                v.assign(x + 10.0)
            with tf.control_dependencies([v.assign_add(x)]):
                last = v.read_value() * 2.0
            return first, last

        return step, [v]

    _compare(make, [(tf.range(5, dtype=tf.float32),)] * 2, jit_compile)


def test_two_functions_on_one_variable_run_in_order() -> None:
    v = tf.Variable(tf.zeros((3,)))
    add = tl.function(lambda x: v.assign_add(x * 1.0), jit_compile=True)
    double = tl.function(lambda: v.assign(v * 2.0), jit_compile=True)
    for _ in range(3):
        add(tf.ones((3,)))
        double()
    np.testing.assert_array_equal(v.numpy(), np.full((3,), 14.0, np.float32))


@pytest.mark.parametrize("jit_compile", MODES)
def test_resource_gather_matches_tf(jit_compile) -> None:
    def make():
        table = tf.Variable(np.arange(20, dtype=np.float32).reshape(5, 4))

        def step(ids):
            rows = tf.gather(table, ids)  # ResourceGather
            table.assign_add(tf.ones((5, 4)))
            return rows * 2.0, tf.gather(table, ids) + 1.0

        return step, [table]

    ids = tf.constant([[0, 4], [2, 2]])
    compiled = _compare(make, [(ids,), (ids,)], jit_compile)
    assert _launch_nodes(compiled) == 1


SCATTERS = ["scatter_add", "scatter_sub", "scatter_mul", "scatter_div", "scatter_min",
            "scatter_max", "scatter_update"]


@pytest.mark.parametrize("method", SCATTERS)
def test_resource_scatters_match_tf(method: str) -> None:
    def make():
        v = tf.Variable(np.linspace(-3, 3, 12, dtype=np.float32).reshape(4, 3))

        def step(updates):
            sparse = tf.IndexedSlices(updates * 1.5, tf.constant([3, 0, 1]))
            getattr(v, method)(sparse)
            return v.read_value() + 0.0

        return step, [v]

    updates = tf.constant(np.linspace(0.5, 2, 9, dtype=np.float32).reshape(3, 3))
    _compare(make, [(updates,), (updates,)], True, op_type="Mul")


def test_scatter_with_a_scalar_update_and_repeated_indices_matches_tf() -> None:
    def make():
        v = tf.Variable(tf.zeros((4, 2)))

        def step(scale):
            tf.raw_ops.ResourceScatterAdd(resource=v.handle, indices=tf.constant([1, 1, 3]),
                                          updates=scale * 2.0)
            return v.read_value() * 1.0

        return step, [v]

    _compare(make, [(tf.constant(1.5),)] * 2, True)


OPTIMIZERS = {
    "gradient_descent": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    "nesterov": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    "rms_prop": lambda: tf.compat.v1.train.RMSPropOptimizer(0.05, momentum=0.5),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_resource_apply_optimizers_match_tf(name: str) -> None:
    def make():
        w = tf.Variable(np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2))
        optimizer = OPTIMIZERS[name]()
        optimizer._create_slots([w])  # noqa: SLF001 - slots exist before the trace
        if hasattr(optimizer, "_create_non_slot_variable"):
            optimizer._prepare()  # noqa: SLF001
        variables = [w] + [optimizer.get_slot(w, s) for s in optimizer.get_slot_names()]

        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.tanh(tf.matmul(x, w)) ** 2)
            optimizer.apply_gradients([(tape.gradient(loss, w), w)])
            return loss

        return step, variables

    x = tf.constant(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4))
    _compare(make, [(x,)] * 3, True, op_type="model gradient", launches_per_call=None)


def test_keras_momentum_raw_op_matches_tf() -> None:
    def make():
        var = tf.Variable(tf.linspace(-1.0, 1.0, 6))
        accum = tf.Variable(tf.fill((6,), 0.25))

        def step(grad):
            tf.raw_ops.ResourceApplyKerasMomentum(var=var.handle, accum=accum.handle, lr=0.1,
                                                  grad=grad, momentum=0.9, use_nesterov=True)
            return var.read_value() * 1.0

        return step, [var, accum]

    _compare(make, [(tf.linspace(0.5, 1.5, 6),)] * 3, True, op_type="Mul")


def test_variable_of_unknown_shape_stays_in_tf() -> None:
    v = tf.Variable(tf.ones((3,)), shape=tf.TensorShape(None))

    @tl.function(jit_compile=True)
    def step(x):
        v.assign(x * 2.0 + 1.0)
        return x * 3.0 + 2.0

    step(tf.ones((3,)))
    np.testing.assert_array_equal(v.numpy(), np.full((3,), 3.0, np.float32))
    report = step.experimental_report() if hasattr(step, "experimental_report") else None
    assert report is None or "AssignVariableOp" in str(report)


@pytest.mark.parametrize("jit_compile", MODES)
def test_unknown_batch_binds_variables_when_must_compile(jit_compile) -> None:
    """A cluster with unknown dimensions compiles per input shape at run time. Without a
    fallback (must-compile) it binds its variables as a static one does: one launch a
    call for every batch size. With one (auto), whose StatelessIf cannot hold the writes,
    its variable ops stay in TF (driver._variables_in_static_clusters)."""
    w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    w_plain = tf.Variable(w.numpy())

    def make(v):
        def step(x):
            y = tf.tanh(x @ v)
            v.assign_sub(0.1 * tf.transpose(x) @ y)
            return tf.reduce_sum(y, axis=1)
        return step

    spec = [tf.TensorSpec([None, 4], tf.float32)]
    plain = tf.function(make(w_plain), input_signature=spec)
    traced = tf.function(make(w), input_signature=spec).get_concrete_function()
    program = driver.build_program(traced, jit_compile, Options(), dynamic=True)
    left = {n.op_type: n.reason for n in program.report.fallbacks}
    if jit_compile:
        assert "AssignSubVariableOp" not in left and "ReadVariableOp" not in left
        assert program.compiled[0].variable_writes
    else:
        assert "unknown dimensions" in left["AssignSubVariableOp"]
        assert "unknown dimensions" in left["ReadVariableOp"]
    for batch in (2, 5, 0, 2):
        x = tf.constant(np.linspace(-2, 2, batch * 4, dtype=np.float32).reshape(batch, 4))
        before = _launches()
        assert_close(program.run(x).numpy(), plain(x).numpy(), "model gradient", f"{batch}")
        if jit_compile:
            assert _launches() - before == 1, f"batch {batch}: one launch"
        assert_close(w.numpy(), w_plain.numpy(), "model gradient", f"w after batch {batch}")


def test_rewrite_cache_hit_writes_the_variables(tmp_path, monkeypatch) -> None:
    """A second build of the same trace comes from the rewrite cache: its launch still
    binds and writes the variables (their writes follow from the cached cluster's ops)."""
    from tfxla_lite.codegen import cache

    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TFXLA_LITE_CACHE", raising=False)
    cache.clear_memory()
    x = tf.constant(np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2))
    results = []
    for _ in range(2):
        step, variables = _make_assigns()
        before = cache.stats().rewrite_hits
        compiled = tl.function(step, jit_compile=True)
        results.append(([t.numpy() for t in compiled(x)], [v.numpy() for v in variables],
                        cache.stats().rewrite_hits - before))
    assert results[1][2] == 1, "the second build hits the rewrite cache"
    for first, second in zip(results[0][0] + results[0][1], results[1][0] + results[1][1]):
        np.testing.assert_array_equal(second, first)


@pytest.mark.parametrize("update_slots", [True, False])
def test_adagrad_v2_raw_op_matches_tf(update_slots: bool) -> None:
    def make():
        var = tf.Variable(tf.linspace(-1.0, 1.0, 6))
        accum = tf.Variable(tf.fill((6,), 0.5))

        def step(grad):
            tf.raw_ops.ResourceApplyAdagradV2(var=var.handle, accum=accum.handle, lr=0.1,
                                              epsilon=1e-3, grad=grad,
                                              update_slots=update_slots)
            return var.read_value() * 1.0

        return step, [var, accum]

    _compare(make, [(tf.linspace(0.5, 1.5, 6),)] * 3, True, op_type="Sqrt")


def _forward_updating_statistics(v: tf.Variable, moving: tf.Variable) -> Callable[..., Any]:
    def forward(x):
        y = tf.tanh(x * v)
        moving.assign(moving * 0.9 + y * 0.1)  # as BatchNorm's moving statistics
        return tf.reduce_sum(y * y)

    return forward


def test_eager_tape_over_a_function_that_writes_runs_the_launch() -> None:
    """Under a recording tape the call runs its launch (the writes once, in the launch),
    and the gradient through it is TF's (tfxla_lite/gradients.py); more cases in
    tests/api/test_variables_gradients.py."""
    results = []
    for compile_it in (False, True):
        v = tf.Variable(tf.linspace(-1.0, 1.0, 4))
        moving = tf.Variable(tf.zeros((4,)))

        forward = _forward_updating_statistics(v, moving)

        f = tl.function(forward, jit_compile=True) if compile_it else tf.function(forward)
        x = tf.linspace(0.5, 2.0, 4)
        before = _launches()
        f(x)  # untaped: compiled when compile_it
        assert _launches() - before == int(compile_it)
        before = _launches()
        with tf.GradientTape() as tape:
            loss = f(x)
        assert _launches() - before == int(compile_it), "a taped call runs the launch"
        results.append((loss.numpy(), tape.gradient(loss, v).numpy(), moving.numpy()))
    for ours, theirs in zip(results[1], results[0]):
        assert_close(ours, theirs, "model gradient")


def test_must_compile_step_called_with_an_unknown_batch_is_one_launch() -> None:
    """Keras's pattern: its iterator function calls the jit_compile step with the batch
    dimension unknown (a last partial batch); the step compiles per batch size at run
    time, its variables inside, and a tape in the caller differentiates through it."""
    results = []
    for compile_it in (False, True):
        w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
        moving = tf.Variable(tf.zeros((3,)))

        inner, outer = _taped_caller(w, moving, compile_it)

        runs = []
        for batch in (8, 5, 8, 0):
            x = tf.constant(np.linspace(-2, 2, batch * 4, dtype=np.float32).reshape(batch, 4))
            before = _launches()
            loss, gradient = outer(x)
            if compile_it and batch:
                assert _launches() - before >= 1, f"batch {batch}: the compiled step ran"
            runs.append((loss.numpy(), gradient.numpy(), moving.numpy()))
        if compile_it:
            before = _launches()
            inner(tf.ones((5, 4)))  # eager: the static program of that shape
            assert _launches() - before == 1
        results.append(runs)
    for n, (ours, theirs) in enumerate(zip(results[1], results[0])):
        for a, b in zip(ours, theirs):
            assert_close(a, b, "model gradient", f"call {n}")


def _taped_caller(w: tf.Variable, moving: tf.Variable, compile_it: bool) -> tuple[Any, Any]:
    def step(x):
        y = tf.tanh(x @ w)
        moving.assign(moving * 0.9 + tf.reduce_mean(y, axis=0) * 0.1)
        return tf.reduce_sum(y * y)

    inner = tl.function(step, jit_compile=True) if compile_it else tf.function(step)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def outer(x):
        with tf.GradientTape() as tape:
            loss = inner(x)
        return loss, tape.gradient(loss, w)

    return inner, outer
