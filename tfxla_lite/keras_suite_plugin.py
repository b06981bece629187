"""The pytest plugin that runs inside Keras's own tests for `tfxla_lite.keras_suite`.

The driver starts pytest on Keras's `*_test.py` files with `-p tfxla_lite.keras_suite_plugin`;
this plugin stands in for the top-level `conftest.py` of Keras's source tree, which the wheel
does not ship (the markers it registers and the skips it adds for the TensorFlow backend),
bounds each test's time, and appends one JSON line per test phase to the file named by
`--keras-suite-log`, flushed as it goes, so that a process that crashes or is killed still
leaves every result before the test it died in (whose `start` line has no report after it).

It imports neither TensorFlow nor the compiler: under plain TF it must change nothing, and
under `TFXLA_LITE_FLAGS` the start-up hook enables tfxla-lite when Keras imports TF.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any, TextIO

import pytest

_log: TextIO | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("keras-suite")
    group.addoption("--keras-suite-log", default=None, metavar="PATH",
                    help="append one JSON line per test phase to PATH")
    group.addoption("--keras-suite-timeout", type=float, default=0.0, metavar="SECONDS",
                    help="fail a test that runs longer than this (SIGALRM; 0: no bound)")
    group.addoption("--keras-suite-exclude", default=None, metavar="PATH",
                    help="deselect the node ids listed in PATH, one a line")


def pytest_configure(config: pytest.Config) -> None:
    global _log
    # The markers Keras's conftest registers; without them `--strict-markers` runs fail
    # and plain runs warn.
    config.addinivalue_line("markers", "requires_trainable_backend: trainable backend only")
    config.addinivalue_line("markers", "multi_device: runs with several devices only")
    path = config.getoption("--keras-suite-log")
    if path:
        _log = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed at unconfigure)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Whether tfxla-lite's tf.function was in place: a flagged run without it would
    # compare plain TF with itself. Looked up, not imported, so plain runs stay plain.
    autojit = sys.modules.get("tfxla_lite.autojit")
    stats = sys.modules.get("tfxla_lite.stats")
    _write({"when": "session", "tfxla_lite_enabled": bool(autojit and autojit.is_enabled()),
            "compile_stats": dataclasses.asdict(stats.PROCESS_STATS) if stats else {}})


def pytest_unconfigure(config: pytest.Config) -> None:
    global _log
    if _log is not None:
        _log.close()
        _log = None


def _write(record: dict[str, Any]) -> None:
    if _log is not None:
        _log.write(json.dumps(record) + "\n")
        _log.flush()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # As Keras's conftest does for the TensorFlow backend: the trainer exists, so
    # `requires_trainable_backend` skips nothing; it counts several devices only for JAX
    # and torch, so `multi_device` tests always skip under TensorFlow.
    for item in items:
        if "multi_device" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="Requires multiple devices"))
    exclude_path = config.getoption("--keras-suite-exclude")
    if not exclude_path:
        return
    excluded = set(Path(exclude_path).read_text(encoding="utf-8").split("\n")) - {""}
    dropped = [item for item in items if item.nodeid in excluded]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid not in excluded]


def first_line(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The first line of a report's error: the exception and its message as pytest's
    summary prints them, or, for a skip, its reason."""
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return str(longrepr[2]).splitlines()[0] if longrepr[2] else ""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return headline(crash.message)
    lines = str(longrepr).splitlines()
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    return errors[0] if errors else (lines[-1].strip() if lines else "")


def headline(message: str) -> str:
    """The first line of an exception's message, with, for TF's `Graph execution error:`
    (whose first line says nothing), the op's own error after the stack of the node."""
    lines = message.splitlines()
    if not lines:
        return ""
    if not lines[0].rstrip().endswith("Graph execution error:"):
        return lines[0]
    # After "Detected at node ... defined at" and its stack: the error, then "[[{{node}}]]".
    body = [line.strip() for line in lines[1:]
            if line.strip() and not line.strip().startswith(("File ", "[[", "Detected at"))]
    return f"{lines[0]} {body[-1]}" if body else lines[0]


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _write({"nodeid": nodeid, "when": "start"})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record: dict[str, Any] = {"nodeid": report.nodeid, "when": report.when,
                              "outcome": report.outcome, "duration": report.duration}
    if not report.passed:
        record["message"] = first_line(report)
    if hasattr(report, "wasxfail"):
        record["xfail"] = True
    _write(record)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed",
                "message": first_line(report)})


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException so that a test's `except Exception` around a
    slow call does not swallow it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout("the test ran past --keras-suite-timeout")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator:
    seconds = item.config.getoption("--keras-suite-timeout")
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
