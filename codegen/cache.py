"""Compile caches of the CPU backend: machine code reused in the process and across runs.

Where it sits: `cpu.compile` asks here before it emits LLVM IR. The key is a
*fingerprint* of everything the generated code depends on once the passes have run:
the optimized HLO text, the buffer assignment's text and the codegen options (the
thread count). The HLO printer prints every attribute codegen reads (its round-trip
tests check that), so equal texts mean equal code.

- In the process: an LRU of `CompiledCode` (engine, entry address, dumps) by
  fingerprint, at most `MEMORY_ENTRIES` entries and `MEMORY_BYTES` bytes (counted from
  the object files, bitcode and IR texts held, plus `ENGINE_BYTES` per engine). A hit
  shares the engine: no IR, no LLVM. An evicted entry's engine lives on in the
  executables that use it, and goes with the last of them.
- On disk: `<cache root>/kernels/<key>.tlk` (root: `tfxla_lite.cache_dir`), where
  `key` hashes the fingerprint with the tfxla-lite version, a hash of the codegen
  sources, llvmlite's and LLVM's versions, the target triple and the host CPU name
  and features. A file is one line of JSON (the manifest: all of the above, entry
  symbol, temp bytes, shapes, kernel count, the functions made internal again when the
  parts are linked, and the size and SHA-256 of each section, with each object's
  undefined and defined global symbols) followed by the sections: one object file per
  part of the module (`engine.compile_parts`), the emitted LLVM IR text (zlib), then
  each part's optimized bitcode. A load checks every manifest field and checksum, that
  each object's symbols are those the manifest lists, and that every symbol no object
  defines resolves in the process; anything else (truncated, flipped, foreign, the
  single-object format before it, unreadable) counts as a miss, is logged at DEBUG and
  is overwritten by the fresh compile. The IR texts are decompressed (the optimized
  one linked from the bitcode) only when something reads them. Writes go to a private
  temporary file renamed into place, so concurrent processes see a whole entry or
  none; hits refresh the file's mtime and the oldest entries are removed beyond
  `DISK_ENTRIES`.

One level up, `compile_module` keeps *optimized modules* the same two ways: by a key
of the module as lowered (its HLO text), the pipeline, the donated parameters and the
thread count, the optimized HLO text, the buffer assignment's text, the donations
and the kernel fingerprint (`OptimizedModule`), so a warm start runs neither the pass
pipeline nor buffer assignment nor LLVM. On disk: `<cache root>/optimized/<key>.tlo`,
a manifest line (the kernel environment plus a hash of the `hlo/` and `passes/`
sources, the key, the payload's size and SHA-256) and the zlib'd payload; a load
checks all of it. The executable built from a hit (`CachedExecutable`) parses its
optimized module and re-runs buffer assignment only when something asks for them
(dumps, the report page), and then checks the assignment against the stored text.
The key leaves metadata out, so an entry also stores the metadata of each line of the
module it was lowered from, and a hit maps it onto the current module's lines
(`with_current_metadata`): the source lines shown are always the current function's.
The rewrite cache one level further up (`tfxla_lite/rewrite_cache.py`) shares the entry
format (`write_manifest_entry`, `read_manifest_entry`) and counts in `stats()`.

`TFXLA_LITE_CACHE` (read at every compile, `codegen/config.py`) sets the default: unset
or `1`: both caches; `memory`: the process only; `0`: none. `compile_module(...,
cache=...)` chooses for one compile (False or "off", "memory", True or "on"; the front
end passes its `cache` option). `stats()` counts LLVM
compilations, pass pipelines run and hits, so tests can see that a compile did no
LLVM work and ran no pass.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import re
import struct
import tempfile
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import llvmlite

from tfxla_lite.codegen import config
from tfxla_lite.codegen.executable import Executable
from tfxla_lite.hlo.ir import HloModule

FORMAT = "tfxla-lite-kernel-2"
MEMORY_ENTRIES = 256
MEMORY_BYTES = 64 << 20
# The optimized modules' in-process LRU (`optimized_lookup`): texts only, no code.
OPTIMIZED_MEMORY_BYTES = 32 << 20
DISK_ENTRIES = 4096
ENTRY_SUFFIX = ".tlk"

logger = logging.getLogger("tfxla_lite")


@dataclass
class CompiledCode:
    """The machine code of one fingerprint and what an `Executable` shows of it."""

    engine: Any  # llvmlite ExecutionEngine owning the code
    entry_address: int
    kernel_count: int
    # The texts, or callables giving them (`Executable` calls one when the text is read).
    llvm_ir: str | Callable[[], str]
    llvm_ir_optimized: str | Callable[[], str]
    objects: tuple[bytes, ...] = ()  # one object file per part (engine.compile_parts)
    bitcode: tuple[bytes, ...] = ()  # each part's optimized IR
    internal: frozenset[str] = frozenset()  # internal again once the parts are linked
    source: str = "llvm"  # "llvm" (compiled now), "memory" or "disk"


@dataclass
class CacheStats:
    """Counts since the process started (or since `reset_stats`)."""

    llvm_compilations: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
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


@dataclass(frozen=True)
class CachePolicy:
    memory: bool
    disk: bool
    # The disk caches' folder when the compile began: a background write lands there even
    # if TFXLA_LITE_CACHE_DIR changes meanwhile (None: `cache_root()` when written).
    root: Path | None = None


class _MemoryTable(collections.OrderedDict):
    """An in-process LRU (oldest first) that knows the bytes each entry holds; bounded
    by `_lru_store`. Read under `_lock`."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: dict[str, int] = {}
        self.bytes = 0

    def clear(self) -> None:
        super().clear()
        self.sizes.clear()
        self.bytes = 0


