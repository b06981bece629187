"""Keras saving under `tl.enable()` (what `TFXLA_LITE_FLAGS=--auto_jit=2` does): `model.save`
(.keras) and `model.export` (a SavedModel through Keras' ExportArchive, whose endpoints are
made by the patched `tf.function`), restored with `keras.models.load_model` and
`tf.saved_model.load`. The oracle is the same model saved by plain TF: same predictions,
and the exported SavedModel holds TF's own graph, no launch op."""

from __future__ import annotations

import re
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.api import Function
from tfxla_lite.stats import PROCESS_STATS

X = np.linspace(-1.0, 1.0, 48, dtype=np.float32).reshape(6, 8)
Y = np.linspace(0.0, 1.0, 12, dtype=np.float32).reshape(6, 2)


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, "tanh"),
                              keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _train_save_export(path: Path) -> tuple[keras.Model, np.ndarray]:
    path.mkdir()
    model = _model()
    model.fit(X, Y, batch_size=3, epochs=1, verbose=0)
    predicted = model.predict(X, verbose=0)
    model.save(path / "model.keras")
    model.export(str(path / "exported"), verbose=False)
    return model, predicted


def test_keras_save_and_export_under_tfxla_lite(tmp_path: Path) -> None:
    _, plain_predicted = _train_save_export(tmp_path / "plain")
    tl.enable(tl.Options(auto_jit=2))
    try:
        model, predicted = _train_save_export(tmp_path / "compiled")
        assert isinstance(model.predict_function, Function)
        reloaded = keras.models.load_model(tmp_path / "compiled" / "model.keras")
        clusters = PROCESS_STATS.clusters_compiled
        reloaded_predicted = reloaded.predict(X, verbose=0)
        # The reloaded model's predict step is compiled again.
        assert isinstance(reloaded.predict_function, Function)
        assert PROCESS_STATS.clusters_compiled > clusters
    finally:
        tl.disable()
    np.testing.assert_allclose(predicted, plain_predicted, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reloaded_predicted, plain_predicted, rtol=1e-5, atol=1e-6)

    graph = (tmp_path / "compiled" / "exported" / "saved_model.pb").read_bytes()
    assert b"TfxlaLite" not in graph
    exported = tf.saved_model.load(str(tmp_path / "compiled" / "exported"))
    plain = tf.saved_model.load(str(tmp_path / "plain" / "exported"))
    # Keras numbers its input names per process (keras_tensor, keras_tensor_3).
    unnamed = {re.sub(r"name='[^']*'", "", loaded.serve.pretty_printed_concrete_signatures())
               for loaded in (exported, plain)}
    assert len(unnamed) == 1, unnamed
    np.testing.assert_allclose(exported.serve(X).numpy(), plain.serve(X).numpy(),
                               rtol=1e-5, atol=1e-6)
