"""Marking: the reason given for each op that cannot compile, and the ones that can."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tfxla_lite.clustering import PLUMBING_OPS, Decision, MarkOptions, mark


def decisions_of(fn: Any, *specs: tf.TensorSpec, options: MarkOptions | None = None
                 ) -> tuple[dict[str, Decision], tf.Graph]:
    graph = tf.function(fn).get_concrete_function(*specs).graph
    return mark(graph, options), graph


def by_type(decisions: dict[str, Decision], op_type: str) -> list[Decision]:
    found = [d for d in decisions.values() if d.op_type == op_type]
    assert found, f"no {op_type} op in {[d.op_type for d in decisions.values()]}"
    return found


def test_every_op_gets_a_decision_with_a_source_line() -> None:
    decisions, graph = decisions_of(lambda x: tf.exp(x) * 2.0, tf.TensorSpec([3]))
    assert list(decisions) == [op.name for op in graph.get_operations()]
    (exp,) = by_type(decisions, "Exp")
    assert exp.compilable and exp.reason is None
    assert exp.source is not None and exp.source.startswith(__file__ + ":")


def test_unique_has_no_lowering() -> None:
    decisions, _ = decisions_of(lambda x: tf.unique(x).y, tf.TensorSpec([5], tf.int32))
    unique = [d for d in decisions.values() if d.op_type.startswith("Unique")]
    assert unique and unique[0].reason == f"op type {unique[0].op_type} has no lowering"


def test_string_ops() -> None:
    decisions, _ = decisions_of(lambda s: tf.strings.length(s + s), tf.TensorSpec([2], tf.string))
    assert by_type(decisions, "StringLength")[0].reason == "op type StringLength has no lowering"
    assert by_type(decisions, "Add")[0].reason == "dtype string not supported by Add"


def test_print_is_stateful() -> None:
    def fn(x: Any) -> Any:
        tf.print(x)
        return x + 1.0

    decisions, _ = decisions_of(fn, tf.TensorSpec([2]))
    assert by_type(decisions, "PrintV2")[0].reason == "stateful op"
    assert by_type(decisions, "AddV2")[0].compilable


def test_random_is_stateful() -> None:
    decisions, _ = decisions_of(lambda x: x + tf.random.uniform([2]), tf.TensorSpec([2]))
    assert by_type(decisions, "RandomUniform")[0].reason == "stateful op"


def test_dynamic_shape() -> None:
    decisions, _ = decisions_of(lambda x: tf.exp(x), tf.TensorSpec([None, 3]))
    assert by_type(decisions, "Exp")[0].reason == "shape of output 0 not fully static"


def test_dynamic_shape_after_unique() -> None:
    decisions, _ = decisions_of(lambda x: tf.unique(x).y * 2, tf.TensorSpec([5], tf.int32))
    assert by_type(decisions, "Mul")[0].reason == "shape of output 0 not fully static"


def test_axis_must_be_a_constant() -> None:
    decisions, _ = decisions_of(lambda x, a: tf.reduce_sum(x, a), tf.TensorSpec([2, 3]),
                                tf.TensorSpec([], tf.int32))
    assert by_type(decisions, "Sum")[0].reason == "input 1 must be a constant"
    decisions, _ = decisions_of(lambda x, p: tf.transpose(x, p), tf.TensorSpec([2, 3]),
                                tf.TensorSpec([2], tf.int32))
    assert by_type(decisions, "Transpose")[0].reason == "input 1 must be a constant"


def test_constant_through_identity_is_a_constant() -> None:
    decisions, _ = decisions_of(lambda x: tf.reduce_sum(x, tf.identity(tf.constant([1]))),
                                tf.TensorSpec([2, 3]))
    assert by_type(decisions, "Sum")[0].compilable


def test_reshape_shape_need_not_be_constant() -> None:
    # The static output shape says everything: Keras' reshape(x, [tf.shape(x)[0], -1]).
    decisions, _ = decisions_of(lambda x, s: tf.reshape(x, tf.shape(s)), tf.TensorSpec([2, 3]),
                                tf.TensorSpec([3, 2]))
    assert by_type(decisions, "Reshape")[0].compilable


def test_variables_of_static_shape_compile_their_handles_stay_plumbing() -> None:
    v = tf.Variable(np.ones(3, np.float32))
    unknown = tf.Variable(np.ones(3, np.float32), shape=tf.TensorShape(None))

    def fn(x: Any) -> Any:
        v.assign_add(x)
        unknown.assign(x)
        return v.read_value() * 2.0

    decisions, graph = decisions_of(fn, tf.TensorSpec([3]))
    for op_type in ("ReadVariableOp", "AssignAddVariableOp"):
        assert by_type(decisions, op_type)[0].compilable
    (assign,) = by_type(decisions, "AssignVariableOp")
    assert "shape not known statically" in assign.reason
    assert all(d.reason == "argument/variable plumbing" for d in by_type(decisions, "Placeholder"))
    assert by_type(decisions, "Mul")[0].compilable


def test_resource_identity_is_not_compiled() -> None:
    v = tf.Variable(1.0)
    decisions, graph = decisions_of(lambda: tf.identity(v.handle), )
    identities = [d for d in by_type(decisions, "Identity")
                  if graph.get_operation_by_name(d.op_name).outputs[0].dtype == tf.resource]
    assert identities and identities[0].reason == "resource op / variable plumbing"


def test_device_placement() -> None:
    def fn(x: Any) -> Any:
        with tf.device("/device:TPU:0"):
            y = tf.exp(x)
        return y + 1.0

    decisions, _ = decisions_of(fn, tf.TensorSpec([2]))
    reason = by_type(decisions, "Exp")[0].reason
    assert reason is not None and reason.startswith("placed on device") and "TPU" in reason
    assert by_type(decisions, "AddV2")[0].compilable
    decisions, _ = decisions_of(fn, tf.TensorSpec([2]),
                                options=MarkOptions(device_types=frozenset({"TPU", "CPU"})))
    assert by_type(decisions, "Exp")[0].compilable


def test_denylist() -> None:
    decisions, _ = decisions_of(lambda x: tf.exp(x), tf.TensorSpec([2]),
                                options=MarkOptions(denylist=frozenset({"Exp"})))
    assert by_type(decisions, "Exp")[0].reason == "op type Exp is on the denylist"


def test_plumbing_ops() -> None:
    assert {"Placeholder", "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp",
            "AssignSubVariableOp", "VarHandleOp", "Identity", "IdentityN", "NoOp"} == PLUMBING_OPS
    assert "Const" not in PLUMBING_OPS
