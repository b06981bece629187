"""Compile caches (codegen/cache.py): hits skip LLVM, bad disk entries are never trusted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from tfxla_lite import cache_dir
from tfxla_lite.codegen import cache, compile_module, module_cache
from tfxla_lite.codegen.cpu import kernel_cache
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.parser import parse_module

HLO = """HloModule cached

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[300,70] parameter(0)
  y = f32[300,70] parameter(1)
  t = f32[300,70] tanh(x)
  m = f32[300,70] multiply(t, y)
  zero = f32[] constant(0)
  ROOT r = f32[300] reduce(m, zero), dimensions={1}, to_apply=add_f32
}
"""


def _module() -> HloModule:
    return parse_module(HLO)


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((300, 70)).astype(np.float32) for _ in range(2)]


def _expected() -> np.ndarray:
    x, y = _inputs()
    return np.sum(np.tanh(x) * y, axis=1)


@pytest.fixture
def kernel_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               background_compiles_done: None) -> Path:
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TFXLA_LITE_CACHE", raising=False)
    cache.clear_memory()
    return tmp_path / "kernels"


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + kernel_cache.STAGE.suffix))


def test_second_compile_in_the_process_reuses_the_machine_code(kernel_dir: Path) -> None:
    first = compile_module(_module())
    before = cache.stats()
    second = compile_module(_module())
    after = cache.stats()
    assert (first.compiled_from, second.compiled_from) == ("llvm", "memory")
    assert after.llvm_compilations == before.llvm_compilations
    assert second.entry_address == first.entry_address
    assert second.llvm_ir_optimized == first.llvm_ir_optimized
    np.testing.assert_array_equal(second(*_inputs())[0], first(*_inputs())[0])
    np.testing.assert_allclose(second(*_inputs())[0], _expected(), rtol=1e-5, atol=1e-5)


def test_thread_count_is_part_of_the_key(kernel_dir: Path) -> None:
    serial = compile_module(_module(), threads=1)
    two = compile_module(_module(), threads=2)
    assert two.compiled_from == "llvm" and serial.compiled_from == "llvm"


def test_disk_entry_is_used_after_the_memory_is_cleared(kernel_dir: Path) -> None:
    compile_module(_module())
    (entry,) = _entries(kernel_dir)
    assert json.loads(entry.read_bytes().split(b"\n", 1)[0])["entry"] == "entry"
    cache.clear_memory()
    before = cache.stats()
    executable = compile_module(_module())
    assert executable.compiled_from == "disk"
    assert cache.stats().llvm_compilations == before.llvm_compilations
    assert executable.llvm_ir and executable.kernel_count >= 1
    np.testing.assert_allclose(executable(*_inputs())[0], _expected(), rtol=1e-5, atol=1e-5)


def _flip_object_byte(data: bytes) -> bytes:
    start = data.index(b"\n") + 1 + 200
    return data[:start] + bytes([data[start] ^ 0xFF]) + data[start + 1:]


def _foreign(field: str, value: object):
    def edit(data: bytes) -> bytes:
        line, rest = data.split(b"\n", 1)
        manifest = json.loads(line)
        manifest[field] = value
        return json.dumps(manifest).encode() + b"\n" + rest
    return edit


def _listed_symbols(symbols: list[str]):
    def edit(data: bytes) -> bytes:
        line, rest = data.split(b"\n", 1)
        manifest = json.loads(line)
        manifest["sections"][0]["symbols"] = symbols
        return json.dumps(manifest).encode() + b"\n" + rest
    return edit


@pytest.mark.parametrize("damage", [
    _flip_object_byte,
    lambda data: data[:len(data) // 2],               # truncated
    lambda data: data[:-1],                           # one byte short
    lambda data: data + b"\0",                        # trailing garbage
    lambda data: b"",                                 # empty
    lambda data: b"not json\n" + data,                # not a manifest
    _foreign("cpu", "some-other-cpu"),
    _foreign("tfxla_lite", "0.0.0"),
    _foreign("llvm", "1.0.0"),
    _foreign("key", "0" * 64),
    _foreign("temp_bytes", 12345),
    _listed_symbols(["tfxla_lite_no_such_symbol"]),  # not what the object needs
    _foreign("format", "tfxla-lite-kernel-2"),
], ids=["flipped", "truncated", "short", "trailing", "empty", "garbage", "cpu", "version",
        "llvm", "key", "temp-bytes", "listed-symbols", "format"])
def test_damaged_or_foreign_entry_is_recompiled_and_rewritten(kernel_dir: Path, damage) -> None:
    compile_module(_module())
    (entry,) = _entries(kernel_dir)
    good = entry.read_bytes()
    entry.write_bytes(damage(good))
    cache.clear_memory()
    before = cache.stats()
    executable = compile_module(_module())
    after = cache.stats()
    assert executable.compiled_from == "llvm"
    assert after.llvm_compilations == before.llvm_compilations + 1
    assert after.disk_rejected == before.disk_rejected + 1
    np.testing.assert_allclose(executable(*_inputs())[0], _expected(), rtol=1e-5, atol=1e-5)
    # The fresh compile replaced the bad entry with a good one.
    cache.clear_memory()
    assert compile_module(_module()).compiled_from == "disk"


@pytest.mark.parametrize("setting, files", [("0", 0), ("memory", 0), ("1", 1)])
def test_environment_variable_chooses_the_caches(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                  setting: str, files: int) -> None:
    monkeypatch.setenv("TFXLA_LITE_CACHE", setting)
    compile_module(_module())
    second = compile_module(_module())
    assert len(_entries(kernel_dir)) == files
    assert second.compiled_from == ("llvm" if setting == "0" else "memory")


def test_cache_argument_overrides_the_environment(kernel_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    compile_module(_module(), cache=False)
    assert compile_module(_module(), cache=False).compiled_from == "llvm"
    assert not _entries(kernel_dir)
    monkeypatch.setenv("TFXLA_LITE_CACHE", "0")
    compile_module(_module(), cache=True)
    assert len(_entries(kernel_dir)) == 1


def test_concurrent_writers_leave_one_whole_entry(kernel_dir: Path) -> None:
    compile_module(_module())
    (entry,) = _entries(kernel_dir)
    good = entry.read_bytes()
    entry.unlink()
    cache.clear_memory()
    threads = [threading.Thread(target=compile_module, args=(_module(),)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [p.name for p in kernel_dir.iterdir()] == [entry.name]  # no temporaries left
    assert entry.read_bytes().split(b"\n")[0] == good.split(b"\n")[0]


def test_external_symbols_of_the_object_are_listed(kernel_dir: Path) -> None:
    # A transposed, many rows, a long K: a library GEMM call (dot_blocks.fits takes none
    # of its cases).
    compile_module(parse_module("""HloModule dot
