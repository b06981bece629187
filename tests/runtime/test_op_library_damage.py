"""A damaged op library in the cache is rebuilt, never loaded; concurrent builders in
several processes compile once; an unusable cache root falls back to a private
temporary folder with one warning.

Most tests stand a fake compiler in for g++ (`CXX`: a script that copies the library
this session loaded), so that a rebuild takes no time; the tests marked slow rebuild
with the real compiler."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from tfxla_lite import cache_dir
from tfxla_lite.runtime import build, loader

# Copies $FAKE_CXX_LIBRARY to the path after -o and logs that path: a compiler that
# produces a good library in no time.
FAKE_COMPILER = """\
import os, shutil, sys, time
out = sys.argv[sys.argv.index("-o") + 1]
with open(os.environ["FAKE_CXX_LOG"], "a") as log:
    log.write(out + "\\n")
time.sleep(float(os.environ.get("FAKE_CXX_DELAY", "0")))
shutil.copyfile(os.environ["FAKE_CXX_LIBRARY"], out)
"""

# Compiles and runs a function in a fresh process; prints its result and the library.
RUN_COMPILED = """\
import tensorflow as tf
import tfxla_lite as tl
from tfxla_lite.runtime import loader

f = tl.function(lambda x, y: tf.reduce_sum(x * y + 1.0), jit_compile=True)
print("RESULT", float(f(tf.ones([4]), tf.fill([4], 2.0))))
print("LIBRARY", loader.load_library().path)
"""


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def _garble(path: Path) -> None:
    """Same size, same ELF header, different bytes after it."""
    data = bytearray(path.read_bytes())
    for i in range(4096, len(data), 97):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _drop_marker(path: Path) -> None:
    build.marker_path(path).unlink()


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate, "garbled": _garble, "emptied": _empty, "no marker": _drop_marker,
}


@pytest.fixture
def good_library(op_library: loader.OpLibrary) -> Path:
    path = Path(op_library.path)
    assert build.library_problem(path) is None
    return path


@pytest.fixture
def fake_compiler(tmp_path: Path, good_library: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Path:
    """Sets CXX to the fake compiler (for this process and its children) and
    TFXLA_LITE_CACHE_DIR to a private folder; returns the compile log."""
    script = tmp_path / "fake_cxx.py"
    script.write_text(FAKE_COMPILER)
    log = tmp_path / "compiles.log"
    log.touch()
    monkeypatch.setenv("CXX", f"{sys.executable} {script}")
    monkeypatch.setenv("FAKE_CXX_LIBRARY", str(good_library))
    monkeypatch.setenv("FAKE_CXX_LOG", str(log))
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path / "cache"))
    return log


def _compiles(log: Path) -> int:
    return len(log.read_text().splitlines())


def _run_compiled(timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUN_COMPILED], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def _assert_ran(result: subprocess.CompletedProcess[str]) -> Path:
    assert result.returncode == 0, f"rc {result.returncode}\n{result.stderr[-3000:]}"
    assert "RESULT 12.0" in result.stdout, result.stdout
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("LIBRARY ")]
    return Path(line.split(" ", 1)[1])


# -- the check ------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_library_is_detected_and_rebuilt(damage: str, fake_compiler: Path,
                                                 good_library: Path) -> None:
    path = build.build_op_library()
    assert _compiles(fake_compiler) == 1 and build.library_problem(path) is None
    DAMAGES[damage](path)
    assert build.library_problem(path) is not None
    # What the loader calls: it hands TF only a path that passed the check.
    assert build.build_op_library() == path
    assert _compiles(fake_compiler) == 2
    assert build.library_problem(path) is None
    assert path.read_bytes() == good_library.read_bytes()
    record = json.loads(build.marker_path(path).read_text())
    assert record["size"] == good_library.stat().st_size


def test_good_library_is_not_rebuilt(fake_compiler: Path) -> None:
    path = build.build_op_library()
    assert build.build_op_library() == path
    assert _compiles(fake_compiler) == 1


@pytest.mark.parametrize("record", ["", "{", "[]", '{"size": 1}', '{"size": "x", "sha256": 1}'])
def test_bad_marker_means_rebuild(record: str, fake_compiler: Path) -> None:
    path = build.build_op_library()
    build.marker_path(path).write_text(record)
    assert build.library_problem(path) is not None
    build.build_op_library()
    assert _compiles(fake_compiler) == 2 and build.library_problem(path) is None


def test_damaged_library_is_never_returned(fake_compiler: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A build whose result fails the check (here: damaged right after the compile)
    raises rather than hand the file to dlopen."""
    path = build.build_op_library()
    _truncate(path)
    real_write = build._write_atomically

    def write_then_damage(marker: Path, text: str) -> None:
        real_write(marker, text)
        _empty(path)

    monkeypatch.setattr(build, "_write_atomically", write_then_damage)
    with pytest.raises(build.BuildError, match="failed its check"):
        build.build_op_library()


