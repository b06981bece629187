"""tfxla-lite: an XLA-style auto-clustering compiler for TensorFlow, in Python.

The user-facing API (`function`, `explain`, `CompilationError`) needs
TensorFlow and is loaded on first use, so that the compiler core
(`tfxla_lite.hlo`, `tfxla_lite.passes`, `tfxla_lite.codegen`) imports without it.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API_NAMES = ("function", "explain", "CompilationError", "Function", "ClusteringReport")


def __getattr__(name: str) -> Any:
    if name in _API_NAMES:
        from tfxla_lite import api

        return getattr(api, name)
    raise AttributeError(f"module 'tfxla_lite' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_API_NAMES))
