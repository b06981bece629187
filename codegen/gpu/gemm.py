"""Dots as cuBLAS strided-batched GEMMs that read the operands where they lie.

Part of the GPU backend's run time: `GpuExecutable` plans each library dot once
(`plan_gemm`, pure Python, no CuPy) and issues it per call (`run_gemm`, through
`cupy.cuda.cublas.gemmStridedBatchedEx`).

A dot's operands are dense row-major buffers, and `dot-folding` leaves batch and
contracting dimensions anywhere. cuBLAS reads a batch of column-major matrices, each
through a transpose flag and a leading dimension, the batch at one stride. So each
operand's dimension groups (batch, free, contracting) are read as one dimension each
where their strides allow (a group collapses when each dimension's stride is the next
one's stride times its size), and its matrix as row-major (unit stride along the
columns: op N) or column-major (unit stride along the rows: op T). What that cannot
describe is copied into a dense (batch, rows, columns) array first:

- a matrix group no single stride describes (two contracting dimensions around a free
  one), or one with no unit stride;
- batch dimensions of no uniform stride (attention's heads in [b, s, h, d]): either the
  longest run of batch dimensions that collapses in both operands is cuBLAS's batch and
  the dimensions before it are looped over here, one GEMM per index, or the operands
  whose batch does not collapse are copied and one GEMM runs; whichever `_launch_cost`
  estimates cheaper (each GEMM call and each copy is a launch from Python; a copy also
  moves its bytes twice). The estimate's constants are guesses, not measured on a GPU.

The product is computed as cuBLAS sees row-major data: out^T = rhs^T . lhs^T in column
major, so `out` (dense, (batch, lhs free, rhs free), HLO's order) needs no transpose.
f16 and bf16 multiply with f32 accumulation (`CUBLAS_COMPUTE_32F`) and round once into
the output, as the CPU backend and the evaluator do; f32 in f32 (no TF32 unless CuPy's
handle is set to allow it), f64 in f64.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

LAUNCH_US = 6.0  # host cost of one GEMM call or one copy through CuPy (a guess)
BYTES_PER_US = 2e6  # device bandwidth of a copy, bytes per microsecond (a guess: 2 TB/s)
INT_MAX = 2**31 - 1  # cuBLAS's m, n, k, leading dimensions and batch count are int

_CUDA_TYPES = {"f16": "CUDA_R_16F", "bf16": "CUDA_R_16BF", "f32": "CUDA_R_32F",
               "f64": "CUDA_R_64F"}
# alpha = 1 and beta = 0 in the compute type, host memory (CuPy's default pointer mode).
_ONE = {np.dtype(np.float32): np.ones(1, np.float32), np.dtype(np.float64): np.ones(1, np.float64)}
_ZERO = {np.dtype(np.float32): np.zeros(1, np.float32),
         np.dtype(np.float64): np.zeros(1, np.float64)}


@dataclass(frozen=True)
class GemmOperand:
    """How cuBLAS reads one operand (element strides of the array it is given)."""

    copy_order: tuple[int, ...] | None  # copied densely in this dimension order first
    transpose: bool  # cuBLAS's op T: the matrix is column-major in the row-major view
    ld: int
    batch_stride: int
    outer_strides: tuple[int, ...]  # per looped batch dimension


@dataclass(frozen=True)
class StridedGemm:
    """One dot as `outer` loops of strided-batched GEMMs of `batch` m x k . k x n."""

    element_type: str
    batch: int
    m: int
    k: int
    n: int
    outer: tuple[int, ...]  # sizes of the batch dimensions looped over in Python
    out_outer_strides: tuple[int, ...]
    lhs: GemmOperand
    rhs: GemmOperand

    @property
    def copies(self) -> int:
        return (self.lhs.copy_order is not None) + (self.rhs.copy_order is not None)

    @property
    def calls(self) -> int:
        return math.prod(self.outer)

    def copy_shapes(self, lhs_dims: tuple[int, ...],
                    rhs_dims: tuple[int, ...]) -> list[tuple[int, ...] | None]:
        """The dense shapes the operands are copied into (None: read in place)."""
        return [None if operand.copy_order is None else
                tuple(dims[d] for d in operand.copy_order)
                for operand, dims in ((self.lhs, lhs_dims), (self.rhs, rhs_dims))]


def _dense_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(dims):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _collapse(sizes: list[int], strides: list[int]) -> tuple[int, int] | None:
    """(size, stride) of dimensions read as one, or None. Dimensions of size 1 have no
    stride that matters; a group of no such dimension, or an empty one, has stride 0."""
    if 0 in sizes:
        return 0, 0
    kept = [(s, st) for s, st in zip(sizes, strides, strict=True) if s != 1]
    for (_, outer), (size, inner) in zip(kept, kept[1:]):
        if outer != inner * size:
            return None
    return math.prod(sizes), (kept[-1][1] if kept else 0)


def _matrix(rows: tuple[int, int], cols: tuple[int, int]) -> tuple[bool, int] | None:
    """(transpose, leading dimension) of a rows x cols matrix cuBLAS can read, or None."""
    (r, row_stride), (c, col_stride) = rows, cols
    if r == 0 or c == 0:  # nothing to read (`run_gemm` calls no GEMM)
        return False, max(1, c)
    if c == 1 or col_stride == 1:  # row-major: cuBLAS's op N
        ld = row_stride if r > 1 else max(1, c)
        if ld >= max(1, c):
            return False, ld
    if r == 1 or row_stride == 1:  # column-major: op T
        ld = col_stride if c > 1 else max(1, r)
        if ld >= max(1, r):
            return True, ld
    return None


@dataclass(frozen=True)
class _Reading:
    """An operand's groups read off its strides (before the batch split)."""

    copy_order: tuple[int, ...] | None
    transpose: bool
    ld: int
    batch_strides: tuple[int, ...]  # per batch dimension, in the output's order


