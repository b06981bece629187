"""The stateless random ops compile to TF's own Philox: bit for bit what TF's CPU kernels
draw (plain `tf.function`), under must-compile and auto-clustering alike, over shapes
(empty, one element, sizes not a multiple of Philox's 4 lanes), seeds (negative and
large int64 ones), dtypes and counters that carry; the normals' logf is glibc's on the
values Box-Muller feeds it; and a Keras Dropout inside a compiled training step drops
exactly TF's units."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.clustering.mark import why_not_compilable
from tfxla_lite.clustering.registry import LoweringContext
from tfxla_lite.clustering.rules_random import box_muller_log
from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo import HloModule, Shape
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.verifier import verify

SHAPES = ((), (0,), (1,), (7,), (3, 5), (2, 0, 3), (4, 4, 3))
SEEDS_64 = ((0, 0), (1, 2), (-1, -(2 ** 63)), (2 ** 63 - 1, 12345))
SEEDS_32 = ((-7, 2 ** 31 - 1), (0, -1))
STRICT = tl.Options(strict_jit_compile=True)
MODES = ("jit_compile", "auto")
# Registered random ops, each drawn against TF below (test_clustering_ops checks the list).
TESTED_OPS = {"StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg",
              "StatelessRandomNormal", "StatelessRandomNormalV2", "StatelessRandomUniform",
              "StatelessRandomUniformFullInt", "StatelessRandomUniformFullIntV2",
              "StatelessRandomUniformInt", "StatelessRandomUniformIntV2",
              "StatelessRandomUniformV2"}


def _compiled(fn: Callable[..., Any], mode: str) -> Any:
    if mode == "jit_compile":
        return tl.function(fn, jit_compile=True, options=STRICT)
    return tl.function(fn, min_cluster_size=1)


def _bits(value: Any) -> np.ndarray:
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    return array.reshape(-1).view(np.uint8)


def _assert_same_draws(fn: Callable[..., Any], mode: str, *inputs_list: tuple[Any, ...]
                       ) -> tl.Function:
    """Run `fn` under plain TF and compiled on each inputs tuple; every output identical,
    bit for bit and shape for shape."""
    plain, compiled = tf.function(fn), _compiled(fn, mode)
    for inputs in inputs_list:
        expected, actual = plain(*inputs), compiled(*inputs)
        for index, (want, got) in enumerate(zip(tf.nest.flatten(expected),
                                                tf.nest.flatten(actual))):
            assert got.dtype == want.dtype and got.shape == want.shape, (index, got, want)
            np.testing.assert_array_equal(_bits(got), _bits(want),
                                          err_msg=f"output {index}, inputs {inputs}")
    return compiled


def _seeds(dtype: tf.DType) -> list[tuple[tf.Tensor]]:
    seeds = SEEDS_64 if dtype == tf.int64 else SEEDS_32
    return [(tf.constant(seed, dtype),) for seed in seeds]


def _sweep(*values: Any) -> list[Any]:
    """(dtype, mode) pairs: the first of each dtype's modes in the default suite, the
    rest slow (every draw compiles a Philox chain; the passes take about a second each)."""
    return [pytest.param(dtype, mode, marks=() if mode == fast_mode else pytest.mark.slow,
                         id=f"{dtype.name}-{mode}")
            for dtype, fast_mode in values for mode in MODES]


@pytest.mark.parametrize(("dtype", "mode"), _sweep(
    (tf.float32, "jit_compile"), (tf.float16, "jit_compile"), (tf.bfloat16, "auto"),
    (tf.float64, "auto")))
def test_stateless_uniform_and_normal_floats_match_tf(dtype: tf.DType, mode: str) -> None:
    # GetKeyCounter + UniformV2 (AUTO_SELECT), and the v1 StatelessRandomUniform.
    def draw(seed: tf.Tensor) -> list[tf.Tensor]:
        v2 = [tf.random.stateless_uniform(shape, seed=seed, dtype=dtype) for shape in SHAPES]
        v1 = [tf.raw_ops.StatelessRandomUniform(shape=(5,), seed=seed, dtype=dtype)]
        normals = [tf.random.stateless_normal(shape, seed=seed, dtype=dtype)
                   for shape in ((), (0,), (7,), (1031,))]
        normals.append(tf.raw_ops.StatelessRandomNormal(shape=(3, 3), seed=seed, dtype=dtype))
        return v2 + v1 + normals

    seed_dtype = tf.int64 if dtype in (tf.float32, tf.float16) else tf.int32
    _assert_same_draws(draw, mode, *_seeds(seed_dtype))


@pytest.mark.parametrize(("dtype", "mode"), _sweep((tf.int32, "jit_compile"),
                                                  (tf.int64, "auto")))
def test_stateless_uniform_ints_match_tf(dtype: tf.DType, mode: str) -> None:
    # UniformIntV2 with constant and runtime bounds, UniformFullIntV2 and the v1 pair.
    def draw(seed: tf.Tensor, low: tf.Tensor, high: tf.Tensor) -> list[tf.Tensor]:
        wide = 2 ** 40 if dtype == tf.int64 else 2 ** 30
        results = [tf.random.stateless_uniform(shape, seed=seed, minval=-5, maxval=wide,
                                               dtype=dtype) for shape in ((), (0,), (7,), (3, 5))]
        results.append(tf.random.stateless_uniform((9,), seed=seed, minval=low, maxval=high,
                                                   dtype=dtype))
        results.append(tf.random.stateless_uniform((11,), seed=seed, minval=None,
                                                   maxval=None, dtype=dtype))
        results.append(tf.raw_ops.StatelessRandomUniformInt(shape=(6,), seed=seed,
                                                            minval=low, maxval=high))
        results.append(tf.raw_ops.StatelessRandomUniformFullInt(shape=(5,), seed=seed,
                                                                dtype=dtype))
        return results

    info = np.iinfo(dtype.as_numpy_dtype)
    inputs = [(seed, tf.constant(low, dtype), tf.constant(high, dtype))
              for (seed,), (low, high) in zip(_seeds(tf.int64) + _seeds(tf.int32),
                                              ((0, 1), (-3, 3), (info.min, info.max),
                                               (info.min, 0), (7, 1000), (-1, 0)))]
    _assert_same_draws(draw, mode, *inputs)


@pytest.mark.parametrize("mode", MODES)
def test_unsigned_full_ints_match_tf(mode: str) -> None:
    def draw(seed: tf.Tensor) -> list[tf.Tensor]:
        return [tf.random.stateless_uniform((7,), seed=seed, minval=None, maxval=None,
                                            dtype=dtype) for dtype in (tf.uint32, tf.uint64)]

    _assert_same_draws(draw, mode, *_seeds(tf.int64))


@pytest.mark.parametrize("mode", MODES)
def test_v2_ops_on_runtime_key_and_counter_match_tf(mode: str) -> None:
    """Key and counter as inputs, the counter's low word about to wrap: the group index
    carries into the high word (itself wrapping), as Philox's 128-bit Skip does."""
    def draw(key: tf.Tensor, counter: tf.Tensor, low: tf.Tensor, high: tf.Tensor
             ) -> list[tf.Tensor]:
        return [tf.raw_ops.StatelessRandomUniformV2(shape=(41,), key=key, counter=counter,
                                                    alg=1, dtype=tf.float32),
                tf.raw_ops.StatelessRandomUniformV2(shape=(9,), key=key, counter=counter,
                                                    alg=3, dtype=tf.float64),
                tf.raw_ops.StatelessRandomUniformFullIntV2(shape=(13,), key=key,
                                                           counter=counter, alg=1,
                                                           dtype=tf.int64),
                tf.raw_ops.StatelessRandomUniformIntV2(shape=(10,), key=key, counter=counter,
                                                       alg=1, minval=low, maxval=high),
                tf.raw_ops.StatelessRandomNormalV2(shape=(2, 7), key=key, counter=counter,
                                                   alg=1, dtype=tf.float32)]

    top = 2 ** 64 - 1
    cases = [((0,), (0, 0)), ((top,), (top - 3, top)), ((2 ** 63 + 5,), (top, 17)),
             ((12345,), (top - 40, 2 ** 32 - 1))]
    _assert_same_draws(draw, mode, *[
        (tf.constant(key, tf.uint64), tf.constant(counter, tf.uint64),
         tf.constant(-100, tf.int32), tf.constant(2 ** 31 - 1, tf.int32))
        for key, counter in cases])


