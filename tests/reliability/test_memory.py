"""Memory: steady calls of a compiled function do not grow the process (RSS slope), beyond
what plain `tf.function` grows by in the same process."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl

_PAGE = os.sysconf("SC_PAGE_SIZE")
# Bytes per call the resident set may grow by beyond plain TF's slope: allocator noise,
# far below one leaked output (this function's output and temporaries are 16 KB).
_SLOPE_BOUND = 256
# The process grows over a function's first calls, plain tf.function's too (objects of
# TF's eager call path), then stays flat (docs/reliability.md, "Memory"): the warm-up
# goes past that, and past the caches and pools settling.
_WARM_UP_CALLS = 3000
_MEASURED_CALLS = 2000


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _slope(function: Callable[[tf.Tensor], tf.Tensor], x: tf.Tensor) -> float:
    """Bytes per call the resident set grows by over `_MEASURED_CALLS` calls (least
    squares over a sample every 100 calls)."""
    calls, samples = [], []
    for step in range(_MEASURED_CALLS):
        function(x)
        if step % 100 == 99:
            calls.append(step)
            samples.append(_rss())
    return float(np.polyfit(calls, samples, 1)[0])


@pytest.mark.slow
@pytest.mark.parametrize("jit_compile", [None, True], ids=["auto", "jit_compile"])
def test_steady_calls_keep_the_resident_set_flat(jit_compile: bool | None) -> None:
    def body(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.softmax(tf.sin(x) * 2.0 + 1.0) * x

    ours = tl.function(body, jit_compile=jit_compile, min_cluster_size=1)
    plain = tf.function(body)
    x = tf.constant(np.random.default_rng(0).standard_normal((64, 64)), tf.float32)
    for _ in range(_WARM_UP_CALLS):
        ours(x)
        plain(x)
    plain_slope = _slope(plain, x)
    slope = _slope(ours, x)
    assert slope < _SLOPE_BOUND + max(0.0, plain_slope), (
        f"RSS grows by {slope:.0f} bytes per call (plain tf.function: {plain_slope:.0f})")
