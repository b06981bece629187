"""Building the op library: the cache (a second load compiles nothing), the cache key,
concurrent builders, compiler errors, and the `python -m` entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tensorflow as tf

from tfxla_lite.runtime import build, loader

# Compiles in well under a second with the TF flags: for tests of the cache machinery.
TINY_SOURCE = 'extern "C" int tfxla_lite_tiny() { return 1; }\n'


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tiny_config(tmp_path: Path) -> build.BuildConfig:
    source = tmp_path / "tiny.cc"
    source.write_text(TINY_SOURCE)
    return build.default_config(source)


@pytest.fixture
def compile_count(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Records each real compile (its target), slowed down so builders overlap."""
    compiled: list[Path] = []
    real_compile = build._compile

    def counting_compile(config: build.BuildConfig, target: Path) -> None:
        compiled.append(target)
        time.sleep(0.2)
        real_compile(config, target)

    monkeypatch.setattr(build, "_compile", counting_compile)
    return compiled


def test_second_load_does_not_rebuild(op_library: loader.OpLibrary, compile_count) -> None:
    path = Path(op_library.path)
    mtime = path.stat().st_mtime_ns
    assert build.build_op_library() == path
    assert loader.load_library() is op_library
    assert compile_count == []
    assert path.stat().st_mtime_ns == mtime


def test_cache_is_keyed_by_tf_version_and_source(
    cache_dir: Path, tiny_config: build.BuildConfig, tmp_path: Path
) -> None:
    path = build.library_path(tiny_config)
    assert path.parent.parent == cache_dir / "ops"
    assert path.parent.name.startswith(f"{tf.__version__}-")
    other_source = tmp_path / "other.cc"
    other_source.write_text(TINY_SOURCE + "// changed\n")
    assert build.library_path(build.default_config(other_source)) != path


def test_tiny_build_then_cached_then_forced(
    cache_dir: Path, tiny_config: build.BuildConfig, compile_count
) -> None:
    path = build.build_op_library(tiny_config)
    assert path.is_file() and len(compile_count) == 1
    assert build.build_op_library(tiny_config) == path
    assert len(compile_count) == 1
    build.build_op_library(tiny_config, force=True)
    assert len(compile_count) == 2
    leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_concurrent_builders_compile_once(
    cache_dir: Path, tiny_config: build.BuildConfig, compile_count
) -> None:
    results: list[Path] = []
    barrier = threading.Barrier(4)

    def builder() -> None:
        barrier.wait()
        results.append(build.build_op_library(tiny_config))

    threads = [threading.Thread(target=builder) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(compile_count) == 1
    assert len(set(results)) == 1 and len(results) == 4 and results[0].is_file()


def test_compiler_error_is_reported(cache_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "broken.cc"
    source.write_text("int broken = ;\n")
    config = build.default_config(source)
    with pytest.raises(build.BuildError, match=r"(?s)failed.*broken\.cc.*error"):
        build.build_op_library(config)
    assert not build.library_path(config).exists()


def test_missing_compiler_is_reported(
    cache_dir: Path, tiny_config: build.BuildConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-tfxla")
    config = build.default_config(tiny_config.source)
    with pytest.raises(build.BuildError, match="no C\\+\\+ compiler"):
        build.build_op_library(config)


def test_module_entry_point_prints_the_path(op_library: loader.OpLibrary) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tfxla_lite.runtime.build"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.stdout.strip().splitlines()[-1] == op_library.path
