"""Row kernels (row fusions on the CPU) against the evaluator: softmax, layer norm, more."""

from __future__ import annotations

import re

import numpy as np
import pytest
from codegen_helpers import as_args, build, check

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu import row_kernel
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.shape import Shape


def _reduce(comp: Computation, x: Instruction, dims: tuple[int, ...], kind: str,
            init: float) -> Instruction:
    assert comp.module is not None
    reducer = comp.module.reduction_computation(kind, x.shape.element_type)
    start = comp.add_constant(init, x.shape.element_type)
    return comp.create("reduce", [x, start], called_computations=[reducer], dimensions=dims)


def _back(comp: Computation, row_value: Instruction, shape: Shape) -> Instruction:
    """Broadcast a per-row value back along the rows of `shape`."""
    kept = tuple(range(row_value.shape.rank))
    return comp.create("broadcast", [row_value], shape=shape, dimensions=kept)


def _reduced_dims(shape: Shape, count: int) -> tuple[int, ...]:
    return tuple(range(shape.rank - count, shape.rank))


def softmax(comp: Computation, x: Instruction, count: int = 1) -> Instruction:
    """As TF's Softmax lowers: max, exp(x - max), its sum, the quotient."""
    dims = _reduced_dims(x.shape, count)
    peak = _reduce(comp, x, dims, "maximum", float("-inf"))
    exponentials = comp.create("exponential",
                               [comp.create("subtract", [x, _back(comp, peak, x.shape)])])
    total = _reduce(comp, exponentials, dims, "add", 0.0)
    return comp.create("divide", [exponentials, _back(comp, total, x.shape)])


def layer_norm(comp: Computation, x: Instruction, gamma: Instruction,
               beta: Instruction) -> Instruction:
    """As the benchmark's layer norm lowers (mean, mean of squares of x - mean, rsqrt)."""
    shape, element = x.shape, x.shape.element_type
    rows = Shape(element, shape.dims[:-1])
    columns = shape.dims[-1]
    scale = comp.create("broadcast", [comp.add_constant(1.0 / columns, element)], shape=rows,
                        dimensions=())
    mean = comp.create("multiply", [_reduce(comp, x, (shape.rank - 1,), "add", 0.0), scale])
    centered = comp.create("subtract", [x, _back(comp, mean, shape)])
    square = comp.create("multiply", [centered, centered])
    variance = comp.create("multiply", [_reduce(comp, square, (shape.rank - 1,), "add", 0.0),
                                        scale])
    column = Shape(element, rows.dims + (1,))
    epsilon = comp.create("broadcast", [comp.add_constant(1e-5, element)], shape=column,
                          dimensions=())
    shifted = comp.create("add", [comp.create("reshape", [variance], shape=column), epsilon])
    inverse = comp.create("reshape", [comp.create("rsqrt", [shifted])], shape=rows)
    normalized = comp.create("multiply", [centered, _back(comp, inverse, shape)])
    last = (shape.rank - 1,)
    scaled = comp.create("multiply", [normalized, comp.create("broadcast", [gamma], shape=shape,
                                                               dimensions=last)])
    return comp.create("add", [scaled, comp.create("broadcast", [beta], shape=shape,
                                                   dimensions=last)])


def _row_fusions(executable) -> int:
    entry = executable.module.entry
    return sum(1 for inst in entry.instructions if row_kernel.is_row_fusion(inst))


@pytest.mark.parametrize("dims", [(4, 8), (3, 37), (64, 128), (200, 1000), (1, 5), (7, 2)])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_softmax_is_one_row_kernel(dims: tuple[int, ...], dtype: str) -> None:
    shape = Shape(dtype, dims)
    module = build("softmax", [shape], lambda comp, p: softmax(comp, p[0]))
    executable = check(module, as_args([shape], edges=False), "Softmax")
    assert executable.kernel_count == 1 and _row_fusions(executable) == 1
    assert executable.temp_bytes == 0  # the exponentials never leave the kernel