ENTRY main {
  a = f32[1024,512] parameter(0)
  b = f32[1024,128] parameter(1)
  ROOT d = f32[512,128] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}
"""))
    (entry,) = _entries(kernel_dir)
    (section, *_) = json.loads(entry.read_bytes().split(b"\n")[0])["sections"]
    assert section["name"] == "object"
    assert any("gemm" in s for s in section["symbols"]), section
    assert "entry" in section["defines"]


SECOND_PROCESS = textwrap.dedent("""
    import sys, numpy as np
    sys.modules["tensorflow"] = None  # the core runs without TF
    from tfxla_lite.codegen import cache, compile_module
    from tfxla_lite.hlo.parser import parse_module
    executable = compile_module(parse_module(sys.stdin.read()))
    rng = np.random.default_rng(0)
    x, y = [rng.standard_normal((300, 70)).astype(np.float32) for _ in range(2)]
    stats = cache.stats()
    print(executable.compiled_from, stats.llvm_compilations, stats.disk_hits)
    np.save(sys.argv[1], executable(x, y)[0])
""")


def test_second_process_starts_without_compiling(tmp_path: Path) -> None:
    env = {**os.environ, "TFXLA_LITE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TFXLA_LITE_CACHE", None)
    runs = []
    for n in range(2):
        result = subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(tmp_path / f"{n}.npy")],
                                input=HLO, capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        runs.append(result.stdout.split())
    assert runs == [["llvm", "1", "0"], ["disk", "0", "1"]]
    np.testing.assert_array_equal(np.load(tmp_path / "0.npy"), np.load(tmp_path / "1.npy"))


def test_runtime_build_and_codegen_share_one_cache_root(kernel_dir: Path) -> None:
    assert kernel_cache.STAGE.path("x").parent.parent == cache_dir.cache_root()
    source = (Path(cache_dir.__file__).parent / "runtime" / "build.py").read_text()
    assert "from tfxla_lite.cache_dir import cache_root" in source


# -- optimized modules: a warm compile runs no pass ------------------------------------

def _optimized_entries(root: Path) -> list[Path]:
    return sorted((root / "optimized").glob("*" + module_cache.STAGE.suffix))


def _cold_then_warm(kernel_dir: Path, **options) -> tuple:
    cold = compile_module(_module(), **options)
    cache.clear_memory()
    before = cache.stats()
    warm = compile_module(_module(), **options)
    return cold, warm, before, cache.stats()


def test_warm_compile_from_disk_runs_no_pass_and_no_llvm(kernel_dir: Path) -> None:
    cold, warm, before, after = _cold_then_warm(kernel_dir)
    assert isinstance(warm, module_cache.CachedExecutable) and warm.compiled_from == "disk"
    assert after.pipeline_runs == before.pipeline_runs
    assert after.llvm_compilations == before.llvm_compilations
    assert after.optimized_disk_hits == before.optimized_disk_hits + 1
    for name in ("hlo_text", "optimized_hlo_text", "assignment_text", "temp_bytes",
                 "kernel_count", "llvm_ir_optimized", "donations"):
        assert getattr(warm, name) == getattr(cold, name), name
    assert [str(s) for s in warm.parameter_shapes] == [str(s) for s in cold.parameter_shapes]
    assert [str(s) for s in warm.output_shapes] == [str(s) for s in cold.output_shapes]
    np.testing.assert_array_equal(warm(*_inputs())[0], cold(*_inputs())[0])
    # The module and assignment are rebuilt on demand, the same as the cold compile's.
    assert "_module" in warm.__dict__ and warm.__dict__["_module"] is None
    assert warm.module.to_text() == cold.module.to_text()
    assert warm.assignment.to_text() == cold.assignment.to_text()
    assert warm.temp_bytes_without_reuse == cold.assignment.temp_bytes_without_reuse


def test_warm_compile_in_the_process_runs_no_pass(kernel_dir: Path) -> None:
    compile_module(_module())
    before = cache.stats()
    second = compile_module(_module())
    after = cache.stats()
    assert second.compiled_from == "memory"
    assert after.pipeline_runs == before.pipeline_runs
    assert after.optimized_memory_hits == before.optimized_memory_hits + 1


@pytest.mark.parametrize("change", [{"pipeline": "dce"}, {"threads": 1}, {"donate": [0]}],
                         ids=["pipeline", "threads", "donate"])
def test_compile_options_are_part_of_the_optimized_key(kernel_dir: Path, change: dict) -> None:
    compile_module(_module())
    before = cache.stats()
    compile_module(_module(), **change)
    assert cache.stats().pipeline_runs == before.pipeline_runs + 1


def test_another_lowered_module_is_another_entry(kernel_dir: Path) -> None:
    compile_module(_module())
    before = cache.stats()
    other = compile_module(parse_module(HLO.replace("tanh(x)", "exponential(x)")))
    assert cache.stats().pipeline_runs == before.pipeline_runs + 1
    x, y = _inputs()
    np.testing.assert_allclose(other(x, y)[0], np.sum(np.exp(x) * y, axis=1), rtol=1e-5)


def test_verify_runs_every_pass_even_when_cached(kernel_dir: Path) -> None:
    compile_module(_module())
    cache.clear_memory()
    before = cache.stats()
    compile_module(_module(), verify=True)
    assert cache.stats().pipeline_runs == before.pipeline_runs + 1


def _edit_payload(edit):
    def damage(data: bytes) -> bytes:
        import hashlib
        import zlib
        line, payload = data.split(b"\n", 1)
        manifest = json.loads(line)
        fields = json.loads(zlib.decompress(payload))
        edit(fields)
        payload = zlib.compress(json.dumps(fields).encode())
        manifest["sections"][0].update(size=len(payload),
                                       sha256=hashlib.sha256(payload).hexdigest())
        return json.dumps(manifest).encode() + b"\n" + payload
    return damage


def _flip_payload_byte(data: bytes) -> bytes:
    start = data.index(b"\n") + 10
    return data[:start] + bytes([data[start] ^ 0xFF]) + data[start + 1:]


@pytest.mark.parametrize("damage", [
    _flip_payload_byte,
    lambda data: data[:len(data) // 2],
    lambda data: data + b"\0",
    lambda data: b"",
    lambda data: b"not json\n" + data,
    _foreign("compiler_sources", "0" * 16),       # the passes changed since
    _foreign("codegen_sources", "0" * 16),
    _foreign("tfxla_lite", "0.0.0"),
    _foreign("key", "0" * 64),
    _edit_payload(lambda fields: fields.pop("temp_bytes")),  # checksummed, but malformed
    _edit_payload(lambda fields: fields.update(extra=1)),
], ids=["flipped", "truncated", "trailing", "empty", "garbage", "passes-edited",
        "codegen-edited", "version", "key", "missing-field", "extra-field"])
def test_damaged_or_stale_optimized_entry_is_recompiled_and_rewritten(kernel_dir: Path,
                                                                       damage) -> None:
    root = kernel_dir.parent
    compile_module(_module())
    (entry,) = _optimized_entries(root)
    entry.write_bytes(damage(entry.read_bytes()))
    cache.clear_memory()
    before = cache.stats()
    executable = compile_module(_module())
    after = cache.stats()
    assert not isinstance(executable, module_cache.CachedExecutable)
    assert after.optimized_disk_rejected == before.optimized_disk_rejected + 1
    assert after.pipeline_runs == before.pipeline_runs + 1
    np.testing.assert_allclose(executable(*_inputs())[0], _expected(), rtol=1e-5, atol=1e-5)
    cache.clear_memory()
    again = cache.stats()
    assert isinstance(compile_module(_module()), module_cache.CachedExecutable)
    assert cache.stats().pipeline_runs == again.pipeline_runs


def test_stored_texts_name_the_machine_code(kernel_dir: Path) -> None:
    """The kernel key is derived from the stored texts, never stored beside them: an
    entry whose assignment was edited finds no machine code and compiles afresh."""
    root = kernel_dir.parent
    compile_module(_module())
    (entry,) = _optimized_entries(root)
    entry.write_bytes(_edit_payload(
        lambda fields: fields.update(assignment_text=fields["assignment_text"] + "x"))(
            entry.read_bytes()))
    cache.clear_memory()
    before = cache.stats()
    executable = compile_module(_module())
    assert not isinstance(executable, module_cache.CachedExecutable)
    assert cache.stats().pipeline_runs == before.pipeline_runs + 1
    np.testing.assert_allclose(executable(*_inputs())[0], _expected(), rtol=1e-5, atol=1e-5)


def test_rebuilt_assignment_must_match_the_stored_one(kernel_dir: Path) -> None:
    import dataclasses

    cold = compile_module(_module())
    found = module_cache.OptimizedModule(
        cold.optimized_hlo_text, cold.assignment_text + "y", cold.temp_bytes,
        cold.assignment.temp_bytes_without_reuse, cold.donations,
        kernel_cache.constants_digest(cold.module),
        tuple((s.element_type, s.dims) for s in cold.parameter_shapes),
        tuple((s.element_type, s.dims) for s in cold.output_shapes))
    code = kernel_cache.CompiledCode(cold.engine, cold.entry_address, cold.kernel_count,
                              cold.llvm_ir, cold.llvm_ir_optimized)
    assert module_cache.cached_executable(dataclasses.replace(
        found, assignment_text=cold.assignment_text), code, cold.hlo_text).module is not None
    with pytest.raises(RuntimeError, match="buffer assignment"):
        _ = module_cache.cached_executable(found, code, cold.hlo_text).module


def _scaled_sine(constant: np.ndarray, metadata: str = "") -> HloModule:
    """sin(x * c) with `c` a literal of 100 elements, more than the printer spells out."""
    values = ", ".join(repr(float(v)) for v in constant)
    module = parse_module(f"""HloModule scaled
