"""dot-folding: a dot with a weight broadcast along its batch, and a batched dot summed
over its batch, become one plain dot; reshapes that merge attention heads into one batch
dimension and transposes of dot operands fold into the dots' dimension numbers. Golden
text, counters, the cases that must stay as they are, and numerics before and after
(evaluator) and compiled (CPU), with the verifier after every step."""

from __future__ import annotations

import sys
from pathlib import Path

import hlo_builders as hlo
import numpy as np
import pytest
from hlo_builders import check_lines, count, flatten, new_module, parameters, reduce

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.dot_folding import DotFolding, gemm_layout
from tfxla_lite.passes.simplify import AlgebraicSimplifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerances import assert_close  # noqa: E402


def _batched(comp: Computation, x: Instruction, w: Instruction, contracting: int) -> Instruction:
    """x[b, m, k] · broadcast(w) as TF lowers BatchMatMulV2 of a 3-D x and a 2-D w."""
    b = x.shape.dims[0]
    broadcast = comp.create("broadcast", [w], shape=Shape(w.shape.element_type,
                                                          (b, *w.shape.dims)), dimensions=(1, 2))
    return comp.create("dot", [x, broadcast], lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                       lhs_contracting_dims=(2,), rhs_contracting_dims=(contracting,))


def _fold(module: HloModule, changed: bool = True) -> list[np.ndarray]:
    """Run the pass (verified); the result must match the evaluator's before it."""
    verify(module)
    args = hlo.random_arguments(module)
    before = evaluate(module, *args)
    assert DotFolding().run(module) is changed
    verify(module)
    after = evaluate(module, *args)
    for value, expected in zip(flatten(after), flatten(before), strict=True):
        assert_close(value, expected, "dot", "evaluator, after dot-folding")
    assert DotFolding().run(module) is False  # nothing left to fold
    return args


@pytest.mark.parametrize("transposed", [False, True])
def test_broadcast_weight_becomes_one_dot(transposed: bool) -> None:
    module, comp = new_module()
    w_dims = (32, 24) if transposed else (24, 32)  # forward x·w, backward dy·wᵀ
    x, w = parameters(comp, Shape("f32", (5, 7, 24)), Shape("f32", w_dims))
    comp.root = _batched(comp, x, w, contracting=2 if transposed else 1)
    args = _fold(module)
    assert count(comp, "broadcast") == 0 and count(comp, "dot") == 1
    contracting = 1 if transposed else 0
    check_lines(module.to_text(),
                r"ROOT %dot.* = f32\[5,7,32\]\{2,1,0\} dot\(f32\[5,7,24\]\{2,1,0\} %param_0, "
                rf"f32\[{w_dims[0]},{w_dims[1]}\]\{{1,0\}} %param_1\), "
                rf"lhs_contracting_dims=\{{2\}}, rhs_contracting_dims=\{{{contracting}\}}")
    expected = np.einsum("bmk,kn->bmn", args[0], args[1].T if transposed else args[1])
    (result,) = compile_module(module)(*args)
    assert_close(result, expected.astype(np.float32), "dot", "compiled")


def test_batch_sum_of_dots_becomes_one_dot() -> None:
    # TF's weight gradient of x[b, m, k] · w: Σ_b x[b]ᵀ · dy[b].
    module, comp = new_module()
    x, dy = parameters(comp, Shape("f32", (6, 9, 16)), Shape("f32", (6, 9, 20)))
    product = comp.create("dot", [x, dy], lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                          lhs_contracting_dims=(1,), rhs_contracting_dims=(1,))
    comp.root = reduce(comp, product, (0,))
    args = _fold(module)
    assert count(comp, "reduce") == 0 and count(comp, "dot") == 1
    check_lines(module.to_text(),
                r"ROOT %dot.* = f32\[16,20\]\{1,0\} dot\(.* %param_0, .* %param_1\), "
                r"lhs_contracting_dims=\{0,1\}, rhs_contracting_dims=\{0,1\}")
    expected = np.einsum("bmk,bmn->kn", args[0].astype(np.float64), args[1].astype(np.float64))
    (result,) = compile_module(module)(*args)
    assert_close(result, expected.astype(np.float32), "dot", "compiled")


def test_both_rewrites_in_a_training_step_shape() -> None:
    # Forward projection and weight gradient side by side, f64, two batch dimensions.
    module, comp = new_module()
    x, w, dy = parameters(comp, Shape("f64", (2, 3, 4, 8)), Shape("f64", (8, 5)),
                          Shape("f64", (2, 3, 4, 5)))
    broadcast = comp.create("broadcast", [w], shape=Shape("f64", (2, 3, 8, 5)),
                            dimensions=(2, 3))
    forward = comp.create("dot", [x, broadcast], lhs_batch_dims=(0, 1), rhs_batch_dims=(0, 1),
                          lhs_contracting_dims=(3,), rhs_contracting_dims=(2,))
    grads = comp.create("dot", [x, dy], lhs_batch_dims=(0, 1), rhs_batch_dims=(0, 1),
                        lhs_contracting_dims=(2,), rhs_contracting_dims=(2,))
    comp.root = comp.create("tuple", [forward, reduce(comp, grads, (0, 1))])
    args = _fold(module)
    assert count(comp, "broadcast") == 0 and count(comp, "reduce") == 0
    assert all(not i.attributes.get("lhs_batch_dims") for i in comp.instructions
               if i.opcode == "dot")
    forward_out, grads_out = compile_module(module)(*args)
    assert_close(forward_out, np.einsum("abmk,kn->abmn", args[0], args[1]), "dot")
    assert_close(grads_out, np.einsum("abmk,abmn->kn", args[0], args[2]), "dot")


