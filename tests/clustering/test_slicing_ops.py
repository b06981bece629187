"""Slicing, padding, tiling, splitting, Einsum and constant-shape ops against TF itself,
over shapes × dtypes (zero-size dims included), and the ops left out with their reasons."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, inputs, sample, trace

from tfxla_lite.clustering import why_not_compilable

F32, F64, I32, I64, BOOL = np.float32, np.float64, np.int32, np.int64, np.bool_
DTYPES = [F32, I32, BOOL]
DTYPE_IDS = ["float32", "int32", "bool"]
raw = tf.raw_ops


def _per_case(cases: list[tuple[Any, ...]], apply: Callable[..., Any]
              ) -> Callable[..., list[Any]]:
    def fn(*xs: Any) -> list[Any]:
        return [apply(x, *case[1:]) for x, case in zip(xs, cases)]

    return fn


# -- strided slices ---------------------------------------------------------------------------
STRIDED_CASES: list[tuple[tuple[int, ...], Callable[[Any], Any]]] = [
    ((6,), lambda x: x[1:4]),
    ((6,), lambda x: x[::2]),
    ((6,), lambda x: x[-1]),
    ((6,), lambda x: x[5:1]),
    ((6,), lambda x: x[-100:100:4]),
    ((4, 5), lambda x: x[1:-1:2, ::3]),
    ((4, 5), lambda x: x[:, None, 1:]),
    ((4, 5), lambda x: x[..., 1]),
    ((4, 5), lambda x: x[tf.newaxis]),
    ((2, 3, 4), lambda x: x[..., tf.newaxis, 0]),
    ((2, 3, 4), lambda x: x[1, ..., 1:3]),
    ((2, 3, 4), lambda x: x[:, -2:, ::2]),
    ((6,), lambda x: x[::-1]),
    ((6,), lambda x: x[4:0:-2]),
    ((6,), lambda x: x[-2::-3]),
    ((6,), lambda x: x[100:-100:-1]),
    ((6,), lambda x: x[1:4:-1]),
    ((4, 5), lambda x: x[::-1, 3::-2]),
    ((2, 3, 4), lambda x: x[..., ::-1, 0]),
    ((0, 3), lambda x: x[:, 1]),
    ((3, 0), lambda x: x[1:, :]),
    ((0, 3), lambda x: x[::-1]),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_slice(dtype: Any) -> None:
    args = inputs([[shape] for shape, _ in STRIDED_CASES], [dtype])
    check_against_tf(lambda *xs: [f(x) for x, (_, f) in zip(xs, STRIDED_CASES)], args,
                     "StridedSlice")


GRAD_CASES = [c for c in STRIDED_CASES if 0 not in c[0]]


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_strided_slice_grad(dtype: Any) -> None:
    """TF's own gradient of each slice (StridedSliceGrad), fed a random dy."""
    xs = inputs([[shape] for shape, _ in GRAD_CASES], [dtype], edges=False)
    dys = [sample(np.shape(f(tf.constant(x))), dtype, seed=50 + k)
           for k, (x, (_, f)) in enumerate(zip(xs, GRAD_CASES))]

    def fn(*args: Any) -> list[Any]:
        results = []
        for (_, f), x, dy in zip(GRAD_CASES, args[:len(GRAD_CASES)], args[len(GRAD_CASES):]):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = f(x)
            results.append(tape.gradient(y, x, output_gradients=dy))
        return results

    check_against_tf(fn, xs + dys, "StridedSliceGrad")


def test_slice_with_a_runtime_begin_stays_in_tf_with_a_reason() -> None:
    graph = trace(lambda x, i: x[i::-1] * 2.0, [np.zeros(4, np.float32),
                                               np.zeros((), np.int32)]).graph
    (op,) = [op for op in graph.get_operations() if op.type == "StridedSlice"]
    assert "constant" in str(why_not_compilable(op))


# -- pads, tiles, splits ----------------------------------------------------------------------
PAD_CASES = [((2, 3), [[1, 2], [0, 3]]), ((4,), [[0, 0]]), ((0, 2), [[1, 1], [2, 0]]),
             ((), np.zeros((0, 2), np.int32)), ((1, 2, 1), [[0, 1], [1, 0], [2, 2]])]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_pad(dtype: Any) -> None:
    args = inputs([[shape] for shape, _ in PAD_CASES], [dtype])
    fill = np.array(True if dtype == BOOL else 5, dtype)
    check_against_tf(_per_case(PAD_CASES, lambda x, p: tf.pad(x, p)), args, "Pad")
    check_against_tf(_per_case(PAD_CASES, lambda x, p: tf.pad(x, p, constant_values=fill)),
                     args, "PadV2")


MIRROR_CASES = [((3, 4), [[1, 2], [0, 3]]), ((5,), [[0, 0]]), ((2, 1, 3), [[1, 1], [0, 0], [2, 2]])]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", ["REFLECT", "SYMMETRIC"])
def test_mirror_pad(dtype: Any, mode: str) -> None:
    cases = [(shape, pads) for shape, pads in MIRROR_CASES
             if mode == "SYMMETRIC" or all(max(p) < n for p, n in zip(pads, shape))]
    cases += [((3, 4), [[3, 3], [4, 0]])] if mode == "SYMMETRIC" else [((3, 4), [[2, 2], [3, 0]])]
    args = inputs([[shape] for shape, _ in cases], [dtype])
    check_against_tf(_per_case(cases, lambda x, p: tf.pad(x, p, mode=mode)), args, "MirrorPad")


