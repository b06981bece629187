"""Gathers, scatters, segment reductions, reverses and cumulative sums against TF itself,
over shapes × dtypes (zero-size dims, repeated and dropped indices, edge values), and
the gradient of GatherV2 (an UnsortedSegmentSum) against TF's own gradient."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, sample, trace
from tolerances import assert_close

from tfxla_lite.clustering import mark
from tfxla_lite.clustering.mark import MarkOptions

F32, F64, I32, I64, BOOL = np.float32, np.float64, np.int32, np.int64, np.bool_
raw = tf.raw_ops


def _indices(shape: tuple[int, ...], high: int, seed: int, dtype: Any = I32,
             low: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, max(high, low + 1), size=shape).astype(dtype)


def _cases(cases: list[tuple[Any, ...]], apply: Callable[..., Any]) -> Callable[..., list[Any]]:
    """One traced function for every case: case k reads arguments 2k and 2k+1."""

    def fn(*xs: Any) -> list[Any]:
        return [apply(xs[2 * k], xs[2 * k + 1], *case[2:]) for k, case in enumerate(cases)]

    return fn


# -- GatherV2 -----------------------------------------------------------------------------------
# (params shape, indices shape, axis, batch_dims)
GATHER_CASES = [
    ((5, 3), (4,), 0, 0),
    ((5, 3), (2, 2), 1, 0),
    ((5, 3), (), 0, 0),
    ((2, 4, 3), (3,), -2, 0),
    ((2, 4, 3), (2, 5), 1, 1),
    ((2, 4, 3), (2, 3, 2), 2, 1),
    ((2, 3, 4, 2), (2, 3, 5), 2, 2),
    ((4, 0), (3,), 0, 0),
    ((5, 3), (0, 2), 0, 0),
]


@pytest.mark.parametrize("dtype", [F32, F64, I32, BOOL], ids=["float32", "float64", "int32",
                                                               "bool"])
@pytest.mark.parametrize("index_dtype", [I32, I64], ids=["int32", "int64"])
def test_gather_v2(dtype: Any, index_dtype: Any) -> None:
    args = []
    for k, (params, indices, axis, _) in enumerate(GATHER_CASES):
        args += [sample(params, dtype, seed=k),
                 _indices(indices, params[axis], seed=k, dtype=index_dtype)]
    check_against_tf(_cases(GATHER_CASES, lambda p, i, axis, batch_dims: tf.gather(
        p, i, axis=axis, batch_dims=batch_dims)), args, "GatherV2")


@pytest.mark.parametrize("dtype", [F32, I64, BOOL], ids=["float32", "int64", "bool"])
def test_gather_nd(dtype: Any) -> None:
    params = sample((4, 3, 2), dtype, seed=1)
    full = np.array([[3, 2, 1], [0, 0, 0], [3, 2, 1]], I32)  # elements, one repeated
    rows = np.array([[[1], [3]], [[0], [0]]], I64)  # [2, 2] of row vectors: slices [3, 2]
    pairs = np.zeros((0, 2), I32)  # no index vectors at all
    check_against_tf(lambda p, a, b, c: [tf.gather_nd(p, a), tf.gather_nd(p, b),
                                         tf.gather_nd(p, c)],
                     [params, full, rows, pairs], "GatherNd")


def test_gather_v1() -> None:
    p, i = sample((5, 3), F32), _indices((2, 3), 5, seed=1)
    check_against_tf(lambda p, i: raw.Gather(params=p, indices=i), [p, i], "Gather")


def test_gather_gradient_is_an_unsorted_segment_sum() -> None:
    """TF's gradient of a gather (an embedding lookup) as a dense tensor: its IndexedSlices
    become an UnsortedSegmentSum over the looked-up rows, repeated rows added up."""
    table = sample((7, 4), F32, seed=2, edges=False)
    ids = np.array([[1, 3, 1], [6, 1, 0]], I32)
    dy = sample((2, 3, 4), F32, seed=3)

    def fn(table: Any, ids: Any, dy: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(table)
            y = tf.gather(table, ids)
        return tf.convert_to_tensor(tape.gradient(y, table, output_gradients=dy))

    check_against_tf(fn, [table, ids, dy], "UnsortedSegmentSum")


def test_gather_with_a_variable_axis_stays_in_tf() -> None:
    graph = trace(lambda p, i, a: tf.gather(p, i, axis=a),
                  [np.zeros((3, 3), F32), np.zeros(2, I32), np.zeros((), I32)]).graph
    (decision,) = [d for d in mark(graph).values() if d.op_type == "GatherV2"]
    assert not decision.compilable and "constant" in decision.reason


def test_indexing_ops_with_unknown_dimensions_are_marked_compilable() -> None:
    """A Keras step traced with an unknown batch dimension: ranks are enough to mark the
    ops (each shape compiles on its own later)."""
    specs = [tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None, 3], tf.int32)]

    def fn(table: Any, ids: Any) -> list[Any]:
        rows = tf.gather(table, ids, axis=1, batch_dims=1)
        return [rows, tf.math.cumsum(rows, axis=1), tf.reverse(rows, [0]),
                tf.math.unsorted_segment_sum(table, ids[:, 0], 5)]

    graph = tf.function(fn).get_concrete_function(*specs).graph
    decisions = mark(graph, MarkOptions(dynamic_shapes=True)).values()
    wanted = {"GatherV2", "Cumsum", "ReverseV2", "UnsortedSegmentSum"}
    reasons = {d.op_type: d.reason for d in decisions if d.op_type in wanted}
    assert set(reasons) == wanted
    assert all(d.compilable for d in decisions if d.op_type in wanted), reasons


def test_dynamic_stitch_with_constant_indices() -> None:
    """The shape arithmetic of reduction gradients (reduced_shape), and rows of data
    stitched in a constant order with a repeated index (the last one wins, as in TF)."""
    x = sample((2, 3, 4), F32, seed=6)
    a, b = sample((2, 3), F32, seed=7), sample((3, 3), F32, seed=8)

    def fn(x: Any, a: Any, b: Any) -> list[Any]:
        shape = tf.shape(x)
        reduced = tf.dynamic_stitch([tf.range(3), tf.constant([0, 2])],
                                    [shape, tf.ones([2], tf.int32)])
        rows = tf.dynamic_stitch([tf.constant([4, 1]), tf.constant([[0, 2], [3, 1]])],
                                 [a, tf.reshape(b[:2, :2], [2, 2, 1]) * tf.ones([1, 1, 3])])
        return [tf.reshape(tf.reduce_sum(x, [0, 2]), reduced), rows]

    check_against_tf(fn, [x, a, b], "DynamicStitch")


def test_dynamic_stitch_with_runtime_indices_stays_in_tf() -> None:
    graph = trace(lambda i, d: tf.dynamic_stitch([i], [d]),
                  [np.zeros(3, I32), np.zeros(3, F32)]).graph
    (decision,) = [d for d in mark(graph).values() if d.op_type == "DynamicStitch"]
    assert not decision.compilable and "constant" in decision.reason


# -- segment reductions -------------------------------------------------------------------------
SEGMENT_OPS = [("UnsortedSegmentSum", tf.math.unsorted_segment_sum),
               ("UnsortedSegmentProd", tf.math.unsorted_segment_prod),
               ("UnsortedSegmentMax", tf.math.unsorted_segment_max),
               ("UnsortedSegmentMin", tf.math.unsorted_segment_min)]
# (data shape, ids shape, num_segments): repeated ids, a negative id (dropped, as in TF),
# empty segments, ids of rank 2, no data.
SEGMENT_CASES = [((9, 3), (9,), 6), ((4, 3, 2), (4, 3), 5), ((6,), (6,), 8), ((0, 3), (0,), 2)]


@pytest.mark.parametrize("op_type, fn", SEGMENT_OPS, ids=[o for o, _ in SEGMENT_OPS])
@pytest.mark.parametrize("dtype", [F32, F64, I32], ids=["float32", "float64", "int32"])
def test_unsorted_segment_reductions(op_type: str, fn: Any, dtype: Any) -> None:
    # NaN and inf land where TF puts them: a NaN row is ignored by max and min (std::max
    # keeps its first operand when the comparison is false).
    args = []
    for k, (data, ids, count) in enumerate(SEGMENT_CASES):
        segment_ids = _indices(ids, count, seed=k, low=-1)
        args += [sample(data, dtype, seed=k, low=-2, high=2), segment_ids]
    check_against_tf(_cases(SEGMENT_CASES, lambda d, i, count: fn(d, i, count)),
                     args, op_type)


# -- ScatterNd and TensorScatter* ---------------------------------------------------------------
def test_scatter_nd_and_tensor_scatters() -> None:
    x = sample((6, 4), F32, seed=1)
    rows = np.array([[4], [1], [4], [0]], I32)  # a repeated row: added twice
    cells = np.array([[5, 3], [0, 0], [2, 1]], I32)
    row_updates = sample((4, 4), F32, seed=2)
    cell_updates = sample((3,), F32, seed=3)
    unique_rows = np.array([[3], [0]], I32)

    def fn(x: Any, rows: Any, cells: Any, row_updates: Any, cell_updates: Any,
           unique_rows: Any) -> list[Any]:
        return [tf.scatter_nd(rows, row_updates, [6, 4]),
                tf.scatter_nd(cells, cell_updates, [6, 4]),
                tf.tensor_scatter_nd_add(x, rows, row_updates),
                tf.tensor_scatter_nd_add(x, cells, cell_updates),
                tf.tensor_scatter_nd_update(x, unique_rows, row_updates[:2]),
                tf.tensor_scatter_nd_update(x, cells, cell_updates),
                tf.tensor_scatter_nd_max(x, rows, row_updates),
                tf.tensor_scatter_nd_min(x, cells, cell_updates)]

    args = [x, rows, cells, row_updates, cell_updates, unique_rows]
    for op_type in ("ScatterNd", "TensorScatterAdd", "TensorScatterUpdate", "TensorScatterMax",
                    "TensorScatterMin"):
        assert op_type in {op.type for op in trace(fn, args).graph.get_operations()}
    check_against_tf(fn, args, "ScatterNd",
                     compare=lambda a, e, o, c: assert_close(a, e, "Maximum", c))


def test_scatter_of_integers_and_bools() -> None:
    x = np.arange(12, dtype=I64).reshape(4, 3)
    rows = np.array([[2], [2], [0]], I64)
    updates = np.array([[1, 2, 3], [10, 20, 30], [-5, -6, -7]], I64)
    flags = np.zeros((4, 3), BOOL)
    check_against_tf(lambda x, r, u, f: [tf.tensor_scatter_nd_add(x, r, u),
                                         tf.scatter_nd(r, u, [4, 3]),
                                         tf.tensor_scatter_nd_update(f, r[1:], u[1:] > 0)],
                     [x, rows, updates, flags], "TensorScatterAdd")


# -- ReverseV2 ----------------------------------------------------------------------------------
REVERSE_CASES = [((5,), [0]), ((3, 4), [1]), ((3, 4), [-1, 0]), ((2, 3, 4), [0, 2]),
                 ((2, 3), []), ((0, 3), [0])]


@pytest.mark.parametrize("dtype", [F32, I64, BOOL], ids=["float32", "int64", "bool"])
def test_reverse_v2(dtype: Any) -> None:
    args = [sample(shape, dtype, seed=k) for k, (shape, _) in enumerate(REVERSE_CASES)]
    check_against_tf(lambda *xs: [tf.reverse(x, axes) for x, (_, axes) in zip(xs, REVERSE_CASES)],
                     args, "ReverseV2")


# -- Cumsum and Cumprod -------------------------------------------------------------------------
SCAN_CASES = [((7,), 0), ((3, 5), 1), ((3, 5), -2), ((2, 3, 4), 1), ((0, 4), 1), ((4, 1), 1)]


@pytest.mark.parametrize("exclusive", [False, True], ids=["inclusive", "exclusive"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", [F32, F64, I32, I64], ids=["float32", "float64", "int32",
                                                            "int64"])
def test_cumsum_and_cumprod(exclusive: bool, reverse: bool, dtype: Any) -> None:
    # Sums accumulate in TF's order (from the start, or from the end when reversed), so
    # floats match exactly, NaN and inf included.
    args = [sample(shape, dtype, seed=k, low=-2, high=2) for k, (shape, _) in
            enumerate(SCAN_CASES)]

    def fn(*xs: Any) -> list[Any]:
        results = []
        for x, (_, axis) in zip(xs, SCAN_CASES):
            results.append(tf.cumsum(x, axis, exclusive=exclusive, reverse=reverse))
            results.append(tf.math.cumprod(x, axis, exclusive=exclusive, reverse=reverse))
        return results

    check_against_tf(fn, args, "Cumsum")


def test_gradients_match_tf() -> None:
    """TF's own gradients of these ops (scans and reverses of the reversed dy, gathers of
    segment sums, segment sums of gathers), fed a random dy, compiled whole."""
    x = sample((3, 5), F32, seed=4, edges=False, low=0.5, high=2)
    ids = np.array([2, 0, 2], I32)
    batch_ids = np.array([[1, 0], [3, 3], [2, 0]], I32)

    def fn(x: Any, ids: Any, batch_ids: Any) -> list[Any]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs = [tf.cumsum(x, 1, reverse=True), tf.math.cumprod(x, 1, exclusive=True),
                       tf.reverse(x, [0]), tf.math.unsorted_segment_sum(x, ids, 4),
                       tf.gather(x, batch_ids, axis=1, batch_dims=1)]
            loss = sum(tf.reduce_sum(y * tf.sin(y)) for y in outputs)
        return [tape.gradient(loss, x)]

    graph_types = {op.type for op in trace(fn, [x, ids, batch_ids]).graph.get_operations()}
    assert {"Cumsum", "Cumprod", "ReverseV2", "GatherV2", "UnsortedSegmentSum"} <= graph_types
    check_against_tf(fn, [x, ids, batch_ids], "Cumsum",
                     compare=lambda a, e, o, c: assert_close(a, e, "model gradient", c))


TESTED_OPS = {"GatherV2", "Gather", "GatherNd", "DynamicStitch", "UnsortedSegmentSum",
              "UnsortedSegmentProd", "UnsortedSegmentMax", "UnsortedSegmentMin", "ScatterNd",
              "TensorScatterAdd", "TensorScatterUpdate", "TensorScatterMax", "TensorScatterMin",
              "ReverseV2", "Cumsum", "Cumprod"}
