"""Drop-in: tf.function programs a newcomer writes run under tfxla-lite with plain TF's
numbers, both through the patched `tf.function` (`tl.enable()` with auto_jit=2, as
TF_XLA_FLAGS=--tf_xla_auto_jit=2) and as `tl.function(jit_compile=True)`: tf.Module
methods with an input_signature and their SavedModel, tapes around a compiled call,
retracing options, and arguments that are not plain tensors (Python scalars, nested
structures, variables, RaggedTensor, SparseTensor)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite import options
from tfxla_lite.original_function import original_tf_function
from tfxla_lite.runtime import loader
from tfxla_lite.stats import PROCESS_STATS

MODES = ["auto", "jit"]


@pytest.fixture(autouse=True)
def _disabled_after():
    yield
    tl.disable()


def _tf() -> Callable[..., Any]:
    """Plain TF's tf.function, also while tfxla-lite is enabled."""
    return original_tf_function() or tf.function


def _compiled(mode: str, fn: Callable[..., Any] | None = None, **keywords: Any) -> Any:
    """`fn` as tfxla-lite runs it in `mode`: the patched tf.function (auto-jit), or
    tl.function(jit_compile=True); a decorator when `fn` is None."""
    if mode == "auto":
        tl.enable(options.Options(verify=True, auto_jit=2))
        return tf.function(fn, **keywords) if fn is not None else tf.function(**keywords)
    if fn is None:
        return tl.function(jit_compile=True, **keywords)
    return tl.function(fn, jit_compile=True, **keywords)


def _launches() -> int:
    return loader.launch_timing().launches


def _same(ours: Any, theirs: Any, what: str = "model gradient") -> None:
    tf.nest.assert_same_structure(ours, theirs, expand_composites=True)
    for n, (a, b) in enumerate(zip(tf.nest.flatten(ours, expand_composites=True),
                                   tf.nest.flatten(theirs, expand_composites=True))):
        assert_close(np.asarray(a), np.asarray(b), what, f"value {n}")


