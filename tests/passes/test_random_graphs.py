"""Property tests over random elementwise DAGs: the pipeline keeps results and the
buffer plan never overlaps two live temps; on rewrite-prone graphs fed -0.0, ±inf and
NaN, simplify, constant folding, CSE and the default pipeline keep every bit."""

from __future__ import annotations

import numpy as np
from hlo_builders import assert_same_bits, flatten, new_module, parameters, reduce
from hypothesis import given, settings
from hypothesis import strategies as st
from test_buffer_assignment import assert_no_live_overlap

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.opcodes import is_expensive
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes import DEFAULT_PIPELINE, assign_buffers, optimize
from tfxla_lite.passes.fusion import can_be_fusion_root, can_fuse_producer

SHAPE = Shape("f32", (3, 4))
UNARY = ("negate", "abs", "exponential", "tanh", "sine", "convert", "transpose2")
BINARY = ("add", "multiply", "subtract", "maximum", "divide")


@st.composite
def random_modules(draw: st.DrawFn) -> HloModule:
    module, comp = new_module("random")
    values = parameters(comp, *[SHAPE] * draw(st.integers(1, 3)))
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(("unary", "binary", "scalar", "reduce", "dot")))
        pick = st.sampled_from(values)
        if kind == "unary":
            opcode, x = draw(st.sampled_from(UNARY)), draw(pick)
            if opcode == "convert":  # through f64 and back
                wide = comp.create("convert", [x], element_type="f64")
                values.append(comp.create("convert", [wide], element_type="f32"))
            elif opcode == "transpose2":  # there and back: a fusible shape change
                t = comp.create("transpose", [x], dimensions=(1, 0))
                values.append(comp.create("reshape", [t], shape=SHAPE))
            else:
                values.append(comp.create(opcode, [x]))
        elif kind == "binary":
            opcode = draw(st.sampled_from(BINARY))
            values.append(comp.create(opcode, [draw(pick), draw(pick)]))
        elif kind == "scalar":
            scalar = comp.add_constant(draw(st.sampled_from((0.5, -2.0, 0.0))), "f32")
            b = comp.create("broadcast", [scalar], shape=SHAPE, dimensions=())
            values.append(comp.create("add", [draw(pick), b]))
        elif kind == "reduce":
            row = reduce(comp, draw(pick), (1,), draw(st.sampled_from(("add", "maximum"))))
            values.append(comp.create("broadcast", [row], shape=SHAPE, dimensions=(0,)))
        else:
            square = comp.create("dot", [draw(pick), draw(pick)], lhs_contracting_dims=(1,),
                                 rhs_contracting_dims=(1,))  # [3,3]
            values.append(comp.create("dot", [square, draw(pick)], lhs_contracting_dims=(1,),
                                      rhs_contracting_dims=(0,)))
    outputs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    comp.root = outputs[0] if len(outputs) == 1 and draw(st.booleans()) else comp.create(
        "tuple", outputs)
    return module


@settings(max_examples=150, deadline=None)
@given(random_modules(), st.integers(0, 2**16))
def test_pipeline_keeps_results_and_plan_never_overlaps(module: HloModule, seed: int) -> None:
    rng = np.random.default_rng(seed)
    args = [rng.normal(size=p.shape.dims).astype(np.float32) for p in module.entry.parameters]
    before = flatten(evaluate(module, *args))
    optimize(module, verify=True)
    after = flatten(evaluate(module, *args))
    assert len(after) == len(before)
    for a, b in zip(after, before, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)
    assignment = assign_buffers(module)
    assert_no_live_overlap(assignment)
    assert assignment.temp_bytes <= assignment.temp_bytes_without_reuse
    root = module.entry.root
    assert len({id(o) for o in root.operands}) == len(root.operands)
    for inst in module.entry.instructions:
        # An op left top-level is a kernel of one: fusion found no cheap producer that
        # only it reads (one other kernels read too may stay apart: `should_fuse`).
        if inst.opcode not in ("fusion", "copy") and can_be_fusion_root(inst):
            assert not any(can_fuse_producer(o) and not is_expensive(o.opcode)
                           and all(user is inst for user in o.users)
                           for o in inst.operands), inst


