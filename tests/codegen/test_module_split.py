"""Parallel LLVM optimization (`codegen/cpu/module_split.py`, `engine.optimize_parts`):
how a module is cut, that every part is a valid module, and that an executable
optimized in parts on several threads computes what the whole module computes, bit
for bit, and what the NumPy evaluator computes."""

from __future__ import annotations

from typing import Any

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu import engine, module_split, parallel
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

F32 = ir.FloatType()
PTR = ir.PointerType()
VOID = ir.VoidType()


def _kernel_module(launched: int = 3) -> ir.Module:
    """entry → two launches that hand a task's address to `run_parallel`, and a serial
    kernel calling its range function; tasks call their range functions; every
    kernel reads one internal constant. `entry` calls the first `launched` launches."""
    module = ir.Module(name="kernels")
    constant = ir.GlobalVariable(module, F32, name="constant.0")
    constant.global_constant = True
    constant.linkage = "internal"
    constant.initializer = F32(2.0)
    run_parallel = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR]), name="run_parallel")

    def function(name: str, body) -> ir.Function:
        fn = ir.Function(module, ir.FunctionType(VOID, [PTR]), name=name)
        fn.linkage = "internal"
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        body(builder, fn.args[0])
        builder.ret_void()
        return fn

    def scale(builder: ir.IRBuilder, pointer: ir.Value) -> None:
        value = builder.load(pointer, typ=F32)
        builder.store(builder.fmul(value, builder.load(constant, typ=F32)), pointer)

    launches = []
    for n in range(2):
        range_function = function(f"kernel.{n}", scale)
        task = function(f"kernel.{n}.task",
                        lambda b, p, f=range_function: b.call(f, [p]))
        launches.append(function(f"kernel.{n}.launch",
                                 lambda b, p, t=task: b.call(run_parallel, [t, p])))
    serial = function("kernel.2", scale)
    launches.append(function("kernel.2.launch", lambda b, p: b.call(serial, [p])))
    entry = ir.Function(module, ir.FunctionType(VOID, [PTR]), name="entry")
    builder = ir.IRBuilder(entry.append_basic_block("entry"))
    for launch in launches[:launched]:
        builder.call(launch, [entry.args[0]])
    builder.ret_void()
    return module


def _defined(text: str) -> dict[str, str]:
    """Defined function name → its linkage, from parsed IR."""
    parsed = llvm.parse_assembly(text)
    parsed.verify()
    return {f.name: f.linkage.name for f in parsed.functions if not f.is_declaration}


def test_whole_text_is_the_printed_module() -> None:
    module = _kernel_module()
    split = module_split.split_module(module, "entry", parts=2)
    assert split.text == str(module)


def test_tasks_and_what_they_reach_are_cut_from_entry() -> None:
    module = _kernel_module()
    split = module_split.split_module(module, "entry", parts=3)
    assert len(split.parts) == 3
    defined = [_defined(part) for part in split.parts]
    names = [name for part in defined for name in part]
    assert sorted(names) == sorted(f.name for f in module.functions if not f.is_declaration)
    by_name = {name: (n, linkage) for n, part in enumerate(defined)
               for name, linkage in part.items()}
    # A task stays with its range function; entry keeps the launches and the serial
    # kernel (LLVM inlines those into it, as it does in the whole module).
    for n in range(2):
        assert by_name[f"kernel.{n}.task"][0] == by_name[f"kernel.{n}"][0]
        assert by_name[f"kernel.{n}.task"][0] != by_name["entry"][0]
        assert by_name[f"kernel.{n}.task"][1] == "external"  # a launch calls it
        assert by_name[f"kernel.{n}"][1] == "internal"
    for name in ("kernel.0.launch", "kernel.1.launch", "kernel.2.launch", "kernel.2"):
        assert by_name[name] == (by_name["entry"][0], "internal")
    # Every part that reads the constant has its own copy.
    assert all('@"constant.0" = internal' in part for part in split.parts)


@pytest.mark.parametrize("parts, min_bytes", [(1, 0), (2, 1 << 30)])
def test_small_or_single_threaded_modules_stay_whole(parts: int, min_bytes: int) -> None:
    module = _kernel_module()
    split = module_split.split_module(module, "entry", parts, min_bytes)
    assert split.parts == [split.text]


