#!/usr/bin/env bash
# Sets everything up, then runs the test suite (slow suites excluded; see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