# Shapes of the rewrite-prone graphs: rewrites fire on identities, splats and constants.
IDENTITIES = ("add -0.0", "add +0.0", "subtract +0.0", "subtract -0.0", "multiply 1",
              "multiply 0", "divide 1", "divide 2", "divide 3", "maximum -inf", "negate2",
              "transpose2", "reshape2", "slice-concat", "select", "self", "constant-chain",
              "reduce-size-1", "duplicate")


@st.composite
def rewrite_prone_modules(draw: st.DrawFn) -> HloModule:
    module, comp = new_module("prone")
    values = parameters(comp, *[SHAPE] * draw(st.integers(1, 3)))

    def splat(value: float):
        return comp.create("broadcast", [comp.add_constant(value, "f32")], shape=SHAPE,
                           dimensions=())

    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(IDENTITIES + BINARY + UNARY[:5]))
        x, y = draw(st.sampled_from(values)), draw(st.sampled_from(values))
        if kind in BINARY:
            values.append(comp.create(kind, [x, y]))
        elif kind in UNARY[:5]:
            values.append(comp.create(kind, [x]))
        elif kind == "negate2":
            values.append(comp.create("negate", [comp.create("negate", [x])]))
        elif kind == "transpose2":
            t = comp.create("transpose", [x], dimensions=(1, 0))
            values.append(comp.create("transpose", [t], dimensions=(1, 0)))
        elif kind == "reshape2":
            r = comp.create("reshape", [x], shape=Shape("f32", (12,)))
            values.append(comp.create("reshape", [comp.create("reshape", [r], shape=Shape(
                "f32", (2, 6)))], shape=SHAPE))
        elif kind == "slice-concat":
            c = comp.create("concatenate", [x, y], dimensions=(0,))  # [6,4]
            start = draw(st.sampled_from((0, 3)))
            values.append(comp.create("slice", [c], slice=((start, start + 3, 1), (0, 4, 1))))
        elif kind == "select":
            p = comp.create("broadcast", [comp.add_constant(draw(st.booleans()), "pred")],
                            shape=SHAPE.with_element_type("pred"), dimensions=())
            values.append(comp.create("select", [p, x, y]))
        elif kind == "self":
            values.append(comp.create(draw(st.sampled_from(("subtract", "maximum", "add"))),
                                      [x, x]))
        elif kind == "constant-chain":
            c = comp.add_constant(np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5)
            folded = comp.create("multiply", [comp.create("negate", [c]), splat(0.5)])
            values.append(comp.create("add", [x, folded]))
        elif kind == "reduce-size-1":
            r = comp.create("reshape", [x], shape=Shape("f32", (3, 1, 4)))
            values.append(reduce(comp, r, (1,), draw(st.sampled_from(("add", "maximum")))))
        elif kind == "duplicate":
            values.append(comp.create("add", [comp.create("exponential", [x]),
                                              comp.create("exponential", [x])]))
        else:  # "op constant"
            opcode, text = kind.split(" ")
            value = float(text)
            operands = [x, splat(value)]
            if opcode in ("add", "multiply", "maximum") and draw(st.booleans()):
                operands.reverse()
            values.append(comp.create(opcode, operands))
    outputs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    comp.root = outputs[0] if len(outputs) == 1 else comp.create("tuple", outputs)
    return module


EDGES = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.5], np.float32)


@settings(max_examples=150, deadline=None)
@given(rewrite_prone_modules(), st.sampled_from(
    ("simplify", "constant-folding", "cse", DEFAULT_PIPELINE)), st.integers(0, 2**16))
def test_passes_keep_results_bit_for_bit(module: HloModule, pipeline: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    args = [rng.choice(EDGES, size=p.shape.dims) for p in module.entry.parameters]
    before = evaluate(module, *args)
    optimize(module, pipeline, verify=True)
    assert_same_bits(evaluate(module, *args), before)
