"""The launch op's output pool (launch_op.cc, "Output pool"): large outputs in blocks
that stay mapped between launches, handed back only when TF has released the tensor;
a cap on the idle bytes; the counters and the option that sets the cap."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfxla_lite import flags, runtime
from tfxla_lite.options import Options, OptionsError
from tfxla_lite.runtime import loader

COUNT = 100_000  # 400 KB outputs: above the pool's 256 KB threshold
SPEC = (tf.float32, (COUNT,))
POOL_CLASS = 448 << 10  # the size class of a 400,000-byte output (4 classes per octave)


@pytest.fixture(autouse=True)
def default_pool(op_library: loader.OpLibrary) -> Iterator[None]:
    """Every test starts and ends with the pool on, huge pages advised, the default cap."""
    default_cap = Options().output_pool_mb << 20
    loader.set_output_pool(enabled=True, cap_bytes=default_cap, huge_pages=True)
    yield
    loader.set_output_pool(enabled=True, cap_bytes=default_cap, huge_pages=True)


@pytest.fixture
def adder(register, kernels):  # type: ignore[no-untyped-def]
    """A tf.function launching x + y on 400 KB float tensors."""
    key = register(kernels.add_f32(COUNT), 0, [SPEC, SPEC], [SPEC])

    @tf.function
    def add(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return loader.launch([x, y], key, [tf.float32], [(COUNT,)])[0]

    return add


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(COUNT).astype(np.float32),
            rng.standard_normal(COUNT).astype(np.float32))


def test_outputs_come_from_the_pool_and_are_reused(adder) -> None:
    x, y = _inputs(0)
    adder(x, y)  # traced
    gc.collect()
    before = runtime.output_pool_stats()
    for _ in range(10):
        np.testing.assert_array_equal(adder(x, y).numpy(), x + y)
    after = runtime.output_pool_stats()
    assert after.hits - before.hits == 10  # each output's block was the previous one's
    assert after.misses == before.misses
    assert after.returned - before.returned == 10
    assert after.idle_bytes >= POOL_CLASS


def test_a_held_output_is_never_reused(adder) -> None:
    x, y = _inputs(1)
    held = adder(x, y)
    before = runtime.output_pool_stats()
    for seed in range(2, 6):
        a, b = _inputs(seed)
        np.testing.assert_array_equal(adder(a, b).numpy(), a + b)
    np.testing.assert_array_equal(held.numpy(), x + y)  # its block never went back
    assert runtime.output_pool_stats().in_use_bytes - before.in_use_bytes <= POOL_CLASS
    in_use = runtime.output_pool_stats().in_use_bytes
    del held
    gc.collect()
    assert runtime.output_pool_stats().in_use_bytes == in_use - POOL_CLASS


def test_outputs_outlive_the_function_and_its_executable(register, kernels) -> None:
    key = register(kernels.add_f32(COUNT), 0, [SPEC, SPEC], [SPEC])

    def run_once(x: np.ndarray, y: np.ndarray) -> tf.Tensor:
        @tf.function
        def add(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            return loader.launch([x, y], key, [tf.float32], [(COUNT,)])[0]

        return add(x, y)

    x, y = _inputs(7)
    kept = [run_once(x, y) for _ in range(3)]
    loader.unregister(key)
    gc.collect()
    for seed in range(3):  # other launches take blocks from the pool meanwhile
        other = tf.constant(_inputs(seed)[0]) * 3.0
        del other
    for output in kept:
        np.testing.assert_array_equal(output.numpy(), x + y)


def test_concurrent_launches_get_distinct_blocks(adder) -> None:
    def worker(seed: int) -> bool:
        x, y = _inputs(seed)
        held = [adder(x, y) for _ in range(8)]  # several live at once per thread
        return all(np.array_equal(output.numpy(), x + y) for output in held)

    adder(*_inputs(0))
    before = runtime.output_pool_stats()
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(worker, range(24)))
    gc.collect()
    after = runtime.output_pool_stats()
    assert after.hits + after.misses - before.hits - before.misses == 24 * 8
    assert after.in_use_bytes == before.in_use_bytes  # every block came back


def test_forwarded_pooled_outputs_stay_correct(register, kernels, op_library) -> None:
    # A pooled output read only by the next op is forwarded as that op's output: by TF's
    # Mul, and by a launch that may take an input's buffer over (donation).
    first = register(kernels.add_f32(COUNT), 0, [SPEC, SPEC], [SPEC])
    kernel = kernels.jit_compile(kernels.add_f32(COUNT))
    second = f"pool_forward/{id(kernel)}"
    loader.register_executable(second, kernel.address, 0, [SPEC, SPEC], [SPEC],
                               owner=kernel, donations=[(0, 0)])
    try:
        @tf.function
        def chain(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            total = loader.launch([x, y], first, [tf.float32], [(COUNT,)])[0]
            doubled = total * 2.0
            return loader.launch([doubled, y], second, [tf.float32], [(COUNT,)])[0]

        x, y = _inputs(3)
        chain(x, y)
        forwarded = loader.forwarded_outputs()
        results = [chain(*_inputs(seed)) for seed in range(4)]
        for seed, result in enumerate(results):
            a, b = _inputs(seed)
            np.testing.assert_allclose(result.numpy(), (a + b) * 2.0 + b, rtol=1e-6)
        assert loader.forwarded_outputs() > forwarded
    finally:
        loader.unregister(second)


def test_idle_bytes_never_exceed_the_cap(adder) -> None:
    cap = 3 * POOL_CLASS
    runtime.set_output_pool(cap_bytes=cap)
    runtime.output_pool_stats(reset_peak=True)
    x, y = _inputs(4)
    before = runtime.output_pool_stats()
    held = [adder(x, y) for _ in range(8)]
    del held  # eight blocks come back at once: five must be unmapped
    gc.collect()
    after = runtime.output_pool_stats(reset_peak=True)
    assert after.cap_bytes == cap
    assert after.peak_idle_bytes <= cap
    assert after.idle_bytes == cap
    assert after.released - before.released >= 5


def test_a_smaller_cap_trims_at_once(adder) -> None:
    x, y = _inputs(5)
    held = [adder(x, y) for _ in range(4)]
    del held
    gc.collect()
    assert runtime.output_pool_stats().idle_bytes >= 4 * POOL_CLASS
    runtime.set_output_pool(cap_bytes=POOL_CLASS)
    assert runtime.output_pool_stats().idle_bytes <= POOL_CLASS
    runtime.trim_output_pool(0)
    assert runtime.output_pool_stats().idle_bytes == 0


def test_off_leaves_outputs_to_tf(adder) -> None:
    x, y = _inputs(6)
    adder(x, y)
    runtime.set_output_pool(enabled=False)
    before = runtime.output_pool_stats()
    for _ in range(3):
        np.testing.assert_array_equal(adder(x, y).numpy(), x + y)
    after = runtime.output_pool_stats()
    assert (after.hits, after.misses) == (before.hits, before.misses)
    assert after.bypassed - before.bypassed == 3
    assert not after.enabled


def test_small_outputs_stay_with_tf(register, kernels) -> None:
    count = 1000
    spec = (tf.float32, (count,))
    key = register(kernels.add_f32(count), 0, [spec, spec], [spec])
    x = np.ones(count, np.float32)
    before = runtime.output_pool_stats()
    result = loader.launch([x, x], key, [tf.float32], [(count,)])[0]
    np.testing.assert_array_equal(result.numpy(), 2 * x)
    after = runtime.output_pool_stats()
    assert (after.hits, after.misses, after.bypassed) == (
        before.hits, before.misses, before.bypassed)


def test_an_eager_callers_argument_is_never_forwarded(op_library, kernels) -> None:
    # Why arguments are not donated: the caller's tensor holds the buffer while the call
    # runs, so TF refuses to forward it even when the caller drops it right after.
    kernel = kernels.jit_compile(kernels.add_f32(COUNT))
    key = f"pool_argument/{id(kernel)}"
    loader.register_executable(key, kernel.address, 0, [SPEC, SPEC], [SPEC], owner=kernel,
                               donations=[(0, 0)])
    try:
        @tf.function
        def add(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            return loader.launch([x, y], key, [tf.float32], [(COUNT,)])[0]

        x, y = _inputs(8)
        add(tf.constant(x), y)
        before = loader.forwarded_outputs()
        for _ in range(3):
            np.testing.assert_array_equal(add(tf.constant(x), y).numpy(), x + y)
        assert loader.forwarded_outputs() == before
    finally:
        loader.unregister(key)


def test_the_option_and_the_flag_set_the_cap() -> None:
    assert flags.parse_flags("--output_pool_mb=64") == {"output_pool_mb": 64}
    with pytest.raises(flags.FlagError):
        flags.parse_flags("--output_pool_mb=-1")
    with pytest.raises(OptionsError):
        Options(output_pool_mb=True)
    try:
        flags.set_options(output_pool_mb=64)
        stats = runtime.output_pool_stats()
        assert stats.cap_bytes == 64 << 20 and stats.enabled
        flags.set_options(output_pool_mb=0)
        assert not runtime.output_pool_stats().enabled
    finally:
        flags.set_options(output_pool_mb=Options().output_pool_mb)
    assert runtime.output_pool_stats().enabled


@pytest.mark.slow
def test_outputs_alive_at_exit_end_cleanly(tmp_path: Path) -> None:
    # Tensors in pool blocks are released during interpreter shutdown, after the library
    # released its idle blocks: the pool must still take them back.
    script = tmp_path / "held.py"
    script.write_text(textwrap.dedent("""
        import tensorflow as tf
        import tfxla_lite as tl
        from tfxla_lite import runtime

        @tl.function(jit_compile=True)
        def swish(x):
            return x * tf.sigmoid(x)

        x = tf.random.normal([1 << 18])
        kept = [swish(x) for _ in range(3)]
        print("pooled", runtime.output_pool_stats().in_use_bytes)
    """))
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"pooled {3 << 20}" in done.stdout
