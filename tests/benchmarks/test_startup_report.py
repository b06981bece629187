"""benchmarks/startup.py names the repeats whose cold and warm processes saw other
sources (a tree edited during the run): their warm misses are the caches' invalidation,
not a nondeterministic key (tests/warm_start/test_rewrite_determinism.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import startup  # noqa: E402
from tfxla_lite import rewrite_cache  # noqa: E402


def _row(sources_edited: list[list[str]]) -> dict:
    return {"tf_ms": 70.0, "xla_ms": 100.0, "cold_ms": 98.0, "warm_ms": 60.0,
            "warm_pipelines": [1, 0], "warm_llvm": [0, 0], "warm_rewrite_hits": [0, 1],
            "sources_edited": sources_edited, "cold_vs_xla": 0.98, "warm_vs_cold": 0.61,
            "warm_vs_xla": 0.6, "cold_overhead_ms": 28.0, "warm_overhead_ms": -10.0}


def test_repeats_with_edited_sources_are_named() -> None:
    text = startup.report({"mlp": _row([["compiler_sources"], []])}, 2)
    assert ("mlp, repeat 1: sources edited between the cold and the warm process "
            "(compiler_sources)") in text
    assert "repeat 2" not in text
    assert "sources edited" not in startup.report({"mlp": _row([[], []])}, 2)


def test_the_children_report_every_source_hash_the_caches_key_on() -> None:
    sources = {k for k in rewrite_cache.environment() if k.endswith("_sources")}
    assert sources == {"codegen_sources", "compiler_sources", "tf_side_sources"}


def test_the_overlap_comparison_alternates_the_variants(monkeypatch) -> None:
    calls: list[tuple[str, str]] = []

    def spawn(variant: str, name: str, quick: bool, cache: object) -> dict:
        overlap = startup.os.environ["TFXLA_LITE_OVERLAP_LLVM"]
        calls.append((name, overlap))
        return {"seconds": 0.080 if overlap == "1" else 0.090}

    monkeypatch.setattr(startup, "_spawn", spawn)
    monkeypatch.setattr(startup, "_fresh_cache", lambda: None)
    monkeypatch.delenv("TFXLA_LITE_OVERLAP_LLVM", raising=False)
    text = startup.compare_overlap(["gelu"], 3, quick=True)
    assert [v for _, v in calls] == ["0", "1", "1", "0", "0", "1"]
    assert "| gelu | 90 | 80 | 90 | 80 | 3 of 3 |" in text
    assert "TFXLA_LITE_OVERLAP_LLVM" not in startup.os.environ


def test_the_tiered_comparison_alternates_and_reports_xla_and_exits(monkeypatch) -> None:
    calls: list[tuple[str, str | None]] = []

    def spawn(variant: str, name: str, quick: bool, cache: object) -> dict:
        tiered = startup.os.environ.get("TFXLA_LITE_TIERED") if variant == "lite" else None
        calls.append((variant, tiered))
        seconds = {"xla": 0.100, "0": 0.120, "1": 0.090}[tiered or variant]
        return {"seconds": seconds, "exit_seconds": seconds + (0.5 if tiered else 0.0),
                "cpu_seconds": seconds / 2}

    monkeypatch.setattr(startup, "_spawn", spawn)
    monkeypatch.setattr(startup, "_fresh_cache", lambda: None)
    monkeypatch.delenv("TFXLA_LITE_TIERED", raising=False)
    text = startup.compare_tiered(["gelu"], 2, quick=True)
    assert calls == [("xla", None), ("lite", "0"), ("lite", "1"),
                     ("xla", None), ("lite", "1"), ("lite", "0")]
    assert ("| gelu | 120 | 90 | 120 | 90 | 2 of 2 | 100 | 1.20 | 0.90 | 620 | 590 | 60 | 45 |"
            in text)
    assert "cold/XLA geometric mean: off 1.20, on 0.90" in text
    assert "TFXLA_LITE_TIERED" not in startup.os.environ
