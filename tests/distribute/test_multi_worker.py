"""MultiWorkerMirroredStrategy over 2 worker processes on loopback (`cluster.py`).

Each worker (`scripts/mwms_worker.py`) trains the same model from the same seed in
plain TF and with tfxla-lite under one strategy; worker 0 also trains without a
strategy on the global batch. Compiled runs must give plain TF's per-step losses and
final weights under the strategy and the single-process ones, the all-reduce must stay
a TF op between compiled clusters, and launch ops must actually run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import cluster  # noqa: E402

_SCRIPT = Path(__file__).parent / "scripts" / "mwms_worker.py"
RTOL = 1e-5


def _train(scenario: str, tmp_path: Path, env: dict[str, str] | None = None) -> list[dict]:
    cluster.run_cluster(_SCRIPT, {"worker": 2}, [scenario, str(tmp_path)], tmp_path / "logs",
                        timeout=240, env=env)
    return [json.loads((tmp_path / f"worker_{i}.json").read_text()) for i in range(2)]


def assert_same_training(got: dict, want: dict) -> None:
    """Per-step losses and final weights within RTOL relative; entries near zero (far
    below the largest weight of their tensor) within RTOL of that largest weight."""
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=RTOL)
    assert len(got["weights"]) == len(want["weights"])
    for g, w in zip(got["weights"], want["weights"]):
        w = np.asarray(w)
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL * 0.1 * np.abs(w).max())


def assert_compiled_around_collectives(run: dict, steps: int) -> None:
    assert run["clusters"] >= 2, run
    assert run["launches_run"] >= steps * 2, run  # every step ran its launch ops
    assert run["collectives_in_tf"] and not run["collectives_in_clusters"], run
    assert "CollectiveReduceV2" in run["collectives_in_tf"]
    assert run["collectives_between_clusters"] >= 1, run


def test_custom_training_loop_two_workers(tmp_path: Path) -> None:
    """A `tl.function(jit_compile=True)` step around `strategy.run`: the gradients'
    all-reduce stays in TF between launch ops (auto-clustering: the autojit tests)."""
    workers = _train("ctl", tmp_path)
    assert all(w["replicas"] == 2 for w in workers)
    for worker in workers:
        run = worker["tfxla_lite_ctl"]
        assert_same_training(run, worker["tf_ctl"])
        assert_same_training(run, workers[0]["single_ctl"])
        assert_compiled_around_collectives(run, steps=len(run["losses"]))
    # Synchronous: both workers hold the same model.
    assert_same_training(workers[1]["tfxla_lite_ctl"], workers[0]["tfxla_lite_ctl"])


@pytest.fixture(scope="module")
def autojit_workers(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _train("autojit", tmp_path_factory.mktemp("autojit"),
                  env={"TFXLA_LITE_FLAGS": "--auto_jit=2"})


@pytest.mark.slow
def test_auto_jit_flag_custom_training_loop(autojit_workers: list[dict]) -> None:
    """`TFXLA_LITE_FLAGS=--auto_jit=2`, a script that never names tfxla-lite."""
    for worker in autojit_workers:
        assert_same_training(worker["tfxla_lite_ctl"], worker["tf_ctl"])
        assert_same_training(worker["tfxla_lite_ctl"], autojit_workers[0]["single_ctl"])
        assert_compiled_around_collectives(worker["tfxla_lite_ctl"], steps=4)


@pytest.mark.slow
def test_auto_jit_flag_keras_fit_matches(autojit_workers: list[dict]) -> None:
    """Keras `fit` with `model.compile(jit_compile=True)`: plain TF's losses and weights.
    Each worker logs the running mean loss of its own half of the batch (the workaround
    for Keras 3's fit under this strategy), so their mean is the single process's."""
    for worker in autojit_workers:
        assert_same_training(worker["tfxla_lite_fit"], worker["tf_fit"])
    mean_losses = np.mean([w["tfxla_lite_fit"]["losses"] for w in autojit_workers], axis=0)
    np.testing.assert_allclose(mean_losses, autojit_workers[0]["single_fit"]["losses"],
                               rtol=RTOL)
    assert_same_training({**autojit_workers[0]["tfxla_lite_fit"], "losses": []},
                         {**autojit_workers[0]["single_fit"], "losses": []})
    run = autojit_workers[0]["tfxla_lite_fit"]
    assert run["clusters"] >= 2 and not run["collectives_in_clusters"], run


@pytest.mark.slow
def test_auto_jit_flag_keras_fit_runs_launch_ops(autojit_workers: list[dict]) -> None:
    """Keras's train step runs compiled inside its loop function (its tf.custom_gradient,
    the all-reduce, feeds only the optimizer's updates), and the loop function itself is
    auto-clustered: launch ops run at every step on both workers, around the all-reduce."""
    for worker in autojit_workers:
        run = worker["tfxla_lite_fit"]
        assert_compiled_around_collectives(run, steps=len(run["losses"]))
