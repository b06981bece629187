"""Zero code change: unmodified scripts under TFXLA_LITE_FLAGS and `python -m tfxla_lite run`.

Each test runs scripts/ in a subprocess with and without tfxla-lite and compares what
they print; the exit summary (INFO, stderr) counts the launch ops placed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
SUMMARY = re.compile(r"tfxla-lite summary: (\d+) traces, (\d+) clusters compiled")


def _run(*runs: tuple[list[str], str | None]) -> list[subprocess.CompletedProcess]:
    """Run each (arguments, TFXLA_LITE_FLAGS or None) at once; all must succeed."""
    processes = []
    for arguments, flags in runs:
        environment = {k: v for k, v in os.environ.items() if k != "TFXLA_LITE_FLAGS"}
        environment["TF_CPP_MIN_LOG_LEVEL"] = "2"
        if flags is not None:
            environment["TFXLA_LITE_FLAGS"] = flags
        processes.append(subprocess.Popen(
            [sys.executable, *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=environment, cwd=SCRIPTS))
    results = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=240)
        result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        assert result.returncode == 0, result.stderr[-4000:]
        results.append(result)
    return results


def _assert_same_numbers(actual: str, expected: str) -> None:
    """Same printed lines; numbers within 1e-5 (compiled exp/tanh round differently)."""
    actual_lines, expected_lines = actual.splitlines(), expected.splitlines()
    assert len(actual_lines) == len(expected_lines), (actual, expected)
    for got, want in zip(actual_lines, expected_lines):
        got_words, want_words = got.split(), want.split()
        assert got_words[0] == want_words[0] and len(got_words) == len(want_words)
        for g, w in zip(got_words[1:], want_words[1:]):
            assert abs(float(g) - float(w)) <= 1e-5 * max(1.0, abs(float(w))), (got, want)


def _launch_ops(result: subprocess.CompletedProcess) -> int:
    match = SUMMARY.search(result.stderr)
    assert match, result.stderr[-4000:]
    return int(match.group(2))


def test_plain_script_under_the_flag_and_under_run() -> None:
    script = str(SCRIPTS / "variable_step.py")
    plain, hooked, ran, flags_only = _run(
        ([script], None),
        ([script], "--auto_jit=2 --min_cluster_size=1 --log_level=info"),
        (["-m", "tfxla_lite", "run", script], "--min_cluster_size=1 --log_level=info"),
        ([script], "--min_cluster_size=1 --log_level=info"))  # no auto_jit: not enabled
    assert "tfxla" not in plain.stderr.lower()
    for result in (hooked, ran):
        _assert_same_numbers(result.stdout, plain.stdout)
        assert _launch_ops(result) >= 1
    assert flags_only.stdout == plain.stdout and "tfxla-lite" not in flags_only.stderr


def _losses(result: subprocess.CompletedProcess) -> list[float]:
    return [float(line.split()[1]) for line in result.stdout.splitlines()
            if line.startswith("loss ")]


def test_keras_fit_with_jit_compile(tmp_path: Path) -> None:
    # 64 samples in batches of 20: Keras' step meets an unknown batch dimension, which
    # compiles per shape; every compute op of the step has a lowering, so
    # jit_compile=True compiles it whole, without falling back to auto-clustering.
    script, batch_size = str(SCRIPTS / "keras_fit.py"), "20"
    dumps = tmp_path / "dumps"
    plain, hooked = _run(([script, batch_size], None),
                         ([script, batch_size],
                          f"--auto_jit=2 --log_level=info --dump_to={dumps}"))
    expected, actual = _losses(plain), _losses(hooked)
    assert len(expected) == 2 and len(actual) == 2
    for want, got in zip(expected, actual):
        assert abs(got - want) <= 1e-5 * abs(want), (expected, actual)
    assert _launch_ops(hooked) >= 1
    assert "one_step_on_data" in hooked.stderr
    assert "runs with auto-clustering" not in hooked.stderr
    # The dumps and the report of the unmodified Keras script.
    assert (dumps / "report.html").stat().st_size > 1000
    assert list(dumps.glob("module_*.after_optimizations.txt"))
    assert list(dumps.glob("*one_step_on_data*.clustering.txt"))
