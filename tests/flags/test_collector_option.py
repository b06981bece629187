"""The `pause_collector` option: Python's GC off while a signature or a dynamic cluster's
shape compiles (the default), or left running (`--pause_collector=false`)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite import dynamic
from tfxla_lite.collector import collector_paused
from tfxla_lite.driver import build_program
from tfxla_lite.flags import FlagError, get_options, parse_flags, set_options
from tfxla_lite.options import Options, OptionsError
from tfxla_lite.runtime import loader


def test_default_is_on_and_the_flag_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Options().pause_collector is True
    assert get_options().pause_collector is True
    assert parse_flags("--pause_collector=false") == {"pause_collector": False}
    assert parse_flags("--pause_collector") == {"pause_collector": True}
    with pytest.raises(FlagError, match="bad value 'off' for --pause_collector"):
        parse_flags("--pause_collector=off")
    with pytest.raises(OptionsError, match="pause_collector must be a bool"):
        Options(pause_collector=0)  # type: ignore[arg-type]
    from tfxla_lite import flags

    monkeypatch.setenv(flags.ENVIRONMENT_VARIABLE, "--pause_collector=0")
    flags.PROCESS_OPTIONS.reset()
    assert get_options().pause_collector is False


def test_collector_paused_can_be_told_not_to_pause() -> None:
    assert gc.isenabled()
    with collector_paused(enabled=False):
        assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def _probe(seen: list[bool]) -> Callable[[tf.Tensor], tf.Tensor]:
    def probe(x: tf.Tensor) -> tf.Tensor:
        seen.append(gc.isenabled())  # runs while TF traces it, inside the compile
        return tf.tanh(x * 2.0 + 1.0) - x

    return probe


@pytest.mark.parametrize("pause", [True, False])
def test_signature_compile_follows_the_option(pause: bool) -> None:
    seen: list[bool] = []
    options = Options(verify=False, pause_collector=pause)
    compiled = tl.function(_probe(seen), jit_compile=True, options=options)
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    np.testing.assert_allclose(compiled(x).numpy(), np.tanh(x * 2 + 1) - x, rtol=1e-5,
                               atol=1e-6)
    assert seen == [not pause] and gc.isenabled()


def test_set_options_reaches_functions_made_afterwards() -> None:
    seen: list[bool] = []
    set_options(pause_collector=False)
    tl.function(_probe(seen), jit_compile=True)(np.ones(3, np.float32))
    assert seen == [True]


@pytest.mark.parametrize("pause", [True, False])
def test_dynamic_cluster_compile_follows_the_option(pause: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster with an unknown batch dimension compiles each new shape at run time,
    from the launch op, with the program's option."""
    seen: list[bool] = []
    original = dynamic.DynamicCluster.compile

    def recording(self: dynamic.DynamicCluster, request: object) -> object:
        seen.append(gc.isenabled())
        return original(self, request)  # type: ignore[arg-type]

    monkeypatch.setattr(dynamic.DynamicCluster, "compile", recording)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def rows(x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.exp(x * 0.5) + x, axis=1)

    options = Options(min_cluster_size=1, verify=False, pause_collector=pause)
    program = build_program(rows.get_concrete_function(), None, options, dynamic=True)
    try:
        assert [d.pause_collector for d in program.dynamic_clusters] == [pause]
        for count in (2, 5):
            x = np.arange(count * 4, dtype=np.float32).reshape(count, 4) / 10
            np.testing.assert_allclose(program.run(x).numpy(),
                                       (np.exp(x * 0.5) + x).sum(axis=1), rtol=1e-5)
    finally:
        for dynamic_cluster in program.dynamic_clusters:
            loader.unregister(dynamic_cluster.key)
    assert seen == [not pause] * 2 and gc.isenabled()
