#!/usr/bin/env bash
# Sets everything up, then lints and runs the test suite (slow suites excluded; see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The report's browser test (tests/dumps) needs Chromium: install Debian's when it is
# missing and we may (root, apt-get); otherwise that test skips and says why.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
        && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends chromium fonts-liberation; } >/dev/null 2>&1 || true
fi
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
