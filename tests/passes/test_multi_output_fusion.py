"""multi-output-fusion: golden text, kernel counts, legality (shapes, cycles, size),
memory (merges that grow the temp arena are refused), numerics before and after, the
verifier after every run, and compiled results."""

from __future__ import annotations

import numpy as np
from hlo_builders import check_lines, count, flatten, new_module, parameters, random_arguments
from hlo_builders import reduce as reduce_of

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule, Instruction
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes import assign_buffers, optimize
from tfxla_lite.passes.dce import DeadCodeElimination
from tfxla_lite.passes.fusion import Fusion
from tfxla_lite.passes.multi_output_fusion import MultiOutputFusion
from tfxla_lite.passes.output_copies import AddOutputCopies
from tfxla_lite.passes.output_fusion import OutputFusion
from tfxla_lite.passes.pipeline import DEFAULT_PIPELINE, PASSES
from tfxla_lite.passes.scheduler import MemoryScheduler

X = Shape("f32", (4, 8))
MATRIX64 = Shape("f32", (64, 64))


def _run(module: HloModule, changed: bool, pass_: MultiOutputFusion | None = None) -> None:
    """fuse, then multi-output fusion; verifies and computes what the input did."""
    verify(module)
    args = random_arguments(module)
    before = flatten(evaluate(module, *args))
    Fusion().run(module)
    verify(module)
    assert (pass_ or MultiOutputFusion()).run(module) is changed
    verify(module)
    for after, expected in zip(flatten(evaluate(module, *args)), before, strict=True):
        np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-5)
    assert (pass_ or MultiOutputFusion()).run(module) is False  # a fixed point


def _kernels(module: HloModule) -> int:
    return sum(1 for i in module.entry.instructions
               if i.opcode not in ("parameter", "constant", "tuple", "get-tuple-element"))


def _moments(dims: tuple[int, ...] = (1,)) -> HloModule:
    """reduce_sum(x) and reduce_sum(x*x) over `dims`: two kernels that both read x."""
    module, comp = new_module("moments")
    (x,) = parameters(comp, X)
    total = reduce_of(comp, x, dims)
    squares = reduce_of(comp, comp.create("multiply", [x, x]), dims)
    comp.root = comp.create("tuple", [total, squares])
    return module


def test_sibling_reductions_become_one_kernel() -> None:
    module = _moments()
    _run(module, changed=True)
    assert _kernels(module) == 1
    fusion = next(i for i in module.entry.instructions if i.opcode == "fusion")
    assert fusion.attributes["kind"] == "kInput"
    assert fusion.shape == Shape.tuple_of([Shape("f32", (4,))] * 2)
    assert len(module.computations) == 3  # reducer, fusion, entry: no leftovers
    assert count(module.entry, "get-tuple-element") == 2
    check_lines(module.to_text(),
                r"^%fused_computation.* \(param_0.*: f32\[4,8\]\) -> \(f32\[4\], f32\[4\]\) \{",
                r"multiply\(.* %param_0.*, .* %param_0.*\)",
                r"reduce\(.* %multiply.*\), dimensions=\{1\}",
                r"reduce\(.* %param_0.*, .*\), dimensions=\{1\}",
                r"ROOT %tuple.* = \(f32\[4\]\{0\}, f32\[4\]\{0\}\) tuple\(",
                r"^ENTRY %main",
                r"%multi_output_.* = \(f32\[4\]\{0\}, f32\[4\]\{0\}\) fusion\(f32\[4,8\]\{1,0\} "
                r"%param_0\), kind=kInput, calls=%fused_computation",
                r"get-tuple-element\(.*\), index=[01]",
                r"get-tuple-element\(.*\), index=[01]",
                r"ROOT %tuple = \(f32\[4\]\{0\}, f32\[4\]\{0\}\) tuple\(")


def test_sibling_loops_read_their_operand_once() -> None:
    module, comp = new_module("loops")
    x, y = parameters(comp, X, X)
    a = comp.create("exponential", [comp.create("add", [x, y])])
    b = comp.create("multiply", [comp.create("negate", [x]), x])
    comp.root = comp.create("tuple", [a, b])
    _run(module, changed=True)
    assert _kernels(module) == 1
    fusion = next(i for i in module.entry.instructions if i.opcode == "fusion")
    assert fusion.attributes["kind"] == "kLoop"
    assert len(fusion.operands) == 2  # x once, y once


