"""tfxla-lite: an XLA-style auto-clustering compiler for TensorFlow, in Python.

The user-facing API (`function`, `explain`, `CompilationError`, `enable`) needs
TensorFlow and is loaded on first use, so that the compiler core
(`tfxla_lite.hlo`, `tfxla_lite.passes`, `tfxla_lite.codegen`) and the options
(`Options`, `get_options`, `set_options`, `FlagError`) import without it.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# name -> module that defines it, imported on first use
_LAZY_NAMES = {
    "function": "api", "explain": "api", "CompilationError": "api", "Function": "api",
    "ClusteringReport": "api",
    "enable": "autojit", "disable": "autojit", "is_enabled": "autojit",
    "get_options": "flags", "set_options": "flags", "FlagError": "flags",
    "Options": "options", "OptionsError": "options",
    "wait_for_compiles": "codegen.background",
    "numerics_report": "numerics_check", "reset_numerics_report": "numerics_check",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY_NAMES.get(name)
    if module_name is not None:
        import importlib

        return getattr(importlib.import_module(f"tfxla_lite.{module_name}"), name)
    raise AttributeError(f"module 'tfxla_lite' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY_NAMES))
