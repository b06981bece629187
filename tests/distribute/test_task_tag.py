"""Each task of a tf.distribute cluster names its dumps and report after itself
(`tfxla_lite.distributed.task_tag`), read from TF_CONFIG; in-process, no cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite import distributed


def _config(task_type: str, index: int) -> str:
    return json.dumps({"cluster": {task_type: [f"127.0.0.1:{2000 + i}" for i in range(2)]},
                       "task": {"type": task_type, "index": index}})


@pytest.mark.parametrize("config, tag", [
    (None, ""),
    ("", ""),
    (_config("worker", 1), "worker_1"),
    (_config("chief", 0), "chief_0"),
    (json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}}), ""),  # no task
    ("{not json", ""),  # TF reports it when a strategy reads it
])
def test_task_tag_from_tf_config(monkeypatch: pytest.MonkeyPatch, config: str | None,
                                 tag: str) -> None:
    if config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", config)
    assert distributed.task_tag() == tag


def test_dumps_and_report_carry_the_task(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.setenv("TF_CONFIG", _config("worker", 1))

    def step(x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.tanh(x) * 2.0 + x, axis=1)

    f = tl.function(step, options=tl.Options(dump_to=str(tmp_path), min_cluster_size=1))
    x = tf.ones([3, 4])
    tf.debugging.assert_near(f(x), tf.function(step)(x))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "worker_1.report.html" in files, files
    assert all(name.startswith("worker_1.") for name in files), files
    assert any(name.startswith("worker_1.module_0") and name.endswith(".ir-with-opt.ll")
               for name in files), files
    assert str(f.explain(x)).splitlines()[0].endswith(" on worker_1")


def test_no_refusal_outside_parameter_server_strategy() -> None:
    assert distributed.remote_refusal() is None
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        assert distributed.remote_refusal() is None