def _read(dims: tuple[int, ...], batch: list[int], rows: list[int], cols: list[int],
          copy: bool) -> _Reading | None:
    order = tuple(batch + rows + cols)
    if copy:  # a dense copy in (batch, rows, cols) order reads as a row-major batch
        dims, batch, rows, cols = (tuple(dims[d] for d in order), list(range(len(batch))),
                                   [len(batch) + i for i in range(len(rows))],
                                   [len(batch) + len(rows) + i for i in range(len(cols))])
    strides = _dense_strides(dims)
    groups = [_collapse([dims[d] for d in g], [strides[d] for d in g]) for g in (rows, cols)]
    if groups[0] is None or groups[1] is None:
        return None
    layout = _matrix(groups[0], groups[1])
    if layout is None or layout[1] > INT_MAX:
        return None
    return _Reading(order if copy else None, layout[0], layout[1],
                    tuple(strides[d] for d in batch))


def _launch_cost(calls: int, copies: int, copied_bytes: int) -> float:
    """Estimated microseconds of `calls` GEMM calls and `copies` operand copies."""
    return (calls + copies) * LAUNCH_US + 2 * copied_bytes / BYTES_PER_US


def _joint_suffix(sizes: list[int], *strides: tuple[int, ...]) -> int:
    """The first batch dimension of the longest run at the end that collapses in every
    operand (a suffix of no dimension collapses trivially)."""
    start = len(sizes)
    while start > 0 and all(_collapse(sizes[start - 1:], list(s[start - 1:])) is not None
                            for s in strides):
        start -= 1
    return start


