"""The `parallel_runtime` option and its `--parallel_runtime` flag: accepted values, case,
and a clear error for anything else (the op library side: tests/runtime)."""

from __future__ import annotations

import pytest

from tfxla_lite import flags
from tfxla_lite.options import PARALLEL_RUNTIMES, Options, OptionsError


def test_default_is_a_known_runtime() -> None:
    assert Options().parallel_runtime in PARALLEL_RUNTIMES == ("tf", "openmp", "serial", "tf_team")


@pytest.mark.parametrize("text,expected", [("tf", "tf"), ("OpenMP", "openmp"),
                                           ("serial", "serial"), ("TF_Team", "tf_team")])
def test_flag_values(text: str, expected: str) -> None:
    assert flags.parse_flags(f"--parallel_runtime={text}") == {"parallel_runtime": expected}


@pytest.mark.parametrize("text,message", [
    ("--parallel_runtime=gomp",
     "parallel_runtime must be one of tf, openmp, serial, tf_team, got 'gomp'"),
    ("--parallel_runtime", "--parallel_runtime needs a value"),
    ("--parallel_runtime=", "bad value '' for --parallel_runtime"),
])
def test_bad_flags_say_what_is_allowed(text: str, message: str) -> None:
    with pytest.raises(flags.FlagError, match=message) as raised:
        flags.parse_flags(text)
    assert "--parallel_runtime=RUNTIME" in str(raised.value)  # the flag list follows


@pytest.mark.parametrize("value", ["pool", 1, None, "TF"])
def test_options_refuse_other_values(value: object) -> None:
    with pytest.raises(OptionsError, match="parallel_runtime must be one of"):
        Options(parallel_runtime=value)  # type: ignore[arg-type]


def test_set_options_checks_before_keeping() -> None:
    with pytest.raises(OptionsError, match="parallel_runtime"):
        flags.set_options(parallel_runtime="threads")
    assert flags.get_options().parallel_runtime == Options().parallel_runtime
