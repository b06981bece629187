"""The start-up hook: `TFXLA_LITE_FLAGS=--auto_jit=2 python train.py`, no code change.

`tfxla_lite_startup.pth`, installed into site-packages with the package, runs
`install()` at interpreter start only when `TFXLA_LITE_FLAGS` is set, so an
interpreter without it pays one environment lookup. `install()` imports nothing
heavy either: it puts a finder first on `sys.meta_path` that waits for the import
of `tensorflow`, and once `tensorflow/__init__.py` has run, calls
`tfxla_lite.autojit.enable_from_environment()`, which enables auto-jit when the
flags ask for it (and raises `FlagError` there on a malformed flag).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from tfxla_lite.flags import ENVIRONMENT_VARIABLE


def _enable() -> None:
    from tfxla_lite import autojit

    autojit.enable_from_environment()


class TensorFlowImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when `tensorflow` is imported, wraps its loader's
    `exec_module` so that `_enable` runs right after the package has initialized."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once only, and not for the lookup just below
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_enable(module: ModuleType) -> None:
            exec_module(module)
            del loader.exec_module  # back to the class's method
            _enable()

        loader.exec_module = exec_then_enable
        return spec


def install() -> None:
    """Arrange for auto-jit once TensorFlow is imported (see the module docstring)."""
    if not os.environ.get(ENVIRONMENT_VARIABLE):
        return
    if "tensorflow" in sys.modules:
        _enable()
    elif not any(isinstance(f, TensorFlowImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, TensorFlowImportHook())
