"""AutoGraph's conversions on disk (tfxla_lite/autograph_cache.py): a hit traces the graph
a fresh conversion traces, keeps the user's source lines in errors, and bad or foreign
entries are never trusted."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.autograph.impl import api as ag_api
from tensorflow.python.autograph.lang import directives as ag_directives
from tensorflow.python.autograph.pyct import cache as pyct_cache

import tfxla_lite as tl
from tfxla_lite import autograph_cache
from tfxla_lite.codegen import cache

X = np.linspace(-1.5, 2.5, 24, dtype=np.float32).reshape(4, 6)  # sum clearly > 0


def loop_and_branch(x):
    # Python control flow on tensors: AutoGraph turns these into tf.while_loop / tf.cond.
    total = tf.zeros_like(x)
    i = tf.constant(0)
    while i < 3:
        total += tf.tanh(x) * tf.cast(i + 1, tf.float32)
        i += 1
    if tf.reduce_sum(x) > 0.0:
        total = total * 2.0
    else:
        total = total - 1.0
    return tf.nn.relu(total) + x


def fails_on_line(x):
    y = x * 2.0
    return tf.reshape(y, [7])  # the line the error names


def with_directive(x):
    for i in tf.range(3):
        tf.autograph.experimental.set_loop_options(maximum_iterations=3)
        x = x + tf.cast(i, tf.float32)
    return x


loop_options = tf.autograph.experimental.set_loop_options  # an alias: read by value


def with_aliased_directive(x):
    for i in tf.range(3):
        loop_options(maximum_iterations=2)
        x = x + tf.cast(i, tf.float32)
    return x


def with_element_type(x):
    values = []
    ag_directives.set_element_type(values, tf.float32)
    for i in tf.range(3):
        values.append(tf.cast(i, tf.float32))
    return x + 1.0


def options_of(option):  # the same code object under a directive or a plain function
    def loop_with(x):
        assert option is not None  # a second use keeps `option` a free variable
        for i in tf.range(3):
            option(maximum_iterations=2)
            x = x + tf.cast(i, tf.float32)
        return x
    return loop_with


def no_options(**_):
    pass


@pytest.fixture
def fresh_conversions(monkeypatch: pytest.MonkeyPatch) -> None:
    """TF's in-process conversions forgotten, as in a new process (restored after)."""
    _forget(monkeypatch)


def _delta(before: cache.CacheStats) -> dict[str, int]:
    after = cache.stats()
    return {name: getattr(after, name) - getattr(before, name)
            for name in ("autograph_hits", "autograph_misses", "autograph_writes",
                         "autograph_rejected")}


def _entries(root: Path) -> list[Path]:
    return sorted((root / "autograph").glob("*" + autograph_cache.STAGE.suffix))


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget TF's in-process conversions now (again, within a test); restored after."""
    monkeypatch.setattr(ag_api._TRANSPILER, "_cache", pyct_cache.CodeObjectCache())


def _ops(function: tl.Function, *args) -> list:
    """The op types of the traced graph and of each function it calls (TF numbers the
    functions' names per process, so names are left out)."""
    graph = function.get_concrete_function(*args).graph.as_graph_def()
    bodies = sorted(tuple(sorted(n.op for n in f.node_def)) for f in graph.library.function)
    return [sorted(n.op for n in graph.node), bodies]


