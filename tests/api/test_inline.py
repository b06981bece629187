"""Function-call inlining (clustering/inline.py): nested tf.function bodies join the
caller's clusters, stateful body ops stay in TF with their effects, and a graph
without calls is left as it is."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.clustering.inline import CALL_OP_TYPES, inline_function_calls


def _x() -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (4, 4)).astype(np.float32)


def test_graph_without_calls_is_not_copied() -> None:
    concrete = tf.function(lambda x: tf.tanh(x) * 2.0).get_concrete_function(
        tf.TensorSpec((4, 4), tf.float32))
    assert inline_function_calls(concrete.graph) is None


def test_nested_bodies_cluster_with_the_caller() -> None:
    @tf.function
    def innermost(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(x) * 3.0

    @tf.function
    def inner(x: tf.Tensor) -> tf.Tensor:
        return innermost(tf.tanh(x)) - 1.0

    def outer(x: tf.Tensor) -> tf.Tensor:
        return inner(x * 2.0) + 1.0

    f = tl.function(outer, jit_compile=True)
    x = _x()
    np.testing.assert_allclose(f(x), tf.function(outer)(x), rtol=1e-6, atol=1e-6)
    report = tl.explain(f, x)
    assert len(report.compiled_clusters) == 1
    types = {op_type for _, op_type in report.compiled_clusters[0].ops}
    assert {"Mul", "Tanh", "Relu", "Sub", "AddV2"} <= types
    assert not types & CALL_OP_TYPES
    assert not [n for n in report.fallbacks if n.op_type in CALL_OP_TYPES]


def test_stateful_body_keeps_its_effects_and_its_state_ops_in_tf() -> None:
    v = tf.Variable(tf.ones((4, 4)))

    @tf.function
    def step(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        y = tf.nn.relu(x @ v) * 2.0
        v.assign_add(tf.ones((4, 4)) * 0.5)
        return y + 1.0, tf.reduce_sum(y)

    def outer(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        y, total = step(x * 2.0)
        return tf.tanh(y) + total, y

    x = _x()
    expected = []
    for _ in range(2):
        expected.append([t.numpy() for t in tf.function(outer)(x)])
    expected_variable = v.numpy()
    v.assign(tf.ones((4, 4)))
    f = tl.function(outer)
    for want in expected:
        for got, value in zip(f(x), want):
            np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v.numpy(), expected_variable)
    report = tl.explain(f, x)
    left = {n.op_type: n.reason for n in report.fallbacks}
    # The inlined body reaches the variable through an Identity of the call's argument:
    # its write stays in TF (clustering/rules_variables.py takes captured handles only).
    assert "comes from a Identity" in left["AssignAddVariableOp"]
    assert "MatMul" in {t for c in report.compiled_clusters for _, t in c.ops}


def test_call_with_only_effects_still_runs() -> None:
    # A call whose only use is its effect: a control output of the caller.
    counter = tf.Variable(0.0)

    @tf.function
    def bump() -> None:
        counter.assign_add(1.0)

    def outer(x: tf.Tensor) -> tf.Tensor:
        bump()
        return tf.tanh(x) * 2.0 + 1.0 - x

    f = tl.function(outer)
    f(_x())
    f(_x())
    assert counter.numpy() == 2.0


def test_stateful_random_op_in_a_body_stays_in_tf() -> None:
    @tf.function
    def noisy(x: tf.Tensor) -> tf.Tensor:
        return x + tf.random.uniform((4, 4)) * 0.0 + tf.tanh(x) * 2.0 - 1.0

    report = tl.explain(lambda x: noisy(x) * 3.0 + 1.0, _x())
    reasons = {n.op_type: n.reason for n in report.fallbacks}
    assert reasons["RandomUniform"] == "stateful op"
    assert report.compiled_clusters


def test_colocation_with_an_argument_survives_inlining() -> None:
    # Keras' multi_step_on_iterator: IteratorGetNext is colocated with the iterator
    # argument; the inlined graph's import must not reject that constraint.
    @tf.function
    def inner(x: tf.Tensor) -> tf.Tensor:
        return tf.tanh(x * 2.0) + tf.exp(-x) - 1.0

    def step(iterator: tf.data.Iterator) -> tf.Tensor:
        return inner(next(iterator)) * 3.0

    data = np.random.default_rng(0).uniform(-1, 1, (8, 4)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(4)
    concrete = tf.function(step).get_concrete_function(iter(dataset))
    assert any(b"loc:@iterator" in op.node_def.attr["_class"].list.s
               for op in concrete.graph.get_operations() if "_class" in op.node_def.attr)
    f = tl.function(step)
    compiled, plain = iter(dataset), iter(dataset)
    for _ in range(2):
        np.testing.assert_allclose(f(compiled), tf.function(step)(plain), rtol=1e-5, atol=1e-6)
    report = tl.explain(f, iter(dataset))
    assert report.note is None and report.compiled_clusters, report


def test_call_of_a_compiled_function_stays_a_call() -> None:
    # Keras' compiled step inside its outer loop function: the step is tfxla-lite's
    # output already, so the caller keeps the call instead of clustering it again.
    inner = tl.function(lambda x: tf.tanh(x * 2.0) + tf.exp(-x) - 1.0)

    def outer(x: tf.Tensor) -> tf.Tensor:
        return inner(x) * 3.0

    x = _x()
    f = tl.function(outer, min_cluster_size=1)
    np.testing.assert_allclose(f(x), tf.function(outer)(x), rtol=1e-5, atol=1e-6)
    report = tl.explain(f, x)
    calls = [n for n in report.fallbacks if n.op_type in CALL_OP_TYPES]
    assert len(calls) == 1, report
    compiled = {op for c in report.compiled_clusters for _, op in c.ops}
    assert compiled <= {"Mul", "Const", "Identity"} and "Mul" in compiled, report


def test_nodes_named_like_a_placeholders_scope_keep_their_names() -> None:
    """A captured placeholder 'scaled/mul/ReadVariableOp/resource' opens the scopes
    'scaled' and 'scaled/mul', which are nodes of the trace too (as 'CollectiveReduceV2'
    beside its captured 'CollectiveReduceV2/group_size' in Keras's loop under
    MultiWorkerMirroredStrategy): the inlined graph keeps every name, the variable's
    handle data and the read's shape, and the function compiles with TF's values."""
    from tfxla_lite.runtime import loader

    v = tf.Variable([1.0, 2.0, 3.0])

    @tf.function
    def inner(x: tf.Tensor) -> tf.Tensor:
        return tf.sin(x) * 2.0

    def f(x: tf.Tensor) -> tf.Tensor:
        with tf.name_scope("scaled") as scope:
            y = tf.identity(inner(x) * v, name=scope)
        return y + 1.0

    graph = tf.function(f).get_concrete_function(tf.TensorSpec([3], tf.float32)).graph
    placeholders = [op.name for op in graph.get_operations() if op.type == "Placeholder"]
    assert "scaled/mul/ReadVariableOp/resource" in placeholders
    inlined = inline_function_calls(graph)
    assert inlined is not None
    names = {op.name for op in inlined.get_operations()}
    assert {op.name for op in graph.get_operations()} - {"scaled/PartitionedCall"} <= names
    assert inlined.get_operation_by_name("scaled/mul/ReadVariableOp").outputs[0].shape == [3]
    assert [t.name for t in inlined.outputs] == [t.name for t in graph.outputs]

    x = tf.constant([0.5, -1.0, 2.0])
    before = loader.launch_timing().launches
    np.testing.assert_allclose(tl.function(f, jit_compile=True)(x).numpy(),
                               tf.function(f)(x).numpy(), rtol=1e-6)
    assert loader.launch_timing().launches > before
