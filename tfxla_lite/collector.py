"""Python's garbage collector paused while tfxla-lite compiles.

Used around the compile of a signature (`api.Function._compile`: trace, clustering,
compile, re-trace) and of a dynamic cluster's specialization (`dynamic.DynamicCluster`),
the two places where a first call spends its time in Python. The `pause_collector`
option (`--pause_collector=false`) turns the pause off.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused(enabled: bool = True) -> Iterator[None]:
    """Python's cyclic garbage collector off while a signature compiles, back on after;
    nothing when `enabled` is False (the `pause_collector` option).

    A compile (TF's trace and autograph's conversion, clustering, lowering, the re-trace)
    allocates hundreds of thousands of short-lived objects beside TF's heap of about
    350,000; each full collection they trigger walks all of it (docs/benchmarks.md has
    the first calls and warm starts this saves). Nothing is
    leaked: the compile's cycles are collected by the next automatic collection. Left
    alone when the collector is already off (the caller's choice, or an enclosing
    compile: a `tl.function` traced inside another).
    """
    if not enabled or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
