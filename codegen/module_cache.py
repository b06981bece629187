"""The optimized-module cache: a warm compile runs neither the passes nor LLVM.

`compile_module` asks here first; a stage of the stage cache (`codegen/cache.py`), one
level above the kernel cache. The key is the module as lowered (HLO without metadata,
constants, pipeline, donations, thread count); the value is the optimized HLO and buffer
assignment texts. A hit's `CachedExecutable` parses and re-assigns its module only when
something reads it, and shows the current function's source lines
(`with_current_metadata`). docs/architecture.md, the stage cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tfxla_lite.codegen import cache as stage_cache
from tfxla_lite.codegen.cpu import kernel_cache
from tfxla_lite.codegen.cpu.emitter import ENTRY_NAME
from tfxla_lite.codegen.executable import Executable, Prepared
from tfxla_lite.hlo.shape import Shape


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

    def kernel_signature(self) -> dict[str, Any]:
        """The fields a kernel entry is checked against (`cpu.compile` spells the same)."""
        return {"entry": ENTRY_NAME, "temp_bytes": self.temp_bytes,
                "parameters": [str(Shape.array(t, d)) for t, d in self.parameters],
                "outputs": [str(Shape.array(t, d)) for t, d in self.outputs]}

    def kernel_fingerprint(self, threads: int) -> str:
        return kernel_cache.kernel_fingerprint(self.optimized_hlo_text, self.assignment_text,
                                               self.donations, threads, self.constants)

    def size(self) -> int:
        return (len(self.optimized_hlo_text) + len(self.assignment_text)
                + sum(map(len, self.lowered_metadata)))

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
    for part in (kernel_cache.without_metadata(hlo_text), f"constants={constants}",
                 f"pipeline={pipeline}", f"donate={sorted(set(donate))}", f"threads={threads}"):
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


def environment() -> dict[str, str]:
    """What an optimized module depends on besides its key (the rewrite cache's adds to it)."""
    return {**kernel_cache.environment(), "compiler_sources": _compiler_source_hash()}


STAGE = stage_cache.Stage("optimized", ".tlo", "tfxla-lite-optimized-3", environment,
                          "optimized_disk")
MEMORY = stage_cache.MemoryTable("optimized", 32 << 20, "optimized_memory_hits")


def lookup(key: str, caches: stage_cache.CachePolicy) -> OptimizedModule | None:
    """The optimized module of `key` from the process, else from disk (verified)."""
    found = MEMORY.get(key) if caches.memory else None
    if found is None and caches.disk:
        found = STAGE.load_json(key, OptimizedModule.from_json)
        if found is not None and caches.memory:
            MEMORY.put(key, found, found.size())
    return found


def store(key: str, module: OptimizedModule, caches: stage_cache.CachePolicy) -> None:
    """Keep `module` in the process and write it to disk, as `caches` says."""
    if caches.memory:
        MEMORY.put(key, module, module.size())
    if caches.disk:
        STAGE.store_json(key, dataclasses.asdict(module))


class CachedExecutable(Executable):
    """An `Executable` made from an optimized-module hit and cached machine code: no
    pass, no buffer assignment, no LLVM ran for it. Its `module` and `assignment` are
    parsed from the stored optimized HLO and assigned again only when something reads
    them (dumps, the report page); that assignment must print as the stored one."""

    temp_bytes_without_reuse: int = 0  # the assignment's figure, kept for the report

    # Parsed and assigned again only when read.
    module = Prepared("_materialize")
    assignment = Prepared("_materialize")
    # The texts, whose metadata a rewrite cache hit looks up in the current trace only when
    # something reads them (`defer_metadata`).
    hlo_text = Prepared("_refresh_metadata")
    optimized_hlo_text = Prepared("_refresh_metadata")

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
    return tuple(match.group(0) if (match := kernel_cache.METADATA.search(line)) else ""
                 for line in hlo_text.splitlines())


def with_current_metadata(found: OptimizedModule, hlo_text: str) -> str:
    """`found`'s optimized text with the metadata of `hlo_text`, the module now lowered.

    Both lowered texts are equal but for metadata, line for line, and the passes only
    carry metadata along: each stored block maps to the current one of the same lowered
    line. A block that maps to nothing is dropped rather than shown stale.
    """
    current = line_metadata(hlo_text)
    if current == found.lowered_metadata:
        return found.optimized_hlo_text
    mapping: dict[str, str] = {}
    if len(current) == len(found.lowered_metadata):
        for stored, now in zip(found.lowered_metadata, current):
            if stored:
                mapping.setdefault(stored, now)
    return kernel_cache.METADATA.sub(lambda match: mapping.get(match.group(0), ""),
                                     found.optimized_hlo_text)


def executable_from_cache(key: str, hlo_text: str, threads: int,
                          caches: stage_cache.CachePolicy,
                          current_hlo_text: Any = None) -> CachedExecutable | None:
    """The executable of optimized-module key `key` from the caches (its optimized module
    and its machine code), for the module whose lowered text is `hlo_text`; None when
    either is missing. `current_hlo_text`: a callable giving the lowered text with the
    current metadata, called only when a text is read (`CachedExecutable.defer_metadata`)."""
    found = lookup(key, caches)
    if found is None:
        return None
    code = kernel_cache.lookup(found.kernel_fingerprint(threads), found.kernel_signature(),
                               caches)
    if code is None:
        return None
    executable = cached_executable(found, code, hlo_text, current_hlo_text is None)
    if current_hlo_text is not None:
        executable.defer_metadata(found, current_hlo_text)
    return executable


def cached_executable(found: OptimizedModule, code: kernel_cache.CompiledCode, hlo_text: str,
                      map_metadata: bool = True) -> CachedExecutable:
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
