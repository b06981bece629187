"""SpaceToBatchND and BatchToSpaceND, SpaceToDepth and DepthToSpace lowered to HLO,
against TF: block shapes of 1 to 3 dims, paddings and crops, trailing dims, 1- and
0-sized dims, every dtype family, NaN and ±inf (moved, never computed), NCHW depth ops
(against TF's XLA), gradients (each op of a pair is the other's), dilated convolutions
built on them, unknown batch sizes, and `tl.function` in both modes."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, check_in_both_modes, sample, tf_result, trace
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.clustering.mark import mark
from tfxla_lite.driver import build_program
from tfxla_lite.runtime import loader

F16, BF16, F32, F64 = np.float16, tf.bfloat16.as_numpy_dtype, np.float32, np.float64

CASES = [
    # (input shape, block_shape, paddings): BatchToSpaceND undoes each with crops = paddings
    ((1, 4, 4, 1), [2, 2], [[0, 0], [0, 0]]),
    ((2, 5, 7, 3), [2, 3], [[1, 0], [0, 2]]),
    ((3, 6, 2), [3], [[2, 1]]),  # one block dim, one trailing dim
    ((2, 4), [2], [[0, 0]]),  # no trailing dims
    ((1, 2, 3, 4, 2), [2, 1, 2], [[0, 0], [1, 1], [1, 3]]),  # three block dims
    ((2, 3, 3, 2, 5), [3, 3], [[0, 0], [3, 3]]),  # two trailing dims
    ((1, 1, 1, 1), [1, 1], [[0, 0], [0, 0]]),
    ((1, 1, 1, 2), [4, 2], [[1, 2], [0, 1]]),  # all padding but one row
    ((0, 4, 2, 3), [2, 2], [[0, 0], [1, 1]]),  # no batch
    ((2, 0, 4, 3), [2, 2], [[1, 1], [0, 0]]),  # no rows: padding alone
    ((2, 4, 4, 0), [2, 2], [[0, 0], [0, 0]]),  # no channels
    ((1, 2, 0, 3), [1, 2], [[0, 0], [0, 0]]),  # an empty dim under a block of 2
]

# Read by test_clustering_ops.test_every_registered_op_is_tested.
TESTED_OPS = frozenset({"SpaceToBatchND", "BatchToSpaceND", "SpaceToDepth", "DepthToSpace"})


def _round_trip(block: list[int], paddings: list[list[int]]) -> Any:
    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        batched = tf.space_to_batch_nd(x, block, paddings)
        return [batched, tf.batch_to_space(batched * 2, block, paddings)]

    return fn


@pytest.mark.parametrize("case", range(len(CASES)))
def test_space_to_batch_and_back(case: int) -> None:
    shape, block, paddings = CASES[case]
    check_against_tf(_round_trip(block, paddings), [sample(shape, F32, seed=case)],
                     "SpaceToBatchND")


@pytest.mark.parametrize("dtype", [F16, BF16, F64, np.int32, np.int64])
def test_dtypes(dtype: Any) -> None:
    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        batched = tf.space_to_batch_nd(x, [2, 3], [[1, 0], [0, 2]])
        return [batched, tf.batch_to_space(batched, [2, 3], [[1, 0], [0, 2]])]

    check_against_tf(fn, [sample((2, 5, 7, 3), dtype)], "SpaceToBatchND")


def test_batch_to_space_crops_more_than_padding() -> None:
    """Crops that cut into real rows, not only the padding SpaceToBatchND added."""

    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.batch_to_space(x, [2, 3], [[1, 2], [2, 0]])

    check_against_tf(fn, [sample((12, 3, 2, 2), F32)], "BatchToSpaceND")


def test_int64_block_shape_and_paddings() -> None:
    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        block = tf.constant([2, 2], tf.int64)
        batched = tf.space_to_batch_nd(x, block, tf.constant([[1, 1], [0, 2]], tf.int64))
        return [batched, tf.batch_to_space(batched, block, tf.constant([[0, 1], [1, 1]],
                                                                        tf.int64))]

    check_against_tf(fn, [sample((2, 4, 6, 3), F32)], "SpaceToBatchND")


def _gradients(x: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
    with tf.GradientTape() as tape:
        tape.watch(x)
        batched = tf.space_to_batch_nd(x, [2, 3], [[1, 0], [0, 2]])
        back = tf.batch_to_space(tf.sin(batched), [3, 2], [[0, 1], [1, 1]])
        loss = tf.reduce_sum(back * upstream)
    return [back, tape.gradient(loss, x)]


def test_gradients() -> None:
    """The gradient of SpaceToBatchND is a BatchToSpaceND and the other way round."""
    x, upstream = sample((2, 5, 7, 3), F32, edges=False), sample((2, 8, 4, 3), F32, seed=1)
    concrete = trace(_gradients, [x, upstream])
    types = [op.type for op in concrete.graph.get_operations()]
    assert types.count("SpaceToBatchND") == 2 and types.count("BatchToSpaceND") == 2
    check_against_tf(_gradients, [x, upstream], "Sin")


def test_dilated_convolution() -> None:
    """`tf.nn.with_space_to_batch` around a VALID convolution: what atrous convolutions
    are made of. The convolution itself is compiled or not by the options."""
    filters = tf.constant(sample((3, 3, 3, 4), F32, seed=3, edges=False))

    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.with_space_to_batch(
            x, dilation_rate=[2, 2], padding="SAME", filter_shape=[3, 3],
            op=lambda inp, num_spatial_dims, padding: tf.nn.conv2d(inp, filters, 1, padding))

    x = tf.constant(sample((2, 9, 10, 3), F32, edges=False))
    check_against_tf(fn, [x.numpy()], "Conv2D")
    expected = fn(x).numpy()
    for jit_compile in (None, True):
        compiled = tl.function(fn, jit_compile=jit_compile,
                               options=tl.Options(min_cluster_size=1, verify=True,
                                                  compile_convolutions=True,
                                                  strict_jit_compile=bool(jit_compile)))
        assert_close(compiled(x).numpy(), expected, "Conv2D", f"jit_compile={jit_compile}")
        hlo = compiled.experimental_get_compiler_ir(x)(stage="hlo")
        assert 'op_type="SpaceToBatchND"' in hlo and 'op_type="BatchToSpaceND"' in hlo


def test_in_both_modes() -> None:
    x = tf.constant(sample((2, 5, 7, 3), F32))
    upstream = tf.constant(sample((2, 8, 4, 3), F32, seed=1))
    check_in_both_modes(_gradients, [x, upstream], "Sin", {"SpaceToBatchND", "BatchToSpaceND"})


def _reasons(fn: Any, args: list[np.ndarray], op_type: str) -> list[str | None]:
    decisions = mark(trace(fn, args).graph)
    return [d.reason for d in decisions.values() if d.op_type == op_type]


def test_runtime_block_shape_refused() -> None:
    """A block shape known only at run time stays in TF."""

    def runtime_block(x: tf.Tensor, block: tf.Tensor) -> tf.Tensor:
        return tf.space_to_batch_nd(x, block, [[0, 0], [0, 0]])

    args = [sample((1, 4, 4, 1), F32), np.array([2, 2], np.int32)]
    assert _reasons(runtime_block, args, "SpaceToBatchND") == ["input 1 must be a constant"]



def test_keras_dilated_conv2d_and_its_gradients() -> None:
    """Keras 3's Conv2D with a dilation rate builds SpaceToBatchND → Conv2D →
    BatchToSpaceND; its gradient the same ops the other way round."""
    keras.utils.set_random_seed(0)
    layer = keras.layers.Conv2D(4, 3, dilation_rate=2, padding="same")
    layer.build((None, 9, 10, 3))

    def fn(x: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(y * upstream)
        return [y, *tape.gradient(loss, [x, *layer.trainable_variables])]

    x = tf.constant(sample((2, 9, 10, 3), F32, edges=False))
    upstream = tf.constant(sample((2, 9, 10, 4), F32, seed=1, edges=False))
    types = {op.type for op in trace(fn, [x.numpy(), upstream.numpy()]).graph.get_operations()}
    assert {"SpaceToBatchND", "BatchToSpaceND"} <= types
    expected = [t.numpy() for t in fn(x, upstream)]
    for jit_compile in (None, True):
        compiled = tl.function(fn, jit_compile=jit_compile,
                               options=tl.Options(min_cluster_size=1, verify=True,
                                                  compile_convolutions=True,
                                                  strict_jit_compile=bool(jit_compile)))
        for got, want in zip(compiled(x, upstream), expected, strict=True):
            assert_close(got.numpy(), want, "Conv2D", f"jit_compile={jit_compile}")
        stuck = {f.op_type for f in compiled.explain(x, upstream).fallbacks}
        assert not stuck & {"SpaceToBatchND", "BatchToSpaceND"}, stuck


def test_unknown_batch_compiles_per_shape() -> None:
    spec = [tf.TensorSpec([None, 5, 7, 3], tf.float32), tf.TensorSpec([None, 8, 4, 3])]
    fn = tf.function(_gradients, input_signature=spec)
    program = build_program(fn.get_concrete_function(), None,
                            tl.Options(min_cluster_size=1, verify=True), dynamic=True)
    try:
        assert program.dynamic_clusters
        assert not {f.op_type for f in program.report.fallbacks} & {
            "SpaceToBatchND", "BatchToSpaceND"}
        for batch in (2, 1, 0):
            x, upstream = sample((batch, 5, 7, 3), F32), sample((batch, 8, 4, 3), F32, seed=1)
            for got, want in zip(program.run(x, upstream), fn(x, upstream), strict=True):
                assert_close(got.numpy(), want.numpy(), "Sin", f"batch {batch}")
    finally:
        for dynamic_cluster in program.dynamic_clusters:
            loader.unregister(dynamic_cluster.key)


DEPTH_CASES = [
    # (SpaceToDepth input NHWC, block_size)
    ((2, 4, 6, 3), 2),
    ((1, 6, 3, 2), 3),
    ((3, 8, 8, 1), 4),
    ((1, 2, 2, 5), 2),
    ((0, 4, 4, 2), 2),  # no batch
    ((2, 4, 4, 0), 2),  # no channels
]


def _depth_round_trip(block: int, data_format: str = "NHWC") -> Any:
    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        deep = tf.nn.space_to_depth(x, block, data_format=data_format)
        return [deep, tf.nn.depth_to_space(deep * 2, block, data_format=data_format)]

    return fn


@pytest.mark.parametrize("case", range(len(DEPTH_CASES)))
def test_space_to_depth_and_back(case: int) -> None:
    shape, block = DEPTH_CASES[case]
    check_against_tf(_depth_round_trip(block), [sample(shape, F32, seed=case)], "SpaceToDepth")


@pytest.mark.parametrize("dtype", [F16, BF16, F64, np.int32, np.int64, np.bool_])
def test_depth_dtypes(dtype: Any) -> None:
    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        deep = tf.nn.space_to_depth(x, 2)
        return [deep, tf.nn.depth_to_space(deep, 2)]

    check_against_tf(fn, [sample((2, 4, 6, 3), dtype)], "SpaceToDepth")


def test_depth_nchw() -> None:
    """TF's CPU kernels refuse NCHW; TF's XLA is the reference there."""
    fn = _depth_round_trip(2, "NCHW")
    x = sample((2, 3, 4, 6), F32)
    check_against_tf(fn, [x], "SpaceToDepth", expected=tf_result(fn, [x], xla=True))


def _depth_gradients(x: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
    with tf.GradientTape() as tape:
        tape.watch(x)
        shuffled = tf.nn.depth_to_space(tf.sin(tf.nn.space_to_depth(x, 2)), 3)
        loss = tf.reduce_sum(shuffled * upstream)
    return [shuffled, tape.gradient(loss, x)]


def test_depth_gradients_in_both_modes() -> None:
    """DepthToSpace is SpaceToDepth's gradient and the other way round."""
    x, upstream = sample((2, 6, 6, 9), F32), sample((2, 9, 9, 4), F32, seed=1)
    types = [op.type for op in trace(_depth_gradients, [x, upstream]).graph.get_operations()]
    assert types.count("SpaceToDepth") == 2 and types.count("DepthToSpace") == 2
    check_against_tf(_depth_gradients, [x, upstream], "Sin")
    check_in_both_modes(_depth_gradients, [tf.constant(x), tf.constant(upstream)], "Sin",
                        {"SpaceToDepth", "DepthToSpace"})
