"""Keras's own layer tests as the check that tfxla-lite is a drop-in (`scripts/keras_suite.sh`).

Keras ships its tests in its wheel (`keras/src/**/*_test.py`). This driver runs those of
`keras/src/layers/` (or of the folders whole models go through, `--models`: `MODEL_FOLDERS`;
or the folders and files named on the command line; or one slice of them) with
`KERAS_BACKEND=tensorflow` under `TFXLA_LITE_FLAGS=--auto_jit=2`, re-runs every
test that failed there under plain TF (the flag unset), and prints the tests that fail only
under tfxla-lite, each with the first line of its error; it exits with 1 when there is any.
A test that fails under plain TF too (one whose module needs JAX, torch or grain fails at
import in both) is not tfxla-lite's.

Data flow: `discover` → `slice_files` → `run_tests` (pytest in subprocesses, from a working
folder outside any repository, with `tfxla_lite.keras_suite_plugin` standing in for Keras's
top-level conftest and writing one JSON line per test phase) → `read_log` (one `Outcome` per
test) → `compare` (the set difference of the failures) → `summary`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

FLAGS = "--auto_jit=2"
SRC = "keras/src"
LAYERS = "keras/src/layers"
# What users do with whole models: fit/evaluate/predict, building and cloning, optimizers,
# losses, metrics, saving, callbacks, and TF's backend (folders of keras/src).
MODEL_FOLDERS = ("trainers", "models", "optimizers", "losses", "metrics", "saving",
                 "callbacks", "backend/tensorflow")
FAILING = ("failed", "error", "crashed")
EXIT_TFXLA_LITE_ONLY = 1
EXIT_NO_TESTS = 2


@dataclass(frozen=True)
class Outcome:
    """What happened to one test (or one test file that failed to import).

    `outcome` is `passed`, `skipped`, `failed` (in the test's body), `error` (in its setup,
    teardown or the file's import) or `crashed` (the process died or hung in it)."""

    nodeid: str
    outcome: str
    message: str = ""
    duration: float = 0.0

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING


@dataclass
class SuiteResult:
    """The figures of one run of the suite: every test's outcome under the flag, the
    outcomes under plain TF of those that failed there, and the difference."""

    flagged: dict[str, Outcome]
    plain: dict[str, Outcome] = field(default_factory=dict)
    tfxla_lite_only: list[Outcome] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    flags: str = FLAGS
    compile_stats: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        flagged = self.flagged.values()
        return {
            "run": len(self.flagged),
            "passed": sum(o.outcome == "passed" for o in flagged),
            "failed": sum(o.failing for o in flagged),
            "skipped": sum(o.outcome == "skipped" for o in flagged),
            "failed_plain_tf": sum(o.failing for o in self.plain.values()),
            "tfxla_lite_only": len(self.tfxla_lite_only),
        }

    def to_json(self) -> dict:
        return {"counts": self.counts(), "flags": self.flags, "files": self.files,
                "seconds": self.seconds, "compile_stats": self.compile_stats,
                "flagged": [asdict(o) for o in self.flagged.values()],
                "plain": [asdict(o) for o in self.plain.values()],
                "tfxla_lite_only": [asdict(o) for o in self.tfxla_lite_only]}


# --- which tests ---------------------------------------------------------------------------

def site_packages_of_keras() -> Path | None:
    """The folder that holds the `keras` package (node ids are relative to it), found
    without importing Keras; None when it is not installed."""
    spec = importlib.util.find_spec("keras")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def resolve(root: Path, name: str) -> Path:
    """The folder or file of Keras's sources that `name` names: a path of `keras/src/layers`
    (`core`), else of `keras/src` (`trainers`, `backend/tensorflow`), or one written from
    site-packages (`keras/src/activations`, as node ids read). A name that leaves
    `keras/src` or names nothing is a clear error."""
    src = (root / SRC).resolve()
    if name.startswith(SRC + "/") or name == SRC:
        candidates = [root / name]
    else:
        candidates = [root / LAYERS / name, root / SRC / name]
    for base in candidates:
        if base.exists():
            if not base.resolve().is_relative_to(src):
                raise SystemExit(f"{name!r} is outside {root / SRC}")
            return base.resolve()
    raise SystemExit(f"no {name!r} in {root / LAYERS} or {root / SRC} "
                     f"(or write it as keras/src/...)")


def discover(root: Path, selection: Sequence[str] = (), *, models: bool = False) -> list[str]:
    """The Keras test files, as paths relative to `root` (site-packages), sorted.

    `selection` names folders or files (`resolve`: `core`,
    `normalization/batch_normalization_test.py`, `trainers`); `models` adds
    `MODEL_FOLDERS`. Neither means all of `keras/src/layers`."""
    names = [*selection, *(MODEL_FOLDERS if models else ())]
    bases = [resolve(root, name) for name in names] or [root / LAYERS]
    files: set[str] = set()
    site = root.resolve()
    for base in bases:
        found = [base] if base.is_file() else base.rglob("*_test.py")
        files.update(path.resolve().relative_to(site).as_posix() for path in found)
    return sorted(files)


def parse_slice(text: str) -> tuple[int, int]:
    """`K/N`, 1 <= K <= N: the K-th of N slices."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slice takes K/N, got {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"--slice K/N needs 1 <= K <= N, got {text!r}")
    return k, n


def slice_files(files: Sequence[str], k: int, n: int) -> list[str]:
    """Every N-th file starting at the K-th (1-based) of the sorted list: deterministic,
    and each slice takes files from every folder rather than one folder's run."""
    return [path for i, path in enumerate(sorted(files)) if i % n == k - 1]


# --- running pytest -------------------------------------------------------------------------

def environment(flags: str | None) -> dict[str, str]:
    """The child's environment: TF's backend for Keras, the flag set or removed."""
    env = dict(os.environ)
    env["KERAS_BACKEND"] = "tensorflow"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Keras's test modules and pytest's rewritten copies stay out of the shared venv.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    if flags:
        env["TFXLA_LITE_FLAGS"] = flags
    else:
        env.pop("TFXLA_LITE_FLAGS", None)
    return env


def pytest_command(root: Path, work: Path, targets: Sequence[str], log: Path,
                   exclude: Path, timeout: float) -> list[str]:
    # The ini file in `work` holds Keras's own pytest settings (its pyproject's warning
    # filters), so neither this repository's pytest.ini nor any other applies.
    # A file that fails to import must not stop the others of its process.
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--continue-on-collection-errors",
            "-p", "tfxla_lite.keras_suite_plugin", "-c", str(work / "pytest.ini"),
            "--rootdir", str(root), "--keras-suite-log", str(log),
            "--keras-suite-exclude", str(exclude), "--keras-suite-timeout", str(timeout),
            "-o", "console_output_style=classic", *[str(root / t) for t in targets]]


