"""MaxPool, AvgPool (2-D, 3-D, MaxPoolV2) and their gradients lowered to HLO, against TF:
window sizes, strides, SAME/VALID/EXPLICIT, NHWC/NCHW, windows wider than the input,
1- and 0-sized dimensions, f32/f64/f16/bf16, NaN and ±inf, equal maxima (which element
MaxPoolGrad credits), through the evaluator and the CPU backend, and through
`tl.function` in both modes. TF's own kernels are the oracle; where TF's CPU kernels
refuse (channels-first layouts) TF's XLA is, on inputs where the two agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, check_in_both_modes, sample, tf_result
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.clustering import rules_pool
from tfxla_lite.hlo import parse_module

F16, BF16, F32, F64 = np.float16, tf.bfloat16.as_numpy_dtype, np.float32, np.float64


@pytest.fixture(autouse=True)
def _every_window_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Auto-clustering leaves MaxPoolGrad of windows past LARGEST_COMPILED_GRAD_WINDOW
    elements to TF's (faster) kernel; these tests lower every window, to check the
    lowering's values."""
    monkeypatch.setattr(rules_pool, "LARGEST_COMPILED_GRAD_WINDOW", 1 << 20)


def _check(fn: Callable[..., Any], args: list[np.ndarray], op_type: str) -> None:
    check_against_tf(fn, args, op_type, expected=tf_result(fn, args))