def plan_gemm(dot: Any) -> StridedGemm:
    """How `run_gemm` computes `dot` (an HLO dot of f16, bf16, f32 or f64)."""
    attrs = dot.attributes
    lhs_dims, rhs_dims = dot.operand(0).shape.dims, dot.operand(1).shape.dims
    lb, rb = list(attrs.get("lhs_batch_dims", ())), list(attrs.get("rhs_batch_dims", ()))
    lc = list(attrs.get("lhs_contracting_dims", ()))
    rc = list(attrs.get("rhs_contracting_dims", ()))
    lf = [d for d in range(len(lhs_dims)) if d not in lb and d not in lc]
    rf = [d for d in range(len(rhs_dims)) if d not in rb and d not in rc]
    m = math.prod(lhs_dims[d] for d in lf)
    k = math.prod(lhs_dims[d] for d in lc)
    n = math.prod(rhs_dims[d] for d in rf)
    sizes = [lhs_dims[d] for d in lb]

    # Contracting pairs may be summed in any order, the same in both operands: try the
    # given one, then each operand's own stride order.
    pairs = list(zip(lc, rc, strict=True))
    lhs_strides, rhs_strides = _dense_strides(lhs_dims), _dense_strides(rhs_dims)
    orders = [pairs, sorted(pairs, key=lambda p: -lhs_strides[p[0]]),
              sorted(pairs, key=lambda p: -rhs_strides[p[1]])]
    best = None
    for pairing in orders:
        lcs, rcs = [p[0] for p in pairing], [p[1] for p in pairing]
        readings = []
        for dims, batch, rows, cols in ((lhs_dims, lb, lf, lcs), (rhs_dims, rb, rcs, rf)):
            reading = _read(dims, batch, rows, cols, copy=False) or \
                _read(dims, batch, rows, cols, copy=True)
            if reading is None or max(m, n, k, math.prod(sizes)) > INT_MAX:
                raise NotImplementedError(f"a dot of {lhs_dims} and {rhs_dims} is beyond "
                                          "one cuBLAS call's 32-bit sizes")
            readings.append(reading)
        copies = sum(r.copy_order is not None for r in readings)
        if best is None or copies < best[0]:
            best = (copies, readings, (lcs, rcs))
    assert best is not None
    lhs, rhs = best[1]
    lcs, rcs = best[2]

    start = _joint_suffix(sizes, lhs.batch_strides, rhs.batch_strides)
    if start > 0:
        # Batch dimensions of no common stride: loop over them, or copy each operand
        # whose own batch does not collapse and make one call; the cheaper.
        copied = [_read(lhs_dims, lb, lf, lcs, copy=True)
                  if _joint_suffix(sizes, lhs.batch_strides) > 0 else lhs,
                  _read(rhs_dims, rb, rcs, rf, copy=True)
                  if _joint_suffix(sizes, rhs.batch_strides) > 0 else rhs]
        itemsize = dot.operand(0).shape.numpy_dtype.itemsize
        new = [math.prod(dims) * itemsize for dims, before, after in
               ((lhs_dims, lhs, copied[0]), (rhs_dims, rhs, copied[1])) if after is not before]
        if _launch_cost(1, len(new), sum(new)) < _launch_cost(math.prod(sizes[:start]), 0, 0):
            lhs, rhs = copied  # type: ignore[assignment]  # dense copies always read
        start = _joint_suffix(sizes, lhs.batch_strides, rhs.batch_strides)
    out_strides = _dense_strides(tuple(sizes) + (m, n))[:len(sizes)]
    outer = [d for d in range(start) if sizes[d] != 1]

    def operand(reading: _Reading) -> GemmOperand:
        inner = _collapse(sizes[start:], list(reading.batch_strides[start:]))
        assert inner is not None
        return GemmOperand(reading.copy_order, reading.transpose, reading.ld,
                           inner[1] if inner[0] > 1 else 0,
                           tuple(reading.batch_strides[d] for d in outer))

    return StridedGemm(dot.shape.element_type, math.prod(sizes[start:]), m, k, n,
                       tuple(sizes[d] for d in outer),
                       tuple(out_strides[d] for d in outer), operand(lhs), operand(rhs))


