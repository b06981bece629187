"""float16 and bfloat16 through the rules, against TF: element-wise math in the 2-byte
type (each result rounded to it), sums, products and dots accumulated in float32, as
XLA computes them; a small model (Dense + relu + softmax) through `tl.function`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, run_clusters, sample, trace
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.clustering import cluster_graph, lower_cluster

HALVES = [tf.float16, tf.bfloat16]
HALF_IDS = ["float16", "bfloat16"]


def _cast(fn: Any, dtype: tf.DType) -> Any:
    """`fn` on float32 inputs cast to `dtype` inside the graph (NumPy has no bfloat16
    TF accepts as an argument everywhere), results cast back to float32 at the end."""

    def wrapped(*xs: Any) -> list[Any]:
        return [tf.cast(y, tf.float32) for y in fn(*[tf.cast(x, dtype) for x in xs])]

    return wrapped


def _half_compare(dtype: tf.DType, op_types: list[str]) -> Any:
    """Compare float32 casts of 2-byte results with the 2-byte dtype's tolerance for the
    op of each output."""
    numpy_half = dtype.as_numpy_dtype

    def compare(actual: np.ndarray, expected: np.ndarray, _: str, context: str) -> None:
        op_type = op_types[int(context.split(",")[0].split()[-1])]
        if np.asarray(expected).dtype.kind == "f":
            actual, expected = (np.asarray(v).astype(numpy_half) for v in (actual, expected))
        assert_close(actual, expected, op_type, context)

    return compare


def _elementwise(a: tf.Tensor, b: tf.Tensor) -> list[tf.Tensor]:
    return [a + b, a * b, a / b, tf.exp(a), tf.tanh(a), tf.sigmoid(a), tf.nn.relu(a),
            tf.math.log(b), tf.maximum(a, b), tf.sqrt(b), tf.nn.gelu(a, approximate=True),
            tf.math.erfc(a), tf.math.erf(a)]


_ELEMENTWISE_OPS = ["AddV2", "Mul", "RealDiv", "Exp", "Tanh", "Sigmoid", "Relu", "Log",
                    "Maximum", "Sqrt", "Tanh", "Erfc", "Erf"]


@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
def test_elementwise_math(dtype: tf.DType) -> None:
    x = sample((4, 6), np.float32, seed=1, low=-4, high=4)
    y = sample((4, 6), np.float32, seed=2, low=0.5, high=3, edges=False)
    check_against_tf(_cast(_elementwise, dtype), [x, y], "Tanh",
                     compare=_half_compare(dtype, _ELEMENTWISE_OPS))


def _reductions(a: tf.Tensor, b: tf.Tensor) -> list[tf.Tensor]:
    return [tf.reduce_sum(a, 1), tf.reduce_mean(a, 0), tf.reduce_max(a, 1), tf.matmul(a, b),
            tf.nn.softmax(a), tf.nn.log_softmax(a), tf.cumsum(a, 1)]


_REDUCTION_OPS = ["Sum", "Mean", "Max", "MatMul", "Softmax", "LogSoftmax", "Sum"]


@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
def test_reductions_dots_and_softmax(dtype: tf.DType) -> None:
    x = sample((8, 16), np.float32, seed=3, edges=False)
    w = sample((16, 5), np.float32, seed=4, edges=False)
    check_against_tf(_cast(_reductions, dtype), [x, w], "Sum",
                     compare=_half_compare(dtype, _REDUCTION_OPS))


@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
def test_sums_accumulate_in_float32(dtype: tf.DType) -> None:
    """4096 ones and one 2048: a 2-byte accumulator would stick at 2048 (f16) or 256
    (bf16); the lowering converts, sums in f32 and rounds once."""
    x = np.ones((1, 4096), np.float32)
    graph = trace(_cast(lambda a: [tf.reduce_sum(a, 1)], dtype), [x]).graph
    (cluster,) = cluster_graph(graph, min_cluster_size=1).clusters
    text = lower_cluster(graph, cluster).to_text()
    assert "f32[1]{0} reduce(" in text, text
    # A mean over more elements than float16's largest finite value: the sum and the
    # division stay in f32, as in XLA (TF's CPU kernel divides in f16 and gives NaN).
    many = np.ones((1, 70000), np.float32)
    mean = _cast(lambda a: [tf.reduce_mean(a, 1)], dtype)
    _, executed = run_clusters(trace(mean, [many]), [many])
    np.testing.assert_array_equal(list(executed.values())[0], [1.0])
    check_against_tf(_cast(lambda a: [tf.reduce_sum(a, 1)], dtype), [many], "Sum",
                     compare=_half_compare(dtype, ["Sum"]))


def _dense_model(dtype: tf.DType) -> tuple[Any, list[tf.Variable]]:
    rng = np.random.default_rng(0)
    w1 = tf.Variable(tf.cast(rng.normal(0, 0.3, (12, 16)), dtype))
    b1 = tf.Variable(tf.cast(rng.normal(0, 0.1, (16,)), dtype))
    w2 = tf.Variable(tf.cast(rng.normal(0, 0.3, (16, 4)), dtype))

    def model(x: tf.Tensor) -> tf.Tensor:
        hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
        return tf.nn.softmax(tf.matmul(hidden, w2))

    return model, [w1, b1, w2]


@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
def test_dense_relu_softmax_model(dtype: tf.DType) -> None:
    model, _ = _dense_model(dtype)
    x = tf.cast(np.random.default_rng(1).normal(size=(10, 12)), dtype)
    expected = tf.function(model)(x)
    compiled = tl.function(model, jit_compile=True)
    actual = compiled(x)
    assert actual.dtype == dtype
    assert_close(actual.numpy(), expected.numpy(), "Softmax")
    hlo = compiled.experimental_get_compiler_ir(x)(stage="hlo")
    element = "f16" if dtype == tf.float16 else "bf16"
    assert f"{element}[10,4]" in hlo and "f32[10,16]" in hlo  # the dot in f32
