"""ResizeBilinear, ResizeNearestNeighbor, ResizeBicubic and their gradients lowered to HLO,
against TF's CPU kernels: upsampling, downsampling, odd and equal sizes, size-1 images
and outputs, no batch, align_corners / half_pixel_centers, f32/f64/f16/bf16 and
integers, NaN and ±inf in images and in gradients, `tf.GradientTape` through
`tf.image.resize` and Keras's UpSampling2D and Resizing, and `tl.function` in both
modes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, check_in_both_modes, sample, trace
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite import coverage
from tfxla_lite.clustering.mark import mark
from tfxla_lite.clustering.rules_resize import (
    bilinear_taps,
    nearest_taps,
    periodic_progressions,
    tf_resize_faster,
)
from tfxla_lite.driver import build_program
from tfxla_lite.runtime import loader

F16, BF16, F32, F64 = np.float16, tf.bfloat16.as_numpy_dtype, np.float32, np.float64
RAW = tf.raw_ops

IMAGE = (2, 5, 7, 3)
SIZES = [
    (10, 14),  # twice
    (11, 9),  # odd factors, one axis barely up
    (3, 4),  # down
    (2, 3),  # down by more than two on one axis
    (5, 7),  # the same size: TF's plain cast
    (5, 12),  # one axis unchanged
    (1, 1),
    (9, 3),
]
# (align_corners, half_pixel_centers): TF refuses both together, but in the nearest
# neighbor gradient.
PIXEL_RULES = [(False, False), (True, False), (False, True)]
RESIZES = {"bilinear": RAW.ResizeBilinear, "nearest": RAW.ResizeNearestNeighbor,
           "bicubic": RAW.ResizeBicubic}
OP_TYPES = {"bilinear": "ResizeBilinear", "nearest": "ResizeNearestNeighbor",
            "bicubic": "ResizeBicubic"}
GRADIENT_OP_TYPES = {"bilinear": "ResizeBilinearGrad", "nearest": "ResizeNearestNeighborGrad",
                     "bicubic": "ResizeBicubicGrad"}
# Read by test_clustering_ops.test_every_registered_op_is_tested.
TESTED_OPS = frozenset(OP_TYPES.values()) | frozenset(GRADIENT_OP_TYPES.values())


def _forward(kind: str, sizes: list[tuple[int, int]], align: bool, half: bool
             ) -> Callable[[tf.Tensor], list[tf.Tensor]]:
    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        return [RESIZES[kind](images=x, size=size, align_corners=align,
                              half_pixel_centers=half) for size in sizes]

    return fn


def _gradients(kind: str, sizes: list[tuple[int, int]], align: bool, half: bool
               ) -> Callable[..., list[tf.Tensor]]:
    """The raw gradient ops, one per resized size, onto the image's size."""

    def fn(image: tf.Tensor, *grads: tf.Tensor) -> list[tf.Tensor]:
        if kind in ("bilinear", "bicubic"):
            op = RAW.ResizeBilinearGrad if kind == "bilinear" else RAW.ResizeBicubicGrad
            return [op(grads=g, original_image=image, align_corners=align,
                       half_pixel_centers=half) for g in grads]
        return [RAW.ResizeNearestNeighborGrad(grads=g, size=image.shape[1:3],
                                              align_corners=align, half_pixel_centers=half)
                for g in grads]

    return fn


def _grads_for(image_shape: tuple[int, ...], sizes: list[tuple[int, int]], dtype: Any
               ) -> list[np.ndarray]:
    batch, channels = image_shape[0], image_shape[3]
    return [sample((batch, *size, channels), dtype, seed=20 + i) for i, size in enumerate(sizes)]


def _bicubic_once(kinds: list[str]) -> list[Any]:
    """(rules, kind) pairs where bicubic keeps one rule set in the default run: each of its
    compiles takes tens of seconds on 2 cores (the others run under `-m slow`)."""
    return [pytest.param(rules, kind, marks=[pytest.mark.slow]
                         if kind == "bicubic" and rules != PIXEL_RULES[1] else [])
            for rules in PIXEL_RULES for kind in kinds]


@pytest.mark.parametrize("kind", list(RESIZES))
@pytest.mark.parametrize("rules", PIXEL_RULES)
def test_resize(kind: str, rules: tuple[bool, bool]) -> None:
    check_against_tf(_forward(kind, SIZES, *rules), [sample(IMAGE, F32)],
                     OP_TYPES[kind])


