"""The stage cache: one mechanism for every compile stage a warm process may skip.

At the bottom of `codegen/` (it imports only `background`, `tfxla_lite.cache_dir` and
`flags`), so that every cached stage uses it: machine code (`cpu/kernel_cache.py`),
optimized modules (`module_cache.py`), rewrites (`tfxla_lite/rewrite_cache.py`) and
AutoGraph conversions (`tfxla_lite/autograph_cache.py`), each a `Stage`. One entry format
(a JSON header line with every version and checksum, then the sections), one atomic
write, one validated load: anything that fails a check is a miss, removed and rewritten,
never an error to the user; least recently used entries beyond `DISK_ENTRIES` go. In the
process, `MemoryTable` is an LRU whose keys may be pending on a background compile.
`stats()` counts hits, writes, rejections and the work saved. docs/architecture.md.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import tfxla_lite
from tfxla_lite import flags
from tfxla_lite.cache_dir import cache_root
from tfxla_lite.codegen import background
from tfxla_lite.options import CACHE_SETTINGS

logger = logging.getLogger("tfxla_lite")

DISK_ENTRIES = 4096  # per stage; beyond it the least recently used go, down to 3/4
T = TypeVar("T")

# -- counters ------------------------------------------------------------------------------


@dataclass
class CacheStats:
    """Counts since the process started (or since `reset_stats`)."""

    llvm_compilations: int = 0
    memory_hits: int = 0
    disk_hits: int = 0  # the kernel stage's
    disk_writes: int = 0
    disk_rejected: int = 0  # entries found but not trusted
    pipeline_runs: int = 0  # pass pipelines run by compile_module
    optimized_memory_hits: int = 0
    optimized_disk_hits: int = 0
    optimized_disk_writes: int = 0
    optimized_disk_rejected: int = 0
    rewrite_hits: int = 0  # whole rewrites reused (tfxla_lite/rewrite_cache.py)
    rewrite_misses: int = 0
    rewrite_writes: int = 0
    rewrite_rejected: int = 0
    autograph_hits: int = 0  # AutoGraph conversions reused (tfxla_lite/autograph_cache.py)
    autograph_misses: int = 0
    autograph_writes: int = 0
    autograph_rejected: int = 0
    # Tiered compiles (codegen/cpu/tiers.py): quick-tier objects compiled (never cached),
    # O3 code swapped in, O3 compiles that failed (the quick code kept running) or were
    # dropped at interpreter exit.
    quick_compilations: int = 0
    tier_swaps: int = 0
    tier_failures: int = 0
    tier_abandoned: int = 0


_lock = threading.Lock()
_stats = CacheStats()


def stats() -> CacheStats:
    """A copy of the counters."""
    with _lock:
        return dataclasses.replace(_stats)


def reset_stats() -> None:
    global _stats
    with _lock:
        _stats = CacheStats()


def count(field: str) -> None:
    with _lock:
        setattr(_stats, field, getattr(_stats, field) + 1)


# -- which caches a compile uses -------------------------------------------------------------


@dataclass(frozen=True)
class CachePolicy:
    memory: bool
    disk: bool
    # The folder when the compile began: a background write lands there even if
    # TFXLA_LITE_CACHE_DIR changes meanwhile (None: `cache_root()` when written).
    root: Path | None = None


def policy(cache: bool | str | None = None) -> CachePolicy:
    """The caches one compile uses: True or "on" both, "memory" the process's only, False
    or "off" none (None: the process's `cache` option, `tfxla_lite.flags.switch`)."""
    if isinstance(cache, bool):
        return CachePolicy(cache, cache, cache_root() if cache else None)
    setting = flags.switch("cache") if cache is None else cache
    if setting not in CACHE_SETTINGS:
        raise ValueError(f"cache must be a bool, None or one of {', '.join(CACHE_SETTINGS)}, "
                         f"got {cache!r}")
    disk = setting == "on"
    return CachePolicy(setting != "off", disk, cache_root() if disk else None)


# -- in the process --------------------------------------------------------------------------


class MemoryTable:
    """An in-process LRU of at most `max_entries` entries and `max_bytes` bytes (the
    newest is kept even when alone it is larger); `hits` names the counter of a hit.
    A key may be pending, a background job submitted with `job_key(key)`: `get` then
    waits for the job, whose result is the value."""

    def __init__(self, name: str, max_bytes: int, hits: str, max_entries: int = 256) -> None:
        self.name, self.max_bytes, self.hits, self.max_entries = name, max_bytes, hits, max_entries
        self._values: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._sizes: dict[str, int] = {}
        self.bytes = 0
        _tables.append(self)

    def get(self, key: str) -> Any:
        """The value of `key` (waiting for a pending one), or None."""
        with _lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
                setattr(_stats, self.hits, getattr(_stats, self.hits) + 1)
                return value
        job = background.pending(self.job_key(key))
        if job is None:
            return None
        try:
            value = job.result()
        except Exception:  # noqa: BLE001 - a failed compile: the caller compiles afresh
            return None
        count(self.hits)
        return value

    def put(self, key: str, value: Any, size: int) -> None:
        with _lock:
            self.bytes += size - self._sizes.get(key, 0)
            self._sizes[key] = size
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > 1 and (len(self._values) > self.max_entries
                                             or self.bytes > self.max_bytes):
                oldest, _ = self._values.popitem(last=False)
                self.bytes -= self._sizes.pop(oldest)

    def job_key(self, key: str) -> tuple[str, str]:
        """The key of a background job giving the value of `key` (`background.submit`)."""
        return self.name, key

    def clear(self) -> None:
        with _lock:
            self._values.clear()
            self._sizes.clear()
            self.bytes = 0
        background.forget_keys(self.name)

    def usage(self) -> tuple[int, int]:
        """(entries, bytes)."""
        with _lock:
            return len(self._values), self.bytes


_tables: list[MemoryTable] = []


def clear_memory() -> None:
    """Forget every in-process entry (executables keep the engines they use)."""
    for table in _tables:
        table.clear()


def memory_usage() -> dict[str, tuple[int, int]]:
    """(entries, bytes) of each in-process table, by name."""
    return {table.name: table.usage() for table in _tables}


# -- on disk ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One cached stage on disk: entries `<root>/<name>/<digest><suffix>`.

    `environment()`: everything besides the key an entry must have been written with
    (versions, source hashes, the host). `counters`: the prefix of its `CacheStats`
    fields (`<counters>_hits`, `_writes`, `_rejected`, and `_misses` where it has one);
    `counts_hits` False: the caller counts a hit once it has checked the entry itself."""

    name: str
    suffix: str
    format: str
    environment: Callable[[], dict[str, Any]]
    counters: str
    counts_hits: bool = True

    def header(self, key: str) -> dict[str, Any]:
        return {"stage": self.name, "format": self.format, "key": key,
                "tfxla_lite": tfxla_lite.__version__, **self.environment()}

    def path(self, key: str, root: Path | None = None) -> Path:
        """The entry's file under `root` (default: `cache_root()` now)."""
        digest = hashlib.sha256(json.dumps(self.header(key), sort_keys=True).encode())
        return (root or cache_root()) / self.name / (digest.hexdigest()[:40] + self.suffix)

    def load(self, key: str, decode: Callable[[dict[str, Any], list[bytes]], T],
             expected: dict[str, Any] | None = None) -> T | None:
        """`decode(header, sections)` of the entry of `key`, or None: absent, or failing
        a check of the header (with `expected`'s fields), of a section or of `decode`
        (removed then)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self._count("misses")
            return None
        try:
            header, sections = read_entry(data, {**self.header(key), **(expected or {})})
            value = decode(header, sections)
        except Exception as error:  # noqa: BLE001 - a cache entry is never trusted blindly
            self.reject(path, error)
            return None
        try:
            os.utime(path)  # least recently used entries go first
        except OSError:
            pass
        if self.counts_hits:
            self._count("hits")
        return value

    def store(self, key: str, sections: list[tuple[str, bytes]],
              fields: dict[str, Any] | None = None, root: Path | None = None,
              describe: Callable[[str, bytes], dict[str, Any]] | None = None) -> None:
        """Write the entry of `key` atomically under `root`, its header with `fields`
        (and each section's `describe(name, body)`); a failure (read-only cache, full
        disk) is only logged."""
        path = self.path(key, root)
        try:
            write_entry(path, {**self.header(key), **(fields or {})}, sections, describe)
        except OSError as error:
            logger.debug("tfxla-lite: could not write %s cache entry %s: %s", self.name,
                         path, error)
            return
        self._count("writes")
        _prune(path.parent, self.suffix)

    def load_json(self, key: str, decode: Callable[[Any], T]) -> T | None:
        """`load` of an entry `store_json` wrote: `decode` of its JSON value."""
        def decoded(_: dict[str, Any], sections: list[bytes]) -> T:
            (body,) = sections
            return decode(json.loads(zlib.decompress(body)))
        return self.load(key, decoded)

    def store_json(self, key: str, value: Any) -> None:
        """`store` one JSON value (zlib'd) as the entry's one section."""
        self.store(key, [("payload", zlib.compress(json.dumps(value).encode(), 1))])

    def reject(self, path_or_key: Path | str, error: Any) -> None:
        """Count, log and remove an entry that failed a check (`load`'s or the caller's):
        the fresh compile rewrites it, and a second look must not read it again."""
        path = self.path(path_or_key) if isinstance(path_or_key, str) else path_or_key
        logger.debug("tfxla-lite: ignoring %s cache entry %s: %s", self.name, path, error)
        self._count("rejected")
        try:
            os.unlink(path)
        except OSError:
            pass

    def _count(self, what: str) -> None:
        field = f"{self.counters}_{what}"
        if hasattr(_stats, field):
            count(field)


def write_entry(path: Path, header: dict[str, Any], sections: list[tuple[str, bytes]],
                describe: Callable[[str, bytes], dict[str, Any]] | None = None) -> None:
    """Write `header` (with each section's name, size, SHA-256 and `describe(name, body)`)
    as one JSON line, then the sections, into a temporary file renamed over `path`.
    Raises OSError."""
    described = [{**(describe(name, body) if describe else {}), "name": name,
                  "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
                 for name, body in sections]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(json.dumps({**header, "sections": described}, sort_keys=True).encode()
                         + b"\n")
            for _, body in sections:
                handle.write(body)
        os.chmod(temporary, 0o644)  # mkstemp's file is private; the cache is not
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def read_entry(data: bytes, expected: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
    """An entry's header and sections, once every field of `expected` matches and every
    section has its size and checksum, with no bytes after the last; raises ValueError
    (or a JSON error)."""
    newline = data.find(b"\n")
    if newline < 0:
        raise ValueError("no header line")
    header = json.loads(data[:newline])
    for name, value in expected.items():
        if header.get(name) != value:
            raise ValueError(f"manifest {name} is {header.get(name)!r}, expected {value!r}")
    sections = []
    offset = newline + 1
    for section in header["sections"]:
        size = int(section["size"])
        body = data[offset:offset + size]
        if len(body) != size:
            raise ValueError(f"section {section['name']} truncated")
        if hashlib.sha256(body).hexdigest() != section["sha256"]:
            raise ValueError(f"section {section['name']} checksum mismatch")
        sections.append(body)
        offset += size
    if offset != len(data):
        raise ValueError(f"{len(data) - offset} bytes after the last section")
    return header, sections


def _prune(folder: Path, suffix: str) -> None:
    """Remove the least recently used entries beyond DISK_ENTRIES (down to 3/4 of it)."""
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(suffix)]
        if len(entries) <= DISK_ENTRIES:
            return
        entries.sort(key=lambda e: e.stat().st_mtime)
        for entry in entries[:len(entries) - DISK_ENTRIES * 3 // 4]:
            os.unlink(entry.path)
    except OSError:
        pass  # another process pruned the same files
