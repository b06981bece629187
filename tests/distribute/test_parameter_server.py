"""ParameterServerStrategy with a ClusterCoordinator: chief, 2 workers and 1 PS as
processes on loopback (`cluster.py`, `scripts/ps_task.py`).

A scheduled step runs in a worker process with its variables on the PS, and a launch
op runs only in the process that compiled it: a `tl.function` step is left to TF
(`tfxla_lite/distributed.py`), so it trains as plain TF does, with the reason in its
report; under `strict_jit_compile` it raises that reason instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import cluster  # noqa: E402

_SCRIPT = Path(__file__).parent / "scripts" / "ps_task.py"


@pytest.mark.slow
def test_parameter_server_strategy_steps_are_left_to_tf_with_the_reason(
        tmp_path: Path) -> None:
    outputs = cluster.run_cluster(_SCRIPT, {"chief": 1, "worker": 2, "ps": 1}, [str(tmp_path)],
                                  tmp_path / "logs", timeout=240, wait_for=("chief",))
    result = json.loads((tmp_path / "chief.json").read_text())
    plain = result["tf"]
    assert "error" not in plain, plain
    for name in ("tfxla_lite", "tfxla_lite_auto"):
        run = result[name]
        assert "error" not in run, run
        np.testing.assert_allclose(run["losses"], plain["losses"], rtol=1e-6)
        for got, want in zip(run["weights"], plain["weights"]):
            np.testing.assert_allclose(got, want, rtol=1e-6)
        assert "ParameterServerStrategy" in run["note"]
        assert "only in the process that compiled" in run["note"]
    assert result["strict"]["error"].startswith("CompilationError: tfxla-lite cannot compile "
                                                "step: ParameterServerStrategy")
    assert outputs["chief_0"].count("step runs in TensorFlow: ParameterServerStrategy") == 2
