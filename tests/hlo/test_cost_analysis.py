"""Cost analysis: XLA's definitions of flops, transcendentals and bytes accessed."""

from __future__ import annotations

from hlo_builders import check_lines, new_module, parameters, reduce, reduce_sum_x_plus_y_times_z

from tfxla_lite.hlo.cost_analysis import Cost, analyze, instruction_cost
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes.fusion import Fusion

F = Shape("f32", (4, 8))  # 32 elements, 128 bytes


def test_elementwise_flops_and_transcendentals() -> None:
    module, comp = new_module()
    x, y = parameters(comp, F, F)
    product = comp.create("multiply", [x, y])
    exp = comp.create("exponential", [product])
    erf = comp.create("erf", [exp])
    ratio = comp.create("divide", [erf, x])
    comp.root = ratio
    assert instruction_cost(product) == Cost(flops=32, bytes_accessed=3 * 128)
    assert instruction_cost(exp) == Cost(transcendentals=32, bytes_accessed=2 * 128)
    assert instruction_cost(erf).transcendentals == 32
    assert instruction_cost(ratio) == Cost(flops=32, bytes_accessed=3 * 128)
    assert instruction_cost(x) == Cost()  # parameters touch nothing themselves
    total = analyze(module).total
    assert (total.flops, total.transcendentals) == (64, 64)


def test_dot_counts_two_flops_per_multiply_add() -> None:
    module, comp = new_module()
    a, b = parameters(comp, Shape("f32", (2, 3, 5)), Shape("f32", (2, 5, 7)))
    comp.root = comp.create("dot", [a, b], lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                            lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))
    cost = instruction_cost(comp.root)
    assert cost.flops == 2 * (2 * 3 * 7) * 5
    assert cost.bytes_accessed == 4 * (30 + 70 + 42)


def test_reduce_applies_its_computation_inputs_minus_outputs_times() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F)
    comp.root = reduce(comp, x, (1,), "maximum")
    cost = instruction_cost(comp.root)
    assert cost.flops == 32 - 4
    assert cost.bytes_accessed == 128 + 4 + 16


def test_data_movement_slices_bitcasts_and_tuples() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F)
    t = comp.create("transpose", [x], dimensions=(1, 0))
    s = comp.create("slice", [x], slice=((0, 2, 1), (0, 8, 1)))
    b = comp.create("bitcast", [x], shape=Shape("f32", (32,)))
    comp.root = comp.create("tuple", [t, s, b])
    assert instruction_cost(t) == Cost(bytes_accessed=256)
    assert instruction_cost(s) == Cost(bytes_accessed=2 * 64)
    assert instruction_cost(b) == Cost()
    assert instruction_cost(comp.root) == Cost(bytes_accessed=3 * 8)


def test_fusion_counts_its_boundary_bytes_and_its_inside_flops() -> None:
    module = reduce_sum_x_plus_y_times_z(F)
    before = analyze(module)
    assert before.flops == 32 + 32 + 31
    assert before.bytes_accessed == 3 * 128 + 3 * 128 + (128 + 4 + 4)
    Fusion().run(module)
    after = analyze(module)
    assert after.flops == before.flops and after.transcendentals == 0
    assert after.bytes_accessed == 3 * 128 + 4  # read x, y, z once, write the sum
    text = after.to_text()
    check_lines(text, r"^CostAnalysis of reduce_sum:",
                r"instruction\s+flops\s+transcendentals\s+bytes",
                r"%add_reduce_fusion\s+95\s+0\s+388",
                r"total\s+95\s+0\s+388")


def test_opcode_facts_come_from_one_table() -> None:
    """Transcendental and expensive are each opcode's registration, read by cost analysis
    and fusion alike; an expensive elementwise op is a transcendental, divide or remainder
    (XLA's IsExpensive)."""
    from tfxla_lite.hlo.opcodes import (
        OPCODES,
        is_elementwise,
        is_expensive,
        is_transcendental,
    )

    transcendental = {name for name, info in OPCODES.items() if info.transcendental}
    assert transcendental == {  # XLA's HloCostAnalysis
        "exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic",
        "sqrt", "rsqrt", "cbrt", "erf", "sine", "cosine", "tan", "power", "atan2"}
    expensive = {name for name in OPCODES if is_expensive(name) and is_elementwise(name)}
    assert expensive == transcendental | {"divide", "remainder"}
    assert is_expensive("dot") and is_expensive("convolution")
    for name in transcendental:
        module, comp = new_module()
        (x,) = parameters(comp, F)
        operands = [x] * OPCODES[name].arity
        comp.root = comp.create(name, operands)
        assert is_transcendental(name)
        assert instruction_cost(comp.root).transcendentals == 32, name
