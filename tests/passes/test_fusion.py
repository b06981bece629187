"""Fusion: kernel counts, golden text, numerics before and after, verifier."""

from __future__ import annotations

import numpy as np
from hlo_builders import (
    check_lines,
    count,
    flatten,
    new_module,
    parameters,
    random_arguments,
    reduce,
    reduce_sum_x_plus_y_times_z,
)

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.executable import Executable
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.fusion import Fusion

F32 = Shape("f32", (4, 8))
MATRIX = Shape("f32", (8, 8))
TOP_LEVEL = {"parameter", "constant", "fusion", "dot", "tuple", "get-tuple-element"}


def _fuse_and_check(module: HloModule, changed: bool = True) -> None:
    """Run fusion; the result verifies and computes what the input did."""
    verify(module)
    args = random_arguments(module)
    before = evaluate(module, *args)
    assert Fusion().run(module) is changed
    verify(module)
    for after, expected in zip(flatten(evaluate(module, *args)), flatten(before), strict=True):
        np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-5)


def _opcodes_in_fusions(module: HloModule, opcode: str) -> int:
    return sum(count(c, opcode) for c in module.computations if c.is_fusion_computation)


def test_reduce_sum_of_x_plus_y_times_z_is_one_kernel() -> None:
    module = reduce_sum_x_plus_y_times_z()
    _fuse_and_check(module)
    entry = module.entry
    assert count(entry, "fusion") == 1
    assert {i.opcode for i in entry.instructions} == {"parameter", "fusion"}
    fusion = entry.root
    assert fusion.attributes["kind"] == "kInput"
    assert fusion.fused_computation.is_fusion_computation
    check_lines(module.to_text(),
                r"^%fused_computation \(param_0.1: f32\[4,8\], param_1.1: f32\[4,8\], "
                r"param_2.1: f32\[4,8\]\) -> f32\[\] \{",
                r"%multiply.1 = f32\[4,8\]\{1,0\} multiply\(.* %param_1.1, .* %param_2.1\)",
                r"%add.2 = f32\[4,8\]\{1,0\} add\(.* %param_0.1, .* %multiply.1\)",
                r"%constant.1 = f32\[\] constant\(0\)",
                r"ROOT %reduce.1 = f32\[\] reduce\(.* %add.2, .* %constant.1\), "
                r"dimensions=\{0,1\}, to_apply=%add_f32",
                r"^ENTRY %main",
                r"ROOT %add_reduce_fusion = f32\[\] fusion\(f32\[4,8\]\{1,0\} %param_0, "
                r"f32\[4,8\]\{1,0\} %param_1, f32\[4,8\]\{1,0\} %param_2\), kind=kInput, "
                r"calls=%fused_computation$")
    assert Fusion().run(module) is False  # nothing left to fuse


def test_elementwise_chain_with_broadcast_scalar_is_one_loop_fusion() -> None:
    module, comp = new_module()
    x, y = parameters(comp, F32, Shape("f32", (8,)))
    half = comp.create("broadcast", [comp.add_constant(0.5, "f32")], shape=F32, dimensions=())
    row = comp.create("broadcast", [y], shape=F32, dimensions=(1,))
    scaled = comp.create("multiply", [comp.create("tanh", [x]), half])
    shifted = comp.create("add", [scaled, row])
    comp.root = comp.create("convert", [comp.create("transpose", [shifted], dimensions=(1, 0))],
                            element_type="f64")
    _fuse_and_check(module)
    assert count(module.entry, "fusion") == 1
    assert module.entry.root.attributes["kind"] == "kLoop"
    assert module.entry.root.name == "transpose_convert_fusion"
    assert count(module.entry, "constant") == 0  # the scalar went into the kernel


