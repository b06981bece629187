"""Drop-in: a must-compile function (`jit_compile=True`) called inside an auto-clustered
trace (`tl.enable()` with auto_jit=2, or an auto-clustering `tl.function`) keeps its
must-compile: it is compiled as its own launch, or run on TF's XLA (a custom gradient
that may be taken needs TF's trace: `api.Function._custom_gradient_on_xla`), never
inlined among TF's kernels.
Values and gradients are plain TF's (which runs the nested call on TF's XLA)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite import options

RNG = np.random.default_rng(7)
# Conv3D over 2 groups (4 input features, filter depth 2): TF's CPU kernel refuses it
# ("input and filter must have the same depth"), only XLA runs it.
X = tf.constant(RNG.standard_normal((2, 5, 6, 6, 4)).astype(np.float32))
K = tf.constant(RNG.standard_normal((3, 3, 3, 2, 6)).astype(np.float32) * 0.3)


@pytest.fixture(autouse=True)
def _disabled_after():
    yield
    tl.disable()


@tf.custom_gradient
def _clipped(y):
    return tf.identity(y), lambda dy: tf.clip_by_value(dy, -0.5, 0.5)


def _grouped(x, k):
    return tf.nn.relu(tf.nn.conv3d(x, k, [1, 1, 1, 1, 1], "SAME") + 0.5)


def _grouped_custom_gradient(x, k):
    return _grouped(_clipped(x), k)


def _ordinary(x, k):
    return tf.tanh(x * 1.5) * tf.reduce_mean(k) + tf.sin(x)


def _outer(inner: Callable[..., Any]) -> Callable[..., Any]:
    def outer(x, k):
        with tf.GradientTape() as tape:
            tape.watch([x, k])
            loss = tf.reduce_mean(tf.square(inner(tf.tanh(x) * 2.0, k) * 3.0))
        return loss, tape.gradient(loss, [x, k])

    return outer


def _eager_tape(inner: Callable[..., Any]) -> Callable[..., Any]:
    def outer(x, k):
        with tf.GradientTape() as tape:
            tape.watch([x, k])
            loss = tf.reduce_mean(tf.square(inner(x, k)))
        return loss, tape.gradient(loss, [x, k])

    return outer


INNERS = {"grouped": _grouped, "grouped_custom_gradient": _grouped_custom_gradient,
          "ordinary": _ordinary}


def _expected(inner: Callable[..., Any], wrap: Callable[..., Any], graph: bool) -> list:
    nested = tf.function(inner, jit_compile=True)
    run = tf.function(wrap(nested)) if graph else wrap(nested)
    return tf.nest.flatten(run(X, K))


def _check(got: list, expected: list) -> None:
    for n, (a, b) in enumerate(zip(got, expected)):
        assert_close(np.asarray(a), np.asarray(b), "model gradient", f"result {n}")


@pytest.mark.parametrize("inner", sorted(INNERS))
def test_nested_tl_must_compile_in_an_auto_clustered_function(inner) -> None:
    expected = _expected(INNERS[inner], _outer, graph=True)
    nested = tl.function(INNERS[inner], jit_compile=True)
    _check(tf.nest.flatten(tl.function(_outer(nested))(X, K)), expected)


@pytest.mark.parametrize("inner", sorted(INNERS))
def test_nested_tf_must_compile_under_enable(inner) -> None:
    expected = _expected(INNERS[inner], _outer, graph=True)
    tl.enable(options.Options(verify=True, auto_jit=2))
    nested = tf.function(INNERS[inner], jit_compile=True)
    outer = tf.function(_outer(nested))
    assert "tfxla_lite" in type(outer).__module__, type(outer)
    for _ in range(2):
        _check(tf.nest.flatten(outer(X, K)), expected)


@pytest.mark.parametrize("inner", ["grouped", "grouped_custom_gradient"])
def test_must_compile_with_xla_only_ops_under_an_eager_tape(inner) -> None:
    expected = _expected(INNERS[inner], _eager_tape, graph=False)
    nested = tl.function(INNERS[inner], jit_compile=True)
    _check(tf.nest.flatten(_eager_tape(nested)(X, K)), expected)


def test_custom_gradient_on_xla_says_why() -> None:
    nested = tl.function(_grouped_custom_gradient, jit_compile=True)
    with tf.GradientTape() as tape:
        tape.watch(X)
        loss = tf.reduce_sum(nested(X, K))
    assert tape.gradient(loss, X) is not None
    report = tl.explain(nested, X, K)
    assert "custom gradient" in str(report) and "TF's XLA" in str(report), str(report)
