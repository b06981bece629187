"""reverse, pad, dynamic-slice, dynamic-update-slice, gather, reduce-window, variadic
reduce, while and conditional: shape rules, NumPy references against independent
NumPy spellings, verifier checks, and parse → print round trips of their attributes."""

from __future__ import annotations

import numpy as np
import pytest
from hlo_builders import argmax_reducer, new_module, parameters

from tfxla_lite.hlo.attributes import PaddingConfig, Window, WindowDimension, parse_window
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import ShapeError
from tfxla_lite.hlo.parser import ParseError, parse_module
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import VerificationError, verify


def _module(shapes: list[Shape], body) -> HloModule:  # type: ignore[no-untyped-def]
    module, comp = new_module()
    params = parameters(comp, *shapes)
    comp.root = body(comp, params)
    verify(module)
    return module


# -- reverse and pad --------------------------------------------------------------------

@pytest.mark.parametrize("dims,axes", [((3, 4), (1,)), ((2, 3, 4), (0, 2)), ((0, 3), (0,)),
                                       ((5,), ())])
def test_reverse_is_np_flip(dims: tuple[int, ...], axes: tuple[int, ...]) -> None:
    x = np.arange(int(np.prod(dims)), dtype=np.int32).reshape(dims)
    module = _module([Shape("s32", dims)], lambda c, ps: c.create("reverse", ps, dimensions=axes))
    np.testing.assert_array_equal(evaluate(module, x), np.flip(x, axes))


def test_reverse_rejects_bad_dimensions() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, Shape("f32", (2, 2)))
    with pytest.raises(ShapeError, match="reverse dimensions"):
        comp.create("reverse", [x], dimensions=(0, 0))


def _reference_pad(x: np.ndarray, value: float, config: list[tuple[int, int, int]]) -> np.ndarray:
    """Interior padding by index arithmetic, then np.pad for the positive edges and
    slicing for the negative ones."""
    for axis, (_, _, interior) in enumerate(config):
        if interior and x.shape[axis] > 1:
            positions = np.arange(x.shape[axis] - 1) + 1
            x = np.insert(x, np.repeat(positions, interior), value, axis=axis)
    x = np.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi, _ in config], constant_values=value)
    return x[tuple(slice(max(-lo, 0), x.shape[a] - max(-hi, 0))
                   for a, (lo, hi, _) in enumerate(config))]


@pytest.mark.parametrize("dims,config", [
    ((3, 4), [(1, 0, 0), (0, 2, 0)]),
    ((3, 4), [(-1, 2, 1), (2, -3, 0)]),
    ((2, 3, 2), [(0, 0, 2), (1, 1, 1), (-1, 0, 0)]),
    ((0, 2), [(1, 1, 3), (0, 0, 0)]),
    ((4,), [(-2, -2, 0)]),
])
def test_pad_matches_numpy(dims: tuple[int, ...], config: list[tuple[int, int, int]]) -> None:
    x = np.arange(1, 1 + int(np.prod(dims)), dtype=np.float32).reshape(dims)
    module = _module([Shape("f32", dims), Shape("f32", ())], lambda c, ps: c.create(
        "pad", ps, padding=PaddingConfig.of(*config)))
    np.testing.assert_array_equal(evaluate(module, x, np.float32(-7)),
                                  _reference_pad(x, -7, config))


def test_pad_shape_rule_errors() -> None:
    module, comp = new_module()
    x, v, i = parameters(comp, Shape("f32", (2,)), Shape("f32", ()), Shape("s32", ()))
    with pytest.raises(ShapeError, match="negative dimension"):
        comp.create("pad", [x, v], padding=PaddingConfig.of((-2, -1)))
    with pytest.raises(ShapeError, match="differ in type"):
        comp.create("pad", [x, i], padding=PaddingConfig.of((0, 0)))
    with pytest.raises(ShapeError, match="does not fit"):
        comp.create("pad", [x, v], padding=PaddingConfig.of((0, 0), (0, 0)))


# -- dynamic slices -----------------------------------------------------------------------

