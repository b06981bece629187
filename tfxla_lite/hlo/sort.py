"""HLO `sort` and `topk`: their shape rules and NumPy references, as XLA defines them.

`sort` permutes every 1-D slice along its dimension of N operands together, by a
comparator over 2N scalars `(lhs_0, rhs_0, lhs_1, rhs_1, ...)`, true when lhs goes
first. The reference and the CPU kernel run the same stable merge
sort (`merge_sort_order`), so they agree even when the comparator is not a strict weak
order (XLA leaves that undefined) and keep equal elements' order either way. TF's TopKV2
lowers to either for long rows (`clustering/rules_nn.py`). docs/architecture.md, section 4.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tfxla_lite.hlo.shape import Shape


class SortShapeError(ValueError):
    """Operands or attributes a sort does not take."""


def sort_dimension(attributes: Mapping[str, Any], rank: int) -> int:
    """The dimension a sort orders: `dimensions={d}`, one dimension of the operands."""
    dims = tuple(attributes.get("dimensions", ()))
    if len(dims) != 1 or not 0 <= dims[0] < max(rank, 1):
        raise SortShapeError(f"sort takes one dimension of its rank-{rank} operands, "
                             f"got dimensions={{{', '.join(map(str, dims))}}}")
    return dims[0]


def sort_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    """The result of sorting `shapes` together: the one array, or a tuple of them."""
    if not shapes:
        raise SortShapeError("sort needs operands")
    first = shapes[0]
    for shape in shapes:
        if shape.is_tuple or shape.dims != first.dims:
            raise SortShapeError(f"sort operands are arrays of equal dims, got {shapes}")
    if first.rank == 0:
        raise SortShapeError("sort operands have at least one dimension")
    sort_dimension(attributes, first.rank)
    return first if len(shapes) == 1 else Shape.tuple_of(list(shapes))


Comparator = Callable[[Sequence[np.ndarray]], bool]


def merge_sort_order(length: int, less: Callable[[int, int], bool]) -> list[int]:
    """The permutation a bottom-up stable merge sort gives: runs of 1, 2, 4... merged
    pairwise, left to right, taking the right run's head only when it is `less` than the
    left's. The CPU kernel runs this very order of comparisons, so that the two agree
    even for a comparator that is not a strict weak order (NaN under a plain LT)."""
    order = list(range(length))
    width = 1
    while width < length:
        merged: list[int] = []
        for low in range(0, length, 2 * width):
            left = order[low:low + width]
            right = order[low + width:low + 2 * width]
            i = j = 0
            while i < len(left) and j < len(right):
                if less(right[j], left[i]):
                    merged.append(right[j])
                    j += 1
                else:
                    merged.append(left[i])
                    i += 1
            merged.extend(left[i:])
            merged.extend(right[j:])
        order = merged
        width *= 2
    return order


def reference(operands: Sequence[np.ndarray], dimension: int, less: Comparator
              ) -> list[np.ndarray]:
    """Every slice along `dimension` of `operands` permuted by `merge_sort_order` under
    `less(lhs_0, rhs_0, lhs_1, rhs_1, ...)` (0-d arrays)."""
    moved = [np.moveaxis(np.asarray(x), dimension, -1) for x in operands]
    results = [np.empty_like(x) for x in moved]
    length = moved[0].shape[-1]
    for index in np.ndindex(*moved[0].shape[:-1]):
        rows = [x[index] for x in moved]

        def before(i: int, j: int, rows: list[np.ndarray] = rows) -> bool:
            return less([value for row in rows for value in (row[i:i + 1].reshape(()),
                                                               row[j:j + 1].reshape(()))])

        order = merge_sort_order(length, before)
        for result, row in zip(results, rows):
            result[index] = row[order]
    return [np.ascontiguousarray(np.moveaxis(r, -1, dimension)) for r in results]


# -- topk ----------------------------------------------------------------------------------
# `topk(x), k=K, largest=true` (XLA's TopK): along the last dimension, the K first
# elements of each row and their s32 indices, a tuple. Order: by value, largest first
# (`largest=false`: smallest first); NaN above every number (last with largest=false);
# equal values (-0.0 and 0.0 among them) and NaNs by index, lowest first: TF's TopKV2
# order, which is total, so the result is defined.


def topk_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    if len(shapes) != 1 or shapes[0].is_tuple or shapes[0].rank == 0:
        raise SortShapeError(f"topk takes one array of rank 1 or more, got {shapes}")
    (x,) = shapes
    k = int(attributes.get("k", -1))
    if not 0 <= k <= x.dims[-1]:
        raise SortShapeError(f"topk k={k} out of [0, {x.dims[-1]}] for {x}")
    dims = x.dims[:-1] + (k,)
    return Shape.tuple_of([x.with_dims(dims), Shape("s32", dims)])


def topk_order(x: np.ndarray, largest: bool = True) -> np.ndarray:
    """The permutation of each last-dimension row of `x` in topk's order."""
    if x.dtype.kind in "iu":
        # ~x reverses an integer order without overflow (-x - 1, or max - x).
        return np.argsort(np.invert(x) if largest else x, axis=-1, kind="stable")
    wide = x.astype(np.float64)
    nan = np.isnan(wide)
    value = np.where(nan, 0.0, -wide if largest else wide) + 0.0  # + 0.0: -0.0 ties 0.0
    rank = (nan != largest).astype(np.int8)  # NaN first when largest, last otherwise
    return np.lexsort((value, rank), axis=-1)


def topk_reference(x: np.ndarray, k: int, largest: bool = True) -> tuple[np.ndarray, np.ndarray]:
    order = topk_order(np.asarray(x), largest)[..., :k]
    return (np.ascontiguousarray(np.take_along_axis(x, order, axis=-1)),
            order.astype(np.int32))
