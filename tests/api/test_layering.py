"""The import layering of tfxla-lite, checked statically over every import.

Every module of the installed packages (`tfxla_lite/`, `clustering/` as
`tfxla_lite.clustering`, `codegen/` as `tfxla_lite.codegen`: setup.py's `PACKAGES`) is
parsed, and each `import` / `from ... import` at any depth, function-local ones included,
becomes an edge of the module import graph. Imports under `if TYPE_CHECKING:` are exempt
(they never run), and so is the root package's lazy `__getattr__` (`importlib`, not an
import statement: `tfxla_lite.function` resolves to the front end on first use).

Two rules: an import goes to the same layer or a lower one (LAYERS), and the graph has
no cycles. Known exceptions that someone is removing sit in ALLOWED_UPWARD and
ALLOWED_CYCLE_EDGES with the owner's name; an entry that no longer matches anything fails
`test_allow_lists_hold_only_live_entries`, so the lists shrink as the work lands.

Because the core (hlo, passes, settings, codegen) imports only itself and no module of it
imports TensorFlow, the core and its tests run without TF; the static checks here say so
on every run, and the slow test re-runs those suites with TF blocked.
"""

from __future__ import annotations

import ast
import fnmatch
import pathlib
import subprocess
import sys
from collections.abc import Iterable, Iterator

import networkx as nx
import pytest

TESTS = pathlib.Path(__file__).parents[1]
REPOSITORY = TESTS.parent
BLOCK_TENSORFLOW = "import sys; sys.modules['tensorflow'] = None\n"  # any import then fails

# Lowest first. A module imports only from its own layer or lower ones. An entry is a
# module, or `package.*` for a package and its submodules; a module's own name wins over a
# pattern, a longer pattern over a shorter one.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # The root package holds only __version__ and lazily resolved names.
    ("hlo", ("tfxla_lite", "tfxla_lite.hlo.*")),
    ("passes", ("tfxla_lite.passes.*",)),
    # Options name passes; codegen, the runtime and the front end read them.
    ("settings", ("tfxla_lite.options", "tfxla_lite.flags", "tfxla_lite.cache_dir")),
    ("codegen", ("tfxla_lite.codegen.*",)),
    ("runtime, clustering", ("tfxla_lite.runtime.*", "tfxla_lite.clustering.*")),
    ("front end", ("tfxla_lite.*",)),
)
CORE_LAYERS = ("hlo", "passes", "settings", "codegen")
TENSORFLOW = ("tensorflow", "keras", "tf_keras")

# (importer, imported) -> owner: imports that go up a layer, being removed.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# (importer, imported) -> owner: without these edges the import graph has no cycle.
# Patterns as in fnmatch.
ALLOWED_CYCLE_EDGES: dict[tuple[str, str], str] = {}