@pytest.mark.parametrize("starts", [(0, 0), (1, 2), (-5, 1), (9, 9), (2, -1)])
def test_dynamic_slice_clamps_like_xla(starts: tuple[int, int]) -> None:
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    module = _module([Shape("f32", (4, 5)), Shape("s32", ()), Shape("s32", ())],
                     lambda c, ps: c.create("dynamic-slice", ps, dynamic_slice_sizes=(2, 3)))
    r = min(max(starts[0], 0), 2)
    k = min(max(starts[1], 0), 2)
    np.testing.assert_array_equal(evaluate(module, x, *starts), x[r:r + 2, k:k + 3])


@pytest.mark.parametrize("starts", [(0, 0), (3, 4), (-1, 2), (1, 100)])
def test_dynamic_update_slice_clamps_like_xla(starts: tuple[int, int]) -> None:
    x = np.zeros((4, 5), np.int32)
    update = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    module = _module([Shape("s32", (4, 5)), Shape("s32", (2, 3)), Shape("s64", ()),
                      Shape("s64", ())], lambda c, ps: c.create("dynamic-update-slice", ps))
    r = min(max(starts[0], 0), 2)
    k = min(max(starts[1], 0), 2)
    expected = x.copy()
    expected[r:r + 2, k:k + 3] = update
    np.testing.assert_array_equal(evaluate(module, x, update, *starts), expected)


def test_dynamic_slice_shape_rule_errors() -> None:
    module, comp = new_module()
    x, i, f = parameters(comp, Shape("f32", (4,)), Shape("s32", ()), Shape("f32", ()))
    with pytest.raises(ShapeError, match="out of"):
        comp.create("dynamic-slice", [x, i], dynamic_slice_sizes=(5,))
    with pytest.raises(ShapeError, match="integer scalars"):
        comp.create("dynamic-slice", [x, f], dynamic_slice_sizes=(1,))
    with pytest.raises(ShapeError, match="one start index per dimension"):
        comp.create("dynamic-slice", [x], dynamic_slice_sizes=(1,))


# -- gather ---------------------------------------------------------------------------------

def gather_v2(comp: Computation, x: Instruction, indices: Instruction, axis: int = 0
              ) -> Instruction:
    """tf.gather(x, indices, axis) as TF's GatherV2 lowers it (index_vector_dim = rank)."""
    rank = indices.shape.rank
    sizes = list(x.shape.dims)
    sizes[axis] = 1
    offset_dims = tuple(list(range(axis)) + list(range(axis + rank, x.shape.rank + rank - 1)))
    return comp.create("gather", [x, indices], offset_dims=offset_dims,
                       collapsed_slice_dims=(axis,), start_index_map=(axis,),
                       index_vector_dim=rank, slice_sizes=tuple(sizes))


@pytest.mark.parametrize("x_dims,index_dims,axis", [((5, 3), (4,), 0), ((5, 3), (2, 2), 1),
                                                    ((2, 4, 3), (3,), 1), ((5, 3), (0,), 0),
                                                    ((0, 3), (2,), 1)])
def test_gather_v2_is_np_take_with_clamping(x_dims: tuple[int, ...],
                                            index_dims: tuple[int, ...], axis: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_dims).astype(np.float32)
    indices = rng.integers(-3, x_dims[axis] + 3, size=index_dims).astype(np.int32)
    module = _module([Shape("f32", x_dims), Shape("s32", index_dims)],
                     lambda c, ps: gather_v2(c, ps[0], ps[1], axis))
    clamped = np.clip(indices, 0, max(x_dims[axis] - 1, 0))
    expected = np.take(x, clamped, axis=axis) if x.size else \
        np.zeros(module.entry.root.shape.dims, np.float32)
    np.testing.assert_array_equal(evaluate(module, x, indices), expected)


