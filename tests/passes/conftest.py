"""Lets the pass tests share `tests/hlo/hlo_builders.py` with the IR tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hlo"))
