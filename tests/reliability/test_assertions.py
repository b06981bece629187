"""`tf.debugging.assert_*` under tfxla-lite: auto mode keeps the assertion in TF, so it
fires as plain TF's does; `jit_compile=True` compiles it away as TF's XLA does (tf2xla's
Assert kernel emits nothing; it only logs 'Ignoring Assert operator'): the Assert, its
message's string constants, the condition computed only for it and the AssertGuard
`If` around it are left out (tfxla_lite/assertions.py), so a must-compile call with a
failing assertion returns TF's XLA's numbers and raises nothing."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite import assertions

STRICT = tl.Options(strict_jit_compile=True)
_GOOD = np.array([1.0, 1.5], np.float32)  # every assertion below holds
_BAD = np.array([1.0, -2.0], np.float32)


def _guarded(x: tf.Tensor) -> tf.Tensor:
    """An assertion on a tensor: an Assert inside tf.cond's AssertGuard If."""
    tf.debugging.assert_positive(x, message="x must be positive")
    return x * 2.0


def _unguarded(x: tf.Tensor) -> tf.Tensor:
    """An assertion with string data only: a bare Assert in the function's graph."""
    tf.debugging.Assert(tf.reduce_all(x > 0.0), ["x must be positive"])
    return tf.exp(x) - 1.0


def _in_a_branch(x: tf.Tensor) -> tf.Tensor:
    """An assertion inside a user's tf.cond branch that also computes: the If stays,
    its branch without the Assert."""
    def checked() -> tf.Tensor:
        tf.debugging.assert_less(x, 2.0)
        return x + 1.0

    return tf.cond(tf.reduce_sum(x) > 0.0, checked, lambda: x - 1.0) * 3.0


def _with_dependency(x: tf.Tensor) -> tf.Tensor:
    """An assertion as an explicit control dependency of the result."""
    check = tf.debugging.assert_non_negative(x)
    with tf.control_dependencies([check]):
        return tf.sqrt(tf.abs(x)) + 0.5


CASES = [_guarded, _unguarded, _in_a_branch, _with_dependency]


def _failing(function: Callable[[tf.Tensor], tf.Tensor]) -> np.ndarray:
    """Values for which `function`'s assertion is reached and fails."""
    return np.array([1.0, 5.0], np.float32) if function is _in_a_branch else _BAD


@pytest.mark.parametrize("holds", [True, False], ids=["holds", "fails"])
@pytest.mark.parametrize("function", CASES, ids=lambda f: f.__name__)
def test_must_compile_drops_the_assertion_as_tfs_xla_does(
        function: Callable[[tf.Tensor], tf.Tensor], holds: bool) -> None:
    x = tf.constant(_GOOD if holds else _failing(function))
    expected = tf.function(function, jit_compile=True)(x).numpy()  # TF's XLA: no check
    compiled = tl.function(function, jit_compile=True, options=STRICT)
    np.testing.assert_allclose(compiled(x).numpy(), expected, rtol=1e-6)
    (program,) = compiled._programs.values()
    assert program.compiled, "the computation compiled"
    kept = {f.op_type for f in program.report.fallbacks
            if f.reason != assertions.DROPPED_REASON}
    assert "Assert" not in kept


@pytest.mark.parametrize("function", CASES, ids=lambda f: f.__name__)
def test_auto_mode_fires_the_assertion_as_plain_tf_does(
        function: Callable[[tf.Tensor], tf.Tensor]) -> None:
    x = tf.constant(_failing(function))
    with pytest.raises(tf.errors.InvalidArgumentError) as plain:
        tf.function(function)(x)
    with pytest.raises(tf.errors.InvalidArgumentError) as ours:
        tl.function(function, min_cluster_size=1)(x)
    assert str(ours.value).split("\n")[0] == str(plain.value).split("\n")[0]
    good = tf.constant(_GOOD)
    np.testing.assert_allclose(tl.function(function, min_cluster_size=1)(good).numpy(),
                               tf.function(function)(good).numpy(), rtol=1e-6)


def test_the_guard_and_the_message_leave_the_rewritten_graph() -> None:
    """Nothing of `_guarded`'s assertion is left for TF to run: no Assert, no If, no
    string constant; one launch computes x * 2."""
    compiled = tl.function(_guarded, jit_compile=True, options=STRICT)
    x = tf.constant(_BAD)
    graph = compiled.get_concrete_function(x).graph
    ops = [op for op in graph.get_operations()]
    assert not [op.name for op in ops if op.type in ("Assert", "If", "StatelessIf")]
    assert not [op.name for op in ops if op.type == "Const" and op.outputs[0].dtype == tf.string]
    np.testing.assert_array_equal(compiled(x).numpy(), _BAD * 2)