def run_gemm(cupy: Any, gemm: StridedGemm, lhs: Any, rhs: Any, out: Any,
             copies: tuple[Any, Any] = (None, None)) -> None:
    """`out = dot(lhs, rhs)` as `plan_gemm` planned it: `lhs` and `rhs` dense arrays of the
    dot's operand shapes, `out` a dense array of its shape (written whole). `copies`: dense
    arrays of `copy_shapes` for the operands the plan copies (the executable's scratch
    area), or None to take them from CuPy's pool."""
    g = gemm
    if g.batch * g.m * g.n * g.calls == 0:
        return
    if g.k == 0:
        out[...] = 0
        return
    lhs, rhs = dense_operands(cupy, g, lhs, rhs, copies)
    constants = _constants(cupy, g.element_type)
    ops, data_type, one, zero, compute_type, algo = constants
    cublas = cupy.cuda.cublas
    handle = cupy.cuda.get_cublas_handle()
    lhs_at, rhs_at, out_at = int(lhs.data.ptr), int(rhs.data.ptr), int(out.data.ptr)
    size = out.dtype.itemsize
    for index in itertools.product(*(range(s) for s in g.outer)) if g.outer else ((),):
        shift = [size * sum(i * s for i, s in zip(index, strides, strict=True))
                 for strides in (g.lhs.outer_strides, g.rhs.outer_strides,
                                 g.out_outer_strides)]
        # Column-major out^T (n x m, ld n) = op(rhs^T) . op(lhs^T).
        cublas.gemmStridedBatchedEx(
            handle, ops[g.rhs.transpose], ops[g.lhs.transpose], g.n, g.m, g.k, one,
            rhs_at + shift[1], data_type, g.rhs.ld, g.rhs.batch_stride,
            lhs_at + shift[0], data_type, g.lhs.ld, g.lhs.batch_stride, zero,
            out_at + shift[2], data_type, max(1, g.n), g.m * g.n,
            g.batch, compute_type, algo)


def dense_operands(cupy: Any, gemm: StridedGemm, lhs: Any, rhs: Any,
                   copies: tuple[Any, Any] = (None, None)) -> tuple[Any, Any]:
    """`lhs` and `rhs` as the GEMM reads them: each operand the plan copies
    (`copy_order`) copied dense into its `copies` array (or CuPy's pool), the others as
    they are."""
    if gemm.lhs.copy_order is not None:
        lhs = _dense_copy(cupy, lhs.transpose(gemm.lhs.copy_order), copies[0])
    if gemm.rhs.copy_order is not None:
        rhs = _dense_copy(cupy, rhs.transpose(gemm.rhs.copy_order), copies[1])
    return lhs, rhs


def _dense_copy(cupy: Any, view: Any, into: Any) -> Any:
    if into is None:
        return cupy.ascontiguousarray(view)
    into[...] = view  # one elementwise copy kernel into the scratch area
    return into


_constants_of: dict[tuple[Any, str], tuple[Any, ...]] = {}


def _constants(cupy: Any, element_type: str) -> tuple[Any, ...]:
    """cuBLAS's enumerators and the host scalars for `element_type`, looked up once per
    CuPy module: (ops N and T, data type, &alpha, &beta, compute type, algorithm)."""
    key = (cupy, element_type)
    found = _constants_of.get(key)
    if found is None:
        cublas, runtime = cupy.cuda.cublas, cupy.cuda.runtime
        wide = element_type == "f64"
        compute = np.dtype(np.float64 if wide else np.float32)
        found = ((cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T),
                 getattr(runtime, _CUDA_TYPES[element_type]),
                 _ONE[compute].ctypes.data, _ZERO[compute].ctypes.data,
                 cublas.CUBLAS_COMPUTE_64F if wide else cublas.CUBLAS_COMPUTE_32F,
                 cublas.CUBLAS_GEMM_DEFAULT)
        _constants_of[key] = found
    return found
