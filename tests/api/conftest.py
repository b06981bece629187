"""API tests compile with the HLO verifier after every pass (docs/conventions.md, habit 5)."""

from __future__ import annotations

import pytest

from tfxla_lite import options


@pytest.fixture(autouse=True)
def _verify_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options, "DEFAULT_OPTIONS", options.Options(verify=True))
