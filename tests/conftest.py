"""Options for the whole test tree.

`--slow-slice=N` (with `-m slow`) keeps one in N of the tests marked `slow`, chosen by
their position in node-id order and rotated by the day of the year, so that CI runs a
bounded, deterministic slice of the long suites each day and all of them over N days.
"""

from __future__ import annotations

import datetime

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow-slice", type=int, default=0, metavar="N",
                     help="run one in N of the tests marked slow (rotated daily)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    n = config.getoption("--slow-slice")
    if n <= 1:
        return
    turn = datetime.date.today().timetuple().tm_yday % n
    slow = sorted((item for item in items if item.get_closest_marker("slow")),
                  key=lambda item: item.nodeid)
    dropped = {id(item) for k, item in enumerate(slow) if k % n != turn}
    if dropped:
        config.hook.pytest_deselected(items=[i for i in items if id(i) in dropped])
        items[:] = [item for item in items if id(item) not in dropped]
