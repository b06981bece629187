"""CPU emitters of reverse, pad, dynamic-slice, dynamic-update-slice, gather and
reduce-window against the NumPy evaluator, over shapes × dtypes with edge values
(NaN, ±inf, ±0, integer bounds, empty arrays, out-of-range start indices), unfused
and through the pipeline (where they fuse with elementwise neighbours)."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_helpers import as_args, build, check

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.attributes import PaddingConfig, Window, WindowDimension
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape

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


def test_variadic_reduce_names_itself_in_codegen() -> None:
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

    with pytest.raises(NotImplementedError, match="variadic reduce"):
        compile_module(build("argmax", [shape], body))


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
