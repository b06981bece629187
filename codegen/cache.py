"""Compile caches of the CPU backend: machine code reused in the process and across runs.

Where it sits: `cpu.compile` asks here before it emits LLVM IR. The key is a
*fingerprint* of everything the generated code depends on once the passes have run:
the optimized HLO text, the buffer assignment's text and the codegen options (the
thread count). The HLO printer prints every attribute codegen reads (its round-trip
tests check that), so equal texts mean equal code.

- In the process: an LRU of `CompiledCode` (engine, entry address, dumps) by
  fingerprint, `MEMORY_ENTRIES` at most. A hit shares the engine: no IR, no LLVM.
- On disk: `<cache root>/kernels/<key>.tlk` (root: `tfxla_lite.cache_dir`), where
  `key` hashes the fingerprint with the tfxla-lite version, a hash of the codegen
  sources, llvmlite's and LLVM's versions, the target triple and the host CPU name
  and features. A file is one line of JSON (the manifest: all of the above, entry
  symbol, temp bytes, shapes, kernel count, the object's external symbols, and the
  size and SHA-256 of each section) followed by the sections: the object file MCJIT
  produced, then the LLVM IR texts (zlib). A load checks every manifest field and
  checksum and that each external symbol resolves; anything else (truncated, flipped,
  foreign, unreadable) counts as a miss, is logged at DEBUG and is overwritten by the
  fresh compile. Writes go to a private temporary file renamed into place, so
  concurrent processes see a whole entry or none; hits refresh the file's mtime and
  the oldest entries are removed beyond `DISK_ENTRIES`.

`TFXLA_LITE_CACHE` (read at every compile) sets the default: unset or `1`: both
caches; `memory`: the process only; `0`: none. `compile_module(..., cache=False)`
turns both off for one compile, `cache=True` turns both on. `stats()` counts LLVM
compilations and hits, so tests can see that a compile did no LLVM work.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import llvmlite

FORMAT = "tfxla-lite-kernel-1"
MEMORY_ENTRIES = 256
DISK_ENTRIES = 4096
ENTRY_SUFFIX = ".tlk"

logger = logging.getLogger("tfxla_lite")


@dataclass
class CompiledCode:
    """The machine code of one fingerprint and what an `Executable` shows of it."""

    engine: Any  # llvmlite ExecutionEngine owning the code
    entry_address: int
    kernel_count: int
    llvm_ir: str
    llvm_ir_optimized: str
    object_code: bytes = b""
    source: str = "llvm"  # "llvm" (compiled now), "memory" or "disk"


@dataclass
class CacheStats:
    """Counts since the process started (or since `reset_stats`)."""

    llvm_compilations: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    disk_writes: int = 0
    disk_rejected: int = 0  # entries found but not trusted


@dataclass(frozen=True)
class CachePolicy:
    memory: bool
    disk: bool


_lock = threading.Lock()
_memory: collections.OrderedDict[str, CompiledCode] = collections.OrderedDict()
_stats = CacheStats()


def policy(cache: bool | None = None) -> CachePolicy:
    """The caches one compile uses: `cache` if given, else `TFXLA_LITE_CACHE`."""
    if cache is not None:
        return CachePolicy(bool(cache), bool(cache))
    value = os.environ.get("TFXLA_LITE_CACHE", "1").strip().lower()
    if value in ("0", "off", "false", "no", "none"):
        return CachePolicy(False, False)
    if value == "memory":
        return CachePolicy(True, False)
    return CachePolicy(True, True)


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


def clear_memory() -> None:
    """Forget the in-process entries (their executables keep their own engines)."""
    with _lock:
        _memory.clear()


def fingerprint(optimized_hlo_text: str, assignment_text: str, threads: int) -> str:
    hasher = hashlib.sha256()
    for part in (optimized_hlo_text, assignment_text, f"threads={threads}"):
        hasher.update(part.encode())
        hasher.update(b"\0")
    return hasher.hexdigest()


# -- in the process --------------------------------------------------------------------

def memory_lookup(key: str) -> CompiledCode | None:
    with _lock:
        code = _memory.get(key)
        if code is None:
            return None
        _memory.move_to_end(key)
        _stats.memory_hits += 1
        return dataclasses.replace(code, source="memory")


def memory_store(key: str, code: CompiledCode) -> None:
    with _lock:
        _memory[key] = code
        _memory.move_to_end(key)
        while len(_memory) > MEMORY_ENTRIES:
            _memory.popitem(last=False)


# -- on disk -----------------------------------------------------------------------------

@cache
def _codegen_source_hash() -> str:
    """Editing an emitter changes the code a fingerprint stands for: key on the sources."""
    root = Path(__file__).parent
    hasher = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        hasher.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return hasher.hexdigest()[:16]


@cache
def environment() -> dict[str, str]:
    """Everything besides the fingerprint that a cached object must have been built with."""
    import tfxla_lite
    from tfxla_lite.codegen.cpu import engine

    return {"format": FORMAT, "tfxla_lite": tfxla_lite.__version__,
            "codegen_sources": _codegen_source_hash(), "llvmlite": llvmlite.__version__,
            **engine.host_description()}


def disk_path(fingerprint_: str) -> Path:
    from tfxla_lite.cache_dir import cache_root

    hasher = hashlib.sha256(fingerprint_.encode())
    hasher.update(json.dumps(environment(), sort_keys=True).encode())
    return cache_root() / "kernels" / (hasher.hexdigest()[:40] + ENTRY_SUFFIX)


def _expected(fingerprint_: str, shapes: dict[str, Any]) -> dict[str, Any]:
    return {**environment(), "fingerprint": fingerprint_, **shapes}


def disk_load(fingerprint_: str, shapes: dict[str, Any]) -> CompiledCode | None:
    """The verified entry for `fingerprint_`, loaded into a new engine; None on a miss.

    `shapes` (entry symbol, temp bytes, parameter and output shapes) must match too.
    """
    from tfxla_lite.codegen.cpu import engine

    path = disk_path(fingerprint_)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        manifest, sections = _parse_entry(data, _expected(fingerprint_, shapes))
        engine.bind_runtime()
        llvm_engine = engine.load_object(sections["object"], manifest["symbols"])
        address = llvm_engine.get_function_address(manifest["entry"])
        if not address:
            raise ValueError(f"no symbol {manifest['entry']!r} in the object")
        llvm_ir, llvm_ir_optimized = json.loads(zlib.decompress(sections["llvm_ir"]))
    except Exception as error:  # noqa: BLE001 - a cache entry is never trusted blindly
        logger.debug("tfxla-lite: ignoring kernel cache entry %s: %s", path, error)
        count("disk_rejected")
        return None
    try:
        os.utime(path)  # least recently used entries go first
    except OSError:
        pass
    count("disk_hits")
    return CompiledCode(llvm_engine, address, int(manifest["kernel_count"]), llvm_ir,
                        llvm_ir_optimized, sections["object"], source="disk")


def _parse_entry(data: bytes, expected: dict[str, Any]
                 ) -> tuple[dict[str, Any], dict[str, bytes]]:
    newline = data.find(b"\n")
    if newline < 0:
        raise ValueError("no manifest line")
    manifest = json.loads(data[:newline])
    for name, value in expected.items():
        if manifest.get(name) != value:
            raise ValueError(f"manifest {name} is {manifest.get(name)!r}, expected {value!r}")
    sections: dict[str, bytes] = {}
    offset = newline + 1
    for section in manifest["sections"]:
        size = int(section["size"])
        body = data[offset:offset + size]
        if len(body) != size:
            raise ValueError(f"section {section['name']} truncated")
        if hashlib.sha256(body).hexdigest() != section["sha256"]:
            raise ValueError(f"section {section['name']} checksum mismatch")
        sections[section["name"]] = body
        offset += size
    if offset != len(data) or set(sections) != {"object", "llvm_ir"}:
        raise ValueError("unexpected sections or trailing bytes")
    return manifest, sections


def disk_store(fingerprint_: str, shapes: dict[str, Any], code: CompiledCode) -> None:
    """Write the entry atomically; a failure (read-only cache, full disk) is only logged."""
    if not code.object_code:
        return
    path = disk_path(fingerprint_)
    llvm_ir = zlib.compress(json.dumps([code.llvm_ir, code.llvm_ir_optimized]).encode(), 1)
    sections = [("object", code.object_code), ("llvm_ir", llvm_ir)]
    manifest = {**_expected(fingerprint_, shapes), "kernel_count": code.kernel_count,
                "symbols": undefined_symbols(code.object_code),
                "sections": [{"name": name, "size": len(body),
                              "sha256": hashlib.sha256(body).hexdigest()}
                             for name, body in sections]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(json.dumps(manifest, sort_keys=True).encode() + b"\n")
                for _, body in sections:
                    handle.write(body)
            os.chmod(temporary, 0o644)  # mkstemp's file is private; the cache is not
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    except OSError as error:
        logger.debug("tfxla-lite: could not write kernel cache entry %s: %s", path, error)
        return
    count("disk_writes")
    _prune(path.parent)


def _prune(folder: Path) -> None:
    """Remove the least recently used entries beyond DISK_ENTRIES (down to 3/4 of it)."""
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(ENTRY_SUFFIX)]
        if len(entries) <= DISK_ENTRIES:
            return
        entries.sort(key=lambda e: e.stat().st_mtime)
        for entry in entries[:len(entries) - DISK_ENTRIES * 3 // 4]:
            os.unlink(entry.path)
    except OSError:
        pass  # another process pruned the same files


def undefined_symbols(object_code: bytes) -> list[str]:
    """The external symbols an ELF64 relocatable object needs ([] for other formats:
    then only the manifest's host fields guard the load)."""
    if object_code[:5] != b"\x7fELF\x02":
        return []
    section_offset, = struct.unpack_from("<Q", object_code, 0x28)
    entry_size, count_, = struct.unpack_from("<HH", object_code, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", object_code, section_offset + i * entry_size)
               for i in range(count_)]
    names: list[str] = []
    for _, kind, _, _, offset, size, link, _, _, symbol_size in headers:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings_offset = headers[link][4]
        for position in range(offset, offset + size, symbol_size):
            name, info, _, index = struct.unpack_from("<IBBH", object_code, position)
            if index == 0 and name and info >> 4 != 0:  # undefined, global or weak
                end = object_code.index(b"\0", strings_offset + name)
                names.append(object_code[strings_offset + name:end].decode())
    return sorted(names)
