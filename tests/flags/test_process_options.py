"""set_options / get_options and the environment, parsed once into the process's options."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite import flags
from tfxla_lite.options import OptionsError


def test_environment_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(flags.ENVIRONMENT_VARIABLE, "--min_cluster_size=2 --verify")
    options = tl.get_options()
    assert (options.min_cluster_size, options.verify) == (2, True)
    monkeypatch.setenv(flags.ENVIRONMENT_VARIABLE, "--min_cluster_size=7")
    assert tl.get_options().min_cluster_size == 2  # read at first use only


def test_bad_environment_fails_at_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(flags.ENVIRONMENT_VARIABLE, "--min_cluster_size=many")
    with pytest.raises(tl.FlagError, match="--min_cluster_size"):
        tl.get_options()


def test_set_options_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(flags.ENVIRONMENT_VARIABLE, "--min_cluster_size=2 --auto_jit=1")
    returned = tl.set_options(min_cluster_size=3, ops_to_cluster={"AddV2"})
    assert returned == tl.get_options()
    assert (returned.min_cluster_size, returned.auto_jit) == (3, 1)
    assert returned.ops_to_cluster == frozenset({"AddV2"})


@pytest.mark.parametrize(("changes", "message"), [
    ({"min_cluster_sise": 2}, "unknown option"),
    ({"auto_jit": 5}, "auto_jit must be"),
    ({"disable_passes": ("fuse", "loop-unroll")}, "unknown pass"),
])
def test_set_options_checks_like_the_parser(changes: dict, message: str) -> None:
    before = tl.get_options()
    with pytest.raises(OptionsError, match=message):
        tl.set_options(**changes)
    assert tl.get_options() == before  # nothing kept from a refused change


def test_functions_take_the_process_options_when_made() -> None:
    tl.set_options(min_cluster_size=1)
    f = tl.function(lambda x: x * 2.0)
    tl.set_options(min_cluster_size=5)
    assert f.options.min_cluster_size == 1
    assert tl.function(lambda x: x).options.min_cluster_size == 5
    own = tl.Options(min_cluster_size=9)
    assert tl.function(lambda x: x, options=own).options is own


def test_dump_flags_are_kept_quietly_until_something_compiles(caplog, tmp_path) -> None:
    # What the dumps hold is tested in tests/dumps.
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        tl.set_options(dump_to=str(tmp_path), dump_hlo_as_text=True)
        tl.set_options(dump_to=str(tmp_path / "again"))
    assert not caplog.records
    assert tl.get_options().dump_to == str(tmp_path / "again")
    assert not any(tmp_path.iterdir())


def test_disabled_passes_reach_the_compiler() -> None:
    def f(x, y):
        return tf.reduce_sum(tf.exp(x) * y + 1.0, axis=1)

    x, y = (np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8) for _ in range(2))
    expected = tf.function(f)(x, y).numpy()
    fused = tl.function(f, jit_compile=True, options=tl.Options(verify=True))
    # Every pass that forms fusions, so that none is left.
    fusion_passes = tuple(name for name in tl.Options().effective_pipeline.split(",")
                          if "fus" in name)
    assert "fuse" in fusion_passes and "multi-output-fusion" in fusion_passes
    tl.set_options(disable_passes=(*fusion_passes, "cse"), verify=True)
    unfused = tl.function(f, jit_compile=True)
    np.testing.assert_allclose(unfused(x, y).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(fused(x, y).numpy(), expected, rtol=1e-6)
    assert "fusion" in fused.experimental_get_compiler_ir(x, y)(stage="optimized_hlo")
    assert "fusion" not in unfused.experimental_get_compiler_ir(x, y)(stage="optimized_hlo")
    kernels = [c.kernel_count for c in unfused.explain(x, y).compiled_clusters]
    assert kernels and kernels[0] > fused.explain(x, y).compiled_clusters[0].kernel_count


def test_every_pass_may_be_disabled() -> None:
    def f(x):
        return tf.reduce_max(tf.tanh(x) * 2.0 + x, axis=0), x + 0.0

    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    expected = tf.function(f)(x)
    everything = tuple(tl.Options().effective_pipeline.split(","))
    g = tl.function(f, jit_compile=True,
                    options=tl.Options(disable_passes=everything, verify=True))
    for actual, reference in zip(g(x), expected):
        np.testing.assert_allclose(actual.numpy(), reference.numpy(), rtol=1e-6)


def test_clustering_debug_logs_the_report(caplog) -> None:
    f = tl.function(lambda x: tf.unique(tf.exp(x) * 2.0 + 1.0)[0],
                    options=tl.Options(clustering_debug=True, min_cluster_size=1))
    with caplog.at_level(logging.INFO, logger="tfxla_lite"):
        f(np.ones(4, np.float32))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "clustering report" in text and "Unique" in text and "has no lowering" in text