_lock = threading.Lock()
_memory: _MemoryTable = _MemoryTable()
# (process id, key) -> the future of machine code a background compile is still making
_pending: dict[tuple[int, str], Any] = {}
_stats = CacheStats()


def switched_off(variable: str) -> bool:
    """Whether the environment variable `variable` turns its cache off (0, off, false,
    no or none; unset means on; read by `codegen/config.py`)."""
    return config.switched_off(variable)


def policy(cache: bool | str | None = None) -> CachePolicy:
    """The caches one compile uses: `cache` if given (True or "on": both; "memory": the
    process only; False or "off": none), else `TFXLA_LITE_CACHE` (`config.cache_setting`)."""
    from tfxla_lite.cache_dir import cache_root

    if isinstance(cache, bool):
        return CachePolicy(cache, cache, cache_root() if cache else None)
    setting = config.cache_setting() if cache is None else cache
    if setting not in config.CACHE_SETTINGS:
        raise ValueError(f"cache must be a bool, None or one of "
                         f"{', '.join(config.CACHE_SETTINGS)}, got {cache!r}")
    disk = setting == "on"
    return CachePolicy(setting != "off", disk, cache_root() if disk else None)


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
    """Forget the in-process entries, machine code and optimized modules (their
    executables keep their own engines)."""
    with _lock:
        _memory.clear()
        _optimized_memory.clear()
        _pending.clear()


def fingerprint(optimized_hlo_text: str, assignment_text: str, threads: int) -> str:
    hasher = hashlib.sha256()
    for part in (optimized_hlo_text, assignment_text, f"threads={threads}"):
        hasher.update(part.encode())
        hasher.update(b"\0")
    return hasher.hexdigest()


def kernel_fingerprint(optimized_hlo_text: str, assignment_text: str,
                       donations: tuple[tuple[int, int], ...], threads: int,
                       constants: str) -> str:
    """The machine code's key: `fingerprint` with the donations (in-place variants) and
    the digest of the module's constants (`constants_digest`)."""
    suffix = f"\ndonations {donations}" if donations else ""
    return fingerprint(without_metadata(optimized_hlo_text) + f"\nconstants {constants}",
                       assignment_text + suffix, threads)


# `, metadata={op_type="..." op_name="..." source_file="..." source_line=N}`, which the
# printer puts last on an instruction's line; strings escape `"` and `\`.
METADATA = re.compile(r', metadata=\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\}$', re.MULTILINE)


def without_metadata(hlo_text: str) -> str:
    """The HLO text without instruction metadata (TF op names, the user's source lines):
    no pass decides on it (they only carry it along) and codegen never reads it, so the
    same model called from another line, or built again, shares its compile (XLA's
    fingerprint leaves metadata out as well)."""
    return METADATA.sub("", hlo_text)


