"""VariableShape folded to a constant where the variable's shape is static (its handle
data says so), against TF, in both modes; a variable of unknown dims stays in TF."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from tf_harness import check_in_both_modes, sample, trace

from tfxla_lite.clustering.mark import mark

F32 = np.float32


def _reasons(fn: Callable[..., Any], x: np.ndarray) -> set[str | None]:
    decisions = mark(trace(fn, [x]).graph)
    return {d.reason for d in decisions.values() if d.op_type == "VariableShape"}


def test_variable_shape_folded() -> None:
    """TF orders a stateful VariableShape before the function's results (auto control
    dependencies), so the check runs end to end, not per cluster."""
    variable = tf.Variable(tf.zeros([5, 3]))
    scalar = tf.Variable(3.0)

    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        dims = tf.raw_ops.VariableShape(input=variable.handle)
        wide = tf.raw_ops.VariableShape(input=variable.handle, out_type=tf.int64)
        none = tf.raw_ops.VariableShape(input=scalar.handle)
        return [dims * 2, wide, x * tf.cast(tf.reduce_prod(dims), tf.float32),
                tf.concat([none, dims], 0)]

    x = sample((4,), F32)
    assert _reasons(fn, x) == {None}
    check_in_both_modes(fn, [tf.constant(x)], "VariableShape", {"VariableShape"})


def test_unknown_dims_stay_in_tf() -> None:
    variable = tf.Variable(tf.zeros([2, 3]), shape=tf.TensorShape([None, 3]))

    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.VariableShape(input=variable.handle) + 1

    (reason,) = _reasons(fn, sample((2,), F32))
    assert reason is not None and "not static" in reason
