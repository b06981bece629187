"""`tf.saved_model.save` of modules whose functions are tfxla-lite's writes TF's own traces
(tfxla_lite/api.py: `Function` is a subclass of TF's `Function`; its listing for the saver
and `get_concrete_function` inside a save give TF's traces, `_CompiledConcreteFunction`
calls TF's trace while a signature is traced). The oracle is the same module with plain
`tf.function`: same signatures saved, same results after loading, no launch op in the
SavedModel, and it loads in a process that never imports tfxla-lite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.api import Function

SPEC = tf.TensorSpec([None, 4], tf.float32)
X = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)


def _body(x: Any, v: Any, scale: Any = 2.0) -> Any:
    return tf.reduce_sum(tf.tanh(x * v) * scale + 1.0, axis=1)


def _module(decorate: Any) -> tf.Module:
    """One module, decorated by `tl.function` or `tf.function`: a method with an
    input_signature, one without (called, and asked for a concrete function), and a
    function held as an attribute."""

    class Model(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.v = tf.Variable(np.linspace(0.5, 1.5, 4, dtype=np.float32))
            self.attribute = decorate(lambda x: _body(x, self.v, 3.0))

        @decorate(input_signature=[SPEC], jit_compile=True)
        def signed(self, x):
            return _body(x, self.v)

        @decorate
        def free(self, x, scale=2.0):
            return _body(x, self.v, scale)

    model = Model()
    model.free(tf.constant(X))
    model.free(tf.constant(X[:2]), scale=3.0)
    model.free.get_concrete_function(SPEC)
    model.attribute(tf.constant(X))
    return model


def _save(model: tf.Module, path: Path) -> None:
    signatures = {"serving_default": model.signed,
                  "free": model.free.get_concrete_function(SPEC)}
    tf.saved_model.save(model, str(path), signatures=signatures)


def _calls(loaded: Any) -> dict[str, np.ndarray]:
    x = tf.constant(X)
    return {"signed": loaded.signed(x).numpy(), "free": loaded.free(x).numpy(),
            "free_scaled": loaded.free(x[:2], scale=3.0).numpy(),
            "free_spec": loaded.free(tf.constant(X[:1])).numpy(),
            "attribute": loaded.attribute(x).numpy(),
            "serving": loaded.signatures["serving_default"](x=x)["output_0"].numpy()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    paths = {}
    for name, decorate in (("plain", tf.function), ("compiled", tl.function)):
        model = _module(decorate)
        if name == "compiled":
            assert isinstance(model.signed, Function)
            assert any(p.has_launches for p in model.free._programs.values())
        paths[name] = tmp_path_factory.mktemp(name)
        _save(model, paths[name])
    return paths


def test_saved_model_holds_tfs_graph(saved: dict[str, Path]) -> None:
    graph = (saved["compiled"] / "saved_model.pb").read_bytes()
    assert b"TfxlaLite" not in graph
    compiled, plain = (tf.saved_model.load(str(saved[k])) for k in ("compiled", "plain"))
    for name in ("signed", "free", "attribute"):
        # The same traces, in the order each was made.
        assert sorted(getattr(compiled, name).pretty_printed_concrete_signatures()
                      .split("\n\n")) == sorted(getattr(plain, name)
                                                 .pretty_printed_concrete_signatures()
                                                 .split("\n\n")), name
    assert set(compiled.signatures) == set(plain.signatures)
    expected = _calls(plain)
    for name, value in _calls(compiled).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, err_msg=name)


_LOAD_WITHOUT_TFXLA_LITE = """
import json, sys
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
x = tf.reshape(tf.linspace(-1.0, 1.0, 12), [3, 4])
out = {"signed": loaded.signed(x).numpy().tolist(),
       "free": loaded.free(x[:2], scale=3.0).numpy().tolist(),
       "serving": loaded.signatures["serving_default"](x=x)["output_0"].numpy().tolist(),
       "tfxla_lite_imported": any(m.startswith("tfxla_lite") for m in sys.modules)}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow  # a second interpreter importing TensorFlow
def test_loads_where_tfxla_lite_is_not_imported(saved: dict[str, Path]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TFXLA_LITE_FLAGS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    done = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_TFXLA_LITE,
                           str(saved["compiled"])], env=env, capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT")]
    result = json.loads(line[len("RESULT"):])
    assert not result["tfxla_lite_imported"]
    plain = tf.saved_model.load(str(saved["plain"]))
    x = tf.constant(X)
    np.testing.assert_allclose(result["signed"], plain.signed(x).numpy(), rtol=1e-6)
    np.testing.assert_allclose(result["free"], plain.free(x[:2], scale=3.0).numpy(),
                               rtol=1e-6)
    np.testing.assert_allclose(result["serving"], plain.signed(x).numpy(), rtol=1e-6)


def test_untraced_function_is_saved_as_tf_saves_it(tmp_path: Path) -> None:
    # Neither called nor given a signature: TF saves no trace of it, and neither do we.
    for decorate, path in ((tf.function, tmp_path / "plain"), (tl.function, tmp_path / "tl")):
        module = tf.Module()
        module.f = decorate(lambda x: x * 2.0)
        tf.saved_model.save(module, str(path))
    plain, compiled = (tf.saved_model.load(str(p)) for p in (tmp_path / "plain", tmp_path / "tl"))
    with pytest.raises(ValueError) as expected:
        plain.f(tf.constant(1.0))
    with pytest.raises(type(expected.value)):
        compiled.f(tf.constant(1.0))


def test_loaded_function_recompiles_under_tfxla_lite(saved: dict[str, Path]) -> None:
    # A restored function is TF's; wrapped again, its saved graph is inlined and compiled.
    # (One saved with jit_compile=True is TF's XLA's to compile, as in plain TF:
    # `_XlaMustCompile` calls are not inlined.)
    loaded = tf.saved_model.load(str(saved["compiled"]))
    recompiled = tl.function(loaded.free)
    x = tf.constant(X)
    np.testing.assert_allclose(recompiled(x).numpy(), loaded.free(x).numpy(), rtol=1e-6)
    assert any(program.has_launches for program in recompiled._programs.values())
