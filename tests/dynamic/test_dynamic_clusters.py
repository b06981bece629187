"""Clusters with unknown dimensions: compiled once per concrete input shape at run time,
results as TF's; the megamorphic limit and compile failures run the cluster's TF ops;
shape-derived Reshape targets; concurrent callers; a Keras-style training step traced
with reduce_retracing."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

from tfxla_lite import dynamic
from tfxla_lite.clustering.cluster import form_clusters
from tfxla_lite.clustering.mark import MarkOptions, mark
from tfxla_lite.program import CompilationError
from tfxla_lite.runtime import loader

SPEC = [tf.TensorSpec([None, 4], tf.float32)]
LIMIT_MESSAGE = "distinct input shapes (the limit)"


def _node_ops(program, *specs) -> list[str]:  # noqa: ANN001
    concrete = program.run.get_concrete_function(*(specs or SPEC))
    return [node.op for node in concrete.graph.as_graph_def().node]


def _rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 4)).astype(np.float32)


def _assert_matches(got, want) -> None:  # noqa: ANN001
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)


@tf.function(input_signature=SPEC)
def gelu_center(x):  # noqa: ANN001, ANN201
    y = 0.5 * x * (1.0 + tf.tanh(0.79788456 * (x + 0.044715 * x * x * x)))
    return y - tf.reduce_mean(y, axis=1, keepdims=True), tf.reduce_sum(y)


@tf.function(input_signature=SPEC)
def reshape_by_batch(x):  # noqa: ANN001, ANN201
    y = tf.nn.relu(x * 2.0 + 1.0)
    pairs = tf.reshape(y, [tf.shape(x)[0], 2, 2])
    return tf.reduce_sum(tf.exp(pairs) * 0.5, axis=2)


def test_one_compilation_per_batch_size(build, stats) -> None:  # noqa: ANN001
    program = build(gelu_center.get_concrete_function())
    assert len(program.dynamic_clusters) == 1 and not program.clusters
    for rows in (3, 8, 3, 1, 8, 0):
        x = _rows(rows, rows)
        _assert_matches(program.run(x), gelu_center(x))
    assert stats(program) == [loader.DynamicStats(4, 0, False)]
    assert len(program.dynamic_clusters[0].specializations) == 4
    # One HLO module per compiled shape, in the order they were met.
    assert program.compiler_ir("hlo").count("ENTRY") == 4
    assert "f32[3,4]" in program.compiler_ir("hlo")
    ops = _node_ops(program)
    assert ops.count("TfxlaLiteCompile") == 1 and ops.count("StatelessIf") == 1


def test_reshape_to_shape_derived_target(build, stats) -> None:  # noqa: ANN001
    program = build(reshape_by_batch.get_concrete_function())
    report = program.report
    assert len(report.compiled_clusters) == 1
    assert report.cluster_of("Reshape") is not None and report.cluster_of("Shape") is not None
    for rows in (2, 5, 2):
        x = _rows(rows, rows)
        _assert_matches(program.run(x), reshape_by_batch(x))
    assert stats(program)[0].compiled == 2


def test_shape_computed_outside_is_value_keyed() -> None:
    """A Reshape target computed outside the cluster (StridedSlice left in TF here) is a
    value-keyed input: embedded as a constant when compiling, part of the cache key."""
    graph = reshape_by_batch.get_concrete_function().graph
    options = MarkOptions(dynamic_shapes=True, denylist=frozenset({"StridedSlice"}))
    clusters = form_clusters(graph, mark(graph, options), min_cluster_size=1)
    (cluster,) = [c for c in clusters if "Reshape" in c.op_names]
    planned = dynamic.plan_dynamic_cluster(graph, cluster, "unregistered", cluster.name)
    names = [planned.inputs[j] for j in planned.value_inputs]
    assert names == ["strided_slice:0"]
    assert planned.param_inputs == (planned.inputs.index("x:0"),)
    x = _rows(3)
    values = {planned.inputs.index("strided_slice:0"): np.array(3, np.int32)}
    request = loader.SpecializationRequest(planned.input_dtypes, ((3, 4), ()), values)
    specialization = planned.compile(request)
    assert specialization.output_specs == ((tf.float32, (3, 2)),)
    (result,) = planned.specializations[0].executable(x)
    np.testing.assert_allclose(result, reshape_by_batch(x).numpy(), rtol=1e-6)


def test_megamorphic_limit_runs_tf_and_logs_once(build, stats, caplog) -> None:  # noqa: ANN001
    program = build(gelu_center.get_concrete_function(), max_specializations=2)
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        for rows in (1, 2, 3, 4, 5, 1, 2, 6):
            x = _rows(rows, rows)
            _assert_matches(program.run(x), gelu_center(x))
    assert stats(program) == [loader.DynamicStats(2, 1, True)]
    assert sum(LIMIT_MESSAGE in r.getMessage() for r in caplog.records) == 1


def test_compile_failure_runs_tf(build, stats, monkeypatch, caplog) -> None:  # noqa: ANN001
    program = build(gelu_center.get_concrete_function())
    planned = program.dynamic_clusters[0]
    original = type(planned).compile

    def fail_on_five(self, request):  # noqa: ANN001, ANN202
        if request.shapes[0][0] == 5:
            raise RuntimeError("no kernel for five rows")
        return original(self, request)

    monkeypatch.setattr(type(planned), "compile", fail_on_five)
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        for rows in (5, 4, 5):
            x = _rows(rows, rows)
            _assert_matches(program.run(x), gelu_center(x))
    assert stats(program) == [loader.DynamicStats(1, 1, False)]
    assert sum("no kernel for five rows" in r.getMessage() for r in caplog.records) == 1


def test_must_compile_has_no_limit_and_no_fallback(build, stats, monkeypatch) -> None:  # noqa: ANN001
    program = build(gelu_center.get_concrete_function(), jit_compile=True,
                    max_specializations=1)
    for rows in (1, 2, 3):
        x = _rows(rows, rows)
        _assert_matches(program.run(x), gelu_center(x))
    assert stats(program) == [loader.DynamicStats(3, 0, False)]
    ops = _node_ops(program)
    assert "StatelessIf" not in ops and ops.count(loader.OP_TYPE) == 1

    def fail(self, request):  # noqa: ANN001, ANN202
        raise RuntimeError("cannot lower this shape")

    monkeypatch.setattr(type(program.dynamic_clusters[0]), "compile", fail)
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot lower this shape"):
        program.run(_rows(9))


def test_must_compile_still_refuses_unknown_rank(build) -> None:  # noqa: ANN001
    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def any_rank(x):  # noqa: ANN001, ANN202
        return tf.exp(x) + 1.0

    with pytest.raises(CompilationError, match="rank of .* unknown"):
        build(any_rank.get_concrete_function(), jit_compile=True)


def test_rank_mismatch_is_invalid_argument(build) -> None:  # noqa: ANN001
    program = build(gelu_center.get_concrete_function())
    key = program.dynamic_clusters[0].key
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 0 has shape"):
        loader.compiled_for([np.ones((2, 4, 1), np.float32)], key)


def test_static_shapes_keep_the_ahead_of_time_path(build) -> None:  # noqa: ANN001
    @tf.function(input_signature=[tf.TensorSpec([3, 4], tf.float32)])
    def static(x):  # noqa: ANN001, ANN202
        return tf.reduce_sum(tf.exp(x) * 2.0 + 1.0)

    program = build(static.get_concrete_function())
    assert not program.dynamic_clusters and len(program.clusters) == 1
    x = _rows(3)
    _assert_matches(program.run(x), static(x))
    assert "StatelessIf" not in _node_ops(program, tf.TensorSpec([3, 4]))


def test_threads_with_different_shapes(build, stats) -> None:  # noqa: ANN001
    program = build(gelu_center.get_concrete_function())
    sizes = [1, 2, 3, 4, 5, 6] * 4

    def check(rows: int) -> bool:
        x = _rows(rows, rows)
        got, want = program.run(x), gelu_center(x)
        return all(np.allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)
                   for g, w in zip(got, want))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(check, sizes))
    # The compile function dedupes: one compilation per shape, however many threads.
    assert stats(program) == [loader.DynamicStats(6, 0, False)]
    assert len(program.dynamic_clusters[0].specializations) == 6


def _dense_model(seed: int) -> tuple[tf.Variable, tf.Variable]:
    rng = np.random.default_rng(seed)
    return (tf.Variable(rng.standard_normal((4, 3)).astype(np.float32)),
            tf.Variable(np.zeros(3, np.float32)))


def _train_step(w: tf.Variable, b: tf.Variable):  # noqa: ANN202
    def step(x, y):  # noqa: ANN001, ANN202
        with tf.GradientTape() as tape:
            logits = tf.matmul(x, w) + b
            loss = tf.reduce_mean(tf.square(tf.nn.softmax(logits) - y))
        grad_w, grad_b = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * grad_w)
        b.assign_sub(0.1 * grad_b)
        return loss

    return step


def test_keras_style_step_generalized_by_reduce_retracing(build, stats) -> None:  # noqa: ANN001
    """Keras builds its train step as tf.function(step, reduce_retracing=True): the
    second shape retraces with the batch dimension None. That trace compiles per shape."""
    w, b = _dense_model(0)
    keras_step = tf.function(_train_step(w, b), reduce_retracing=True)
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((n, 4)).astype(np.float32),
                rng.random((n, 3)).astype(np.float32)) for n in (8, 5, 8, 3, 5)]
    keras_step(*batches[0])
    keras_step(*batches[1])
    concrete = keras_step.get_concrete_function(tf.TensorSpec([None, 4]), tf.TensorSpec([None, 3]))
    assert concrete.inputs[0].shape.as_list() == [None, 4]  # the generalized trace
    program = build(concrete, min_cluster_size=4)
    assert program.dynamic_clusters

    w_ref, b_ref = _dense_model(0)
    reference = tf.function(_train_step(w_ref, b_ref), reduce_retracing=True)
    w.assign(w_ref)
    b.assign(b_ref)
    for x, y in batches:
        np.testing.assert_allclose(float(program.run(x, y)), float(reference(x, y)), rtol=1e-5)
        np.testing.assert_allclose(w.numpy(), w_ref.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b.numpy(), b_ref.numpy(), rtol=1e-5, atol=1e-6)
    assert all(s.compiled == 3 and s.refused == 0 for s in stats(program))
