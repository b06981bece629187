"""One task of a MultiWorkerMirroredStrategy cluster (TF_CONFIG says which).

Run by tests/distribute/test_multi_worker.py through `cluster.run_cluster`:
`python mwms_worker.py SCENARIO OUT_DIR`, writing OUT_DIR/<task>_<index>.json.

Scenarios, each training the same small model from the same seed several ways in one
process (one strategy per process: TF configures its collectives once):
- `ctl`: a custom training loop. Plain TF (`tf.function`), then `tl.function` with
  `jit_compile=True`; on worker 0, the same steps without a strategy on the global
  batch. (`autojit` covers auto-clustering.)
- `autojit`: under `TFXLA_LITE_FLAGS=--auto_jit=2` (the start-up hook patched
  `tf.function`): `fit` with `model.compile(jit_compile=True)` and the `ctl` loop with
  `tf.function`, then both in plain TF after `autojit.disable()`; on worker 0, both
  without a strategy.
- `shared_cache`: the `ctl` loop's `jit_compile=True` step, compiled by both workers at
  once into the `TFXLA_LITE_CACHE_DIR` they share, then again from the disk alone,
  with the compile caches' counters of both.
Each run records its per-step losses, final weights and, when compiled, what was
compiled and run (`Recorder.summary`). Keras 3's `fit` needs a workaround under this
strategy, in plain TF as well (`keras_symbolic_build`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras.config.disable_traceback_filtering()

import tfxla_lite as tl  # noqa: E402
from tfxla_lite import api, autojit  # noqa: E402
from tfxla_lite.runtime import loader  # noqa: E402

GLOBAL_BATCH = 16
STEPS = 4
COLLECTIVE_PREFIXES = ("Collective",)


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS, 8)).astype(np.float32)
    y = (np.sin(x).sum(axis=1, keepdims=True) * 0.3).astype(np.float32)
    return x, y


def make_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="tanh"),
                             keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])


class Recorder:
    """Every program `api.build_program` makes while active (the compiled traces), and
    the launch ops the op library ran meanwhile."""

    def __init__(self) -> None:
        self.programs: list[Any] = []
        self._build = api.build_program
        self.launches = 0

    def __enter__(self) -> Recorder:
        def recording(*args: Any, **kwargs: Any) -> Any:
            program = self._build(*args, **kwargs)
            self.programs.append(program)
            return program

        api.build_program = recording
        self._launches_before = loader.launch_timing().launches
        return self

    def __exit__(self, *exc: object) -> None:
        api.build_program = self._build
        self.launches = loader.launch_timing().launches - self._launches_before

    def summary(self) -> dict:
        """Compiled clusters and launch ops run; where the collectives are: in TF (in no
        cluster) and between compiled clusters (one among the ops their inputs come
        from, one among the ops their outputs go to), or inside a cluster."""
        clusters = clustered_ops = between = 0
        in_clusters: list[str] = []
        in_tf: list[str] = []
        for program in self.programs:
            compiled = program.report.compiled_clusters
            clusters += len(compiled)
            clustered = {name for c in compiled for name, _ in c.ops}
            clustered_ops += len(clustered)
            for op in program.graph.get_operations():
                if not op.type.startswith(COLLECTIVE_PREFIXES):
                    continue
                if op.name in clustered:
                    in_clusters.append(op.type)
                    continue
                in_tf.append(op.type)
                before = _reaches(op, clustered, lambda o: [t.op for t in o.inputs]
                                  + list(o.control_inputs))
                after = _reaches(op, clustered, lambda o: [c for t in o.outputs
                                                           for c in t.consumers()])
                between += before and after
        traces = [(p.report.function_name, len(p.report.compiled_clusters), p.report.note)
                  for p in self.programs]
        return {"clusters": clusters, "launches_run": self.launches, "traces": traces,
                "clustered_ops": clustered_ops, "collectives_in_tf": sorted(in_tf),
                "collectives_in_clusters": sorted(in_clusters),
                "collectives_between_clusters": between}


def _reaches(start: Any, clustered: set[str], neighbours: Any) -> bool:
    """Whether a clustered op is reachable from `start` through `neighbours`."""
    seen, stack = set(), list(neighbours(start))
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.name in clustered:
            return True
        stack.extend(neighbours(op))
    return False


def weights(model: keras.Model) -> list:
    return [np.asarray(w.numpy()).tolist() for w in model.weights]


# -- custom training loop -------------------------------------------------------------
def train_ctl(strategy: Any, function: Any, x: np.ndarray, y: np.ndarray) -> dict:
    """STEPS steps of SGD on the global batch split across the replicas."""
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        model = make_model()
        optimizer = keras.optimizers.SGD(0.1)

    def replica_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = tf.reduce_sum(tf.square(model(xb, training=True) - yb), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @function
    def step(xb: Any, yb: Any) -> tf.Tensor:
        losses = strategy.run(replica_step, args=(xb, yb))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    per_replica = GLOBAL_BATCH // replicas
    losses = []
    for k in range(STEPS):
        xs = x[k * GLOBAL_BATCH:(k + 1) * GLOBAL_BATCH]
        ys = y[k * GLOBAL_BATCH:(k + 1) * GLOBAL_BATCH]

        def shard(array: np.ndarray) -> Any:
            return strategy.experimental_distribute_values_from_function(
                lambda ctx, a=array: tf.constant(
                    a[ctx.replica_id_in_sync_group * per_replica:
                      (ctx.replica_id_in_sync_group + 1) * per_replica]))

        losses.append(float(step(shard(xs), shard(ys))))
    return {"losses": losses, "weights": weights(model)}


def run_ctl(strategy: Any, x: np.ndarray, y: np.ndarray, result: dict) -> None:
    result["tf_ctl"] = train_ctl(strategy, tf.function, x, y)
    with Recorder() as recorder:
        result["tfxla_lite_ctl"] = train_ctl(strategy, tl.function(jit_compile=True), x, y)
    result["tfxla_lite_ctl"].update(recorder.summary())


def run_shared_cache(strategy: Any, x: np.ndarray, y: np.ndarray, result: dict) -> None:
    """Both workers compile the same step at once into one cache folder (the strategy's
    collectives keep them in step), then each compiles it again from the disk alone."""
    from tfxla_lite.codegen import cache

    result["tf_ctl"] = train_ctl(strategy, tf.function, x, y)
    with Recorder() as recorder:
        result["tfxla_lite_ctl"] = train_ctl(strategy, tl.function(jit_compile=True), x, y)
    result["tfxla_lite_ctl"].update(recorder.summary())
    result["cold"] = dataclasses.asdict(cache.stats())
    cache.clear_memory()
    cache.reset_stats()
    with Recorder() as recorder:
        result["warm_ctl"] = train_ctl(strategy, tl.function(jit_compile=True), x, y)
    result["warm_ctl"].update(recorder.summary())
    result["warm"] = dataclasses.asdict(cache.stats())


# -- Keras fit --------------------------------------------------------------------------
class _Losses(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.losses.append(float(logs["loss"]))


def keras_symbolic_build(model: keras.Model, x: np.ndarray, y: np.ndarray) -> None:
    """Keras 3's `fit` under MultiWorkerMirroredStrategy fails, in plain TF too
    (keras-team/keras#20585): `_maybe_symbolic_build` reduces the first distributed
    batch, a tuple, with `strategy.reduce`, and each step's logs, scalars, are reduced
    across workers along an axis 0 they lack. The workaround: build the metrics and
    optimizer variables from a plain batch first, and reduce the logs over the local
    replica only (each worker logs the running mean of its own half of the batch; the
    gradients are all-reduced by the optimizer as before)."""
    from keras.src.backend.tensorflow import trainer

    model._symbolic_build(data_batch=(x[:2], y[:2]))
    model._maybe_symbolic_build = lambda *args, **kwargs: None
    trainer._collective_all_reduce_multi_worker = lambda strategy: False


def train_fit(strategy: Any, jit_compile: bool, x: np.ndarray, y: np.ndarray) -> dict:
    with strategy.scope():
        model = make_model()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit_compile)
        if strategy.extended._in_multi_worker_mode():
            keras_symbolic_build(model, x, y)
    losses = _Losses()
    model.fit(x, y, epochs=1, batch_size=GLOBAL_BATCH, shuffle=False, verbose=0,
              callbacks=[losses])
    return {"losses": losses.losses, "weights": weights(model)}


def run_autojit(strategy: Any, x: np.ndarray, y: np.ndarray, result: dict) -> None:
    """Compiled first, under the start-up hook's patch; plain TF after disabling it."""
    if not autojit.is_enabled():
        raise SystemExit("autojit scenario: TFXLA_LITE_FLAGS did not enable auto-jit")
    with Recorder() as recorder:
        result["tfxla_lite_fit"] = train_fit(strategy, True, x, y)
    result["tfxla_lite_fit"].update(recorder.summary())
    with Recorder() as recorder:
        result["tfxla_lite_ctl"] = train_ctl(strategy, tf.function, x, y)
    result["tfxla_lite_ctl"].update(recorder.summary())
    autojit.disable()
    result["tf_fit"] = train_fit(strategy, False, x, y)
    result["tf_ctl"] = train_ctl(strategy, tf.function, x, y)


def main(scenario: str, out_dir: str) -> None:
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = data()
    result: dict = {"replicas": strategy.num_replicas_in_sync}
    scenarios = {"ctl": run_ctl, "autojit": run_autojit, "shared_cache": run_shared_cache}
    scenarios[scenario](strategy, x, y, result)
    if task["index"] == 0:  # the single-process references, on the global batch
        default = tf.distribute.get_strategy()
        result["single_ctl"] = train_ctl(default, tf.function, x, y)
        if scenario == "autojit":
            result["single_fit"] = train_fit(default, False, x, y)
    path = Path(out_dir) / f"{task['type']}_{task['index']}.json"
    path.write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
