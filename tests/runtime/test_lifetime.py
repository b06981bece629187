"""Lifetime of compiled code (issue 18 item 4): a dropped `tfxla_lite.function` gives its
registry keys and machine code back, a graph that still calls its code keeps it, and the
in-process caches stay within their caps.

RSS is measured as a slope over the second half of the cycles (least squares), so that
warm-up (TF's own first-use allocations, the caches filling) does not count. Each run of
LLVM's pass pipeline leaves memory in llvmlite that no one can free (`engine`'s module
docstring): a cycle that compiles new code is allowed what its runs leave, measured in
the same process.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.codegen import cache as code_caches
from tfxla_lite.codegen import module_cache
from tfxla_lite.codegen.cpu import engine, kernel_cache
from tfxla_lite.runtime import loader

# Allowed RSS growth per create/compile/drop cycle, over the second half of the cycles.
# With the caches capped small, what stays is allocator noise; a leaked program (its
# graphs, engine and registry entry) costs 70-350 KB a cycle.
MAX_SLOPE_BYTES = 24 << 10


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _make(constant: float) -> tl.Function:
    def f(a: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(a * constant + 1.0) * tf.exp(-a)

    return tl.function(f, jit_compile=True)


def _settle() -> None:
    tl.wait_for_compiles()  # background O3 compiles hold their executables
    gc.collect()


@pytest.fixture
def small_caches(cache_root, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Caps small enough that the caches fill within a few cycles."""
    monkeypatch.setattr(kernel_cache.MEMORY, "max_bytes", 2 << 20)
    monkeypatch.setattr(module_cache.MEMORY, "max_bytes", 256 << 10)


def _cycles(count: int, new_code: bool) -> tuple[list[int], dict[int, float]]:
    """Create, compile, call and drop `count` functions: RSS after each, and the runs of
    LLVM's pass pipeline a cycle made, by speed level. The registry and the held owners
    are back to their size before."""
    x = tf.random.normal([64, 64])
    _make(2.0)(x)  # warm: the op library, TF's kernels, the compile caches
    _settle()
    registry, owners = loader.registry_size(), loader.release_owners()
    runs = engine.pipeline_runs()
    samples = []
    for cycle in range(count):
        function = _make(3.0 + cycle * 0.5 if new_code else 2.0)
        function(x)
        del function
        _settle()
        samples.append(_rss())
    assert loader.registry_size() == registry, "every dropped function's keys are gone"
    assert loader.release_owners() == owners, "and every owner of their code"
    made = {level: (n - runs.get(level, 0)) / count
            for level, n in engine.pipeline_runs().items() if n > runs.get(level, 0)}
    return samples, made


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _malloc_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (every arena)."""
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def _kernel_ir() -> str:
    """The LLVM IR the cycles' function emits (with another constant)."""
    function = _make(0.75)
    function(tf.random.normal([64, 64]))
    (program,) = function._programs.values()
    return program.compiler_ir("llvm_unoptimized")


def _bytes_per_pipeline_run(text: str, speed_level: int, runs: int = 24) -> float:
    """What one run of LLVM's pass pipeline at `speed_level` over the IR `text` leaves in
    llvmlite (it grows with the passes that run, so the cycles' own IR is measured), as
    malloc's bytes in use across `runs` compiles."""
    engine.compile_parts([text], speed_level)
    gc.collect()
    before = _malloc_in_use()
    for _ in range(runs):
        engine.compile_parts([text], speed_level)
    gc.collect()
    return max(0.0, (_malloc_in_use() - before) / runs)


def _slope(samples: list[int]) -> float:
    half = samples[len(samples) // 2:]
    return float(np.polyfit(np.arange(len(half)), np.asarray(half, dtype=np.float64), 1)[0])


def test_dropped_function_unregisters_its_keys(cache_root) -> None:  # noqa: ANN001
    x = tf.random.normal([8, 8])
    _settle()
    before = loader.registry_size()
    function = _make(5.0)
    function(x)
    assert loader.registry_size() == before + 1
    (program,) = function._programs.values()
    (registration,) = program.all_registrations()
    collected = weakref.ref(registration)
    del function, program, registration
    _settle()
    assert collected() is None
    assert loader.registry_size() == before


def test_short_cycles_are_bounded(small_caches) -> None:  # noqa: ANN001
    _cycles(24, new_code=True)
    usage = code_caches.memory_usage()
    assert usage["code"][1] <= 2 << 20 and usage["optimized"][1] <= 256 << 10


@pytest.mark.slow
@pytest.mark.parametrize("new_code", [False, True], ids=["cached_code", "new_code"])
def test_create_compile_drop_200_cycles(small_caches, new_code: bool) -> None:  # noqa: ANN001
    samples, made = _cycles(200, new_code)
    assert bool(made) == new_code, f"pipeline runs a cycle: {made}"
    text = _kernel_ir() if made else ""
    llvmlite = sum(per_cycle * _bytes_per_pipeline_run(text, level)
                   for level, per_cycle in made.items())
    slope = _slope(samples)
    assert slope < MAX_SLOPE_BYTES + llvmlite, (
        f"RSS grows {slope / 1024:.1f} KB a cycle, of which llvmlite's pipeline runs "
        f"({made} a cycle by speed level) explain {llvmlite / 1024:.1f} KB")


def test_concrete_function_outlives_its_function(cache_root) -> None:  # noqa: ANN001
    """The rewritten graph holds its keys: a concrete function (and an outer tf.function
    that traced a call) keeps running after the tfxla-lite function is collected."""
    x = tf.random.normal([16, 16])
    held = [_make(7.0)]  # the outer function's Python body needs it only to trace
    concrete = held[0].get_concrete_function(x)

    @tf.function
    def outer(a: tf.Tensor) -> tf.Tensor:
        return held[0](a) + 1.0

    expected = held[0](x).numpy()
    np.testing.assert_allclose(outer(x).numpy(), expected + 1.0, rtol=1e-6)
    size = loader.registry_size()
    held.clear()
    _settle()
    assert loader.registry_size() == size, "the graphs still hold the key"
    np.testing.assert_allclose(concrete(x).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(outer(x).numpy(), expected + 1.0, rtol=1e-6)
    del concrete
    _settle()
    np.testing.assert_allclose(outer(x).numpy(), expected + 1.0, rtol=1e-6)
    del outer
    _settle()
    assert loader.registry_size() == size - 1


def test_calls_while_other_functions_drop(cache_root) -> None:  # noqa: ANN001
    """8 threads call a live function while another thread creates and drops others:
    every result is right, and the dropped functions' keys go."""
    x = tf.random.normal([32, 32])
    live = _make(1.5)
    expected = live(x).numpy()
    _settle()
    before = loader.registry_size()
    stop = threading.Event()
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            while not stop.is_set():
                np.testing.assert_array_equal(live(x).numpy(), expected)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        for cycle in range(6):
            dropped = _make(9.0 + cycle)
            dropped(x)
            del dropped
            gc.collect()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors[0]
    _settle()
    assert loader.registry_size() == before


def test_launch_of_released_key_fails_cleanly(cache_root) -> None:  # noqa: ANN001
    """A released registration's key is gone: a launch naming it raises NotFoundError
    (never runs freed code), and its owner is dropped once no launch holds it."""
    x = tf.random.normal([4, 4])
    function = _make(11.0)
    concrete = function.get_concrete_function(x)
    (program,) = function._programs.values()
    (registration,) = program.all_registrations()
    registration.release()
    with pytest.raises(tf.errors.NotFoundError):
        concrete(x)
    del function, program, concrete
    _settle()
