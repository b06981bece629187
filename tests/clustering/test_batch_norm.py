"""FusedBatchNorm/V2/V3 and their gradients lowered to HLO, against TF: training and
inference, NHWC/NCHW (and 3-D layouts), epsilon, exponential_avg_factor, every output
(running statistics and the reserve spaces the gradient reads), 1-sized and empty
batches, f32/f16/bf16, through the evaluator and the CPU backend, gradients via
tf.GradientTape, and through `tl.function` in both modes. TF's CPU kernels are the
oracle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, check_in_both_modes, sample
from tolerances import assert_close

F16, BF16, F32 = np.float16, tf.bfloat16.as_numpy_dtype, np.float32


def _check(fn: Callable[..., Any], args: list[np.ndarray], op_type: str,
           compare_as: str = "FusedBatchNormV3") -> None:
    check_against_tf(fn, args, op_type, compare=lambda actual, want, _, where: assert_close(
        actual, want, compare_as, where))


def _statistics(channels: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=channels).astype(F32), rng.normal(size=channels).astype(F32),
            rng.normal(size=channels).astype(F32),
            rng.uniform(0.5, 2.0, size=channels).astype(F32)]


def _batch_norm(op_name: str = "FusedBatchNormV3", outputs: int = 5, **attrs: Any
                ) -> Callable[..., list[tf.Tensor]]:
    """The op's first `outputs` outputs: reserve space 3 has no static shape in TF's graph
    (it is empty), and in inference TF's Eigen kernel leaves reserve spaces 1 and 2 unset
    (oneDNN's copies the mean and variance into them for float32)."""
    op = getattr(tf.raw_ops, op_name)

    def fn(x: tf.Tensor, scale: tf.Tensor, offset: tf.Tensor, mean: tf.Tensor,
           variance: tf.Tensor) -> list[tf.Tensor]:
        return list(op(x=x, scale=scale, offset=offset, mean=mean, variance=variance,
                       **attrs))[:outputs]

    return fn


CASES = [
    # (x shape, data_format, is_training, epsilon, exponential_avg_factor)
    ((4, 5, 6, 3), "NHWC", True, 1e-3, 1.0),
    ((4, 5, 6, 3), "NHWC", True, 1e-5, 0.25),
    ((4, 5, 6, 3), "NHWC", False, 1e-3, 1.0),
    ((2, 3, 4, 5), "NCHW", True, 1e-3, 1.0),
    ((2, 3, 4, 5), "NCHW", False, 0.01, 1.0),
    ((1, 1, 1, 4), "NHWC", True, 1e-3, 1.0),  # one element per feature
    ((3, 2, 2, 1), "NHWC", True, 1e-3, 0.5),
    ((2, 3, 3, 2, 4), "NDHWC", True, 1e-3, 1.0),
    ((8, 7, 7, 16), "NHWC", True, 1e-3, 0.01),
    ((0, 2, 2, 3), "NHWC", True, 1e-3, 0.5),  # an empty batch
    ((0, 2, 2, 3), "NHWC", False, 1e-3, 1.0),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_batch_norm_v3(case: int) -> None:
    shape, data_format, is_training, epsilon, factor = CASES[case]
    channels = shape[-1] if data_format.endswith("C") else shape[1]
    # An empty batch leaves the reserve spaces unset in TF's Eigen kernel too.
    fn = _batch_norm(outputs=5 if is_training and 0 not in shape else 3, epsilon=epsilon,
                     exponential_avg_factor=factor, data_format=data_format,
                     is_training=is_training)
    _check(fn, [sample(shape, F32, seed=case, edges=False), *_statistics(channels, case)],
           "FusedBatchNormV3")


@pytest.mark.parametrize("op_name", ["FusedBatchNorm", "FusedBatchNormV2"])
def test_fused_batch_norm_v1_v2(op_name: str) -> None:
    fn = _batch_norm(op_name, epsilon=1e-3, is_training=True)
    _check(fn, [sample((3, 4, 4, 2), F32, seed=1, edges=False), *_statistics(2, 1)], op_name)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("is_training", [True, False])
def test_fused_batch_norm_half(dtype: Any, is_training: bool) -> None:
    fn = _batch_norm(outputs=5 if is_training else 3, epsilon=1e-3, is_training=is_training,
                     exponential_avg_factor=0.5)
    _check(fn, [sample((4, 3, 3, 5), dtype, seed=2, edges=False), *_statistics(5, 2)],
           "FusedBatchNormV3")


def test_fused_batch_norm_edge_values() -> None:
    """A NaN or an infinity in a feature's batch spoils that feature only, as in TF."""
    x = sample((2, 3, 3, 4), F32, seed=3, edges=False)
    x[0, 0, 0, 1], x[1, 2, 1, 2], x[0, 1, 1, 3] = np.nan, np.inf, -0.0
    fn = _batch_norm(epsilon=1e-3, is_training=True)
    _check(fn, [x, *_statistics(4, 3)], "FusedBatchNormV3")


def _gradients(is_training: bool, data_format: str = "NHWC", factor: float = 1.0
               ) -> Callable[..., list[tf.Tensor]]:
    """The forward outputs and the gradients of sum(y * upstream) by x, scale and offset."""

    def fn(x: tf.Tensor, scale: tf.Tensor, offset: tf.Tensor, mean: tf.Tensor,
           variance: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, scale, offset])
            y, *_ = tf.raw_ops.FusedBatchNormV3(
                x=x, scale=scale, offset=offset, mean=mean, variance=variance, epsilon=1e-3,
                exponential_avg_factor=factor, data_format=data_format,
                is_training=is_training)
            loss = tf.reduce_sum(y * upstream)
        return [y, *tape.gradient(loss, [x, scale, offset])]

    return fn


@pytest.mark.parametrize("is_training", [True, False])
@pytest.mark.parametrize("shape, data_format", [((4, 5, 6, 3), "NHWC"), ((2, 3, 4, 5), "NCHW"),
                                                ((1, 1, 2, 3), "NHWC")])
def test_fused_batch_norm_gradient(is_training: bool, shape: tuple[int, ...],
                                   data_format: str) -> None:
    channels = shape[-1] if data_format == "NHWC" else shape[1]
    args = [sample(shape, F32, seed=4, edges=False), *_statistics(channels, 4),
            sample(shape, F32, seed=5, edges=False)]
    _check(_gradients(is_training, data_format), args, "FusedBatchNormGradV3",
           "FusedBatchNormGradV3")


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_fused_batch_norm_gradient_half(dtype: Any) -> None:
    args = [sample((4, 3, 3, 5), dtype, seed=6, edges=False), *_statistics(5, 6),
            sample((4, 3, 3, 5), dtype, seed=7, edges=False)]
    _check(_gradients(True), args, "FusedBatchNormGradV3", "FusedBatchNormGradV3")


@pytest.mark.parametrize("op_name", ["FusedBatchNormGrad", "FusedBatchNormGradV2"])
def test_fused_batch_norm_grad_v1_v2(op_name: str) -> None:
    op = getattr(tf.raw_ops, op_name)

    def fn(dy: tf.Tensor, x: tf.Tensor, scale: tf.Tensor, mean: tf.Tensor,
           variance: tf.Tensor) -> list[tf.Tensor]:
        return list(op(y_backprop=dy, x=x, scale=scale, reserve_space_1=mean,
                       reserve_space_2=variance, epsilon=1e-3, is_training=True))[:3]

    statistics = _statistics(3, 8)
    _check(fn, [sample((2, 3, 4, 3), F32, seed=8, edges=False),
                sample((2, 3, 4, 3), F32, seed=9, edges=False), statistics[0],
                statistics[2], statistics[3]], op_name, "FusedBatchNormGradV3")


def test_batch_norm_layer_in_both_modes() -> None:
    """A conv-free Keras-style BatchNorm training step through tl.function, auto and
    must-compile: forward, running statistics and gradients compiled, TF's values."""
    x = sample((8, 6, 6, 4), F32, seed=10, edges=False)
    upstream = sample((8, 6, 6, 4), F32, seed=11, edges=False)
    scale, offset, mean, variance = _statistics(4, 10)
    fn = _gradients(True, factor=0.1)
    tensors = [tf.constant(a) for a in (x, scale, offset, mean, variance, upstream)]
    check_in_both_modes(fn, tensors, "model gradient",
                        {"FusedBatchNormV3", "FusedBatchNormGradV3"})


# For test_clustering_ops.test_every_registered_op_is_tested.
TESTED_OPS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
                        "FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"})
