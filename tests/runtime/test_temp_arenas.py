"""Memory traffic of the launch op: temp arenas kept by each launch node from launch to
launch (never shared by two launches running at once), and inputs forwarded to outputs
when TF no longer needs them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

from tfxla_lite.runtime import loader

COUNT = 100_000  # a 400 KB arena


def _tripler(register, kernels):  # type: ignore[no-untyped-def]
    key = register(kernels.triple_via_temp(COUNT), 4 * COUNT, [(tf.float32, (COUNT,))],
                   [(tf.float32, (COUNT,)), (tf.int64, ())])

    @tf.function
    def triple(x: tf.Tensor) -> tf.Tensor:
        return loader.launch([x], key, [tf.float32, tf.int64], [(COUNT,), ()])[0]

    return triple


def test_a_node_reuses_its_arena(register, kernels) -> None:
    triple = _tripler(register, kernels)
    x = np.linspace(-1, 1, COUNT, dtype=np.float32)
    np.testing.assert_allclose(triple(x).numpy(), 3 * x, rtol=1e-6)  # traced, first arena
    before = loader.arena_stats()
    for _ in range(10):
        np.testing.assert_allclose(triple(x).numpy(), 3 * x, rtol=1e-6)
    after = loader.arena_stats()
    assert after.allocated == before.allocated
    assert after.reused - before.reused == 10


def test_concurrent_launches_use_distinct_arenas(register, kernels) -> None:
    # Two launches sharing an arena would mix each other's 2x values into the result.
    triple = _tripler(register, kernels)

    def worker(seed: int) -> bool:
        x = np.random.default_rng(seed).standard_normal(COUNT).astype(np.float32)
        return all(np.allclose(triple(x).numpy(), 3 * x, rtol=1e-6) for _ in range(20))

    before = loader.arena_stats()
    with ThreadPoolExecutor(max_workers=4) as pool:  # at most ArenaPool::kMaxIdle
        assert all(pool.map(worker, range(12)))
    after = loader.arena_stats()
    launches = 12 * 20
    assert after.reused - before.reused + after.allocated - before.allocated == launches
    assert after.allocated - before.allocated <= 4  # one per launch in flight, kept


def test_an_input_tf_no_longer_needs_becomes_the_output(op_library, kernels) -> None:
    spec = (tf.float32, (4, 3))
    key = f"forward/{id(kernels)}"
    kernel = kernels.jit_compile(kernels.add_f32(12))
    loader.register_executable(key, kernel.address, 0, [spec, spec], [spec], owner=kernel,
                               donations=[(0, 0)])
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = np.ones((4, 3), np.float32)

    @tf.function
    def private(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        doubled = x * 2.0  # read by the launch only: TF may hand its buffer over
        return loader.launch([doubled, y], key, [tf.float32], [(4, 3)])[0]

    @tf.function
    def shared(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        doubled = x * 2.0  # also returned: never overwritten
        return doubled, loader.launch([doubled, y], key, [tf.float32], [(4, 3)])[0]

    before = loader.forwarded_outputs()
    np.testing.assert_array_equal(private(x, y).numpy(), 2 * x + 1)
    assert loader.forwarded_outputs() == before + 1
    doubled, total = shared(x, y)
    np.testing.assert_array_equal(doubled.numpy(), 2 * x)
    np.testing.assert_array_equal(total.numpy(), 2 * x + 1)
    loader.unregister(key)


def test_bad_donations_are_rejected(op_library, kernels) -> None:
    kernel = kernels.jit_compile(kernels.add_f32(12))
    spec = (tf.float32, (4, 3))
    with pytest.raises(ValueError, match="bad donation"):
        loader.register_executable("bad/donation", kernel.address, 0, [spec, spec], [spec],
                                   owner=kernel, donations=[(0, 2)])
    with pytest.raises(ValueError, match="rejected"):  # an int64 output over a float input
        loader.register_executable("bad/dtype", kernel.address, 0, [spec, spec],
                                   [(tf.int32, (4, 3))], owner=kernel, donations=[(0, 0)])


def test_auto_clustering_forwards_an_intermediate_into_a_cluster() -> None:
    import tfxla_lite as tl

    def fn(x: tf.Tensor) -> tf.Tensor:
        noise = tf.random.uniform((256, 256))  # stateful: stays in TF, read once below
        return tf.tanh(noise + x) * 3.0 + 1.0

    f = tl.function(fn, min_cluster_size=1)
    x = tf.constant(np.full((256, 256), 0.5, np.float32))
    f(x)
    before = loader.forwarded_outputs()
    result = f(x).numpy()
    assert loader.forwarded_outputs() == before + 1
    assert np.all((result > 1.0 + 3 * np.tanh(0.5) - 1e-5) & (result < 1.0 + 3 * np.tanh(1.5)
                                                               + 1e-5))
