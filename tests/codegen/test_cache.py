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
from tfxla_lite.codegen import cache, compile_module
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
def kernel_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TFXLA_LITE_CACHE", raising=False)
    cache.clear_memory()
    return tmp_path / "kernels"


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + cache.ENTRY_SUFFIX))


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
    _foreign("fingerprint", "0" * 64),
    _foreign("temp_bytes", 12345),
    _foreign("symbols", ["tfxla_lite_no_such_symbol"]),  # would abort MCJIT if loaded
], ids=["flipped", "truncated", "short", "trailing", "empty", "garbage", "cpu", "version",
        "llvm", "fingerprint", "temp-bytes", "unresolved-symbol"])
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
    compile_module(parse_module("""HloModule dot
ENTRY main {
  a = f32[64,64] parameter(0)
  b = f32[64,64] parameter(1)
  ROOT d = f32[64,64] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""))
    (entry,) = _entries(kernel_dir)
    symbols = json.loads(entry.read_bytes().split(b"\n")[0])["symbols"]
    assert any("gemm" in s for s in symbols), symbols


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
    assert cache.disk_path("x").parent.parent == cache_dir.cache_root()
    source = (Path(cache_dir.__file__).parent / "runtime" / "build.py").read_text()
    assert "from tfxla_lite.cache_dir import cache_root" in source
