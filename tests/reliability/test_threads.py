"""Threads: compiled calls and first compiles from 8 threads give the single-threaded
bits, without a deadlock (every wait is bounded)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl

_THREADS = 8
_TIMEOUT_S = 300


def _model(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.tanh(tf.matmul(x, w)) * 3.0 + tf.exp(-tf.abs(x[:, :4])), axis=1)


def _inputs(rows: int, seed: int) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.standard_normal((rows, 16)), tf.float32),
            tf.constant(rng.standard_normal((16, 4)), tf.float32))


@pytest.mark.slow
def test_eight_threads_calling_one_function_get_the_single_threaded_bits() -> None:
    f = tl.function(_model, min_cluster_size=1)
    x, w = _inputs(32, 0)
    reference = f(x, w).numpy()

    def calls(_: int) -> list[bytes]:
        return [f(x, w).numpy().tobytes() for _ in range(200)]

    with ThreadPoolExecutor(_THREADS) as pool:
        results = [job.result(timeout=_TIMEOUT_S) for job in
                   [pool.submit(calls, k) for k in range(_THREADS)]]
    assert all(r == reference.tobytes() for rs in results for r in rs)


@pytest.mark.parametrize("jit_compile", [None, True])
def test_concurrent_first_compiles_match_single_threaded_ones(jit_compile: bool | None
                                                             ) -> None:
    # Signatures 0-3 are each first called by two threads at once (the same signature
    # compiled concurrently); the four differ in shape (different signatures at once).
    shapes = [5, 6, 7, 8]
    expected = {n: tl.function(_model, jit_compile=jit_compile, min_cluster_size=1)(
        *_inputs(n, n)).numpy().tobytes() for n in shapes}
    fresh = tl.function(_model, jit_compile=jit_compile, min_cluster_size=1)

    def first_call(k: int) -> tuple[int, bytes]:
        n = shapes[k % len(shapes)]
        return n, fresh(*_inputs(n, n)).numpy().tobytes()

    with ThreadPoolExecutor(_THREADS) as pool:
        results = [job.result(timeout=_TIMEOUT_S) for job in
                   [pool.submit(first_call, k) for k in range(_THREADS)]]
    for n, bits in results:
        assert bits == expected[n], f"rows={n}"
