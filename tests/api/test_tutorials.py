"""Every tutorial runs to completion (at small sizes where it takes a size)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

TUTORIALS = sorted((pathlib.Path(__file__).parents[2] / "tutorials").glob("*.py"))
ARGUMENTS = {"03_timing.py": ["4096"]}


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_tutorial_runs(path: pathlib.Path) -> None:
    result = subprocess.run([sys.executable, str(path), *ARGUMENTS.get(path.name, [])],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
