"""Keras acceptance tests: train with tfxla-lite enabled and with plain TF, compare."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