def test_gather_with_explicit_index_vector_and_uncollapsed_slice() -> None:
    """XLA's optimized form: indices [4,1], index_vector_dim=1, offset_dims={1,2}."""
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    indices = np.array([[4], [0], [7], [-1]], np.int32)
    module = _module([Shape("f32", (5, 3)), Shape("s32", (4, 1))], lambda c, ps: c.create(
        "gather", ps, offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0,),
        index_vector_dim=1, slice_sizes=(1, 3)))
    assert module.entry.root.shape == Shape("f32", (4, 1, 3))
    expected = x[np.clip(indices[:, 0], 0, 4)][:, None, :]
    np.testing.assert_array_equal(evaluate(module, x, indices), expected)


def test_gather_of_two_dimensional_start_vectors() -> None:
    """tf.gather_nd: each index vector picks a row and column start."""
    x = np.arange(24, dtype=np.int32).reshape(4, 6)
    indices = np.array([[0, 0], [3, 5], [2, 1]], np.int32)
    module = _module([Shape("s32", (4, 6)), Shape("s32", (3, 2))], lambda c, ps: c.create(
        "gather", ps, offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0, 1),
        index_vector_dim=1, slice_sizes=(1, 2)))
    expected = np.stack([x[r, min(k, 4):min(k, 4) + 2] for r, k in indices])
    np.testing.assert_array_equal(evaluate(module, x, indices), expected)


def test_gather_shape_rule_errors() -> None:
    module, comp = new_module()
    x, i = parameters(comp, Shape("f32", (5, 3)), Shape("s32", (4,)))
    with pytest.raises(ShapeError, match="slice size 1"):
        comp.create("gather", [x, i], offset_dims=(1,), collapsed_slice_dims=(0,),
                    start_index_map=(0,), index_vector_dim=1, slice_sizes=(2, 3))
    with pytest.raises(ShapeError, match="offset_dims"):
        comp.create("gather", [x, i], offset_dims=(), collapsed_slice_dims=(0,),
                    start_index_map=(0,), index_vector_dim=1, slice_sizes=(1, 3))


# -- reduce-window ----------------------------------------------------------------------

def reduce_window(comp: Computation, x: Instruction, window: Window, kind: str = "add",
                  init: float = 0.0) -> Instruction:
    assert comp.module is not None
    element_type = x.shape.element_type
    reducer = comp.module.reduction_computation(kind, element_type)
    return comp.create("reduce-window", [x, comp.add_constant(init, element_type)],
                       window=window, called_computations=[reducer])


def test_reduce_window_cumsum_form() -> None:
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    module = _module([Shape("f32", (3, 6))], lambda c, ps: reduce_window(
        c, ps[0], Window.of((1, 6), padding=((0, 0), (5, 0)))))
    np.testing.assert_allclose(evaluate(module, x), np.cumsum(x, axis=1), rtol=1e-6)


@pytest.mark.parametrize("stride,padding", [((2, 2), ((0, 0), (0, 0))),
                                            ((1, 1), ((1, 1), (1, 1))),
                                            ((2, 3), ((0, 1), (2, 0)))])
def test_reduce_window_max_pool(stride: tuple[int, int],
                                padding: tuple[tuple[int, int], ...]) -> None:
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(np.float32)
    window = Window.of((2, 3), stride, padding)
    module = _module([Shape("f32", (5, 7))], lambda c, ps: reduce_window(
        c, ps[0], window, "maximum", -np.inf))
    padded = np.pad(x, padding, constant_values=-np.inf)
    out = module.entry.root.shape.dims
    expected = np.array([[padded[i * stride[0]:i * stride[0] + 2,
                                 j * stride[1]:j * stride[1] + 3].max()
                          for j in range(out[1])] for i in range(out[0])], np.float32)
    np.testing.assert_array_equal(evaluate(module, x), expected.reshape(out))


