"""Kernel cache entries of a module compiled in parts (codegen/cache.py, format
`tfxla-lite-kernel-2`): one object per part, loaded into one engine whose linker
resolves the calls between parts; a damaged object, a symbol no part and nothing in
the process defines, and the single-object format before it are misses, never a crash."""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from pathlib import Path

import numpy as np
import pytest
from codegen_helpers import PARTS_HLO, float32_reference
from llvmlite import ir

from tfxla_lite.codegen import cache, compile_module
from tfxla_lite.codegen.cpu import engine, kernel_cache, parallel
from tfxla_lite.hlo.parser import parse_module

pytestmark = pytest.mark.skipif(not parallel.openmp_available(),
                                reason="no libgomp: no parallel kernels, a single part")


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.standard_normal((512, 256), dtype=np.float32),
            rng.standard_normal((256, 256), dtype=np.float32) / 16]


@pytest.fixture
def kernel_dir(cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # `cache_root` also waits for earlier tests' background compiles, which would store
    # their entries into this folder.
    # Cut every module into as many parts as it has units, up to 3.
    monkeypatch.setattr(engine, "PARALLEL_IR_BYTES", 0)
    monkeypatch.setattr(engine, "optimizer_threads", lambda: 3)
    yield cache_root / "kernels"
    cache.clear_memory()


def _compile() -> object:
    return compile_module(parse_module(PARTS_HLO), threads=2)


def _entry(kernel_dir: Path) -> Path:
    (entry,) = sorted(kernel_dir.glob("*" + kernel_cache.STAGE.suffix))
    return entry


def _manifest(data: bytes) -> dict:
    return json.loads(data.split(b"\n", 1)[0])


def _sections(data: bytes) -> list[tuple[dict, bytes]]:
    """An entry's (manifest section, body) pairs, in order."""
    manifest = _manifest(data)
    offset = data.index(b"\n") + 1
    pairs = []
    for section in manifest["sections"]:
        pairs.append((section, data[offset:offset + section["size"]]))
        offset += section["size"]
    return pairs


def _rewritten(data: bytes, replace: dict[int, bytes]) -> bytes:
    """The entry with section bodies replaced and the manifest made to agree with them
    (sizes, checksums and an object's symbols): only a deeper check can refuse it."""
    manifest = _manifest(data)
    bodies = []
    for number, (section, body) in enumerate(_sections(data)):
        body = replace.get(number, body)
        section.update(size=len(body), sha256=hashlib.sha256(body).hexdigest())
        if section["name"] == "object":
            section["defines"], section["symbols"] = kernel_cache.object_symbols(body)
        manifest["sections"][number] = section
        bodies.append(body)
    return json.dumps(manifest).encode() + b"\n" + b"".join(bodies)


def _refused_then_rewritten(kernel_dir: Path, damaged: bytes, reason: str,
                            caplog: pytest.LogCaptureFixture) -> None:
    entry = _entry(kernel_dir)
    entry.write_bytes(damaged)
    cache.clear_memory()
    before = cache.stats()
    with caplog.at_level(logging.DEBUG, logger="tfxla_lite"):
        executable = _compile()
    assert reason in caplog.text
    after = cache.stats()
    assert executable.compiled_from == "llvm"
    assert after.disk_rejected == before.disk_rejected + 1
    assert after.llvm_compilations == before.llvm_compilations + 1
    # The exact results rounded: the evaluator sums a column sequentially in f32, which
    # loses more than the kernel's blocked sum (column_reduction.py).
    expected = float32_reference(PARTS_HLO, _inputs())
    for got, reference in zip(executable(*_inputs()), expected):
        np.testing.assert_allclose(got, np.asarray(reference), rtol=1e-5, atol=1e-5)
    cache.clear_memory()
    assert _compile().compiled_from == "disk"  # the fresh compile wrote a good entry


def test_an_entry_holds_one_object_per_part_and_loads_them_into_one_engine(
        kernel_dir: Path) -> None:
    cold = _compile()
    data = _entry(kernel_dir).read_bytes()
    names = [section["name"] for section, _ in _sections(data)]
    parts = names.count("object")
    assert parts > 1 and names == ["object"] * parts + ["llvm_ir"] + ["bitcode"] * parts
    objects = [(section, body) for section, body in _sections(data)
               if section["name"] == "object"]
    # entry's part calls tasks that other parts define: resolved among the objects.
    defined = {name for section, _ in objects for name in section["defines"]}
    assert "entry" in defined
    calls_between_parts = {name for section, _ in objects for name in section["symbols"]
                           } & defined
    assert calls_between_parts, "no call between parts to resolve"
    assert sorted(_manifest(data)["internal"]) == sorted(calls_between_parts)
    cache.clear_memory()
    before = cache.stats()
    warm = _compile()
    assert warm.compiled_from == "disk"
    assert cache.stats().llvm_compilations == before.llvm_compilations
    for got, same in zip(warm(*_inputs()), cold(*_inputs())):
        np.testing.assert_array_equal(got, same)
    # The texts come back only when read, the optimized one linked from the bitcode.
    assert warm.llvm_ir == cold.llvm_ir
    assert warm.llvm_ir_optimized == cold.llvm_ir_optimized
    assert "define void @entry" in warm.llvm_ir_optimized.replace('"', "")


def test_a_damaged_object_among_several_is_a_miss(kernel_dir: Path, caplog) -> None:
    _compile()
    data = _entry(kernel_dir).read_bytes()
    sections = _sections(data)
    start = data.index(b"\n") + 1 + sections[0][0]["size"] + 100  # inside the second object
    assert sections[1][0]["name"] == "object"
    _refused_then_rewritten(kernel_dir, data[:start] + bytes([data[start] ^ 0xFF])
                            + data[start + 1:], "section object checksum mismatch", caplog)


def test_another_object_in_place_of_a_part_is_a_miss(kernel_dir: Path, caplog) -> None:
    """The manifest agrees with the replaced object, but the parts no longer define
    what entry calls: the load finds no symbol for it and refuses the entry."""
    _compile()
    data = _entry(kernel_dir).read_bytes()
    (_, other), = [(s, b) for s, b in _sections(data)[:2] if "entry" not in s["defines"]]
    lone = engine.compile_parts([_module_returning("tfxla_lite_lone", 1)]).objects[0]
    number = [s for s, _ in _sections(data)].index(
        next(s for s, b in _sections(data) if b == other))
    _refused_then_rewritten(kernel_dir, _rewritten(data, {number: lone}),
                            "unresolved symbols", caplog)


def test_a_part_needing_a_symbol_nothing_defines_is_a_miss(kernel_dir: Path, caplog) -> None:
    """An object whose call neither another part nor the process resolves would abort
    MCJIT; the load checks every such symbol first."""
    _compile()
    data = _entry(kernel_dir).read_bytes()
    sections = _sections(data)
    parts = [s["name"] for s, _ in sections].count("object")
    calling = engine.compile_parts([_module_calling("tfxla_lite_test_missing")]).objects[0]
    assert "tfxla_lite_test_missing" in kernel_cache.object_symbols(calling)[1]
    # Appended as one more part (with its bitcode slot), entry's own parts intact.
    objects = [body for s, body in sections[:parts]] + [calling]
    rest = [body for s, body in sections[parts:]]
    bitcode = engine.compile_parts([_module_calling("tfxla_lite_test_missing")]).bitcode[0]
    manifest = _manifest(data)
    described = []
    for name, body in ([("object", b) for b in objects] + [("llvm_ir", rest[0])]
                       + [("bitcode", b) for b in rest[1:] + [bitcode]]):
        section = {"name": name, "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        if name == "object":
            section["defines"], section["symbols"] = kernel_cache.object_symbols(body)
        described.append(section)
    manifest["sections"] = described
    damaged = (json.dumps(manifest).encode() + b"\n" + b"".join(objects) + rest[0]
               + b"".join(rest[1:]) + bitcode)
    _refused_then_rewritten(kernel_dir, damaged, "unresolved symbols tfxla_lite_test_missing",
                            caplog)


def test_an_entry_of_the_single_object_format_is_a_miss(kernel_dir: Path, caplog) -> None:
    """An entry of the format before several objects (`tfxla-lite-kernel-1`: the whole
    module's one object, its undefined symbols at the top, both IR texts in one zlib'd
    section) is refused cleanly, even under the name of a current entry."""
    cold = _compile()
    manifest = _manifest(_entry(kernel_dir).read_bytes())
    body = engine.compile_parts([cold.llvm_ir]).objects[0]
    texts = zlib.compress(json.dumps([cold.llvm_ir, cold.llvm_ir_optimized]).encode(), 1)
    old = {key: value for key, value in manifest.items() if key not in ("sections", "internal")}
    old.update(format="tfxla-lite-kernel-1", symbols=kernel_cache.object_symbols(body)[1],
               sections=[
        {"name": "object", "size": len(body), "sha256": hashlib.sha256(body).hexdigest()},
        {"name": "llvm_ir", "size": len(texts), "sha256": hashlib.sha256(texts).hexdigest()}])
    _refused_then_rewritten(kernel_dir, json.dumps(old).encode() + b"\n" + body + texts,
                            "manifest format is 'tfxla-lite-kernel-1'", caplog)


def _module_calling(callee: str) -> str:
    module = ir.Module(name="calling")
    declared = ir.Function(module, ir.FunctionType(ir.IntType(32), []), name=callee)
    function = ir.Function(module, ir.FunctionType(ir.IntType(32), []), name="calls_" + callee)
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    builder.ret(builder.call(declared, []))
    return str(module)


def _module_returning(name: str, value: int) -> str:
    module = ir.Module(name="returning")
    function = ir.Function(module, ir.FunctionType(ir.IntType(32), []), name=name)
    ir.IRBuilder(function.append_basic_block("entry")).ret(ir.IntType(32)(value))
    return str(module)
