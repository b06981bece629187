"""Where tfxla-lite keeps what it builds between processes: one folder, no TensorFlow.

Both users of the cache sit under this root: the C++ launch op (`runtime/build.py`,
`ops/`) and the compiled kernels of the CPU backend (`codegen/cache.py`, `kernels/`).
The root is `$TFXLA_LITE_CACHE_DIR` when set, else `$XDG_CACHE_HOME/tfxla_lite`, else
`~/.cache/tfxla_lite`. It is read at every call, so tests can move it with the
environment variable.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The tfxla-lite cache folder (it may not exist yet)."""
    override = os.environ.get("TFXLA_LITE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tfxla_lite"
