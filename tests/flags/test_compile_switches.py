"""The compile switches as options (`cache`, `tiered_llvm`, `overlap_llvm`): flags, checks,
and each one reaching codegen over its environment variable (`flags.SWITCH_VARIABLES`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite import driver, flags
from tfxla_lite.codegen import cache
from tfxla_lite.flags import SWITCH_VARIABLES, FlagError, parse_flags
from tfxla_lite.options import Options, OptionsError


@pytest.mark.parametrize(("text", "expected"), [
    ("--cache=memory", {"cache": "memory"}),
    ("--cache=OFF", {"cache": "off"}),
    ("--tiered_llvm=false", {"tiered_llvm": False}),
    ("--overlap_llvm", {"overlap_llvm": True}),
])
def test_each_switch_flag(text: str, expected: dict) -> None:
    assert parse_flags(text) == expected
    Options(**expected)


@pytest.mark.parametrize(("text", "message"), [
    ("--cache=disk", "cache must be one of on, memory, off"),
    ("--cache", "--cache needs a value"),
    ("--tiered_llvm=maybe", "bad value 'maybe' for --tiered_llvm"),
])
def test_bad_switch_flags(text: str, message: str) -> None:
    with pytest.raises(FlagError, match=message):
        parse_flags(text)


def test_options_check_the_switches() -> None:
    with pytest.raises(OptionsError, match="tiered_llvm must be a bool or None"):
        Options(tiered_llvm=1)  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="cache must be one of"):
        Options(cache=True)  # type: ignore[arg-type]
    assert (Options().cache, Options().tiered_llvm, Options().overlap_llvm) == (None,) * 3


def test_an_option_decides_over_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH_VARIABLES["tiered_llvm"], "0")
    monkeypatch.setenv(SWITCH_VARIABLES["overlap_llvm"], "1")
    assert not flags.switch("tiered_llvm", Options())
    assert flags.switch("overlap_llvm", Options())
    assert flags.switch("tiered_llvm", Options(tiered_llvm=True))
    assert not flags.switch("overlap_llvm", Options(overlap_llvm=False))
    monkeypatch.delenv(SWITCH_VARIABLES["tiered_llvm"])
    monkeypatch.delenv(SWITCH_VARIABLES["overlap_llvm"])
    assert flags.switch("tiered_llvm", Options()) and not flags.switch("overlap_llvm", Options())


def _step(x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.tanh(x) * x + 1.0, axis=1)


X = np.linspace(-2.0, 2.0, 96, dtype=np.float32).reshape(12, 8)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "ops" not in p.parts)


@pytest.mark.parametrize(("environment", "option", "writes"), [
    ("1", "off", False), ("1", "memory", False), ("0", "on", True), ("0", None, False),
])
def test_the_cache_option_reaches_every_cache(cache_root: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              environment: str, option: str | None,
                                              writes: bool) -> None:
    monkeypatch.setenv(SWITCH_VARIABLES["cache"], environment)
    lite = tl.function(_step, options=Options(min_cluster_size=1, cache=option))
    np.testing.assert_allclose(lite(tf.constant(X)).numpy(), _step(tf.constant(X)).numpy(),
                               rtol=1e-5, atol=1e-6)
    tl.wait_for_compiles()
    folders = {p.relative_to(cache_root).parts[0] for p in _files(cache_root)}
    assert bool(folders) == writes
    if writes:
        assert {"kernels", "optimized", "rewrites"} <= folders, folders


@pytest.mark.parametrize("tiered", [True, False])
def test_the_llvm_options_reach_compile_module(cache_root: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               tiered: bool) -> None:
    monkeypatch.setenv(SWITCH_VARIABLES["tiered_llvm"], "0" if tiered else "1")
    monkeypatch.setenv(SWITCH_VARIABLES["overlap_llvm"], "1")
    calls: list[dict[str, Any]] = []
    original = driver.compile_module

    def recording(module: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(module, **kwargs)

    monkeypatch.setattr(driver, "compile_module", recording)
    options = Options(min_cluster_size=1, cache="off", tiered_llvm=tiered, overlap_llvm=False)
    tl.function(_step, options=options)(tf.constant(X))
    tl.wait_for_compiles()
    assert calls and all(c["tiered"] is tiered and c["background"] is False
                         and c["cache"] == "off" for c in calls)
    assert cache.policy(calls[0]["cache"]) == cache.CachePolicy(False, False)