def constants_digest(module: HloModule) -> str:
    """A hash of every constant's values: the printer elides literals of more than
    `MAX_PRINTED_LITERAL_ELEMENTS` elements as `{...}`, so the HLO text alone does not
    tell two modules that differ only in a large constant apart (as XLA's fingerprint
    hashes literals, not their printed form)."""
    import numpy as np

    hasher = hashlib.sha256()
    for computation in module.computations:
        for inst in computation.instructions:
            if inst.opcode == "constant":
                literal = np.ascontiguousarray(inst.literal)
                hasher.update(f"{computation.name}/{inst.name} {inst.shape} "
                              f"{literal.dtype.str}\0".encode())
                hasher.update(literal.tobytes())
    return hasher.hexdigest()


# -- in the process --------------------------------------------------------------------

def memory_lookup(key: str) -> CompiledCode | None:
    """The machine code of `key` in this process; one that a background compile is
    still making (`memory_pending`) is waited for: a second compile of the module would
    do LLVM's work again."""
    with _lock:
        code = _memory.get(key)
        pending = _pending.get((os.getpid(), key)) if code is None else None
        if code is not None:
            _memory.move_to_end(key)
            _stats.memory_hits += 1
            return dataclasses.replace(code, source="memory")
    if pending is None:
        return None
    try:
        code = pending.result()
    except Exception:  # noqa: BLE001 - a failed compile: the caller compiles afresh
        return None
    count("memory_hits")
    return dataclasses.replace(code, source="memory")


def memory_pending(key: str, job: Any) -> None:
    """Note that the future `job` will give the machine code of `key` (a tiered compile's
    O3 code, `codegen/cpu/tiers.py`), until it is done; `memory_lookup` waits for it."""
    pending = (os.getpid(), key)  # a forked child never waits for its parent's thread
    with _lock:
        _pending[pending] = job

    def forget(_: Any) -> None:
        with _lock:
            if _pending.get(pending) is job:
                del _pending[pending]

    job.add_done_callback(forget)


def memory_store(key: str, code: CompiledCode) -> None:
    _lru_store(_memory, key, code, _code_bytes(code), MEMORY_BYTES)


# What an MCJIT engine costs besides its code (its module, memory manager, page-rounded
# sections), counted per entry: for small kernels it is most of the entry's memory.
ENGINE_BYTES = 192 << 10


def _code_bytes(code: CompiledCode) -> int:
    """What an entry holds: its engine, its object files twice (the bytes, and the
    engine's mapped copy), its bitcode and the IR texts already made."""
    texts = [t for t in (code.llvm_ir, code.llvm_ir_optimized) if isinstance(t, str)]
    return (ENGINE_BYTES + 2 * sum(map(len, code.objects)) + sum(map(len, code.bitcode))
            + sum(map(len, texts)))


def _lru_store(table: _MemoryTable, key: str, value: Any, size: int, max_bytes: int) -> None:
    """Put `value` in an in-process table as its newest entry, dropping the oldest beyond
    MEMORY_ENTRIES entries or `max_bytes` bytes (the newest is kept even when alone it is
    larger)."""
    with _lock:
        table.bytes += size - table.sizes.get(key, 0)
        table.sizes[key] = size
        table[key] = value
        table.move_to_end(key)
        while len(table) > 1 and (len(table) > MEMORY_ENTRIES or table.bytes > max_bytes):
            oldest, _ = table.popitem(last=False)
            table.bytes -= table.sizes.pop(oldest)


def memory_usage() -> dict[str, tuple[int, int]]:
    """(entries, bytes) of each in-process table: "code" and "optimized"."""
    with _lock:
        return {"code": (len(_memory), _memory.bytes),
                "optimized": (len(_optimized_memory), _optimized_memory.bytes)}


# -- on disk -----------------------------------------------------------------------------