def test_producer_needed_by_a_reduction_and_outside() -> None:
    """exp(x) feeds a row sum and an output: one kernel computes exp once and returns
    both the sum and exp(x)."""
    module, comp = new_module("producer")
    (x,) = parameters(comp, X)
    e = comp.create("exponential", [x])
    total = reduce_of(comp, e, (1,))
    comp.root = comp.create("tuple", [total, comp.create("negate", [e])])
    _run(module, changed=True)
    fusions = [i for i in module.entry.instructions if i.opcode == "fusion"]
    merged = next(f for f in fusions if f.shape.is_tuple)
    assert merged.attributes["kind"] == "kInput"
    assert [s.dims for s in merged.shape.tuple_shapes] == [(4,), (4, 8)]
    assert count(merged.fused_computation, "exponential") == 1
    # exp is computed once in the whole module.
    assert sum(count(c, "exponential") for c in module.computations
               if any(c is f.fused_computation for f in fusions)) == 1


def test_reductions_over_different_dimensions_stay_apart() -> None:
    module, comp = new_module("rows_and_columns")
    (x,) = parameters(comp, X)
    comp.root = comp.create("tuple", [reduce_of(comp, x, (1,)), reduce_of(comp, x, (0,))])
    _run(module, changed=False)
    assert _kernels(module) == 2


def test_no_cycle_through_a_dependent_sibling() -> None:
    """b reads x and the row sums of x: merging the two would make b wait for itself."""
    module, comp = new_module("dependent")
    (x,) = parameters(comp, X)
    sums = reduce_of(comp, x, (1,))
    wide = comp.create("broadcast", [sums], shape=X, dimensions=(0,))
    b = comp.create("divide", [x, wide])
    comp.root = comp.create("tuple", [sums, b])
    _run(module, changed=False)


def test_a_full_reduction_keeps_its_chunks() -> None:
    """A loop over x and a full reduction of x stay apart: a kernel that writes an
    array of x's shape could not split the reduction into parallel chunks."""
    module, comp = new_module("full")
    (x,) = parameters(comp, X)
    comp.root = comp.create("tuple", [reduce_of(comp, x, (0, 1)),
                                      comp.create("negate", [x])])
    _run(module, changed=False)


def test_size_bound_on_outputs() -> None:
    module, comp = new_module("three")
    (x,) = parameters(comp, X)
    sums = [reduce_of(comp, comp.create(op, [x]), (1,)) for op in ("negate", "abs", "sign")]
    comp.root = comp.create("tuple", sums)
    _run(module, changed=True, pass_=MultiOutputFusion(max_outputs=2))
    assert _kernels(module) == 2
    module, comp = new_module("three")
    (x,) = parameters(comp, X)
    sums = [reduce_of(comp, comp.create(op, [x]), (1,)) for op in ("negate", "abs", "sign")]
    comp.root = comp.create("tuple", sums)
    _run(module, changed=True)
    assert _kernels(module) == 1


def test_registered_and_in_the_default_pipeline() -> None:
    assert PASSES["multi-output-fusion"] is MultiOutputFusion
    names = DEFAULT_PIPELINE.split(",")
    assert names.index("multi-output-fusion") > names.index("fuse")
    assert names.index("multi-output-fusion") < names.index("add-output-copies")


def test_optimize_runs_it_with_the_verifier() -> None:
    module = _moments()
    optimize(module, verify=True)
    assert _kernels(module) == 1


# -- memory: merges that would grow the temp arena are refused --------------------------

def _arena(module: HloModule, mof: MultiOutputFusion | None) -> int:
    """The temp arena after the default pipeline's fusion and buffer passes, with `mof`
    as the multi-output fusion pass (None: without one); checks numerics as it goes."""
    args = random_arguments(module)
    before = flatten(evaluate(module, *args))
    for hlo_pass in (Fusion(), OutputFusion(), mof, DeadCodeElimination(), AddOutputCopies(),
                     MemoryScheduler()):
        if hlo_pass is not None:
            hlo_pass.run(module)
            verify(module)
    for after, expected in zip(flatten(evaluate(module, *args)), before, strict=True):
        np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-5)
    return assign_buffers(module).temp_bytes


def _tuple_fusions(module: HloModule) -> int:
    return sum(1 for i in module.entry.instructions if i.opcode == "fusion" and i.shape.is_tuple)