def _value_and_gradient(pool: Callable[[tf.Tensor], tf.Tensor]
                        ) -> Callable[[tf.Tensor, tf.Tensor], list[tf.Tensor]]:
    """The pool and the gradient of sum(pool(x) * upstream) with respect to x."""

    def fn(x: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pool(x)
            loss = tf.reduce_sum(y * upstream)
        return [y, tape.gradient(loss, x)]

    return fn


POOL_CASES = [
    # (input NHWC, ksize, strides, padding)
    ((2, 6, 6, 3), (2, 2), (2, 2), "VALID"),
    ((2, 7, 5, 3), (2, 2), (2, 2), "SAME"),
    ((1, 7, 7, 4), (3, 3), (2, 2), "SAME"),
    ((1, 7, 7, 4), (3, 3), (2, 2), "VALID"),
    ((1, 8, 6, 2), (3, 2), (1, 2), "SAME"),
    ((1, 5, 6, 2), (2, 3), (3, 1), "VALID"),
    ((3, 1, 1, 2), (1, 1), (1, 1), "SAME"),
    ((1, 3, 2, 2), (5, 4), (1, 1), "SAME"),  # window wider than the input
    ((1, 3, 2, 2), (5, 4), (2, 3), "SAME"),
    ((2, 4, 4, 1), (1, 1), (2, 2), "VALID"),
    ((0, 4, 4, 2), (2, 2), (2, 2), "SAME"),  # no batch
    ((1, 4, 4, 0), (2, 2), (1, 1), "SAME"),  # no channels
    ((1, 0, 4, 2), (1, 2), (1, 1), "SAME"),  # no rows
]


def _pool_fn(kind: str, ksize: tuple[int, int], strides: tuple[int, int], padding: Any,
             data_format: str = "NHWC") -> Callable[[tf.Tensor], tf.Tensor]:
    explicit = isinstance(padding, list)

    def pool(x: tf.Tensor) -> tf.Tensor:
        if data_format == "NHWC":
            k, s = [1, *ksize, 1], [1, *strides, 1]
        else:
            k, s = [1, 1, *ksize], [1, 1, *strides]
        if kind == "max":
            return tf.raw_ops.MaxPool(input=x, ksize=k, strides=s,
                                      padding="EXPLICIT" if explicit else padding,
                                      explicit_paddings=sum(padding, []) if explicit else [],
                                      data_format=data_format)
        return tf.raw_ops.AvgPool(value=x, ksize=k, strides=s, padding=padding,
                                  data_format=data_format)

    return pool


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", range(len(POOL_CASES)))
def test_pool_nhwc(kind: str, case: int) -> None:
    x_shape, ksize, strides, padding = POOL_CASES[case]
    pool = _pool_fn(kind, ksize, strides, padding)
    op_type = "MaxPool" if kind == "max" else "AvgPool"
    args = [sample(x_shape, F32, seed=case, edges=kind == "max" and case % 2 == 0)]
    _check(pool, args, op_type)
    upstream = sample(_output_shape(pool, args[0]), F32, seed=case + 50, edges=False)
    _check(_value_and_gradient(pool), [args[0], upstream],
           "MaxPoolGrad" if kind == "max" else "AvgPoolGrad")


def _output_shape(pool: Callable[[tf.Tensor], tf.Tensor], x: np.ndarray) -> tuple[int, ...]:
    return tuple(pool(tf.constant(x)).shape)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", [1, 2, 4, 8])
def test_pool_nchw(kind: str, case: int) -> None:
    """TF's CPU kernels run no channels-first pooling: TF's XLA is the oracle (finite
    inputs, where it agrees with TF's kernels)."""
    x_shape, ksize, strides, padding = POOL_CASES[case]
    pool = _pool_fn(kind, ksize, strides, padding, "NCHW")
    n, h, w, c = x_shape
    x = sample((n, c, h, w), F32, seed=case, edges=False)
    _check(pool, [x], "MaxPool" if kind == "max" else "AvgPool")
    upstream = sample(tuple(tf.function(pool, jit_compile=True)(tf.constant(x)).shape), F32,
                      seed=7, edges=False)
    _check(_value_and_gradient(pool), [x, upstream],
           "MaxPoolGrad" if kind == "max" else "AvgPoolGrad")


@pytest.mark.parametrize("padding", [[[0, 0], [1, 0], [0, 2], [0, 0]],
                                     [[0, 0], [2, 1], [1, 1], [0, 0]]])
def test_max_pool_explicit_padding(padding: list[list[int]]) -> None:
    pool = _pool_fn("max", (3, 3), (2, 1), padding)
    x = sample((2, 6, 5, 3), F32, seed=3)
    _check(pool, [x], "MaxPool")
    upstream = sample(_output_shape(pool, x), F32, seed=4, edges=False)
    _check(_value_and_gradient(pool), [x, upstream], "MaxPoolGrad")


@pytest.mark.parametrize("dtype", [F64, F16, BF16], ids=["f64", "f16", "bf16"])
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", [1, 2])
def test_pool_dtypes(dtype: Any, kind: str, case: int) -> None:
    x_shape, ksize, strides, padding = POOL_CASES[case]
    pool = _pool_fn(kind, ksize, strides, padding)
    x = sample(x_shape, dtype, seed=case, edges=False)
    upstream = sample(_output_shape(pool, x), dtype, seed=9, edges=False)
    _check(_value_and_gradient(pool), [x, upstream],
           "MaxPoolGrad" if kind == "max" else "AvgPoolGrad")


def test_max_pool_nan_and_infinities() -> None:
    """TF's kernel skips NaN and starts from the lowest finite value; its gradient credits
    a NaN only when it is first in the window."""
    x = np.array([np.nan, 1, 2, 3,  1, np.nan, 2, 3,  3, 1, 2, np.nan,
                  np.nan, np.nan, np.nan, np.nan,  -np.inf, -np.inf, -np.inf, -np.inf,
                  np.inf, 1, np.inf, 2], np.float32).reshape(1, 6, 4, 1)
    x = np.concatenate([x, x[:, ::-1]], axis=-1)
    pool = _pool_fn("max", (2, 2), (2, 2), "SAME")
    upstream = sample(_output_shape(pool, x), F32, seed=1, edges=False)
    _check(_value_and_gradient(pool), [x, upstream], "MaxPoolGrad")
    overlapping = _pool_fn("max", (3, 3), (1, 1), "SAME")
    upstream = sample(_output_shape(overlapping, x), F32, seed=2, edges=False)
    _check(_value_and_gradient(overlapping), [x, upstream], "MaxPoolGrad")


@pytest.mark.parametrize("ksize, strides, padding", [((2, 2), (2, 2), "VALID"),
                                                      ((3, 3), (1, 1), "SAME"),
                                                      ((2, 2), (1, 1), "VALID"),
                                                      ((3, 2), (2, 1), "SAME")])
def test_max_pool_gradient_ties(ksize: tuple[int, int], strides: tuple[int, int],
                                padding: str) -> None:
    """Equal maxima everywhere: the gradient goes to the first in row-major window order."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=(2, 6, 7, 3)).astype(np.float32)
    pool = _pool_fn("max", ksize, strides, padding)
    upstream = sample(_output_shape(pool, x), F32, seed=3, edges=False)
    _check(_value_and_gradient(pool), [x, upstream], "MaxPoolGrad")


def _check_grad_grad(x: np.ndarray, ksize: tuple[int, int], strides: tuple[int, int],
                     padding: str) -> None:
    k, s = [1, *ksize, 1], [1, *strides, 1]

    def fn(x: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
        y = tf.raw_ops.MaxPool(input=x, ksize=k, strides=s, padding=padding)
        return tf.raw_ops.MaxPoolGradGrad(orig_input=x, orig_output=y, grad=grad, ksize=k,
                                          strides=s, padding=padding)

    _check(fn, [x, sample(x.shape, F32, seed=5, edges=False)], "MaxPoolGradGrad")


@pytest.mark.parametrize("ksize, strides, padding", [((2, 2), (1, 1), "VALID"),
                                                      ((3, 3), (2, 2), "SAME")])
def test_max_pool_grad_grad(ksize: tuple[int, int], strides: tuple[int, int],
                            padding: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 4, size=(2, 6, 5, 3)).astype(np.float32)
    _check_grad_grad(x, ksize, strides, padding)


@pytest.mark.parametrize("ksize, strides, padding", [((2, 2), (2, 2), "VALID"),
                                                      ((3, 3), (1, 1), "SAME")])
def test_max_pool_grad_grad_nan_and_infinities(ksize: tuple[int, int],
                                               strides: tuple[int, int], padding: str) -> None:
    """TF's kernel reads the gradient at the first element equal to the forward output:
    never at a NaN, nowhere (0) in a window of NaN or -inf."""
    x = np.array([np.nan, 1, 2, 3,  1, np.nan, 2, 3,  3, 1, 2, np.nan,
                  np.nan, np.nan, np.nan, np.nan,  -np.inf, -np.inf, -np.inf, -np.inf,
                  np.inf, 1, np.inf, 2], np.float32).reshape(1, 6, 4, 1)
    _check_grad_grad(x, ksize, strides, padding)


def test_max_pool_grad_grad_v2_and_3d() -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(0, 4, size=(1, 5, 6, 2)).astype(np.float32)

    def fn_v2(x: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
        k, s = tf.constant([1, 2, 3, 1]), tf.constant([1, 1, 2, 1])
        y = tf.raw_ops.MaxPoolV2(input=x, ksize=k, strides=s, padding="SAME")
        return tf.raw_ops.MaxPoolGradGradV2(orig_input=x, orig_output=y, grad=grad, ksize=k,
                                            strides=s, padding="SAME")

    _check(fn_v2, [x, sample(x.shape, F32, seed=6, edges=False)], "MaxPoolGradGradV2")
    x3 = rng.integers(0, 3, size=(1, 4, 4, 5, 2)).astype(np.float32)
    k3, s3 = [1, 2, 2, 3, 1], [1, 2, 1, 2, 1]

    def fn_3d(x: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
        y = tf.raw_ops.MaxPool3D(input=x, ksize=k3, strides=s3, padding="VALID")
        return tf.raw_ops.MaxPool3DGradGrad(orig_input=x, orig_output=y, grad=grad, ksize=k3,
                                            strides=s3, padding="VALID")

    _check(fn_3d, [x3, sample(x3.shape, F32, seed=7, edges=False)], "MaxPool3DGradGrad")


def test_max_pool_v2_constant_sizes() -> None:
    def fn(x: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.raw_ops.MaxPoolV2(input=x, ksize=tf.constant([1, 3, 3, 1]),
                                     strides=tf.constant([1, 2, 2, 1]), padding="SAME")
            loss = tf.reduce_sum(y * upstream)
        return [y, tape.gradient(loss, x)]

    x = sample((1, 7, 6, 2), F32, seed=4)
    _check(fn, [x, sample((1, 4, 3, 2), F32, seed=5, edges=False)], "MaxPoolGradV2")


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_pool_3d(kind: str, padding: str) -> None:
    def pool(x: tf.Tensor) -> tf.Tensor:
        op = tf.nn.max_pool3d if kind == "max" else tf.nn.avg_pool3d
        return op(x, ksize=[2, 3, 2], strides=[1, 2, 2], padding=padding)

    x = sample((2, 4, 5, 5, 3), F32, seed=8, edges=False)
    upstream = sample(_output_shape(pool, x), F32, seed=9, edges=False)
    _check(_value_and_gradient(pool), [x, upstream],
           "MaxPool3DGrad" if kind == "max" else "AvgPool3DGrad")


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_max_pool_3d_ties_and_nan(padding: str) -> None:
    """TF's 3-D kernels differ from the 2-D ones: MaxPool3DGrad gives a window's gradient
    to every element equal to the forward output, MaxPool3DGradGrad reads it at the first."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 3, size=(1, 4, 4, 5, 2)).astype(np.float32)
    x.reshape(-1)[[0, 5, 17, 33, 60]] = [np.nan, np.nan, -np.inf, np.nan, np.inf]
    k, s = [1, 2, 2, 3, 1], [1, 2, 1, 2, 1]

    def pool(x: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.MaxPool3D(input=x, ksize=k, strides=s, padding=padding)

    upstream = sample(_output_shape(pool, x), F32, seed=9, edges=False)
    _check(_value_and_gradient(pool), [x, upstream], "MaxPool3DGrad")

    def grad_grad(x: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.MaxPool3DGradGrad(orig_input=x, orig_output=pool(x), grad=grad,
                                            ksize=k, strides=s, padding=padding)

    _check(grad_grad, [x, sample(x.shape, F32, seed=7, edges=False)], "MaxPool3DGradGrad")


def _max_pool_step(ksize: int, strides: int, padding: str
                   ) -> tuple[Callable[..., Any], list[tf.Tensor]]:
    """A relu, a max pool of `ksize`, a weighted sum and the gradient of x."""
    x = tf.constant(sample((2, 12, 12, 8), F32, seed=21, edges=True))
    pooled = tf.nn.max_pool2d(x, ksize, strides, padding)
    upstream = tf.constant(sample(tuple(pooled.shape), F32, seed=22, edges=False))

    def step(x: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.nn.max_pool2d(tf.nn.relu(x), ksize, strides, padding)
            loss = tf.reduce_sum(y * upstream)
        return [loss, tape.gradient(loss, x)]

    return step, [x, upstream]


@pytest.mark.parametrize("ksize, auto_compiled", [(3, True), (4, True), (5, False)])
def test_max_pool_gradient_window_rule(monkeypatch: pytest.MonkeyPatch, ksize: int,
                                       auto_compiled: bool) -> None:
    """Auto-clustering leaves MaxPoolGrad of windows past 16 elements to TF's kernel;
    jit_compile=True compiles every window: one program, TF's numbers."""
    monkeypatch.setattr(rules_pool, "LARGEST_COMPILED_GRAD_WINDOW", 16)
    step, tensors = _max_pool_step(ksize, 2, "SAME")
    expected = [t.numpy() for t in step(*tensors)]
    for jit_compile in (None, True):
        compiled = tl.function(step, jit_compile=jit_compile, options=tl.Options(
            min_cluster_size=1, strict_jit_compile=bool(jit_compile)))
        loss, gradient = compiled(*tensors)
        assert_close(loss.numpy(), expected[0], "Sum", f"jit_compile={jit_compile}")
        assert_close(gradient.numpy(), expected[1], "MaxPoolGrad", f"jit={jit_compile}")
        report = compiled.explain(*tensors)
        assert not report.runs_on_xla and report.jit_compile_fallback is None, report
        stuck = [f for f in report.fallbacks if f.op_type == "MaxPoolGrad"]
        if jit_compile or auto_compiled:
            assert not stuck, report
        else:
            (grad,) = stuck
            assert "runs on TF's kernel" in grad.reason and "rules_pool.py" in grad.reason
        if jit_compile:
            assert len(report.clusters) == 1, report


def test_max_pool_gradient_picks_each_window_once() -> None:
    """The window argmax is one kernel's output: the kernel spreading the gradient back
    reads the index, never the pooled input (fused, it would redo each window per
    window offset, ksize^2 times)."""
    x = tf.constant(sample((2, 16, 16, 8), F32, seed=3, edges=False))
    grad = tf.constant(sample((2, 8, 8, 8), F32, seed=4, edges=False))

    def fn(x: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
        pooled = tf.nn.max_pool2d(x, 3, 2, "SAME")
        return tf.raw_ops.MaxPoolGrad(orig_input=x, orig_output=pooled, grad=grad,
                                      ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1],
                                      padding="SAME")

    compiled = tl.function(fn, jit_compile=True)
    np.testing.assert_array_equal(compiled(x, grad).numpy(), fn(x, grad).numpy())
    module = parse_module(compiled.experimental_get_compiler_ir(x, grad)(
        stage="optimized_hlo"), fill_elided_constants=True)
    assert module.entry is not None
    (x_param,) = [i for i in module.entry.instructions
                  if i.opcode == "parameter" and i.shape.dims == (2, 16, 16, 8)]
    readers = [i for i in x_param.users if i.opcode == "fusion"]
    assert readers, module.entry
    # Only the index kernel (and the forward pool) read x; none makes x's gradient.
    assert all(r.shape.dims != (2, 16, 16, 8) for r in readers), [str(r) for r in readers]
    assert any(r.shape.element_type == "s32" for r in readers), [str(r) for r in readers]


def test_pooling_in_both_modes() -> None:
    """A pooling layer and its gradient through tl.function, auto and must-compile."""
    x = sample((4, 9, 9, 8), F32, seed=11, edges=False)
    upstream = sample((4, 4, 4, 8), F32, seed=12, edges=False)

    def fn(x: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.nn.max_pool2d(tf.nn.relu(x), 3, 2, "VALID") + tf.nn.avg_pool2d(
                x, 2, 2, "VALID")
            loss = tf.reduce_sum(y * upstream)
        return [y, tape.gradient(loss, x)]

    tensors = [tf.constant(a) for a in (x, upstream)]
    check_in_both_modes(fn, tensors, "MaxPool",
                        {"MaxPool", "AvgPool", "MaxPoolGrad", "AvgPoolGrad"})


# For test_clustering_ops.test_every_registered_op_is_tested.
TESTED_OPS = frozenset({"MaxPool", "MaxPoolV2", "MaxPool3D", "AvgPool", "AvgPool3D",
                        "MaxPoolGrad", "MaxPoolGradV2", "MaxPool3DGrad", "AvgPoolGrad",
                        "AvgPool3DGrad", "MaxPoolGradGrad", "MaxPoolGradGradV2",
                        "MaxPool3DGradGrad"})