@cache
def _codegen_source_hash() -> str:
    """Editing an emitter changes the code a fingerprint stands for: key on the sources.

    The CPU backend's sources only (this folder and `cpu/`): editing the GPU backend
    leaves the CPU cache valid.
    """
    root = Path(__file__).parent
    hasher = hashlib.sha256()
    for path in sorted([*root.glob("*.py"), *(root / "cpu").rglob("*.py")]):
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


def disk_path(fingerprint_: str, root: Path | None = None) -> Path:
    """The entry's file under `root` (default: `cache_root()` now)."""
    from tfxla_lite.cache_dir import cache_root

    hasher = hashlib.sha256(fingerprint_.encode())
    hasher.update(json.dumps(environment(), sort_keys=True).encode())
    return (root or cache_root()) / "kernels" / (hasher.hexdigest()[:40] + ENTRY_SUFFIX)


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
        objects = [body for section, body in sections if section["name"] == "object"]
        engine.bind_runtime()
        llvm_engine = engine.load_objects(objects, _external_symbols(manifest["sections"]))
        address = llvm_engine.get_function_address(manifest["entry"])
        if not address:
            raise ValueError(f"no symbol {manifest['entry']!r} in the objects")
    except Exception as error:  # noqa: BLE001 - a cache entry is never trusted blindly
        logger.debug("tfxla-lite: ignoring kernel cache entry %s: %s", path, error)
        count("disk_rejected")
        _discard(path)
        return None
    try:
        os.utime(path)  # least recently used entries go first
    except OSError:
        pass
    count("disk_hits")
    (llvm_ir,) = [body for section, body in sections if section["name"] == "llvm_ir"]
    bitcode = tuple(body for section, body in sections if section["name"] == "bitcode")
    internal = frozenset(manifest["internal"])
    return CompiledCode(llvm_engine, address, int(manifest["kernel_count"]),
                        cache(lambda: zlib.decompress(llvm_ir).decode()),
                        optimized_text(bitcode, internal), tuple(objects), bitcode, internal,
                        source="disk")


def optimized_text(bitcode: tuple[bytes, ...], internal: frozenset[str]) -> Callable[[], str]:
    """A callable giving the optimized module's text, linked from its parts' bitcode on
    the first call and kept (executables sharing one `CompiledCode` link it once)."""
    from tfxla_lite.codegen.cpu import engine

    return cache(lambda: engine.linked_text(bitcode, internal))


def _external_symbols(sections: list[dict[str, Any]]) -> list[str]:
    """The symbols an entry's objects need from the process: undefined in one object,
    defined in none (calls between parts resolve among the objects)."""
    objects = [section for section in sections if section["name"] == "object"]
    defined = {name for section in objects for name in section["defines"]}
    return sorted({name for section in objects for name in section["symbols"]} - defined)


