"""Buffer assignment: slice kinds, reuse of dead temps, no overlap of live ones."""

from __future__ import annotations

import numpy as np
import pytest
from hlo_builders import new_module, parameters, reduce_sum_x_plus_y_times_z

from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes import BufferAssignment, BufferSlice, assign_buffers, optimize

F32 = Shape("f32", (10,))  # 40 bytes: 64 once aligned


def _in_place_group(assignment: BufferAssignment, name: str) -> str:
    while name in assignment.in_place:
        name = assignment.in_place[name]
    return name


def assert_no_live_overlap(assignment: BufferAssignment) -> None:
    """Temps whose live ranges meet (inclusive) never share a byte, unless one writes
    the other in place (the same in-place group)."""
    temps = [(name, s) for name, s in assignment.slices.items() if s.kind == "temp" and s.size]
    for _, s in temps:
        assert s.offset % 64 == 0 and s.offset + s.size <= assignment.temp_bytes
    for i, (a, sa) in enumerate(temps):
        for b, sb in temps[i + 1:]:
            (a0, a1), (b0, b1) = assignment.live_ranges[a], assignment.live_ranges[b]
            if a1 < b0 or b1 < a0:
                continue
            if _in_place_group(assignment, a) == _in_place_group(assignment, b):
                assert sa == sb, (a, b)
                continue
            assert sa.offset + sa.size <= sb.offset or sb.offset + sb.size <= sa.offset, (a, b)


def _chain(length: int) -> HloModule:
    module, comp = new_module("chain")
    (value,) = parameters(comp, F32)
    for n in range(length):
        value = comp.create("negate" if n % 2 else "exponential", [value])
    comp.root = comp.create("tuple", [value])
    return module


def test_chain_reuses_dead_temps() -> None:
    assignment = assign_buffers(_chain(6), in_place=False)
    assert assignment.temp_bytes_without_reuse == 5 * 64
    # Ping-pong (a kernel never writes its input), but the first temp dies before the
    # output is defined and moves into the output's buffer: 64-byte offsets, 40-byte ends.
    assert assignment.slice_of("exponential") == BufferSlice("output", 0, 0, 40)
    assert assignment.temp_bytes == 64 + 40
    assert assignment.temp_bytes < assignment.temp_bytes_without_reuse
    assert assignment.in_place == {}
    assert_no_live_overlap(assignment)


def test_chain_runs_in_place() -> None:
    assignment = assign_buffers(_chain(6))
    # Every elementwise kernel overwrites its input, the output too: the whole chain
    # lives in the output buffer and no arena is left.
    assert assignment.temp_bytes == 0
    assert assignment.in_place == {"negate": "exponential", "exponential.1": "negate",
                                   "negate.1": "exponential.1", "exponential.2": "negate.1",
                                   "negate.2": "exponential.2"}
    assert {s.kind for s in assignment.slices.values()} == {"parameter", "output"}
    assert "in place of %exponential" in assignment.to_text()
    assert_no_live_overlap(assignment)


def test_slice_kinds() -> None:
    module, comp = new_module()
    x, y = parameters(comp, F32, Shape("s32", (3,)))
    one = comp.add_constant(np.ones(10, np.float32))
    t = comp.create("add", [x, one])
    out0 = comp.create("multiply", [t, t])
    comp.root = comp.create("tuple", [comp.create("negate", [y]), out0])
    a = assign_buffers(module, in_place=False)  # in place, t would live in output 1
    assert a.slice_of(x) == BufferSlice("parameter", 0, 0, 40)
    assert a.slice_of("param_1") == BufferSlice("parameter", 1, 0, 12)
    assert a.slice_of(one) == BufferSlice("constant", 0, 0, 40)
    assert a.slice_of(t) == BufferSlice("temp", 0, 0, 40)
    assert a.slice_of(out0) == BufferSlice("output", 1, 0, 40)
    assert a.slice_of("negate") == BufferSlice("output", 0, 0, 12)
    assert a.temp_bytes == 40
    with pytest.raises(KeyError, match="tuple"):
        a.slice_of(comp.root)
    assert set(a.slices) == {i.name for i in comp.instructions} - {"tuple"}


def test_non_tuple_root_is_output_zero() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = comp.create("negate", [comp.create("abs", [x])])
    a = assign_buffers(module, in_place=False)
    assert a.slice_of(comp.root) == BufferSlice("output", 0, 0, 40)
    assert a.slice_of("abs").kind == "temp"


def test_zero_size_buffers() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, Shape("f32", (0, 4)))
    comp.root = comp.create("tuple", [comp.create("negate", [comp.create("abs", [x])])])
    a = assign_buffers(module)
    assert a.slice_of("abs") == BufferSlice("temp", 0, 0, 0)
    assert a.temp_bytes == 0 and a.temp_bytes_without_reuse == 0


def test_best_fit_of_decreasing_size_fills_holes() -> None:
    # big (256 B) dies early; two small temps defined later fit into its hole.
    module, comp = new_module()
    x, s = parameters(comp, Shape("f32", (64,)), Shape("f32", (16,)))
    big = comp.create("exponential", [x])
    big_user = comp.create("negate", [big])  # live until the tuple: an output
    small1 = comp.create("abs", [s])
    small2 = comp.create("negate", [small1])
    comp.root = comp.create("tuple", [big_user, comp.create("exponential", [small2])])
    a = assign_buffers(module, in_place=False)
    assert a.slice_of(big).offset == 0
    # small1 dies before the second output is defined: it moves into that buffer.
    assert a.slice_of(small1) == BufferSlice("output", 1, 0, 64)
    assert a.slice_of(small2) == BufferSlice("temp", 0, 0, 64)  # in big's hole
    assert a.temp_bytes == 256
    assert_no_live_overlap(a)


def test_to_text_dump() -> None:
    module = optimize(reduce_sum_x_plus_y_times_z(), verify=True)
    text = assign_buffers(module).to_text()
    assert "allocation 0: parameter 0, size 128" in text
    assert "output 0, size 4" in text
    assert "%add_reduce_fusion f32[] offset 0 size 4 live [3, 5]" in text
    assert text.rstrip().endswith("total temp bytes: 0 before reuse, 0 after reuse")
    chain = assign_buffers(_chain(4), in_place=False).to_text()
    assert "temp arena, size 104 (192 without reuse)" in chain
    assert "live [1, 2]" in chain