def test_dot_is_not_fused_and_splits_kernels() -> None:
    module, comp = new_module()
    x, y, w = parameters(comp, MATRIX, MATRIX, MATRIX)
    product = comp.create("dot", [comp.create("subtract", [comp.create("add", [x, y]), w]), w],
                          lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("exponential", [comp.create("negate", [product])])
    _fuse_and_check(module)
    entry = module.entry
    assert count(entry, "dot") == 1
    assert count(entry, "fusion") == 2  # subtract(add) before the dot, exp(negate) after
    assert {i.opcode for i in entry.instructions} <= TOP_LEVEL


def test_expensive_producer_is_not_duplicated() -> None:
    module, comp = new_module()
    x, w = parameters(comp, MATRIX, MATRIX)
    e = comp.create("exponential", [x])
    left = comp.create("dot", [comp.create("add", [e, comp.create("negate", [x])]), w],
                       lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    right = comp.create("dot", [comp.create("multiply", [e, comp.create("abs", [x])]), w],
                        lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("tuple", [left, right])
    _fuse_and_check(module)
    total = _opcodes_in_fusions(module, "exponential") + count(module.entry, "exponential")
    assert total == 1


def test_expensive_producer_used_only_inside_one_fusion_is_fused() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    e = comp.create("exponential", [x])
    comp.root = comp.create("add", [comp.create("negate", [e]), e])
    _fuse_and_check(module)
    assert count(module.entry, "fusion") == 1
    assert _opcodes_in_fusions(module, "exponential") == 1


def test_expensive_producer_behind_a_duplicated_member_stays_single() -> None:
    # negate is also read by a dot; were it duplicated into the add's fusion, exp below
    # it would run twice, so exp must not follow it in.
    module, comp = new_module()
    x, w = parameters(comp, MATRIX, MATRIX)
    n = comp.create("negate", [comp.create("exponential", [x])])
    product = comp.create("dot", [n, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("add", [n, product])
    _fuse_and_check(module)
    total = _opcodes_in_fusions(module, "exponential") + count(module.entry, "exponential")
    assert total == 1
    # A copy of negate in the add's kernel would read exp's full-size buffer, as many
    # bytes as negate's own: one kernel computes exp and negate, read by the dot and the
    # add.
    assert _opcodes_in_fusions(module, "negate") + count(module.entry, "negate") == 1


def test_cheap_producer_is_duplicated_into_each_consumer() -> None:
    module, comp = new_module()
    x, w = parameters(comp, MATRIX, MATRIX)
    n = comp.create("negate", [x])
    a = comp.create("dot", [comp.create("add", [n, w]), w],
                    lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    b = comp.create("dot", [comp.create("multiply", [n, w]), w],
                    lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("tuple", [a, b])
    _fuse_and_check(module)
    assert count(module.entry, "fusion") == 2
    assert count(module.entry, "negate") == 0
    assert _opcodes_in_fusions(module, "negate") == 2


def test_reduce_is_a_fusion_root_never_a_fused_producer() -> None:
    # softmax-like: exp(x - max(x)) / sum(...): reductions end kernels.
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    peak = reduce(comp, x, (1,), "maximum", -np.inf)
    shifted = comp.create("subtract", [x, comp.create("broadcast", [peak], shape=F32,
                                                      dimensions=(0,))])
    e = comp.create("exponential", [shifted])
    total = reduce(comp, e, (1,))
    comp.root = comp.create("divide", [e, comp.create("broadcast", [total], shape=F32,
                                                      dimensions=(0,))])
    _fuse_and_check(module)
    entry = module.entry
    kinds = sorted(i.attributes["kind"] for i in entry.instructions if i.opcode == "fusion")
    # max-reduce, subtract+exp, sum-reduce, divide: the reductions end kernels, and exp,
    # read by two kernels, ends one too.
    assert kinds == ["kInput", "kInput", "kLoop", "kLoop"]
    assert {i.opcode for i in entry.instructions} <= TOP_LEVEL
    assert [c.name for c in module.computations if c.is_fusion_computation] == [
        "fused_computation", "fused_computation.1", "fused_computation.2",
        "fused_computation.3"]
    # exp is expensive and read by both kernels: computed once, in the entry or a fusion.
    total_exp = _opcodes_in_fusions(module, "exponential") + count(entry, "exponential")
    assert total_exp == 1


def test_fusion_without_inputs_keeps_topological_order() -> None:
    module, comp = new_module()
    (w,) = parameters(comp, MATRIX)
    ones = comp.create("broadcast", [comp.add_constant(1.0, "f32")], shape=MATRIX, dimensions=())
    comp.root = comp.create("dot", [comp.create("negate", [ones]), w],
                            lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    _fuse_and_check(module)
    fusion = next(i for i in module.entry.instructions if i.opcode == "fusion")
    assert fusion.operands == ()


def test_metadata_of_the_root_is_kept() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = comp.create("negate", [comp.create("abs", [x])],
                            metadata={"op_type": "Neg", "op_name": "model/neg"})
    _fuse_and_check(module)
    assert module.entry.root.metadata == {"op_type": "Neg", "op_name": "model/neg"}
    assert 'metadata={op_type="Neg" op_name="model/neg"}' in module.to_text()


def test_nothing_to_fuse() -> None:
    module, comp = new_module()
    x, w = parameters(comp, MATRIX, MATRIX)
    comp.root = comp.create("dot", [x, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    _fuse_and_check(module, changed=False)


# -- the cost model: one test per rule ------------------------------------------------------

def _exp_of_vector_into(comp: Computation, target: Shape, vector: Instruction,
                        opcode: str = "exponential") -> Instruction:
    """broadcast(opcode(vector)) along the last dimension of `target`."""
    value = comp.create(opcode, [vector])
    return comp.create("broadcast", [value], shape=target, dimensions=(target.rank - 1,))


def test_expensive_producer_is_not_recomputed_through_an_expanding_broadcast() -> None:
    # exp of a row vector read by every row: fused, it would run 4 times per element.
    module, comp = new_module()
    x, v = parameters(comp, F32, Shape("f32", (8,)))
    comp.root = comp.create("add", [x, _exp_of_vector_into(comp, F32, v)])
    _fuse_and_check(module)
    assert count(module.entry, "exponential") == 1  # a kernel of its own, over 8 elements
    assert _opcodes_in_fusions(module, "exponential") == 0
    assert _opcodes_in_fusions(module, "broadcast") == 1


def test_expensive_producer_through_a_broadcast_that_does_not_expand_is_fused() -> None:
    module, comp = new_module()
    x, v = parameters(comp, Shape("f32", (1, 8)), Shape("f32", (8,)))
    comp.root = comp.create("add", [x, _exp_of_vector_into(comp, Shape("f32", (1, 8)), v)])
    _fuse_and_check(module)
    assert count(module.entry, "fusion") == 1
    assert _opcodes_in_fusions(module, "exponential") == 1


def test_cheap_producer_is_recomputed_when_that_costs_less_than_its_buffer() -> None:
    # negate(bias) broadcast over 64 rows: 63 extra negates per element of an
    # 8-element vector cost less than the vector's own kernel.
    module, comp = new_module()
    rows = Shape("f32", (64, 8))
    x, v = parameters(comp, rows, Shape("f32", (8,)))
    comp.root = comp.create("add", [x, _exp_of_vector_into(comp, rows, v, "negate")])
    _fuse_and_check(module)
    assert count(module.entry, "fusion") == 1
    assert _opcodes_in_fusions(module, "negate") == 1


def test_cheap_producer_is_not_recomputed_when_its_buffer_is_cheaper() -> None:
    # negate over 2048 elements, each recomputed for 64 rows: 129K negates against a
    # 16 KiB round trip and a kernel launch; it gets a kernel of its own.
    module, comp = new_module()
    rows = Shape("f32", (64, 2048))
    x, v = parameters(comp, rows, Shape("f32", (2048,)))
    comp.root = comp.create("add", [x, _exp_of_vector_into(comp, rows, v, "negate")])
    _fuse_and_check(module)
    assert count(module.entry, "negate") == 1
    assert _opcodes_in_fusions(module, "negate") == 0


def test_duplicating_a_cheap_producer_counts_only_the_read_it_saves() -> None:
    # negate(v) is also an output, so its buffer is written anyway: cloning it saves
    # only the read of 8 elements, less than recomputing it for 64 rows.
    module, comp = new_module()
    rows = Shape("f32", (64, 8))
    x, v = parameters(comp, rows, Shape("f32", (8,)))
    n = comp.create("negate", [v])
    added = comp.create("add", [x, comp.create("broadcast", [n], shape=rows, dimensions=(1,))])
    comp.root = comp.create("tuple", [added, n])
    _fuse_and_check(module)
    assert count(module.entry, "negate") == 1
    assert _opcodes_in_fusions(module, "negate") == 0


def test_expensive_producer_of_a_gather_is_not_recomputed() -> None:
    # An embedding lookup of exp(table): 6 rows gathered from 3, so rows repeat.
    module, comp = new_module()
    table, indices = parameters(comp, Shape("f32", (3, 4)), Shape("s32", (6,)))
    looked_up = comp.create("gather", [comp.create("exponential", [table]), indices],
                            offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,),
                            index_vector_dim=1, slice_sizes=(1, 4))
    comp.root = comp.create("negate", [looked_up])
    verify(module)
    args = [np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32),
            np.array([0, 2, 2, 1, 0, 2], np.int32)]
    before = evaluate(module, *args)
    assert Fusion().run(module)
    verify(module)
    np.testing.assert_allclose(evaluate(module, *args), before, rtol=1e-6)
    assert count(module.entry, "exponential") == 1
    assert _opcodes_in_fusions(module, "gather") == 1


def test_reduction_and_dot_are_computed_once_for_several_consumers() -> None:
    module, comp = new_module()
    x, w = parameters(comp, MATRIX, MATRIX)
    total = reduce(comp, x, (1,))
    spread = comp.create("broadcast", [total], shape=MATRIX, dimensions=(0,))
    product = comp.create("dot", [x, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("tuple", [comp.create("add", [spread, product]),
                                      comp.create("multiply", [spread, product])])
    _fuse_and_check(module)
    everywhere = [c for c in module.computations if c.name not in ("add_f32",)]
    assert sum(count(c, "reduce") for c in everywhere) == 1
    assert sum(count(c, "dot") for c in everywhere) == 1


def test_element_reuse_of_each_consumer_kind() -> None:
    from tfxla_lite.hlo.attributes import Window
    from tfxla_lite.passes.fusion import element_reuse, should_fuse

    module, comp = new_module()
    x, v = parameters(comp, F32, Shape("f32", (8,)))
    expand = comp.create("broadcast", [v], shape=F32, dimensions=(1,))
    bounds = comp.add_constant(1.0, "f32")
    clamp = comp.create("clamp", [bounds, x, bounds])
    reducer = module.reduction_computation("add", "f32")
    overlapping = comp.create("reduce-window", [x, comp.add_constant(0.0, "f32")],
                              window=Window.of((1, 3)), called_computations=[reducer])
    tiled = comp.create("reduce-window", [x, comp.add_constant(0.0, "f32")],
                        window=Window.of((1, 2), (1, 2)), called_computations=[reducer])
    transposed = comp.create("transpose", [x], dimensions=(1, 0))
    comp.root = comp.create("tuple", [expand, clamp, overlapping, tiled, transposed])
    assert element_reuse(expand, 0) == 4
    assert element_reuse(clamp, 0) == 32 and element_reuse(clamp, 1) == 1
    assert element_reuse(overlapping, 0) == 3 and element_reuse(tiled, 0) == 1
    assert element_reuse(transposed, 0) == 1
    e = comp.create("exponential", [x])
    assert should_fuse(e, 1, exclusive=True)
    assert not should_fuse(e, 1, exclusive=False)  # would be computed twice
    assert not should_fuse(e, element_reuse(overlapping, 0), exclusive=True)
    n = comp.create("negate", [x])
    # Duplicated where its buffer is written anyway, a copy would read x's 128 bytes to
    # save the read of negate's 128: no gain. Where every consumer copies it, 32 negates
    # and a read of x beat a kernel of its own, its write and the reads of it.
    assert not should_fuse(n, 1, exclusive=False)
    assert should_fuse(n, 1, exclusive=False, buffer_written=False)
    assert should_fuse(comp.create("transpose", [x], dimensions=(1, 0)), 1000, exclusive=False)


# -- slices, concatenates and iotas (XLA's kLoop list), variadic reduces (argmax) ----------

def _compiled_matches_evaluator(module: HloModule) -> Executable:
    """Compile a copy of `module` under the default pipeline (verifier on) and check its
    results against the evaluator's on `module` itself."""
    args = random_arguments(module)
    expected = flatten(evaluate(module, *args))
    executable = compile_module(parse_module(module.to_text()), verify=True, cache=False)
    got = executable(*args)  # a tuple of the outputs
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return executable


def _concat_slice() -> HloModule:
    """exp(x ++ -y)[:, 1:7:2], TF's concat then strided slice."""
    module, comp = new_module()
    x, y = parameters(comp, Shape("f32", (3, 4)), Shape("f32", (3, 5)))
    joined = comp.create("concatenate", [x, comp.create("negate", [y])], dimensions=(1,))
    picked = comp.create("slice", [joined], slice=((0, 3, 1), (1, 7, 2)))
    comp.root = comp.create("exponential", [picked])
    return module


def test_slice_of_a_concatenate_is_one_loop_fusion() -> None:
    module = _concat_slice()
    _fuse_and_check(module)
    entry = module.entry
    assert {i.opcode for i in entry.instructions} == {"parameter", "fusion"}
    assert entry.root.attributes["kind"] == "kLoop"
    check_lines(module.to_text(),
                r"^%fused_computation \(param_0.1: f32\[3,4\], param_1.1: f32\[3,5\]\) "
                r"-> f32\[3,3\] \{",
                r"%negate.1 = f32\[3,5\]\{1,0\} negate\(.* %param_1.1\)",
                r"%concatenate.1 = f32\[3,9\]\{1,0\} concatenate\(.* %param_0.1, .* "
                r"%negate.1\), dimensions=\{1\}",
                r"%slice.1 = f32\[3,3\]\{1,0\} slice\(.* %concatenate.1\), "
                r"slice=\{\[0:3\], \[1:7:2\]\}",
                r"ROOT %exponential.1 = f32\[3,3\]\{1,0\} exponential\(.* %slice.1\)",
                r"^ENTRY %main",
                r"ROOT %slice_exponential_fusion = f32\[3,3\]\{1,0\} fusion\(f32\[3,4\]\{1,0\} "
                r"%param_0, f32\[3,5\]\{1,0\} %param_1\), kind=kLoop, calls=%fused_computation$")
    # Neither the concatenate nor the slice is stored: one kernel, no temp arena.
    executable = _compiled_matches_evaluator(_concat_slice())
    assert executable.kernel_count == 1
    assert executable.temp_bytes == 0


def test_expensive_producer_of_two_slices_is_computed_once() -> None:
    # exp(x) is read by two slices in different kernels: cloned, it would run twice.
    module, comp = new_module()
    (x,) = parameters(comp, MATRIX)
    e = comp.create("exponential", [x])
    top = comp.create("slice", [e], slice=((0, 4, 1), (0, 8, 1)))
    bottom = comp.create("slice", [e], slice=((4, 8, 1), (0, 8, 1)))
    w = comp.create("dot", [comp.create("negate", [bottom]), x],
                    lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("tuple", [comp.create("abs", [top]), w])
    _fuse_and_check(module)
    assert _opcodes_in_fusions(module, "exponential") + count(module.entry, "exponential") == 1
    assert count(module.entry, "slice") == 0  # both went into their consumers' kernels


def _argmax_of_abs(shape: Shape) -> HloModule:
    """argmax(|x|, axis=1) as TF's XLA lowers it: a variadic reduce of (values, iota)."""
    module, comp = new_module()
    (x,) = parameters(comp, shape)
    minmax = module.new_computation("minmax")
    a, i, b, j = (minmax.add_parameter(n, Shape(t, ())) for n, t in
                  enumerate(("f32", "s32", "f32", "s32")))
    ge = minmax.create("compare", [a, b], direction="GE")
    minmax.root = minmax.create("tuple", [minmax.create("select", [ge, a, b]),
                                          minmax.create("select", [ge, i, j])])
    iota = comp.create("iota", shape=Shape("s32", shape.dims), iota_dimension=1)
    result = comp.create("reduce", [comp.create("abs", [x]), iota,
                                    comp.add_constant(-np.inf, "f32"), comp.add_constant(0, "s32")],
                         dimensions=(1,), called_computations=[minmax])
    comp.root = comp.create("get-tuple-element", [result], index=1)
    return module


def test_variadic_reduce_is_a_fusion_root_and_takes_its_iota() -> None:
    module = _argmax_of_abs(Shape("f32", (16, 40)))
    _fuse_and_check(module)
    entry = module.entry
    assert [i.opcode for i in entry.instructions] == ["parameter", "fusion", "get-tuple-element"]
    fusion = entry.root.operand(0)
    assert fusion.attributes["kind"] == "kInput"
    check_lines(module.to_text(),
                r"^%fused_computation \(param_0.2: f32\[16,40\]\) -> \(f32\[16\], s32\[16\]\) \{",
                r"%abs.1 = f32\[16,40\]\{1,0\} abs\(.* %param_0.2\)",
                r"%iota.1 = s32\[16,40\]\{1,0\} iota\(\), iota_dimension=1",
                r"ROOT %reduce.1 = \(f32\[16\]\{0\}, s32\[16\]\{0\}\) reduce\(.* %abs.1, .* "
                r"%iota.1, .*\), dimensions=\{1\}, to_apply=%minmax",
                r"^ENTRY %main",
                r"%abs_reduce_fusion = \(f32\[16\]\{0\}, s32\[16\]\{0\}\) fusion\("
                r"f32\[16,40\]\{1,0\} %param_0\), kind=kInput, calls=%fused_computation",
                r"ROOT %get-tuple-element = s32\[16\]\{0\} get-tuple-element\(.*\), index=1")
    # The indices are never stored: the arena holds only the maxima nobody reads.
    executable = _compiled_matches_evaluator(_argmax_of_abs(Shape("f32", (16, 40))))
    assert executable.kernel_count == 1
    assert executable.temp_bytes == 16 * 4