def test_a_module_one_part_would_hold_stays_whole() -> None:
    module = _kernel_module()
    # A long serial kernel: entry's unit becomes most of the module.
    serial = module.get_global("kernel.2")
    builder = ir.IRBuilder(serial.blocks[0])
    builder.position_before(serial.blocks[0].instructions[-1])
    for _ in range(400):
        builder.store(builder.fadd(builder.load(serial.args[0], typ=F32), F32(1.0)),
                      serial.args[0])
    split = module_split.split_module(module, "entry", parts=3)
    assert split.parts == [split.text] and split.exported == frozenset()


def test_a_module_with_a_mutable_global_stays_whole() -> None:
    module = _kernel_module()
    ir.GlobalVariable(module, F32, name="state").initializer = F32(0.0)
    split = module_split.split_module(module, "entry", parts=2)
    assert split.parts == [split.text]


def test_parts_optimize_and_link_into_one_module() -> None:
    module = _kernel_module()
    split = module_split.split_module(module, "entry", parts=3)
    assert split.exported == {"kernel.0.task", "kernel.1.task"}
    linked = engine.optimize_parts(split.parts, split.exported)
    linked.verify()
    linkage = {f.name: f.linkage.name for f in linked.functions if not f.is_declaration}
    # Internal again once linked, as in the whole module.
    assert linkage["kernel.0.task"] == linkage["kernel.1.task"] == "internal"
    assert linkage["entry"] == "external"


def test_a_task_nobody_launches_is_dropped_after_linking() -> None:
    # The part holding kernel.1's task cannot know that no launch of it is left; the
    # whole module would have dropped it, and so does the link.
    module = _kernel_module(launched=1)
    split = module_split.split_module(module, "entry", parts=2)
    assert len(split.parts) == 2
    linked = engine.optimize_parts(split.parts, split.exported)
    functions = {f.name for f in linked.functions if not f.is_declaration}
    assert "kernel.0.task" in functions and "kernel.1.task" not in functions
    whole = engine.optimize_parts([split.text])
    assert functions == {f.name for f in whole.functions if not f.is_declaration}


_HLO = """
HloModule split_compile

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[512,256]{1,0} parameter(0)
  w = f32[256,256]{1,0} parameter(1)
  e = f32[512,256]{1,0} exponential(x)
  zero = f32[] constant(0)
  sums = f32[512]{0} reduce(e, zero), dimensions={1}, to_apply=add
  spread = f32[512,256]{1,0} broadcast(sums), dimensions={0}
  soft = f32[512,256]{1,0} divide(e, spread)
  d = f32[512,256]{1,0} dot(soft, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[256,512]{1,0} transpose(d), dimensions={1,0}
  th = f32[256,512]{1,0} tanh(t)
  columns = f32[256]{0} reduce(x, zero), dimensions={0}, to_apply=add
  ROOT r = (f32[256,512]{1,0}, f32[512]{0}, f32[256]{0}) tuple(th, sums, columns)
}
"""


@pytest.mark.skipif(not parallel.openmp_available(), reason="no libgomp: no parallel kernels")
def test_an_executable_optimized_in_parts_computes_the_same_bits(monkeypatch) -> None:
    rng = np.random.default_rng(5)
    args = [rng.standard_normal((512, 256), dtype=np.float32),
            rng.standard_normal((256, 256), dtype=np.float32) / 16]
    whole = compile_module(parse_module(_HLO), threads=2, cache=False)

    part_counts = []
    optimize_parts = engine.optimize_parts

    def counting(texts: list[str], *rest: Any) -> llvm.ModuleRef:
        part_counts.append(len(texts))
        return optimize_parts(texts, *rest)

    monkeypatch.setattr(engine, "PARALLEL_IR_BYTES", 0)
    monkeypatch.setattr(engine, "optimizer_threads", lambda: 3)
    monkeypatch.setattr(engine, "optimize_parts", counting)
    cut = compile_module(parse_module(_HLO), threads=2, cache=False)
    assert part_counts and part_counts[0] > 1
    assert cut.llvm_ir == whole.llvm_ir  # the same emitted module, only optimized in parts
    expected = evaluate(parse_module(_HLO), *args)
    for got, same, reference in zip(cut(*args), whole(*args), expected):
        np.testing.assert_array_equal(got, same)
        assert_close(got, np.asarray(reference), "model gradient")
