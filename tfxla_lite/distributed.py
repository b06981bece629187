"""tf.distribute's multi-process strategies as tfxla-lite sees them (docs/distributed.md).

`api.Function` asks `remote_refusal()` before it compiles a trace: a trace made for
`ParameterServerStrategy`'s `ClusterCoordinator.schedule` runs in a worker process,
where this process's launch ops are not registered, so it is left to TensorFlow
(MultiWorkerMirroredStrategy's replica steps compile in each worker, nothing special).
`dump` names each task's files with `task_tag()`, from `TF_CONFIG`, else the current
strategy's cluster resolver (TF imported only if it is loaded already).
"""

from __future__ import annotations

import json
import os
import re
import sys

PARAMETER_SERVER_REFUSAL = (
    "ParameterServerStrategy: ClusterCoordinator.schedule runs this trace in a worker "
    "process, with its variables on the parameter servers, and a tfxla-lite launch op "
    "runs only in the process that compiled its cluster (the executable is registered "
    "in that process's op library)")


def remote_refusal() -> str | None:
    """Why a trace made now would run in another process, or None: under a
    ParameterServerStrategy's scope (where the coordinator traces what it schedules)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    from tensorflow.python.distribute import parameter_server_strategy_v2

    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, parameter_server_strategy_v2.ParameterServerStrategyV2):
        return PARAMETER_SERVER_REFUSAL
    return None


def task_tag() -> str:
    """"<type>_<index>" of this process's task ("worker_1", "chief_0"), or "" outside a
    multi-process cluster (no task in TF_CONFIG, no cluster resolver with a task)."""
    task = _task_from_tf_config()
    if task is None:
        task = _task_from_strategy()
    if task is None:
        return ""
    task_type, index = task
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{task_type}_{index}")


def _task_from_tf_config() -> tuple[str, int] | None:
    text = os.environ.get("TF_CONFIG")
    if not text:
        return None
    try:
        task = json.loads(text).get("task") or {}
        task_type, index = task.get("type"), task.get("index", 0)
    except (ValueError, AttributeError):
        return None  # TF itself reports a malformed TF_CONFIG
    if not isinstance(task_type, str) or not task_type:
        return None
    return task_type, int(index)


def _task_from_strategy() -> tuple[str, int] | None:
    tf = sys.modules.get("tensorflow")
    if tf is None or not tf.distribute.has_strategy():
        return None
    resolver = getattr(tf.distribute.get_strategy(), "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type:
        return None
    return str(task_type), int(getattr(resolver, "task_id", 0) or 0)