def test_softmax_with_edge_values_matches_the_evaluator() -> None:
    shape = Shape("f32", (16, 40))
    module = build("softmax", [shape], lambda comp, p: softmax(comp, p[0]))
    (x,) = as_args([shape], seed=3)
    x[5] = -np.inf  # a row of -inf: NaN everywhere, as in the evaluator
    x[6, :3] = np.inf
    check(module, [x], "Softmax")


def test_softmax_over_two_trailing_dimensions() -> None:
    shape = Shape("f32", (3, 5, 6, 7))
    module = build("softmax", [shape], lambda comp, p: softmax(comp, p[0], count=2))
    executable = check(module, as_args([shape], edges=False), "Softmax")
    assert _row_fusions(executable) == 1


def normalize(comp: Computation, x: Instruction) -> Instruction:
    """x / sum(x) along the rows: a divide root by a per-row value."""
    total = _reduce(comp, x, (x.shape.rank - 1,), "add", 0.0)
    return comp.create("divide", [x, _back(comp, total, x.shape)])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_division_by_a_row_value_multiplies_by_its_reciprocal(dtype: str) -> None:
    # One division per row, x * (1/d) while 1/d is a normal number (within 2 ulp of
    # x / d) and where d is zero, inf or NaN (IEEE's special cases give x / d's bits);
    # rows whose d is denormal or huge keep the exact quotients.
    shape = Shape(dtype, (9, 64))
    module = build("normalize", [shape], lambda comp, p: normalize(comp, p[0]))
    (x,) = as_args([shape], seed=5, edges=False)
    x = np.abs(x) + 0.5
    # Integers times a power of two: every summation order gives the same d.
    steps = np.arange(1, 65, dtype=x.dtype)
    x[1] = steps * np.finfo(x.dtype).tiny * x.dtype.type(2.0 ** -20)  # d denormal
    x[2] = steps * x.dtype.type(2.0 ** (np.finfo(x.dtype).maxexp - 13))  # d > 2^(emax-2)
    x[3] = 0.0  # d = 0: NaN (0/0)
    x[4, 0] = np.inf  # d = inf: inf/inf = NaN, the rest 0
    x[5, 7] = np.nan
    x[6] = np.finfo(x.dtype).max / 8  # d overflows to inf
    x[7] *= -1.0
    executable = check(module, [x], "divide")
    assert executable.kernel_count == 1 and _row_fusions(executable) == 1
    expected = np.asarray(evaluate(module, x)).reshape(shape.dims)
    actual = executable(x)[0]
    for row in (1, 2, 3, 4, 5, 6):  # the exact path: bit for bit
        np.testing.assert_array_equal(actual[row], expected[row])
    # The loop over columns multiplies; the one division per row is a scalar one.
    vector_divisions = [line for line in executable.llvm_ir_optimized.splitlines()
                        if " fdiv <" in line]
    reciprocals = [line for line in executable.llvm_ir_optimized.splitlines()
                   if re.search(r"fdiv (float|double) 1\.0", line)]
    # The exact loop, which only such rows run, is kept scalar (loop metadata): vectorized
    # and interleaved it cost LLVM more than its scalar form costs those rows.
    assert reciprocals and not vector_divisions
    assert '!"llvm.loop.vectorize.enable", i1 0' in executable.llvm_ir


def test_kernels_share_one_scalar_loop_id() -> None:
    # Every exact-quotient loop carries the same loop ID node, so that two copies of a
    # kernel print alike (identical kernels are emitted once by comparing texts).
    shape = Shape("f32", (8, 64))
    module = build("two", [shape, shape],
                   lambda comp, p: [normalize(comp, p[0]), normalize(comp, p[1])])
    text = compile_module(module, cache=False, threads=1).llvm_ir
    assert len(set(re.findall(r"!llvm\.loop !\d+", text))) == 1


@pytest.mark.parametrize("dims", [(4, 8), (64, 128), (33, 1024), (2, 3, 100)])
def test_layer_norm_is_one_row_kernel(dims: tuple[int, ...]) -> None:
    shape = Shape("f32", dims)
    affine = Shape("f32", dims[-1:])
    module = build("layer_norm", [shape, affine, affine],
                   lambda comp, p: layer_norm(comp, *p))
    executable = check(module, as_args([shape, affine, affine], edges=False), "Mean")
    assert executable.kernel_count == 1 and _row_fusions(executable) == 1
    assert executable.temp_bytes == 0


