"""tfxla_lite.enable()/disable(): what gets patched, what the patched tf.function returns."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.api import Function
from tfxla_lite.original_function import original_tf_function

ORIGINAL = tf.function


def _aliases() -> list:
    return [tf, tf.compat.v1, tf.compat.v2]


def test_enable_patches_every_alias_and_disable_restores_them() -> None:
    assert all(module.function is ORIGINAL for module in _aliases())
    tl.enable()
    assert tl.is_enabled()
    assert all(module.function is tf.function for module in _aliases())
    assert tf.function is not ORIGINAL
    assert sys.modules["tensorflow.python.eager.polymorphic_function.polymorphic_function"] \
        .function is ORIGINAL  # TF's internals keep theirs
    tl.enable()  # idempotent
    patched = tf.function
    tl.enable()
    assert tf.function is patched
    tl.disable()
    tl.disable()
    assert not tl.is_enabled()
    assert all(module.function is ORIGINAL for module in _aliases())
    assert original_tf_function() is ORIGINAL


def double(x):
    return x * 2.0 + 1.0


def test_what_the_patched_tf_function_returns() -> None:
    tl.enable(tl.Options(auto_jit=0))
    assert isinstance(tf.function(double, jit_compile=True), Function)
    assert isinstance(tf.function(jit_compile=True)(double), Function)  # decorator with args
    assert not isinstance(tf.function(double), Function)  # auto-jit off: TF's own
    assert not isinstance(tf.function(double, jit_compile=False), Function)
    tl.enable(tl.Options(auto_jit=2))
    for made in (tf.function(double), tf.function()(double),
                 tf.function(double, reduce_retracing=True, autograph=False,
                             experimental_autograph_options=None)):
        assert isinstance(made, Function) and made.jit_compile is None
    assert not isinstance(tf.function(double, jit_compile=False), Function)
    assert not isinstance(tf.function(double, experimental_implements="name: 'x'"), Function)
    signature = (tf.TensorSpec([None], tf.float32),)
    made = tf.function(double, input_signature=signature)
    assert made.input_signature == signature
    with pytest.raises(TypeError):
        tf.function(double, not_a_tf_function_argument=1)


def test_patched_decorator_runs_and_compiles() -> None:
    tl.enable(tl.Options(auto_jit=2, min_cluster_size=1, verify=True))

    @tf.function
    def f(x):
        return tf.exp(x) * 2.0 + x

    x = np.linspace(-1, 1, 8, dtype=np.float32)
    np.testing.assert_allclose(f(x).numpy(), np.exp(x) * 2.0 + x, rtol=1e-6)
    assert f.explain(x).compiled_clusters
    tl.disable()
    np.testing.assert_allclose(f(x).numpy(), np.exp(x) * 2.0 + x, rtol=1e-6)  # still works


def test_methods_and_existing_tf_functions() -> None:
    tl.enable(tl.Options(auto_jit=1, min_cluster_size=1))

    class Scale:
        def __init__(self, factor: float) -> None:
            self.factor = factor

        @tf.function
        def __call__(self, x):
            return x * self.factor + 1.0

    x = np.ones(3, np.float32)
    np.testing.assert_allclose(Scale(3.0)(x).numpy(), 4.0)
    np.testing.assert_allclose(Scale(5.0)(x).numpy(), 6.0)
    wrapped = tf.function(ORIGINAL(double))
    assert isinstance(wrapped, Function) and wrapped.python_function is double


def unique_after_math(x):
    return tf.unique(tf.exp(x) * 2.0)[0]


def test_jit_compile_true_through_the_patch_falls_back_to_xla_with_a_warning(caplog) -> None:
    # tfxla-lite has no lowering of Unique; TF's XLA has: the trace runs there, whole.
    tl.enable(tl.Options(verify=True))
    f = tf.function(unique_after_math, jit_compile=True)
    x = np.array([0.0, 1.0, 0.0], np.float32)
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        result = f(x)
        f(x + 1.0)
    expected = ORIGINAL(unique_after_math, jit_compile=True)(x)
    np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-6)
    warnings = [r.getMessage() for r in caplog.records if "runs with TF's XLA" in
                r.getMessage()]
    assert len(warnings) == 1 and "Unique" in warnings[0]  # once per function, with why
    report = f.explain(x)
    assert report.runs_on_xla and not report.clusters
    assert [node.op_type for node in report.jit_compile_fallback.ops] == ["Unique"]


def test_strict_jit_compile_raises_like_tfxla_lite_function() -> None:
    tl.enable(tl.Options(strict_jit_compile=True))
    with pytest.raises(tl.CompilationError, match="Unique"):
        tf.function(unique_after_math, jit_compile=True)(np.ones(3, np.float32))
    strict = tl.Options(strict_jit_compile=True)
    with pytest.raises(tl.CompilationError):  # tfxla_lite.function: the same option
        tl.function(unique_after_math, jit_compile=True, options=strict)(np.ones(3, np.float32))


def test_must_compile_step_called_inside_a_function_with_unknown_batch() -> None:
    # Keras' shape: a jit_compile=True step called while tracing an outer tf.function
    # whose input has an unknown batch dimension.
    tl.enable(tl.Options(verify=True))
    w = tf.Variable(np.linspace(0, 1, 12, dtype=np.float32).reshape(4, 3))

    def step(x):
        y = tf.nn.relu(tf.matmul(x, w) + 0.5)
        w.assign_sub(0.01 * tf.reduce_mean(y) * tf.ones_like(w))
        return tf.reduce_sum(y)

    inner = tf.function(step, jit_compile=True)
    outer = ORIGINAL(lambda x: inner(x) * 2.0,
                     input_signature=(tf.TensorSpec([None, 4], tf.float32),))
    w_reference = tf.Variable(w.numpy())

    def reference_step(x):
        y = tf.nn.relu(tf.matmul(x, w_reference) + 0.5)
        w_reference.assign_sub(0.01 * tf.reduce_mean(y) * tf.ones_like(w_reference))
        return tf.reduce_sum(y) * 2.0

    for rows in (5, 3):
        x = np.linspace(-1, 1, rows * 4, dtype=np.float32).reshape(rows, 4)
        np.testing.assert_allclose(outer(x).numpy(), reference_step(x).numpy(), rtol=1e-5)
        np.testing.assert_allclose(w.numpy(), w_reference.numpy(), rtol=1e-6)


def test_ops_to_cluster_limits_what_compiles() -> None:
    def f(x):
        return tf.exp(x) * 2.0 + tf.tanh(x)

    g = tl.function(f, options=tl.Options(ops_to_cluster=frozenset({"Exp", "Mul"}),
                                          min_cluster_size=1))
    x = np.ones(4, np.float32)
    np.testing.assert_allclose(g(x).numpy(), f(x).numpy(), rtol=1e-6)
    report = g.explain(x)
    compiled = {t for c in report.compiled_clusters for _, t in c.ops}
    assert {"Exp", "Mul"} <= compiled <= {"Exp", "Mul", "Const", "Identity"}
    reasons = {f.op_type: f.reason for f in report.fallbacks}
    assert reasons["Tanh"] == "op type Tanh is not in --ops_to_cluster"


def test_tfxla_lite_own_functions_are_not_wrapped() -> None:
    tl.enable(tl.Options(auto_jit=2))

    def inner(x):
        return x + 1.0

    inner.__module__ = "tfxla_lite.driver"  # as the compiler's rewritten function is
    assert not isinstance(tf.function(inner), Function)