def test_a_hit_traces_the_graph_a_fresh_conversion_traces(
        cache_root: Path, fresh_conversions: None, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = tf.function(loop_and_branch)(tf.constant(X)).numpy()
    _forget(monkeypatch)
    before = cache.stats()
    cold = tl.function(loop_and_branch, min_cluster_size=1)
    cold_value = cold(tf.constant(X)).numpy()
    assert _delta(before) == {"autograph_hits": 0, "autograph_misses": 1,
                              "autograph_writes": 1, "autograph_rejected": 0}
    assert len(_entries(cache_root)) == 1

    _forget(monkeypatch)
    cache.clear_memory()
    before = cache.stats()
    warm = tl.function(loop_and_branch, min_cluster_size=1)
    warm_value = warm(tf.constant(X)).numpy()
    assert _delta(before) == {"autograph_hits": 1, "autograph_misses": 0,
                              "autograph_writes": 0, "autograph_rejected": 0}
    np.testing.assert_array_equal(warm_value, cold_value)
    np.testing.assert_allclose(warm_value, expected, rtol=2e-6, atol=2e-6)
    assert _ops(warm, tf.constant(X)) == _ops(cold, tf.constant(X))
    assert warm.get_concrete_function(tf.constant(X)).graph.as_graph_def().library.function, \
        "AutoGraph's while/cond bodies are in the trace"


def test_errors_name_the_users_line_on_a_hit(
        cache_root: Path, fresh_conversions: None, monkeypatch: pytest.MonkeyPatch) -> None:
    line = fails_on_line.__code__.co_firstlineno + 2
    for attempt in ("cold", "warm"):
        _forget(monkeypatch)
        before = cache.stats()
        with pytest.raises(Exception) as error:
            tl.function(fails_on_line, min_cluster_size=1)(tf.constant(X))
        assert _delta(before)["autograph_hits"] == (attempt == "warm")
        text = str(error.value)
        assert f"{Path(__file__).name}\", line {line}, in fails_on_line" in text, (attempt, text)
        assert "return tf.reshape(y, [7])" in text


def test_a_corrupt_entry_is_rejected_and_written_again(
        cache_root: Path, fresh_conversions: None, monkeypatch: pytest.MonkeyPatch) -> None:
    tl.function(loop_and_branch, min_cluster_size=1)(tf.constant(X))
    (entry,) = _entries(cache_root)
    data = bytearray(entry.read_bytes())
    data[-5] ^= 0x40
    entry.write_bytes(bytes(data))
    _forget(monkeypatch)
    before = cache.stats()
    value = tl.function(loop_and_branch, min_cluster_size=1)(tf.constant(X)).numpy()
    assert _delta(before) == {"autograph_hits": 0, "autograph_misses": 0,
                              "autograph_writes": 1, "autograph_rejected": 1}
    np.testing.assert_allclose(value, tf.function(loop_and_branch)(tf.constant(X)).numpy(),
                               rtol=2e-6, atol=2e-6)
    assert entry.read_bytes() != bytes(data)


def test_an_entry_of_another_tensorflow_is_not_trusted(
        cache_root: Path, fresh_conversions: None, monkeypatch: pytest.MonkeyPatch) -> None:
    tl.function(loop_and_branch, min_cluster_size=1)(tf.constant(X))
    (entry,) = _entries(cache_root)
    key = json.loads(entry.read_bytes().split(b"\n", 1)[0])["key"]
    assert autograph_cache.STAGE.path(key) == entry
    foreign = {**autograph_cache.environment(), "tensorflow": "0.0.1"}
    stage = dataclasses.replace(autograph_cache.STAGE, environment=lambda: foreign)
    monkeypatch.setattr(autograph_cache, "STAGE", stage)
    assert stage.path(key) != entry, "the environment is in the path"
    # The same file found under another TF (a copied folder): its header must not pass.
    stage.path(key).write_bytes(entry.read_bytes())
    _forget(monkeypatch)
    before = cache.stats()
    tl.function(loop_and_branch, min_cluster_size=1)(tf.constant(X))
    assert _delta(before)["autograph_rejected"] == 1


def test_the_key_follows_source_namespace_and_options() -> None:
    options = ag_api.converter.ConversionOptions(recursive=True, user_requested=True)
    key = autograph_cache.conversion_key(loop_and_branch, options)
    assert autograph_cache.conversion_key(loop_and_branch, options) == key
    other = ag_api.converter.ConversionOptions(recursive=False, user_requested=True)
    assert autograph_cache.conversion_key(loop_and_branch, other) != key

    # The same code under globals with one more name, one AutoGraph's namer would pick.
    crowded = types.FunctionType(loop_and_branch.__code__, {**globals(), "do_return": 1})
    assert autograph_cache.conversion_key(crowded, options) != key


def test_directives_lambdas_and_methods_are_left_to_tensorflow(
        cache_root: Path, fresh_conversions: None) -> None:
    options = ag_api.converter.ConversionOptions(recursive=True, user_requested=True)
    with pytest.raises(TypeError, match="directive"):
        autograph_cache.conversion_key(with_directive, options)
    before = cache.stats()
    value = tl.function(with_directive, min_cluster_size=1)(tf.constant(X)).numpy()
    np.testing.assert_allclose(value, X + 3.0, rtol=1e-6)
    tl.function(lambda x: tf.nn.relu(x) * 3.0, min_cluster_size=1)(tf.constant(X))
    assert _delta(before) == {"autograph_hits": 0, "autograph_misses": 0,
                              "autograph_writes": 0, "autograph_rejected": 0}
    assert not _entries(cache_root)


@pytest.mark.parametrize("fn", [with_element_type, with_aliased_directive,
                                options_of(tf.autograph.experimental.set_loop_options)],
                         ids=["set_element_type", "global alias", "closure alias"])
def test_every_directive_is_left_to_tensorflow(fn) -> None:
    # AutoGraph's directives converter resolves a name by its value (a global or a
    # closure cell): `set_element_type` is one, and an alias of one is one.
    options = ag_api.converter.ConversionOptions(recursive=True, user_requested=True)
    with pytest.raises(TypeError, match="directive"):
        autograph_cache.conversion_key(fn, options)
    plain = options_of(no_options)
    assert autograph_cache.conversion_key(plain, options), "a plain closure is cached"


def test_a_directive_behind_a_name_never_reaches_a_plain_function(
        cache_root: Path, fresh_conversions: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # One code object, two closures: `option` is set_loop_options (AutoGraph drops the
    # call and stops the loop after 2 iterations: x + 1) or a plain function (3
    # iterations: x + 3). A conversion stored for one must not serve the other in a
    # later process (here: TF's in-process conversions forgotten), either way round.
    directive = options_of(tf.autograph.experimental.set_loop_options)
    plain = options_of(no_options)
    expected = {}
    for name, fn in (("directive", directive), ("plain", plain)):
        _forget(monkeypatch)
        expected[name] = tf.function(fn)(tf.constant(X)).numpy()
    np.testing.assert_allclose(expected["directive"], X + 1.0, rtol=1e-6)
    np.testing.assert_allclose(expected["plain"], X + 3.0, rtol=1e-6)
    for order in (("directive", "plain"), ("plain", "directive")):
        for name in order:
            _forget(monkeypatch)
            fn = directive if name == "directive" else plain
            value = tl.function(fn, min_cluster_size=1)(tf.constant(X)).numpy()
            np.testing.assert_allclose(value, expected[name], rtol=1e-6, err_msg=str(order))


@pytest.mark.parametrize("variable, value", [("TFXLA_LITE_CACHE", "memory"),
                                             ("TFXLA_LITE_AUTOGRAPH_CACHE", "0")])
def test_switched_off_it_writes_nothing(
        cache_root: Path, fresh_conversions: None, monkeypatch: pytest.MonkeyPatch,
        variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    tl.function(loop_and_branch, min_cluster_size=1)(tf.constant(X))
    assert not _entries(cache_root)


def test_plain_tf_function_outside_tfxla_lite_is_untouched(
        cache_root: Path, fresh_conversions: None) -> None:
    tl.function(lambda x: x * 2.0)(tf.constant(X))  # installs the hook
    before = cache.stats()
    tf.function(loop_and_branch)(tf.constant(X))
    assert _delta(before)["autograph_misses"] == 0
    assert not _entries(cache_root)


_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf
import tfxla_lite as tl
from tfxla_lite.codegen import cache

def step(x, w):
    h = x
    for _ in tf.range(2):
        h = tf.tanh(tf.matmul(h, w))
    if tf.reduce_max(h) > 0.5:
        h = h * 0.5
    return h

x = tf.constant(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8))
value = tl.function(step, min_cluster_size=1)(x, x)
print("RESULT", cache.stats().autograph_hits, cache.stats().autograph_writes,
      np.asarray(value).tobytes().hex())
"""


def test_a_second_process_converts_nothing(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "TFXLA_LITE_CACHE_DIR": str(tmp_path / "cache"),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TFXLA_LITE_CACHE", None)
    results = []
    for _ in range(2):
        run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                             text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
        (line,) = [x for x in run.stdout.splitlines() if x.startswith("RESULT")]
        results.append(line.split())
    assert results[0][1:3] == ["0", "1"], results[0]
    assert results[1][1:3] == ["1", "0"], results[1]
    assert results[0][3] == results[1][3], "the same bits from a cached conversion"


def test_the_source_read_is_autographs() -> None:
    import functools

    from tensorflow.python.autograph.pyct import inspect_utils

    def outer(scale):
        @functools.wraps(loop_and_branch)
        def inner(x):
            return x * scale  # a closure, renamed by functools.wraps
        return inner

    for fn in (loop_and_branch, fails_on_line, with_directive, outer(2.0)):
        assert autograph_cache._source(fn) == inspect_utils.getimmediatesource(fn), fn


def test_the_source_is_found_without_a_scan_of_every_module(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a code object, `inspect.getmodule` resolves the real path of every loaded
    module's file (hundreds of ms with TF loaded); given the function it reads
    `__module__`. The key must take the second road."""
    import inspect

    asked = []
    original = inspect.getmodule

    def recording(obj, *rest):
        asked.append(obj)
        return original(obj, *rest)

    monkeypatch.setattr(inspect, "getmodule", recording)
    autograph_cache._source(loop_and_branch)
    assert asked and not any(inspect.iscode(obj) for obj in asked), asked


def test_a_failing_cache_step_leaves_the_conversion_to_tensorflow(
        cache_root: Path, fresh_conversions: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """If TF's internals moved under the cache (here: the key raises something no source
    problem would), the trace still converts through TF and gives TF's result."""
    def broken(*_: object) -> str:
        raise AttributeError("_cache_lock moved")

    monkeypatch.setattr(autograph_cache, "conversion_key", broken)
    value = tl.function(loop_and_branch, min_cluster_size=1)(tf.constant(X)).numpy()
    np.testing.assert_allclose(value, tf.function(loop_and_branch)(tf.constant(X)).numpy(),
                               rtol=2e-6, atol=2e-6)
    assert not _entries(cache_root)


def test_without_the_internals_it_stays_off(
        cache_root: Path, fresh_conversions: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autograph_cache, "AVAILABLE", False)
    tl.function(loop_and_branch, min_cluster_size=1)(tf.constant(X))
    assert not _entries(cache_root)
