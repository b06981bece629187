"""`cluster.run_cluster`, the launcher of the multi-process tests, without TF: tasks see
their TF_CONFIG, a failure or a timeout raises with the logs, and no process (nor a
child it started) outlives the call."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import cluster  # noqa: E402

# A task: writes its TF_CONFIG and pid (and its child's) under OUT, then acts on its
# type's behaviour: "ok" exits 0, "fail" exits 3, "hang" and servers sleep on, with a
# child of their own.
_TASK = r"""
import json, os, subprocess, sys, time
out, behaviour = sys.argv[1], json.loads(sys.argv[2])
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
name = f"{task['type']}_{task['index']}"
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.path.join(out, name + ".json"), "w") as f:
    json.dump({"config": config, "pids": [os.getpid(), child.pid]}, f)
what = behaviour.get(name, "hang")
if what == "ok":
    child.kill()
    sys.exit(0)
if what == "fail":
    print("task failed on purpose", flush=True)
    sys.exit(3)
time.sleep(600)
"""


def _run(tmp_path: Path, behaviour: dict[str, str], timeout: float = 60) -> dict[str, str]:
    script = tmp_path / "task.py"
    script.write_text(_TASK)
    return cluster.run_cluster(script, {"chief": 1, "worker": 2, "ps": 1},
                               [str(tmp_path), json.dumps(behaviour)], tmp_path / "logs",
                               timeout=timeout, wait_for=("chief", "worker"))


def _pids(tmp_path: Path) -> list[int]:
    return [pid for f in tmp_path.glob("*.json") for pid in json.loads(f.read_text())["pids"]]


def _assert_all_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        time.sleep(0.1)
    assert not alive, f"left running: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone but not yet reaped
        return stat.read().split(") ")[-1][0] != "Z"


def test_tasks_get_their_tf_config_and_servers_are_killed(tmp_path: Path) -> None:
    _run(tmp_path, {"chief_0": "ok", "worker_0": "ok", "worker_1": "ok"})
    configs = {f.stem: json.loads(f.read_text())["config"] for f in tmp_path.glob("*.json")}
    assert set(configs) == {"chief_0", "worker_0", "worker_1", "ps_0"}
    spec = configs["ps_0"]["cluster"]
    addresses = [a for role in ("chief", "worker", "ps") for a in spec[role]]
    assert len(spec["worker"]) == 2 and len(set(addresses)) == 4
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert all(c["cluster"] == spec for c in configs.values())
    assert configs["worker_1"]["task"] == {"type": "worker", "index": 1}
    _assert_all_gone(_pids(tmp_path))  # the PS, and every task's child


def test_a_failed_task_raises_with_its_log_and_nothing_is_left(tmp_path: Path) -> None:
    with pytest.raises(cluster.ClusterError, match=r"(?s)worker_1 exited with 3.*"
                                                   r"task failed on purpose"):
        _run(tmp_path, {"chief_0": "ok", "worker_0": "hang", "worker_1": "fail"})
    _assert_all_gone(_pids(tmp_path))


def test_a_hanging_cluster_times_out_and_nothing_is_left(tmp_path: Path) -> None:
    with pytest.raises(cluster.ClusterError, match="ran past 3 s"):
        _run(tmp_path, {}, timeout=3)
    _assert_all_gone(_pids(tmp_path))