@pytest.mark.parametrize("mode", MODES)
def test_key_counter_ops_match_tf(mode: str) -> None:
    def draw(seed: tf.Tensor) -> list[tf.Tensor]:
        key, counter, alg = tf.raw_ops.StatelessRandomGetKeyCounterAlg(seed=seed)
        plain_key, plain_counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed)
        return [key, counter, alg, plain_key, plain_counter]

    _assert_same_draws(draw, mode, *_seeds(tf.int64), *_seeds(tf.int32))


def test_draws_of_an_unknown_batch_dimension_match_tf() -> None:
    """The shape input is `tf.shape(x)` of an unknown batch (what Keras's retraced steps
    give): the cluster compiles per concrete shape and still draws TF's numbers."""
    def draw(x: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        keep = tf.random.stateless_uniform(tf.shape(x), seed=seed) > 0.3
        return tf.where(keep, x, 0.0) + tf.random.stateless_normal(tf.shape(x), seed=seed)

    spec = [tf.TensorSpec([None, 5]), tf.TensorSpec([2], tf.int64)]
    plain = tf.function(draw, input_signature=spec)
    compiled = tl.function(draw, input_signature=spec, jit_compile=True, options=STRICT)
    for batch in (1, 7):
        x, seed = tf.ones((batch, 5)), tf.constant([batch, 9], tf.int64)
        np.testing.assert_array_equal(compiled(x, seed).numpy(), plain(x, seed).numpy())


def test_random_ops_run_inside_the_cluster() -> None:
    def draw(seed: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
        mask = tf.random.stateless_uniform((4, 8), seed=seed) >= 0.5
        return tf.where(mask, x * 2.0, 0.0) + tf.cast(
            tf.random.stateless_uniform((4, 8), seed=seed, minval=0, maxval=3,
                                        dtype=tf.int32), tf.float32)

    seed, x = tf.constant([3, 4], tf.int64), tf.ones((4, 8))
    f = tl.function(draw, jit_compile=True, options=STRICT)
    report = tl.explain(f, seed, x)
    compiled = {op_type for c in report.compiled_clusters for _, op_type in c.ops}
    assert {"StatelessRandomGetKeyCounter", "StatelessRandomUniformV2",
            "StatelessRandomUniformIntV2"} <= compiled, report
    assert len(report.compiled_clusters) == 1, report
    assert not [n for n in report.fallbacks if "Random" in n.op_type], report


def test_non_philox_and_bad_inputs_stay_in_tf_with_a_reason() -> None:
    @tf.function
    def draw(key: tf.Tensor, counter: tf.Tensor, alg: tf.Tensor) -> list[tf.Tensor]:
        return [tf.raw_ops.StatelessRandomUniformV2(shape=(4,), key=key, counter=counter,
                                                    alg=2),
                tf.raw_ops.StatelessRandomUniformV2(shape=(4,), key=key, counter=counter,
                                                    alg=alg),
                tf.raw_ops.StatelessRandomUniformInt(shape=(4,), seed=[1, 2], minval=3,
                                                     maxval=3)]

    graph = draw.get_concrete_function(tf.TensorSpec((1,), tf.uint64),
                                       tf.TensorSpec((2,), tf.uint64),
                                       tf.TensorSpec((), tf.int32)).graph
    reasons = {op.name: why_not_compilable(op) for op in graph.get_operations()
               if op.type.startswith("StatelessRandomUniform")}
    assert sorted(reasons.values()) == sorted([
        "alg 2 is not Philox: only TF's Philox is reproduced bit for bit (ThreeFry stays "
        "in TF)", "input 3 must be a constant", "minval must be below maxval (TF raises)"])


# -- Keras Dropout ---------------------------------------------------------------------------
def _mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dropout(0.5), keras.layers.Dense(3)])


