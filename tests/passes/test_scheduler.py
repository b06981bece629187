"""The memory scheduler: a value computed early and read last moves next to its reader
when that shrinks the arena; an order that is already best stays as it is."""

from __future__ import annotations

import numpy as np
from hlo_builders import new_module, parameters
from hypothesis import given, settings
from hypothesis import strategies as st
from test_random_graphs import random_modules

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.printer import module_to_text
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes import assign_buffers, optimize
from tfxla_lite.passes.scheduler import SCHEDULERS, MemoryScheduler, is_topological, schedule

F32 = Shape("f32", (256,))  # 1 KiB


def _early_exponential() -> HloModule:
    """exp(x) computed first but read last, after a chain of three reverses (which never
    run in place): it is live across the chain."""
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    e = comp.create("exponential", [x])
    a = comp.create("reverse", [x], dimensions=(0,))
    b = comp.create("reverse", [a], dimensions=(0,))
    c = comp.create("reverse", [b], dimensions=(0,))
    out = comp.create("add", [c, e])
    comp.root = comp.create("tuple", [out])
    comp.instructions[:] = [x, e, a, b, c, out, comp.root]
    return module


def _names(module: HloModule) -> list[str]:
    return [inst.name for inst in module.entry.instructions]


def test_a_value_computed_early_moves_next_to_its_reader() -> None:
    module = _early_exponential()
    before = assign_buffers(module)
    assert before.temp_bytes == 2048  # exp lives across the chain
    assert MemoryScheduler().run(module)
    verify(module)
    assert _names(module) == ["param_0", "reverse", "reverse.1", "reverse.2", "exponential",
                              "add", "tuple"]
    after = assign_buffers(module)
    assert after.temp_bytes == 1024
    assert after.live_ranges["exponential"] == (4, 5)
    assert not MemoryScheduler().run(module)  # a fixed point


def test_schedule_returns_the_plan_of_the_order_it_keeps() -> None:
    # Multi-output fusion weighs merges by this plan instead of assigning buffers again.
    for ordered in (False, True):
        module = _early_exponential()
        if ordered:  # already best: kept, and its plan still returned
            module.entry.instructions[:] = SCHEDULERS["dfs"](module.entry)
        plan = schedule(module)
        assert plan is not None and plan.temp_bytes == 1024
        again = assign_buffers(module)
        assert plan.to_text() == again.to_text()
        assert plan.live_ranges == again.live_ranges


def test_candidates_are_topological_permutations() -> None:
    module = _early_exponential()
    entry = module.entry
    for name, make in SCHEDULERS.items():
        order = make(entry)
        assert sorted(map(id, order)) == sorted(map(id, entry.instructions)), name
        assert is_topological(order), name
        assert order[-1] is entry.root, name
    # Ties in the list scheduler keep the current order: exp and the first reverse
    # both define 1 KiB and free nothing.
    assert [i.name for i in SCHEDULERS["list"](entry)][:3] == ["param_0", "exponential",
                                                               "reverse"]


def test_an_order_that_is_already_best_is_kept() -> None:
    module = _early_exponential()
    entry = module.entry
    entry.instructions[:] = SCHEDULERS["dfs"](entry)
    text = module_to_text(module)
    assert not MemoryScheduler().run(module)
    assert module_to_text(module) == text


@settings(max_examples=100, deadline=None)
@given(random_modules(), st.integers(0, 2**16))
def test_scheduling_keeps_results_and_never_grows_the_arena(module: HloModule,
                                                            seed: int) -> None:
    optimize(module, "simplify,dce,fuse,dce,add-output-copies")
    rng = np.random.default_rng(seed)
    args = [rng.normal(size=p.shape.dims).astype(np.float32)
            for p in module.entry.parameters]
    expected = evaluate(module, *args)
    arena = assign_buffers(module).temp_bytes
    changed = MemoryScheduler().run(module)
    verify(module)
    assert is_topological(module.entry.instructions)
    after = assign_buffers(module).temp_bytes
    assert after < arena if changed else after == arena
    got = evaluate(module, *args)
    for a, b in zip(got if isinstance(got, tuple) else (got,),
                    expected if isinstance(expected, tuple) else (expected,), strict=True):
        np.testing.assert_array_equal(a, b)


def test_instructions_the_root_does_not_reach_stay_before_the_root() -> None:
    module = _early_exponential()
    entry = module.entry
    dead = entry.create("negate", [entry.parameters[0]])  # no user: dce would drop it
    for name, make in SCHEDULERS.items():
        order = make(entry)
        assert is_topological(order) and order[-1] is entry.root, name
        assert dead in order, name
    assert MemoryScheduler().run(module)
    verify(module)
    assert module.entry.instructions[-1] is entry.root