def test_reduce_window_dilations_and_init_folded_once() -> None:
    """Base dilation holes and padding are skipped, not folded with the init value;
    the general (non-fast) path agrees with the fast one."""
    x = np.arange(1, 5, dtype=np.float32)
    window = Window((WindowDimension(2, 1, 1, 1, window_dilation=2, base_dilation=2),))
    module = _module([Shape("f32", (4,))], lambda c, ps: reduce_window(c, ps[0], window,
                                                                        "add", 10.0))
    # dilated base: [1 _ 2 _ 3 _ 4], padded by one each side: size 9; window taps i, i+2.
    base = [None, 1, None, 2, None, 3, None, 4, None]
    expected = [10 + sum(v for v in (base[i], base[i + 2]) if v is not None) for i in range(7)]
    np.testing.assert_array_equal(evaluate(module, x), np.array(expected, np.float32))
    # The same through a reducer the fast path does not know (x + y spelled y + x).
    module2, comp = new_module()
    (p,) = parameters(comp, Shape("f32", (4,)))
    reducer = module2.new_computation("add_swapped")
    a = reducer.add_parameter(0, Shape("f32", ()))
    b = reducer.add_parameter(1, Shape("f32", ()))
    reducer.root = reducer.create("add", [b, reducer.create("copy", [a])])
    comp.root = comp.create("reduce-window", [p, comp.add_constant(10.0, "f32")],
                            window=window, called_computations=[reducer])
    verify(module2)
    np.testing.assert_array_equal(evaluate(module2, x), np.array(expected, np.float32))


def test_reduce_window_on_empty_and_oversized_windows() -> None:
    module = _module([Shape("f32", (0, 3))], lambda c, ps: reduce_window(
        c, ps[0], Window.of((1, 2))))
    assert evaluate(module, np.zeros((0, 3), np.float32)).shape == (0, 2)
    module = _module([Shape("f32", (2,))], lambda c, ps: reduce_window(c, ps[0], Window.of((3,))))
    assert evaluate(module, np.ones(2, np.float32)).shape == (0,)


# -- variadic reduce (argmax) -------------------------------------------------------------

def argmax_module(dims: tuple[int, int], element_type: str = "f32") -> HloModule:
    """TF's ArgMax lowering: reduce of (values, iota) with a 4-parameter comparator."""
    module, comp = new_module("argmax")
    (x,) = parameters(comp, Shape(element_type, dims))
    minmax = argmax_reducer(module, element_type, "minmax")
    iota = comp.create("iota", shape=Shape("s32", dims), iota_dimension=1)
    low = -np.inf if element_type.startswith("f") else np.iinfo(np.dtype("int32")).min
    result = comp.create("reduce", [x, iota, comp.add_constant(low, element_type),
                                    comp.add_constant(0, "s32")],
                         dimensions=(1,), called_computations=[minmax])
    comp.root = comp.create("get-tuple-element", [result], index=1)
    verify(module)
    return module


def test_variadic_reduce_is_argmax() -> None:
    x = np.random.default_rng(3).standard_normal((4, 7)).astype(np.float32)
    x[1, 2] = x[1, 5] = 9.0  # ties pick the lower index
    np.testing.assert_array_equal(evaluate(argmax_module((4, 7)), x), np.argmax(x, axis=1))


def test_variadic_reducer_signature_is_verified() -> None:
    module = argmax_module((2, 3))
    reduce_inst = module.entry.root.operand(0)
    reduce_inst.called_computations[0] = module.reduction_computation("add", "f32")
    with pytest.raises(VerificationError, match="does not take"):
        verify(module)


# -- while and conditional ----------------------------------------------------------------

WHILE_TEXT = """HloModule loop

%cond (state: (s32[], f32[3])) -> pred[] {
  %state = (s32[], f32[3]{0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %n = s32[] constant(4)
  ROOT %less = pred[] compare(%i, %n), direction=LT
}

%body (state.1: (s32[], f32[3])) -> (s32[], f32[3]) {
  %state.1 = (s32[], f32[3]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%state.1), index=0
  %x = f32[3]{0} get-tuple-element(%state.1), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i.1, %one)
  %doubled = f32[3]{0} add(%x, %x)
  ROOT %tuple = (s32[], f32[3]{0}) tuple(%next, %doubled)
}

%negate_branch (a: f32[3]) -> f32[3] {
  %a = f32[3]{0} parameter(0)
  ROOT %neg = f32[3]{0} negate(%a)
}

%exp_branch (b: f32[3]) -> f32[3] {
  %b = f32[3]{0} parameter(0)
  ROOT %exp = f32[3]{0} exponential(%b)
}

ENTRY %main (x.1: f32[3], p: pred[], k: s32[]) -> (f32[3], f32[3]) {
  %x.1 = f32[3]{0} parameter(0)
  %p = pred[] parameter(1)
  %k = s32[] parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], f32[3]{0}) tuple(%zero, %x.1)
  %loop = (s32[], f32[3]{0}) while(%init), body=%body, condition=%cond
  %result = f32[3]{0} get-tuple-element(%loop), index=1
  %if = f32[3]{0} conditional(%p, %result, %x.1), true_computation=%negate_branch, false_computation=%exp_branch
  %switch = f32[3]{0} conditional(%k, %x.1, %x.1), branch_computations={%exp_branch, %negate_branch}
  ROOT %out = (f32[3]{0}, f32[3]{0}) tuple(%if, %switch)
}
"""  # noqa: E501 (HLO lines as XLA prints them)


