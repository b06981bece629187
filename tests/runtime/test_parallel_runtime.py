"""Parallel kernels launched by TF (launch_op.cc's `tfxla_lite_parallel`): the same bits on
TF's intra-op pool (closures per region, or a team per launch), on libgomp and on the
caller alone, for loop, row, dot and reduction kernels; concurrent launches from several
TF threads; regions whose pool workers start late (after the caller did every part); a
team's helpers serving several regions of one launch; kernels called outside a launch;
and the `parallel_runtime` option reaching the op library."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite import flags
from tfxla_lite.cache_dir import cache_root
from tfxla_lite.codegen.cpu import parallel
from tfxla_lite.options import PARALLEL_RUNTIMES, Options, OptionsError
from tfxla_lite.runtime import loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerances import assert_close  # noqa: E402

pytestmark = pytest.mark.skipif(
    parallel.effective_threads(None) < 2,
    reason="one CPU (or no libgomp): kernels are compiled serial, no parallel region runs")

RUNTIMES = ("tf", "tf_team", "openmp", "serial")
POOL_RUNTIMES = ("tf", "tf_team")


@pytest.fixture(autouse=True)
def restore_runtime(op_library: loader.OpLibrary) -> Iterator[None]:
    previous = loader.parallel_runtime()
    yield
    loader.set_parallel_runtime(previous)


def _tensor(shape: tuple[int, ...], seed: int) -> tf.Tensor:
    rng = np.random.default_rng(seed)
    return tf.constant(rng.standard_normal(shape).astype(np.float32))


def _loop(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    return x * 2.0 + y  # times two is exact: a fused multiply-add gives TF's bits


def _row(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.softmax(x, axis=-1)


def _dot(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    # Scaled as a layer's weights are (1/sqrt(K)): sums of about one, whose rounding
    # differences against TF's order stay within the table's absolute tolerance.
    return tf.nn.relu(tf.matmul(x, w * 0.04) + b)


def _sum(x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(x)


# (function, input shapes, the op whose tolerance applies); shapes big enough to run
# parallel (PARALLEL_MIN_WORK elements, a dot of several units) and used nowhere else,
# so that every kernel is linked in this process, after the op library loaded.
CASES = {
    "loop": (_loop, [(3, 1 << 18), (3, 1 << 18)], "Mul"),
    "row": (_row, [(1536, 1000)], "Softmax"),
    "dot": (_dot, [(384, 520), (520, 264), (264,)], "MatMul"),
    "reduction": (_sum, [(1 << 20) + 3], "Sum"),
}


def _stats_delta(before: loader.ParallelStats) -> loader.ParallelStats:
    after = loader.parallel_stats()
    return loader.ParallelStats(*(a - b for a, b in zip(
        (after.on_pool, after.on_openmp, after.serial, after.workers_scheduled,
         after.workers_entered, after.workers_late),
        (before.on_pool, before.on_openmp, before.serial, before.workers_scheduled,
         before.workers_entered, before.workers_late))))


@pytest.mark.parametrize("case", list(CASES))
def test_same_bits_on_every_runtime(case: str) -> None:
    fn, shapes, op = CASES[case]
    args = [_tensor(s if isinstance(s, tuple) else (s,), seed=n) for n, s in enumerate(shapes)]
    compiled = tl.function(fn, jit_compile=True)
    results = {}
    for runtime in RUNTIMES:
        loader.set_parallel_runtime(runtime)
        before = loader.parallel_stats()
        results[runtime] = compiled(*args).numpy()
        ran = _stats_delta(before)
        if runtime in POOL_RUNTIMES:
            assert ran.on_pool > 0 and ran.on_openmp == 0, ran
        elif runtime == "openmp":
            assert ran.on_openmp > 0 and ran.on_pool == 0, ran
        else:
            assert ran.serial > 0 and ran.on_pool == ran.on_openmp == 0, ran
    for runtime in RUNTIMES[1:]:
        np.testing.assert_array_equal(results[runtime], results["tf"], err_msg=runtime)
    assert_close(results["tf"], fn(*args).numpy(), op, context=case)


@pytest.mark.parametrize("runtime", POOL_RUNTIMES)
def test_concurrent_launches_from_several_tf_threads(runtime: str) -> None:
    """Independent branches of one tf.function (TF's inter-op threads run them at once),
    called from several Python threads at once: every launch has regions of its own."""
    soft = tl.function(_row, jit_compile=True)
    total = tl.function(lambda x: tf.reduce_sum(x * x, axis=0), jit_compile=True)

    @tf.function
    def branches(a: tf.Tensor, b: tf.Tensor, c: tf.Tensor) -> tuple[tf.Tensor, ...]:
        return soft(a), total(b), soft(c), total(a)

    inputs = [[_tensor((1280, 1000), 10 + n), _tensor((2560, 520), 20 + n),
               _tensor((1280, 1000), 30 + n)] for n in range(3)]
    loader.set_parallel_runtime("serial")
    expected = [[t.numpy() for t in branches(*args)] for args in inputs]
    loader.set_parallel_runtime(runtime)
    before = loader.parallel_stats()
    errors: list[str] = []

    def worker(n: int) -> None:
        for call in range(12):
            got = branches(*inputs[n])
            for k, (a, e) in enumerate(zip(got, expected[n])):
                if not np.array_equal(a.numpy(), e):
                    errors.append(f"thread {n}, call {call}, output {k} differs")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:5]
    assert _stats_delta(before).on_pool >= 3 * 12 * 4
    assert_close(expected[0][0], _row(inputs[0][0]).numpy(), "Softmax")


def _wait_for_pool(before: loader.ParallelStats, timeout: float = 10.0) -> loader.ParallelStats:
    """The counts once every closure scheduled since `before` has run (or `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        ran = _stats_delta(before)
        if ran.workers_entered + ran.workers_late >= ran.workers_scheduled:
            return ran
        if time.monotonic() > deadline:
            return ran
        time.sleep(0.01)


def _drain(timeout: float = 10.0) -> None:
    """Wait until every closure scheduled in the process so far has run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = loader.parallel_stats()
        if stats.workers_entered + stats.workers_late >= stats.workers_scheduled:
            return
        time.sleep(0.01)


@pytest.mark.parametrize("runtime", POOL_RUNTIMES)
def test_late_workers_never_touch_a_finished_region(runtime: str) -> None:
    """Many small parallel launches (just above the threshold, microseconds each) while
    other threads keep TF's intra-op pool busy with matmuls: most closures start after
    their caller has done every part and returned (its `data` is gone from its stack).
    They must return at once: results stay right, and every closure is accounted for."""
    small = tl.function(lambda x: x * 2.0 + 1.0, jit_compile=True)
    x = _tensor((parallel.PARALLEL_MIN_WORK + 7,), 40)
    expected = x.numpy() * 2.0 + 1.0
    loader.set_parallel_runtime(runtime)
    small(x)
    _drain()  # a closure still queued from earlier would be counted below
    big = _tensor((640, 640), 41)
    stop = threading.Event()

    def hog() -> None:
        while not stop.is_set():
            tf.matmul(big, big)

    errors: list[str] = []

    def launcher(n: int) -> None:
        for call in range(300):
            if not np.array_equal(small(x).numpy(), expected):
                errors.append(f"launcher {n}, call {call} differs")

    before = loader.parallel_stats()
    hogs = [threading.Thread(target=hog) for _ in range(2)]
    launchers = [threading.Thread(target=launcher, args=(n,)) for n in range(3)]
    for thread in hogs + launchers:
        thread.start()
    for thread in launchers:
        thread.join()
    stop.set()
    for thread in hogs:
        thread.join()
    assert not errors, errors[:5]
    ran = _wait_for_pool(before)
    assert ran.on_pool >= 900
    assert ran.workers_entered + ran.workers_late == ran.workers_scheduled, ran
    assert ran.workers_late > 0, ran  # the path under test did run


def _chain(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    # Three dots in a row: several parallel kernels (regions) in one launch.
    for _ in range(3):
        x = tf.nn.relu(tf.matmul(x, w * 0.04))
    return x


def test_team_helpers_serve_several_regions_of_a_launch() -> None:
    """Under "tf_team" a launch of several parallel regions wakes fewer pool closures
    than it has regions when its helpers stay between regions (a long idle wait here),
    and gives the bits of the caller alone; every closure is accounted for."""
    compiled = tl.function(_chain, jit_compile=True)
    x, w = _tensor((384, 520), 50), _tensor((520, 520), 51)
    loader.set_parallel_runtime("serial")
    expected = compiled(x, w).numpy()
    loader.set_parallel_runtime("tf_team")
    previous_idle = loader.set_team_idle(20000.0)
    try:
        compiled(x, w)
        _drain()
        before = loader.parallel_stats()
        served_before = loader.team_regions_entered()
        # On two free cores every helper serves several regions; on a busy machine a
        # helper may start late (in a launch's last region, or after it): a few rounds.
        for _ in range(5):
            for _ in range(10):
                np.testing.assert_array_equal(compiled(x, w).numpy(), expected)
            ran = _wait_for_pool(before)
            served = loader.team_regions_entered() - served_before
            if served > ran.workers_entered:
                break
    finally:
        loader.set_team_idle(previous_idle)
    assert ran.on_pool >= 10 * 3, ran
    assert ran.workers_entered + ran.workers_late == ran.workers_scheduled, ran
    assert ran.workers_scheduled < ran.on_pool, ran
    assert served > ran.workers_entered, (served, ran)
    assert_close(expected, _chain(x, w).numpy(), "MatMul")


def test_team_idle_refuses_a_negative_wait() -> None:
    with pytest.raises(ValueError, match="at least 0 us"):
        loader.set_team_idle(-1.0)


def test_kernels_called_outside_a_launch_use_libgomp() -> None:
    """An executable called from Python (ctypes, no TF op around it) has no pool: its
    regions run on libgomp under the "tf" runtime, alone under "serial"."""
    from tfxla_lite.codegen import compile_module
    from tfxla_lite.hlo.ir import HloModule
    from tfxla_lite.hlo.shape import Shape

    module = HloModule("outside_launch")
    comp = module.new_computation("main", entry=True)
    p = comp.add_parameter(0, Shape("f32", (5, 1 << 16)))
    comp.root = comp.create("multiply", [p, p])
    executable = compile_module(module, threads=2, cache=False)
    assert parallel.parallel_runtime_bound()
    assert parallel.RUNTIME_SYMBOL in executable.llvm_ir
    value = np.random.default_rng(3).standard_normal((5, 1 << 16)).astype(np.float32)
    for runtime, counter in (("tf", "on_openmp"), ("tf_team", "on_openmp"),
                             ("serial", "serial")):
        loader.set_parallel_runtime(runtime)
        before = loader.parallel_stats()
        (result,) = executable(value)
        assert getattr(_stats_delta(before), counter) == 1, runtime
        np.testing.assert_array_equal(result, value * value)


def test_option_reaches_the_op_library(monkeypatch: pytest.MonkeyPatch) -> None:
    flags.PROCESS_OPTIONS.reset()
    try:
        tl.set_options(parallel_runtime="openmp")
        assert loader.parallel_runtime() == "openmp"
        tl.set_options(parallel_runtime="serial")
        assert loader.parallel_runtime() == "serial"
        with pytest.raises(OptionsError, match="parallel_runtime must be one of"):
            tl.set_options(parallel_runtime="gomp")
        assert loader.parallel_runtime() == "serial"  # a refused value changes nothing
        monkeypatch.setenv(flags.ENVIRONMENT_VARIABLE, "--parallel_runtime=OpenMP")
        flags.PROCESS_OPTIONS.reset()
        assert tl.get_options().parallel_runtime == "openmp"
        assert loader.parallel_runtime() == "openmp"
    finally:
        monkeypatch.delenv(flags.ENVIRONMENT_VARIABLE, raising=False)
        flags.PROCESS_OPTIONS.reset()
        tl.get_options()
    assert loader.parallel_runtime() == Options().parallel_runtime


def test_runtime_names_agree() -> None:
    """The option's values are the op library's runtimes, in the enum's order."""
    assert tuple(loader.PARALLEL_RUNTIMES) == PARALLEL_RUNTIMES
    assert list(loader.PARALLEL_RUNTIMES.values()) == [0, 1, 2, 3]
    for name in PARALLEL_RUNTIMES:
        loader.set_parallel_runtime(name)
        assert loader.parallel_runtime() == name


def test_set_parallel_runtime_refuses_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown parallel runtime 'pool'; runtimes are tf"):
        loader.set_parallel_runtime("pool")
    assert loader.set_parallel_runtime("openmp") in RUNTIMES
    assert loader.set_parallel_runtime("tf") == "openmp"


_WARM_SCRIPT = """
import numpy as np
import tensorflow as tf
import tfxla_lite as tl
from tfxla_lite.codegen import cache
from tfxla_lite.runtime import loader

f = tl.function(lambda x: tf.nn.softmax(x * 3.0), jit_compile=True)
x = tf.constant(np.random.default_rng(0).standard_normal((1024, 999)).astype(np.float32))
y = f(x).numpy()
np.testing.assert_allclose(y, tf.nn.softmax(x * 3.0).numpy(), rtol=1e-5, atol=1e-7)
stats = cache.stats()
print(loader.parallel_stats().on_pool, stats.llvm_compilations, stats.disk_hits)
"""


@pytest.mark.slow  # two TF processes: 10 to 20 s
def test_kernels_loaded_from_the_disk_cache_run_on_the_pool(tmp_path: Path) -> None:
    """The op library loads before a cache hit links machine code: a warm process's
    kernels call the library's runtime too, not libgomp directly."""
    (tmp_path / "ops").symlink_to(cache_root() / "ops", target_is_directory=True)
    env = {**os.environ, "TFXLA_LITE_CACHE_DIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop(flags.ENVIRONMENT_VARIABLE, None)
    runs = []
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", _WARM_SCRIPT], env=env, text=True,
                                capture_output=True, timeout=300, check=False)
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append([int(n) for n in result.stdout.split()[-3:]])
    (cold_pool, cold_llvm, _), (warm_pool, warm_llvm, warm_hits) = runs
    assert cold_llvm >= 1 and warm_llvm == 0 and warm_hits >= 1, runs
    assert cold_pool >= 1 and warm_pool >= 1, runs
