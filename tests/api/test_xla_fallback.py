"""`jit_compile=True` that tfxla-lite cannot compile whole falls back to TF's XLA, never to
TF's kernels alone (tfxla_lite/xla_fallback.py): grouped convolutions, which TF's CPU
kernels refuse (tfxla-lite compiles them), give TF's XLA's numbers; an op without a
lowering runs on TF's XLA and the report says so; random numbers and other ops left to
TF by design stay auto-clustered; what TF's XLA refuses too raises, as plain TF does."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite import xla_fallback
from tfxla_lite.original_function import original_tf_function
from tfxla_lite.report import FallbackNode
from tfxla_lite.stats import PROCESS_STATS

ORIGINAL = tf.function


@pytest.fixture(autouse=True)
def _disabled_after():
    yield
    tl.disable()


@pytest.mark.parametrize("make, shape", [
    pytest.param(lambda: keras.layers.Conv3D(4, 2, groups=2), (2, 4, 5, 5, 4), id="Conv3D"),
    pytest.param(lambda: keras.layers.Conv1D(4, 3, groups=2), (2, 7, 4), id="Conv1D"),
])
def test_grouped_convolution_layers_give_tf_numbers(make, shape) -> None:
    # Keras computes grouped convolutions in a jit_compile=True function: TF's CPU kernels
    # refuse them ("input and filter must have the same depth").
    keras.utils.set_random_seed(0)
    layer = make()
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    expected = layer(x).numpy()  # plain TF: TF's XLA
    tl.enable()
    np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_grouped_conv3d_trains_a_step_like_tf() -> None:
    # The step is jit_compile=True too; the grouped convolution and its gradients compile
    # with it (TF's CPU kernels cannot run them: clustering/rules_conv_cost.py).
    def build() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4, 4, 4, 4)), keras.layers.Conv3D(4, 2, groups=2),
                                  keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=True)
        return model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4, 4, 4, 4)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    reference = build()
    expected = reference.fit(x, y, batch_size=4, epochs=1, verbose=0).history["loss"]
    tl.enable()
    model = build()
    losses = model.fit(x, y, batch_size=4, epochs=1, verbose=0).history["loss"]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    for got, want in zip(model.weights, reference.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def spectrum(x):
    # RFFT and ComplexAbs have no lowering in tfxla-lite (complex numbers); XLA has them.
    return tf.abs(tf.signal.rfft(x * 2.0)) + 1.0


def test_op_without_lowering_runs_on_tf_xla(caplog) -> None:
    tl.enable(tl.Options(verify=True))
    f = tf.function(spectrum, jit_compile=True)
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    before = PROCESS_STATS.xla_fallbacks
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        result = f(x)
        f(x + 1.0)
    expected = ORIGINAL(spectrum, jit_compile=True)(x)
    np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-5)
    warnings = [r.getMessage() for r in caplog.records if "jit_compile=True" in r.getMessage()]
    assert len(warnings) == 1 and "runs with TF's XLA" in warnings[0], warnings
    assert "RFFT" in warnings[0] and "test_xla_fallback.py:" in warnings[0]
    report = f.explain(x)
    assert report.runs_on_xla and not report.clusters, report
    assert "RFFT" in {node.op_type for node in report.jit_compile_fallback.ops}
    assert "TF's XLA" in str(report) and "RFFT" in str(report)
    assert PROCESS_STATS.xla_fallbacks == before + 1  # one trace: one signature
    assert "run by TF's XLA" in PROCESS_STATS.summary()


def test_tfxla_lite_function_falls_back_to_xla_unless_strict() -> None:
    x = np.random.default_rng(2).normal(size=(4, 4)).astype(np.float32)
    f = tl.function(spectrum, jit_compile=True)
    np.testing.assert_allclose(f(x).numpy(), ORIGINAL(spectrum, jit_compile=True)(x),
                               rtol=1e-5)
    assert f.explain(x).runs_on_xla
    strict = tl.function(spectrum, jit_compile=True,
                         options=tl.Options(strict_jit_compile=True))
    with pytest.raises(tl.CompilationError, match="RFFT"):
        strict(x)


def dropout_like(x, seed):
    mask = tf.random.stateless_uniform(tf.shape(x), seed=seed) > 0.3
    return tf.where(mask, tf.exp(x) * 2.0, 0.0) + tf.tanh(x)


def truncated_like(x, seed):
    noise = tf.random.stateless_truncated_normal(tf.shape(x), seed=seed)
    return tf.exp(x) * 2.0 + noise + tf.tanh(x)


def test_stateless_draws_compile_whole_with_tf_numbers() -> None:
    # TF's XLA would draw other numbers for the seed; tfxla-lite compiles TF's own Philox
    # (clustering/rules_random.py), so a Keras step with Dropout compiles whole and draws
    # plain TF's masks.
    tl.enable()
    f = tf.function(dropout_like, jit_compile=True)
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    seed = tf.constant([3, 4])
    np.testing.assert_allclose(f(x, seed).numpy(), ORIGINAL(dropout_like)(x, seed).numpy(),
                               rtol=1e-6)
    report = f.explain(x, seed)
    assert not report.runs_on_xla and report.compiled_clusters, report
    assert report.jit_compile_fallback is None


def test_random_ops_left_in_tf_stay_auto_clustered_with_tf_numbers() -> None:
    # A truncated normal (a redraw loop) stays in TF's kernel in every mode: the trace
    # runs auto-clustered, the draw TF's own, rather than on TF's XLA.
    tl.enable()
    f = tf.function(truncated_like, jit_compile=True)
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    seed = tf.constant([3, 4])
    np.testing.assert_allclose(f(x, seed).numpy(), ORIGINAL(truncated_like)(x, seed).numpy(),
                               rtol=1e-6, atol=1e-6)
    report = f.explain(x, seed)
    assert not report.runs_on_xla and report.compiled_clusters, report
    assert report.jit_compile_fallback.target == xla_fallback.AUTO
    assert "jit_compile=True fallback, auto-clustering" in str(report)


def as_text(x):
    return tf.strings.as_string(tf.reduce_max(x * 2.0))


def test_what_tf_xla_refuses_too_raises_as_plain_tf_does() -> None:
    tl.enable()
    x = np.ones(3, np.float32)
    with pytest.raises(Exception, match="AsString"):
        original_tf_function()(as_text, jit_compile=True)(x)
    with pytest.raises(tl.CompilationError, match="TF's XLA cannot compile it either") as info:
        tf.function(as_text, jit_compile=True)(x)
    assert "AsString" in str(info.value.message)


def _node(op_type: str, reason: str) -> FallbackNode:
    return FallbackNode(f"n/{op_type}", op_type, reason, None)


@pytest.mark.parametrize("op_type, reason, target", [
    ("StatelessRandomUniformV2", "op type StatelessRandomUniformV2 has no lowering", "auto"),
    ("RandomStandardNormal", "stateful op", "auto"),
    ("TensorListGetItem", "variant op (TensorList, dataset, optional)", "auto"),
    ("Sum", "rank of output 0 unknown", "auto"),
    ("Reshape", "input 1 decides an output shape but is not derived from shapes", "auto"),
    ("Tanh", "op type Tanh is not in --ops_to_cluster", "auto"),
    ("Svd", "op type Svd has no lowering", "xla"),
    ("Conv3D", "op type Conv3D has no lowering", "xla"),
    ("PrintV2", "stateful op", "xla"),
    ("PartitionedCall", "op type PartitionedCall has no lowering", "xla"),  # not XLA's call
])
def test_choice_per_reason(op_type: str, reason: str, target: str) -> None:
    choice = xla_fallback.choose([_node("StatelessRandomGetKeyCounter", "stateful op"),
                                  _node(op_type, reason)], None)
    assert choice.target == target
    assert [n.op_type for n in choice.deciding] == (
        [op_type] if target == "xla" else ["StatelessRandomGetKeyCounter", op_type])


def test_internal_failure_without_offending_ops_goes_to_xla() -> None:
    assert xla_fallback.choose([], None).target == xla_fallback.XLA


def test_compiled_functions_called_in_a_trace_tf_xla_runs_give_tf_traces() -> None:
    # TF's XLA cannot compile a launch op: while it traces the outer function, the inner
    # tfxla-lite function must give TF's own trace (it would fail binding otherwise).
    inner = tl.function(lambda x: tf.reduce_sum(tf.sin(x) * x + 1.0, axis=-1),
                        min_cluster_size=1)

    def outer(x):
        return tf.signal.rfft(inner(x) * 2.0)

    def reference(x):
        return tf.signal.rfft(tf.reduce_sum(tf.sin(x) * x + 1.0, axis=-1) * 2.0)

    x = tf.constant(np.random.default_rng(7).normal(size=(4, 8)).astype(np.float32))
    inner(x)  # compiled for this shape first: the nested call must not reuse its launch
    compiled = tl.function(outer, jit_compile=True)
    np.testing.assert_allclose(compiled(x).numpy(),
                               tf.function(reference, jit_compile=True)(x).numpy(),
                               rtol=1e-5, atol=1e-4)
    assert compiled.explain(x).runs_on_xla