def test_while_and_conditional_parse_verify_evaluate_and_round_trip() -> None:
    module = parse_module(WHILE_TEXT)
    verify(module)
    loop = next(i for i in module.entry.instructions if i.opcode == "while")
    assert [c.name for c in loop.called_computations] == ["cond", "body"]
    x = np.array([1.0, -2.0, 0.5], np.float32)
    for p, k, first, second in [(True, 0, -16 * x, np.exp(x)), (False, 1, np.exp(x), -x),
                                (True, 7, -16 * x, -x), (False, -1, np.exp(x), -x)]:
        got = evaluate(module, x, np.bool_(p), np.int32(k))
        np.testing.assert_allclose(got[0], first, rtol=1e-6)
        np.testing.assert_allclose(got[1], second, rtol=1e-6)
    text = module.to_text()
    assert "condition=%cond, body=%body" in text
    assert "true_computation=%negate_branch, false_computation=%exp_branch" in text
    assert "branch_computations={%exp_branch, %negate_branch}" in text
    assert parse_module(text).to_text() == text


def test_while_with_a_body_of_the_wrong_shape_fails_to_verify() -> None:
    text = WHILE_TEXT.replace("body=%body", "body=%negate_branch")
    with pytest.raises(VerificationError, match="does not take the loop state"):
        verify(parse_module(text))


def test_conditional_with_wrong_branch_count_fails_to_verify() -> None:
    # The parser refuses true_computation= without false_computation=; one branch
    # under a pred selector is still text it reads, and the verifier's to refuse.
    text = WHILE_TEXT.replace("true_computation=%negate_branch, false_computation=%exp_branch",
                              "branch_computations={%negate_branch}")
    with pytest.raises(VerificationError, match="true and a false"):
        verify(parse_module(text))
    with pytest.raises(ParseError, match="false_computation"):
        parse_module(WHILE_TEXT.replace(", false_computation=%exp_branch", ""))


# -- parsing and printing attributes ---------------------------------------------------------

ATTRIBUTES_TEXT = """HloModule attrs

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

ENTRY %main (a: f32[5,3], i: s32[4], j: s32[]) -> (f32[9,4], f32[5,3], f32[4,3], f32[2,3], f32[3,2], f32[5,3]) {
  %a = f32[5,3]{1,0} parameter(0)
  %i = s32[4]{0} parameter(1)
  %j = s32[] parameter(2)
  %zero = f32[] constant(0)
  %pad = f32[9,4]{1,0} pad(%a, %zero), padding=1_-1_1x0_1
  %rev = f32[5,3]{1,0} reverse(%a), dimensions={0,1}
  %g = f32[4,3]{1,0} gather(%a, %i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,3}, indices_are_sorted=false
  %ds = f32[2,3]{1,0} dynamic-slice(%a, %j, %j), dynamic_slice_sizes={2,3}
  %rw = f32[3,2]{1,0} reduce-window(%a, %zero), window={size=2x2 stride=2x1 pad=1_0x0_0 lhs_dilate=1x1 rhs_dilate=1x1}, to_apply=%add
  %dus = f32[5,3]{1,0} dynamic-update-slice(%a, %ds, %j, %j)
  ROOT %t = (f32[9,4]{1,0}, f32[5,3]{1,0}, f32[4,3]{1,0}, f32[2,3]{1,0}, f32[3,2]{1,0}, f32[5,3]{1,0}) tuple(%pad, %rev, %g, %ds, %rw, %dus)
}
"""  # noqa: E501 (HLO lines as XLA prints them)


