"""Start a tf.distribute cluster of real processes on loopback, bounded and cleaned up.

Used by the tests in this folder and by `benchmarks/multi_worker.py`. Each task
(`worker` 0 and 1, and a `chief` and `ps` where the strategy needs them) is a process
of its own with `TF_CONFIG` naming every task at a `127.0.0.1` port picked free when
the cluster starts. Each process leads a new process group, so that a timeout or a
failure kills it and whatever it started (`os.killpg`); nothing outlives `run_cluster`.

The tasks that finish by themselves (the workers of MultiWorkerMirroredStrategy, the
chief of ParameterServerStrategy) are waited for; the servers that never return
(`server.join()`: PS and the workers under a coordinator) are killed once those are done.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Task:
    type: str
    index: int
    process: subprocess.Popen
    log: Path

    @property
    def name(self) -> str:
        return f"{self.type}_{self.index}"

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class ClusterError(AssertionError):
    """A task failed or ran past the time limit; the message holds the logs' tails."""


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 now (bound together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_spec(roles: dict[str, int]) -> dict[str, list[str]]:
    """{"worker": 2, "ps": 1} -> TF_CONFIG's "cluster" with free loopback ports."""
    ports = iter(free_ports(sum(roles.values())))
    return {role: [f"127.0.0.1:{next(ports)}" for _ in range(count)]
            for role, count in roles.items()}


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The tasks' environment: the repository importable, TF quiet, no flags inherited."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    for name in ("TFXLA_LITE_FLAGS", "TF_XLA_FLAGS", "TF_CONFIG"):
        env.pop(name, None)
    env.update(extra or {})
    return env


def run_cluster(script: Path, roles: dict[str, int], args: list[str], log_dir: Path,
                timeout: float, wait_for: tuple[str, ...] = ("worker",),
                env: dict[str, str] | None = None) -> dict[str, str]:
    """Run `script args...` as every task of a cluster of `roles`; wait (at most `timeout`
    seconds in all) for the tasks of the types in `wait_for`, then kill the rest.

    Returns each task's output by name ("worker_0", ...). Raises `ClusterError` when a
    waited task exits non-zero or the time runs out; every process group is killed
    whatever happens."""
    spec = cluster_spec(roles)
    log_dir.mkdir(parents=True, exist_ok=True)
    tasks: list[Task] = []
    try:
        for role, addresses in spec.items():
            for index in range(len(addresses)):
                config = {"cluster": spec, "task": {"type": role, "index": index}}
                log = log_dir / f"{role}_{index}.log"
                with open(log, "w") as handle:
                    process = subprocess.Popen(
                        [sys.executable, str(script), *args], cwd=str(ROOT),
                        env=environment({**(env or {}), "TF_CONFIG": json.dumps(config)}),
                        stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
                tasks.append(Task(role, index, process, log))
        waited = [task for task in tasks if task.type in wait_for]
        deadline = time.monotonic() + timeout
        while True:
            failed = [t for t in waited if t.process.poll() not in (None, 0)]
            if failed:
                raise ClusterError(_failure(f"{failed[0].name} exited with "
                                            f"{failed[0].process.returncode}", tasks))
            if all(t.process.poll() == 0 for t in waited):
                break
            if time.monotonic() > deadline:
                raise ClusterError(_failure(f"cluster ran past {timeout:.0f} s", tasks))
            # A server task dying early leaves the waited ones hanging: report it now.
            dead = [t for t in tasks if t not in waited and t.process.poll() is not None]
            if dead:
                raise ClusterError(_failure(f"{dead[0].name} exited early with "
                                            f"{dead[0].process.returncode}", tasks))
            time.sleep(0.2)
        return {task.name: task.output() for task in tasks}
    finally:
        for task in tasks:
            _kill(task.process)


def _kill(process: subprocess.Popen) -> None:
    # The whole group, even when its leader has exited: a child it started may remain
    # (a group id is not reused while the group has a member).
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent
        pass


def _failure(what: str, tasks: list[Task]) -> str:
    tails = "\n".join(f"--- {t.name} ---\n{t.output()[-2500:]}" for t in tasks)
    return f"{what}\n{tails}"
