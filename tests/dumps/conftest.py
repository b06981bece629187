"""Dump tests run with a fresh process-options holder (flags are read per test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tfxla_lite import flags


@pytest.fixture(autouse=True)
def fresh_options(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(flags.ENVIRONMENT_VARIABLE, raising=False)
    flags.PROCESS_OPTIONS.reset()
    yield
    flags.PROCESS_OPTIONS.reset()