def test_dropout_mask_is_tfs_exactly() -> None:
    def masks(x: tf.Tensor) -> tf.Tensor:
        return layer(x, training=True)

    x = tf.ones((5, 7))
    keras.utils.set_random_seed(0)
    layer = keras.layers.Dropout(0.3)
    want = [tf.function(masks)(x).numpy() for _ in range(3)]
    keras.utils.set_random_seed(0)
    layer = keras.layers.Dropout(0.3)
    f = tl.function(masks, jit_compile=True, options=STRICT)
    got = [f(x).numpy() for _ in range(3)]
    for step, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a, b, err_msg=f"call {step}")
    assert not np.array_equal(want[0], want[1])  # the seed advanced between calls


def test_dropout_training_step_compiles_and_matches_tf_step_for_step() -> None:
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(8, 12)).astype(np.float32))
    y = tf.constant(rng.integers(0, 3, size=8))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def run(compile_step: Callable[[Any], Any]) -> list[float]:
        model = _mlp()
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)

        def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        compiled = compile_step(step)
        return [float(compiled(x, y)) for _ in range(4)]

    want = run(tf.function)
    got = run(lambda step: tl.function(step, jit_compile=True, options=STRICT))
    # Same masks: the losses agree to rounding (fused dots may round differently).
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert len(set(want)) == len(want)