def _transposes_read_far_apart() -> HloModule:
    """transpose(x) @ y + transpose(tanh(x)) @ y: two loop kernels read x; each result
    is read by its own dot."""
    module, comp = new_module("transposes")
    x, y = parameters(comp, Shape("f32", (64, 96)), Shape("f32", (64, 32)))

    def times_y(a: Instruction) -> Instruction:
        return comp.create("dot", [a, y], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))

    first = times_y(comp.create("transpose", [x], dimensions=(1, 0)))
    second = times_y(comp.create("transpose", [comp.create("tanh", [x])], dimensions=(1, 0)))
    comp.root = comp.create("add", [first, second])
    return module


def test_siblings_whose_results_are_read_far_apart_stay_apart() -> None:
    # Merged, both 24 KiB transposes are live at once; apart, the first dies at its dot
    # before the second is computed.
    alone = _arena(_transposes_read_far_apart(), None)
    module = _transposes_read_far_apart()
    assert _arena(module, MultiOutputFusion()) == alone == 36864
    assert _tuple_fusions(module) == 0
    # Not a tautology: unweighed, the pass merges them and the arena grows.
    module = _transposes_read_far_apart()
    assert _arena(module, MultiOutputFusion(weigh_memory=False)) == 61440
    assert _tuple_fusions(module) == 1


