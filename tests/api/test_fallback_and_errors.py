"""Auto mode leaves what cannot compile to TensorFlow; must-compile mode refuses it."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl


def mixed(x):
    y = tf.nn.relu(x * 2.0 + 1.0) - 0.5
    tf.print("tfxla-lite-print-check", tf.reduce_sum(y))
    values, _ = tf.unique(tf.cast(y > 0.0, tf.int32))
    label = tf.strings.as_string(tf.reduce_max(y))
    return tf.exp(y) * 3.0 + 1.0, values, label


def test_auto_mode_falls_back_and_still_prints(capfd) -> None:
    x = np.linspace(-2, 2, 16).astype(np.float32)
    expected = tf.function(mixed)(x)
    capfd.readouterr()
    f = tl.function(mixed)
    actual = f(x)
    np.testing.assert_allclose(actual[0].numpy(), expected[0].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(actual[1].numpy(), expected[1].numpy())
    assert actual[2].numpy() == expected[2].numpy()
    captured = capfd.readouterr()
    assert "tfxla-lite-print-check" in captured.out + captured.err
    report = tl.explain(f, x)
    left = {node.op_type: node for node in report.fallbacks}
    for op_type in ("Unique", "AsString", "PrintV2"):
        assert op_type in left, report
        assert left[op_type].reason
    assert report.compiled_clusters


def test_must_compile_names_offending_ops() -> None:
    x = np.linspace(-2, 2, 16).astype(np.float32)
    f = tl.function(mixed, jit_compile=True)
    with pytest.raises(tl.CompilationError) as info:
        f(x)
    assert isinstance(info.value, tf.errors.InvalidArgumentError)
    message = str(info.value.message)
    for op_type in ("Unique", "AsString", "PrintV2"):
        assert op_type in message
    assert "test_fallback_and_errors.py:" in message  # the user's source line
    assert {n.op_type for n in info.value.offending} >= {"Unique", "AsString", "PrintV2"}


def test_jit_compile_false_is_plain_tf_function() -> None:
    f = tl.function(mixed, jit_compile=False)
    x = np.ones(4, np.float32)
    assert f(x)[0].shape == (4,)
    assert not f.explain(x).clusters


def _step_on(v: tf.Variable):
    def step(x):
        new = tf.tanh(v * 0.5 + x) * 2.0
        v.assign(new)
        return tf.reduce_sum(new * v)  # reads v again, after the write

    return step


def test_variables_read_and_assigned_call_after_call() -> None:
    initial = np.arange(6, dtype=np.float32).reshape(2, 3) / 6.0
    v_reference, v_compiled = tf.Variable(initial), tf.Variable(initial)
    reference = tf.function(_step_on(v_reference))
    compiled = tl.function(_step_on(v_compiled), jit_compile=True)
    x = np.full((2, 3), 0.25, np.float32)
    for _ in range(3):
        expected = reference(x).numpy()
        actual = compiled(x).numpy()
        np.testing.assert_allclose(v_compiled.numpy(), v_reference.numpy(), rtol=1e-6)
        np.testing.assert_allclose(actual, expected, rtol=1e-5)
    assert tl.explain(compiled, x).compiled_clusters


def test_failure_inside_tfxla_lite_falls_back_in_auto_mode(monkeypatch) -> None:
    from tfxla_lite import driver

    def broken(*args, **kwargs):
        raise RuntimeError("injected rewrite failure")

    monkeypatch.setattr(driver, "rewrite_graph_def", broken)

    def fn(x):
        return tf.exp(tf.nn.relu(x * 2.0 + 1.0)) - 1.0

    x = np.linspace(-1, 1, 8).astype(np.float32)
    auto = tl.function(fn)
    np.testing.assert_allclose(auto(x).numpy(), tf.function(fn)(x).numpy(), rtol=1e-6)
    assert "injected rewrite failure" in str(tl.explain(auto, x))
    # jit_compile=True: TF's XLA runs the trace, and the report says why; strict raises.
    must = tl.function(fn, jit_compile=True)
    np.testing.assert_allclose(must(x).numpy(), tf.function(fn)(x).numpy(), rtol=1e-6)
    assert must.explain(x).runs_on_xla and "injected rewrite failure" in str(must.explain(x))
    strict = tl.function(fn, jit_compile=True, options=tl.Options(strict_jit_compile=True))
    with pytest.raises(tl.CompilationError, match="injected rewrite failure"):
        strict(x)
