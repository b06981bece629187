"""`Shape`: sizes (cached on the frozen shape) and what caching must not change."""

from __future__ import annotations

import math

import pytest

from tfxla_lite.hlo.parser import ParseError, parse_module
from tfxla_lite.hlo.shape import MAX_ARRAY_SIZE, Shape, ShapeSizeError


@pytest.mark.parametrize("dims, elements", [((), 1), ((0, 7), 0), ((2, 3, 4), 24),
                                            ((1 << 20, 1 << 20, 1 << 20), 1 << 60)])
def test_num_elements_and_byte_size(dims: tuple[int, ...], elements: int) -> None:
    shape = Shape("f32", dims)
    assert shape.num_elements == elements  # exact Python ints
    assert shape.byte_size == 4 * elements
    assert Shape("f16", dims).byte_size == 2 * elements


def test_a_tuple_counts_its_leaves_and_has_no_element_count() -> None:
    shape = Shape.tuple_of([Shape("f32", (2, 3)), Shape("s8", (5,))])
    assert shape.byte_size == 29
    with pytest.raises(ValueError, match="tuple shape"):
        _ = shape.num_elements


def test_cached_sizes_leave_equality_and_hashing_alone() -> None:
    a, b = Shape("f32", (4, 5)), Shape("f32", (4, 5))
    assert a.byte_size == 80
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert str(a) == str(b)


def test_spellings_with_and_without_layout_are_kept_apart_per_shape() -> None:
    array = Shape("f32", (2, 3))
    pair = Shape.tuple_of([array, Shape("s32", ())])
    for _ in range(2):  # the second round reads the cached spellings
        assert array.to_text() == str(array) == "f32[2,3]{1,0}"
        assert array.to_text(layout=False) == "f32[2,3]"
        assert pair.to_text() == str(pair) == "(f32[2,3]{1,0}, s32[])"
        assert pair.to_text(layout=False) == "(f32[2,3], s32[])"
    assert array == Shape("f32", (2, 3)) and hash(array) == hash(Shape("f32", (2, 3)))


@pytest.mark.parametrize(("element_type", "dims"), [
    ("f32", (2**31, 2**31, 8)),  # 2^65 elements: wrapped to 0 in int64
    ("f32", (2**61,)),  # 2^61 elements fit, 2^63 bytes do not
    ("pred", (2**63,)),
    ("s8", (0, 2**64)),  # no elements, but a dimension past int64
])
def test_arrays_past_the_int64_limit_are_refused(element_type: str,
                                                 dims: tuple[int, ...]) -> None:
    with pytest.raises(ShapeSizeError, match=r"at most 2\^63-1"):
        Shape(element_type, dims)


@pytest.mark.parametrize(("element_type", "dims"), [
    ("pred", (2**63 - 1,)), ("f32", ((2**63 - 1) // 4,)), ("f64", (2**30, 2**29, 1)),
])
def test_arrays_up_to_the_limit_are_shapes(element_type: str, dims: tuple[int, ...]) -> None:
    shape = Shape(element_type, dims)
    assert shape.byte_size <= MAX_ARRAY_SIZE and shape.num_elements == math.prod(dims)


def test_parser_refuses_a_shape_past_the_limit() -> None:
    text = ("HloModule m\nENTRY e {\n  p = f32[8]{0} parameter(0)\n"
            "  ROOT b = f32[4294967296,4294967296,8]{2,1,0} broadcast(p), dimensions={2}\n}")
    with pytest.raises(ParseError, match=r"2\^63-1"):
        parse_module(text)
