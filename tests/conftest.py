"""Options and fixtures for the whole test tree.

`--slow-slice=N` (with `-m slow`) keeps one in N of the tests marked `slow`, chosen by
their position in node-id order and rotated by the day of the year, so that CI runs a
bounded, deterministic slice of the long suites each day and all of them over N days.
Tests marked `slow_rotation(K)` as well rotate K times slower, one in N*K a day (the
Keras layer suite: about two of its files a day instead of ten).
`cache_root` gives a test its own empty cache folder, once earlier background compiles
are over (`background_compiles_done`, for tests that count or patch LLVM's work).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow-slice", type=int, default=0, metavar="N",
                     help="run one in N of the tests marked slow (rotated daily)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    n = config.getoption("--slow-slice")
    if n <= 1:
        return
    day = datetime.date.today().timetuple().tm_yday
    groups: dict[int, list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            rotation = item.get_closest_marker("slow_rotation")
            groups.setdefault(rotation.args[0] if rotation else 1, []).append(item)
    dropped = set()
    for factor, group in groups.items():
        every = n * factor
        group.sort(key=lambda item: item.nodeid)
        dropped |= {id(item) for k, item in enumerate(group) if k % every != day % every}
    if dropped:
        config.hook.pytest_deselected(items=[i for i in items if id(i) in dropped])
        items[:] = [item for item in items if id(item) not in dropped]


@pytest.fixture
def background_compiles_done() -> None:
    """Earlier tests' background LLVM compiles are over: one that finishes late calls LLVM,
    counts and swaps code inside the next test. For tests that count or patch LLVM's work
    (every test waiting made the whole suite 1.7x slower)."""
    import sys

    if "tfxla_lite.codegen.background" in sys.modules:  # never imported here for a test
        sys.modules["tfxla_lite.codegen.background"].wait_for_compiles()


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               background_compiles_done: None) -> Path:
    """An empty private cache folder for every tfxla-lite cache (`TFXLA_LITE_CACHE_DIR`),
    both levels enabled, the in-process caches emptied.

    In a test that uses TF, the launch op library is loaded first, from the usual cache
    folder: the process loads it once, and a first load under the private folder would
    build it there (tens of seconds) and leave the process's library in a folder that is
    deleted after the test (tests/runtime/test_op_build.py checks the usual one)."""
    import sys

    from tfxla_lite.codegen import cache

    if sys.modules.get("tensorflow") is not None:  # None: blocked (tests/api/test_layering)
        from tfxla_lite.runtime import loader

        loader.load_library()
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TFXLA_LITE_CACHE", raising=False)
    cache.clear_memory()
    return tmp_path
