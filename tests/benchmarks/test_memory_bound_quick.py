"""benchmarks/memory_bound.py --quick: every workload and variant runs, the table and the
goals are printed, and the JSON is complete. No timing is asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import memory_bound  # noqa: E402
from tfxla_lite.runtime import loader  # noqa: E402


def test_quick_run_prints_the_table_and_the_goals(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    before = loader.output_pool_stats()
    out = tmp_path / "memory_bound.json"
    assert memory_bound.main(["--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("copy probe", "tf.function", "xla", "tfxla-lite pool", "tfxla-lite tf-alloc"):
        assert name in printed
    for workload in ("swish", "rmsnorm", "adam"):
        assert printed.count(f"\n{workload} ") == len(memory_bound.QUICK_SIZES_MB)
    assert "goals:" in printed and "load average before" in printed
    document = json.loads(out.read_text())
    assert len(document["results"]) == 3 * len(memory_bound.QUICK_SIZES_MB)
    assert len(document["goals"]) == len(document["results"])
    for result in document["results"]:
        assert result["variants"]["copy probe"]["of_probe"] == 1.0
        assert result["pool_hits"] > 0  # the pooled variant really used the pool
    after = loader.output_pool_stats()
    assert (after.enabled, after.huge_pages) == (before.enabled, before.huge_pages)


def test_bad_sizes_are_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        memory_bound.main(["--sizes", "0"])
    assert "positive" in capsys.readouterr().err
