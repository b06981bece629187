"""The rewrite cache's key and the lowered HLO do not depend on the process: hash
randomization (PYTHONHASHSEED), function-name counters and node-name uniquifiers must
give a warm process the cold process's key (tfxla_lite/rewrite_cache.py), else every
warm start misses. Checked for the seed `mlp` example and a Keras model's train step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite import rewrite_cache
from tfxla_lite.codegen import cache

# Builds both workloads; shared by the in-process test (exec) and the child processes.
WORKLOADS = textwrap.dedent("""
    import keras
    import numpy as np
    import tensorflow as tf
    from tfxla_lite.examples import mlp

    def workloads():
        rng = np.random.default_rng(0)
        mlp_args = [tf.constant(rng.standard_normal(s).astype(np.float32))
                    for s in [(8, 16), (16, 32), (32,), (32, 4), (4,)]]
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(4)])
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)

        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        step_args = [tf.constant(rng.standard_normal(s).astype(np.float32))
                     for s in [(8, 16), (8, 4)]]
        return {"mlp": (mlp, mlp_args), "keras_step": (train_step, step_args)}
""")

CHILD = WORKLOADS + textwrap.dedent("""
    import json, sys
    import tfxla_lite as tl
    from tfxla_lite import rewrite_cache

    keys = []
    original = rewrite_cache.rewrite_key
    rewrite_cache.rewrite_key = lambda *a, **k: keys.append(original(*a, **k)) or keys[-1]
    result = {}
    for name, (fn, args) in workloads().items():
        function = tl.function(fn, min_cluster_size=1)
        hlo = function.experimental_get_compiler_ir(*args)("hlo")
        result[name] = {"key": keys[-1], "hlo": hlo}
    print(json.dumps(result))
""")


def _fresh_process(seed: str, cache_dir: Path) -> dict[str, dict[str, str]]:
    env = {**os.environ, "PYTHONHASHSEED": seed, "TFXLA_LITE_CACHE_DIR": str(cache_dir),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TFXLA_LITE_CACHE", None)
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two processes that import TensorFlow and Keras
def test_fresh_processes_with_other_hash_seeds_agree(tmp_path: Path) -> None:
    # Each process starts from an empty cache folder: both trace, lower and compile.
    first, second = (_fresh_process(seed, tmp_path / seed) for seed in ("0", "4242"))
    assert sorted(first) == sorted(second) == ["keras_step", "mlp"]
    for name in first:
        assert first[name]["key"] == second[name]["key"], name
        assert "ENTRY" in first[name]["hlo"], name
        assert first[name]["hlo"] == second[name]["hlo"], name
    # ... and each wrote its entries under those keys (the manifests' "key"; the file
    # names also hash the sources, which a concurrent edit of the tree may change).
    written = [sorted(json.loads(p.read_bytes().split(b"\n", 1)[0])["key"]
                      for p in (tmp_path / seed / "rewrites").iterdir()) for seed in ("0", "4242")]
    assert written[0] == written[1]
    assert {first["mlp"]["key"], first["keras_step"]["key"]} <= set(written[0])


def test_a_second_trace_in_one_process_has_the_same_key_and_hlo(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast variant: other function-name counters and Keras name scopes (a second trace
    of the same function in one process) give the same key; the second build hits."""
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TFXLA_LITE_CACHE", raising=False)
    cache.clear_memory()
    keys: list[str] = []
    original = rewrite_cache.rewrite_key
    monkeypatch.setattr(rewrite_cache, "rewrite_key",
                        lambda *a, **k: keys.append(original(*a, **k)) or keys[-1])
    namespace: dict = {}
    exec(WORKLOADS, namespace)  # noqa: S102 - the same source as the child processes'
    for name, (fn, args) in namespace["workloads"]().items():
        texts = []
        for _ in range(2):
            before = cache.stats()
            function = tl.function(fn, min_cluster_size=1)
            texts.append(function.experimental_get_compiler_ir(*args)("hlo"))
            hits = cache.stats().rewrite_hits - before.rewrite_hits
        assert keys[-1] == keys[-2], name
        assert hits == 1, name
        assert "ENTRY" in texts[0] and texts[0] == texts[1], name
    assert tf.executing_eagerly()
    np.testing.assert_equal(len(keys), 4)


@tf.custom_gradient
def _clipped(x):
    return tf.identity(x), lambda dy: tf.clip_by_value(dy, -1.0, 1.0)


def _with_custom_gradient(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(_clipped(x * 3.0) * _clipped(x))
    return tape.gradient(y, x)


def test_custom_gradient_counters_do_not_change_the_fingerprint() -> None:
    """Each trace numbers its custom gradients from TF's process-wide counter; the
    fingerprint numbers them by first appearance and leaves the GraphDef as it was."""
    spec = tf.TensorSpec((3,), tf.float32)
    graph_defs = [tf.function(_with_custom_gradient).get_concrete_function(spec)
                  .graph.as_graph_def() for _ in range(2)]
    names = [sorted({n.attr["_gradient_op_type"].s for n in g.node
                     if "_gradient_op_type" in n.attr}) for g in graph_defs]
    assert len(names[0]) == 2 and names[0] != names[1]  # what the fingerprint must ignore
    copies = [tf.compat.v1.GraphDef.FromString(g.SerializeToString()) for g in graph_defs]
    assert (rewrite_cache.graph_fingerprint(graph_defs[0])
            == rewrite_cache.graph_fingerprint(graph_defs[1]))
    assert graph_defs == copies  # restored: the rewrite still names this process's gradients
    # A graph that differs elsewhere still has another fingerprint.
    other = tf.function(lambda x: _with_custom_gradient(x) + 1.0).get_concrete_function(spec)
    assert (rewrite_cache.graph_fingerprint(other.graph.as_graph_def())
            != rewrite_cache.graph_fingerprint(graph_defs[0]))
