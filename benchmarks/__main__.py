"""`python -m benchmarks`: see `benchmarks/run.py`."""

from __future__ import annotations

import sys

from benchmarks.run import main

sys.exit(main())
