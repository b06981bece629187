"""TFXLA_LITE_FLAGS: every flag, bool spellings, bad values, and the error that lists flags."""

from __future__ import annotations

import logging

import pytest

from tfxla_lite.flags import FLAGS, FlagError, parse_flags
from tfxla_lite.options import Options, OptionsError
from tfxla_lite.passes import DEFAULT_PIPELINE, PASSES


@pytest.mark.parametrize(("text", "expected"), [
    ("--auto_jit=2", {"auto_jit": 2}),
    ("--auto_jit=-1", {"auto_jit": -1}),
    ("--min_cluster_size=1", {"min_cluster_size": 1}),
    ("--max_cluster_size=12", {"max_cluster_size": 12}),
    ("--ops_to_cluster=AddV2,MatMul", {"ops_to_cluster": frozenset({"AddV2", "MatMul"})}),
    ("--clustering_debug", {"clustering_debug": True}),
    ("--dump_to=/tmp/dumps", {"dump_to": "/tmp/dumps"}),
    ("--dump_hlo_as_text=1", {"dump_hlo_as_text": True}),
    ("--disable_passes=fuse,cse", {"disable_passes": ("fuse", "cse")}),
    ("--verify=true", {"verify": True}),
    ("--strict_jit_compile=false", {"strict_jit_compile": False}),
    ("--log_level=INFO", {"log_level": "info"}),
    ("--pause_collector=false", {"pause_collector": False}),
    ("", {}),
    ("  --verify   --auto_jit=1 ", {"verify": True, "auto_jit": 1}),
    ("--auto_jit=1 --auto_jit=2", {"auto_jit": 2}),  # the last one wins
])
def test_each_flag(text: str, expected: dict) -> None:
    assert parse_flags(text) == expected
    Options(**expected)  # and the options accept it


@pytest.mark.parametrize(("spelling", "value"), [
    ("--verify", True), ("--verify=true", True), ("--verify=True", True), ("--verify=1", True),
    ("--verify=false", False), ("--verify=0", False),
])
def test_bool_spellings(spelling: str, value: bool) -> None:
    assert parse_flags(spelling) == {"verify": value}


@pytest.mark.parametrize(("text", "message"), [
    ("--bogus=1", "unknown flag --bogus"),
    ("--tf_xla_auto_jit=2", "unknown flag --tf_xla_auto_jit"),
    ("auto_jit=2", "is not a flag"),
    ("--auto_jit", "--auto_jit needs a value"),
    ("--auto_jit=two", "bad value 'two' for --auto_jit"),
    ("--auto_jit=3", "auto_jit must be -1, 0, 1 or 2"),
    ("--min_cluster_size=0", "min_cluster_size must be at least 1"),
    ("--min_cluster_size=4 --max_cluster_size=2", "smaller than min_cluster_size"),
    ("--verify=yes", "bad value 'yes' for --verify"),
    ("--ops_to_cluster=", "bad value '' for --ops_to_cluster"),
    ("--ops_to_cluster=Add-V2", "ops_to_cluster must be a set of TF op type names"),
    ("--disable_passes=fuse,nope", "unknown pass(es) nope"),
    ("--log_level=loud", "log_level must be one of"),
    ("--dump_to=", "bad value '' for --dump_to"),
    ("--verify='unclosed", "cannot split"),
])
def test_bad_flags_name_the_problem_and_list_every_flag(text: str, message: str) -> None:
    with pytest.raises(FlagError) as info:
        parse_flags(text)
    assert isinstance(info.value, ValueError)
    assert message in str(info.value)
    for name in FLAGS:
        assert f"--{name}" in str(info.value)


def test_unknown_pass_error_lists_the_passes() -> None:
    with pytest.raises(FlagError) as info:
        parse_flags("--disable_passes=fusion")
    for name in PASSES:
        assert name in str(info.value)


def test_disable_passes_takes_names_out_of_the_pipeline() -> None:
    options = Options(**parse_flags("--disable_passes=fuse,cse"))
    remaining = options.effective_pipeline.split(",")
    assert "fuse" not in remaining and "cse" not in remaining
    assert [n for n in DEFAULT_PIPELINE.split(",") if n not in ("fuse", "cse")] == remaining
    assert Options(disable_passes=tuple(PASSES)).effective_pipeline == ","  # no passes
    assert Options().effective_pipeline == DEFAULT_PIPELINE


def test_options_check_values_given_in_python() -> None:
    with pytest.raises(OptionsError, match="unknown option"):
        Options().with_changes(min_cluster=3)
    with pytest.raises(OptionsError, match="must be an integer"):
        Options(min_cluster_size=True)
    with pytest.raises(OptionsError, match="must be a bool"):
        Options(verify="yes")  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="got a string"):
        Options(disable_passes="fuse")  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="unknown pass"):
        Options(pipeline="dce,nope")


def test_clustering_debug_logs_at_info() -> None:
    assert Options().logging_level is None
    assert Options(clustering_debug=True).logging_level == logging.INFO
    assert Options(log_level="debug", clustering_debug=True).logging_level == logging.DEBUG
    assert Options(log_level="error").logging_level == logging.ERROR
