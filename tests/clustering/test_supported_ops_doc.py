"""docs/supported_ops.md is the registry's own table: regenerate it when a rule changes."""

from __future__ import annotations

from pathlib import Path

from tfxla_lite.clustering import OP_RULES
from tfxla_lite.clustering.supported_ops import supported_ops_markdown

PAGE = Path(__file__).resolve().parents[2] / "docs" / "supported_ops.md"


def test_supported_ops_page_is_up_to_date() -> None:
    assert PAGE.read_text() == supported_ops_markdown(), (
        "docs/supported_ops.md is out of date; regenerate it with "
        "`python -m tfxla_lite.clustering.supported_ops > docs/supported_ops.md`")


def test_page_lists_every_registered_op() -> None:
    text = supported_ops_markdown()
    for op_type in OP_RULES:
        assert f"| {op_type} |" in text
