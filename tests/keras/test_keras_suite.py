"""Keras's own layer tests, one Keras test file a test, under `--auto_jit=2`: no test may fail
that passes under plain TF (`tfxla_lite.keras_suite`, `scripts/keras_suite.sh`).

Marked `slow` and `slow_rotation(5)`: CI's `-m slow --slow-slice=12` runs one in 60 of the
files each day (about two, a few minutes), the whole layer suite over sixty days. The full
run's figures are in docs/keras_suite.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tfxla_lite import keras_suite

ROOT = keras_suite.site_packages_of_keras()
FILES = keras_suite.discover(ROOT) if ROOT else []


def _name(path: str) -> str:
    return path.removeprefix(keras_suite.LAYERS + "/")


@pytest.mark.slow
@pytest.mark.slow_rotation(5)
@pytest.mark.parametrize("path", FILES, ids=_name)
def test_keras_layer_tests_pass_as_under_plain_tf(path: str, tmp_path: Path) -> None:
    assert ROOT is not None
    result = keras_suite.run_suite([path], tmp_path, root=ROOT, echo=False)
    assert result.flagged, f"no test of {path} reported (logs in {tmp_path})"
    assert not result.tfxla_lite_only, "\n".join(
        [keras_suite.summary(result), *keras_suite.report_lines(result)])
