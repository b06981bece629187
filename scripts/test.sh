#!/usr/bin/env bash
# Sets everything up, then lints and runs the test suite (slow suites excluded; see docs/testing.md).
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
# Two worker processes, each test file on one of them (its module fixtures and the order of
# its tests kept); TFXLA_LITE_TEST_WORKERS=0 runs everything in this process.
exec .venv/bin/python -m pytest -n "${TFXLA_LITE_TEST_WORKERS:-2}" --dist loadfile "$@"