def _packages() -> dict[str, pathlib.Path]:
    """setup.py's `PACKAGES`: import name -> folder, read without running setup()."""
    for node in ast.parse((REPOSITORY / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "PACKAGES"
                for target in node.targets):
            return {name: REPOSITORY / folder
                    for name, folder in ast.literal_eval(node.value).items()}
    raise AssertionError("setup.py has no PACKAGES table")


def _modules(packages: dict[str, pathlib.Path]) -> dict[str, pathlib.Path]:
    """Import name -> file, for every module of `packages`."""
    modules = {}
    for package, folder in packages.items():
        for path in folder.glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def _under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in `tree` at any depth, except the bodies of
    `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _under_type_checking(node):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _imported_names(module: str, is_package: bool,
                    node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute dotted names `node` imports: `from p import n` gives `p.n` (a module or
    a name in `p`, decided by the caller)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def imports_of(modules: dict[str, pathlib.Path]) -> dict[str, dict[str, int]]:
    """importer -> {imported: line}; an imported name is the longest known module that
    prefixes it, or its top-level name when it is not one of `modules`."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        targets: dict[str, int] = {}
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            for name in _imported_names(module, path.name == "__init__.py", node):
                target = name
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target not in modules:
                    target = name.split(".")[0]
                if target != module:
                    targets.setdefault(target, node.lineno)
        graph[module] = targets
    return graph


def layer_of(module: str) -> int:
    """The index in LAYERS of `module`'s layer."""
    matches = []
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if module == entry:
                matches.append((1, 0, index))
            elif entry.endswith(".*") and (module + ".").startswith(entry[:-1]):
                matches.append((0, len(entry), index))
    if not matches:
        raise AssertionError(f"{module} is in no layer of LAYERS")
    return max(matches)[2]


def upward_imports(graph: dict[str, dict[str, int]]) -> dict[tuple[str, str], int]:
    """(importer, imported) -> line, for every internal import into a higher layer."""
    return {(importer, imported): line
            for importer, targets in graph.items() for imported, line in targets.items()
            if imported in graph and layer_of(imported) > layer_of(importer)}


def _allowed(edge: tuple[str, str], patterns: Iterable[tuple[str, str]]) -> bool:
    return any(fnmatch.fnmatchcase(edge[0], importer) and fnmatch.fnmatchcase(edge[1], imported)
               for importer, imported in patterns)


def cycles(graph: dict[str, dict[str, int]],
           allowed: Iterable[tuple[str, str]] = ()) -> list[list[str]]:
    """The import cycles (strongly connected groups of modules, sorted) that remain once
    the `allowed` edges are left out."""
    allowed = list(allowed)
    directed = nx.DiGraph()
    directed.add_nodes_from(graph)
    directed.add_edges_from((importer, imported) for importer, targets in graph.items()
                            for imported in targets
                            if imported in graph and not _allowed((importer, imported), allowed))
    return sorted(sorted(group) for group in nx.strongly_connected_components(directed)
                  if len(group) > 1)


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return imports_of(_modules(_packages()))


def test_every_module_is_in_a_layer(graph: dict[str, dict[str, int]]) -> None:
    assert "tfxla_lite.clustering.mark" in graph and "tfxla_lite.codegen.cpu.compiler" in graph
    for module in graph:
        layer_of(module)


def test_every_import_goes_to_the_same_or_a_lower_layer(
        graph: dict[str, dict[str, int]]) -> None:
    upward = {edge: line for edge, line in upward_imports(graph).items()
              if edge not in ALLOWED_UPWARD}
    assert not upward, "imports into a higher layer (importer -> imported, line):\n" + "\n".join(
        f"  {importer} ({LAYERS[layer_of(importer)][0]}) -> {imported} "
        f"({LAYERS[layer_of(imported)][0]}), line {line}"
        for (importer, imported), line in sorted(upward.items()))


def test_the_import_graph_has_no_cycles(graph: dict[str, dict[str, int]]) -> None:
    remaining = cycles(graph, ALLOWED_CYCLE_EDGES)
    assert not remaining, "import cycles (each group imports itself through its members):\n" + (
        "\n".join("  " + " <-> ".join(group) for group in remaining))


def test_allow_lists_hold_only_live_entries(graph: dict[str, dict[str, int]]) -> None:
    """An entry that no longer matches (its import is gone or no longer closes a cycle)
    is to be deleted: the lists only shrink."""
    upward = upward_imports(graph)
    stale = [f"ALLOWED_UPWARD {edge}" for edge in ALLOWED_UPWARD if edge not in upward]
    groups = [set(group) for group in cycles(graph)]
    for pattern in ALLOWED_CYCLE_EDGES:
        if not any(_allowed((importer, imported), [pattern])
                   and any(importer in group and imported in group for group in groups)
                   for importer, targets in graph.items() for imported in targets):
            stale.append(f"ALLOWED_CYCLE_EDGES {pattern}")
    assert not stale, "delete these entries, they match nothing now:\n" + "\n".join(stale)


def test_the_checks_find_an_upward_import_and_a_cycle(tmp_path: pathlib.Path) -> None:
    """A small package: hlo importing passes (up a layer, inside a function), passes and
    dce importing each other (a cycle), an import under TYPE_CHECKING (exempt)."""
    (tmp_path / "hlo").mkdir()
    (tmp_path / "passes").mkdir()
    (tmp_path / "hlo" / "__init__.py").write_text("")
    (tmp_path / "hlo" / "ir.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tfxla_lite.api\n"
        "def f():\n    from tfxla_lite.passes import dce\n")
    (tmp_path / "passes" / "__init__.py").write_text("from . import dce\n")
    (tmp_path / "passes" / "dce.py").write_text("import tfxla_lite.passes as p\n")
    graph = imports_of(_modules({"tfxla_lite.hlo": tmp_path / "hlo",
                                 "tfxla_lite.passes": tmp_path / "passes"}))
    assert graph["tfxla_lite.hlo.ir"] == {"typing": 1, "tfxla_lite.passes.dce": 5}
    assert upward_imports(graph) == {("tfxla_lite.hlo.ir", "tfxla_lite.passes.dce"): 5}
    assert cycles(graph) == [["tfxla_lite.passes", "tfxla_lite.passes.dce"]]
    assert cycles(graph, [("tfxla_lite.passes.d*", "tfxla_lite.passes")]) == []


def test_the_core_imports_no_tensorflow(graph: dict[str, dict[str, int]]) -> None:
    """With the layering above, the core's import closure (function-local imports
    included) is the core itself: none of its modules may import TF."""
    core = [module for module in graph if LAYERS[layer_of(module)][0] in CORE_LAYERS]
    assert "tfxla_lite.codegen.cpu.compiler" in core and "tfxla_lite.api" not in core
    found = [f"{module} -> {imported}" for module in core for imported in graph[module]
             if imported in TENSORFLOW]
    assert not found, found


def test_core_imports_without_tensorflow() -> None:
    code = (
        "import sys\n"
        "import tfxla_lite, tfxla_lite.hlo, tfxla_lite.hlo.evaluator, tfxla_lite.passes\n"
        "import tfxla_lite.codegen, tfxla_lite.hlo.parser, tfxla_lite.hlo.cost_analysis\n"
        "assert 'tensorflow' not in sys.modules, 'the core imported TensorFlow'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


CORE_TEST_FOLDERS = ("hlo", "passes", "codegen")
# (test file, imported module) -> why: imports of the core's tests outside the core.
# Patterns as in fnmatch.
CORE_TEST_EXCEPTIONS = {
    ("conftest.py", "tfxla_lite.runtime.loader"):
        "cache_root loads the launch op only when TF is already loaded",
    ("*", "tfxla_lite.cli"): "its HLO commands (opt, run, export-stablehlo) use only the "
                             "core; the others import the front end when they run",
}


def _core_test_files() -> dict[str, pathlib.Path]:
    """Name -> path of the core's test files, conftests included (the root one is loaded
    for them too), and of every module under tests/ they import, transitively."""
    helpers = {path.stem: path for path in TESTS.rglob("*.py")}
    pending = [path for folder in CORE_TEST_FOLDERS for path in (TESTS / folder).glob("*.py")
               if path.stem.startswith("test_") or path.stem == "conftest"]
    pending.append(TESTS / "conftest.py")
    found: dict[str, pathlib.Path] = {}
    while pending:
        path = pending.pop()
        name = str(path.relative_to(TESTS))
        if name in found:
            continue
        found[name] = path
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            for imported in _imported_names("", False, node):
                top = imported.split(".")[0]
                if top in helpers:
                    pending.append(helpers[top])
    return found


def test_core_tests_import_no_tensorflow(graph: dict[str, dict[str, int]]) -> None:
    """The tests of hlo, passes and codegen, and the helpers they import, import neither
    TF nor a module of tfxla-lite outside the core: they run where TF is not installed."""
    files = _core_test_files()
    assert "tolerances.py" in files and "hlo/hlo_builders.py" in files
    found = []
    for name, path in files.items():
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            for imported in _imported_names("", False, node):
                if imported.split(".")[0] in TENSORFLOW:
                    found.append(f"{name}:{node.lineno} imports {imported}")
                elif imported.startswith("tfxla_lite"):
                    module = imported
                    while module not in graph:
                        module = module.rsplit(".", 1)[0]
                    if (LAYERS[layer_of(module)][0] not in CORE_LAYERS
                            and not _allowed((name, module), CORE_TEST_EXCEPTIONS)):
                        found.append(f"{name}:{node.lineno} imports {module}")
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_core_test_suites_pass_with_tensorflow_unimportable() -> None:
    """The dynamic form of the two checks above: the core's suites with TF blocked."""
    code = BLOCK_TENSORFLOW + (
        "import pytest\n"
        f"sys.exit(pytest.main([{str(TESTS / 'hlo')!r}, {str(TESTS / 'passes')!r}, "
        f"{str(TESTS / 'codegen')!r}, '-q', '-x', '-p', 'no:cacheprovider', "
        "'-m', 'not slow']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