def _exponential_read_late() -> HloModule:
    """p = exp(t), t a reduction's result that p may overwrite; a row reduction of
    p * dot(y, w) and dot(p, w) read p."""
    module, comp = new_module("late")
    z, y, w = parameters(comp, Shape("f32", (2, 64, 64)), MATRIX64, MATRIX64)
    t = reduce_of(comp, z, (0,))
    p = comp.create("exponential", [t])
    late = comp.create("dot", [y, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    sums = reduce_of(comp, comp.create("multiply", [p, late]), (1,))
    comp.root = comp.create("tuple", [sums, comp.create(
        "dot", [p, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))])
    return module


def test_producer_whose_operand_would_outlive_it_stays_apart() -> None:
    # Fused into the row reduction, exp(t) would be computed when dot(y, w) is live, and
    # t could no longer die where exp(t) overwrites it.
    module = _exponential_read_late()
    assert _arena(module, MultiOutputFusion()) == _arena(_exponential_read_late(), None) == 16384
    assert _tuple_fusions(module) == 0
    module = _exponential_read_late()
    assert _arena(module, MultiOutputFusion(weigh_memory=False)) == 32768
    assert _tuple_fusions(module) == 1


def _lstm_cell() -> HloModule:
    """c' = σ(f)·c + σ(i)·tanh(g), h = σ(o)·tanh(c'), the gates slices of one array."""
    module, comp = new_module("lstm")
    gates, c = parameters(comp, Shape("f32", (16, 256)), Shape("f32", (16, 64)))

    def gate(n: int, opcode: str) -> Instruction:
        part = comp.create("slice", [gates], slice=((0, 16, 1), (64 * n, 64 * n + 64, 1)))
        return comp.create(opcode, [part])

    i, f, g, o = (gate(n, op) for n, op in enumerate(("logistic", "logistic", "tanh",
                                                       "logistic")))
    cell = comp.create("add", [comp.create("multiply", [f, c]), comp.create("multiply", [i, g])])
    comp.root = comp.create("tuple", [comp.create("multiply", [o, comp.create("tanh", [cell])]),
                                      cell])
    return module


def test_loop_kernels_merge_into_their_consumer_through_get_tuple_elements() -> None:
    # `fuse` computes c' (an output, so written anyway) in one kernel and h in another
    # that reads it (recomputing c' there would read c and the gates again): no temps.
    # The two outputs' kernels merge as siblings, which then read the gates once.
    assert _arena(_lstm_cell(), None) == 0
    module = _lstm_cell()
    assert _arena(module, MultiOutputFusion()) == 0
    entry = module.entry
    assert [i.opcode for i in entry.instructions if i.opcode not in (
        "parameter", "get-tuple-element", "tuple")] == ["fusion"]
    fused = next(i for i in entry.instructions if i.opcode == "fusion").fused_computation
    assert count(fused, "tanh") == 2 and count(fused, "logistic") == 3  # each computed once
    check_lines(module.to_text(),
                r"^%fused_computation.* -> \(f32\[16,64\], f32\[16,64\]\) \{",
                r"ROOT %tuple.* = \(f32\[16,64\]\{1,0\}, f32\[16,64\]\{1,0\}\) tuple\(",
                r"^ENTRY %main",
                r"%multi_output_.* = \(f32\[16,64\]\{1,0\}, f32\[16,64\]\{1,0\}\) fusion\("
                r"f32\[16,256\]\{1,0\} %param_0, f32\[16,64\]\{1,0\} %param_1\), kind=kLoop")
    # Compiled, the one kernel computes both outputs.
    args = random_arguments(_lstm_cell())
    expected = flatten(evaluate(_lstm_cell(), *args))
    executable = compile_module(_lstm_cell(), verify=True, cache=False)
    assert executable.kernel_count == 1 and executable.temp_bytes == 0
    for got, want in zip(executable(*args), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_without_budget_to_weigh_a_merge_nothing_merges() -> None:
    module = _moments()
    _run(module, changed=False, pass_=MultiOutputFusion(weighing_budget=0))
    assert _kernels(module) == 2


def _column_statistics() -> HloModule:
    """Column sums of exp(x) and of x*x, column maxima of x, and exp(x) itself."""
    module, comp = new_module("columns")
    (x,) = parameters(comp, Shape("f32", (500, 40)))
    e = comp.create("exponential", [x])
    comp.root = comp.create("tuple", [
        reduce_of(comp, e, (0,)), reduce_of(comp, comp.create("multiply", [x, x]), (0,)),
        reduce_of(comp, x, (0,), "maximum", -np.inf), e])
    return module


def test_reduction_kernel_with_an_input_shaped_result_feeds_a_reduction_of_it() -> None:
    # The siblings of x merge first (the maxima and exp(x), then the sums of squares);
    # the sum of exp(x) then reads that kernel's input-shaped exp(x) at its own index and
    # joins it: one kernel, whose leaves all share the input's iteration space.
    module = _column_statistics()
    _run(module, changed=True)
    assert _kernels(module) == 1
    (fusion,) = [i for i in module.entry.instructions if i.opcode == "fusion"]
    assert fusion.attributes["kind"] == "kInput"
    assert sorted(s.dims for s in fusion.shape.tuple_shapes) == [(40,)] * 3 + [(500, 40)]
    assert count(fusion.fused_computation, "exponential") == 1
    args = random_arguments(_column_statistics())
    expected = flatten(evaluate(_column_statistics(), *args))
    executable = compile_module(_column_statistics(), verify=True, cache=False)
    assert executable.kernel_count == 1
    for got, want in zip(executable(*args), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _bias_gradient(batch: int = 4) -> HloModule:
    """A bias gradient's pattern: g = (x + y) * (x - y) over [batch, 16, 32], summed over
    its first two dimensions, and reshaped to [batch*16, 32] for a dot: `fuse` computes g
    in both kernels (the reduce's and the reshape's, which the dot cannot take in)."""
    module, comp = new_module("bias_gradient")
    x, y, w = parameters(comp, Shape("f32", (batch, 16, 32)), Shape("f32", (batch, 16, 32)),
                         Shape("f32", (32, 8)))
    g = comp.create("multiply", [comp.create("add", [x, y]), comp.create("subtract", [x, y])])
    flat = comp.create("reshape", [g], shape=Shape("f32", (batch * 16, 32)))
    product = comp.create("dot", [flat, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("tuple", [reduce_of(comp, g, (0, 1)), product])
    return module


def test_a_reduction_and_the_reshape_of_its_input_share_one_kernel() -> None:
    """The sum and the reshaped values merge into one reduction kernel that computes g
    once and stores it where the reshape puts it, even where the two kernels together
    are over the size bound (the merged one adds only the roots to either)."""
    module = _bias_gradient()
    _run(module, changed=True, pass_=MultiOutputFusion(max_instructions=3))
    (merged,) = [i for i in module.entry.instructions if i.opcode == "fusion"]
    assert merged.attributes["kind"] == "kInput"
    assert [s.dims for s in merged.shape.tuple_shapes] == [(64, 32), (32,)]
    for opcode in ("add", "subtract", "multiply"):
        assert count(merged.fused_computation, opcode) == 1
    args = random_arguments(_bias_gradient())
    expected = flatten(evaluate(_bias_gradient(), *args))
    executable = compile_module(_bias_gradient(), verify=True, cache=False)
    assert count(executable.module.entry, "fusion") == 1
    for got, want in zip(executable(*args), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bigger_siblings_than_the_bound_stay_apart() -> None:
    """Two loops over x that share no work stay apart when together they are over
    `max_instructions`: the distinct count is their sum."""
    module, comp = new_module("apart")
    x, y = parameters(comp, X, X)
    a = comp.create("exponential", [comp.create("add", [x, y])])
    b = comp.create("multiply", [comp.create("negate", [x]), x])
    comp.root = comp.create("tuple", [a, b])
    _run(module, changed=False, pass_=MultiOutputFusion(max_instructions=3))
