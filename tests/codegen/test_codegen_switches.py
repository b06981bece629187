"""The compiler core's switches: no module under `codegen/` reads the environment; each
switch is an `Options` field (`tfxla_lite.flags`, which maps the switches' own
variables), and a switch passed to `compile_module` decides over the process's."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tfxla_lite import flags
from tfxla_lite.codegen import cache, compile_module
from tfxla_lite.codegen.cpu import parallel
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.options import Options

CODEGEN = Path(cache.__file__).resolve().parent
# Locating the CUDA toolkit, as nvcc and CuPy do (CUDA_HOME, CUDA_PATH), and leaving a
# user's choice of libgomp's wait policy alone: not switches.
ALLOWED_READS = {"gpu/nvcc.py": ("CUDA_HOME", "CUDA_PATH"),
                 "gpu/executable.py": ("CUDA_HOME", "CUDA_PATH"),
                 "gpu/cublaslt.py": ("CUDA_HOME", "CUDA_PATH"),
                 "cpu/parallel.py": ("_WAIT_POLICY_VARIABLES",)}

HLO = """HloModule switched

ENTRY main {
  x = f32[64,8] parameter(0)
  ROOT t = f32[64,8] tanh(x)
}
"""


def _environment_reads(path: Path) -> list[int]:
    """The lines of each `os.environ`, `os.getenv` or `os.putenv` use in `path`."""
    names = ("environ", "getenv", "putenv")
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in names:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                alias.name in names for alias in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_codegen_module_reads_the_environment() -> None:
    offenders = []
    for path in sorted(CODEGEN.rglob("*.py")):
        relative = path.relative_to(CODEGEN).as_posix()
        lines = path.read_text().splitlines()
        for line in _environment_reads(path):
            if any(name in lines[line - 1] for name in ALLOWED_READS.get(relative, ())):
                continue
            offenders.append(f"codegen/{relative}:{line}")
    assert not offenders, f"environment read under codegen/: {offenders}"


def test_the_check_finds_a_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom os import getenv\nx = os.environ.get('A')\n")
    assert _environment_reads(sample) == [2, 3]


@pytest.mark.parametrize(("value", "setting"), [
    (None, None), ("1", "on"), ("memory", "memory"), (" Memory ", "memory"), ("0", "off"),
    ("off", "off"), ("FALSE", "off"), ("no", "off"), ("none", "off"), ("yes", "on"),
])
def test_the_cache_variable_maps_to_the_option(monkeypatch: pytest.MonkeyPatch,
                                               value: str | None, setting: str | None) -> None:
    if value is None:
        monkeypatch.delenv(flags.SWITCH_VARIABLES["cache"], raising=False)
    else:
        monkeypatch.setenv(flags.SWITCH_VARIABLES["cache"], value)
    assert flags.switch("cache") == (setting or "on")


def test_switches_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ("tiered_llvm", "overlap_llvm", "cublaslt_epilogues", "background_nice",
             "autograph_cache")
    for name in names:
        monkeypatch.delenv(flags.SWITCH_VARIABLES[name], raising=False)
    assert [flags.switch(name) for name in names] == [True, False, True, 10, True]
    for name, value in zip(names, ("off", "1", "0", "3", "no")):
        monkeypatch.setenv(flags.SWITCH_VARIABLES[name], value)
    assert [flags.switch(name) for name in names] == [False, True, False, 3, False]
    monkeypatch.setenv(flags.SWITCH_VARIABLES["background_nice"], "high")
    with pytest.raises(ValueError, match=flags.SWITCH_VARIABLES["background_nice"]):
        flags.switch("background_nice")


def test_an_option_decides_over_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(flags.SWITCH_VARIABLES["tiered_llvm"], "0")
    assert flags.switch("tiered_llvm", Options(tiered_llvm=True)) is True
    assert flags.switch("tiered_llvm", Options()) is False


_LIBGOMP_SPIN = """
import os, sys
from tfxla_lite.codegen.cpu import parallel
assert parallel.openmp_available()
print("GOMP_SPINCOUNT" in os.environ, os.getenv("GOMP_SPINCOUNT"))
"""


@pytest.mark.skipif(not parallel.openmp_available(), reason="no libgomp")
@pytest.mark.parametrize(("preset", "expected"), [
    ({}, "20000"),
    ({"GOMP_SPINCOUNT": "7"}, "7"),
    ({"OMP_WAIT_POLICY": "passive"}, "0"),
])
def test_libgomp_spins_briefly_and_the_environment_stays(preset: dict[str, str],
                                                         expected: str) -> None:
    """libgomp reads its spin count (`OMP_DISPLAY_ENV` prints what it read) unless the user
    chose a wait policy; neither `os.environ` nor the C environment keeps the variable."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(preset, OMP_DISPLAY_ENV="VERBOSE")
    done = subprocess.run([sys.executable, "-c", _LIBGOMP_SPIN], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"GOMP_SPINCOUNT = '{expected}'" in done.stderr, done.stderr
    kept = "GOMP_SPINCOUNT" in preset
    assert done.stdout.split() == [str(kept), preset.get("GOMP_SPINCOUNT", "None")]


@pytest.mark.parametrize(("argument", "memory", "disk"), [
    (True, True, True), ("on", True, True), ("memory", True, False),
    (False, False, False), ("off", False, False),
])
def test_policy_of_an_argument(argument: bool | str, memory: bool, disk: bool) -> None:
    chosen = cache.policy(argument)
    assert (chosen.memory, chosen.disk) == (memory, disk)
    assert (chosen.root is not None) == disk  # the folder is fixed when the compile begins


def test_policy_refuses_an_unknown_setting() -> None:
    with pytest.raises(ValueError, match="on, memory, off"):
        cache.policy("disk")


@pytest.fixture
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path))
    cache.clear_memory()
    yield tmp_path
    cache.clear_memory()


def _written(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize(("environment", "argument", "writes", "second_from"), [
    ("1", "off", False, "llvm"),
    ("1", "memory", False, "memory"),
    ("0", "on", True, "memory"),
    ("0", True, True, "memory"),
    ("memory", None, False, "memory"),
])
def test_the_cache_argument_reaches_codegen(cache_folder: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            environment: str, argument: bool | str | None,
                                            writes: bool, second_from: str) -> None:
    monkeypatch.setenv(flags.SWITCH_VARIABLES["cache"], environment)
    x = np.linspace(-3.0, 3.0, 512, dtype=np.float32).reshape(64, 8)
    first = compile_module(parse_module(HLO), cache=argument)
    np.testing.assert_allclose(first(x)[0], np.tanh(x), rtol=1e-5, atol=1e-6)
    second = compile_module(parse_module(HLO), cache=argument)
    assert bool(_written(cache_folder)) == writes
    assert second.compiled_from == second_from
    np.testing.assert_allclose(second(x)[0], np.tanh(x), rtol=1e-5, atol=1e-6)
