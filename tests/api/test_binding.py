"""Arguments are bound as `tf.function` binds them (tfxla_lite/api.py `Function._canonical`,
`__get__`): methods, keywords, defaults, `*args`/`**kwargs`, nested structures,
`input_signature` with unknown dimensions, and TF's own errors. Every case runs the same
Python function under plain `tf.function` and under `tl.function` and compares results,
exception types and messages, and the introspection TF offers."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.api import Function

X = np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4)
SPEC = tf.TensorSpec([None, 4], tf.float32)


def _body(x: Any, scale: Any = 2.0) -> Any:
    # Four compilable ops, so that auto-clustering compiles it too.
    return tf.reduce_sum(tf.tanh(x * scale) + 1.0, axis=-1) * 0.5


def _launched(function: Function) -> bool:
    return any(program.has_launches for program in function._programs.values())


def _same_outcome(plain: Callable, compiled: Callable, *args: Any, **kwargs: Any) -> None:
    """Both return the same values, or both raise the same exception type and message."""
    try:
        expected = plain(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - whatever TF raises, we must raise
        with pytest.raises(type(error)) as raised:
            compiled(*args, **kwargs)
        # TF's messages name the arguments, the signature and TF's Python objects
        # (addresses differ): compare the first clause.
        assert str(raised.value).split(". Received")[0] == str(error).split(". Received")[0]
        return
    # Binding is what is tested: sums of a few tanh terms, a loose tolerance.
    tf.nest.map_structure(lambda e, a: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5),
                          expected, compiled(*args, **kwargs))


class Scaled(tf.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = tf.Variable(scale)

    @tl.function(input_signature=[SPEC])
    def compiled(self, x):
        return _body(x, self.scale)

    @tf.function(input_signature=[SPEC])
    def plain(self, x):
        return _body(x, self.scale)


def test_method_with_input_signature_binds_self() -> None:
    module = Scaled(1.5)
    x = tf.constant(X)
    for args, kwargs in (((x,), {}), ((), {"x": x}), ((X,), {}), ((X.tolist(),), {})):
        _same_outcome(module.plain, module.compiled, *args, **kwargs)
    assert isinstance(module.compiled, Function) and _launched(module.compiled)
    # TF's per-instance copy: cached, its signature without `self`.
    assert module.compiled is module.compiled
    assert module.compiled.function_type == module.plain.function_type
    assert module.compiled.input_signature == module.plain.input_signature
    assert Scaled.compiled is Scaled.__dict__["compiled"]


def test_each_instance_has_its_own_program_and_is_not_kept_alive() -> None:
    first, second = Scaled(1.0), Scaled(-3.0)
    x = tf.constant(X)
    assert_close(first.compiled(x).numpy(), first.plain(x).numpy(), "Tanh")
    assert_close(second.compiled(x).numpy(), second.plain(x).numpy(), "Tanh")
    alive = weakref.ref(second)
    del second
    gc.collect()
    assert alive() is None, "the bound copy holds its instance weakly, as TF's does"


def test_signature_mismatches_raise_tfs_type_error() -> None:
    module = Scaled(1.0)
    for args, kwargs in (((np.ones((2, 5), np.float32),), {}),  # shape
                         ((tf.ones([2, 4], tf.int32),), {}),  # dtype
                         ((tf.constant(X), tf.constant(X)), {}),  # too many
                         ((), {}),  # missing
                         ((), {"y": tf.constant(X)})):  # unknown keyword
        _same_outcome(module.plain, module.compiled, *args, **kwargs)


def test_unknown_dimensions_compile_per_concrete_shape() -> None:
    module = Scaled(0.5)
    for rows in (1, 3, 1, 5):
        _same_outcome(module.plain, module.compiled, tf.ones([rows, 4]) * 0.3)
    assert len(module.compiled._programs) == 3


def _keywords(x, y=None, *, scale=2.0, **extra):
    total = _body(x, scale)
    if y is not None:
        total += tf.reduce_sum(y)
    for name in sorted(extra):
        total += extra[name]
    return total


def _variadic(x, *rest, **named):
    return _body(x) + sum(rest) + sum(named[k] for k in sorted(named))


def _nested(pair, options=None):
    scale = options["scale"] if options else 1.0
    return {"sum": _body(pair[0], scale), "second": pair[1]["b"] * scale}


@pytest.mark.parametrize("python_function, calls", [
    (_keywords, [((X,), {}), ((X, X), {}), ((X,), {"y": X, "scale": 3.0}),
                 ((), {"x": X, "scale": 0.5, "bias": 1.0}), ((X,), {"scale": 1.0, "z": 2.0}),
                 ((X, X, X), {}), ((), {"scale": 1.0}), ((X,), {"x": X})]),
    (_variadic, [((X,), {}), ((X, 1.0, 2.0), {}), ((tf.constant(X), tf.constant(1.0)),
                                                   {"a": tf.constant(2.0)})]),
    (_nested, [(((X, {"b": X}),), {}), (((tf.constant(X), {"b": tf.constant(X)}),),
                                         {"options": {"scale": 2.0}}),
               ((), {"pair": (X, {"b": X})})]),
], ids=["keywords_defaults", "variadic", "nested"])
def test_keywords_defaults_varargs_and_structures(python_function: Callable,
                                                  calls: list) -> None:
    plain, compiled = tf.function(python_function), tl.function(python_function)
    for args, kwargs in calls:
        _same_outcome(plain, compiled, *args, **kwargs)
    assert _launched(compiled)


def test_nested_input_signature() -> None:
    signature = [(SPEC, {"b": tf.TensorSpec([None], tf.float32)})]
    plain = tf.function(_nested, input_signature=signature)
    compiled = tl.function(_nested, input_signature=signature)
    _same_outcome(plain, compiled, (X, {"b": X[0]}))
    _same_outcome(plain, compiled, (X, {"b": X}))  # wrong rank
    _same_outcome(plain, compiled, (X,))  # wrong structure
    assert compiled.input_signature == plain.input_signature


def test_introspection_matches_tf() -> None:
    plain = tf.function(_keywords, reduce_retracing=True)
    compiled = tl.function(_keywords, reduce_retracing=True)
    assert compiled.python_function is _keywords is plain.python_function
    assert compiled.function_type == plain.function_type
    assert compiled.function_spec.fullargspec == plain.function_spec.fullargspec
    assert compiled.input_signature is plain.input_signature is None
    for x in (X, X[:1], X[:2]):
        _same_outcome(plain, compiled, tf.constant(x), scale=3.0)
    # TF's own traces of the signatures called: the listing re-traces each compiled
    # signature through TF's own function, which relaxes shapes as plain TF's did.
    assert compiled.pretty_printed_concrete_signatures() == \
        plain.pretty_printed_concrete_signatures()
    assert isinstance(compiled, tf.types.experimental.PolymorphicFunction)


def test_get_concrete_function_with_specs_and_values() -> None:
    plain, compiled = tf.function(_body), tl.function(_body, jit_compile=True)
    for args in ((SPEC,), (tf.constant(X),), (SPEC, 3.0)):
        expected, concrete = plain.get_concrete_function(*args), compiled.get_concrete_function(
            *args)
        assert concrete.structured_outputs.shape == expected.structured_outputs.shape
        assert any(op.type == "TfxlaLiteLaunch" for op in concrete.graph.get_operations())
        assert_close(concrete(tf.constant(X)).numpy(), expected(tf.constant(X)).numpy(), "Tanh")
    with_signature = Scaled(2.0)
    concrete = with_signature.compiled.get_concrete_function()
    # The compiled program's arguments are positional (`args_0`), TF's are named.
    assert [spec.shape for spec in concrete.structured_input_signature[0]] == \
        [spec.shape for spec in with_signature.plain.get_concrete_function()
         .structured_input_signature[0]]
    with pytest.raises(TypeError):
        with_signature.compiled.get_concrete_function(tf.TensorSpec([None, 5]))
    with pytest.raises(TypeError):
        with_signature.plain.get_concrete_function(tf.TensorSpec([None, 5]))


class Layer(tf.keras.layers.Layer):
    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(shape=(input_shape[-1], 3), initializer="ones")

    @tl.function(input_signature=[SPEC])
    def project(self, x):
        return tf.tanh(tf.matmul(x, self.kernel) * 0.1 + 1.0) * 2.0 - 1.0


def test_keras_layer_method() -> None:
    layer = Layer()
    layer.build((None, 4))
    expected = tf.tanh(tf.matmul(X, layer.kernel) * 0.1 + 1.0) * 2.0 - 1.0
    assert_close(layer.project(X).numpy(), expected.numpy(), "Tanh")
    assert_close(layer.project(x=tf.constant(X)).numpy(), expected.numpy(), "Tanh")
    assert _launched(layer.project)


def test_patched_tf_function_as_a_method_decorator() -> None:
    tl.enable(tl.Options(auto_jit=2))
    try:
        class Patched(tf.Module):
            scale = 2.0

            @tf.function(input_signature=[SPEC])
            def signed(self, x):
                return _body(x, self.scale)

            @tf.function
            def free(self, x, scale=1.0):
                return _body(x, scale)

            @tf.function(jit_compile=True, reduce_retracing=True)
            def must(self, x):
                return _body(x, self.scale)
    finally:
        tl.disable()
    module = Patched()
    expected = tf.function(_body)
    for method, kwargs in ((module.signed, {}), (module.must, {}), (module.free, {"scale": 2.0})):
        assert isinstance(method, Function)
        assert_close(method(tf.constant(X), **kwargs).numpy(),
                     expected(tf.constant(X), 2.0).numpy(), "Tanh")
        assert _launched(method)
    with pytest.raises(TypeError, match="Can not cast"):
        module.signed(tf.ones([2, 5]))