def test_attributes_parse_into_values_and_print_back() -> None:
    module = parse_module(ATTRIBUTES_TEXT)
    verify(module)
    by_name = {i.name: i for i in module.entry.instructions}
    assert by_name["pad"].attributes["padding"] == PaddingConfig.of((1, -1, 1), (0, 1))
    assert by_name["rw"].attributes["window"] == Window.of((2, 2), (2, 1), ((1, 0), (0, 0)))
    assert by_name["g"].attributes["slice_sizes"] == (1, 3)
    assert by_name["g"].attributes["index_vector_dim"] == 1
    assert by_name["ds"].attributes["dynamic_slice_sizes"] == (2, 3)
    text = module.to_text()
    assert "padding=1_-1_1x0_1" in text
    assert "window={size=2x2 stride=2x1 pad=1_0x0_0}" in text
    assert parse_module(text).to_text() == text
    args = [np.arange(15, dtype=np.float32).reshape(5, 3), np.array([0, 4, 9, -2], np.int32),
            np.int32(2)]
    results = evaluate(module, *args)
    assert [r.shape for r in results] == [(9, 4), (5, 3), (4, 3), (2, 3), (3, 2), (5, 3)]


@pytest.mark.parametrize("bad,message", [
    ("padding=1_-1_1x0_1", "padding=1x0_1"),
    ("window={size=2x2 stride=2x1", "window={size=2x2 stride=2 "),
    ("window={size=2x2 stride=2x1", "window={stride=2x1"),
])
def test_malformed_structured_attributes_raise_parse_errors(bad: str, message: str) -> None:
    with pytest.raises(ParseError):
        parse_module(ATTRIBUTES_TEXT.replace(bad, message))


def test_window_text_round_trip() -> None:
    for text in ("{size=3}", "{size=1x6 pad=0_0x5_0}", "{size=2 stride=2 lhs_dilate=3}",
                 "{size=2x2 rhs_dilate=2x1}"):
        assert str(parse_window(text)) == text


# -- scatter ------------------------------------------------------------------------------

# As TF's XLA prints UnsortedSegmentSum and TensorScatterUpdate (metadata dropped).
SCATTER_TEXT = """HloModule scatter, entry_computation_layout={(f32[3,4]{1,0}, s32[3]{0}, f32[5,4]{1,0}, s32[2,1]{1,0}, f32[2,4]{1,0})->(f32[5,4]{1,0}, f32[5,4]{1,0})}

%scatter-combiner.1 (p0.1: f32[], p1.1: f32[]) -> f32[] {
  %p0.1 = f32[] parameter(0)
  %p1.1 = f32[] parameter(1)
  ROOT %add.1 = f32[] add(f32[] %p0.1, f32[] %p1.1)
}

%scatter-combiner.2 (p0.2: f32[], p1.2: f32[]) -> f32[] {
  %p0.2 = f32[] parameter(0)
  ROOT %p1.2 = f32[] parameter(1)
}

ENTRY %main (data: f32[3,4], ids: s32[3], x: f32[5,4], i: s32[2,1], u: f32[2,4]) -> (f32[5,4], f32[5,4]) {
  %data = f32[3,4]{1,0} parameter(0)
  %ids = s32[3]{0} parameter(1)
  %x = f32[5,4]{1,0} parameter(2)
  %i = s32[2,1]{1,0} parameter(3)
  %u = f32[2,4]{1,0} parameter(4)
  %zero = f32[] constant(0)
  %zeros = f32[5,4]{1,0} broadcast(f32[] %zero), dimensions={}
  %sum = f32[5,4]{1,0} scatter(f32[5,4]{1,0} %zeros, s32[3]{0} %ids, f32[3,4]{1,0} %data), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%scatter-combiner.1
  %update = f32[5,4]{1,0} scatter(f32[5,4]{1,0} %x, s32[2,1]{1,0} %i, f32[2,4]{1,0} %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%scatter-combiner.2
  ROOT %t = (f32[5,4]{1,0}, f32[5,4]{1,0}) tuple(f32[5,4]{1,0} %sum, f32[5,4]{1,0} %update)
}
"""  # noqa: E501 (HLO lines as XLA prints them)


