"""The compiler core's switches (codegen/config.py): one module reads the environment,
and a switch passed to `compile_module` decides over the variable."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tfxla_lite.codegen import cache, compile_module, config
from tfxla_lite.hlo.parser import parse_module

CODEGEN = Path(config.__file__).resolve().parent
# Locating the CUDA toolkit, as nvcc and CuPy do (CUDA_HOME, CUDA_PATH): not a switch.
TOOLKIT_LOCATION = {"gpu/nvcc.py", "gpu/executable.py", "gpu/cublaslt.py"}
TOOLKIT_VARIABLES = {"CUDA_HOME", "CUDA_PATH"}

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


def _locates_the_toolkit(path: Path, line: int) -> bool:
    text = path.read_text().splitlines()[line - 1]
    return any(f'"{name}"' in text for name in TOOLKIT_VARIABLES)


def test_only_the_config_module_reads_the_environment() -> None:
    offenders = []
    for path in sorted(CODEGEN.rglob("*.py")):
        relative = path.relative_to(CODEGEN).as_posix()
        if relative == "config.py":
            continue
        for line in _environment_reads(path):
            if relative in TOOLKIT_LOCATION and _locates_the_toolkit(path, line):
                continue
            offenders.append(f"codegen/{relative}:{line}")
    assert not offenders, f"environment read outside codegen/config.py: {offenders}"


def test_the_check_finds_a_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom os import getenv\nx = os.environ.get('A')\n")
    assert _environment_reads(sample) == [2, 3]


@pytest.mark.parametrize(("value", "setting"), [
    (None, "on"), ("1", "on"), ("memory", "memory"), (" Memory ", "memory"), ("0", "off"),
    ("off", "off"), ("FALSE", "off"), ("no", "off"), ("none", "off"), ("yes", "on"),
])
def test_cache_setting_reads_the_variable(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                          setting: str) -> None:
    if value is None:
        monkeypatch.delenv(config.CACHE, raising=False)
    else:
        monkeypatch.setenv(config.CACHE, value)
    assert config.cache_setting() == setting


def test_switches_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (config.TIERED, config.OVERLAP_LLVM, config.CUBLASLT,
                     config.BACKGROUND_NICE):
        monkeypatch.delenv(variable, raising=False)
    assert (config.tiered_llvm(), config.overlap_llvm(), config.cublaslt_epilogues(),
            config.background_nice(10)) == (True, False, True, 10)
    monkeypatch.setenv(config.TIERED, "off")
    monkeypatch.setenv(config.OVERLAP_LLVM, "1")
    monkeypatch.setenv(config.CUBLASLT, "0")
    monkeypatch.setenv(config.BACKGROUND_NICE, "3")
    assert (config.tiered_llvm(), config.overlap_llvm(), config.cublaslt_epilogues(),
            config.background_nice(10)) == (False, True, False, 3)
    monkeypatch.setenv(config.BACKGROUND_NICE, "high")
    with pytest.raises(ValueError, match=config.BACKGROUND_NICE):
        config.background_nice(10)


@pytest.mark.parametrize(("preset", "expected"), [
    ({}, config.GOMP_SPIN_COUNT),
    ({"GOMP_SPINCOUNT": "7"}, "7"),
    ({"OMP_WAIT_POLICY": "passive"}, None),
])
def test_gomp_spin_count_leaves_a_users_choice(monkeypatch: pytest.MonkeyPatch,
                                               preset: dict[str, str],
                                               expected: str | None) -> None:
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in preset.items():
        monkeypatch.setenv(name, value)
    config.default_gomp_spin_count()
    assert os.environ.get("GOMP_SPINCOUNT") == expected


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
    monkeypatch.setenv(config.CACHE, environment)
    x = np.linspace(-3.0, 3.0, 512, dtype=np.float32).reshape(64, 8)
    first = compile_module(parse_module(HLO), cache=argument)
    np.testing.assert_allclose(first(x)[0], np.tanh(x), rtol=1e-5, atol=1e-6)
    second = compile_module(parse_module(HLO), cache=argument)
    assert bool(_written(cache_folder)) == writes
    assert second.compiled_from == second_from
    np.testing.assert_allclose(second(x)[0], np.tanh(x), rtol=1e-5, atol=1e-6)