def test_attention_heads_fold_into_one_batched_dot() -> None:
    # TF's scores of multi-head attention: q and k [b, s, h, d] transposed to [b, h, s, d]
    # and [b, h, d, s], merged to [b·h, ...], one batched dot, split into heads again.
    module, comp = new_module()
    q, k = parameters(comp, Shape("f32", (2, 6, 3, 4)), Shape("f32", (2, 6, 3, 4)))
    qt = comp.create("transpose", [q], dimensions=(0, 2, 1, 3))
    kt = comp.create("transpose", [k], dimensions=(0, 2, 3, 1))
    merged_q = comp.create("reshape", [qt], shape=Shape("f32", (6, 6, 4)))
    merged_k = comp.create("reshape", [kt], shape=Shape("f32", (6, 4, 6)))
    scores = comp.create("dot", [merged_q, merged_k], lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                         lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))
    comp.root = comp.create("reshape", [scores], shape=Shape("f32", (2, 3, 6, 6)))
    args = _fold(module)
    AlgebraicSimplifier().run(module)  # the reshape pair cancels
    verify(module)
    assert {i.opcode for i in comp.instructions} == {"parameter", "dot"}
    check_lines(module.to_text(),
                r"ROOT %dot.* = f32\[2,3,6,6\]\{3,2,1,0\} dot\(.* %param_0, .* %param_1\), "
                r"lhs_batch_dims=\{0,2\}, rhs_batch_dims=\{0,2\}, lhs_contracting_dims=\{3\}, "
                r"rhs_contracting_dims=\{3\}")
    (result,) = compile_module(module)(*args)
    assert_close(result, np.einsum("bshd,bthd->bhst", *args), "dot", "compiled")


def test_transposed_operand_folds_when_gemm_reads_it() -> None:
    module, comp = new_module()
    x, y = parameters(comp, Shape("f32", (12, 5)), Shape("f32", (7, 12)))
    xt = comp.create("transpose", [x], dimensions=(1, 0))  # [5, 12]
    yt = comp.create("transpose", [y], dimensions=(1, 0))  # [12, 7]
    comp.root = comp.create("dot", [xt, yt], lhs_contracting_dims=(1,),
                            rhs_contracting_dims=(0,))
    args = _fold(module)
    assert count(comp, "transpose") == 0
    check_lines(module.to_text(), r"ROOT %dot.* = f32\[5,7\]\{1,0\} dot\(.* %param_0, .* "
                                  r"%param_1\), lhs_contracting_dims=\{0\}, "
                                  r"rhs_contracting_dims=\{1\}")
    (result,) = compile_module(module)(*args)
    assert_close(result, (args[0].T.astype(np.float64) @ args[1].T.astype(np.float64)
                          ).astype(np.float32), "dot", "compiled")


def test_gemm_layout_agrees_with_the_dot_codegen() -> None:
    from tfxla_lite.codegen.cpu.dot import _matrix

    dims = (2, 6, 3, 4)
    groups = [(), (0,), (1,), (3,), (1, 3), (2, 3), (0, 1), (1, 2), (3, 1), (0, 2)]
    for rows in groups:
        for cols in groups:
            if set(rows) & set(cols):
                continue
            assert gemm_layout(dims, rows, cols) == (_matrix(dims, rows, cols) is not None), \
                (rows, cols)


def _unchanged(build) -> None:  # noqa: ANN001 - a local builder
    module, comp = new_module()
    comp.root = build(comp)
    text = module.to_text()
    _fold(module, changed=False)
    assert module.to_text() == text


