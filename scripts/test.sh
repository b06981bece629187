#!/usr/bin/env bash
# Sets everything up, then lints and runs the test suite (slow suites excluded; see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