def test_square_layer_norm_keeps_gamma_on_columns() -> None:
    # rows == columns: gamma's shape equals the per-row shape, but it is read by column.
    shape, affine = Shape("f32", (32, 32)), Shape("f32", (32,))
    module = build("layer_norm", [shape, affine, affine],
                   lambda comp, p: layer_norm(comp, *p))
    check(module, as_args([shape, affine, affine], edges=False), "Mean")


def test_per_row_root_is_one_kernel() -> None:
    # logsumexp: log(sum(exp(x - max))) + max, one value per row.
    shape = Shape("f32", (50, 300))

    def body(comp: Computation, p: list[Instruction]) -> Instruction:
        x = p[0]
        peak = _reduce(comp, x, (1,), "maximum", float("-inf"))
        shifted = comp.create("subtract", [x, _back(comp, peak, shape)])
        total = _reduce(comp, comp.create("exponential", [shifted]), (1,), "add", 0.0)
        return comp.create("add", [comp.create("log", [total]), peak])

    executable = check(module := build("logsumexp", [shape], body),
                       as_args([shape], edges=False), "LogSoftmax")
    assert executable.kernel_count == 1 and _row_fusions(executable) == 1
    del module


def test_reduce_used_outside_stays_a_kernel_of_its_own() -> None:
    # The max is also an output: it is computed once, by its own kernel.
    shape = Shape("f32", (20, 64))

    def body(comp: Computation, p: list[Instruction]) -> list[Instruction]:
        x = p[0]
        peak = _reduce(comp, x, (1,), "maximum", float("-inf"))
        shifted = comp.create("exponential",
                              [comp.create("subtract", [x, _back(comp, peak, shape)])])
        total = _reduce(comp, shifted, (1,), "add", 0.0)
        return [comp.create("divide", [shifted, _back(comp, total, shape)]), peak]

    executable = check(build("softmax_and_max", [shape], body), as_args([shape], edges=False),
                       "Softmax")
    assert executable.kernel_count == 2 and _row_fusions(executable) == 1


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_results_do_not_depend_on_the_thread_count(threads: int) -> None:
    shape = Shape("f32", (512, 384))  # above the parallel threshold
    module = build("softmax", [shape], lambda comp, p: softmax(comp, p[0]))
    args = as_args([shape], edges=False)
    expected = evaluate(module, *args)
    serial = compile_module(module, threads=1)(*args)[0]
    parallel = compile_module(build("softmax", [shape], lambda comp, p: softmax(comp, p[0])),
                              threads=threads)(*args)[0]
    np.testing.assert_array_equal(serial, parallel)
    np.testing.assert_allclose(serial, expected[0] if isinstance(expected, tuple) else expected,
                               rtol=1e-5, atol=1e-7)


def test_wide_rows_recompute_instead_of_buffering() -> None:
    # 20000 floats a row: more than ROW_SCRATCH_BYTES, so the exponentials are recomputed.
    shape = Shape("f32", (3, 20000))
    assert shape.dims[1] * 4 > row_kernel.ROW_SCRATCH_BYTES
    module = build("softmax", [shape], lambda comp, p: softmax(comp, p[0]))
    executable = check(module, as_args([shape], edges=False), "Softmax")
    assert _row_fusions(executable) == 1
    assert "row.scratch" not in executable.llvm_ir


@pytest.mark.parametrize("kind, init", [("add", 0.0), ("maximum", float("-inf")),
                                        ("minimum", float("inf")), ("multiply", 1.0)])
@pytest.mark.parametrize("dtype, width", [("f32", 200), ("f32", 40), ("f32", 13),
                                          ("f64", 100), ("s32", 50)])