CONCURRENT_BUILD = """\
import sys
from pathlib import Path
from tfxla_lite.runtime import build
config = build.BuildConfig(Path(sys.argv[1]), sys.argv[2], "tf-x", (), ())
path = build.build_op_library(config)
assert build.library_problem(path) is None, build.library_problem(path)
print(path)
"""


def test_concurrent_processes_rebuild_a_damaged_library_once(fake_compiler: Path,
                                                             tmp_path: Path) -> None:
    source = tmp_path / "tiny.cc"
    source.write_text("int tiny;\n")
    compiler = os.environ["CXX"]
    config = build.BuildConfig(source, compiler, "tf-x", (), ())
    path = build.build_op_library(config)
    _truncate(path)
    env = {**os.environ, "FAKE_CXX_DELAY": "0.5"}
    processes = [subprocess.Popen([sys.executable, "-c", CONCURRENT_BUILD, str(source),
                                   compiler], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env) for _ in range(4)]
    outputs = [process.communicate(timeout=120) for process in processes]
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr
        assert stdout.strip() == str(path)
    assert _compiles(fake_compiler) == 2  # the first build, then one rebuild
    assert build.library_problem(path) is None
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_truncated_library_rebuilds_in_a_new_process(fake_compiler: Path) -> None:
    """Without the check, the new process died of SIGBUS at its first launch."""
    path = build.build_op_library()
    _truncate(path)
    assert _assert_ran(_run_compiled()) == path
    assert _compiles(fake_compiler) == 2 and build.library_problem(path) is None


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "garbled", "emptied"])
def test_damaged_library_rebuilds_with_the_real_compiler(
        damage: str, good_library: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(cache))
    path = build.library_path()  # what the new process will compute
    shutil.copytree(good_library.parent, path.parent)
    assert build.library_problem(path) is None
    DAMAGES[damage](path)
    assert _assert_ran(_run_compiled(timeout=600)) == path
    assert build.library_problem(path) is None


# -- the cache root -------------------------------------------------------------------------

def _root_warnings(configured: Path) -> tuple[Path, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = cache_dir.cache_root()
        assert cache_dir.cache_root() == first
    assert cache_dir.configured_root() == configured
    return first, [w for w in caught if issubclass(w.category, cache_dir.CacheDirWarning)]


@pytest.mark.parametrize("where", ["the file", "under the file"])
def test_cache_root_that_is_no_folder_falls_back_with_one_warning(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    regular = tmp_path / "not_a_folder"
    regular.write_text("")
    configured = regular if where == "the file" else regular / "cache"
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(configured))
    root, caught = _root_warnings(configured)
    assert len(caught) == 1 and "not a folder" in str(caught[0].message)
    assert root.is_dir() and os.access(root, os.W_OK)
    assert not str(root).startswith(str(regular))


def test_read_only_cache_root_falls_back_with_one_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # chmod does not stop root, who runs these tests on some machines: os.access says no.
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    real_access = os.access
    monkeypatch.setattr(cache_dir.os, "access", lambda path, mode, **kw: (
        False if Path(path) == read_only else real_access(path, mode, **kw)))
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(read_only / "tfxla_lite"))
    root, caught = _root_warnings(read_only / "tfxla_lite")
    assert len(caught) == 1 and "not writable" in str(caught[0].message)
    assert root != read_only / "tfxla_lite" and root.is_dir()


def test_usable_cache_root_is_used_without_warning(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path / "a" / "b"))
    root, caught = _root_warnings(tmp_path / "a" / "b")
    assert root == tmp_path / "a" / "b" and caught == []


def test_compiled_function_runs_with_a_file_as_cache_root(fake_compiler: Path,
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Every call raised before; now the op library is built in the fallback folder."""
    regular = tmp_path / "cache_file"
    regular.write_text("")
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(regular))
    result = _run_compiled()
    library = _assert_ran(result)
    assert not str(library).startswith(str(regular))
    assert result.stderr.count("CacheDirWarning") == 1, textwrap.shorten(result.stderr, 3000)
    assert _compiles(fake_compiler) == 1
