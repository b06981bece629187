"""Keras `fit` with `model.compile(jit_compile=True)` under tf.distribute.MirroredStrategy
over 2 logical CPU devices, and without a strategy: the compiled train step gives the
losses of plain TF, launch ops run at every step (counted by the op library, not found
in a graph), the collectives stay in TF and the per-replica math runs in launch ops on
both devices.

Each run is a subprocess (`scripts/mirrored_fit.py`): logical devices must be configured
before TF initializes. The reference is plain TF with `jit_compile=False`: TF's own XLA
cannot run this step (its variables live on two devices, TF's known issue
"tf.Variable on a different device").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

_SCRIPT = Path(__file__).parent / "scripts" / "mirrored_fit.py"
_ROOT = Path(__file__).resolve().parents[2]


STEPS = 6  # 3 batches (one ragged) x 2 epochs
RTOL = 1e-5


def _run(mode: str, tmp_path: Path, strategy: str = "mirrored") -> dict:
    out = tmp_path / f"{mode}_{strategy}.json"
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [str(_ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    env.pop("TFXLA_LITE_FLAGS", None)
    completed = subprocess.run([sys.executable, str(_SCRIPT), mode, str(out), strategy], env=env,
                               capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(out.read_text())


def test_mirrored_strategy_two_cpus_matches_tf(tmp_path: Path) -> None:
    plain = _run("tf", tmp_path)
    compiled = _run("tfxla_lite", tmp_path)
    print(f"\nMirroredStrategy, 2 CPUs: {compiled['op_share']:.1%} of compute ops, "
          f"{compiled['flop_share']:.1%} of FLOPs compiled; left: {compiled['left_out']}")
    _assert_same_training(compiled, plain)
    # Collectives stay in TF; the per-replica math is compiled on each replica's device.
    assert compiled["collectives_in_tf"] and not compiled["collectives_in_clusters"]
    assert any(reason.startswith("CollectiveReduceV2: collective")
               for reason in compiled["left_out"])
    devices = {d.rsplit("/", 1)[-1] for d in compiled["launch_devices"] if d}
    assert {"device:CPU:0", "device:CPU:1"} <= devices, compiled["launch_devices"]
    assert compiled["flop_share"] > 0.95


@pytest.mark.slow
def test_fit_without_strategy_runs_launch_ops(tmp_path: Path) -> None:
    """The train step holds a tf.custom_gradient (the optimizer's all-reduce, under the
    default strategy too) off its outputs: inside Keras's loop function it must still run
    compiled, not its TF trace."""
    _assert_same_training(_run("tfxla_lite", tmp_path, "none"), _run("tf", tmp_path, "none"))


def _assert_same_training(compiled: dict, plain: dict) -> None:
    assert len(compiled["losses"]) == len(plain["losses"]) == STEPS
    np.testing.assert_allclose(compiled["losses"], plain["losses"], rtol=RTOL)
    for got, want in zip(compiled["weights"], plain["weights"]):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())
    assert compiled["launches_run"] >= STEPS, compiled["launches_run"]  # ran, every step
