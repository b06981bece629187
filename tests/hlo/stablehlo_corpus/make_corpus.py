"""Writes this folder's corpus for the StableHLO export's tests: each TF function below
traced, clustered and lowered by tfxla-lite, its cluster's HLO as `NAME.hlo` (constants
in full) and the inputs it was checked on as `NAME.npz`. Needs TF; the tests do not:

    python tests/hlo/stablehlo_corpus/make_corpus.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from tfxla_lite.clustering import cluster_graph, lower_cluster
from tfxla_lite.hlo.printer import module_to_text

HERE = Path(__file__).resolve().parent
rng = np.random.default_rng(0)
F = np.float32


def spd(*dims: int) -> np.ndarray:
    x = rng.standard_normal(dims).astype(F)
    return x @ np.swapaxes(x, -1, -2) + dims[-1] * np.eye(dims[-1], dtype=F)


def normal(*dims: int) -> np.ndarray:
    return rng.standard_normal(dims).astype(F)


# name -> (TF function, inputs): one cluster each, the op families the export writes.
CASES = {
    "conv": (lambda x, w: tf.nn.relu(tf.nn.conv2d(x, w, 2, "SAME")),
             [normal(2, 9, 9, 3), normal(3, 3, 3, 4)]),
    "pool": (lambda x: [tf.nn.max_pool2d(x, 3, 2, "SAME"), tf.nn.avg_pool2d(x, 2, 2, "VALID")],
             [normal(2, 8, 8, 3)]),
    "gather_scatter": (lambda x, i: [tf.gather(x, i),
                                     tf.tensor_scatter_nd_add(x, i[:, None], tf.ones((3, 4)))],
                       [normal(5, 4), np.array([4, 0, 2], np.int32)]),
    "sort_topk": (lambda x: [tf.sort(x), tf.math.top_k(x, 3).values,
                             tf.math.top_k(x, 3).indices, tf.argsort(x)], [normal(3, 40)]),
    "cumsum_softmax": (lambda x: [tf.cumsum(x, 1), tf.nn.softmax(x), tf.reduce_max(x, 0),
                                  tf.argmax(x, 1)], [normal(4, 6)]),
    "matmul_pad": (lambda a, b: [tf.pad(a @ b, [[1, 0], [2, 1]]), tf.reverse(a, [1]),
                                 tf.one_hot(tf.constant([1, 0, 3]), 4), tf.math.erf(a)],
                   [normal(3, 5), normal(5, 2)]),
    "linalg": (lambda a, b: [tf.linalg.cholesky(a),
                             tf.linalg.triangular_solve(tf.linalg.cholesky(a), b, adjoint=True),
                             tf.bitcast(b, tf.int32)], [spd(2, 4, 4), normal(2, 4, 3)]),
    "slices": (lambda x, i: [x[1:, ::2], tf.slice(x, [i, 0], [2, 3]), tf.concat([x, x], 0),
                             tf.transpose(x), tf.cast(x > 0, tf.float32), tf.where(x > 0, x, -x),
                             tf.clip_by_value(x, -0.5, 0.5)], [normal(4, 6), np.int32(1)]),
    "ints": (lambda x: [x // 3, x % 3, tf.bitwise.left_shift(x, 2), tf.abs(x),
                        tf.cast(x, tf.float64) * 0.5],
             [rng.integers(-20, 20, (7,)).astype(np.int32)]),
}


def main() -> None:
    for name, (fn, args) in CASES.items():
        specs = [tf.TensorSpec(a.shape, tf.as_dtype(np.asarray(a).dtype)) for a in args]
        graph = tf.function(fn).get_concrete_function(*specs).graph
        (cluster,) = cluster_graph(graph, min_cluster_size=1).clusters
        feeds = {t.name: np.asarray(a) for t, a in zip(graph.inputs, args)}
        module = lower_cluster(graph, cluster)
        module.name = name
        (HERE / f"{name}.hlo").write_text(module_to_text(module, print_large_constants=True))
        np.savez(HERE / f"{name}.npz", *[feeds[n] for n in cluster.inputs])


if __name__ == "__main__":
    main()