TILE_CASES = [((2, 3), [2, 1]), ((3,), [4]), ((), []), ((2, 0), [3, 2]), ((1, 2, 1), [2, 1, 3]),
              ((2, 2), [0, 1])]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_tile(dtype: Any) -> None:
    args = inputs([[shape] for shape, _ in TILE_CASES], [dtype])
    check_against_tf(_per_case(TILE_CASES, tf.tile), args, "Tile")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_split_split_v_unpack(dtype: Any) -> None:
    args = inputs([[(4, 6)], [(0, 3)], [(3,)]], [dtype])

    def fn(a: Any, b: Any, c: Any) -> list[Any]:
        return [*tf.split(a, 3, axis=1), *tf.split(a, [1, -1, 2], axis=0),
                *tf.split(b, 3, axis=-1), *tf.unstack(a, axis=0), *tf.unstack(c),
                *tf.unstack(b, axis=1)]

    for op_type in ("Split", "SplitV", "Unpack"):
        check_against_tf(fn, args, op_type)


def test_identity_n() -> None:
    args = inputs([[(2, 3), (), (0,)]], [F32, I32, BOOL])
    check_against_tf(lambda *xs: [y * 1 if y.dtype != tf.bool else y
                                  for y in raw.IdentityN(input=list(xs))], args, "IdentityN")


# -- constant-shape ops ------------------------------------------------------------------------
def test_range_rank_size() -> None:
    args = inputs([[(2, 0, 3), (4,)]], [F32, I32])

    def fn(x: Any, y: Any) -> list[Any]:
        return [raw.Range(start=2, limit=11, delta=3), raw.Range(start=10, limit=2, delta=-3),
                raw.Range(start=np.float32(0.5), limit=np.float32(2.0),
                          delta=np.float32(0.25)),
                raw.Range(start=np.int64(0), limit=np.int64(4), delta=np.int64(1)) + 1,
                raw.Rank(input=x), raw.Size(input=x), raw.Size(input=y, out_type=tf.int64) * 2,
                tf.cast(raw.Range(start=0, limit=4, delta=1), tf.int32) + y]

    for op_type in ("Range", "Rank", "Size"):
        check_against_tf(fn, args, op_type)


def test_transpose_gradient_inverts_a_constant_permutation() -> None:
    """TF's gradient of a Transpose transposes dy by InvertPermutation(perm): folded."""
    x, dy = sample((2, 3, 4), F32, seed=1), sample((4, 2, 3), F32, seed=2)

    def fn(x: Any, dy: Any) -> list[Any]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.transpose(x, [2, 0, 1])
        return [tape.gradient(y, x, output_gradients=dy),
                tf.math.invert_permutation(tf.constant([2, 0, 3, 1]))]

    check_against_tf(fn, [x, dy], "InvertPermutation")


# -- einsum and batched dots ------------------------------------------------------------------
EINSUM_CASES = [("ij,jk->ik", (3, 4), (4, 5)), ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
                ("bqd,bkd->bqk", (2, 3, 4), (2, 5, 4)), ("abc,cd->abd", (2, 3, 4), (4, 5)),
                ("i,j->ij", (3,), (4,)), ("ij,ij->ij", (2, 3), (2, 3)),
                ("bhqk,bkhd->bqhd", (2, 3, 4, 5), (2, 5, 3, 6)), ("ij,jk", (2, 3), (3, 4)),
                ("ij,kj->", (2, 3), (4, 3)), ("ab,bc->ac", (0, 3), (3, 2)), ("ij->ji", (3, 4)),
                ("ijk->ki", (2, 3, 4)), ("ij,jk->ik", (2, 0), (0, 3))]


@pytest.mark.parametrize("dtype", [F32, F64, I32], ids=["float32", "float64", "int32"])
def test_einsum(dtype: Any) -> None:
    args = inputs([case[1:] for case in EINSUM_CASES], [dtype, dtype], edges=False)

    def fn(*xs: Any) -> list[Any]:
        results, k = [], 0
        for equation, *shapes in EINSUM_CASES:
            results.append(tf.einsum(equation, *xs[k:k + len(shapes)]))
            k += len(shapes)
        return results

    check_against_tf(fn, args, "Einsum")


def test_einsum_with_ellipsis_stays_in_tf_with_a_reason() -> None:
    args = [np.zeros((2, 3, 4), np.float32), np.zeros((4, 5), np.float32)]
    graph = trace(lambda a, b: tf.einsum("...j,jk->...k", a, b), args).graph
    (op,) = [op for op in graph.get_operations() if op.type == "Einsum"]
    assert "ellipsis" in str(why_not_compilable(op))


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_batch_matmul_v3(dtype: Any) -> None:
    cases = [((2, 3, 4), (2, 4, 5)), ((1, 3, 4), (3, 4, 2)), ((0, 2, 3), (3, 2))]
    args = inputs(cases, [dtype, dtype])

    def fn(*xs: Any) -> list[Any]:
        return [raw.BatchMatMulV3(x=a, y=b, Tout=tf.as_dtype(dtype))
                for a, b in zip(xs[::2], xs[1::2])]

    check_against_tf(fn, args, "BatchMatMulV3")


TESTED_OPS = {"StridedSlice", "StridedSliceGrad", "Pad", "PadV2", "MirrorPad", "Tile",
              "Split", "SplitV", "Unpack", "IdentityN", "Range", "Rank", "Size", "Einsum",
              "BatchMatMulV3", "InvertPermutation"}
