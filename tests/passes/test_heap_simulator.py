"""The heap simulator: best-fit placement, both of XLA's sort orders, output hosting,
and the buffer plans it produces for HLO never letting two live values share bytes."""

from __future__ import annotations

import pytest
from hlo_builders import new_module, parameters, reduce
from hypothesis import given, settings
from hypothesis import strategies as st
from test_random_graphs import random_modules

from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes import BufferAssignment, BufferSlice, assign_buffers, optimize
from tfxla_lite.passes.heap_simulator import (
    BufferInterval,
    Chunk,
    FixedBuffer,
    best_fit_offset,
    check_packing,
    global_decreasing_size_best_fit,
    host_in_fixed_buffers,
)


def _intervals(*specs: tuple[str, int, int, int]) -> list[BufferInterval]:
    return [BufferInterval(*spec) for spec in specs]


def test_best_fit_takes_the_smallest_gap_not_the_first() -> None:
    busy = [Chunk(0, 10), Chunk(30, 10), Chunk(45, 15)]  # gaps [10, 30) and [40, 45)
    assert best_fit_offset(5, busy, 1) == 40
    assert best_fit_offset(6, busy, 1) == 10
    assert best_fit_offset(25, busy, 1) == 60  # nothing fits: the top
    assert best_fit_offset(4, [], 1) == 0


def test_best_fit_aligns_every_candidate_offset() -> None:
    busy = [Chunk(0, 10), Chunk(40, 8)]  # the gap starts at 16 once aligned to 8
    assert best_fit_offset(24, busy, 8) == 16
    assert best_fit_offset(25, busy, 8) == 48
    assert best_fit_offset(1, [Chunk(0, 1)], 64) == 64


def test_disjoint_live_ranges_share_offset_zero() -> None:
    heap = global_decreasing_size_best_fit(_intervals(("a", 100, 0, 1), ("b", 60, 2, 3),
                                                      ("c", 100, 4, 4)))
    assert {c.offset for c in heap.chunks.values()} == {0}
    assert heap.heap_size == 100


def test_overlapping_ranges_stack_at_aligned_offsets_and_the_end_is_not_rounded() -> None:
    heap = global_decreasing_size_best_fit(_intervals(("a", 12, 0, 2), ("b", 12, 1, 3)))
    assert heap.chunks["a"] == Chunk(0, 12) and heap.chunks["b"] == Chunk(64, 12)
    assert heap.heap_size == 76  # as XLA's heap: 64-aligned offsets, exact end


def test_a_freed_hole_is_refilled_by_later_buffers() -> None:
    # big dies at 1; two small buffers live later fit in its hole under a long-lived one.
    heap = global_decreasing_size_best_fit(_intervals(
        ("long", 64, 0, 9), ("big", 256, 0, 1), ("s1", 64, 2, 5), ("s2", 64, 3, 6)))
    assert heap.chunks["big"].offset == 0
    assert heap.chunks["long"].offset == 256
    assert {heap.chunks["s1"].offset, heap.chunks["s2"].offset} == {0, 64}
    assert heap.heap_size == 320


def test_temporal_order_wins_where_it_packs_tighter() -> None:
    intervals = _intervals(("a", 2, 0, 3), ("b", 4, 4, 5), ("c", 3, 0, 1), ("d", 2, 0, 5))
    spatial = global_decreasing_size_best_fit(intervals, 1, ("spatial",))
    temporal = global_decreasing_size_best_fit(intervals, 1, ("temporal",))
    assert (spatial.heap_size, temporal.heap_size) == (8, 7)
    assert temporal.chunks == {"d": Chunk(0, 2), "a": Chunk(2, 2), "b": Chunk(2, 4),
                               "c": Chunk(4, 3)}
    best = global_decreasing_size_best_fit(intervals, 1)
    assert (best.heap_size, best.order) == (7, "temporal")


def test_spatial_order_wins_where_it_packs_tighter() -> None:
    intervals = _intervals(("a", 1, 1, 2), ("b", 2, 2, 5), ("c", 4, 1, 1))
    assert global_decreasing_size_best_fit(intervals, 1, ("temporal",)).heap_size == 7
    best = global_decreasing_size_best_fit(intervals, 1)
    assert (best.heap_size, best.order) == (5, "spatial")
    assert best.chunks == {"c": Chunk(0, 4), "b": Chunk(0, 2), "a": Chunk(4, 1)}


def test_zero_size_and_bad_intervals() -> None:
    heap = global_decreasing_size_best_fit(_intervals(("empty", 0, 0, 5), ("a", 8, 0, 5)))
    assert heap.chunks["empty"] == Chunk(0, 0) and heap.heap_size == 8
    assert global_decreasing_size_best_fit([]).heap_size == 0
    with pytest.raises(ValueError, match="distinct"):
        global_decreasing_size_best_fit(_intervals(("a", 1, 0, 0), ("a", 1, 1, 1)))
    with pytest.raises(ValueError, match="start <= end"):
        global_decreasing_size_best_fit(_intervals(("a", 1, 3, 2)))


def test_hosting_in_fixed_buffers_takes_the_smallest_that_admits() -> None:
    fixed = [FixedBuffer("big", 400, [(5, 9)]), FixedBuffer("small", 100, [(7, 9)])]
    hosted = host_in_fixed_buffers(_intervals(
        ("t1", 100, 0, 2),    # fits both: the smaller one
        ("t2", 300, 1, 4),    # only the big one, before its output is defined
        ("t3", 50, 3, 4),     # big is busy over [1, 4] now; small is free after 2
        ("t4", 100, 4, 8),    # overlaps both outputs' own values
        ("t5", 0, 0, 0)), fixed)  # empty: stays out
    assert hosted == {"t2": "big", "t1": "small", "t3": "small"}
    assert fixed[0].busy == [(5, 9), (1, 4)]
    assert fixed[1].busy == [(7, 9), (0, 2), (3, 4)]


