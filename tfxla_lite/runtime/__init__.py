"""The TfxlaLiteLaunch op: runs compiled executables on TF tensors, zero-copy.

launch_op.cc   the C++ op and kernel, the process-wide executable registry, the pool of
               output blocks, and the parallel runtime of generated kernels (TF's
               intra-op pool, libgomp, serial)
build.py       compiles it against the running TF into a cache (`python -m ...build`)
loader.py      loads it, registers executables (ctypes), emits launch nodes

Names are loaded on first use, so that `python -m tfxla_lite.runtime.build` runs the
build module once, as __main__, without importing it a second time through here.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BuildError": "build",
    "build_op_library": "build",
    "ArenaStats": "loader",
    "arena_stats": "loader",
    "COMPILE_OP_TYPE": "loader",
    "OP_TYPE": "loader",
    "Refusal": "loader",
    "Specialization": "loader",
    "SpecializationRequest": "loader",
    "compiled_for": "loader",
    "dynamic_stats": "loader",
    "forwarded_outputs": "loader",
    "variables_in_place": "loader",
    "register_dynamic": "loader",
    "OpLibrary": "loader",
    "OutputPoolStats": "loader",
    "output_pool_stats": "loader",
    "set_output_pool": "loader",
    "trim_output_pool": "loader",
    "PARALLEL_RUNTIMES": "loader",
    "ParallelStats": "loader",
    "parallel_runtime": "loader",
    "parallel_stats": "loader",
    "set_parallel_runtime": "loader",
    "launch": "loader",
    "load_library": "loader",
    "load_ops": "loader",
    "register_executable": "loader",
    "registry_size": "loader",
    "unregister": "loader",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"tfxla_lite.runtime.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'tfxla_lite.runtime' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))
