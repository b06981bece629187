"""The CPU backend's modules import alone, and none reaches back into `cpu/compiler.py`
from inside a function (the form an import cycle hides in)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfxla_lite.codegen import cache

CODEGEN = Path(cache.__file__).resolve().parent
MODULES = sorted(
    ["tfxla_lite.codegen." + p.stem for p in CODEGEN.glob("*.py") if p.stem != "__init__"]
    + ["tfxla_lite.codegen.cpu." + p.stem for p in (CODEGEN / "cpu").glob("*.py")
       if p.stem != "__init__"])


# Imports each module first, with every module of the package forgotten before it: as
# a fresh interpreter would, for the package under test, at a fraction of the time of
# one interpreter per module (NumPy, llvmlite and the HLO package stay loaded).
_SCRIPT = """
import importlib, sys
package, names = sys.argv[1], sys.argv[2:]
failures = {}
for name in names:
    for loaded in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as error:
        failures[name] = f"{type(error).__name__}: {error}"
print(repr(failures))
"""


def _import_failures(package: str, names: list[str], path: Path | None = None
                     ) -> dict[str, str]:
    """Each of `names` imported first after `package`'s modules are forgotten, in one
    fresh interpreter (`path`: a folder put first on its sys.path); the failures."""
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if path is not None:
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(path), *filter(None, [environment.get("PYTHONPATH")])])
    result = subprocess.run([sys.executable, "-c", _SCRIPT, package, *names],
                            capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stderr
    return ast.literal_eval(result.stdout.strip().splitlines()[-1])


def test_each_module_imports_first_in_a_fresh_interpreter() -> None:
    """A cycle among top-level imports fails with a partially initialized module."""
    assert _import_failures("tfxla_lite.codegen", MODULES) == {}


def test_the_check_finds_a_cycle(tmp_path: Path) -> None:
    """Two modules that import each other's names at the top, and one that does not."""
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic.b import B\nA = 1\n")
    (package / "b.py").write_text("from cyclic.a import A\nB = 2\n")
    (package / "c.py").write_text("C = 3\n")
    failures = _import_failures("cyclic", ["cyclic.a", "cyclic.c", "cyclic.b"], tmp_path)
    assert sorted(failures) == ["cyclic.a", "cyclic.b"]
    assert "partially initialized" in failures["cyclic.a"]


def _local_imports_of_the_driver(path: Path) -> list[int]:
    """Lines of function-local imports of `cpu/compiler.py` in `path`."""
    lines = []
    for function in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (
                    node.module == "tfxla_lite.codegen.cpu.compiler"
                    or (node.module == "tfxla_lite.codegen.cpu"
                        and any(alias.name == "compiler" for alias in node.names))):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", sorted((CODEGEN / "cpu").glob("*.py")), ids=lambda p: p.name)
def test_no_function_imports_the_driver(path: Path) -> None:
    assert not _local_imports_of_the_driver(path)


def test_the_check_finds_a_local_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from tfxla_lite.codegen.cpu import compiler\n"
                      "    return compiler\n")
    assert _local_imports_of_the_driver(sample) == [2]
