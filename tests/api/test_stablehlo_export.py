"""A tl.function's compiled clusters as StableHLO: `experimental_get_compiler_ir(...)
(stage='stablehlo')`, one module per cluster; with JAX at hand (slow), JAX's XLA runs the
text on the function's inputs and gives TF's numbers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl

HLO_TESTS = Path(__file__).resolve().parents[1] / "hlo"


def _solve(matrix: tf.Tensor, rhs: tf.Tensor) -> tf.Tensor:
    factor = tf.linalg.cholesky(matrix)
    return tf.nn.relu(tf.linalg.triangular_solve(factor, rhs) * 2.0)


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 4)).astype(np.float32)
    return [x @ np.swapaxes(x, 1, 2) + 4 * np.eye(4, dtype=np.float32),
            rng.standard_normal((2, 4, 3)).astype(np.float32)]


def test_stablehlo_stage_prints_each_cluster() -> None:
    compiled = tl.function(_solve, jit_compile=True)
    args = _inputs()
    text = compiled.experimental_get_compiler_ir(*args)(stage="stablehlo")
    assert len(re.findall(r"^module @cluster_\d+ \{$", text, re.M)) == 1
    assert "func.func public @main(%arg0: tensor<2x4x4xf32>, %arg1: tensor<2x4x3xf32>) -> " \
           "(tensor<2x4x3xf32>)" in text
    for op in ("stablehlo.cholesky", "stablehlo.triangular_solve", "stablehlo.maximum"):
        assert f'"{op}"' in text


@pytest.mark.slow
def test_jax_runs_the_stage_with_tf_numbers(tmp_path: Path) -> None:
    sys.path.insert(0, str(HLO_TESTS))
    from test_stablehlo_jax import RUNNER, _jax_python

    python = _jax_python()
    compiled = tl.function(_solve, jit_compile=True)
    args = _inputs()
    text = compiled.experimental_get_compiler_ir(*args)(stage="stablehlo")
    np.savez(tmp_path / "cases.npz", count=np.array(1), text_0=np.array(text),
             input_0_0=args[0], input_0_1=args[1])
    subprocess.run([python, str(RUNNER), str(tmp_path / "cases.npz"),
                    str(tmp_path / "results.npz")], check=True, timeout=600)
    results = np.load(tmp_path / "results.npz")
    assert "error_0" not in results, str(results["error_0"])
    expected = _solve(*[tf.constant(a) for a in args]).numpy()
    assert_close(results["output_0_0"], expected, "MatrixTriangularSolve")
