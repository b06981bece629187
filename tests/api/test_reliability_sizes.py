"""Shapes past the int64 limit (2^63-1 elements or bytes) are errors, never a loop that
does not end: TF raises InvalidArgumentError for them, must-compile mode a
`CompilationError` (an InvalidArgumentError) naming the op and the user's line, and auto
mode leaves the op to TF, which raises its own error."""

from __future__ import annotations

import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.program import CompilationError


def _sum_of_huge_broadcast(x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.broadcast_to(x, [2**31, 2**31, 8]))


def test_tf_itself_refuses_the_shape() -> None:
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.function(_sum_of_huge_broadcast, jit_compile=True)(tf.ones([8]))


def test_must_compile_raises_a_compilation_error_naming_the_op() -> None:
    f = tl.function(_sum_of_huge_broadcast, jit_compile=True)
    with pytest.raises(CompilationError) as caught:
        f(tf.ones([8]))
    message = str(caught.value)
    assert "BroadcastTo" in message and "2^63-1" in message
    assert "test_reliability_sizes.py" in message  # the user's line
    assert isinstance(caught.value, tf.errors.InvalidArgumentError)


def test_auto_mode_leaves_the_op_to_tensorflow() -> None:
    f = tl.function(_sum_of_huge_broadcast)
    with pytest.raises(tf.errors.InvalidArgumentError):
        f(tf.ones([8]))


def test_large_but_valid_fused_broadcast_still_compiles() -> None:
    """Just under the limit in elements is a shape like any other: only the size
    check is new (a 2^20-element broadcast summed, as XLA fuses it)."""
    f = tl.function(lambda x: tf.reduce_sum(tf.broadcast_to(x, [1024, 128, 8])),
                    jit_compile=True)
    assert float(f(tf.ones([8]))) == 1024 * 128 * 8
