"""Keras's own tests, one Keras test file a test, under `--auto_jit=2`: no test may fail that
passes under plain TF (`tfxla_lite.keras_suite`, `scripts/keras_suite.sh`). The layer
tests' files, and those of the folders whole models go through (`keras_suite.MODEL_FOLDERS`:
fit/evaluate/predict, models, optimizers, losses, metrics, saving, callbacks, TF's backend).

Marked `slow` and `slow_rotation(5)`: CI's `-m slow --slow-slice=12` runs one in 60 of the
files each day (about three, a few minutes), the whole of both over sixty days. The full
runs' figures are in docs/keras_suite.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tfxla_lite import keras_suite

ROOT = keras_suite.site_packages_of_keras()
FILES = keras_suite.discover(ROOT) if ROOT else []
MODEL_FILES = keras_suite.discover(ROOT, models=True) if ROOT else []


def _name(path: str) -> str:
    return path.removeprefix(keras_suite.LAYERS + "/").removeprefix(keras_suite.SRC + "/")


def _check(path: str, tmp_path: Path) -> None:
    assert ROOT is not None
    result = keras_suite.run_suite([path], tmp_path, root=ROOT, echo=False)
    assert result.flagged, f"no test of {path} reported (logs in {tmp_path})"
    assert not result.tfxla_lite_only, "\n".join(
        [keras_suite.summary(result), *keras_suite.report_lines(result)])


@pytest.mark.slow
@pytest.mark.slow_rotation(5)
@pytest.mark.parametrize("path", FILES, ids=_name)
def test_keras_layer_tests_pass_as_under_plain_tf(path: str, tmp_path: Path) -> None:
    _check(path, tmp_path)


@pytest.mark.slow
@pytest.mark.slow_rotation(5)
@pytest.mark.parametrize("path", MODEL_FILES, ids=_name)
def test_keras_model_tests_pass_as_under_plain_tf(path: str, tmp_path: Path) -> None:
    _check(path, tmp_path)
