"""The pipeline: parsing, the default list, verification after each pass."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hlo_builders import (
    assert_same_bits,
    count,
    edge_arguments,
    flatten,
    new_module,
    parameters,
    random_arguments,
    reduce,
    reduce_sum_x_plus_y_times_z,
)

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import VerificationError
from tfxla_lite.passes import DEFAULT_PIPELINE, PASSES, optimize, parse_pipeline
from tfxla_lite.passes.base import Pass


def test_registry_and_parsing() -> None:
    assert DEFAULT_PIPELINE == ("call-inliner,simplify,constant-folding,cse,while-licm,"
                                "slice-accumulation,dot-folding,simplify,dce,fuse-rows,fuse,output-fusion,multi-output-fusion,dce,"
                                "add-output-copies,schedule")
    assert [p.name for p in parse_pipeline(DEFAULT_PIPELINE)] == [
        "call-inliner", "simplify", "constant-folding", "cse", "while-licm",
        "slice-accumulation", "dot-folding", "simplify",
        "dce", "fuse-rows", "fuse", "output-fusion", "multi-output-fusion", "dce",
        "add-output-copies", "schedule"]
    assert {"simplify", "constant-folding", "cse"} <= set(PASSES)
    assert [p.name for p in parse_pipeline(" fuse , ")] == ["fuse"]
    assert parse_pipeline("") == []
    for name, cls in PASSES.items():
        assert cls.name == name and issubclass(cls, Pass) and cls.__doc__
        assert name == name.lower() and " " not in name and "_" not in name
    with pytest.raises(ValueError, match="unknown pass 'bogus'"):
        parse_pipeline("dce,bogus")


def test_default_pipeline_on_reduce_sum() -> None:
    module = reduce_sum_x_plus_y_times_z()
    args = random_arguments(module)
    before = evaluate(module, *args)
    assert optimize(module, verify=True) is module
    assert count(module.entry, "fusion") == 1
    assert module.entry.root.opcode == "tuple"
    (after,) = flatten(evaluate(module, *args))
    np.testing.assert_allclose(after, before, rtol=1e-5)


def test_verify_names_the_pass_that_broke_the_module() -> None:
    class Breaker(Pass):
        name = "breaker"

        def run(self, module) -> bool:
            module.entry.root = None
            return True

    PASSES["breaker"] = Breaker
    try:
        with pytest.raises(VerificationError, match="after pass breaker"):
            optimize(reduce_sum_x_plus_y_times_z(), "dce,breaker", verify=True)
    finally:
        del PASSES["breaker"]


# Modules shaped as TF lowering builds the seed examples (see tfxla_lite/examples.py):
# scalar constants broadcast into elementwise ops, reductions with -inf and 0 inits,
# dots with batch-broadcast weights, and the repeats lowering leaves.
def _splat(comp: Computation, value: float, shape: Shape) -> Instruction:
    return comp.create("broadcast", [comp.add_constant(value, shape.element_type)], shape=shape,
                       dimensions=())


def _gelu() -> HloModule:
    module, comp = new_module("gelu")
    shape = Shape("f32", (32,))
    (x,) = parameters(comp, shape)
    half = comp.create("multiply", [_splat(comp, 0.5, shape), x])
    scaled = comp.create("divide", [x, _splat(comp, 1.41421354, shape)])
    one_plus = comp.create("add", [_splat(comp, 1.0, shape), comp.create("erf", [scaled])])
    comp.root = comp.create("tuple", [comp.create("multiply", [half, one_plus])])
    return module


def _softmax(comp: Computation, x: Instruction, axis: int) -> Instruction:
    shape = x.shape
    kept = tuple(d for d in range(shape.rank) if d != axis)
    peak = reduce(comp, x, (axis,), "maximum", float("-inf"))
    shifted = comp.create("subtract", [x, comp.create("broadcast", [peak], shape=shape,
                                                      dimensions=kept)])
    exp = comp.create("exponential", [shifted])
    total = reduce(comp, exp, (axis,), "add")
    return comp.create("divide", [exp, comp.create("broadcast", [total], shape=shape,
                                                   dimensions=kept)])


def _softmax_module() -> HloModule:
    module, comp = new_module("softmax")
    (x,) = parameters(comp, Shape("f32", (8, 16)))
    comp.root = comp.create("tuple", [_softmax(comp, x, 1)])
    return module


def _mlp() -> HloModule:
    module, comp = new_module("mlp")
    x, w1, b1, w2, b2 = parameters(comp, Shape("f32", (8, 16)), Shape("f32", (16, 32)),
                                   Shape("f32", (32,)), Shape("f32", (32, 8)), Shape("f32", (8,)))
    hidden = comp.create("dot", [x, w1], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    biased = comp.create("add", [hidden, comp.create("broadcast", [b1], shape=hidden.shape,
                                                     dimensions=(1,))])
    relu = comp.create("maximum", [biased, _splat(comp, 0.0, hidden.shape)])
    out = comp.create("dot", [relu, w2], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("tuple", [comp.create("add", [out, comp.create(
        "broadcast", [b2], shape=out.shape, dimensions=(1,))])])
    return module


def _attention() -> HloModule:
    module, comp = new_module("self_attention")
    x, wq, wk = parameters(comp, Shape("f32", (2, 4, 8)), Shape("f32", (8, 8)),
                           Shape("f32", (8, 8)))
    batched = Shape("f32", (2, 8, 8))
    dims = {"lhs_batch_dims": (0,), "rhs_batch_dims": (0,)}

    def project(w: Instruction) -> Instruction:
        wide = comp.create("broadcast", [w], shape=batched, dimensions=(1, 2))
        return comp.create("dot", [x, wide], lhs_contracting_dims=(2,),
                           rhs_contracting_dims=(1,), **dims)

    q, k = project(wq), project(wk)
    scores = comp.create("dot", [q, k], lhs_contracting_dims=(2,), rhs_contracting_dims=(2,),
                         **dims)
    scaled = comp.create("divide", [scores, _splat(comp, 2.82842708, scores.shape)])
    weights = _softmax(comp, scaled, 2)
    # Lowering each TF op alone repeats work: the same projection once more, and an
    # identity reshape/transpose pair around the result.
    v = project(wq)
    mixed = comp.create("dot", [weights, v], lhs_contracting_dims=(2,),
                        rhs_contracting_dims=(1,), **dims)
    flipped = comp.create("transpose", [comp.create("transpose", [mixed], dimensions=(0, 2, 1))],
                          dimensions=(0, 2, 1))
    comp.root = comp.create("tuple", [comp.create("reshape", [flipped], shape=mixed.shape)])
    return module


SEED_LIKE: dict[str, Callable[[], HloModule]] = {
    "reduce_sum": reduce_sum_x_plus_y_times_z, "gelu": _gelu, "softmax": _softmax_module,
    "mlp": _mlp, "self_attention": _attention,
}


@pytest.mark.parametrize("name", list(SEED_LIKE))
def test_default_pipeline_on_seed_like_modules(name: str) -> None:
    module = SEED_LIKE[name]()
    for args in (random_arguments(module), edge_arguments(module)):
        fresh = SEED_LIKE[name]()
        before = evaluate(fresh, *args)
        optimize(fresh, verify=True)
        # No pass reassociates floats and fusion evaluates the same ops: bit for bit.
        assert_same_bits(evaluate(fresh, *args), before)
    optimize(module, verify=True)
    entry = module.entry
    for opcode in ("multiply", "add", "subtract", "divide", "exponential"):
        assert count(entry, opcode) == 0, f"{opcode} left outside a fusion"
    # Batch-broadcast weights of a dot stay a kernel of their own (see simplify's gaps).
    assert all(u.opcode == "dot" for i in entry.instructions if i.opcode == "broadcast"
               for u in i.users)


def test_default_pipeline_removes_lowering_leftovers() -> None:
    module = _attention()
    optimize(module, verify=True)
    entry = module.entry
    assert count(entry, "transpose") == 0 and count(entry, "reshape") == 0
    # The repeated projection is computed once: q, k (v is q), scores, mixed.
    assert count(entry, "dot") == 4
