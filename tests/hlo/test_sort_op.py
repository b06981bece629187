"""HLO `sort`: shape rule, verifier, text round trip and the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import ParseError, parse_module
from tfxla_lite.hlo.printer import module_to_text
from tfxla_lite.hlo.sort import merge_sort_order
from tfxla_lite.hlo.verifier import VerificationError, verify

# XLA's text for tf.math.top_k's sort (values and iota indices, descending, stable).
TOP_K = """HloModule top_k

%compare (p.0.lhs: f32[], p.0.rhs: f32[], p.1.lhs: s32[], p.1.rhs: s32[]) -> pred[] {
  %p.0.lhs = f32[] parameter(0)
  %p.0.rhs = f32[] parameter(1)
  %p.1.lhs = s32[] parameter(2)
  %p.1.rhs = s32[] parameter(3)
  ROOT %gt = pred[] compare(f32[] %p.0.lhs, f32[] %p.0.rhs), direction=GT
}

ENTRY %main (a: f32[3,5]) -> (f32[3,5], s32[3,5]) {
  %a = f32[3,5]{1,0} parameter(0)
  %iota = s32[3,5]{1,0} iota(), iota_dimension=1
  ROOT %sort = (f32[3,5]{1,0}, s32[3,5]{1,0}) sort(f32[3,5]{1,0} %a, s32[3,5]{1,0} %iota),
    dimensions={1}, is_stable=true, to_apply=%compare
}
"""

ONE = """HloModule ascending

%less (x: s32[], y: s32[]) -> pred[] {
  %x = s32[] parameter(0)
  %y = s32[] parameter(1)
  ROOT %lt = pred[] compare(s32[] %x, s32[] %y), direction=LT
}

ENTRY %main (a: s32[4,3]) -> s32[4,3] {
  %a = s32[4,3]{1,0} parameter(0)
  ROOT %sort = s32[4,3]{1,0} sort(s32[4,3]{1,0} %a), dimensions={0}, to_apply=%less
}
"""


def test_round_trip_and_verify() -> None:
    for text in (TOP_K, ONE):
        module = parse_module(text)
        verify(module)
        printed = module_to_text(module)
        assert module_to_text(parse_module(printed)) == printed
    assert parse_module(TOP_K).entry.root.attributes["is_stable"] is True


def test_descending_stable_with_indices() -> None:
    x = np.array([[3, 1, 2, 2, 5], [0, -1, 4, 4, 4], [1, 1, 1, 1, 1]], np.float32)
    values, indices = evaluate(parse_module(TOP_K), x)
    order = np.argsort(-x, axis=1, kind="stable")
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, 1))


def test_one_operand_along_a_major_dimension() -> None:
    x = np.array([[5, 0, 2], [1, 9, 2], [3, -4, 2], [2, 1, 0]], np.int32)
    np.testing.assert_array_equal(evaluate(parse_module(ONE), x), np.sort(x, axis=0))


@pytest.mark.parametrize("length", [0, 1, 2, 3, 7, 8, 33])
def test_merge_order_is_a_stable_sort(length: int) -> None:
    keys = np.random.default_rng(length).integers(0, 4, length)
    order = merge_sort_order(length, lambda i, j: keys[i] < keys[j])
    assert order == list(np.argsort(keys, kind="stable"))


def test_shape_and_comparator_errors() -> None:
    bad_dimension = ONE.replace("dimensions={0}", "dimensions={2}")
    with pytest.raises(VerificationError, match="sort takes one dimension"):
        verify(parse_module(bad_dimension))
    bad_comparator = ONE.replace("ROOT %lt = pred[] compare(s32[] %x, s32[] %y), direction=LT",
                                 "ROOT %lt = s32[] add(s32[] %x, s32[] %y)").replace(
        "-> pred[] {", "-> s32[] {")
    with pytest.raises(VerificationError, match="to pred"):
        verify(parse_module(bad_comparator))
    with pytest.raises(ParseError, match="true or false"):
        parse_module(TOP_K.replace("is_stable=true", "is_stable=yes"))


TOPK = """HloModule topk

ENTRY %main (x: f32[2,9]) -> (f32[2,4], s32[2,4]) {
  %x = f32[2,9]{1,0} parameter(0)
  ROOT %topk = (f32[2,4]{1,0}, s32[2,4]{1,0}) topk(f32[2,9]{1,0} %x), k=4, largest=true
}
"""


def test_topk_round_trip_and_order() -> None:
    module = parse_module(TOPK)
    verify(module)
    printed = module_to_text(module)
    assert module_to_text(parse_module(printed)) == printed
    row = [1.0, np.nan, 3.0, -np.inf, np.nan, 0.0, -0.0, np.inf, 3.0]
    x = np.array([row, row[::-1]], np.float32)
    values, indices = evaluate(module, x)
    # NaN first, then by value; equal values (NaNs, 3.0 and 3.0) by index.
    np.testing.assert_array_equal(indices, [[1, 4, 7, 2], [4, 7, 1, 0]])
    np.testing.assert_array_equal(values, np.take_along_axis(x, indices, 1))
    smallest = parse_module(TOPK.replace("largest=true", "largest=false"))
    _, lowest = evaluate(smallest, x)
    np.testing.assert_array_equal(lowest, [[3, 5, 6, 0], [5, 2, 3, 8]])


def test_topk_errors() -> None:
    with pytest.raises(VerificationError, match="topk k=10 out of"):
        verify(parse_module(TOPK.replace("k=4", "k=10").replace("[2,4]", "[2,10]")))