@pytest.mark.parametrize("rules, kind", _bicubic_once(list(RESIZES)))
def test_resize_gradient(kind: str, rules: tuple[bool, bool]) -> None:
    """Gradients with NaN and ±inf among them: TF's kernels multiply even zero weights."""
    image = sample(IMAGE, F32, edges=False)
    op_type = GRADIENT_OP_TYPES[kind]
    check_against_tf(_gradients(kind, SIZES, *rules), [image, *_grads_for(IMAGE, SIZES, F32)],
                     op_type)


# Integer factors, whose index tables have structure (`periodic_progressions`): the
# lowering takes strided slices and interior pads instead of gathers.
FACTOR_IMAGE = (2, 12, 12, 3)
FACTOR_SIZES = [(4, 3), (6, 4), (24, 36), (12, 6), (3, 24)]


@pytest.mark.parametrize("rules, kind", _bicubic_once(list(RESIZES)))
def test_integer_factors(kind: str, rules: tuple[bool, bool]) -> None:
    """Up and down by 2, 3 and 4 per axis, forward and gradient (NaN and ±inf in both)."""
    check_against_tf(_forward(kind, FACTOR_SIZES, *rules), [sample(FACTOR_IMAGE, F32)],
                     OP_TYPES[kind])
    image = sample(FACTOR_IMAGE, F32, edges=False)
    check_against_tf(_gradients(kind, FACTOR_SIZES, *rules),
                     [image, *_grads_for(FACTOR_IMAGE, FACTOR_SIZES, F32)],
                     GRADIENT_OP_TYPES[kind])


def test_integer_factor_gradients_half_floats() -> None:
    """The structured nearest-neighbor gradient sums 2-byte floats in float32 (TF's
    kernel rounds each partial sum: at six terms, x2 by x3, they differ beyond the
    tolerance, with or without the structure; at most four here)."""
    sizes = [s for s in FACTOR_SIZES if s != (24, 36)]
    for dtype in (F16, BF16):
        image = sample(FACTOR_IMAGE, dtype, edges=False)
        check_against_tf(_gradients("nearest", sizes, False, True),
                         [image, *_grads_for(FACTOR_IMAGE, sizes, dtype)],
                         "ResizeNearestNeighborGrad")


def test_periodic_progressions() -> None:
    assert periodic_progressions(np.array([1, 5, 9, 13])) == (1, [(1, 4)])
    assert periodic_progressions(np.array([0, 0, 1, 1, 2, 2])) == (2, [(0, 1), (0, 1)])
    assert periodic_progressions(np.array([4, 0, 4, 1, 4, 2])) == (2, [(4, 0), (0, 1)])
    assert periodic_progressions(np.array([7])) == (1, [(7, 0)])
    # Edges clamped (a half-pixel bilinear x2 upsampling) or a falling run: no structure.
    assert periodic_progressions(bilinear_taps(64, 128, False, True)[0]) is None
    assert periodic_progressions(np.arange(9)[::-1]) is None


def _gradient_op(kind: str, image_size: tuple[int, int], size: tuple[int, int]
                 ) -> tuple[tf.Operation, tf.Graph]:
    shape = (1, *image_size, 2)
    graph = trace(_gradients(kind, [size], False, True),
                  [sample(shape, F32), *_grads_for(shape, [size], F32)]).graph
    (op,) = [op for op in graph.get_operations() if op.type == GRADIENT_OP_TYPES[kind]]
    return op, graph


def test_downsampling_gradients_stay_on_tf_kernels_in_auto_mode() -> None:
    """The shape rule: a bilinear or bicubic gradient of a downsampling resize (along
    either axis) is left to TF's kernel in auto-clustering; upsampling compiles, and
    must-compile compiles both."""
    assert tf_resize_faster(_gradient_op("bilinear", (16, 16), (4, 4))[0])
    assert tf_resize_faster(_gradient_op("bicubic", (8, 16), (8, 4))[0])
    assert not tf_resize_faster(_gradient_op("bilinear", (4, 4), (8, 8))[0])
    assert not tf_resize_faster(_gradient_op("bicubic", (4, 4), (4, 4))[0])
    shape, size = (1, 16, 16, 2), (4, 4)
    args = [tf.constant(sample(shape, F32)), *map(tf.constant, _grads_for(shape, [size], F32))]
    fn = _gradients("bilinear", [size], False, True)
    auto = tl.function(fn, options=tl.Options(min_cluster_size=1))
    (left,) = [f for f in auto.explain(*args).fallbacks if f.op_type == "ResizeBilinearGrad"]
    assert "rules_resize.py" in left.reason
    strict = tl.function(fn, jit_compile=True, options=tl.Options(strict_jit_compile=True))
    assert_close(strict(*args)[0].numpy(), fn(*args)[0].numpy(), "ResizeBilinearGrad")
    assert not [f for f in strict.explain(*args).fallbacks if f.op_type == "ResizeBilinearGrad"]


