"""`--check_numerics`: each launch against its cluster's TF ops (tfxla_lite/numerics_check.py).

A planted wrong lowering (Tanh lowered as something else) must be reported with its
cluster, its op and the worst difference; correct programs, and NaN that TF makes too,
must not be flagged; "off" must leave the graph as it was.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from api_helpers import keras_adam_step

import tfxla_lite as tl
from tfxla_lite import numerics_check
from tfxla_lite.clustering import registry
from tfxla_lite.flags import parse_flags
from tfxla_lite.options import Options, OptionsError
from tfxla_lite.rewrite import LAUNCH_OP_TYPES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerances import assert_close  # noqa: E402 - tests/tolerances.py, by path

# The caches off: a planted lowering must compile, not be found compiled.
CHECK = Options(check_numerics="compare", cache="off", verify=True)


@pytest.fixture(autouse=True)
def _fresh_report() -> Iterator[None]:
    numerics_check.reset_numerics_report()
    with numerics_check._lock:  # noqa: SLF001 - each test reads only its own clusters
        numerics_check._clusters.clear()  # noqa: SLF001
    yield


@pytest.fixture
def wrong_tanh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tanh lowered as log(1 + x): NaN below -1 (where tanh is finite), wrong elsewhere."""
    rule = registry.OP_RULES["Tanh"]

    def lower(ctx: registry.LoweringContext, op: tf.Operation, operands: list
              ) -> list:
        return [ctx.emit("log-plus-one", [operands[0]])]

    monkeypatch.setitem(registry.OP_RULES, "Tanh", dataclasses.replace(rule, lower=lower))


def _values() -> tuple[tf.Tensor, tf.Tensor]:
    x = tf.constant(np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6))
    return x, tf.ones([4, 6])