def test_scatter_parses_verifies_evaluates_and_round_trips() -> None:
    module = parse_module(SCATTER_TEXT)
    verify(module)
    by_name = {i.name: i for i in module.entry.instructions}
    assert by_name["sum"].attributes["update_window_dims"] == (1,)
    assert by_name["sum"].attributes["scatter_dims_to_operand_dims"] == (0,)
    text = module.to_text()
    assert "update_window_dims={1}, inserted_window_dims={0}, " \
           "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%scatter-combiner.1" \
           in text
    assert parse_module(text).to_text() == text
    rng = np.random.default_rng(0)
    data = rng.normal(size=(3, 4)).astype(np.float32)
    ids = np.array([4, 1, 4], np.int32)  # a repeated segment
    x = rng.normal(size=(5, 4)).astype(np.float32)
    i = np.array([[3], [3]], np.int32)  # a repeated target: the last update wins
    u = np.arange(8, dtype=np.float32).reshape(2, 4)
    summed, updated = evaluate(module, data, ids, x, i, u)
    want = np.zeros((5, 4), np.float32)
    np.add.at(want, ids, data)
    np.testing.assert_array_equal(summed, want)
    want = x.copy()
    want[3] = u[1]
    np.testing.assert_array_equal(updated, want)


def _scatter_module(operand: Shape, indices: Shape, updates: Shape, kind: str,
                    **dims: tuple[int, ...] | int) -> HloModule:
    module, comp = new_module()
    x, i, u = parameters(comp, operand, indices, updates)
    combiner = module.reduction_computation(kind, operand.element_type)
    comp.root = comp.create("scatter", [x, i, u], called_computations=[combiner], **dims)
    verify(module)
    return module


def test_scatter_skips_windows_out_of_bounds_and_takes_index_vectors() -> None:
    # ScatterNd-style: [row, col] index vectors into a [4, 5] operand, windows of [1, 2].
    module = _scatter_module(Shape("s32", (4, 5)), Shape("s64", (3, 2)), Shape("s32", (3, 2)),
                             "add", update_window_dims=(1,), inserted_window_dims=(0,),
                             scatter_dims_to_operand_dims=(0, 1), index_vector_dim=1)
    x = np.zeros((4, 5), np.int32)
    indices = np.array([[1, 3], [1, 4], [-1, 0]], np.int64)  # the 2nd and 3rd fall outside
    updates = np.array([[1, 2], [10, 20], [100, 200]], np.int32)
    want = x.copy()
    want[1, 3:5] += [1, 2]
    np.testing.assert_array_equal(evaluate(module, x, indices, updates), want)


def test_scatter_shape_rule_and_verifier_errors() -> None:
    operand, indices, updates = Shape("f32", (5, 4)), Shape("s32", (3,)), Shape("f32", (3, 4))
    dims = {"update_window_dims": (1,), "inserted_window_dims": (0,),
            "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1}
    for bad, message in [({"update_window_dims": (0,)}, "do not match the scatter dims"),
                         ({"inserted_window_dims": ()}, "do not cover"),
                         ({"scatter_dims_to_operand_dims": (0, 1)}, "index vector of 1")]:
        with pytest.raises(ShapeError, match=message):
            _scatter_module(operand, indices, updates, "add", **{**dims, **bad})
    with pytest.raises(ShapeError, match="scatter operands"):
        _scatter_module(operand, Shape("f32", (3,)), updates, "add", **dims)
    module = _scatter_module(operand, indices, updates, "add", **dims)
    scatter = module.entry.root
    scatter.called_computations[0] = module.reduction_computation("add", "s32")
    with pytest.raises(VerificationError, match="to_apply"):
        verify(module)
