"""The algebraic simplifier: one golden test per rewrite, the rewrites that must not
fire (floats with -0.0, inf and NaN about), changed flag, bit-exact numerics, verifier."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hlo_builders import (
    assert_same_bits,
    check_lines,
    count,
    edge_arguments,
    new_module,
    parameters,
    reduce,
)

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.simplify import REWRITES, AlgebraicSimplifier, splat_value

F32 = Shape("f32", (8,))
S32 = Shape("s32", (8,))
PRED = Shape("pred", (8,))


def splat(comp: Computation, value: object, shape: Shape) -> Instruction:
    scalar = comp.add_constant(value, shape.element_type)
    return comp.create("broadcast", [scalar], shape=shape, dimensions=())


def build(*shapes: Shape) -> Callable[[Callable], Callable[[], HloModule]]:
    """Decorate `body(comp, *params) -> root` into a maker of the module."""
    def decorate(body: Callable) -> Callable[[], HloModule]:
        def make() -> HloModule:
            module, comp = new_module()
            comp.root = body(comp, *parameters(comp, *shapes))
            return module
        return make
    return decorate


def _binary(opcode: str, shape: Shape, value: object, constant_first: bool = False,
            **attributes: object) -> Callable[[], HloModule]:
    @build(shape)
    def make(comp: Computation, x: Instruction) -> Instruction:
        c = splat(comp, value, shape)
        return comp.create(opcode, [c, x] if constant_first else [x, c], **attributes)
    return make


@build(F32)
def _element_of_tuple(comp: Computation, x: Instruction) -> Instruction:
    pair = comp.create("tuple", [x, comp.create("negate", [x])])
    first = comp.create("get-tuple-element", [pair], index=0)
    return comp.create("add", [first, first])


def _self(opcode: str, shape: Shape, **attributes: object) -> Callable[[], HloModule]:
    @build(shape)
    def make(comp: Computation, x: Instruction) -> Instruction:
        return comp.create(opcode, [x, x], **attributes)
    return make


@build(F32, F32)
def _add_of_scalar_products(comp: Computation, x: Instruction, _: Instruction) -> Instruction:
    product = comp.create("multiply", [splat(comp, 2.0, F32), splat(comp, 3.0, F32)])
    return comp.create("add", [x, product])


@build(Shape("f32", (8,)))
def _reshape_twice(comp: Computation, x: Instruction) -> Instruction:
    r = comp.create("reshape", [x], shape=Shape("f32", (2, 4)))
    return comp.create("reshape", [r], shape=Shape("f32", (4, 2)))


@build(Shape("f32", (4, 2)))
def _transpose_of_splat(comp: Computation, x: Instruction) -> Instruction:
    t = comp.create("transpose", [splat(comp, 1.5, Shape("f32", (2, 4)))], dimensions=(1, 0))
    return comp.create("add", [x, t])


@build(Shape("f32", (2, 3, 4)))
def _transpose_twice(comp: Computation, x: Instruction) -> Instruction:
    t = comp.create("transpose", [x], dimensions=(1, 2, 0))  # [3,4,2]
    return comp.create("transpose", [t], dimensions=(1, 0, 2))  # [4,3,2]


@build(Shape("f32", (3,)))
def _broadcast_twice(comp: Computation, x: Instruction) -> Instruction:
    b = comp.create("broadcast", [x], shape=Shape("f32", (3, 4)), dimensions=(0,))
    return comp.create("broadcast", [b], shape=Shape("f32", (2, 3, 4)), dimensions=(1, 2))


@build(Shape("f32", (16,)))
def _slice_twice(comp: Computation, x: Instruction) -> Instruction:
    s = comp.create("slice", [x], slice=((2, 14, 2),))  # elements 2, 4, ..., 12
    return comp.create("slice", [s], slice=((1, 5, 3),))  # elements 4, 10


def _slice_of_concatenate(spec: tuple) -> Callable[[], HloModule]:
    @build(Shape("f32", (4, 3)), Shape("f32", (6, 3)))
    def make(comp: Computation, a: Instruction, b: Instruction) -> Instruction:
        c = comp.create("concatenate", [a, b], dimensions=(0,))
        return comp.create("slice", [c], slice=spec)
    return make


@build(F32)
def _concatenate_one(comp: Computation, x: Instruction) -> Instruction:
    return comp.create("concatenate", [x], dimensions=(0,))


LIST = Shape("f32", (1, 4, 3))
INDEX = Shape("s32", ())


@build(LIST, INDEX)
def _dynamic_slice_all(comp: Computation, x: Instruction, i: Instruction) -> Instruction:
    return comp.create("dynamic-slice", [x, i, i, i], shape=LIST, dynamic_slice_sizes=(1, 4, 3))


@build(Shape("f32", (2, 4, 3)), INDEX)
def _dynamic_slice_part(comp: Computation, x: Instruction, i: Instruction) -> Instruction:
    return comp.create("dynamic-slice", [x, i, i, i], shape=LIST, dynamic_slice_sizes=(1, 4, 3))


@build(LIST, LIST, INDEX)
def _dynamic_update_all(comp: Computation, x: Instruction, u: Instruction, i: Instruction
                        ) -> Instruction:
    return comp.create("dynamic-update-slice", [x, u, i, i, i], shape=LIST)


@build(F32, F32)
def _select_true(comp: Computation, x: Instruction, y: Instruction) -> Instruction:
    return comp.create("select", [splat(comp, True, PRED), x, y])


@build(PRED, F32)
def _select_same(comp: Computation, p: Instruction, x: Instruction) -> Instruction:
    return comp.create("select", [p, x, x])


def _dot_identity(element_type: str) -> Callable[[], HloModule]:
    @build(Shape(element_type, (4, 3)))
    def make(comp: Computation, x: Instruction) -> Instruction:
        eye = comp.add_constant(np.eye(3), element_type)
        return comp.create("dot", [x, eye], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    return make


def _reduce_of(shape: Shape, dims: tuple[int, ...], kind: str,
               init: float) -> Callable[[], HloModule]:
    @build(shape)
    def make(comp: Computation, x: Instruction) -> Instruction:
        return reduce(comp, x, dims, kind, init)
    return make


def _unary_twice(opcode: str, shape: Shape) -> Callable[[], HloModule]:
    @build(shape)
    def make(comp: Computation, x: Instruction) -> Instruction:
        return comp.create(opcode, [comp.create(opcode, [x])])
    return make


@build(F32)
def _convert_to_same(comp: Computation, x: Instruction) -> Instruction:
    return comp.create("convert", [x], element_type="f32")


@build(F32)
def _barrier_of_set_size(comp: Computation, x: Instruction) -> Instruction:
    size = comp.create("get-dimension-size", [x], dimensions=(0,))
    # Printed static, as XLA's builder does for the static size (a dynamic result is the
    # dynamic padder's, not simplify's).
    return comp.create("opt-barrier", [comp.create("set-dimension-size", [x, size],
                                                   shape=x.shape, dimensions=(0,))])


@build(F32)
def _dimension_size_plus_one(comp: Computation, x: Instruction) -> Instruction:
    size = comp.create("get-dimension-size", [x], dimensions=(0,))
    return comp.create("add", [size, comp.add_constant(1, "s32")])


def _same_shape(opcode: str, **attributes: object) -> Callable[[], HloModule]:
    @build(Shape("f32", (2, 4)))
    def make(comp: Computation, x: Instruction) -> Instruction:
        return comp.create(opcode, [x], shape=x.shape if opcode != "transpose" else None,
                           **attributes)
    return make


ROOT_IS_PARAM = r"ROOT %param_0 = .* parameter\(0\)"
ROOT_IS_PARAM_1 = r"ROOT %param_1 = .* parameter\(1\)"

# rewrite name -> [(module maker, CHECK patterns after the rewrite)]
CASES: dict[str, list[tuple[Callable[[], HloModule], list[str]]]] = {
    "add-zero": [(_binary("add", F32, -0.0), [ROOT_IS_PARAM]),
                 (_binary("add", S32, 0, constant_first=True), [ROOT_IS_PARAM])],
    "subtract-zero": [(_binary("subtract", F32, 0.0), [ROOT_IS_PARAM]),
                      (_binary("subtract", S32, 0), [ROOT_IS_PARAM])],
    "subtract-self-integer": [(_self("subtract", S32),
                               [r"%constant = s32\[\] constant\(0\)",
                                r"ROOT %broadcast.* broadcast\(s32\[\] %constant\)"])],
    "multiply-one": [(_binary("multiply", F32, 1.0, constant_first=True), [ROOT_IS_PARAM]),
                     (_binary("multiply", S32, 1), [ROOT_IS_PARAM])],
    "multiply-zero-integer": [(_binary("multiply", S32, 0),
                               [r"ROOT %broadcast = s32\[8\]\{0\} broadcast\(.*constant\)"])],
    "divide-one": [(_binary("divide", F32, 1.0), [ROOT_IS_PARAM]),
                   (_binary("divide", S32, 1), [ROOT_IS_PARAM])],
    "divide-by-power-of-two": [(_binary("divide", F32, 4.0),
                                [r"%constant.* = f32\[\] constant\(0.25\)",
                                 r"ROOT %multiply = f32\[8\]\{0\} multiply\(.* %param_0, "
                                 r"f32\[8\]\{0\} %broadcast"]),
                               (_binary("divide", F32, 0.125),
                                [r"constant\(8\)", r"ROOT %multiply"])],
    "idempotent-self": [(_self("maximum", F32), [ROOT_IS_PARAM]),
                        (_self("and", PRED), [ROOT_IS_PARAM])],
    "max-min-identity": [(_binary("maximum", F32, -np.inf), [ROOT_IS_PARAM]),
                         (_binary("minimum", S32, 2**31 - 1, constant_first=True),
                          [ROOT_IS_PARAM])],
    "bitwise-identity": [(_binary("and", PRED, True), [ROOT_IS_PARAM]),
                         (_binary("xor", S32, 0), [ROOT_IS_PARAM])],
    "bitwise-absorb": [(_binary("or", S32, -1), [r"ROOT %broadcast = s32\[8\]"]),
                       (_binary("and", PRED, False), [r"ROOT %broadcast = pred\[8\]"])],
    "involution": [(_unary_twice("negate", F32), [ROOT_IS_PARAM]),
                   (_unary_twice("not", PRED), [ROOT_IS_PARAM])],
    "compare-self-integer": [(_self("compare", S32, direction="LT"),
                              [r"%constant = pred\[\] constant\(false\)",
                               r"ROOT %broadcast = pred\[8\]"]),
                             (_self("compare", S32, direction="GE"), [r"constant\(true\)"])],
    "convert-same-type": [(_convert_to_same, [ROOT_IS_PARAM])],
    "pass-through": [(_barrier_of_set_size, [ROOT_IS_PARAM])],
    "dimension-size": [(_dimension_size_plus_one,
                        [r"%constant.* = s32\[\] constant\(8\)",
                         r"ROOT %add = s32\[\] add\(s32\[\] %constant"])],
    "fold-broadcast-scalars": [(_add_of_scalar_products,
                                [r"%constant.* = f32\[\] constant\(6\)",
                                 r"%broadcast.* = f32\[8\]\{0\} broadcast\(f32\[\] %constant",
                                 r"ROOT %add = f32\[8\]\{0\} add\(.* %param_0, .* %broadcast"])],
    "tuple-element-of-tuple": [(_element_of_tuple, [r"ROOT %add.* = f32\[8\]\{0\} add\("
                                                    r".* %param_0, .* %param_0\)"])],
    "reshape-same-shape": [(_same_shape("reshape"), [ROOT_IS_PARAM])],
    "reshape-of-reshape": [(_reshape_twice,
                            [r"ROOT %reshape.* = f32\[4,2\]\{1,0\} reshape\(f32\[8\]\{0\} "
                             r"%param_0\)"])],
    "move-scalar-broadcast": [(_transpose_of_splat,
                               [r"%broadcast.* = f32\[4,2\]\{1,0\} broadcast\(f32\[\] %constant",
                                r"ROOT %add"])],
    "transpose-identity": [(_same_shape("transpose", dimensions=(0, 1)), [ROOT_IS_PARAM])],
    "transpose-of-transpose": [(_transpose_twice,
                                [r"ROOT %transpose.* = f32\[4,3,2\]\{2,1,0\} transpose\("
                                 r"f32\[2,3,4\]\{2,1,0\} %param_0\), dimensions=\{2,1,0\}"])],
    "broadcast-identity": [(_same_shape("broadcast", dimensions=(0, 1)), [ROOT_IS_PARAM])],
    "broadcast-of-broadcast": [(_broadcast_twice,
                                [r"ROOT %broadcast.* = f32\[2,3,4\]\{2,1,0\} broadcast\("
                                 r"f32\[3\]\{0\} %param_0\), dimensions=\{1\}"])],
    "slice-whole": [(_same_shape("slice", slice=((0, 2, 1), (0, 4, 1))), [ROOT_IS_PARAM])],
    "slice-of-slice": [(_slice_twice,
                        [r"ROOT %slice.* = f32\[2\]\{0\} slice\(f32\[16\]\{0\} %param_0\), "
                         r"slice=\{\[4:11:6\]\}"])],
    "slice-of-concatenate": [(_slice_of_concatenate(((5, 8, 1), (0, 3, 1))),
                              [r"ROOT %slice.* = f32\[3,3\]\{1,0\} slice\(f32\[6,3\]\{1,0\} "
                               r"%param_1\), slice=\{\[1:4\], \[0:3\]\}"]),
                             (_slice_of_concatenate(((0, 4, 2), (1, 2, 1))),
                              [r"ROOT %slice.* slice\(.* %param_0\), slice=\{\[0:3:2\], "
                               r"\[1:2\]\}"])],
    "concatenate-single": [(_concatenate_one, [ROOT_IS_PARAM])],
    "dynamic-slice-whole": [(_dynamic_slice_all, [ROOT_IS_PARAM])],
    "dynamic-update-slice-whole": [(_dynamic_update_all, [ROOT_IS_PARAM_1])],
    "select-constant-predicate": [(_select_true, [ROOT_IS_PARAM])],
    "select-same-branches": [(_select_same, [ROOT_IS_PARAM_1])],
    "dot-identity-integer": [(_dot_identity("s32"), [ROOT_IS_PARAM])],
    "reduce-trivial-dimensions": [
        (_reduce_of(Shape("f32", (4, 1)), (1,), "add", 0.0),
         [r"%reshape = f32\[4\]\{0\} reshape\(f32\[4,1\]\{1,0\} %param_0\)",
          r"%broadcast = f32\[4\]\{0\} broadcast\(f32\[\] %constant\), dimensions=\{\}",
          r"ROOT %add.* = f32\[4\]\{0\} add\(.* %broadcast, .* %reshape\)"]),
        (_reduce_of(Shape("f32", (8,)), (), "maximum", -3.0),
         [r"ROOT %maximum.* = f32\[8\]\{0\} maximum\(.* %broadcast, .* %(reshape|param_0)\)"]),
        (_reduce_of(Shape("f32", (4, 0)), (1,), "add", 0.0),
         [r"ROOT %broadcast = f32\[4\]\{0\} broadcast\(f32\[\] %constant\)"]),
    ],
}

# Rewrites that are not exact for these inputs: nothing may change.
UNCHANGED = {
    "x + 0.0 (float: -0.0 + 0.0 is +0.0)": _binary("add", F32, 0.0),
    "0.0 + x (float)": _binary("add", F32, 0.0, constant_first=True),
    "x - (-0.0) (float)": _binary("subtract", F32, -0.0),
    "x * 0 (float: inf * 0 is NaN)": _binary("multiply", F32, 0.0),
    "x - x (float: inf - inf is NaN)": _self("subtract", F32),
    "x == x (float: NaN)": _self("compare", F32, direction="EQ"),
    "x / 3 (1/3 is inexact)": _binary("divide", F32, 3.0),
    "x / 2^-149 (2^149 overflows)": _binary("divide", F32, float(np.float32(2.0**-149))),
    "max(x, -3)": _binary("maximum", F32, -3.0),
    "dot(x, I) (float: inf * 0, -0.0 + 0.0)": _dot_identity("f32"),
    "slice across concatenate operands": _slice_of_concatenate(((3, 6, 1), (0, 3, 1))),
    "dynamic-slice of part of x": _dynamic_slice_part,
    "reduce over a dimension of 4": _reduce_of(Shape("f32", (4, 4)), (1,), "add", 0.0),
}


def _simplify_and_check(module: HloModule, rewrites: tuple[str, ...] | None) -> bool:
    verify(module)
    args = edge_arguments(module)
    before = evaluate(module, *args)
    changed = AlgebraicSimplifier(rewrites).run(module)
    verify(module)
    assert_same_bits(evaluate(module, *args), before)
    return changed


@pytest.mark.parametrize(("name", "case"), [(name, n) for name, cases in CASES.items()
                                            for n in range(len(cases))])
def test_rewrite(name: str, case: int) -> None:
    make, patterns = CASES[name][case]
    # The rewrite alone, then every rewrite: both give the golden text.
    for rewrites in ((name,), None):
        module = make()
        assert _simplify_and_check(module, rewrites) is True
        check_lines(module.to_text(), r"^ENTRY %main", *patterns)


def test_every_rewrite_has_a_golden_test() -> None:
    assert set(CASES) == set(REWRITES)


@pytest.mark.parametrize("name", list(UNCHANGED))
def test_inexact_rewrites_do_not_fire(name: str) -> None:
    module = UNCHANGED[name]()
    text = module.to_text()
    assert _simplify_and_check(module, None) is False
    assert module.to_text() == text


def test_rewrites_chain_through_the_worklist() -> None:
    @build(F32)
    def make(comp: Computation, x: Instruction) -> Instruction:
        # -(-(x * 1)) + (-0.0), reshaped there and back: all of it is x.
        one = comp.create("multiply", [x, splat(comp, 1.0, F32)])
        twice = comp.create("negate", [comp.create("negate", [one])])
        total = comp.create("add", [twice, splat(comp, -0.0, F32)])
        matrix = comp.create("reshape", [total], shape=Shape("f32", (2, 4)))
        return comp.create("reshape", [matrix], shape=F32)

    module = make()
    assert _simplify_and_check(module, None) is True
    assert module.entry.root is module.entry.parameter(0)
    assert [i.opcode for i in module.entry.instructions] == ["parameter"]


def test_keeps_metadata_of_the_replaced_instruction() -> None:
    module = _binary("divide", F32, 2.0)()
    module.entry.root.metadata = {"op_type": "RealDiv", "op_name": "truediv"}
    _simplify_and_check(module, None)
    assert module.entry.root.opcode == "multiply"
    assert module.entry.root.metadata["op_name"] == "truediv"


def test_rewrites_reducer_free_modules_only_outside_fusions() -> None:
    from tfxla_lite.passes.fusion import Fusion

    module = _binary("multiply", F32, 1.0)()
    module.entry.root = module.entry.create("exponential", [module.entry.root])
    Fusion().run(module)
    fused = next(c for c in module.computations if c.is_fusion_computation)
    assert count(fused, "multiply") == 1
    AlgebraicSimplifier().run(module)
    verify(module)
    assert count(fused, "multiply") == 1  # fusion computations are left alone


def test_splat_value_reads_bits() -> None:
    module, comp = new_module()
    mixed_zeros = comp.add_constant(np.array([0.0, -0.0], np.float32))
    nans = comp.add_constant(np.array([np.nan, np.nan], np.float32))
    assert splat_value(mixed_zeros) is None
    assert np.isnan(splat_value(nans))
    assert splat_value(comp.add_constant(np.zeros((0,), np.float32))) is None