def test_each_reducer_over_rows_of_each_width(kind: str, init: float, dtype: str,
                                              width: int) -> None:
    # x - fold(x) per row: vector folds (float add, max, min, multiply; 4 accumulators
    # from 128 floats on, one below, a scalar tail), scalar lanes for integers.
    shape = Shape(dtype, (9, width))
    if dtype == "s32" and init in (float("inf"), float("-inf")):
        init = 2**31 - 1 if init > 0 else -(2**31)

    def body(comp: Computation, p: list[Instruction]) -> Instruction:
        folded = _reduce(comp, p[0], (1,), kind, init)
        return comp.create("subtract", [p[0], _back(comp, folded, shape)])

    low, high = (0.9, 1.1) if kind == "multiply" else (-4.0, 4.0)
    args = as_args([shape], edges=dtype != "s32" and kind != "multiply", low=low, high=high)
    executable = check(build(f"row_{kind}", [shape], body), args, "reduce")
    assert _row_fusions(executable) == 1


def _one_over_row_fold(kind: str, x: np.ndarray, shape: Shape) -> np.ndarray:
    """1 / (the max or min of each row of `x`), broadcast back over the row, compiled as
    one row fusion: 1/fold shows a zero's sign."""
    def body(comp: Computation, p: list[Instruction]) -> Instruction:
        init = float("-inf") if kind == "maximum" else float("inf")
        folded = _reduce(comp, p[0], (1,), kind, init)
        return comp.create("divide", [p[1], _back(comp, folded, shape)])

    executable = compile_module(build(f"row_{kind}", [shape, shape], body))
    assert _row_fusions(executable) == 1
    return executable(x, np.ones(shape.dims, x.dtype))[0]


@pytest.mark.parametrize("kind", ["maximum", "minimum"])
@pytest.mark.parametrize("dtype, width", [("f32", 200), ("f64", 100)])
def test_fast_max_and_min_keep_nan_and_the_sign_of_zero(kind: str, dtype: str,
                                                         width: int) -> None:
    # The vector max/min folds with one compare-select and corrects the result where a
    # NaN or a zero was seen: the result is llvm.maximum's (NaN, -0 below +0). 1/fold
    # shows the sign of a zero.
    shape = Shape(dtype, (5, width))
    sign = 1.0 if kind == "maximum" else -1.0

    dtype_np = np.float32 if dtype == "f32" else np.float64
    x = -sign * np.random.default_rng(7).uniform(1.0, 2.0, shape.dims).astype(dtype_np)
    x[0, 3], x[0, width - 50] = 0.0 * sign, -0.0 * sign  # both zeros: +0 wins max
    x[1, 3], x[1, width - 50] = -0.0 * sign, -0.0 * sign  # only -0 (max) or +0 (min)
    x[2, 37] = np.nan
    x[4, width - 1] = 5.0 * sign  # in the scalar tail
    actual = _one_over_row_fold(kind, x, shape)
    fold = {"maximum": np.max, "minimum": np.min}[kind](x, axis=1)
    fold[0] = 0.0 * sign
    fold[1] = -0.0 * sign
    with np.errstate(divide="ignore"):
        expected = np.broadcast_to((1.0 / fold)[:, None], shape.dims).astype(dtype_np)
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("kind", ["maximum", "minimum"])
@pytest.mark.parametrize("dtype, width", [("f32", 1024), ("f32", 200), ("f32", 40),
                                          ("f64", 100)])
