"""benchmarks/parallel_runtime.py: one process times every runtime on one compiled
workload (the bursts really switch runtimes) and writes complete JSON; bad arguments
are refused. No timing is asserted: only the shape of the results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import parallel_runtime  # noqa: E402
from tfxla_lite.codegen.cpu import parallel  # noqa: E402
from tfxla_lite.flags import get_options  # noqa: E402
from tfxla_lite.runtime import loader  # noqa: E402


@pytest.mark.skipif(parallel.effective_threads(None) < 2, reason="one CPU: no parallel region")
def test_runs_every_runtime_and_writes_json(tmp_path: Path) -> None:
    before = loader.parallel_stats()
    out = tmp_path / "runtimes.json"
    assert parallel_runtime.main(["softmax_1024x1024", "--repeats", "2", "--burst-seconds",
                                  "0.002", "--json", str(out)]) == 0
    after = loader.parallel_stats()
    document = json.loads(out.read_text())
    assert {"cores", "load_before", "load_after", "results"} <= set(document)
    (result,) = document["results"]
    runtimes = ["tf", "openmp", "serial", "tf_team"]
    for field in ("median_ms", "best_ms", "median_vs_first", "cpu_ms"):
        assert list(result[field]) == runtimes
    assert result["median_vs_first"]["tf"] == 1.0
    assert result["pool_regions"] > 0
    assert after.on_openmp > before.on_openmp and after.serial > before.serial
    assert loader.parallel_runtime() == get_options().parallel_runtime  # restored


@pytest.mark.parametrize("argv,message", [
    (["gelu", "--runtimes", "tf,gomp"], "unknown runtime"),
    (["gelu", "--repeats", "0"], "at least 1"),
    (["no_such_workload"], "unknown workload"),
])
def test_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parallel_runtime.main(argv)
    assert message in capsys.readouterr().err
