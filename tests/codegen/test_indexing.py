"""CPU emitters of reverse, pad, dynamic-slice, dynamic-update-slice, gather and
reduce-window against the NumPy evaluator, over shapes × dtypes with edge values
(NaN, ±inf, ±0, integer bounds, empty arrays, out-of-range start indices), unfused
and through the pipeline (where they fuse with elementwise neighbours)."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_helpers import as_args, build, check, compile_unfused
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.attributes import PaddingConfig, Window, WindowDimension
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify

DTYPES = ["f32", "f64", "f16", "s32", "u8", "s64", "pred"]
SHAPES = [(3, 4), (2, 3, 5), (0, 3), (1,), (7,)]


def _check_both(module_factory, args: list[np.ndarray]) -> None:  # type: ignore[no-untyped-def]
    check(module_factory(), args, "Transpose", fused=False)
    check(module_factory(), args, "Transpose", fused=True)


@pytest.mark.parametrize("element_type", DTYPES)
@pytest.mark.parametrize("dims", SHAPES)
def test_reverse(element_type: str, dims: tuple[int, ...]) -> None:
    shape = Shape(element_type, dims)
    axes = tuple(range(0, len(dims), 2))
    _check_both(lambda: build("reverse", [shape], lambda c, ps: [
        c.create("reverse", ps, dimensions=axes)]), as_args([shape]))


@pytest.mark.parametrize("element_type", DTYPES)
@pytest.mark.parametrize("dims,config", [
    ((3, 4), [(1, 0, 0), (0, 2, 0)]),
    ((3, 4), [(-1, 2, 1), (2, -3, 0)]),
    ((2, 3, 2), [(0, 0, 2), (1, 1, 1), (-1, 0, 0)]),
    ((0, 2), [(1, 1, 3), (0, 0, 0)]),
    ((5,), [(-2, -2, 0)]),
])
def test_pad(element_type: str, dims: tuple[int, ...], config: list[tuple[int, int, int]]
             ) -> None:
    shape = Shape(element_type, dims)
    padding = PaddingConfig.of(*config)
    _check_both(lambda: build("pad", [shape, Shape(element_type, ())], lambda c, ps: [
        c.create("pad", ps, padding=padding)]), as_args([shape, Shape(element_type, ())]))


@pytest.mark.parametrize("element_type", ["f32", "s32", "pred", "f16"])
@pytest.mark.parametrize("index_type", ["s32", "s64", "u32", "u8"])
@pytest.mark.parametrize("starts", [(0, 0), (1, 2), (-5, 1), (9, 9)])
def test_dynamic_slice_and_update(element_type: str, index_type: str,
                                  starts: tuple[int, int]) -> None:
    shape, part = Shape(element_type, (4, 5)), Shape(element_type, (2, 3))
    index = Shape(index_type, ())
    dtype = index.numpy_dtype
    start_args = [np.array(s if s >= 0 or dtype.kind == "i" else 200).astype(dtype)
                  for s in starts]
    _check_both(lambda: build("dynamic_slice", [shape, index, index], lambda c, ps: [
        c.create("dynamic-slice", ps, dynamic_slice_sizes=(2, 3))]),
        as_args([shape]) + start_args)
    _check_both(lambda: build("dynamic_update_slice", [shape, part, index, index],
                              lambda c, ps: [c.create("dynamic-update-slice", ps)]),
                as_args([shape, part]) + start_args)


def test_dynamic_slice_of_empty_and_full_sizes() -> None:
    shape, index = Shape("f32", (3, 0)), Shape("s32", ())
    check(build("empty", [shape, index, index], lambda c, ps: [
        c.create("dynamic-slice", ps, dynamic_slice_sizes=(2, 0))]),
        as_args([shape]) + [np.int32(1), np.int32(0)], "Slice", fused=False)
    shape = Shape("f32", (3, 4))
    check(build("full", [shape, shape, index, index], lambda c, ps: [
        c.create("dynamic-update-slice", ps)]),
        as_args([shape, shape]) + [np.int32(2), np.int32(-1)], "Slice", fused=False)


def _gather_v2(c: Computation, x: Instruction, indices: Instruction, axis: int) -> Instruction:
    rank = indices.shape.rank
    sizes = list(x.shape.dims)
    sizes[axis] = 1
    offset_dims = tuple(list(range(axis)) + list(range(axis + rank, x.shape.rank + rank - 1)))
    return c.create("gather", [x, indices], offset_dims=offset_dims,
                    collapsed_slice_dims=(axis,), start_index_map=(axis,),
                    index_vector_dim=rank, slice_sizes=tuple(sizes))


@pytest.mark.parametrize("element_type", ["f32", "f64", "s32", "pred", "u8"])
@pytest.mark.parametrize("index_type", ["s32", "s64"])
@pytest.mark.parametrize("x_dims,index_dims,axis", [((5, 3), (4,), 0), ((5, 3), (2, 2), 1),
                                                    ((2, 4, 3), (3,), 1), ((5, 3), (0,), 0)])
def test_gather_v2(element_type: str, index_type: str, x_dims: tuple[int, ...],
                   index_dims: tuple[int, ...], axis: int) -> None:
    x, i = Shape(element_type, x_dims), Shape(index_type, index_dims)
    rng = np.random.default_rng(0)
    indices = rng.integers(-3, x_dims[axis] + 3, size=index_dims).astype(i.numpy_dtype)
    _check_both(lambda: build("gather", [x, i], lambda c, ps: [
        _gather_v2(c, ps[0], ps[1], axis)]), as_args([x]) + [indices])


def test_gather_with_index_vector_dimension_and_fused_bitcast() -> None:
    """The form XLA's optimizer prints: indices [4,1], offset_dims={1,2}, then a bitcast."""
    x, i = Shape("f32", (5, 3)), Shape("s32", (4, 1))

    def body(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        g = c.create("gather", ps, offset_dims=(1, 2), collapsed_slice_dims=(),
                     start_index_map=(0,), index_vector_dim=1, slice_sizes=(1, 3))
        return [c.create("bitcast", [g], shape=Shape("f32", (4, 3)))]

    indices = np.array([[4], [0], [7], [-1]], np.int32)
    _check_both(lambda: build("gather_nd", [x, i], body), as_args([x]) + [indices])


def _reduce_window(c: Computation, x: Instruction, window: Window, kind: str, init: float
                   ) -> Instruction:
    assert c.module is not None
    reducer = c.module.reduction_computation(kind, x.shape.element_type)
    return c.create("reduce-window", [x, c.add_constant(init, x.shape.element_type)],
                    window=window, called_computations=[reducer])


WINDOWS = [
    ((3, 6), Window.of((1, 6), padding=((0, 0), (5, 0)))),  # tf.cumsum
    ((5, 7), Window.of((2, 3), (2, 2))),  # pooling
    ((5, 7), Window.of((3, 3), (1, 1), ((1, 1), (1, 1)))),  # SAME pooling
    ((4,), Window((WindowDimension(2, 1, 1, 1, window_dilation=2, base_dilation=2),))),
    ((0, 3), Window.of((1, 2))),
    ((2,), Window.of((3,))),  # window larger than the input: empty result
    # AvgPoolGrad's form: the gradient dilated by the strides, padded by k - 1 - low
    ((3, 4), Window((WindowDimension(3, 1, 2, 2, 1, 2), WindowDimension(2, 1, 1, 0, 1, 3)))),
    ((1, 5, 4, 2), Window.of((1, 3, 3, 1), (1, 2, 1, 1), ((0, 0), (1, 1), (0, 2), (0, 0)))),
    ((2, 70), Window.of((1, 70), padding=((0, 0), (69, 0)))),  # past the unrolled size
]


@pytest.mark.parametrize("element_type", ["f32", "f64", "s32"])
@pytest.mark.parametrize("kind,init", [("add", 0.0), ("maximum", -np.inf), ("add", 2.0)])
@pytest.mark.parametrize("case", range(len(WINDOWS)))
def test_reduce_window(element_type: str, kind: str, init: float, case: int) -> None:
    dims, window = WINDOWS[case]
    if element_type == "s32" and np.isinf(init):
        init = float(np.iinfo(np.int32).min)
    shape = Shape(element_type, dims)
    module = build("reduce_window", [shape], lambda c, ps: [
        _reduce_window(c, c.create("negate", ps), window, kind, init)])
    executable = check(module, as_args([shape], edges=element_type != "f32" or kind != "add"),
                       "Sum")
    assert executable.kernel_count == 2  # the negate is never fused into the window


def test_variadic_reduce_computes_argmax() -> None:
    shape = Shape("f32", (4, 7))

    def body(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        module = c.module
        assert module is not None
        minmax = module.new_computation("minmax")
        a, i, b, j = (minmax.add_parameter(n, Shape(t, ())) for n, t in
                      enumerate(("f32", "s32", "f32", "s32")))
        ge = minmax.create("compare", [a, b], direction="GE")
        minmax.root = minmax.create("tuple", [minmax.create("select", [ge, a, b]),
                                              minmax.create("select", [ge, i, j])])
        iota = c.create("iota", shape=Shape("s32", shape.dims), iota_dimension=1)
        result = c.create("reduce", [ps[0], iota, c.add_constant(-np.inf, "f32"),
                                     c.add_constant(0, "s32")],
                          dimensions=(1,), called_computations=[minmax])
        return [c.create("get-tuple-element", [result], index=1)]

    # Variadic reduces compile (codegen/cpu/variadic_reduce.py); test_multi_output.py
    # covers them over shapes, reductions and thread counts.
    check(build("argmax", [shape], body), as_args([shape], edges=False), "ArgMax")


def test_pad_and_reverse_fuse_into_one_kernel() -> None:
    shape = Shape("f32", (6, 8))

    def body(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        flipped = c.create("reverse", [c.create("exponential", ps)], dimensions=(1,))
        padded = c.create("pad", [flipped, c.add_constant(0.0, "f32")],
                          padding=PaddingConfig.of((1, 1), (0, 2, 1)))
        return [c.create("multiply", [padded, padded])]

    module: HloModule = build("fused", [shape], body)
    executable = check(module, as_args([shape]), "exponential")
    assert executable.kernel_count == 1


# -- scatter ------------------------------------------------------------------------------

def _scatter(c: Computation, ps: list[Instruction], kind: str, **dims: object) -> Instruction:
    assert c.module is not None
    combiner = c.module.reduction_computation(kind, ps[0].shape.element_type)
    return c.create("scatter", ps, called_computations=[combiner], **dims)


_SEGMENT_DIMS = {"update_window_dims": (1,), "inserted_window_dims": (0,),
                 "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1}


@pytest.mark.parametrize("element_type,kind", [("f32", "add"), ("f64", "add"), ("s32", "add"),
                                               ("f32", "maximum"), ("s64", "minimum"),
                                               ("pred", "or"), ("f16", "add")])
@pytest.mark.parametrize("index_type", ["s32", "s64", "u8"])
def test_scatter_segment_form(element_type: str, kind: str, index_type: str) -> None:
    """UnsortedSegmentSum's form: rows of updates combined into rows of the operand,
    repeated rows combined in order, rows out of range skipped."""
    x, i, u = Shape(element_type, (6, 3)), Shape(index_type, (9,)), Shape(element_type, (9, 3))
    dtype = i.numpy_dtype
    ids = np.array([0, 5, 2, 2, 5, 7 if dtype.kind == "u" else -1, 0, 6, 2]).astype(dtype)
    args = as_args([x]) + [ids] + as_args([u], seed=1)
    _check_both(lambda: build("scatter", [x, i, u], lambda c, ps: [
        _scatter(c, ps, kind, **_SEGMENT_DIMS)]), args)


@pytest.mark.parametrize("case", range(3))
def test_scatter_index_vectors_and_windows(case: int) -> None:
    """ScatterNd's forms: full index vectors (element updates), partial ones (row windows),
    scalar indices into a vector, an empty update set."""
    forms = [
        ((4, 5), (6, 2), (6,), {"update_window_dims": (), "inserted_window_dims": (0, 1),
                                "scatter_dims_to_operand_dims": (0, 1), "index_vector_dim": 1}),
        ((4, 5), (2, 3, 1), (2, 3, 5), {"update_window_dims": (2,),
                                        "inserted_window_dims": (0,),
                                        "scatter_dims_to_operand_dims": (0,),
                                        "index_vector_dim": 2}),
        ((7,), (0,), (0,), {"update_window_dims": (), "inserted_window_dims": (0,),
                            "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1}),
    ]
    x_dims, i_dims, u_dims, dims = forms[case]
    x, i, u = Shape("f32", x_dims), Shape("s32", i_dims), Shape("f32", u_dims)
    rng = np.random.default_rng(case)
    indices = rng.integers(-1, 6, size=i_dims).astype(np.int32)
    args = as_args([x]) + [indices] + as_args([u], seed=2)
    _check_both(lambda: build("scatter", [x, i, u], lambda c, ps: [
        _scatter(c, ps, "add", **dims)]), args)


def test_scatter_then_elementwise_consumers_and_constant_operand() -> None:
    """UnsortedSegmentSum as lowered: scatter into a broadcast zero, then more work."""
    i, u = Shape("s32", (40,)), Shape("f32", (40, 8))

    def body(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        zeros = c.create("broadcast", [c.add_constant(0.0, "f32")],
                         shape=Shape("f32", (50, 8)), dimensions=())
        summed = _scatter(c, [zeros, *ps], "add", **_SEGMENT_DIMS)
        return [c.create("multiply", [summed, summed])]

    ids = np.random.default_rng(3).integers(0, 50, size=40).astype(np.int32)
    _check_both(lambda: build("segment_sum", [i, u], body), [ids] + as_args([u], edges=False))


FUSED_SCATTER = """HloModule fused_scatter

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%fused_computation (p0: f32[6,3], p1: s32[9], p2: f32[9,3]) -> f32[6,3] {
  %p0 = f32[6,3]{1,0} parameter(0)
  %p1 = s32[9]{0} parameter(1)
  %p2 = f32[9,3]{1,0} parameter(2)
  %s = f32[6,3]{1,0} scatter(f32[6,3]{1,0} %p0, s32[9]{0} %p1, f32[9,3]{1,0} %p2), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  ROOT %m = f32[6,3]{1,0} multiply(f32[6,3]{1,0} %s, f32[6,3]{1,0} %s)
}

ENTRY %main (x: f32[6,3], i: s32[9], u: f32[9,3]) -> f32[6,3] {
  %x = f32[6,3]{1,0} parameter(0)
  %i = s32[9]{0} parameter(1)
  %u = f32[9,3]{1,0} parameter(2)
  ROOT %f = f32[6,3]{1,0} fusion(f32[6,3]{1,0} %x, s32[9]{0} %i, f32[9,3]{1,0} %u), kind=kLoop, calls=%fused_computation
}
"""  # noqa: E501 (HLO lines as XLA prints them)


def test_scatter_inside_a_fusion_uses_its_element_generator() -> None:
    """A scatter at a kernel's root is a serial kernel of its own; inside a fusion it is
    computed per output element, reading every update that lands there."""
    module = parse_module(FUSED_SCATTER)
    verify(module)
    ids = np.array([0, 5, 2, 2, 5, -1, 0, 6, 2], np.int32)
    args = as_args([Shape("f32", (6, 3))]) + [ids] + as_args([Shape("f32", (9, 3))], seed=1)
    executable = compile_unfused(module)
    assert "scatter.accumulator" in executable.llvm_ir
    expected = evaluate(module, *args)
    assert_close(executable(*args)[0], expected, "Mul")


def test_unfused_scatter_is_a_serial_kernel() -> None:
    x, i, u = Shape("f32", (6, 3)), Shape("s32", (9,)), Shape("f32", (9, 3))
    module = build("scatter", [x, i, u], lambda c, ps: [_scatter(c, ps, "add", **_SEGMENT_DIMS)])
    executable = compile_module(module)
    assert "scatter.accumulator" not in executable.llvm_ir and "update" in executable.llvm_ir
