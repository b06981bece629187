"""HLO `while` and `conditional` compiled by the CPU backend (codegen/cpu/control_flow.py),
checked against the evaluator: loops of 0, 1 and many iterations, tuple state of mixed
element types (scalars, 0-sized arrays), nested loops, a buffer filled by
dynamic-update-slice in a loop, data-dependent trip counts, conditionals on a pred and
on an index (out of range included), and the loop-invariant hoist."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module


def flat(value: Any) -> list[np.ndarray]:
    """The evaluator's result as the executable's flat list of outputs."""
    if isinstance(value, (tuple, list)):
        return [leaf for element in value for leaf in flat(element)]
    return [np.asarray(value)]


def check(text: str, *args: Any, cache: Any = False, op_type: str = "Exp"
          ) -> list[np.ndarray]:
    """Compile `text`, run it on `args` and compare every output with the evaluator's
    (within `op_type`'s tolerance)."""
    expected = flat(evaluate(parse_module(text), *args))
    executable = compile_module(parse_module(text), cache=cache, verify=True)
    got = executable(*args)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert_close(g, e, op_type, "HLO control flow")
    return got


COUNTED = """
HloModule counted

cond {
  p = (s32[], s32[], f32[3,4], f16[5], pred[], s64[], f32[0,3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] get-tuple-element(p), index=1
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], s32[], f32[3,4], f16[5], pred[], s64[], f32[0,3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  x = f32[3,4] get-tuple-element(p), index=2
  half = f32[] constant(0.5)
  hb = f32[3,4] broadcast(half), dimensions={}
  fi = f32[] convert(i)
  fb = f32[3,4] broadcast(fi), dimensions={}
  xh = f32[3,4] multiply(x, hb)
  x1 = f32[3,4] add(xh, fb)
  h = f16[5] get-tuple-element(p), index=3
  h1 = f16[5] negate(h)
  b = pred[] get-tuple-element(p), index=4
  b1 = pred[] not(b)
  s = s64[] get-tuple-element(p), index=5
  si = s64[] convert(i)
  s1 = s64[] add(s, si)
  e = f32[0,3] get-tuple-element(p), index=6
  e1 = f32[0,3] exponential(e)
  ROOT t = (s32[], s32[], f32[3,4], f16[5], pred[], s64[], f32[0,3])
    tuple(i1, n, x1, h1, b1, s1, e1)
}

ENTRY main {
  n = s32[] parameter(0)
  x = f32[3,4] parameter(1)
  h = f16[5] parameter(2)
  e = f32[0,3] parameter(3)
  zero = s32[] constant(0)
  f = pred[] constant(false)
  s = s64[] constant(7)
  init = (s32[], s32[], f32[3,4], f16[5], pred[], s64[], f32[0,3]) tuple(zero, n, x, h, f, s, e)
  ROOT loop = (s32[], s32[], f32[3,4], f16[5], pred[], s64[], f32[0,3]) while(init),
    condition=cond, body=body
}
"""


@pytest.mark.parametrize("trips", [0, 1, 2, 7])
def test_counted_loop_with_mixed_tuple_state(trips: int) -> None:
    rng = np.random.default_rng(trips)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    h = rng.standard_normal(5).astype(np.float16)
    got = check(COUNTED, np.int32(trips), x, h, np.zeros((0, 3), np.float32))
    assert got[0] == trips and got[4] == bool(trips % 2) and got[5] == 7 + trips * (trips - 1) // 2


DATA_DEPENDENT = """
HloModule doubling

cond {
  p = (f32[], f32[], s32[]) parameter(0)
  x = f32[] get-tuple-element(p), index=0
  limit = f32[] get-tuple-element(p), index=1
  ROOT lt = pred[] compare(x, limit), direction=LT
}

body {
  p = (f32[], f32[], s32[]) parameter(0)
  x = f32[] get-tuple-element(p), index=0
  limit = f32[] get-tuple-element(p), index=1
  k = s32[] get-tuple-element(p), index=2
  two = f32[] constant(2)
  one = s32[] constant(1)
  x2 = f32[] multiply(x, two)
  k1 = s32[] add(k, one)
  ROOT t = (f32[], f32[], s32[]) tuple(x2, limit, k1)
}

ENTRY main {
  x = f32[] parameter(0)
  limit = f32[] parameter(1)
  zero = s32[] constant(0)
  init = (f32[], f32[], s32[]) tuple(x, limit, zero)
  loop = (f32[], f32[], s32[]) while(init), condition=cond, body=body
  ROOT k = s32[] get-tuple-element(loop), index=2
}
"""


@pytest.mark.parametrize("x,limit,trips", [(1.0, 1000.0, 10), (5.0, 1.0, 0), (1.0, 2.0, 1)])
def test_data_dependent_trip_count(x: float, limit: float, trips: int) -> None:
    (k,) = check(DATA_DEPENDENT, np.float32(x), np.float32(limit))
    assert k == trips


# A swap of two state elements (the body's outputs are its parameters at other
# positions) and a while whose whole tuple is the entry's result.
SWAP = """
HloModule swap

cond {
  p = (s32[], f32[2], f32[2]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(i, three), direction=LT
}

body {
  p = (s32[], f32[2], f32[2]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  a = f32[2] get-tuple-element(p), index=1
  b = f32[2] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[2], f32[2]) tuple(i1, b, a)
}

ENTRY main {
  a = f32[2] parameter(0)
  b = f32[2] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[2], f32[2]) tuple(zero, a, b)
  ROOT loop = (s32[], f32[2], f32[2]) while(init), condition=cond, body=body
}
"""


def test_state_elements_swapped_each_iteration() -> None:
    a, b = np.array([1, 2], np.float32), np.array([3, 4], np.float32)
    _, x, y = check(SWAP, a, b)
    np.testing.assert_array_equal(x, b)
    np.testing.assert_array_equal(y, a)


# Row i of a buffer written by dynamic-update-slice in a loop (TensorList's lowering),
# then read back row by row with dynamic-slice in a second loop.
FILL = """
HloModule fill

fill_cond {
  p = (s32[], f32[8,3], f32[3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(8)
  ROOT lt = pred[] compare(i, n), direction=LT
}

fill_body {
  p = (s32[], f32[8,3], f32[3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  buffer = f32[8,3] get-tuple-element(p), index=1
  x = f32[3] get-tuple-element(p), index=2
  fi = f32[] convert(i)
  bi = f32[3] broadcast(fi), dimensions={}
  row = f32[3] multiply(x, bi)
  update = f32[1,3] reshape(row)
  zero = s32[] constant(0)
  written = f32[8,3] dynamic-update-slice(buffer, update, i, zero)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[8,3], f32[3]) tuple(i1, written, x)
}

sum_cond {
  p = (s32[], f32[8,3], f32[3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(8)
  ROOT lt = pred[] compare(i, n), direction=LT
}

sum_body {
  p = (s32[], f32[8,3], f32[3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  buffer = f32[8,3] get-tuple-element(p), index=1
  acc = f32[3] get-tuple-element(p), index=2
  zero = s32[] constant(0)
  row = f32[1,3] dynamic-slice(buffer, i, zero), dynamic_slice_sizes={1,3}
  flat = f32[3] reshape(row)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  acc1 = f32[3] add(acc, flat)
  ROOT t = (s32[], f32[8,3], f32[3]) tuple(i1, buffer, acc1)
}

ENTRY main {
  x = f32[3] parameter(0)
  zero = s32[] constant(0)
  z = f32[] constant(0)
  empty = f32[8,3] broadcast(z), dimensions={}
  init = (s32[], f32[8,3], f32[3]) tuple(zero, empty, x)
  filled = (s32[], f32[8,3], f32[3]) while(init), condition=fill_cond, body=fill_body
  buffer = f32[8,3] get-tuple-element(filled), index=1
  acc = f32[3] broadcast(z), dimensions={}
  init2 = (s32[], f32[8,3], f32[3]) tuple(zero, buffer, acc)
  summed = (s32[], f32[8,3], f32[3]) while(init2), condition=sum_cond, body=sum_body
  total = f32[3] get-tuple-element(summed), index=2
  ROOT r = (f32[8,3], f32[3]) tuple(buffer, total)
}
"""


def test_buffer_filled_by_dynamic_update_slice_in_a_loop() -> None:
    x = np.array([1, -2, 0.5], np.float32)
    buffer, total = check(FILL, x)
    np.testing.assert_array_equal(buffer, np.arange(8, dtype=np.float32)[:, None] * x)
    assert_close(total, 28 * x, "Add")
    # The filling loop updates its buffer in place (one buffer, only the row written).
    assignment = compile_module(parse_module(FILL), cache=False).assignment
    plan = assignment.control_flow
    assert plan["filled"].in_place == {1} and 1 not in plan["filled"].scratch
    # The summing loop passes the buffer through: it reads the filled buffer where it
    # is, with no copy and no buffer of its own.
    assert plan["summed"].passthrough == {1}
    assert assignment.slice_of("summed", (1,)) == assignment.slice_of("filled", (1,))


# Each row is the previous row plus x: the body reads the buffer (dynamic-slice) before
# it updates it, so the update may still be in place (the read runs first).
RUNNING = """
HloModule running

cond {
  p = (s32[], f32[6,2], f32[2]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(6)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[6,2], f32[2]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  buffer = f32[6,2] get-tuple-element(p), index=1
  x = f32[2] get-tuple-element(p), index=2
  one = s32[] constant(1)
  zero = s32[] constant(0)
  before = s32[] subtract(i, one)
  previous = f32[1,2] dynamic-slice(buffer, before, zero), dynamic_slice_sizes={1,2}
  row = f32[1,2] reshape(x)
  next = f32[1,2] add(previous, row)
  written = f32[6,2] dynamic-update-slice(buffer, next, i, zero)
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[6,2], f32[2]) tuple(i1, written, x)
}

ENTRY main {
  x = f32[2] parameter(0)
  b = f32[6,2] parameter(1)
  one = s32[] constant(1)
  init = (s32[], f32[6,2], f32[2]) tuple(one, b, x)
  loop = (s32[], f32[6,2], f32[2]) while(init), condition=cond, body=body
  ROOT r = f32[6,2] get-tuple-element(loop), index=1
}
"""


def test_a_buffer_the_body_reads_before_updating_it_is_updated_in_place() -> None:
    b = np.zeros((6, 2), np.float32)
    b[0] = [10, 20]
    (got,) = check(RUNNING, np.array([1, -1], np.float32), b)
    np.testing.assert_array_equal(got[:, 0], 10 + np.arange(6))
    plan = compile_module(parse_module(RUNNING), cache=False).assignment.control_flow
    assert plan["loop"].in_place == {1} and 1 not in plan["loop"].scratch


def test_a_buffer_whose_old_value_the_body_returns_is_not_updated_in_place() -> None:
    # The body returns the old buffer as the next state's third element: the update
    # must not overwrite it, so the buffer ping-pongs.
    text = RUNNING.replace("(s32[], f32[6,2], f32[2])", "(s32[], f32[6,2], f32[6,2], f32[2])")
    text = text.replace("x = f32[2] get-tuple-element(p), index=2",
                        "x = f32[2] get-tuple-element(p), index=3")
    text = text.replace("tuple(i1, written, x)", "tuple(i1, written, buffer, x)")
    text = text.replace("tuple(one, b, x)", "tuple(one, b, b, x)")
    b = np.zeros((6, 2), np.float32)
    b[0] = [10, 20]
    check(text, np.array([1, -1], np.float32), b)
    plan = compile_module(parse_module(text), cache=False).assignment.control_flow
    assert plan["loop"].in_place == set() and 1 in plan["loop"].scratch


NESTED = """
HloModule nested

inner_cond {
  p = (s32[], f32[4]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  m = s32[] constant(3)
  ROOT lt = pred[] compare(j, m), direction=LT
}

inner_body {
  p = (s32[], f32[4]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  v = f32[4] get-tuple-element(p), index=1
  fj = f32[] convert(j)
  one = s32[] constant(1)
  j1 = s32[] add(j, one)
  bj = f32[4] broadcast(fj), dimensions={}
  v1 = f32[4] add(v, bj)
  ROOT t = (s32[], f32[4]) tuple(j1, v1)
}

outer_cond {
  p = (s32[], s32[], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] get-tuple-element(p), index=1
  ROOT lt = pred[] compare(i, n), direction=LT
}

outer_body {
  p = (s32[], s32[], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] get-tuple-element(p), index=1
  v = f32[4] get-tuple-element(p), index=2
  w = f32[4] get-tuple-element(p), index=3
  zero = s32[] constant(0)
  scaled = f32[4] multiply(v, w)
  start = (s32[], f32[4]) tuple(zero, scaled)
  inner = (s32[], f32[4]) while(start), condition=inner_cond, body=inner_body
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  v1 = f32[4] get-tuple-element(inner), index=1
  ROOT t = (s32[], s32[], f32[4], f32[4]) tuple(i1, n, v1, w)
}

ENTRY main {
  n = s32[] parameter(0)
  v = f32[4] parameter(1)
  w = f32[4] parameter(2)
  zero = s32[] constant(0)
  init = (s32[], s32[], f32[4], f32[4]) tuple(zero, n, v, w)
  loop = (s32[], s32[], f32[4], f32[4]) while(init), condition=outer_cond, body=outer_body
  ROOT r = f32[4] get-tuple-element(loop), index=2
}
"""


@pytest.mark.parametrize("trips", [0, 1, 4])
def test_nested_loops(trips: int) -> None:
    v = np.array([1, 2, 3, 4], np.float32)
    w = np.array([0.5, 1, -1, 2], np.float32)
    check(NESTED, np.int32(trips), v, w)


BRANCHES = """
HloModule branches

on_true {
  p = (f32[3], s32[]) parameter(0)
  x = f32[3] get-tuple-element(p), index=0
  k = s32[] get-tuple-element(p), index=1
  ex = f32[3] exponential(x)
  ROOT t = (f32[3], s32[]) tuple(ex, k)
}

on_false {
  p = f32[2,3] parameter(0)
  z = f32[] constant(0)
  r = f32[3] reduce(p, z), dimensions={0}, to_apply=add
  m = s32[] constant(-1)
  ROOT t = (f32[3], s32[]) tuple(r, m)
}

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  c = pred[] parameter(0)
  x = f32[3] parameter(1)
  k = s32[] parameter(2)
  y = f32[2,3] parameter(3)
  xk = (f32[3], s32[]) tuple(x, k)
  ROOT r = (f32[3], s32[]) conditional(c, xk, y), true_computation=on_true,
    false_computation=on_false
}
"""


@pytest.mark.parametrize("flag", [True, False])
def test_conditional_on_a_pred(flag: bool) -> None:
    x = np.array([0, 1, -1], np.float32)
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    check(BRANCHES, np.bool_(flag), x, np.int32(5), y)


INDEXED = """
HloModule indexed

b0 {
  p = f32[4] parameter(0)
  ROOT r = f32[4] negate(p)
}

b1 {
  p = f32[4] parameter(0)
  ROOT r = f32[4] multiply(p, p)
}

b2 {
  p = f32[0] parameter(0)
  ROOT r = f32[4] constant({7, 8, 9, 10})
}

ENTRY main {
  i = s32[] parameter(0)
  x = f32[4] parameter(1)
  e = f32[0] constant({})
  ROOT r = f32[4] conditional(i, x, x, e), branch_computations={b0, b1, b2}
}
"""


@pytest.mark.parametrize("index", [0, 1, 2, 3, -1, 100])
def test_conditional_on_an_index_out_of_range_runs_the_last_branch(index: int) -> None:
    (got,) = check(INDEXED, np.int32(index), np.array([1, -2, 3, 0.5], np.float32))
    if index not in (0, 1):
        np.testing.assert_array_equal(got, [7, 8, 9, 10])


# A conditional inside a loop body: Collatz steps until 1.
COLLATZ = """
HloModule collatz

even {
  p = s32[] parameter(0)
  two = s32[] constant(2)
  ROOT h = s32[] divide(p, two)
}

odd {
  p = s32[] parameter(0)
  three = s32[] constant(3)
  one = s32[] constant(1)
  p3 = s32[] multiply(p, three)
  ROOT h = s32[] add(p3, one)
}

cond {
  p = (s32[], s32[]) parameter(0)
  x = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  ROOT gt = pred[] compare(x, one), direction=GT
}

body {
  p = (s32[], s32[]) parameter(0)
  x = s32[] get-tuple-element(p), index=0
  k = s32[] get-tuple-element(p), index=1
  two = s32[] constant(2)
  zero = s32[] constant(0)
  one = s32[] constant(1)
  r = s32[] remainder(x, two)
  is_even = pred[] compare(r, zero), direction=EQ
  next = s32[] conditional(is_even, x, x), true_computation=even, false_computation=odd
  k1 = s32[] add(k, one)
  ROOT t = (s32[], s32[]) tuple(next, k1)
}

ENTRY main {
  x = s32[] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], s32[]) tuple(x, zero)
  loop = (s32[], s32[]) while(init), condition=cond, body=body
  ROOT k = s32[] get-tuple-element(loop), index=1
}
"""


@pytest.mark.parametrize("start,steps", [(1, 0), (2, 1), (27, 111)])
def test_conditional_in_a_loop_body(start: int, steps: int) -> None:
    (k,) = check(COLLATZ, np.int32(start))
    assert k == steps


def test_loop_invariant_work_is_hoisted_out_of_the_body() -> None:
    text = """
HloModule hoist

cond {
  p = (s32[], f32[16], f32[16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  five = s32[] constant(5)
  ROOT lt = pred[] compare(i, five), direction=LT
}

body {
  p = (s32[], f32[16], f32[16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[16] get-tuple-element(p), index=1
  w = f32[16] get-tuple-element(p), index=2
  ew = f32[16] exponential(w)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  xe = f32[16] multiply(x, ew)
  ROOT t = (s32[], f32[16], f32[16]) tuple(i1, xe, w)
}

ENTRY main {
  x = f32[16] parameter(0)
  w = f32[16] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[16], f32[16]) tuple(zero, x, w)
  loop = (s32[], f32[16], f32[16]) while(init), condition=cond, body=body
  ROOT r = f32[16] get-tuple-element(loop), index=1
}
"""
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    w = np.linspace(0, 0.3, 16, dtype=np.float32)
    check(text, x, w, op_type="model gradient")  # five rounded products in a row
    module = parse_module(text)
    executable = compile_module(module, cache=False)
    entry = module.entry
    ops = {inst.opcode for inst in entry.instructions}
    assert "exponential" in {i.opcode for c in module.computations for i in c.instructions}
    loop = next(i for i in entry.instructions if i.opcode == "while")
    body_ops = {i.opcode for i in loop.called_computations[1].instructions}
    body_fused = {i.opcode for inst in loop.called_computations[1].instructions
                  if inst.opcode == "fusion" for i in inst.fused_computation.instructions}
    assert "exponential" not in body_ops | body_fused, executable.optimized_hlo_text
    assert "while" in ops and len(loop.shape.tuple_shapes) == 4


ONE_ITEM_LIST = """
HloModule one_item

cond {
  p = (s32[], s32[], f32[2,4], (f32[1,4,4], s32[])) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] get-tuple-element(p), index=1
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], s32[], f32[2,4], (f32[1,4,4], s32[])) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] get-tuple-element(p), index=1
  h = f32[2,4] get-tuple-element(p), index=2
  tl = (f32[1,4,4], s32[]) get-tuple-element(p), index=3
  list = f32[1,4,4] get-tuple-element(tl), index=0
  size = s32[] get-tuple-element(tl), index=1
  zero = s32[] constant(0)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  back = s32[] subtract(size, one)
  item = f32[1,4,4] dynamic-slice(list, back, zero, zero), dynamic_slice_sizes={1,4,4}
  w = f32[4,4] reshape(item)
  y = f32[2,4] dot(h, w), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  h1 = f32[2,4] tanh(y)
  popped = (f32[1,4,4], s32[]) tuple(list, back)
  ROOT t = (s32[], s32[], f32[2,4], (f32[1,4,4], s32[])) tuple(i1, n, h1, popped)
}

ENTRY main {
  n = s32[] parameter(0)
  h = f32[2,4] parameter(1)
  list = f32[1,4,4] parameter(2)
  zero = s32[] constant(0)
  tl = (f32[1,4,4], s32[]) tuple(list, n)
  init = (s32[], s32[], f32[2,4], (f32[1,4,4], s32[])) tuple(zero, n, h, tl)
  ROOT loop = (s32[], s32[], f32[2,4], (f32[1,4,4], s32[])) while(init), condition=cond,
    body=body
}
"""


@pytest.mark.parametrize("trips", [0, 1, 3])
def test_the_item_of_a_one_element_list_leaves_the_loop(trips: int) -> None:
    """A gradient loop's pop of a one-element TensorList (a loop-invariant weight that
    the forward loop pushed) reads the list itself (simplify: a dynamic-slice of all of
    its operand), and its reshape, which the dot would read through a copy kernel every
    iteration, is hoisted out of the body (while-licm: a dot reads it; the list's buffer
    is invariant while its counter changes)."""
    rng = np.random.default_rng(2)
    h = rng.standard_normal((2, 4)).astype(np.float32)
    items = rng.standard_normal((1, 4, 4)).astype(np.float32)
    check(ONE_ITEM_LIST, np.int32(trips), h, items, op_type="Tanh")
    module = parse_module(ONE_ITEM_LIST)
    compile_module(module, cache=False)
    loop = next(i for i in module.entry.instructions if i.opcode == "while")
    body = loop.called_computations[1]
    opcodes = {i.opcode for i in body.instructions} | {
        i.opcode for inst in body.instructions if inst.opcode == "fusion"
        for i in inst.fused_computation.instructions}
    assert not opcodes & {"dynamic-slice", "reshape", "copy"}, opcodes
    assert "dot" in opcodes and len(loop.shape.tuple_shapes) == 5


def test_a_changed_body_does_not_hit_the_old_compile() -> None:
    """The compile caches key on the called computations too."""
    changed = COLLATZ.replace("three = s32[] constant(3)", "three = s32[] constant(5)")
    first = check(COLLATZ, np.int32(7), cache="memory")
    second = check(changed, np.int32(7), cache="memory")
    assert first[0] == 16 and second[0] != first[0]


def test_the_gpu_backend_refuses_control_flow_clearly() -> None:
    from tfxla_lite.codegen import gpu

    with pytest.raises(NotImplementedError, match="GPU backend: HLO while"):
        gpu.emit_module(parse_module(DATA_DEPENDENT))


# The inner loop's exp(w) depends on state that the inner loop passes through but the
# outer loop changes: it moves to the outer body, not out of both loops.
NESTED_HOIST = """
HloModule nested_hoist

inner_cond {
  p = (s32[], f32[8], f32[8]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  m = s32[] constant(3)
  ROOT lt = pred[] compare(j, m), direction=LT
}

inner_body {
  p = (s32[], f32[8], f32[8]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  v = f32[8] get-tuple-element(p), index=1
  w = f32[8] get-tuple-element(p), index=2
  ew = f32[8] exponential(w)
  v1 = f32[8] add(v, ew)
  one = s32[] constant(1)
  j1 = s32[] add(j, one)
  ROOT t = (s32[], f32[8], f32[8]) tuple(j1, v1, w)
}

outer_cond {
  p = (s32[], f32[8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}

outer_body {
  p = (s32[], f32[8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  v = f32[8] get-tuple-element(p), index=1
  w = f32[8] get-tuple-element(p), index=2
  zero = s32[] constant(0)
  start = (s32[], f32[8], f32[8]) tuple(zero, v, w)
  inner = (s32[], f32[8], f32[8]) while(start), condition=inner_cond, body=inner_body
  v1 = f32[8] get-tuple-element(inner), index=1
  half = f32[] constant(0.5)
  h = f32[8] broadcast(half), dimensions={}
  w1 = f32[8] multiply(w, h)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[8], f32[8]) tuple(i1, v1, w1)
}

ENTRY main {
  v = f32[8] parameter(0)
  w = f32[8] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[8], f32[8]) tuple(zero, v, w)
  loop = (s32[], f32[8], f32[8]) while(init), condition=outer_cond, body=outer_body
  ROOT r = f32[8] get-tuple-element(loop), index=1
}
"""


def test_nested_loop_invariants_move_to_the_outer_body() -> None:
    v = np.linspace(-1, 1, 8, dtype=np.float32)
    w = np.linspace(0, 0.5, 8, dtype=np.float32)
    check(NESTED_HOIST, v, w, op_type="model gradient")
    module = parse_module(NESTED_HOIST)
    compile_module(module, cache=False)
    outer = next(i for i in module.entry.instructions if i.opcode == "while")
    outer_body = outer.called_computations[1]
    inner = next(i for i in outer_body.instructions if i.opcode == "while")

    def opcodes(computation: Any) -> set[str]:
        found = {i.opcode for i in computation.instructions}
        return found | {f.opcode for i in computation.instructions if i.opcode == "fusion"
                        for f in i.fused_computation.instructions}

    assert "exponential" not in opcodes(inner.called_computations[1])
    assert "exponential" in opcodes(outer_body)
    assert "exponential" not in opcodes(module.entry)


# An array-shaped loop state, and a body whose root is another loop (which passes the
# limit through, so the outer loop sees that leaf unchanged too).
ARRAY_STATE = """
HloModule array_state

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

cond {
  p = f32[3] parameter(0)
  zero = f32[] constant(0)
  s = f32[] reduce(p, zero), dimensions={0}, to_apply=add
  limit = f32[] constant(100)
  ROOT lt = pred[] compare(s, limit), direction=LT
}

body {
  p = f32[3] parameter(0)
  ROOT d = f32[3] add(p, p)
}

inner_cond {
  p = (s32[], f32[3], s32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] get-tuple-element(p), index=2
  ROOT lt = pred[] compare(i, n), direction=LT
}

inner_body {
  p = (s32[], f32[3], s32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[3] get-tuple-element(p), index=1
  n = s32[] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  x1 = f32[3] negate(x)
  ROOT t = (s32[], f32[3], s32[]) tuple(i1, x1, n)
}

outer_cond {
  p = (s32[], f32[3], s32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] get-tuple-element(p), index=2
  ROOT lt = pred[] compare(i, n), direction=LT
}

outer_body {
  p = (s32[], f32[3], s32[]) parameter(0)
  ROOT w = (s32[], f32[3], s32[]) while(p), condition=inner_cond, body=inner_body
}

ENTRY main {
  x = f32[3] parameter(0)
  doubled = f32[3] while(x), condition=cond, body=body
  zero = s32[] constant(0)
  n = s32[] parameter(1)
  init = (s32[], f32[3], s32[]) tuple(zero, doubled, n)
  ROOT loop = (s32[], f32[3], s32[]) while(init), condition=outer_cond, body=outer_body
}
"""


@pytest.mark.parametrize("n", [0, 3, 10])
def test_array_state_and_a_body_that_is_a_loop(n: int) -> None:
    _, x, _ = check(ARRAY_STATE, np.array([1, 2, -0.5], np.float32), np.int32(n))
    np.testing.assert_array_equal(x, np.array([1, 2, -0.5], np.float32) * 64 * (-1) ** n)


def test_branches_sharing_one_computation() -> None:
    text = INDEXED.replace("branch_computations={b0, b1, b2}", "branch_computations={b1, b1, b2}")
    for index in (0, 1, 2, 5):
        check(text, np.int32(index), np.array([1, -2, 3, 0.5], np.float32))


# A loop inside a branch: the true branch counts the Collatz steps of its operand.
LOOP_IN_BRANCH = COLLATZ.replace("ENTRY main {", "steps {") + """
none {
  p = s32[] parameter(0)
  ROOT m = s32[] negate(p)
}

ENTRY main {
  c = pred[] parameter(0)
  x = s32[] parameter(1)
  ROOT r = s32[] conditional(c, x, x), true_computation=steps, false_computation=none
}
"""


@pytest.mark.parametrize("flag,expected", [(True, 111), (False, -27)])
def test_a_loop_inside_a_branch(flag: bool, expected: int) -> None:
    (got,) = check(LOOP_IN_BRANCH, np.bool_(flag), np.int32(27))
    assert got == expected


# A TensorList's gradient pattern: read item i into an accumulator, then zero item i.
# Whatever order the scheduler gives, the zeroing runs after the read, in place.
READ_THEN_ZERO = """
HloModule read_then_zero

cond {
  p = (s32[], f32[5,4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[5,4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  buffer = f32[5,4] get-tuple-element(p), index=1
  acc = f32[4] get-tuple-element(p), index=2
  zero = s32[] constant(0)
  z = f32[] constant(0)
  zeros = f32[1,4] broadcast(z), dimensions={}
  cleared = f32[5,4] dynamic-update-slice(buffer, zeros, i, zero)
  item = f32[1,4] dynamic-slice(buffer, i, zero), dynamic_slice_sizes={1,4}
  flat = f32[4] reshape(item)
  acc1 = f32[4] add(acc, flat)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[5,4], f32[4]) tuple(i1, cleared, acc1)
}

ENTRY main {
  b = f32[5,4] parameter(0)
  zero = s32[] constant(0)
  z = f32[] constant(0)
  acc = f32[4] broadcast(z), dimensions={}
  init = (s32[], f32[5,4], f32[4]) tuple(zero, b, acc)
  loop = (s32[], f32[5,4], f32[4]) while(init), condition=cond, body=body
  cleared = f32[5,4] get-tuple-element(loop), index=1
  total = f32[4] get-tuple-element(loop), index=2
  ROOT r = (f32[5,4], f32[4]) tuple(cleared, total)
}
"""


def test_reads_of_a_buffer_run_before_its_in_place_update() -> None:
    b = np.arange(20, dtype=np.float32).reshape(5, 4)
    cleared, total = check(READ_THEN_ZERO, b, op_type="Add")
    assert not cleared.any()
    np.testing.assert_array_equal(total, b.sum(axis=0))
    plan = compile_module(parse_module(READ_THEN_ZERO), cache=False).assignment.control_flow
    assert plan["loop"].in_place == {1}


def test_an_update_is_moved_after_the_reads_of_the_old_buffer() -> None:
    from tfxla_lite.passes.control_flow import order_updates_after_reads

    module = parse_module(READ_THEN_ZERO)
    body = next(c for c in module.computations if c.name == "body")
    opcodes = [i.opcode for i in body.instructions]
    assert opcodes.index("dynamic-update-slice") < opcodes.index("dynamic-slice")
    assert order_updates_after_reads(body)
    opcodes = [i.opcode for i in body.instructions]
    assert opcodes.index("dynamic-update-slice") > opcodes.index("dynamic-slice")
    assert not order_updates_after_reads(body)


def test_a_kernel_reading_a_row_of_a_big_buffer_counts_the_row_as_its_work() -> None:
    """A loop body's kernel that reads one row of a TensorList is as small as the row:
    it stays serial (a parallel launch per iteration costs more than the row)."""
    from tfxla_lite.codegen.cpu.compiler import plan_partition, read_elements

    text = READ_THEN_ZERO.replace("f32[5,4]", "f32[4096,64]").replace("f32[1,4]", "f32[1,64]")
    text = text.replace("f32[4]", "f32[64]").replace("dynamic_slice_sizes={1,4}",
                                                     "dynamic_slice_sizes={1,64}")
    text = text.replace("n = s32[] constant(5)", "n = s32[] constant(4096)")
    module = parse_module(text)
    compile_module(module, cache=False)
    body = next(i for i in module.entry.instructions if i.opcode == "while"
                ).called_computations[1]
    (reader,) = [i for i in body.instructions if i.opcode == "fusion" and any(
        f.opcode == "dynamic-slice" for f in i.fused_computation.instructions)]
    big = next(n for n, o in enumerate(reader.operands) if o.shape.dims == (4096, 64))
    assert reader.operand(big).shape.num_elements == 4096 * 64
    assert read_elements(reader, big) == 64
    assert plan_partition(reader).work == 64


def test_a_dynamic_update_slice_fusion_outside_loops() -> None:
    """XLA's dynamic-update-slice fusion (the update computed in the kernel) copies its
    operand when its output is another buffer, then stores the update at the clamped
    start (here past the end: clamped to the last rows)."""
    text = """
HloModule dus_fusion

fused {
  buffer = f32[6,3] parameter(0)
  row = f32[2,3] parameter(1)
  start = s32[] parameter(2)
  e = f32[2,3] exponential(row)
  zero = s32[] constant(0)
  ROOT u = f32[6,3] dynamic-update-slice(buffer, e, start, zero)
}

ENTRY main {
  b = f32[6,3] parameter(0)
  r = f32[2,3] parameter(1)
  i = s32[] parameter(2)
  f = f32[6,3] fusion(b, r, i), kind=kLoop, calls=fused
  ROOT n = f32[6,3] negate(f)
}
"""
    b = np.arange(18, dtype=np.float32).reshape(6, 3)
    r = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    for start in (0, 3, 5, -2):
        (got,) = check(text, b, r, np.int32(start))
        at = min(max(start, 0), 4)
        np.testing.assert_array_equal(np.delete(got, [at, at + 1], axis=0),
                                      -np.delete(b, [at, at + 1], axis=0))


# A TensorList gradient's shape in a loop: each iteration adds a list of zeros with
# item i set (here i - 1, clamped to 0 at the first step) to the accumulated list.
ACCUMULATE = """
HloModule accumulate

cond {
  p = (s32[], f32[4,3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(6)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[4,3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  acc = f32[4,3] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  back = s32[] subtract(i, one)
  fi = f32[] convert(i)
  item = f32[1,3] broadcast(fi), dimensions={}
  zero = f32[] constant(ZERO)
  zeros = f32[4,3] broadcast(zero), dimensions={}
  c0 = s32[] constant(0)
  set = f32[4,3] dynamic-update-slice(zeros, item, back, c0)
  ROOT t = (s32[], f32[4,3]) tuple(i1, ADD)
}

ENTRY main {
  x = f32[4,3] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[4,3]) tuple(zero, x)
  loop = (s32[], f32[4,3]) while(init), condition=cond, body=body
  ROOT r = f32[4,3] get-tuple-element(loop), index=1
}
"""


def _whole_adds(module: Any) -> int:
    """The loop body's adds of [4,3] arrays, fused or not."""
    loop = next(i for i in module.entry.instructions if i.opcode == "while")
    body = loop.called_computations[1].instructions
    inner = [i for inst in body if inst.opcode == "fusion"
             for i in inst.fused_computation.instructions]
    return sum(i.opcode == "add" and i.shape.dims == (4, 3) for i in [*body, *inner])


@pytest.mark.parametrize("add", ["f32[4,3] add(acc, set)", "f32[4,3] add(set, acc)"])
def test_adding_one_item_set_into_zeros_adds_that_item_alone(add: str) -> None:
    """slice-accumulation: the body reads and writes one row, no whole-array add; the
    last rows (clamped start, never written) keep x, -0.0, inf and NaN included
    (-0.0 zeros: the add would keep them too, so the evaluator agrees)."""
    text = ACCUMULATE.replace("ZERO", "-0").replace("ADD", "sum").replace(
        "ROOT t =", f"sum = {add}\n  ROOT t =")
    x = np.array([[1, -2, 3], [0.5, np.inf, -np.inf], [-0.0, np.nan, 2], [7, -0.0, 0]],
                 np.float32)
    check(text, x)
    module = parse_module(text)
    compile_module(module, cache=False)
    assert _whole_adds(module) == 0


def test_a_slice_set_into_non_zeros_is_added_whole() -> None:
    text = ACCUMULATE.replace("ZERO", "0.5").replace("ADD", "sum").replace(
        "ROOT t =", "sum = f32[4,3] add(acc, set)\n  ROOT t =")
    module = parse_module(text)
    compile_module(module, cache=False)
    assert _whole_adds(module) == 1
    check(text, np.arange(12, dtype=np.float32).reshape(4, 3))


# The same dot + tanh (16.8e6 flops: an entry's kernel takes the team from 2.1e6) in
# the entry and in a loop's body.
TEAM = """
HloModule team

cond {
  p = (s32[], f32[32,512], f32[512,512]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[32,512], f32[512,512]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  h = f32[32,512] get-tuple-element(p), index=1
  w = f32[512,512] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  d = f32[32,512] dot(h, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  h1 = f32[32,512] tanh(d)
  ROOT t = (s32[], f32[32,512], f32[512,512]) tuple(i1, h1, w)
}

ENTRY main {
  h = f32[32,512] parameter(0)
  w = f32[512,512] parameter(1)
  d = f32[32,512] dot(h, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  h0 = f32[32,512] tanh(d)
  zero = s32[] constant(0)
  init = (s32[], f32[32,512], f32[512,512]) tuple(zero, h0, w)
  loop = (s32[], f32[32,512], f32[512,512]) while(init), condition=cond, body=body
  ROOT r = f32[32,512] get-tuple-element(loop), index=1
}
"""


def _team_calls(llvm_ir: str) -> dict[str, int]:
    """For each function of the IR, how many of the functions it calls start a
    parallel region (call the team's entry point)."""
    from tfxla_lite.codegen.cpu import parallel

    callees: dict[str, set[str]] = {}
    name = ""
    for line in llvm_ir.splitlines():
        if line.startswith("define"):
            name = re.search(r'@"?([^"(]+)"?\(', line).group(1)
            callees[name] = set()
        elif name and "call " in line:
            callees[name].update(re.findall(r'@"?([^"(\s]+)"?\(', line))
    starts = {f for f, called in callees.items() if parallel.RUNTIME_SYMBOL in called}
    return {f: len(called & starts) for f, called in callees.items()}


@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_in_a_loop_use_the_team_only_when_big(threads: int) -> None:
    """loop_kernel_team: the entry's dot takes the team (when there is one), the body's
    same dot runs on the calling thread; past the loop thresholds a kernel keeps it."""
    from tfxla_lite.codegen.cpu import control_flow

    h = np.random.default_rng(0).normal(size=(32, 512)).astype(np.float32)
    w = np.random.default_rng(1).normal(size=(512, 512)).astype(np.float32) / 512
    executable = compile_module(parse_module(TEAM), threads=threads, cache=False)
    expected = evaluate(parse_module(TEAM), h, w)
    assert_close(executable(h, w)[0], np.asarray(expected), "MatMul", "loop team")
    calls = _team_calls(executable.llvm_ir)
    bodies = [f for f in calls if "body" in f]
    assert bodies and all(calls[f] == 0 for f in bodies), calls
    if parallel_available():
        assert calls["entry"] == (1 if threads == 2 else 0), calls
    assert control_flow.loop_kernel_team(2, 0, 2 * 32 * 512 * 512) == 1
    assert control_flow.loop_kernel_team(2, 0, control_flow.LOOP_PARALLEL_MIN_FLOPS) == 2
    assert control_flow.loop_kernel_team(2, 1 << 20, None) == 1
    assert control_flow.loop_kernel_team(2, control_flow.LOOP_PARALLEL_MIN_WORK, None) == 2
    assert control_flow.loop_kernel_team(1, 1 << 30, None) == 1


def parallel_available() -> bool:
    from tfxla_lite.codegen.cpu import parallel

    return parallel.effective_threads(2) == 2
