"""benchmarks/kernel_profile.py `thread_scaling`: a module compiled for one and two
threads, called through its entry on preallocated buffers cycled through a given size,
computes what the NumPy evaluator computes, the same bits on every thread count; its
report counts the calls on which both threads worked."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tolerances import assert_close  # noqa: E402

from benchmarks import kernel_profile  # noqa: E402
from tfxla_lite.codegen.cpu import parallel  # noqa: E402
from tfxla_lite.hlo.evaluator import evaluate  # noqa: E402
from tfxla_lite.hlo.ir import HloModule  # noqa: E402
from tfxla_lite.hlo.shape import Shape  # noqa: E402

SIZE = 4 * parallel.PARALLEL_MIN_WORK  # big enough to run on the team


def _erf_module() -> HloModule:
    module = HloModule("scaled")
    comp = module.new_computation("main", entry=True)
    x = comp.add_parameter(0, Shape("f32", (SIZE,)))
    comp.root = comp.create("erf", [x])
    return module


def test_thread_counts_compute_what_the_evaluator_does() -> None:
    x = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32) * 3
    samples, outputs = kernel_profile.thread_scaling(_erf_module, [x], (1, 2), repeats=6,
                                                     moved_bytes=3 * 2 * 4 * SIZE)
    assert sorted(samples) == [1, 2]
    for count, s in samples.items():
        assert s.threads == count and len(s.wall) == len(s.cpu) == 6
        assert all(w > 0 for w in s.wall)
    (result,) = outputs
    assert_close(result, evaluate(_erf_module(), x), "erf")
    assert "calls with both threads busy" in kernel_profile.scaling_report(samples, 8.0 * SIZE)


def test_both_busy_keeps_the_calls_with_two_threads_of_cpu_time() -> None:
    s = kernel_profile.ThreadScaling(2, wall=[1.0, 1.0, 2.0], cpu=[1.9, 1.0, 3.0])
    assert s.both_busy() == [1.0]
    assert s.both_busy(share=1.5) == [1.0, 2.0]
    report = kernel_profile.scaling_report({2: s}, moved=1e9)
    assert report.endswith("both threads busy 1/3: 1000.000 / 1000.000 (  1.0 GB/s best)")


@pytest.mark.parametrize("threads", [(1, 2), (2, 1)])
def test_every_thread_count_gives_the_same_bits(threads: tuple[int, int]) -> None:
    x = np.linspace(-9, 9, SIZE, dtype=np.float32)
    _, outputs = kernel_profile.thread_scaling(_erf_module, [x], threads, repeats=1,
                                               moved_bytes=0)
    assert_close(outputs[0], evaluate(_erf_module(), x), "erf")


def test_concurrent_streams_time_both_threads_and_leave_the_inputs() -> None:
    x = np.random.default_rng(1).standard_normal(SIZE).astype(np.float32)
    kept = x.copy()
    alone, pairs = kernel_profile.concurrent_streams(_erf_module, [x], repeats=4,
                                                     moved_bytes=0)
    assert len(alone) == 4 and all(t > 0 for t in alone)
    assert len(pairs) <= 4 and all(a > 0 and b > 0 for a, b in pairs)
    np.testing.assert_array_equal(x, kept)  # the runs work on copies
