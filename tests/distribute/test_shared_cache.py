"""Two workers of one machine share the disk cache and a dump folder.

Both MultiWorkerMirroredStrategy workers (`scripts/mwms_worker.py shared_cache`)
compile the same step at the same moment into one `TFXLA_LITE_CACHE_DIR` and dump into
one `--dump_to` folder. The cache must come out whole: each worker then compiles the
step again from the disk alone (no LLVM, no pass pipeline, no entry rejected), and no
temporary file is left. Each worker's dumps and report carry its task in their names.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import cluster  # noqa: E402
from test_multi_worker import assert_same_training  # noqa: E402

_SCRIPT = Path(__file__).parent / "scripts" / "mwms_worker.py"


def _seeded_cache(root: Path) -> Path:
    """A new cache folder holding the op library only (built or found in the usual
    folder), so that the workers share kernels, not a build of the library."""
    found = subprocess.run(
        [sys.executable, "-c", "from tfxla_lite import cache_dir\n"
         "from tfxla_lite.runtime import loader\nloader.load_library()\n"
         "print(cache_dir.cache_root())"],
        env=cluster.environment(), capture_output=True, text=True, timeout=600, check=True)
    usual = Path(found.stdout.strip().splitlines()[-1])
    shutil.copytree(usual / "ops", root / "ops", ignore=shutil.ignore_patterns("*.lock"))
    return root


@pytest.mark.slow
def test_two_workers_compile_into_one_cache_and_dump_folder(tmp_path: Path) -> None:
    cache = _seeded_cache(tmp_path / "cache")
    dumps = tmp_path / "dumps"
    cluster.run_cluster(_SCRIPT, {"worker": 2}, ["shared_cache", str(tmp_path)],
                        tmp_path / "logs", timeout=300,
                        env={"TFXLA_LITE_CACHE_DIR": str(cache),
                             "TFXLA_LITE_FLAGS": f"--dump_to={dumps}"})
    workers = [json.loads((tmp_path / f"worker_{i}.json").read_text()) for i in range(2)]
    for worker in workers:
        assert_same_training(worker["tfxla_lite_ctl"], worker["tf_ctl"])
        assert worker["cold"]["llvm_compilations"] > 0, worker["cold"]
        warm = worker["warm"]
        assert warm["llvm_compilations"] == 0 and warm["pipeline_runs"] == 0, warm
        assert warm["disk_hits"] + warm["optimized_disk_hits"] > 0, warm
        assert warm["disk_rejected"] == 0, warm
        assert worker["warm_ctl"]["losses"] == worker["tfxla_lite_ctl"]["losses"]
        assert worker["warm_ctl"]["launches_run"] > 0
    for folder in ("kernels", "optimized"):
        names = [p.name for p in (cache / folder).iterdir()]
        assert names and all(n.endswith((".tlk", ".tlo")) for n in names), names
    # Each worker's files start with its task; none is unprefixed or overwritten.
    files = sorted(p.name for p in dumps.iterdir())
    assert {"worker_0.report.html", "worker_1.report.html"} <= set(files), files
    assert all(name.startswith(("worker_0.", "worker_1.")) for name in files), files
    for task in ("worker_0", "worker_1"):
        modules = [n for n in files if n.startswith(f"{task}.module_")
                   and n.endswith(".after_optimizations.txt")]
        assert len(modules) >= 2, files  # the cold and the warm compile of each cluster
        tables = [n for n in files if n.startswith(task) and n.endswith(".clustering.json")]
        assert tables and all(json.loads((dumps / n).read_text())["clusters"] for n in tables)
