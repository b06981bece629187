"""The kernel cache: a module's machine code reused in the process and across runs.

`cpu.compile` asks here before it emits LLVM IR; a stage of the stage cache
(`codegen/cache.py`). The key fingerprints everything the code depends on once the
passes have run (optimized HLO without metadata, constants, buffer assignment,
donations, thread count: the printer prints every attribute codegen reads). In the
process, an LRU of `CompiledCode` bounded in bytes (a hit shares the engine); on disk,
one object file per part plus the IR and bitcode, checked symbol by symbol before a
load. Entry layout: docs/benchmarks.md, "The compile caches".
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import llvmlite

from tfxla_lite.codegen import cache as stage_cache
from tfxla_lite.codegen.cpu import engine
from tfxla_lite.hlo.ir import HloModule

# What an MCJIT engine costs besides its code (its module, memory manager, page-rounded
# sections), counted per entry: for small kernels it is most of the entry's memory.
ENGINE_BYTES = 192 << 10


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


# -- the key ---------------------------------------------------------------------------------

# `, metadata={op_type="..." op_name="..." source_file="..." source_line=N}`, which the
# printer puts last on an instruction's line; strings escape `"` and `\`.
METADATA = re.compile(r', metadata=\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\}$', re.MULTILINE)


def without_metadata(hlo_text: str) -> str:
    """The HLO text without instruction metadata (TF op names, the user's source lines):
    no pass decides on it and codegen never reads it, so the same model called from
    another line shares its compile (XLA's fingerprint leaves metadata out as well)."""
    return METADATA.sub("", hlo_text)


def constants_digest(module: HloModule) -> str:
    """A hash of every constant's values: the printer elides large literals as `{...}`,
    so the HLO text alone does not tell two modules that differ only in a large constant
    apart (XLA's fingerprint hashes literals, not their printed form)."""
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


def kernel_fingerprint(optimized_hlo_text: str, assignment_text: str,
                       donations: tuple[tuple[int, int], ...], threads: int,
                       constants: str) -> str:
    """The machine code's key (see the module docstring)."""
    suffix = f"\ndonations {donations}" if donations else ""
    # The vectorizer's width changes the machine code (keys of LLVM's own tuning unchanged).
    width = engine.vector_width()
    threads_part = f"threads={threads}" + ("" if width == "llvm" else f" vector_width={width}")
    hasher = hashlib.sha256()
    for part in (without_metadata(optimized_hlo_text) + f"\nconstants {constants}",
                 assignment_text + suffix, threads_part):
        hasher.update(part.encode())
        hasher.update(b"\0")
    return hasher.hexdigest()


# -- the stage -------------------------------------------------------------------------------

@cache
def _codegen_source_hash() -> str:
    """Editing an emitter changes the code a fingerprint stands for: key on the sources
    of `codegen/` and `cpu/` (editing the GPU backend leaves the CPU cache valid)."""
    root = Path(__file__).parent.parent
    hasher = hashlib.sha256()
    for path in sorted([*root.glob("*.py"), *(root / "cpu").rglob("*.py")]):
        hasher.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return hasher.hexdigest()[:16]


@cache
def environment() -> dict[str, str]:
    """Everything besides the fingerprint that machine code depends on."""
    return {"codegen_sources": _codegen_source_hash(), "llvmlite": llvmlite.__version__,
            **engine.host_description()}


STAGE = stage_cache.Stage("kernels", ".tlk", "tfxla-lite-kernel-3", environment, "disk")
MEMORY = stage_cache.MemoryTable("code", 64 << 20, "memory_hits")


def lookup(key: str, signature: dict[str, Any],
           caches: stage_cache.CachePolicy) -> CompiledCode | None:
    """The machine code of `key` from the process (waiting for a background compile
    still making it: a second compile would do LLVM's work again), else from disk
    (`signature`: entry symbol, temp bytes, parameter and output shapes must match)."""
    code = MEMORY.get(key) if caches.memory else None
    if code is not None:
        return dataclasses.replace(code, source="memory")
    if caches.disk:
        code = STAGE.load(key, _decode, signature)
        if code is not None and caches.memory:
            MEMORY.put(key, code, _code_bytes(code))
    return code


def store(key: str, signature: dict[str, Any], code: CompiledCode,
          caches: stage_cache.CachePolicy) -> None:
    """Keep `code` in the process and on disk (under `caches.root`), as `caches` says."""
    if caches.memory:
        MEMORY.put(key, code, _code_bytes(code))
    if not caches.disk or not code.objects or len(code.bitcode) != len(code.objects):
        return
    llvm_ir = code.llvm_ir if isinstance(code.llvm_ir, str) else code.llvm_ir()
    sections = [("object", body) for body in code.objects]
    sections += [("llvm_ir", zlib.compress(llvm_ir.encode(), 1))]
    sections += [("bitcode", body) for body in code.bitcode]
    STAGE.store(key, sections, {**signature, "kernel_count": code.kernel_count,
                                "internal": sorted(code.internal)}, caches.root, _describe)


def _describe(name: str, body: bytes) -> dict[str, Any]:
    if name != "object":
        return {}
    defined, undefined = object_symbols(body)
    return {"defines": defined, "symbols": undefined}


def _code_bytes(code: CompiledCode) -> int:
    """What an entry holds: its engine, its object files twice (the bytes, and the
    engine's mapped copy), its bitcode and the IR texts already made."""
    texts = [t for t in (code.llvm_ir, code.llvm_ir_optimized) if isinstance(t, str)]
    return (ENGINE_BYTES + 2 * sum(map(len, code.objects)) + sum(map(len, code.bitcode))
            + sum(map(len, texts)))


def _decode(header: dict[str, Any], bodies: list[bytes]) -> CompiledCode:
    """The entry's objects loaded into a new engine, once their layout and symbols check
    out; raises ValueError otherwise."""
    sections = header["sections"]
    names = [section["name"] for section in sections]
    parts = names.count("object")
    if not parts or names != ["object"] * parts + ["llvm_ir"] + ["bitcode"] * parts:
        raise ValueError(f"unexpected sections {names}")
    for number, (section, body) in enumerate(zip(sections[:parts], bodies)):
        if (section["defines"], section["symbols"]) != object_symbols(body):
            raise ValueError(f"object {number} has other symbols than its manifest lists")
    if not isinstance(header["internal"], list):
        raise ValueError("malformed internal functions")
    defined = {name for section in sections[:parts] for name in section["defines"]}
    external = sorted({name for section in sections[:parts] for name in section["symbols"]}
                      - defined)  # calls between parts resolve among the objects
    objects = tuple(bodies[:parts])
    engine.bind_runtime()
    llvm_engine = engine.load_objects(objects, external)
    address = llvm_engine.get_function_address(header["entry"])
    if not address:
        raise ValueError(f"no symbol {header['entry']!r} in the objects")
    llvm_ir, bitcode = bodies[parts], tuple(bodies[parts + 1:])
    internal = frozenset(header["internal"])
    return CompiledCode(llvm_engine, address, int(header["kernel_count"]),
                        cache(lambda: zlib.decompress(llvm_ir).decode()),
                        optimized_text(bitcode, internal), objects, bitcode, internal,
                        source="disk")


def optimized_text(bitcode: tuple[bytes, ...], internal: frozenset[str]) -> Callable[[], str]:
    """A callable giving the optimized module's text, linked from its parts' bitcode on
    the first call and kept (executables sharing one `CompiledCode` link it once)."""
    return cache(lambda: engine.linked_text(bitcode, internal))


def object_symbols(object_code: bytes) -> tuple[list[str], list[str]]:
    """(defined, undefined) global and weak symbols of an ELF64 relocatable object,
    sorted (both [] for other formats: then only the header's host fields guard the
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