def test_fast_max_and_min_redo_exactly_for_a_nan_anywhere_or_a_zero_result(
        kind: str, dtype: str, width: int) -> None:
    # One NaN mask for all accumulators (`fcmp uno` of two vectors at a time) and a zero
    # test of the result alone: a NaN in any accumulator, group or the tail gives NaN; a
    # zero result has the exact sign (max: +0 when a +0 is in the row), even where a lane
    # met both zeros; a nonzero result is exact whatever the zeros' signs in the lanes.
    shape = Shape(dtype, (12, width))
    sign = 1.0 if kind == "maximum" else -1.0
    lanes = 16 if dtype == "f32" else 8
    group = lanes * (4 if width >= 8 * lanes else 1)  # elements per step of the fold

    dtype_np = np.float32 if dtype == "f32" else np.float64
    x = -sign * np.random.default_rng(11).uniform(1.0, 2.0, shape.dims).astype(dtype_np)
    for row, position in enumerate([0, lanes + 3, group - 1, width // 2 + 1, width - 1]):
        x[row, position] = np.nan  # first vectors, a later group, the last element
    x[5] = 0.0  # all +0
    x[6] = -0.0  # all -0
    x[7] = -0.0 * sign
    x[7, width - 2] = 0.0 * sign  # one zero of the sign that wins, near the end
    x[8, 5], x[8, 5 + lanes], x[8, 7] = -0.0 * sign, 0.0 * sign, 3.0 * sign  # nonzero wins
    x[9] = -0.0 * sign
    x[9, 5], x[9, 5 + group] = 0.0 * sign, -0.0 * sign  # one lane meets both zeros
    x[10:] = -0.0 * sign
    x[10, width - 1], x[11, 0] = 0.0 * sign, 0.0 * sign  # the winning zero last, first
    actual = _one_over_row_fold(kind, x, shape)
    fold = {"maximum": np.max, "minimum": np.min}[kind](x, axis=1)
    for row in range(shape.dims[0]):  # a zero's sign: the winning one if the row has it
        if fold[row] == 0:
            fold[row] = 0.0 * sign if np.any((x[row] == 0) & (np.signbit(x[row]) == (sign < 0))) \
                else -0.0 * sign
    assert np.isnan(fold[:5]).all() and fold[8] == 3.0 * sign
    with np.errstate(divide="ignore"):
        expected = np.broadcast_to((1.0 / fold)[:, None], shape.dims).astype(dtype_np)
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("dims", [(1, 7, 33), (5, 1, 40), (1, 64)])
def test_unit_dimensions_among_the_rows(dims: tuple[int, ...]) -> None:
    shape = Shape("f32", dims)
    module = build("softmax", [shape], lambda comp, p: softmax(comp, p[0]))
    executable = check(module, as_args([shape], edges=False), "Softmax")
    assert _row_fusions(executable) == 1


def test_f16_rows_and_an_independent_transposed_read() -> None:
    # A half-precision softmax plus transpose(x): the transpose depends on no reduce,
    # so it may read x at any index.
    shape = Shape("f16", (24, 24))

    def body(comp: Computation, p: list[Instruction]) -> Instruction:
        flipped = comp.create("transpose", [p[0]], dimensions=(1, 0))
        return comp.create("add", [softmax(comp, p[0]), flipped])

    executable = check(build("softmax_f16", [shape], body), as_args([shape], edges=False),
                       "Softmax")
    assert _row_fusions(executable) == 1 and executable.kernel_count == 1


@pytest.mark.parametrize("dtype, width", [("f32", 1024), ("f32", 200), ("f64", 100)])
def test_softmax_of_rows_whose_max_is_zero(dtype: str, width: int) -> None:
    # softmax(x - max(x)): every row's max is a zero, so the fast max fold's result takes
    # the exact path, a scan of the row's bits for a +0 (not a second fold of the row
    # with llvm.maximum, which cost LLVM time): -0 rows give -0, mixed rows +0.
    shape = Shape(dtype, (9, width))
    module = build("softmax", [shape], lambda comp, p: softmax(comp, p[0]))
    (x,) = as_args([shape], seed=8, edges=False)
    x -= x.max(axis=1, keepdims=True)
    x[1] = np.where(x[1] == 0, x.dtype.type(-0.0), x[1])  # the max is -0 only
    x[2, 3] = -0.0  # +0 and -0 in one row
    x[3] = 0.0
    x[4] = -0.0
    executable = check(module, [x], "Softmax")
    assert _row_fusions(executable) == 1
    text = executable.llvm_ir
    assert "zero.scan" in text
    # No llvm.maximum on whole vectors: the groups and the tree over the accumulators
    # compare and select, and the exact result is that scan, not a second fold of the
    # row (4 calls in its loop, 7 in its tree before).
    assert "@\"llvm.maximum.v" not in text