def _checked_manifest(data: bytes, expected: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """An entry's manifest (its first line) and where that line ends, once every field of
    `expected` matches; raises ValueError (or a JSON error)."""
    newline = data.find(b"\n")
    if newline < 0:
        raise ValueError("no manifest line")
    manifest = json.loads(data[:newline])
    for name, value in expected.items():
        if manifest.get(name) != value:
            raise ValueError(f"manifest {name} is {manifest.get(name)!r}, expected {value!r}")
    return manifest, newline


def _parse_entry(data: bytes, expected: dict[str, Any]
                 ) -> tuple[dict[str, Any], list[tuple[dict[str, Any], bytes]]]:
    """The manifest and (manifest section, body) pairs of a kernel entry whose fields,
    checksums, layout and object symbols all check out; raises ValueError otherwise."""
    manifest, newline = _checked_manifest(data, expected)
    sections: list[tuple[dict[str, Any], bytes]] = []
    offset = newline + 1
    for section in manifest["sections"]:
        size = int(section["size"])
        body = data[offset:offset + size]
        if len(body) != size:
            raise ValueError(f"section {section['name']} truncated")
        if hashlib.sha256(body).hexdigest() != section["sha256"]:
            raise ValueError(f"section {section['name']} checksum mismatch")
        sections.append((section, body))
        offset += size
    names = [section["name"] for section, _ in sections]
    parts = names.count("object")
    if offset != len(data) or not parts or names != (
            ["object"] * parts + ["llvm_ir"] + ["bitcode"] * parts):
        raise ValueError(f"unexpected sections {names} or trailing bytes")
    for number, (section, body) in enumerate(sections[:parts]):
        defined, undefined = object_symbols(body)
        if (section["defines"], section["symbols"]) != (defined, undefined):
            raise ValueError(f"object {number} has other symbols than its manifest lists")
    if not isinstance(manifest["internal"], list):
        raise ValueError("malformed internal functions")
    return manifest, sections


def disk_store(fingerprint_: str, shapes: dict[str, Any], code: CompiledCode,
               root: Path | None = None) -> None:
    """Write the entry atomically under `root` (`disk_path`); a failure (read-only cache,
    full disk) is only logged."""
    if not code.objects or len(code.bitcode) != len(code.objects):
        return
    path = disk_path(fingerprint_, root)
    llvm_ir = code.llvm_ir if isinstance(code.llvm_ir, str) else code.llvm_ir()
    sections = [("object", body) for body in code.objects]
    sections += [("llvm_ir", zlib.compress(llvm_ir.encode(), 1))]
    sections += [("bitcode", body) for body in code.bitcode]
    described = []
    for name, body in sections:
        section = {"name": name, "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        if name == "object":
            section["defines"], section["symbols"] = object_symbols(body)
        described.append(section)
    manifest = {**_expected(fingerprint_, shapes), "kernel_count": code.kernel_count,
                "internal": sorted(code.internal), "sections": described}
    try:
        _write_entry(path, manifest, [body for _, body in sections])
    except OSError as error:
        logger.debug("tfxla-lite: could not write kernel cache entry %s: %s", path, error)
        return
    count("disk_writes")
    _prune(path.parent)


def _write_entry(path: Path, manifest: dict, bodies: list[bytes]) -> None:
    """Write a cache entry (its manifest as one JSON line, then `bodies`) atomically: into
    a temporary file beside it, renamed over `path`, so a reader never sees half an
    entry. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(json.dumps(manifest, sort_keys=True).encode() + b"\n")
            for body in bodies:
                handle.write(body)
        os.chmod(temporary, 0o644)  # mkstemp's file is private; the cache is not
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_manifest_entry(path: Path, manifest: dict[str, Any], payload: bytes) -> None:
    """Write a one-payload entry (`manifest` plus the payload's size and SHA-256, then
    the payload) atomically, as the optimized-module and rewrite caches store theirs.
    Raises OSError."""
    _write_entry(path, {**manifest, "size": len(payload),
                        "sha256": hashlib.sha256(payload).hexdigest()}, [payload])


def read_manifest_entry(data: bytes, expected: dict[str, Any]) -> bytes:
    """The payload of an entry `write_manifest_entry` wrote, once every field of
    `expected`, the size and the checksum match; raises ValueError (or a JSON error)."""
    manifest, newline = _checked_manifest(data, expected)
    payload = data[newline + 1:]
    if len(payload) != int(manifest["size"]):
        raise ValueError(f"payload of {len(payload)} bytes, expected {manifest['size']}")
    if hashlib.sha256(payload).hexdigest() != manifest["sha256"]:
        raise ValueError("payload checksum mismatch")
    return payload


def touch(path: Path) -> None:
    """Mark an entry used: the least recently used entries are pruned first."""
    try:
        os.utime(path)
    except OSError:
        pass


def _discard(path: Path) -> None:
    """Remove an entry that failed its checks: the fresh compile rewrites it anyway, and
    a second look in this compile (kernel after optimized module) must not read it again."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _prune(folder: Path, suffix: str = ENTRY_SUFFIX) -> None:
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


discard = _discard
prune = _prune


def object_symbols(object_code: bytes) -> tuple[list[str], list[str]]:
    """(defined, undefined) global and weak symbols of an ELF64 relocatable object,
    sorted (both [] for other formats: then only the manifest's host fields guard the
    load)."""
    if object_code[:5] != b"\x7fELF\x02":
        return [], []
    section_offset, = struct.unpack_from("<Q", object_code, 0x28)
    entry_size, count_, = struct.unpack_from("<HH", object_code, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", object_code, section_offset + i * entry_size)
               for i in range(count_)]
    defined: list[str] = []
    undefined: list[str] = []
    for _, kind, _, _, offset, size, link, _, _, symbol_size in headers:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings_offset = headers[link][4]
        for position in range(offset, offset + size, symbol_size):
            name, info, _, index = struct.unpack_from("<IBBH", object_code, position)
            if not name or info >> 4 == 0:  # unnamed, or local
                continue
            end = object_code.index(b"\0", strings_offset + name)
            (undefined if index == 0 else defined).append(
                object_code[strings_offset + name:end].decode())
    return sorted(defined), sorted(undefined)


# -- optimized modules: above codegen ----------------------------------------------------

OPTIMIZED_FORMAT = "tfxla-lite-optimized-2"
OPTIMIZED_SUFFIX = ".tlo"
_optimized_memory: _MemoryTable = _MemoryTable()


@dataclass(frozen=True)
class OptimizedModule:
    """What the pass pipeline and buffer assignment made of one lowered module: everything
    an `Executable` needs besides the machine code, whose key is derived from these texts
    (never stored beside them, so an entry cannot name code of another module)."""

    optimized_hlo_text: str
    assignment_text: str
    temp_bytes: int
    temp_bytes_without_reuse: int
    donations: tuple[tuple[int, int], ...]
    constants: str  # constants_digest of the optimized module
    # (element type, dims) of each parameter and output, in order
    parameters: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, tuple[int, ...]], ...]
    # The metadata of each line of the module as lowered (`line_metadata`): the key leaves
    # metadata out, so a hit maps these onto the current module's (`cached_executable`).
    lowered_metadata: tuple[str, ...] = ()

    def kernel_signature(self, entry_name: str) -> dict[str, Any]:
        """The `shapes` a kernel entry is checked against (`cpu.compile` spells the same)."""
        from tfxla_lite.hlo.shape import Shape

        return {"entry": entry_name, "temp_bytes": self.temp_bytes,
                "parameters": [str(Shape.array(t, d)) for t, d in self.parameters],
                "outputs": [str(Shape.array(t, d)) for t, d in self.outputs]}

    def kernel_fingerprint(self, threads: int) -> str:
        return kernel_fingerprint(self.optimized_hlo_text, self.assignment_text,
                                  self.donations, threads, self.constants)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> OptimizedModule:
        """Typed, so that a payload of the wrong shape fails here and not in a launch."""
        def shapes(items: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
            return tuple((str(t), tuple(int(d) for d in dims)) for t, dims in items)

        module = OptimizedModule(
            str(data["optimized_hlo_text"]), str(data["assignment_text"]),
            int(data["temp_bytes"]), int(data["temp_bytes_without_reuse"]),
            tuple((int(j), int(i)) for j, i in data["donations"]),
            str(data["constants"]), shapes(data["parameters"]),
            shapes(data["outputs"]), tuple(str(m) for m in data["lowered_metadata"]))
        if set(data) != {f.name for f in dataclasses.fields(OptimizedModule)}:
            raise ValueError(f"unexpected fields {sorted(data)}")
        return module


def optimized_key(hlo_text: str, constants: str, pipeline: str, donate: Any,
                  threads: int) -> str:
    """The key of a lowered module's compile: its HLO text, its constants' digest and
    every compile option that changes the result (the verifier does not)."""
    hasher = hashlib.sha256()
    for part in (without_metadata(hlo_text), f"constants={constants}", f"pipeline={pipeline}",
                 f"donate={sorted(set(donate))}", f"threads={threads}"):
        hasher.update(part.encode())
        hasher.update(b"\0")
    return hasher.hexdigest()


@cache
def _compiler_source_hash() -> str:
    """The passes and the HLO IR decide the optimized module: key on their sources."""
    import tfxla_lite.hlo
    import tfxla_lite.passes

    hasher = hashlib.sha256()
    for package in (tfxla_lite.hlo, tfxla_lite.passes):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            hasher.update(f"{package.__name__}/{path.relative_to(root)}".encode() + b"\0"
                          + path.read_bytes())
    return hasher.hexdigest()[:16]


def optimized_environment() -> dict[str, str]:
    """The environment an optimized-module entry is checked against (also part of the
    rewrite cache's, `tfxla_lite/rewrite_cache.py`)."""
    return _optimized_environment()


def _optimized_environment() -> dict[str, str]:
    return {**environment(), "format": OPTIMIZED_FORMAT,
            "compiler_sources": _compiler_source_hash()}


def optimized_disk_path(key: str) -> Path:
    from tfxla_lite.cache_dir import cache_root

    hasher = hashlib.sha256(key.encode())
    hasher.update(json.dumps(_optimized_environment(), sort_keys=True).encode())
    return cache_root() / "optimized" / (hasher.hexdigest()[:40] + OPTIMIZED_SUFFIX)


def optimized_lookup(key: str, caches: CachePolicy) -> OptimizedModule | None:
    """The optimized module of `key` from the process, else from disk (verified)."""
    if caches.memory:
        with _lock:
            found = _optimized_memory.get(key)
            if found is not None:
                _optimized_memory.move_to_end(key)
                _stats.optimized_memory_hits += 1
                return found
    if not caches.disk:
        return None
    path = optimized_disk_path(key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        payload = read_manifest_entry(data, {**_optimized_environment(), "key": key})
        found = OptimizedModule.from_json(json.loads(zlib.decompress(payload)))
    except Exception as error:  # noqa: BLE001 - a cache entry is never trusted blindly
        logger.debug("tfxla-lite: ignoring optimized-module cache entry %s: %s", path, error)
        count("optimized_disk_rejected")
        _discard(path)
        return None
    touch(path)
    count("optimized_disk_hits")
    if caches.memory:
        _optimized_memory_store(key, found)
    return found


def optimized_store(key: str, module: OptimizedModule, caches: CachePolicy) -> None:
    """Keep `module` in the process and write it to disk, as `caches` says."""
    if caches.memory:
        _optimized_memory_store(key, module)
    if not caches.disk:
        return
    path = optimized_disk_path(key)
    payload = zlib.compress(json.dumps(module.to_json()).encode(), 1)
    try:
        write_manifest_entry(path, {**_optimized_environment(), "key": key}, payload)
    except OSError as error:
        logger.debug("tfxla-lite: could not write optimized-module entry %s: %s", path, error)
        return
    count("optimized_disk_writes")
    _prune(path.parent, OPTIMIZED_SUFFIX)


def _optimized_memory_store(key: str, module: OptimizedModule) -> None:
    size = (len(module.optimized_hlo_text) + len(module.assignment_text)
            + sum(map(len, module.lowered_metadata)))
    _lru_store(_optimized_memory, key, module, size, OPTIMIZED_MEMORY_BYTES)


def kernel_lookup(fingerprint_: str, shapes: dict[str, Any],
                  caches: CachePolicy) -> CompiledCode | None:
    """The machine code of `fingerprint_` from the process, else from disk."""
    code = memory_lookup(fingerprint_) if caches.memory else None
    if code is None and caches.disk:
        code = disk_load(fingerprint_, shapes)
        if code is not None and caches.memory:
            memory_store(fingerprint_, code)
    return code


class _Prepared:
    """An attribute of a `CachedExecutable` that calls the instance's method `prepare`
    (by name) before each read: stored in the instance's `__dict__` under `_<name>`."""

    def __init__(self, prepare: str) -> None:
        self.prepare = prepare

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = "_" + name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        getattr(instance, self.prepare)()
        return instance.__dict__[self.key]

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[self.key] = value


class CachedExecutable(Executable):
    """An `Executable` made from an optimized-module hit and cached machine code: no
    pass, no buffer assignment, no LLVM ran for it. Its `module` and `assignment` are
    parsed from the stored optimized HLO and assigned again only when something reads
    them (dumps, the report page); that assignment must print as the stored one."""

    temp_bytes_without_reuse: int = 0  # the assignment's figure, kept for the report

    # Parsed and assigned again only when read.
    module = _Prepared("_materialize")
    assignment = _Prepared("_materialize")
    # The texts, whose metadata a rewrite cache hit looks up in the current trace only when
    # something reads them (`defer_metadata`).
    hlo_text = _Prepared("_refresh_metadata")
    optimized_hlo_text = _Prepared("_refresh_metadata")

    def defer_metadata(self, found: OptimizedModule, current_hlo_text: Any) -> None:
        """Take the lowered text from `current_hlo_text()` (and the optimized text's
        metadata from it) when a text is first read, not now."""
        self.__dict__["_pending_metadata"] = (found, current_hlo_text)

    def _refresh_metadata(self) -> None:
        pending = self.__dict__.pop("_pending_metadata", None)
        if pending is not None:
            found, current_hlo_text = pending
            self.hlo_text = current_hlo_text()
            self.optimized_hlo_text = with_current_metadata(found, self.hlo_text)

    def _materialize(self) -> None:
        if self.__dict__.get("_module") is not None:
            return
        from tfxla_lite.hlo.parser import parse_module
        from tfxla_lite.passes import assign_buffers

        module = parse_module(self.optimized_hlo_text)
        assignment = assign_buffers(module)
        if assignment.to_text() != self.assignment_text:
            raise RuntimeError(f"tfxla-lite: the cached optimized module {module.name} does "
                               "not reproduce its buffer assignment")
        self.__dict__["_assignment"] = assignment
        self.__dict__["_module"] = module


def line_metadata(hlo_text: str) -> tuple[str, ...]:
    """The metadata block of each line of `hlo_text` ("" where a line has none)."""
    return tuple(match.group(0) if (match := METADATA.search(line)) else ""
                 for line in hlo_text.splitlines())


def with_current_metadata(found: OptimizedModule, hlo_text: str) -> str:
    """`found`'s optimized text with the metadata of `hlo_text`, the module now lowered.

    The key leaves metadata out, so the entry may come from another function or source
    line. Both lowered texts are equal but for metadata, line for line, and the passes
    only carry metadata along: each stored block maps to the current one of the same
    lowered line. A block that maps to nothing is dropped rather than shown stale.
    """
    current = line_metadata(hlo_text)
    if current == found.lowered_metadata:
        return found.optimized_hlo_text
    mapping: dict[str, str] = {}
    if len(current) == len(found.lowered_metadata):
        for stored, now in zip(found.lowered_metadata, current):
            if stored:
                mapping.setdefault(stored, now)
    return METADATA.sub(lambda match: mapping.get(match.group(0), ""), found.optimized_hlo_text)


def executable_from_cache(key: str, hlo_text: str, threads: int, caches: CachePolicy,
                          current_hlo_text: Any = None) -> CachedExecutable | None:
    """The executable of optimized-module key `key` from the caches (its optimized module
    and its machine code), for the module whose lowered text is `hlo_text`; None when
    either is missing. `current_hlo_text`: a callable giving the lowered text with the
    current metadata, called only when a text is read (`CachedExecutable.defer_metadata`)."""
    from tfxla_lite.codegen.cpu.emitter import ENTRY_NAME

    found = optimized_lookup(key, caches)
    if found is None:
        return None
    code = kernel_lookup(found.kernel_fingerprint(threads), found.kernel_signature(ENTRY_NAME),
                         caches)
    if code is None:
        return None
    executable = cached_executable(found, code, hlo_text, current_hlo_text is None)
    if current_hlo_text is not None:
        executable.defer_metadata(found, current_hlo_text)
    return executable


def cached_executable(found: OptimizedModule, code: CompiledCode, hlo_text: str,
                      map_metadata: bool = True) -> CachedExecutable:
    from tfxla_lite.hlo.shape import Shape

    executable = CachedExecutable(
        module=None, assignment=None,  # type: ignore[arg-type]
        parameter_shapes=[Shape.array(t, d) for t, d in found.parameters],
        output_shapes=[Shape.array(t, d) for t, d in found.outputs],
        temp_bytes=found.temp_bytes, kernel_count=code.kernel_count, llvm_ir=code.llvm_ir,
        llvm_ir_optimized=code.llvm_ir_optimized, entry_address=code.entry_address,
        engine=code.engine, hlo_text=hlo_text,
        optimized_hlo_text=(with_current_metadata(found, hlo_text) if map_metadata
                            else found.optimized_hlo_text),
        assignment_text=found.assignment_text, compiled_from=code.source,
        donations=found.donations)
    executable.temp_bytes_without_reuse = found.temp_bytes_without_reuse
    return executable