def test_cases_that_stay_batched() -> None:
    f32 = "f32"

    def lhs_broadcast(comp: Computation) -> Instruction:
        # The plain dot would put the batch after the weight's rows: needs a transpose.
        w, y = parameters(comp, Shape(f32, (7, 24)), Shape(f32, (5, 24, 3)))
        bw = comp.create("broadcast", [w], shape=Shape(f32, (5, 7, 24)), dimensions=(1, 2))
        return comp.create("dot", [bw, y], lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                           lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))

    def broadcast_beyond_batch(comp: Computation) -> Instruction:
        # w is broadcast along n as well: not one weight matrix per batch element.
        x, w = parameters(comp, Shape(f32, (5, 7, 24)), Shape(f32, (24,)))
        bw = comp.create("broadcast", [w], shape=Shape(f32, (5, 24, 3)), dimensions=(1,))
        return comp.create("dot", [x, bw], lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                           lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))

    def transposing_broadcast(comp: Computation) -> Instruction:
        x, w = parameters(comp, Shape(f32, (5, 7, 24)), Shape(f32, (3, 24)))
        bw = comp.create("broadcast", [w], shape=Shape(f32, (5, 24, 3)), dimensions=(2, 1))
        return comp.create("dot", [x, bw], lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                           lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))

    def batch_after_rows(comp: Computation) -> Instruction:
        # x's batch dimension follows its free one: a plain dot orders them the other way.
        x, w = parameters(comp, Shape(f32, (7, 5, 24)), Shape(f32, (24, 3)))
        bw = comp.create("broadcast", [w], shape=Shape(f32, (5, 24, 3)), dimensions=(1, 2))
        return comp.create("dot", [x, bw], lhs_batch_dims=(1,), rhs_batch_dims=(0,),
                           lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))

    def integer_dot(comp: Computation) -> Instruction:
        x, w = parameters(comp, Shape("s32", (5, 7, 24)), Shape("s32", (24, 3)))
        return _batched(comp, x, w, contracting=1)

    def batched_product(comp: Computation) -> list[Instruction]:
        x, dy = parameters(comp, Shape(f32, (6, 9, 16)), Shape(f32, (6, 9, 20)))
        return comp.create("dot", [x, dy], lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                           lhs_contracting_dims=(1,), rhs_contracting_dims=(1,))

    def sum_over_rows(comp: Computation) -> Instruction:
        return reduce(comp, batched_product(comp), (1,))  # not the batch

    def max_over_batch(comp: Computation) -> Instruction:
        return reduce(comp, batched_product(comp), (0,), kind="maximum", init=-np.inf)

    def sum_from_one(comp: Computation) -> Instruction:
        return reduce(comp, batched_product(comp), (0,), init=1.0)

    def product_read_twice(comp: Computation) -> Instruction:
        product = batched_product(comp)
        return comp.create("tuple", [reduce(comp, product, (0,)), product])

    def transpose_reordering_rows(comp: Computation) -> Instruction:
        # Folding would swap the order of the result's two row dimensions.
        x, w = parameters(comp, Shape(f32, (3, 5, 8)), Shape(f32, (8, 4)))
        xt = comp.create("transpose", [x], dimensions=(1, 0, 2))
        return comp.create("dot", [xt, w], lhs_contracting_dims=(2,), rhs_contracting_dims=(0,))

    def transpose_gemm_cannot_read(comp: Computation) -> Instruction:
        # Rows (0, 2) of x: no single stride, so the transposed copy stays.
        x, w = parameters(comp, Shape(f32, (3, 8, 5)), Shape(f32, (8, 4)))
        xt = comp.create("transpose", [x], dimensions=(0, 2, 1))
        return comp.create("dot", [xt, w], lhs_contracting_dims=(2,), rhs_contracting_dims=(0,))

    def merged_batch_read_by_a_loop(comp: Computation) -> Instruction:
        # The split would need a reshape of the result of its own.
        a, b = parameters(comp, Shape(f32, (2, 3, 6, 4)), Shape(f32, (2, 3, 4, 5)))
        ra = comp.create("reshape", [a], shape=Shape(f32, (6, 6, 4)))
        rb = comp.create("reshape", [b], shape=Shape(f32, (6, 4, 5)))
        product = comp.create("dot", [ra, rb], lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                              lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))
        return comp.create("negate", [product])

    for build in (transpose_reordering_rows, transpose_gemm_cannot_read,
                  merged_batch_read_by_a_loop, lhs_broadcast, broadcast_beyond_batch,
                  transposing_broadcast, batch_after_rows, integer_dot, sum_over_rows,
                  max_over_batch, sum_from_one, product_read_twice):
        _unchanged(build)


def test_random_transposed_operands_fold_only_into_gemm_layouts() -> None:
    """Random dots of transposed operands: the result never changes, and a folded dot
    is one the CPU backend runs as GEMM calls."""
    from tfxla_lite.codegen.cpu.dot import plan_gemm

    rng = np.random.default_rng(7)
    folded = 0
    for _ in range(60):
        batch, m, k, n = (int(v) for v in rng.integers(1, 5, size=4))
        module, comp = new_module()
        # lhs [batch, m, k] and rhs [batch, k, n], each stored in a random dimension order
        operands = []
        for dims in ((batch, m, k), (batch, k, n)):
            permutation = tuple(int(p) for p in rng.permutation(3))
            inverse = tuple(int(p) for p in np.argsort(permutation))
            stored = tuple(dims[p] for p in permutation)
            source = comp.add_parameter(len(operands), Shape("f32", stored))
            operands.append(comp.create("transpose", [source], dimensions=inverse))
        comp.root = comp.create("dot", operands, lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                                lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))
        verify(module)
        args = hlo.random_arguments(module)
        before = evaluate(module, *args)
        changed = DotFolding().run(module)
        verify(module)
        assert_close(evaluate(module, *args), before, "dot", "after dot-folding")
        if changed:
            folded += 1
            (dot,) = [i for i in comp.instructions if i.opcode == "dot"]
            assert plan_gemm(dot) is not None, module.to_text()
    assert folded > 10  # the draw exercises the rewrite