# -- glibc's logf, as Box-Muller takes it ------------------------------------------------------
def _glibc_logf(values: np.ndarray) -> np.ndarray:
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    logf = libm.logf
    logf.restype, logf.argtypes = ctypes.c_float, [ctypes.c_float]
    return np.array([logf(float(v)) for v in values], np.float32)


def _box_muller_log_module(count: int) -> HloModule:
    module = HloModule("box_muller_log")
    entry = module.new_computation("main", entry=True)
    ctx = LoweringContext(module, entry)
    mantissa = entry.add_parameter(0, Shape("u32", (count,)))
    entry.root = entry.create("tuple", [box_muller_log(ctx, mantissa)])
    return module


def _check_box_muller_log(mantissas: np.ndarray) -> None:
    """The lowering's logf of u1 = max(m 2^-23, 1e-7f), run by the NumPy evaluator (what
    constant folding uses) and by the CPU backend, is glibc's logf bit for bit."""
    u1 = np.maximum(mantissas.astype(np.float32) * np.float32(2.0 ** -23), np.float32(1e-7))
    expected = _glibc_logf(u1)
    module = _box_muller_log_module(mantissas.size)
    verify(module)
    (evaluated,) = evaluate(module, mantissas)
    np.testing.assert_array_equal(np.asarray(evaluated).view(np.uint32),
                                  expected.view(np.uint32))
    (compiled,) = compile_module(module)(mantissas)
    np.testing.assert_array_equal(np.asarray(compiled).view(np.uint32),
                                  expected.view(np.uint32))


def test_box_muller_log_is_glibcs_logf() -> None:
    edges = [0, 1, 2, 3, 0x7FFFFF, 0x400000, 0x3FFFFF, 0x333333, 0x599999, 0x59999A]
    powers = [1 << j for j in range(23)] + [(1 << j) - 1 for j in range(2, 23)]
    strided = list(range(5, 1 << 23, 97))
    _check_box_muller_log(np.array(sorted(set(edges + powers + strided)), np.uint32))


@pytest.mark.slow
def test_box_muller_log_is_glibcs_logf_on_every_mantissa() -> None:
    _check_box_muller_log(np.arange(1 << 23, dtype=np.uint32))