class _Scorer(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(tf.reshape(tf.linspace(-1.0, 1.0, 12), (4, 3)))
        self.b = tf.Variable(tf.linspace(0.1, 0.3, 3))

    def body(self, x: tf.Tensor) -> tf.Tensor:
        return tf.nn.softmax(tf.tanh(x @ self.w + self.b) * 2.0 + 1.0)


@pytest.mark.parametrize("mode", MODES)
def test_module_with_input_signature_saved_and_loaded(mode) -> None:
    signature = [tf.TensorSpec([None, 4], tf.float32)]

    class Plain(_Scorer):
        @_tf()(input_signature=signature)
        def __call__(self, x):
            return self.body(x)

    class Compiled(_Scorer):
        @_compiled(mode, input_signature=signature)
        def __call__(self, x):
            return self.body(x)

    x = tf.constant(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
    expected = Plain()(x)
    module = Compiled()
    before = _launches()
    _same(module(x), expected, "Softmax")
    assert _launches() > before, "the method ran compiled"
    directory = tempfile.mkdtemp()
    tf.saved_model.save(module, directory)
    loaded = tf.saved_model.load(directory)
    _same(loaded(x), expected, "Softmax")
    _same(loaded(x[:2]), expected[:2], "Softmax")  # the signature's unknown batch
    _same(loaded.signatures["serving_default"](x=x)["output_0"], expected, "Softmax")


def _loss(x: tf.Tensor, w: tf.Variable) -> tf.Tensor:
    return tf.reduce_sum(tf.sin(x * w) * tf.exp(w * 0.1) + x * x * w)


def _tape_results(function: Callable[..., Any], x: tf.Tensor, w: tf.Variable) -> list:
    """First and second order, a persistent tape asked three times, a watched constant."""
    with tf.GradientTape(persistent=True) as outer:
        outer.watch(x)
        with tf.GradientTape(persistent=True) as inner:
            inner.watch(x)
            y = function(x, w)
        dx = inner.gradient(y, x)
        dw = inner.gradient(y, w)
        both = inner.gradient(y, [x, w])
    d2x = outer.gradient(dx, x)
    dxdw = outer.gradient(dx, w)
    c = tf.constant(2.0)
    with tf.GradientTape() as tape:
        tape.watch(c)
        z = function(x * c, w)
    return [y, dx, dw, *both, d2x, dxdw, tape.gradient(z, c)]


@pytest.mark.parametrize("mode", MODES)
def test_tapes_around_a_compiled_call(mode) -> None:
    x = tf.constant([0.3, -1.2, 2.0])
    expected = _tape_results(_tf()(_loss), x, tf.Variable([0.5, 1.5, -0.7]))
    compiled = _compiled(mode, _loss)
    before = _launches()
    _same(_tape_results(compiled, x, tf.Variable([0.5, 1.5, -0.7])), expected)
    assert _launches() > before


@pytest.mark.parametrize("keyword", ["reduce_retracing", "experimental_relax_shapes"])
@pytest.mark.parametrize("mode", MODES)
def test_retracing_options(mode, keyword) -> None:
    def f(x):
        return tf.reduce_sum(tf.tanh(x) * 2.0 + x * x, axis=-1)

    compiled = _compiled(mode, f, **{keyword: True})
    for n in (1, 2, 3, 5, 8):
        x = tf.reshape(tf.linspace(-2.0, 2.0, n * 3), (n, 3))
        _same(compiled(x), _tf()(f)(x), "Sum")


def test_deprecated_spellings_through_the_patched_tf_function() -> None:
    # TF's deprecated keywords reach the same program through the patched tf.function.
    def f(x):
        return tf.reduce_sum(tf.tanh(x) * 2.0 + x * x, axis=-1)

    tl.enable(options.Options(verify=True))
    compiled = tf.function(f, experimental_compile=True, experimental_relax_shapes=True)
    assert isinstance(compiled, tl.Function) and compiled.jit_compile
    for n in (1, 2, 5):
        x = tf.reshape(tf.linspace(-2.0, 2.0, n * 3), (n, 3))
        _same(compiled(x), _tf()(f)(x), "Sum")


def test_deprecated_spellings_of_tl_function() -> None:
    # tl.function takes tf.function's deprecated keywords as their current names.
    def f(x):
        return x * 2.0

    compiled = tl.function(f, experimental_compile=True, experimental_relax_shapes=True)
    assert compiled.jit_compile is True
    assert tl.function(f, jit_compile=False, experimental_compile=True).jit_compile is False
    _same(compiled(tf.constant([1.0, -2.0])), tf.constant([2.0, -4.0]), "Mul")


@pytest.mark.parametrize("mode", MODES)
def test_python_scalar_arguments(mode) -> None:
    def f(x, scale, count, flag):
        y = tf.reduce_sum(x * scale) + count
        return y * 2.0 if flag else y

    compiled = _compiled(mode, f)
    x = tf.constant([1.0, 2.0, -3.5])
    for arguments in ((2.0, 1, True), (3.0, 1, True), (2.0, 4, False), (0.5, 0, True)):
        _same(compiled(x, *arguments), _tf()(f)(x, *arguments))


@pytest.mark.parametrize("mode", MODES)
def test_nested_structure_arguments_and_results(mode) -> None:
    def f(features, pair):
        return {"a": tf.tanh(features["x"]) * pair[0] + pair[1]["y"],
                "b": [features["x"] * 2.0, (pair[0] + 1.0,)]}

    compiled = _compiled(mode, f)
    arguments = ({"x": tf.constant([1.0, -2.0])},
                 (tf.constant(3.0), {"y": tf.constant([0.5, 0.25])}))
    _same(compiled(*arguments), _tf()(f)(*arguments), "Tanh")


@pytest.mark.parametrize("mode", MODES)
def test_variable_arguments(mode) -> None:
    """A variable passed as an argument: one trace serves variables of one spec, and it
    runs compiled (it fell back to TF, or TF's XLA, when the rewrite met the argument's
    eager handle)."""
    def f(x, v):
        v.assign_add(x)
        return tf.reduce_sum(tf.square(v * x) + x)

    results = []
    for function in (_tf()(f), _compiled(mode, f)):
        a, b = tf.Variable([1.0, 2.0]), tf.Variable([3.0, 4.0])
        x = tf.constant([1.0, 2.0])
        before = _launches()
        results.append([function(x, a), function(x, b), function(x, a), a.numpy(), b.numpy()])
        launched = _launches() - before
    assert launched == 3, "each call of the compiled function is one launch"
    _same(results[1], results[0])


@pytest.mark.parametrize("mode", MODES)
def test_ragged_arguments(mode) -> None:
    def f(r):
        return tf.reduce_sum(r * 2.0 + 1.0, axis=1), r.row_lengths()

    compiled = _compiled(mode, f)
    for rows in ([[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]], [[0.5], [], [1.0, -1.0]]):
        r = tf.ragged.constant(rows)
        _same(compiled(r), _tf()(f)(r))


def _sparse_product(s, d):
    return tf.sparse.sparse_dense_matmul(s, d) * 2.0 + 1.0


SPARSE = (tf.sparse.SparseTensor([[0, 1], [2, 0]], [1.5, -2.0], [3, 2]),
          tf.constant([[1.0, 2.0], [3.0, 4.0]]))


def test_sparse_arguments_auto() -> None:
    _same(_compiled("auto", _sparse_product)(*SPARSE), _tf()(_sparse_product)(*SPARSE))


def test_sparse_arguments_must_compile_fail_as_tf_does() -> None:
    """SparseTensorDenseMatMul has no XLA kernel: plain TF's jit_compile=True fails, so
    tfxla-lite's (falling back to TF's XLA) fails with TF's error, never other numbers."""
    with pytest.raises(tf.errors.InvalidArgumentError, match="SparseTensorDenseMatMul"):
        _tf()(_sparse_product, jit_compile=True)(*SPARSE)
    with pytest.raises(tf.errors.InvalidArgumentError, match="SparseTensorDenseMatMul"):
        _compiled("jit", _sparse_product)(*SPARSE)


def test_arg_max_of_an_unknown_batch_compiles() -> None:
    """Keras's accuracy metrics take an ArgMax of the batch's logits, whose batch is
    unknown in a step traced for any batch: it compiles (it was refused as 'a scalar
    input', and a must-compile step with it ran on TF's XLA, whole)."""
    def f(logits, labels):
        hits = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels)
        return tf.reduce_mean(tf.cast(hits, tf.float32)), tf.argmin(logits, axis=1)

    compiled = tl.function(f, jit_compile=True)
    # Called in a trace for any batch (Keras's step inside its loop over a dataset), the
    # compiled call is traced with the batch unknown.
    signature = [tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None], tf.int32)]
    outer = _tf()(lambda logits, labels: compiled(logits, labels), input_signature=signature)
    before = PROCESS_STATS.xla_fallbacks
    rng = np.random.default_rng(2)
    for batch in (7, 4):
        logits = tf.constant(rng.standard_normal((batch, 3)).astype(np.float32))
        labels = tf.constant(rng.integers(0, 3, batch).astype(np.int32))
        _same(outer(logits, labels), _tf()(f)(logits, labels))
    assert PROCESS_STATS.xla_fallbacks == before, PROCESS_STATS.summary()