# Keras's `[tool.pytest.ini_options]` (its pyproject.toml): warnings are errors but for these.
KERAS_PYTEST_INI = """[pytest]
filterwarnings =
    error
    ignore::DeprecationWarning
    ignore::ImportWarning
    ignore::RuntimeWarning
    ignore::PendingDeprecationWarning
    ignore::FutureWarning
    ignore::UserWarning
    ignore:Custom mask layers require a config
"""


# Keras's top-level conftest.py, which is not in the wheel, is also a module some tests
# import (`from conftest import skip_if_backend`); `python -m pytest` puts the working folder
# first on sys.path, so this stand-in there is what they import.
KERAS_CONFTEST_MODULE = '''"""Stand-in for the helpers of Keras's top-level conftest.py."""
import pytest
from keras.src.backend import backend


def skip_if_backend(given_backend, reason):
    return pytest.mark.skipif(backend() == given_backend, reason=reason)
'''


def run_tests(targets: Sequence[str], flags: str | None, work: Path, tag: str, *,
              root: Path, timeout: float = 300.0, files_per_process: int = 8,
              echo: bool = True) -> dict[str, Outcome]:
    """Runs `targets` (files or node ids relative to `root`) under `flags` and returns each
    test's outcome.

    A few files a process bound the memory one process accumulates and what a crash
    costs. When a process dies or hangs (no log line for `timeout` + 60 s), the test it
    was in is `crashed` and the rest of its files run again in a new process, without
    the tests already reported."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "pytest.ini").write_text(KERAS_PYTEST_INI, encoding="utf-8")
    (work / "conftest.py").write_text(KERAS_CONFTEST_MODULE, encoding="utf-8")
    log = work / f"{tag}.jsonl"
    log.write_text("", encoding="utf-8")
    exclude = work / f"{tag}.exclude"
    env = environment(flags)
    chunks = [list(targets[i:i + files_per_process])
              for i in range(0, len(targets), files_per_process)]
    for number, chunk in enumerate(chunks, 1):
        for _attempt in range(50):
            done = read_log(log)
            exclude.write_text("\n".join(done) + "\n", encoding="utf-8")
            if echo:
                print(f"[{tag} {number}/{len(chunks)}] {' '.join(chunk)}", flush=True)
            command = pytest_command(root, work, chunk, log, exclude, timeout)
            with open(work / f"{tag}.out", "a", encoding="utf-8") as out:
                rc = _run_watched(command, env, work, out, log, timeout + 60.0)
            # pytest's own codes: 0 all passed, 1 some failed, 5 nothing collected; a
            # crash or a kill leaves a test started and never finished.
            if rc in (0, 1, 5) or not _unfinished(log):
                break
            _write_crash(log, rc)
        if rc not in (0, 1, 5):
            _write_unreported(log, chunk, f"pytest ended with {rc} without reporting it "
                                          f"(see {work / (tag + '.out')})")
    return read_log(log)


def _run_watched(command: list[str], env: dict[str, str], cwd: Path, out: TextIO,
                 log: Path, idle_limit: float) -> int:
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    last_size, last_change = -1, time.monotonic()
    while process.poll() is None:
        time.sleep(1.0)
        size = log.stat().st_size
        if size != last_size:
            last_size, last_change = size, time.monotonic()
        elif time.monotonic() - last_change > idle_limit:
            process.kill()
            process.wait()
            return -9
    return process.returncode


def _unfinished(log: Path) -> list[str]:
    started: dict[str, bool] = {}
    for record in _records(log):
        if record["when"] == "session":
            continue
        if record["when"] == "start":
            started[record["nodeid"]] = False
        elif record["when"] == "teardown":
            started[record["nodeid"]] = True
    return [nodeid for nodeid, finished in started.items() if not finished]


def _write_crash(log: Path, rc: int) -> None:
    with open(log, "a", encoding="utf-8") as file:
        for nodeid in _unfinished(log):
            file.write(json.dumps({"nodeid": nodeid, "when": "crash", "outcome": "crashed",
                                   "message": f"the test process ended with {rc}"}) + "\n")


def _write_unreported(log: Path, targets: Sequence[str], message: str) -> None:
    # A pytest that could not start or stopped early must not read as a clean run.
    reported = list(read_log(log))
    with open(log, "a", encoding="utf-8") as file:
        for target in targets:
            if not any(nodeid.startswith(target) for nodeid in reported):
                file.write(json.dumps({"nodeid": target, "when": "collect",
                                       "outcome": "failed", "message": message}) + "\n")


# --- reading the results --------------------------------------------------------------------

def _records(log: Path) -> Iterable[dict]:
    if not log.exists():
        return
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def outcomes(records: Iterable[dict]) -> dict[str, Outcome]:
    """One `Outcome` per node id from the plugin's phase records, in first-seen order.

    A failure in the body is `failed`, in setup or teardown or at import `error`, a crash
    `crashed`; otherwise a skip in any phase (an expected failure too) is `skipped`; a
    test with only a `start` line is left out (`run_tests` marks it `crashed` first)."""
    phases: dict[str, list[dict]] = {}
    for record in records:
        if record["when"] not in ("start", "session"):
            phases.setdefault(record["nodeid"], []).append(record)
    result: dict[str, Outcome] = {}
    for nodeid, records_of_test in phases.items():
        by_outcome = {(r["when"], r["outcome"]): r for r in records_of_test}
        duration = sum(r.get("duration", 0.0) for r in records_of_test)
        crash = by_outcome.get(("crash", "crashed"))
        failed = [r for r in records_of_test if r["outcome"] == "failed"]
        skipped = [r for r in records_of_test if r["outcome"] == "skipped"]
        if crash is not None:
            outcome = Outcome(nodeid, "crashed", crash.get("message", ""), duration)
        elif failed:
            kind = "failed" if failed[0]["when"] == "call" else "error"
            outcome = Outcome(nodeid, kind, failed[0].get("message", ""), duration)
        elif skipped:
            outcome = Outcome(nodeid, "skipped", skipped[0].get("message", ""), duration)
        else:
            outcome = Outcome(nodeid, "passed", "", duration)
        result[nodeid] = outcome
    return result


def read_log(log: Path) -> dict[str, Outcome]:
    return outcomes(_records(log))


def compile_stats(log: Path) -> dict[str, int]:
    """tfxla-lite's process counters (`tfxla_lite.stats.CompileStats`) summed over the
    pytest processes: evidence that the flagged run compiled something."""
    total: dict[str, int] = {}
    for record in _records(log):
        for name, value in record.get("compile_stats", {}).items():
            total[name] = total.get(name, 0) + value
    return total


def enabled_in_every_session(log: Path) -> bool:
    """Whether every pytest process that finished had tfxla-lite's tf.function in place."""
    sessions = [r for r in _records(log) if r["when"] == "session"]
    return bool(sessions) and all(r["tfxla_lite_enabled"] for r in sessions)


