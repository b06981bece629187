#!/usr/bin/env bash
# Keras's layer tests (or, with --models, its trainers/models/optimizers/saving/... tests)
# under TFXLA_LITE_FLAGS=--auto_jit=2, failures re-run under plain TF; exits 1 when a test
# fails only under tfxla-lite. Arguments go to tfxla_lite.keras_suite
# (`scripts/keras_suite.sh core normalization`, `trainers`, `--slice 2/8`, `--json out.json`).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m tfxla_lite.keras_suite "$@"
