#!/usr/bin/env bash
# Creates .venv (if missing), installs tfxla-lite with TensorFlow and the test tools,
# and builds the C++ launch op against the installed TensorFlow. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[tf,test]"
.venv/bin/python -m tfxla_lite.runtime.build
