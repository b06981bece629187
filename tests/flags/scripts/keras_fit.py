"""A tiny Keras model fit with compile(jit_compile=True); never imports tfxla_lite.

Prints the loss of every epoch, so that runs with and without TFXLA_LITE_FLAGS can be
compared. The batch size is the first argument (default 16); one that does not divide
the 64 samples gives Keras' step an unknown batch dimension.
"""

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype(np.float32)
y = (x @ rng.normal(size=(8, 1)) + 0.1).astype(np.float32)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=True)
batch_size = int(sys.argv[1]) if len(sys.argv) > 1 else 16
history = model.fit(x, y, batch_size=batch_size, epochs=2, verbose=0, shuffle=False)
for loss in history.history["loss"]:
    print(f"loss {loss:.8f}")