def test_hosting_never_overlaps_a_fixed_buffers_contents() -> None:
    fixed = [FixedBuffer("out", 64, [(5, 9)])]
    hosted = host_in_fixed_buffers(_intervals(("a", 64, 0, 2), ("b", 64, 2, 4),
                                              ("c", 64, 3, 4)), fixed)
    assert hosted == {"a": "out", "c": "out"}  # b meets a at position 2 (inclusive)
    assert sorted(fixed[0].busy) == [(0, 2), (3, 4), (5, 9)]


live_intervals = st.lists(
    st.tuples(st.integers(0, 5000), st.integers(0, 30), st.integers(0, 12)),
    max_size=25).map(lambda specs: [BufferInterval(f"b{n}", size, start, start + length)
                                    for n, (size, start, length) in enumerate(specs)])


@settings(max_examples=300, deadline=None)
@given(live_intervals, st.sampled_from((1, 16, 64)))
def test_packing_is_safe_and_between_its_bounds(intervals: list[BufferInterval],
                                                alignment: int) -> None:
    heap = global_decreasing_size_best_fit(intervals, alignment)
    check_packing(intervals, heap.chunks, alignment)
    assert heap.heap_size == max((c.end for c in heap.chunks.values()), default=0)
    # No plan beats the most bytes live at one position; none is worse than no reuse.
    peak = max((sum(b.size for b in intervals if b.start <= t <= b.end)
                for t in range(45)), default=0)
    no_reuse = sum(-(-b.size // alignment) * alignment for b in intervals)
    assert peak <= heap.heap_size <= max(no_reuse, 0)
    for order in ("spatial", "temporal"):
        alone = global_decreasing_size_best_fit(intervals, alignment, (order,))
        check_packing(intervals, alone.chunks, alignment)
        assert heap.heap_size <= alone.heap_size


def _group(assignment: BufferAssignment, name: str) -> str:
    while name in assignment.in_place:
        name = assignment.in_place[name]
    return name


def assert_plan_is_safe(assignment: BufferAssignment) -> None:
    """No two values live at once share a byte of the arena or of an output buffer,
    unless one writes the other in place; a value hosted in an output fits in it."""
    placed = [(name, s) for name, s in assignment.slices.items()
              if s.kind in ("temp", "output") and s.size]
    for name, s in placed:
        if s.kind == "temp":
            assert s.offset % 64 == 0 and s.offset + s.size <= assignment.temp_bytes, name
    for n, (a, sa) in enumerate(placed):
        for b, sb in placed[n + 1:]:
            (a0, a1), (b0, b1) = assignment.live_ranges[a], assignment.live_ranges[b]
            if a1 < b0 or b1 < a0 or sa.kind != sb.kind:
                continue
            if sa.kind == "output":
                if sa.index == sb.index:
                    assert _group(assignment, a) == _group(assignment, b), (a, b)
            elif _group(assignment, a) == _group(assignment, b):
                assert sa == sb, (a, b)
            else:
                assert sa.offset + sa.size <= sb.offset or sb.offset + sb.size <= sa.offset, \
                    (a, b)


def _outputs_hold_their_guests(assignment: BufferAssignment, module: HloModule) -> None:
    root = module.entry.root
    outputs = list(root.operands) if root.opcode == "tuple" else [root]
    capacity = {j: o.shape.byte_size for j, o in enumerate(outputs)}
    for name, s in assignment.slices.items():
        if s.kind == "output":
            assert s.size <= capacity[s.index], name


@settings(max_examples=150, deadline=None)
@given(random_modules())
def test_plans_for_random_graphs_are_safe(module: HloModule) -> None:
    optimize(module)
    for in_place in (True, False):
        assignment = assign_buffers(module, in_place=in_place)
        assert_plan_is_safe(assignment)
        _outputs_hold_their_guests(assignment, module)
        assert assignment.temp_bytes <= assignment.temp_bytes_without_reuse


F32 = Shape("f32", (16,))


def test_a_dying_temp_moves_into_the_output_it_feeds_in_place() -> None:
    # softmax-like: the big temp e is read by a reduction and then, elementwise, by
    # the output; the output overwrites it, so only the small reduction is left.
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    e = comp.create("exponential", [x])
    total = reduce(comp, e, (0,))
    b = comp.create("broadcast", [total], shape=F32, dimensions=())
    comp.root = comp.create("tuple", [comp.create("divide", [e, b]), total])
    a = assign_buffers(module)
    assert a.slice_of(e) == BufferSlice("output", 0, 0, 64)
    assert a.in_place == {"divide": "exponential"}
    assert a.slice_of(b).kind == "temp" and a.temp_bytes == 64
    assert_plan_is_safe(a)
    without = assign_buffers(module, in_place=False)
    assert without.slice_of(e).kind == "temp" and without.temp_bytes == 128
    assert_plan_is_safe(without)


def test_parameters_and_constants_that_are_outputs_keep_their_kind() -> None:
    # Without `add-output-copies` an output may be a parameter: it stays one, and no
    # temp moves into that output's buffer (codegen copies the parameter there last).
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    t = comp.create("exponential", [x])
    comp.root = comp.create("tuple", [x, comp.create("negate", [t])])
    a = assign_buffers(module, in_place=False)
    assert a.slice_of(x) == BufferSlice("parameter", 0, 0, 64)
    assert a.slice_of(t) == BufferSlice("temp", 0, 0, 64)
    assert a.slice_of("negate") == BufferSlice("output", 1, 0, 64)
    assert_plan_is_safe(a)