def test_nearest_gradient_with_both_pixel_rules() -> None:
    """ResizeNearestNeighborGrad alone takes align_corners with half_pixel_centers."""
    image = sample(IMAGE, F32, edges=False)
    check_against_tf(_gradients("nearest", SIZES, True, True),
                     [image, *_grads_for(IMAGE, SIZES, F32)], "ResizeNearestNeighborGrad")


@pytest.mark.parametrize("image_shape", [(1, 1, 1, 2), (3, 1, 4, 1), (0, 4, 3, 2)])
def test_small_images(image_shape: tuple[int, ...]) -> None:
    """From one pixel, from one row, and with no batch."""
    sizes = [(4, 3), (1, 1), (2, 5)]
    for align, half in PIXEL_RULES:
        fn = _forward("bilinear", sizes, align, half)
        check_against_tf(lambda x, fn=fn, align=align, half=half: fn(x) + _forward(
            "nearest", sizes, align, half)(x), [sample(image_shape, F32)], "ResizeBilinear")
        grads = _grads_for(image_shape, sizes, F32)
        both = (lambda image, *g, align=align, half=half:
                _gradients("bilinear", sizes, align, half)(image, *g)
                + _gradients("nearest", sizes, align, half)(image, *g))
        check_against_tf(both, [sample(image_shape, F32, edges=False), *grads],
                         "ResizeBilinearGrad")


@pytest.mark.parametrize("dtype", [F16, BF16, F64, np.int32, np.int64])
def test_resize_dtypes(dtype: Any) -> None:
    """Bilinear and bicubic give float32 whatever the image's dtype; nearest keeps it."""
    sizes = [(10, 14), (3, 4), (5, 7)]

    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        return (_forward("bilinear", sizes, False, True)(x)
                + _forward("nearest", sizes, False, False)(x)
                + _forward("bilinear", sizes, True, False)(x)
                + _forward("bicubic", sizes, False, True)(x)
                + _forward("bicubic", sizes, False, False)(x))

    check_against_tf(fn, [sample(IMAGE, dtype)], "ResizeBilinear")


@pytest.mark.parametrize("dtype", [F16, BF16, F64])
def test_gradient_dtypes(dtype: Any) -> None:
    """The bilinear gradient's incoming gradient is float32 (the forward's output dtype);
    its result takes the image's dtype. The nearest one is all in the image's dtype."""
    sizes = [(10, 14), (3, 4)]
    image = sample(IMAGE, dtype, edges=False)

    def fn(image: tf.Tensor, *grads: tf.Tensor) -> list[tf.Tensor]:
        half = len(grads) // 2
        return (_gradients("bilinear", sizes, False, True)(image, *grads[:half])
                + _gradients("nearest", sizes, False, True)(image, *grads[half:]))

    grads = _grads_for(IMAGE, sizes, F32) + _grads_for(IMAGE, sizes, dtype)
    check_against_tf(fn, [image, *grads], "ResizeBilinearGrad")


def test_bicubic_gradient_float64() -> None:
    """TF's bicubic gradient kernels are float32 and float64 only."""
    sizes = [(10, 14), (3, 4), (5, 7)]
    check_against_tf(_gradients("bicubic", sizes, False, True),
                     [sample(IMAGE, F64, edges=False), *_grads_for(IMAGE, sizes, F32)],
                     "ResizeBicubicGrad")


def test_nearest_gradient_integers() -> None:
    sizes = [(10, 14), (3, 4), (11, 9)]
    check_against_tf(_gradients("nearest", sizes, False, False),
                     [sample(IMAGE, np.int32), *_grads_for(IMAGE, sizes, np.int32)],
                     "ResizeNearestNeighborGrad")