ENTRY main {{
  x = f32[100] parameter(0)
  c = f32[100] constant({{{values}}})
  m = f32[100] multiply(x, c){metadata}
  ROOT s = f32[100] sine(m)
}}
""")
    assert "{...}" in module.to_text()  # the text alone does not show the values
    return module


def test_modules_differing_only_in_a_large_constant_do_not_share_code(kernel_dir: Path) -> None:
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    for scale in (1.0, 2.0, 3.0):
        constant = np.arange(100, dtype=np.float32) * scale
        executable = compile_module(_scaled_sine(constant))
        np.testing.assert_allclose(executable(x)[0], np.sin(x * constant), rtol=1e-5,
                                   atol=1e-6)
        cache.clear_memory()  # from disk too
        again = compile_module(_scaled_sine(constant))
        assert isinstance(again, module_cache.CachedExecutable)
        np.testing.assert_allclose(again(x)[0], np.sin(x * constant), rtol=1e-5, atol=1e-6)


def test_metadata_is_not_part_of_the_keys(kernel_dir: Path) -> None:
    constant = np.arange(100, dtype=np.float32)
    first = compile_module(_scaled_sine(constant, ', metadata={op_type="Mul" '
                                                  'source_file="a.py" source_line=1}'))
    before = cache.stats()
    second = compile_module(_scaled_sine(constant, ', metadata={op_type="Mul" '
                                                   'source_file="b.py" source_line=7}'))
    after = cache.stats()
    assert "b.py" in second.hlo_text and "a.py" in first.hlo_text
    assert after.pipeline_runs == before.pipeline_runs
    assert after.llvm_compilations == before.llvm_compilations
    assert second.entry_address == first.entry_address


def test_optimized_module_hit_shows_the_current_metadata(kernel_dir: Path) -> None:
    """The key leaves metadata out: a hit must show the current module's source lines,
    not those of the compile that wrote the entry, in memory and from disk."""
    constant = np.arange(100, dtype=np.float32)
    first = compile_module(_scaled_sine(constant, ', metadata={op_type="Mul" '
                                                  'source_file="a.py" source_line=1}'))
    assert 'source_file="a.py" source_line=1' in first.optimized_hlo_text
    for clear in (False, True):
        if clear:
            cache.clear_memory()
        second = compile_module(_scaled_sine(constant, ', metadata={op_type="Mul" '
                                                       'source_file="b.py" source_line=7}'))
        assert isinstance(second, module_cache.CachedExecutable)
        assert 'source_file="b.py" source_line=7' in second.optimized_hlo_text
        assert "a.py" not in second.optimized_hlo_text
        assert (kernel_cache.without_metadata(second.optimized_hlo_text)
                == kernel_cache.without_metadata(first.optimized_hlo_text))


def test_metadata_that_maps_to_nothing_is_dropped() -> None:
    """A stored block without a counterpart in the current lowered text is left out
    rather than shown stale."""
    stale = ', metadata={op_type="Mul" source_file="old.py" source_line=3}'
    found = module_cache.OptimizedModule(
        f"ENTRY main {{\n  ROOT m = f32[] multiply(a, b){stale}\n}}", "", 0, 0, (), "", (), (),
        ("", stale, ""))
    assert "old.py" not in module_cache.with_current_metadata(found, "HloModule x\nENTRY main {\n}")
    unmapped = module_cache.with_current_metadata(found, "one\ntwo\nthree")  # lines without any
    assert unmapped == found.optimized_hlo_text.replace(stale, "")


def test_a_background_compile_stores_where_its_compile_began(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache folder is fixed when the compile starts: LLVM finishing after
    TFXLA_LITE_CACHE_DIR changed (the next test's folder, another job's) writes the entry
    where the compile began, not into the new folder."""
    from tfxla_lite.codegen import background
    from tfxla_lite.codegen.cpu import engine

    began, moved = tmp_path / "began", tmp_path / "moved"
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(began))
    monkeypatch.delenv("TFXLA_LITE_CACHE", raising=False)
    cache.clear_memory()
    release = threading.Event()
    compile_parts = engine.compile_parts

    def held(*args, **kwargs):
        assert release.wait(60), "never released"
        return compile_parts(*args, **kwargs)

    monkeypatch.setattr(engine, "compile_parts", held)
    executable = compile_module(_module(), background=True)
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(moved))
    release.set()
    assert background.wait_for_compiles(timeout=120)
    assert len(_entries(began / "kernels")) == 1
    assert _entries(moved / "kernels") == []
    np.testing.assert_allclose(executable(*_inputs())[0], _expected(), rtol=1e-5, atol=1e-5)
