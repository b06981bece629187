"""Buffer assignment of tuple-shaped values: one slice per leaf, get-tuple-element and
tuple as aliases (no copy), liveness through every name, reuse and in-place per leaf;
add-output-copies flattens tuple-shaped outputs."""

from __future__ import annotations

import numpy as np
from hlo_builders import flatten, new_module, parameters, random_arguments
from test_buffer_assignment import assert_no_live_overlap

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes import assign_buffers
from tfxla_lite.passes.buffer_assignment import entry_values, leaves
from tfxla_lite.passes.output_copies import AddOutputCopies

X = Shape("f32", (16,))  # 64 bytes


def _two_output_fusion(comp: Computation, a: Instruction, b: Instruction) -> Instruction:
    """fusion(a, b) -> (a + b, a * b), a kLoop multi-output fusion."""
    module = comp.module
    assert module is not None
    fused = module.new_computation("fused")
    fused.is_fusion_computation = True
    p, q = fused.add_parameter(0, X), fused.add_parameter(1, X)
    fused.root = fused.create("tuple", [fused.create("add", [p, q]),
                                        fused.create("multiply", [p, q])])
    return comp.create("fusion", [a, b], shape=Shape.tuple_of([X, X]),
                       called_computations=[fused], kind="kLoop")


def _module(in_place_donor: bool = False) -> HloModule:
    module, comp = new_module("tuples")
    x, y = parameters(comp, X, X)
    a = comp.create("exponential", [x])  # a temp
    f = _two_output_fusion(comp, a if in_place_donor else x, y)
    first = comp.create("get-tuple-element", [f], index=0, name="first")
    second = comp.create("get-tuple-element", [f], index=1, name="second")
    early = comp.create("negate", [first])  # the last reader of leaf 0
    late = comp.create("abs", [comp.create("sine", [second])])
    pair = comp.create("tuple", [early, late], name="pair")
    out = comp.create("add", [comp.create("get-tuple-element", [pair], index=0), late])
    comp.root = comp.create("tuple", [out, a])
    return module


def test_values_are_leaves_and_names_are_aliases() -> None:
    module = _module()
    entry = module.entry
    f = next(i for i in entry.instructions if i.opcode == "fusion")
    values = entry_values(entry)
    second = next(i for i in entry.instructions if i.name == "second")
    assert values[(id(f), (1,))] is values[(id(second), ())]
    assert values[(id(f), (1,))].instruction is f
    assert [index for index, _ in leaves(f.shape)] == [(0,), (1,)]
    a = assign_buffers(module, in_place=False)
    assert a.slice_of("first") == a.slice_of(f, (0,))
    assert a.slice_of("second") == a.slice_of(f, (1,))
    assert a.slice_of("pair", (1,)) == a.slice_of("abs")
    assert "f{0}" not in a.aliases and a.aliases["first"] == f"{f.name}{{0}}"
    assert f"%{f.name}{{1}} f32[16]{{0}}" in a.to_text()
    # Leaf 0 dies at its last reader (through the get-tuple-element), leaf 1 later.
    start0, end0 = a.live_ranges[f"{f.name}{{0}}"]
    start1, end1 = a.live_ranges[f"{f.name}{{1}}"]
    position = {i.name: n for n, i in enumerate(entry.instructions)}
    assert start0 == start1 == position[f.name]
    assert end0 == position["negate"] and end1 == position["sine"]
    assert_no_live_overlap(a)
    assert a.temp_bytes < a.temp_bytes_without_reuse


def test_a_leaf_overwrites_its_dying_operand_in_place() -> None:
    """exp(x) dies at the fusion, which reads it elementwise: one leaf takes its bytes;
    an output is never a donor."""
    module = _module(in_place_donor=True)  # there exp(x) is also an output
    assert "exponential" not in assign_buffers(module).in_place.values()
    module, comp = new_module("donor")
    x, y = parameters(comp, X, X)
    t = comp.create("exponential", [x])
    f = _two_output_fusion(comp, t, y)
    comp.root = comp.create("tuple", [comp.create("get-tuple-element", [f], index=1),
                                      comp.create("get-tuple-element", [f], index=0)])
    a = assign_buffers(module)
    donor_taken = [leaf for leaf, donor in a.in_place.items() if donor == "exponential"]
    assert len(donor_taken) == 1 and donor_taken[0].startswith(f.name + "{")
    assert_no_live_overlap(a)


def test_tuple_shaped_outputs_are_flattened() -> None:
    module, comp = new_module("flat")
    x, y = parameters(comp, X, X)
    f = _two_output_fusion(comp, x, y)
    comp.root = comp.create("tuple", [comp.create("negate", [x]), f])
    args = random_arguments(module)
    before = flatten(evaluate(module, *args))
    assert AddOutputCopies().run(module) is True
    verify(module)
    root = module.entry.root
    assert [o.opcode for o in root.operands] == ["negate", "get-tuple-element",
                                                 "get-tuple-element"]
    for got, wanted in zip(flatten(evaluate(module, *args)), before, strict=True):
        np.testing.assert_array_equal(got, wanted)
    a = assign_buffers(module)
    assert a.slice_of(f, (0,)).kind == a.slice_of(f, (1,)).kind == "output"
    assert {a.slice_of(f, (0,)).index, a.slice_of(f, (1,)).index} == {1, 2}


def test_output_copies_look_through_get_tuple_element() -> None:
    """A parameter behind get-tuple-element(tuple(...)) and a leaf named twice are
    copied, as a plain parameter or a repeated output are; two leaves of one fusion
    are distinct outputs."""
    module, comp = new_module("names")
    x, y = parameters(comp, X, X)
    f = _two_output_fusion(comp, x, y)
    wrapped = comp.create("get-tuple-element", [comp.create("tuple", [y, x])], index=1)
    leaf0 = comp.create("get-tuple-element", [f], index=0)
    leaf1 = comp.create("get-tuple-element", [f], index=1)
    again = comp.create("get-tuple-element", [f], index=0)
    comp.root = comp.create("tuple", [wrapped, leaf0, leaf1, again])
    args = random_arguments(module)
    before = flatten(evaluate(module, *args))
    assert AddOutputCopies().run(module) is True
    verify(module)
    assert [o.opcode for o in module.entry.root.operands] == [
        "copy", "get-tuple-element", "get-tuple-element", "copy"]
    for got, wanted in zip(flatten(evaluate(module, *args)), before, strict=True):
        np.testing.assert_array_equal(got, wanted)
    a = assign_buffers(module)
    assert [a.slice_of(o).kind for o in module.entry.root.operands] == ["output"] * 4
    assert sorted(a.slice_of(o).index for o in module.entry.root.operands) == [0, 1, 2, 3]
