"""TF's softmax through the row kernel's exp of a nonpositive argument (x - max(x),
`row_kernel._nonpositive_exponentials`) against TF's own result: wide rows that take
the vectorized loops, arguments whose exponentials are denormal or round to 0, and
rows with NaN and ±inf."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf
from tolerances import assert_close

from tfxla_lite.codegen.cpu import row_kernel


def _compare(actual: np.ndarray, expected: np.ndarray, op_type: str, context: str) -> None:
    """As `test_clustering_ops`: TF's CPU softmax gives 0 beside a NaN or inf in a row,
    XLA and tfxla-lite NaN for the whole row; finite rows within the tolerance table."""
    finite_rows = np.isfinite(expected).all(axis=-1) & np.isfinite(actual).all(axis=-1)
    assert finite_rows.sum() >= expected.shape[0] - 4, context
    assert_close(actual[finite_rows], expected[finite_rows], op_type, context)
    assert np.isnan(actual[np.isnan(expected)]).all(), context


@pytest.mark.parametrize("dims", [(24, 1024), (10, 300)])
def test_softmax_of_wide_range_rows_matches_tf(dims: tuple[int, int], cache_root: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(dims[1])
    x = rng.uniform(-120.0, 120.0, size=dims).astype(np.float32)  # many exp(x - max) < 2^-126
    x[1] = rng.uniform(-3.0, 3.0, size=dims[1])
    x[2, 7] = np.nan
    x[3, :2] = np.inf
    x[4] = -np.inf
    x[5] = 0.0
    x[6, 3] = 200.0  # the rest of the row gives exp(-200..-80): 0 and denormals
    found: list[int] = []
    real = row_kernel._nonpositive_exponentials

    def counting(plan: Any, instructions: Any) -> Any:
        result = real(plan, instructions)
        found.append(len(result))
        return result

    monkeypatch.setattr(row_kernel, "_nonpositive_exponentials", counting)
    check_against_tf(lambda a: tf.nn.softmax(a, axis=-1), [x], "Softmax", compare=_compare)
    assert found and all(count == 1 for count in found)  # (an empty cache: compiled here)
