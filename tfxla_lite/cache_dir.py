"""Where tfxla-lite keeps what it builds between processes: one folder, no TensorFlow.

Both users of the cache sit under this root: the C++ launch op (`runtime/build.py`,
`ops/`) and the compiled kernels of the CPU backend (`codegen/cache.py`, `kernels/`).
The root is `$TFXLA_LITE_CACHE_DIR` when set, else `$XDG_CACHE_HOME/tfxla_lite`, else
`~/.cache/tfxla_lite`. It is read at every call, so tests can move it with the
environment variable.

A root that cannot hold the cache (a regular file, a folder under one, a folder this
user may not write) would make every compile fail, since the op library must be built
somewhere: such a root is replaced, for the rest of the process, by a private temporary
folder (removed at exit), with one `CacheDirWarning` per configured root. Nothing is
shared between processes then, so each one builds the op library again.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path


class CacheDirWarning(UserWarning):
    """The configured cache folder is unusable; a private temporary one is used instead."""


_lock = threading.Lock()
# configured root -> the root used for it (itself, or the temporary fallback).
_resolved: dict[Path, Path] = {}
_fallback: Path | None = None


def configured_root() -> Path:
    """The cache folder the environment asks for (it may not exist yet)."""
    override = os.environ.get("TFXLA_LITE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tfxla_lite"


def cache_root() -> Path:
    """The tfxla-lite cache folder (it may not exist yet): the configured one when it can
    be created or written, else the process's private temporary fallback."""
    configured = configured_root()
    resolved = _resolved.get(configured)
    if resolved is not None:
        return resolved
    with _lock:
        resolved = _resolved.get(configured)
        if resolved is None:
            problem = unusable_reason(configured)
            resolved = configured if problem is None else _fallback_root()
            # Recorded before warning: a warnings filter set to "error" must not make
            # every later call raise.
            _resolved[configured] = resolved
            if problem is not None:
                warnings.warn(f"tfxla-lite: the cache folder {configured} is unusable "
                              f"({problem}); using the private temporary folder {resolved} "
                              f"for this process instead (set TFXLA_LITE_CACHE_DIR to a "
                              f"writable folder to share the cache between processes)",
                              CacheDirWarning, stacklevel=2)
    return resolved


def unusable_reason(root: Path) -> str | None:
    """Why `root` cannot hold the cache, or None: its nearest existing ancestor (itself
    when it exists) must be a folder this process may write and enter."""
    existing = root
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def _fallback_root() -> Path:
    global _fallback
    if _fallback is None:
        _fallback = Path(tempfile.mkdtemp(prefix="tfxla_lite-cache-"))
        # A loaded op library stays mapped after its file is removed.
        atexit.register(shutil.rmtree, _fallback, ignore_errors=True)
    return _fallback
