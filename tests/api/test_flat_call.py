"""Calls of a compiled signature whose positional tensors are its flat inputs go to the
concrete function's flat call (tfxla_lite/api.py `_flat_call`), skipping TF's structured
binding; every other call keeps TF's structured call. Either way: TF's results."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl

X = np.linspace(-2.0, 2.0, 24, dtype=np.float32).reshape(4, 6)
W = np.linspace(-1.0, 1.0, 30, dtype=np.float32).reshape(6, 5)


def _dense(x, w):
    return tf.nn.relu(tf.matmul(x, w) + 1.0)


def _program(function: tl.Function) -> object:
    (program,) = function._programs.values()
    return program


def _count_structured_calls(monkeypatch: pytest.MonkeyPatch, program: object) -> list:
    """Record calls that go through TF's structured path of the program's function."""
    calls: list = []
    run = program.concrete_run  # type: ignore[attr-defined]
    structured = type(run)._call_with_structured_signature

    def recording(self, args, kwargs):
        calls.append(1)
        return structured(self, args, kwargs)

    monkeypatch.setattr(type(run), "_call_with_structured_signature", recording)
    return calls


def test_positional_tensors_take_the_flat_call(monkeypatch: pytest.MonkeyPatch) -> None:
    function = tl.function(_dense, jit_compile=True)
    x, w = tf.constant(X), tf.constant(W)
    first = function(x, w).numpy()
    program = _program(function)
    assert program.flat_call  # type: ignore[attr-defined]
    calls = _count_structured_calls(monkeypatch, program)
    again = function(tf.constant(X * 0.5), w).numpy()
    assert calls == [], "the flat call skips TF's binding"
    expected = tf.function(_dense)(tf.constant(X * 0.5), w).numpy()
    assert_close(again, expected, "MatMul")
    assert_close(first, tf.function(_dense)(x, w).numpy(), "MatMul")
    # The same signature given NumPy arrays: TF's structured call converts them.
    from_numpy = function(X * 0.5, W).numpy()
    assert calls == [1]
    np.testing.assert_array_equal(from_numpy, again)


def test_structures_and_python_values_keep_the_structured_call() -> None:
    def nested(pair, scale=2.0):
        return pair["a"] * scale + pair["b"]

    function = tl.function(nested, jit_compile=True)
    pair = {"a": tf.constant(X), "b": tf.constant(X * 3.0)}
    value = function(pair, scale=3.0).numpy()
    assert not _program(function).flat_call  # type: ignore[attr-defined]
    np.testing.assert_allclose(value, X * 3.0 + X * 3.0, rtol=1e-6)

    # A keyword that names a positional parameter is bound to its position first
    # (`Function._canonical`), so that call is positional tensors again.
    keyword = tl.function(_dense, jit_compile=True)
    assert_close(keyword(tf.constant(X), w=tf.constant(W)).numpy(),
                 tf.function(_dense)(tf.constant(X), tf.constant(W)).numpy(), "MatMul")
    assert _program(keyword).flat_call  # type: ignore[attr-defined]


def test_captured_variables_and_calls_inside_a_tf_function() -> None:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(5, "tanh")])
    infer = tl.function(lambda x: model(x, training=False), jit_compile=True)
    x = tf.constant(X)
    assert_close(infer(x).numpy(), model(x).numpy(), "Tanh")
    assert _program(infer).flat_call  # type: ignore[attr-defined]
    model.layers[-1].kernel.assign(model.layers[-1].kernel * 2.0)  # read at each call
    assert_close(infer(x).numpy(), model(x).numpy(), "Tanh")

    @tf.function
    def outer(x):
        return infer(x) * 2.0  # symbolic tensors through the compiled program

    assert_close(outer(x).numpy(), model(x).numpy() * 2.0, "Tanh")