def compare(flagged: dict[str, Outcome], plain: dict[str, Outcome]) -> list[Outcome]:
    """The tests that fail under the flag and not under plain TF, in the flagged order.

    A test failing under the flag that the plain run did not report at all counts as
    tfxla-lite's (nothing shows it fails without the flag)."""
    return [o for nodeid, o in flagged.items()
            if o.failing and not (nodeid in plain and plain[nodeid].failing)]


def rerun_targets(failures: Iterable[Outcome]) -> list[str]:
    """What to run again under plain TF: each failing test's node id (a file's, for an
    import error), each once, in order."""
    return list(dict.fromkeys(o.nodeid for o in failures))


def summary(result: SuiteResult) -> str:
    c = result.counts()
    return (f"keras suite: {c['run']} tests run under {result.flags}: {c['passed']} passed, "
            f"{c['failed']} failed, {c['skipped']} skipped; {c['failed_plain_tf']} of the "
            f"failures also fail under plain TF; {c['tfxla_lite_only']} tfxla-lite-only "
            f"failures")


def report_lines(result: SuiteResult) -> list[str]:
    lines = [f"tfxla-lite-only failures ({len(result.tfxla_lite_only)}):"]
    for o in result.tfxla_lite_only:
        lines.append(f"  {o.nodeid}  [{o.outcome}] {o.message}")
    return lines


