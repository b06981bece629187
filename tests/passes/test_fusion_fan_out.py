"""Fusion's duplication decision on fan-out graphs (issue 19): a value that several
kernels read is recomputed in each only when the copies cost less than one kernel that
writes it and the reads of it. Asserts which fusions form (kernel counts, the
parameters of each consumer fusion) and the numerics before and after, under the
whole default pipeline and under `fuse` alone."""

from __future__ import annotations

import numpy as np
from hlo_builders import count, flatten, new_module, parameters, random_arguments, reduce

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule, Instruction
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.fusion import Fusion
from tfxla_lite.passes.pipeline import optimize
from tfxla_lite.passes.row_fusion import RowFusion

ROWS = Shape("f32", (64, 256))
ROW = Shape("f32", (64,))


def _fusions(module: HloModule) -> list[Instruction]:
    assert module.entry is not None
    return [i for i in module.entry.instructions if i.opcode == "fusion"]


def _in_fusions(module: HloModule, opcode: str) -> int:
    return sum(count(c, opcode) for c in module.computations if c.is_fusion_computation)


def _run(module: HloModule, passes: list | None) -> None:
    verify(module)
    args = random_arguments(module)
    before = evaluate(module, *args)
    if passes is None:
        optimize(module, verify=True)
    else:
        for p in passes:
            p.run(module)
    verify(module)
    for after, expected in zip(flatten(evaluate(module, *args)), flatten(before), strict=True):
        np.testing.assert_allclose(after, expected, rtol=1e-4, atol=1e-4)


def _residual_read_by_reductions(consumers: int) -> HloModule:
    """r = a + b (two full-size operands), reduced against `consumers` weights."""
    module, comp = new_module("fan_out")
    a, b, *weights = parameters(comp, ROWS, ROWS, *[ROWS] * consumers)
    r = comp.create("add", [a, b])
    sums = [reduce(comp, comp.create("multiply", [r, w]), (0,)) for w in weights]
    comp.root = comp.create("tuple", sums)
    return module


def test_a_sum_of_two_arrays_read_by_six_reductions_is_computed_once() -> None:
    # Six copies would each read a and b (twice r's bytes) to save one read of r.
    module = _residual_read_by_reductions(6)
    _run(module, [Fusion()])
    assert _in_fusions(module, "add") + count(module.entry, "add") == 1  # one r
    reductions = [f for f in _fusions(module) if f.attributes["kind"] == "kInput"]
    assert len(reductions) == 6
    # Each reduction reads r and its weight, never past r to a and b.
    assert all(len(f.operands) == 2 for f in reductions)


def test_the_same_graph_keeps_r_single_through_the_pipeline() -> None:
    module = _residual_read_by_reductions(6)
    _run(module, None)
    assert _in_fusions(module, "add") + count(module.entry, "add") == 1


def test_a_square_read_by_six_reductions_is_recomputed_in_each() -> None:
    # a * a reads a once (the kernel loads it once per element), so each copy reads as
    # many bytes as s itself: six copies cost less than writing s and reading it six
    # times (counting both operands, as for a + b above, had s materialized).
    module, comp = new_module("square_fan_out")
    a, *weights = parameters(comp, ROWS, *[ROWS] * 6)
    s = comp.create("multiply", [a, a])
    comp.root = comp.create("tuple", [
        reduce(comp, comp.create("multiply", [s, w]), (0,)) for w in weights])
    _run(module, [Fusion()])
    assert count(module.entry, "multiply") == 0  # no kernel of its own
    reductions = [f for f in _fusions(module) if f.attributes["kind"] == "kInput"]
    assert len(reductions) == 6
    assert all(len(f.operands) == 2 and f.operands[0] is a for f in reductions)


def test_a_centred_row_read_by_two_consumers_is_recomputed_in_each() -> None:
    # x - mean reads x and a broadcast row vector: two copies cost about x's reads,
    # which a kernel of its own would pay too, plus its write and two reads back.
    module, comp = new_module("centred")
    x, mean, scale = parameters(comp, ROWS, ROW, ROWS)
    centred = comp.create("subtract", [x, comp.create("broadcast", [mean], shape=ROWS,
                                                       dimensions=(0,))])
    variance = reduce(comp, comp.create("multiply", [centred, centred]), (1,))
    scaled = comp.create("multiply", [centred, scale])
    comp.root = comp.create("tuple", [variance, scaled])
    _run(module, [Fusion()])
    assert count(module.entry, "subtract") == 0
    assert _in_fusions(module, "subtract") == 2
    assert len(_fusions(module)) == 2


def test_a_gather_read_by_several_kernels_is_materialized() -> None:
    module, comp = new_module("embedding")
    table, indices = parameters(comp, Shape("f32", (1000, 256)), Shape("s32", (64, 1)))
    rows = comp.create("gather", [table, indices], shape=ROWS, offset_dims=(1,),
                       collapsed_slice_dims=(0,), start_index_map=(0,), index_vector_dim=1,
                       slice_sizes=(1, 256))
    outputs = [reduce(comp, comp.create(op, [rows, rows]), (1,))
               for op in ("add", "multiply", "maximum")]
    comp.root = comp.create("tuple", outputs)
    _run(module, [Fusion()])
    assert count(module.entry, "gather") + _in_fusions(module, "gather") == 1
    # The table is read by one kernel only.
    assert sum(any(o.shape.dims == (1000, 256) for o in f.operands)
               for f in _fusions(module)) <= 1


def test_row_fusion_reads_a_shared_residual_instead_of_recomputing_it() -> None:
    # Two layer-norm-like row groups over r = a + b: each reads r, not a and b.
    module, comp = new_module("two_rows")
    a, b = parameters(comp, ROWS, ROWS)
    r = comp.create("add", [a, b])
    means = [reduce(comp, comp.create(op, [r, r]), (1,)) for op in ("multiply", "maximum")]
    centred = [comp.create("subtract", [r, comp.create("broadcast", [m], shape=ROWS,
                                                        dimensions=(0,))]) for m in means]
    comp.root = comp.create("tuple", centred)
    _run(module, [RowFusion(), Fusion()])
    assert _in_fusions(module, "add") + count(module.entry, "add") == 1
    assert all(len(f.operands) <= 2 for f in _fusions(module))
