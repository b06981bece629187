#!/usr/bin/env bash
# Sets everything up, then runs the demo: the seed models compiled, with clusters,
# optimized HLO, buffer reuse and timings against tf.function and TF's XLA.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m tfxla_lite.demo "$@"