# --- the whole run --------------------------------------------------------------------------

def run_suite(files: Sequence[str], work: Path, *, root: Path, flags: str = FLAGS,
              timeout: float = 300.0, files_per_process: int = 8,
              echo: bool = True) -> SuiteResult:
    """Runs `files` under `flags`, re-runs their failures under plain TF, compares."""
    start = time.monotonic()
    flagged = run_tests(files, flags, work, "flagged", root=root, timeout=timeout,
                        files_per_process=files_per_process, echo=echo)
    if not enabled_in_every_session(work / "flagged.jsonl"):
        raise RuntimeError(f"tfxla-lite was not enabled under TFXLA_LITE_FLAGS={flags!r} "
                           f"(see {work / 'flagged.out'})")
    failures = [o for o in flagged.values() if o.failing]
    plain: dict[str, Outcome] = {}
    if failures:
        # Node ids of one file run in one process, as the files did.
        plain = run_tests(rerun_targets(failures), None, work, "plain", root=root,
                          timeout=timeout, files_per_process=10_000, echo=echo)
    return SuiteResult(flagged, plain, compare(flagged, plain), list(files),
                       round(time.monotonic() - start, 1), flags,
                       compile_stats(work / "flagged.jsonl"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/keras_suite.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*",
                        help="folders or files of keras/src/layers, else of keras/src "
                             "(default: all of keras/src/layers)")
    parser.add_argument("--models", action="store_true",
                        help="add the folders whole models go through: "
                             + ", ".join(MODEL_FOLDERS))
    parser.add_argument("--slice", type=parse_slice, metavar="K/N",
                        help="run only the K-th of N slices of the test files")
    parser.add_argument("--flags", default=FLAGS,
                        help=f"TFXLA_LITE_FLAGS of the first run (default {FLAGS})")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a test may run (default 300)")
    parser.add_argument("--files-per-process", type=int, default=8)
    parser.add_argument("--work-dir", type=Path,
                        help="where logs go (default: a new temporary folder)")
    parser.add_argument("--json", type=Path, help="write the full result as JSON here")
    parser.add_argument("--list", action="store_true", help="list the files and stop")
    args = parser.parse_args(argv)
    root = site_packages_of_keras()
    if root is None:
        print("keras suite: keras is not installed in this interpreter", file=sys.stderr)
        return EXIT_NO_TESTS
    files = discover(root, args.names, models=args.models)
    if args.slice:
        files = slice_files(files, *args.slice)
    if args.list:
        print("\n".join(files))
        return 0
    if not files:
        print("keras suite: no test files selected", file=sys.stderr)
        return EXIT_NO_TESTS
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="keras_suite_"))
    print(f"keras suite: {len(files)} test files; logs in {work}", flush=True)
    result = run_suite(files, work.resolve(), root=root, flags=args.flags, timeout=args.timeout,
                       files_per_process=args.files_per_process)
    if not result.flagged:
        print(f"keras suite: no test reported (see {work})", file=sys.stderr)
        return EXIT_NO_TESTS
    if args.json:
        args.json.write_text(json.dumps(result.to_json(), indent=1), encoding="utf-8")
    print("\n".join(report_lines(result)))
    if result.compile_stats:
        print("tfxla-lite under the flag: " + ", ".join(
            f"{name} {value}" for name, value in result.compile_stats.items()))
    print(summary(result))
    return EXIT_TFXLA_LITE_ONLY if result.tfxla_lite_only else 0


if __name__ == "__main__":
    sys.exit(main())