def _program(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    t = tf.tanh(x * 0.5)
    return t * y, tf.reduce_sum(tf.exp(t) + y, axis=1)


def _launch_graph(f: tl.Function, *args: tf.Tensor) -> tf.Graph:
    return f.get_concrete_function(*args).graph


def test_correct_program_within_tolerance(caplog: pytest.LogCaptureFixture) -> None:
    f = tl.function(_program, jit_compile=True, options=CHECK)
    x, y = _values()
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        results = f(x, y)
        f(x * 2.0, y)
    for got, want in zip(results, tf.function(_program)(x, y)):
        assert_close(got.numpy(), want.numpy(), op_type="Exp")
    report = tl.numerics_report()
    (cluster,) = report.clusters.values()
    assert cluster.calls == 2
    assert [o.calls for o in cluster.outputs] == [2, 2]
    assert not report.problems, str(report)
    assert all(o.max_abs < 1e-5 and o.max_ulp is not None and o.max_ulp <= 64
               for o in cluster.outputs), str(report)
    assert "Tanh" in dict(cluster.ops).values()
    assert not [r for r in caplog.records if "numerics check" in r.getMessage()]


def test_planted_wrong_lowering_is_reported(wrong_tanh: None,
                                            caplog: pytest.LogCaptureFixture) -> None:
    def program(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        t = tf.tanh(x * 2.0)
        return t, tf.exp(t) * 3.0

    x = tf.constant(np.linspace(-3, 3, 25, dtype=np.float32))
    f = tl.function(program, jit_compile=True, options=CHECK)
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        got = f(x)[0].numpy()
    assert np.isnan(got).any()  # the planted bug is live: the check has something to find
    report = tl.numerics_report()
    (name, cluster) = next(iter(report.clusters.items()))
    assert "/tfxla_lite_launch_" in name and name == cluster.launch
    tanh = next(n for n, t in cluster.ops if t == "Tanh")
    first, second = cluster.outputs
    assert first.op == tanh
    # log1p(2x) against tanh(2x) at x = 3: log(7) - tanh(6), the worst finite difference.
    expected = np.log1p(np.float32(6.0)) - np.tanh(6.0)
    assert first.max_abs == pytest.approx(expected, rel=1e-5)
    assert first.nonfinite_only_compiled == int((2 * x.numpy() <= -1).sum())
    assert first.out_of_tolerance > 0 and second.nonfinite_only_compiled > 0
    assert cluster.first_nonfinite_op == tanh
    assert tanh in cluster.describe_first_nonfinite()
    assert not any(cluster.tf_nonfinite.values())  # TF stayed finite throughout
    warnings = [r.getMessage() for r in caplog.records if "numerics check" in r.getMessage()]
    assert any(name in w and "NaN/Inf in compiled code only" in w for w in warnings)
    assert tanh in str(report) and "OUT OF TOLERANCE" in str(report)

    tl.reset_numerics_report()
    (fresh,) = tl.numerics_report().clusters.values()
    assert fresh.calls == 0 and fresh.first_nonfinite_op is None
    assert all(o.within_tolerance and o.max_abs == 0 for o in fresh.outputs)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        f(x)
    assert tl.numerics_report().clusters[name].first_nonfinite_op == tanh
    assert any("NaN/Inf in compiled code only" in r.getMessage() for r in caplog.records)


def test_one_op_clusters_name_the_wrong_op(wrong_tanh: None) -> None:
    """docs/numerics_check.md's way to narrow a bad cluster down: one op per cluster."""
    def program(x: tf.Tensor) -> tf.Tensor:
        return tf.exp(tf.tanh(x * 2.0)) * 3.0

    options = CHECK.with_changes(min_cluster_size=1, max_cluster_size=1)
    tl.function(program, jit_compile=True, options=options)(tf.constant([-2.0, 0.5, 3.0]))
    report = tl.numerics_report()
    assert len(report.clusters) >= 3, str(report)
    # Each cluster is checked on its launch's own inputs: the NaN the wrong Tanh hands on
    # is TF's NaN too downstream, so only Tanh's cluster is flagged.
    flagged = [dict(c.ops)[c.first_nonfinite_op] for c in report.clusters.values()
               if c.first_nonfinite_op]
    assert flagged == ["Tanh"], str(report)
    assert len(report.problems) == 1, str(report)


def test_variable_writes_are_compared_once_written() -> None:
    v = tf.Variable(tf.ones([3]))

    def step(x: tf.Tensor) -> tf.Tensor:
        a = tf.tanh(v.read_value() * x)
        v.assign_add(a)
        v.assign_sub(a * 0.5)
        return v.read_value() * 3.0

    f = tl.function(step, jit_compile=True, options=CHECK)
    x = tf.constant([0.5, -1.0, 2.0])
    got = f(x).numpy()
    expected = 1.0 + 0.5 * np.tanh(x.numpy())
    assert_close(v.numpy(), expected.astype(np.float32), op_type="Tanh")  # written once
    assert_close(got, 3.0 * v.numpy(), op_type="Mul")
    report = tl.numerics_report()
    assert not report.unchecked and not report.problems, str(report)
    (cluster,) = report.clusters.values()
    written = [o for o in cluster.outputs if "as written" in o.tensor]
    assert [dict(cluster.ops)[o.op] for o in written] == ["AssignSubVariableOp"]


def test_keras_adam_step_is_checked_whole() -> None:
    _, step = keras_adam_step(6, 8, "tanh", 2)
    f = tl.function(step, jit_compile=True, options=CHECK)
    rng = np.random.default_rng(2)
    x = tf.constant(rng.standard_normal((8, 6)), tf.float32)
    y = tf.constant(rng.standard_normal((8, 2)), tf.float32)
    losses = [float(f(x, y)) for _ in range(3)]
    assert losses[2] < losses[0]
    report = tl.numerics_report()
    assert not report.unchecked and not report.problems, str(report)
    written = [o for c in report.clusters.values() for o in c.outputs
               if "as written" in o.tensor]
    # The 4 weights, Adam's 2 moments of each, and its iteration counter.
    assert len(written) >= 4 * 3 + 1 and all(o.calls == 3 for o in written), str(report)


def test_wrong_variable_update_is_reported(wrong_tanh: None) -> None:
    v = tf.Variable(tf.zeros([4]))

    def step(x: tf.Tensor) -> tf.Tensor:
        v.assign_add(tf.tanh(x))
        return tf.reduce_sum(x)

    tl.function(step, jit_compile=True, options=CHECK)(tf.constant([-2.0, -0.5, 0.5, 2.0]))
    report = tl.numerics_report()
    ((cluster, written),) = [(c, o) for c in report.clusters.values() for o in c.outputs
                             if "as written" in o.tensor]
    assert report.problems == [(cluster, written)], str(report)
    # log1p against tanh at -2 (NaN), -0.5, 0.5 and 2; the worst at -0.5.
    assert written.nonfinite_only_compiled == 1 and written.out_of_tolerance == 3
    assert written.max_abs == pytest.approx(np.tanh(-0.5) - np.log1p(-0.5), rel=1e-5)
    assert cluster.first_nonfinite_op == written.op


def test_scatter_into_a_variable_is_listed_as_unchecked() -> None:
    v = tf.Variable(tf.zeros([5]))

    def step(x: tf.Tensor) -> tf.Tensor:
        v.scatter_add(tf.IndexedSlices(x * 2.0, tf.constant([0, 3])))
        return tf.reduce_sum(x * 3.0)

    tl.function(step, jit_compile=True, options=CHECK)(tf.constant([1.0, 2.0]))
    assert v.numpy().tolist() == [2.0, 0.0, 0.0, 4.0, 0.0]
    report = tl.numerics_report()
    assert any("ResourceScatterAdd" in why for why in report.unchecked.values()), str(report)
    assert "not checked" in str(report)


def test_raise_mode_fails_the_call(wrong_tanh: None) -> None:
    f = tl.function(lambda x: tf.tanh(x) + 1.0, jit_compile=True,
                    options=CHECK.with_changes(check_numerics="raise"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="compiled NaN/Inf"):
        f(tf.constant([-2.0, 0.5, 3.0]))


def test_nan_that_tf_makes_too_is_not_flagged() -> None:
    def program(x: tf.Tensor) -> tf.Tensor:
        return tf.sqrt(x) * 2.0 + tf.math.log(x)

    f = tl.function(program, jit_compile=True, options=CHECK)
    x = tf.constant([-1.0, 0.0, 4.0, np.nan, np.inf, -np.inf])
    assert_close(f(x).numpy(), tf.function(program)(x).numpy(), op_type="Log")
    report = tl.numerics_report()
    assert not report.problems, str(report)
    (cluster,) = report.clusters.values()
    assert cluster.outputs[0].nonfinite_only_compiled == 0
    assert any(cluster.tf_nonfinite.values())  # TF's own NaN/Inf, seen inside the cluster


def test_auto_clustering_and_dtypes() -> None:
    def program(a: tf.Tensor, b: tf.Tensor, n: tf.Tensor) -> tuple[tf.Tensor, ...]:
        h = tf.nn.relu(a * b + 1.0)
        s = tf.sigmoid(h) - tf.tanh(b)
        k = (n * 3 + 1) // 2
        return s, tf.cast(h, tf.bfloat16) * 2.0, k - n

    options = CHECK.with_changes(min_cluster_size=2)
    f = tl.function(program, options=options)  # auto-clustering, not must-compile
    rng = np.random.default_rng(0)
    a = tf.constant(rng.standard_normal((5, 7)), tf.float32)
    b = tf.constant(rng.standard_normal((5, 7)), tf.float32)
    n = tf.constant(rng.integers(-9, 9, (5, 7)), tf.int32)
    f(a, b, n)
    report = tl.numerics_report()
    assert report.clusters, str(report)
    assert not report.problems, str(report)
    dtypes = {o.dtype for c in report.clusters.values() for o in c.outputs}
    assert "float32" in dtypes
    for cluster in report.clusters.values():
        for output in cluster.outputs:
            assert (output.max_ulp is None) == (output.dtype not in (
                "float16", "bfloat16", "float32", "float64"))


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float64])
def test_narrow_and_wide_floats_within_tolerance(dtype: tf.DType) -> None:
    def program(x: tf.Tensor) -> tf.Tensor:
        return tf.sigmoid(x) * tf.tanh(x) + tf.exp(x * 0.25) - 1.0

    x = tf.cast(tf.constant(np.append(np.linspace(-6, 6, 61), [0.0, -0.0])), dtype)
    f = tl.function(program, jit_compile=True, options=CHECK)
    f(x)
    report = tl.numerics_report()
    assert not report.problems, str(report)
    (cluster,) = report.clusters.values()
    assert cluster.outputs[0].dtype == dtype.name and cluster.outputs[0].max_ulp is not None


def test_zero_sized_output() -> None:
    f = tl.function(lambda x: tf.tanh(x) * 2.0 + 1.0, jit_compile=True, options=CHECK)
    f(tf.zeros([0, 3]))
    (cluster,) = tl.numerics_report().clusters.values()
    assert cluster.calls == 1 and cluster.outputs[0].elements == 0
    assert cluster.outputs[0].within_tolerance


def test_off_by_default_adds_nothing() -> None:
    assert Options().check_numerics == "off"
    options = CHECK.with_changes(check_numerics="off")
    f = tl.function(_program, jit_compile=True, options=options)
    g = tl.function(_program, jit_compile=True, options=CHECK)
    x, y = _values()
    off = [op.type for op in _launch_graph(f, x, y).get_operations()]
    assert not tl.numerics_report().clusters
    on = [op.type for op in _launch_graph(g, x, y).get_operations()]
    assert "EagerPyFunc" not in off and "EagerPyFunc" in on
    assert sum(t in LAUNCH_OP_TYPES for t in off) == sum(t in LAUNCH_OP_TYPES for t in on) == 1
    assert len(on) > len(off)
    rewritten = tf.compat.v1.GraphDef()
    assert numerics_check.instrument(rewritten, "off") is rewritten


def test_flag_and_bad_values() -> None:
    assert parse_flags("--check_numerics=compare") == {"check_numerics": "compare"}
    with pytest.raises(OptionsError, match="check_numerics"):
        Options(check_numerics="loud")
    with pytest.raises(ValueError, match="check_numerics"):
        numerics_check.instrument(tf.compat.v1.GraphDef(), "loud")
