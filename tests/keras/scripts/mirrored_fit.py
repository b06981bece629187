"""Train a small Keras model under tf.distribute.MirroredStrategy over 2 logical CPUs.

Run by tests/keras/test_distribute.py in a subprocess, since logical devices must be
configured before TF initializes. `python mirrored_fit.py tf|tfxla_lite OUT.json
[mirrored|none]`: `tf` trains with plain TF (jit_compile=False: TF's own XLA cannot run
this step on the CPU, its variables live on two devices), `tfxla_lite` with
`tl.enable()` and `jit_compile=True`; under the MirroredStrategy (default) or none.
Writes the per-step losses, the final weights and, for tfxla_lite, what was compiled
where and how many launch ops ran during `fit`.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from tfxla_lite import api, coverage  # noqa: E402
from tfxla_lite.rewrite import LAUNCH_OP_TYPES  # noqa: E402
from tfxla_lite.runtime import loader  # noqa: E402

COLLECTIVE_PREFIXES = ("Collective", "NcclAllReduce")


class _Losses(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.losses.append(float(logs["loss"]))


def main(mode: str, out: str, strategy_name: str = "mirrored") -> None:
    compiled = mode == "tfxla_lite"
    strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
                if strategy_name == "mirrored" else tf.distribute.get_strategy())
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="tanh"),
                                  keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=compiled)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(50, 8)).astype(np.float32)  # batches of 20, 20 and a ragged 10
    y = (np.sin(x).sum(axis=1)[:, None] * 0.3).astype(np.float32)
    losses = _Losses()

    programs = []
    build = api.build_program

    def recording_build(*args, **kwargs):  # type: ignore[no-untyped-def]
        program = build(*args, **kwargs)
        programs.append(program)
        return program

    if compiled:
        api.build_program = recording_build
        tl.enable()
    before = loader.launch_timing().launches if compiled else 0
    with coverage.record() as recorded:
        model.fit(x, y, epochs=2, batch_size=20, shuffle=False, verbose=0, callbacks=[losses])
    result = {"losses": losses.losses, "weights": [w.numpy().tolist() for w in model.weights]}
    if compiled:
        launch_devices: list[str] = []
        collectives_in_clusters: list[str] = []
        collectives_in_tf: list[str] = []
        for program in programs:
            clustered = {name for c in program.report.compiled_clusters for name, _ in c.ops}
            for op in program.graph.get_operations():
                if op.type.startswith(COLLECTIVE_PREFIXES):
                    (collectives_in_clusters if op.name in clustered
                     else collectives_in_tf).append(op.type)
            if program.concrete_run is not None:
                launch_devices += [op.device for op in program.concrete_run.graph.get_operations()
                                   if op.type in LAUNCH_OP_TYPES]
        share = coverage.total(recorded)
        result.update(launches_run=loader.launch_timing().launches - before,
                      launch_devices=launch_devices, collectives_in_tf=collectives_in_tf,
                      collectives_in_clusters=collectives_in_clusters,
                      flop_share=share.flop_share, op_share=share.op_share,
                      left_out=share.left_out)
    with open(out, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(*sys.argv[1:4])
