"""Cluster formation: cycle safety, control edges, sizes, names, inputs and outputs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf
from tf_harness import sample, trace
from tolerances import assert_close

from tfxla_lite.clustering import Cluster, cluster_graph, counted_size, lower_cluster
from tfxla_lite.clustering.mark import MarkOptions
from tfxla_lite.hlo.evaluator import evaluate


def clusters_of(fn: Any, *shapes: tuple[int, ...], **kwargs: Any) -> tuple[list[Cluster], Any]:
    concrete = trace(fn, [np.zeros(s, np.float32) for s in shapes])
    return cluster_graph(concrete.graph, **kwargs).clusters, concrete


def op_types(concrete: Any, cluster: Cluster) -> list[str]:
    return [concrete.graph.get_operation_by_name(n).type for n in cluster.op_names]


def test_contraction_does_not_make_a_cycle_through_a_non_compilable_op() -> None:
    # a → lgamma (no lowering) → c, and a → c: merging a and c would make a cycle.
    def fn(x: Any) -> Any:
        a = tf.exp(x) * 2.0
        b = tf.math.lgamma(a)
        return tf.tanh(a + b)

    clusters, concrete = clusters_of(fn, (4,), min_cluster_size=1)
    assert len(clusters) == 2
    first, second = clusters
    assert {"Exp", "Mul"} <= set(op_types(concrete, first))
    assert {"AddV2", "Tanh"} <= set(op_types(concrete, second))
    assert first.outputs == ["mul:0"]
    assert second.inputs == ["mul:0", "Lgamma:0"]
    # and the pieces still compute the function
    x = sample((4,), seed=3, edges=False)
    graph = concrete.graph
    values = {"x:0": x}
    for cluster in clusters:
        if cluster is second:
            values["Lgamma:0"] = np.array([math.lgamma(v) for v in values["mul:0"]],
                                          np.float32)
        outputs = evaluate(lower_cluster(graph, cluster), *[values[n] for n in cluster.inputs])
        values.update(zip(cluster.outputs, outputs))
    assert_close(values[graph.outputs[0].name], fn(tf.constant(x)).numpy(), "Tanh")


def test_control_edges_are_respected() -> None:
    def fn(x: Any) -> Any:
        a = tf.exp(x)
        printed = tf.print(a)
        with tf.control_dependencies([printed]):
            c = tf.tanh(a)
        with tf.control_dependencies([c]):
            done = tf.print("done")
        with tf.control_dependencies([done]):
            return tf.identity(c)

    clusters, concrete = clusters_of(fn, (3,), min_cluster_size=1)
    graph = concrete.graph
    assert len(clusters) == 2  # exp → print →(control) tanh would close a cycle
    first, second = clusters
    assert "Exp" in op_types(concrete, first) and "Tanh" in op_types(concrete, second)
    printers = [op.name for op in graph.get_operations() if op.type == "PrintV2"]
    assert second.control_inputs == [printers[0]]
    tanh = second.op_names[0]
    after = [op.name for op in graph.get_operations()
             if any(c.name == tanh for c in op.control_inputs)]
    assert after and second.control_outputs == after


def test_min_cluster_size() -> None:
    def fn(x: Any) -> Any:
        return tf.tanh(tf.exp(x) * 2.0)  # Exp, Mul, Tanh (+ Const, Identity: not counted)

    assert clusters_of(fn, (3,), min_cluster_size=4)[0] == []
    (cluster,), concrete = clusters_of(fn, (3,), min_cluster_size=3)
    assert counted_size(op_types(concrete, cluster)) == 3
    assert set(op_types(concrete, cluster)) == {"Exp", "Const", "Mul", "Tanh", "Identity"}


def test_max_cluster_size() -> None:
    def fn(x: Any) -> Any:
        for _ in range(6):
            x = tf.exp(x)
        return x

    clusters, concrete = clusters_of(fn, (3,), min_cluster_size=1, max_cluster_size=3)
    sizes = [counted_size(op_types(concrete, c)) for c in clusters]
    assert max(sizes) <= 3 and sum(sizes) == 6


def test_const_and_identity_alone_form_no_cluster() -> None:
    clusters, _ = clusters_of(lambda x: (tf.identity(x), tf.constant(3.0)), (2,),
                              min_cluster_size=1)
    assert clusters == []


def test_names_are_deterministic_and_topological() -> None:
    def fn(x: Any, y: Any) -> Any:
        first = tf.exp(x) + 1.0
        middle = tf.math.lgamma(first)
        return tf.tanh(middle) * tf.sigmoid(y)

    a, concrete = clusters_of(fn, (3,), (3,), min_cluster_size=1)
    b, _ = clusters_of(fn, (3,), (3,), min_cluster_size=1)
    assert [(c.name, c.op_names, c.inputs, c.outputs) for c in a] == \
        [(c.name, c.op_names, c.inputs, c.outputs) for c in b]
    assert [c.name for c in a] == ["cluster_0", "cluster_1"]
    assert "Exp" in op_types(concrete, a[0])


def test_inputs_outputs_and_constants() -> None:
    def fn(x: Any, y: Any) -> Any:
        s = x * y
        t = tf.reduce_sum(s, axis=0) + 2.0
        return t, tf.math.lgamma(s), t

    (cluster,), concrete = clusters_of(fn, (2, 3), (2, 3), min_cluster_size=1)
    assert cluster.inputs == ["x:0", "y:0"]  # axes and 2.0 are embedded, not inputs
    graph = concrete.graph
    consts = [n for n in cluster.op_names if graph.get_operation_by_name(n).type == "Const"]
    assert len(consts) == 2  # both used only inside: absorbed
    # 'mul:0' feeds the lgamma; the function returns Identity and Identity_2 outputs.
    assert cluster.outputs[0] == "mul:0"
    assert set(cluster.outputs[1:]) == {graph.outputs[0].name, graph.outputs[2].name}
    assert len(cluster.outputs) == len(set(cluster.outputs))


def test_shared_constant_is_embedded_in_each_cluster() -> None:
    def fn(x: Any) -> Any:
        two = tf.constant(2.0)
        a = tf.exp(x) * two
        b = tf.math.lgamma(a)
        return tf.tanh(b) * two

    clusters, concrete = clusters_of(fn, (3,), min_cluster_size=1)
    assert len(clusters) == 2
    assert all(not any(i.startswith("Const") for i in c.inputs) for c in clusters)
    text = lower_cluster(concrete.graph, clusters[1]).to_text()
    assert "constant(2)" in text


def test_devices_split_clusters() -> None:
    def fn(x: Any) -> Any:
        with tf.device("/device:CPU:0"):
            a = tf.exp(tf.exp(x))
        return tf.tanh(tf.tanh(a))

    clusters, concrete = clusters_of(fn, (3,), min_cluster_size=1)
    assert len(clusters) == 2
    assert {c.device for c in clusters} == {"", "/device:CPU:0"}


def test_lowered_module_metadata() -> None:
    (cluster,), concrete = clusters_of(lambda x: tf.nn.softmax(x) * 3.0, (2, 3),
                                       min_cluster_size=1)
    module = lower_cluster(concrete.graph, cluster)
    assert module.name == "cluster_0"
    entry = module.entry
    assert [p.name for p in entry.parameters] == ["arg0"]
    for inst in entry.instructions:
        if inst.opcode in ("parameter", "tuple"):
            continue
        assert inst.metadata["op_type"] in ("Softmax", "Mul", "Const"), inst
        assert inst.metadata["source_file"] == __file__
        assert isinstance(inst.metadata["source_line"], int)
    assert 'op_type="Softmax"' in module.to_text()


def test_result_waiting_for_variable_writes_keeps_its_producer_in_the_cluster() -> None:
    # A training step: the loss is returned through an Identity that waits (control
    # edge) for the variable write, which depends on the cluster. Merged with the loss
    # first, that Identity kept the loss out of the main cluster: two launches a step.
    weights = tf.Variable(np.full((4, 3), 0.5, np.float32))

    def step(x: Any, target: Any) -> Any:
        w = weights.read_value()
        error = tf.matmul(x, w) - target
        loss = tf.reduce_mean(tf.square(error))
        weights.assign(w - 0.1 * tf.matmul(x, error * 2.0, transpose_a=True))
        return loss

    clusters, concrete = clusters_of(step, (2, 4), (2, 3), min_cluster_size=1)
    returned = concrete.graph.get_operation_by_name(concrete.outputs[0].op.name)
    assert returned.type == "Identity" and returned.control_inputs
    assert len(clusters) == 1
    (cluster,) = clusters
    assert "Mean" in op_types(concrete, cluster)
    assert returned.name not in cluster.op_names  # it stays in TF, after the write


def _contracted_is_acyclic(graph: Any, clusters: list[Cluster]) -> bool:
    """Whether the graph stays a DAG with each cluster contracted to one node."""
    import networkx as nx
    owner = {name: c.name for c in clusters for name in c.op_names}
    contracted = nx.DiGraph()
    for op in graph.get_operations():
        node = owner.get(op.name, op.name)
        contracted.add_node(node)
        for source in [t.op for t in op.inputs] + list(op.control_inputs):
            start = owner.get(source.name, source.name)
            if start != node:
                contracted.add_edge(start, node)
    return nx.is_directed_acyclic_graph(contracted)


def test_clusters_no_path_joins_merge_into_one() -> None:
    # exp(x)*2 feeds lgamma (no lowering), whose result feeds tanh(.)+1: two clusters with
    # a path between them. sin(y)*3 is joined to neither, so it merges into the first.
    def fn(x: Any, y: Any) -> Any:
        a = tf.exp(x) * 2.0
        b = tf.tanh(tf.math.lgamma(a)) + 1.0
        return b, tf.sin(y) * 3.0

    merged, concrete = clusters_of(fn, (4,), (3,), min_cluster_size=1)
    separate, _ = clusters_of(fn, (4,), (3,), min_cluster_size=1, merge_independent=False)
    assert len(separate) == 3 and len(merged) == 2
    assert {"Exp", "Sin"} <= set(op_types(concrete, merged[0]))
    assert {"Tanh", "AddV2"} <= set(op_types(concrete, merged[1]))
    assert _contracted_is_acyclic(concrete.graph, merged)


def test_merging_never_closes_a_cycle_through_another_merge() -> None:
    # A → lgamma → C and D → lgamma → B: A and D are independent, so are C and B, but
    # {A, D} and {C, B} may not become one (A reaches C).
    def fn(x: Any, y: Any) -> Any:
        a = tf.exp(x) * 2.0
        d = tf.sin(y) * 3.0
        c = tf.tanh(tf.math.lgamma(a)) + 1.0
        b = tf.cos(tf.math.lgamma(d)) + 1.0
        return c, b

    clusters, concrete = clusters_of(fn, (4,), (3,), min_cluster_size=1)
    assert len(clusters) == 2
    assert _contracted_is_acyclic(concrete.graph, clusters)
    assert {"Exp", "Sin"} <= set(op_types(concrete, clusters[0]))
    assert {"Tanh", "Cos"} <= set(op_types(concrete, clusters[1]))


def test_independent_clusters_with_unknown_dimensions_stay_apart() -> None:
    def fn(x: Any, y: Any) -> Any:
        return tf.exp(x) * 2.0, tf.sin(y) * 3.0

    concrete = tf.function(fn).get_concrete_function(
        tf.TensorSpec([None], tf.float32), tf.TensorSpec([3], tf.float32))
    clusters = cluster_graph(concrete.graph, MarkOptions(dynamic_shapes=True),
                             min_cluster_size=1).clusters
    assert len(clusters) == 2


def test_merge_respects_max_cluster_size() -> None:
    def fn(x: Any, y: Any) -> Any:
        return tf.exp(x) * 2.0, tf.sin(y) * 3.0

    clusters, _ = clusters_of(fn, (4,), (3,), min_cluster_size=1, max_cluster_size=3)
    assert len(clusters) == 2
    clusters, _ = clusters_of(fn, (4,), (3,), min_cluster_size=1, max_cluster_size=4)
    assert len(clusters) == 1