def _through_tape(resize: Callable[[tf.Tensor], tf.Tensor]) -> Callable[..., list[tf.Tensor]]:
    def fn(x: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = resize(x)
            loss = tf.reduce_sum(y * upstream)
        return [y, tape.gradient(loss, x)]

    return fn


TAPE_RESIZES = {
    "image.resize bilinear": lambda x: tf.image.resize(x, (11, 9)),
    "image.resize nearest": lambda x: tf.image.resize(x, (11, 9), method="nearest"),
    "v1 nearest align_corners": lambda x: tf.compat.v1.image.resize_nearest_neighbor(
        x, (3, 13), align_corners=True),
    "v1 align_corners": lambda x: tf.compat.v1.image.resize_bilinear(x, (3, 13),
                                                                   align_corners=True),
    "Keras UpSampling2D bilinear": keras.layers.UpSampling2D((2, 3), interpolation="bilinear"),
    "image.resize bicubic": lambda x: tf.image.resize(x, (11, 9), method="bicubic"),
    "v1 bicubic align_corners": lambda x: tf.compat.v1.image.resize_bicubic(
        x, (3, 13), align_corners=True),
}


@pytest.mark.parametrize("name", list(TAPE_RESIZES))
def test_gradient_tape(name: str) -> None:
    fn = _through_tape(TAPE_RESIZES[name])
    x = sample(IMAGE, F32, edges=False)
    out_shape = fn(tf.constant(x), tf.ones((1,)))[0].shape
    upstream = sample(tuple(out_shape), F32, seed=4, edges=False)
    grad_ops = {op.type for op in trace(fn, [x, upstream]).graph.get_operations()}
    (op_type,) = grad_ops & set(GRADIENT_OP_TYPES.values())
    check_against_tf(fn, [x, upstream], op_type)


def test_in_both_modes() -> None:
    def fn(x: tf.Tensor, upstream: tf.Tensor, upstream_nearest: tf.Tensor) -> list[tf.Tensor]:
        bilinear = _through_tape(lambda t: tf.image.resize(t, (11, 9)))(x, upstream)
        nearest = _through_tape(lambda t: tf.image.resize(t, (3, 4), method="nearest"))(
            x, upstream_nearest)
        bicubic = _through_tape(lambda t: tf.image.resize(t, (11, 9), method="bicubic"))(
            x, upstream)
        return bilinear + nearest + bicubic

    tensors = [tf.constant(sample(IMAGE, F32)), tf.constant(sample((2, 11, 9, 3), F32, seed=1)),
               tf.constant(sample((2, 3, 4, 3), F32, seed=2))]
    check_in_both_modes(fn, tensors, "ResizeBilinearGrad",
                        set(OP_TYPES.values()) | set(GRADIENT_OP_TYPES.values()))


def test_nearest_taps_round_half_away_from_zero() -> None:
    """align_corners rounds with roundf: 2 pixels onto 5 read at 0, 0.25, 0.5, 0.75, 1,
    and 0.5 goes to 1 (NumPy's round would take it to 0)."""
    assert nearest_taps(2, 5, True, False).tolist() == [0, 0, 1, 1, 1]
    assert nearest_taps(4, 3, False, True).tolist() == [0, 2, 3]


def _reason(fn: Callable[..., Any], args: list[np.ndarray], op_type: str) -> str | None:
    (decision,) = [d for d in mark(trace(fn, args).graph).values() if d.op_type == op_type]
    return decision.reason


def test_sizes_tf_refuses_stay_in_tf() -> None:
    """An output size of 0 and both pixel rules together make TF's kernels raise: those ops
    stay in TF, to raise there; a size known only at run time stays too."""

    def empty(x: tf.Tensor) -> tf.Tensor:
        return RAW.ResizeBilinear(images=x, size=[0, 3])

    reason = _reason(empty, [sample(IMAGE, F32)], "ResizeBilinear")
    assert reason is not None and "size of 0" in reason

    def both_rules(x: tf.Tensor) -> tf.Tensor:
        return RAW.ResizeNearestNeighbor(images=x, size=[3, 3], align_corners=True,
                                         half_pixel_centers=True)

    reason = _reason(both_rules, [sample(IMAGE, F32)], "ResizeNearestNeighbor")
    assert reason is not None and "both set" in reason

    def runtime_size(x: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
        return RAW.ResizeBilinear(images=x, size=size)

    reason = _reason(runtime_size, [sample(IMAGE, F32), np.array([3, 3], np.int32)],
                     "ResizeBilinear")
    assert reason is not None and "not fully static" in reason


def _fit(compiled: bool, x: np.ndarray, y: np.ndarray) -> tuple[list[float], dict[str, int]]:
    """Three steps of a model of Keras's resizing layers, from seed 0: per-step losses and
    what stayed in TF. Plain TF runs it without jit_compile: TF's XLA has no
    ResizeNearestNeighborGrad."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6, 5, 2)),
        keras.layers.Dense(3),
        keras.layers.UpSampling2D((2, 3), interpolation="bilinear"),
        keras.layers.Resizing(7, 9, interpolation="nearest"),
        keras.layers.Resizing(4, 4),
        keras.layers.Flatten(),
        keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=compiled)
    losses: list[float] = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))
    if compiled:
        tl.enable()
    try:
        with coverage.record() as recorded:
            model.fit(x, y, epochs=1, batch_size=4, shuffle=False, verbose=0,
                      callbacks=[record])
    finally:
        tl.disable()
    return losses, coverage.total(recorded).left_out


def test_keras_resizing_layers_train_compiled() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 6, 5, 2)).astype(np.float32)
    y = rng.normal(size=(12, 1)).astype(np.float32)
    plain, _ = _fit(False, x, y)
    losses, left = _fit(True, x, y)
    np.testing.assert_allclose(losses, plain, rtol=1e-5)
    assert not [reason for reason in left if reason.startswith("Resize")], left


def test_unknown_batch_compiles_per_shape() -> None:
    """Keras retraces with the batch as None: the cluster compiles per concrete batch."""
    spec = [tf.TensorSpec([None, 5, 7, 3], tf.float32), tf.TensorSpec([None, 11, 9, 3])]

    @tf.function(input_signature=spec)
    def fn(x: tf.Tensor, upstream: tf.Tensor) -> list[tf.Tensor]:
        return _through_tape(lambda t: tf.image.resize(t, (11, 9)))(x, upstream)

    program = build_program(fn.get_concrete_function(), None,
                            tl.Options(min_cluster_size=1, verify=True), dynamic=True)
    try:
        assert program.dynamic_clusters
        assert not {f.op_type for f in program.report.fallbacks} & {
            "ResizeBilinear", "ResizeBilinearGrad"}
        for batch in (2, 3, 0):
            x, upstream = sample((batch, 5, 7, 3), F32), sample((batch, 11, 9, 3), F32, seed=1)
            for got, want in zip(program.run(x, upstream), fn(x, upstream), strict=True):
                assert_close(got.numpy(), want.numpy(), "ResizeBilinearGrad", f"batch {batch}")
    finally:
        for dynamic_cluster in program.dynamic_clusters:
            loader.unregister(dynamic_cluster.key)


# 1, 3 and 7 take minutes each on 2 cores: they run under `-m slow`.
@pytest.mark.parametrize("in_size", [pytest.param(n, marks=pytest.mark.slow) if n in (1, 3, 7)
                                     else n for n in (1, 2, 3, 7, 13, 33)])
def test_index_arithmetic_sweep(in_size: int) -> None:
    """Every pixel rule from `in_size` rows to many sizes, on distinct pixel values, so a
    row read from the wrong place shows (evaluator only: the indices are constants)."""
    out_sizes = [1, 2, 3, 5, 8, 31, 64, 100, 257]
    image = np.arange(in_size * 3, dtype=np.float32).reshape(1, in_size, 3, 1) * 1.5 + 0.25
    grads = [sample((1, size, 3, 1), F32, seed=size, edges=False) for size in out_sizes]

    def fn(x: tf.Tensor, *grads: tf.Tensor) -> list[tf.Tensor]:
        results = []
        for align, half in PIXEL_RULES:
            for kind in RESIZES:
                results += _forward(kind, [(s, 3) for s in out_sizes], align, half)(x)
                results += _gradients(kind, [(s, 3) for s in out_sizes], align, half)(
                    x, *grads)
        return results

    check_against_tf(fn, [image, *grads], "ResizeBilinearGrad", compiled=False)
