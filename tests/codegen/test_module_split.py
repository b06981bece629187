"""Parallel LLVM optimization and code generation (`codegen/cpu/module_split.py`,
`engine.compile_parts`): how a module is cut, that every part is a valid module, that
the parts' objects hold the machine code of the whole module's, function for function,
and that an executable compiled in parts on several threads computes what the whole
module computes, bit for bit, and what the NumPy evaluator computes."""

from __future__ import annotations

import ctypes
import re
import struct
import sys
from typing import Any

import llvmlite.binding as llvm
import numpy as np
import pytest
from codegen_helpers import PARTS_HLO
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


def _tasks_and_a_long_serial_kernel(tasks: int, stores: int) -> ir.Module:
    """entry → `tasks` launches of parallel tasks, and one serial kernel of `stores`
    stores (inlined into entry's unit: straight-line code, cheap for LLVM per byte)."""
    module = ir.Module(name="uneven")
    run_parallel = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR]), name="run_parallel")
    entry = ir.Function(module, ir.FunctionType(VOID, [PTR]), name="entry")
    builder = ir.IRBuilder(entry.append_basic_block("entry"))
    for n in range(tasks):
        task = ir.Function(module, ir.FunctionType(VOID, [PTR]), name=f"kernel.{n}.task")
        task.linkage = "internal"
        body = ir.IRBuilder(task.append_basic_block("entry"))
        body.store(body.fmul(body.load(task.args[0], typ=F32), F32(float(n))), task.args[0])
        body.ret_void()
        builder.call(run_parallel, [task, entry.args[0]])
    for _ in range(stores):
        builder.store(builder.fadd(builder.load(entry.args[0], typ=F32), F32(1.0)),
                      entry.args[0])
    builder.ret_void()
    return module


def test_units_are_packed_by_size_plus_a_cost_per_unit(monkeypatch) -> None:
    """`entry`'s straight-line unit is larger than all tasks together, but each task's
    loops cost LLVM more per byte (`UNIT_BYTES`): the entry's part also takes tasks;
    packed by size alone it would hold none. Whether to cut is decided by size."""
    module = _tasks_and_a_long_serial_kernel(tasks=10, stores=25)
    entry_bytes = len(str(module.get_global("entry")))
    task_bytes = sum(len(str(f)) for f in module.functions if f.name.endswith(".task"))
    assert task_bytes < entry_bytes < 2.9 * task_bytes  # cut by size: entry < 75%

    def tasks_beside_entry() -> int:
        split = module_split.split_module(module, "entry", parts=2)
        assert len(split.parts) == 2
        (owner,) = [part for part in split.parts if 'define void @"entry"' in part]
        return len(re.findall(r'^define (?:internal )?void @"kernel\.\d+\.task"', owner, re.M))

    assert tasks_beside_entry() >= 2
    monkeypatch.setattr(module_split, "UNIT_BYTES", 0)
    assert tasks_beside_entry() == 0


@pytest.mark.parametrize("parts", [1, 3])
def test_functions_set_apart_get_the_last_part(parts: int) -> None:
    """`apart` (the quick tier's O3 functions): those functions alone in a last part,
    external there and declared where called; the rest cut as without it (or whole)."""
    module = _kernel_module()
    plain = module_split.split_module(module, "entry", parts)
    split = module_split.split_module(module, "entry", parts, apart=["kernel.2", "missing"])
    assert split.apart and not plain.apart
    assert len(split.parts) == len(plain.parts) + 1
    defined = [_defined(part) for part in split.parts]
    assert defined[-1] == {"kernel.2": "external"}
    assert all("kernel.2" not in part for part in defined[:-1])
    assert "kernel.2" in split.exported
    caller = next(part for part in split.parts[:-1] if 'define internal void @"kernel.2.launch"'
                  in part)
    assert 'declare void @"kernel.2"(ptr' in caller
    assert sorted(name for part in defined for name in part) == sorted(
        f.name for f in module.functions if not f.is_declaration)
    linked = engine.optimize_parts(split.parts, split.exported)
    linked.verify()
    assert linked.get_function("entry").linkage.name == "external"


def test_nothing_to_set_apart_or_a_mutable_global_changes_nothing() -> None:
    module = _kernel_module()
    assert module_split.split_module(module, "entry", 1, apart=["missing", "entry"]) == \
        module_split.split_module(module, "entry", 1)
    ir.GlobalVariable(module, F32, name="state").initializer = F32(0.0)
    split = module_split.split_module(module, "entry", 3, apart=["kernel.2"])
    assert split.parts == [split.text] and not split.apart


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




@pytest.mark.skipif(not parallel.openmp_available(), reason="no libgomp: no parallel kernels")
def test_an_executable_optimized_in_parts_computes_the_same_bits(monkeypatch) -> None:
    rng = np.random.default_rng(5)
    args = [rng.standard_normal((512, 256), dtype=np.float32),
            rng.standard_normal((256, 256), dtype=np.float32) / 16]
    whole = compile_module(parse_module(PARTS_HLO), threads=2, cache=False)

    part_counts = []
    compile_parts = engine.compile_parts

    def counting(texts: list[str], *rest: Any, **options: Any) -> engine.CompiledParts:
        part_counts.append(len(texts))
        return compile_parts(texts, *rest, **options)

    monkeypatch.setattr(engine, "PARALLEL_IR_BYTES", 0)
    monkeypatch.setattr(engine, "optimizer_threads", lambda: 3)
    monkeypatch.setattr(engine, "compile_parts", counting)
    cut = compile_module(parse_module(PARTS_HLO), threads=2, cache=False)
    assert part_counts and part_counts[0] > 1
    assert cut.llvm_ir == whole.llvm_ir  # the same emitted module, only optimized in parts
    # The parts' optimized IR, linked, is what the whole module's optimization gives.
    assert _function_names(cut.llvm_ir_optimized) == _function_names(whole.llvm_ir_optimized)
    expected = evaluate(parse_module(PARTS_HLO), *args)
    for got, same, reference in zip(cut(*args), whole(*args), expected):
        np.testing.assert_array_equal(got, same)
        assert_close(got, np.asarray(reference), "model gradient")


def _function_names(text: str) -> set[str]:
    parsed = llvm.parse_assembly(text)
    return {f.name for f in parsed.functions if not f.is_declaration}


def _function_code(object_code: bytes) -> dict[str, bytes]:
    """Each defined function's bytes in an ELF64 relocatable object, by name (x86-64's
    relocations keep their addends apart, so the bytes do not depend on where a callee
    or a constant lies)."""
    section_offset, = struct.unpack_from("<Q", object_code, 0x28)
    entry_size, count = struct.unpack_from("<HH", object_code, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", object_code, section_offset + i * entry_size)
               for i in range(count)]
    functions = {}
    for _, kind, _, _, offset, size, link, _, _, symbol_size in headers:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings = headers[link][4]
        for position in range(offset, offset + size, symbol_size):
            name, info, _, index, value, length = struct.unpack_from("<IBBHQQ", object_code,
                                                                      position)
            if info & 0xF == 2 and index != 0:  # a defined function
                start = headers[index][4] + value
                functions[object_code[strings + name:object_code.index(b"\0", strings + name)]
                          .decode()] = object_code[start:start + length]
    return functions


@pytest.mark.skipif(not parallel.openmp_available(), reason="no libgomp: no parallel kernels")
@pytest.mark.skipif(llvm.get_process_triple().split("-")[0] != "x86_64"
                    or sys.platform != "linux", reason="reads x86-64 ELF objects")
def test_the_parts_objects_hold_the_whole_modules_machine_code(monkeypatch) -> None:
    """Each part gets its own object on its own thread; every function's bytes are those
    of the object generated for the whole module."""
    compiled: list[tuple[list[str], engine.CompiledParts]] = []
    compile_parts = engine.compile_parts

    def keeping(texts: list[str], *rest: Any, **options: Any) -> engine.CompiledParts:
        compiled.append((texts, compile_parts(texts, *rest, **options)))
        return compiled[-1][1]

    monkeypatch.setattr(engine, "PARALLEL_IR_BYTES", 0)
    monkeypatch.setattr(engine, "optimizer_threads", lambda: 3)
    monkeypatch.setattr(engine, "compile_parts", keeping)
    module = compile_module(parse_module(PARTS_HLO), threads=2, cache=False)
    ((texts, cut),) = compiled
    assert len(texts) > 1 and len(cut.objects) == len(texts)
    whole = compile_parts([module.llvm_ir])
    expected = _function_code(whole.objects[0])
    found: dict[str, bytes] = {}
    for object_code in cut.objects:
        for name, code in _function_code(object_code).items():
            assert name not in found, f"{name} defined twice"
            found[name] = code
    assert found.keys() == expected.keys() and len(expected) > 3
    assert found == expected


def test_a_symbol_nothing_defines_is_refused_before_mcjit_sees_it() -> None:
    """An object whose call no other object and nothing in the process resolves: MCJIT
    would abort the process, so `load_objects` raises instead."""
    calling = _caller_module("tfxla_lite_test_nowhere")
    parts = engine.compile_parts([calling])
    with pytest.raises(LookupError, match="tfxla_lite_test_nowhere"):
        engine.load_objects(parts.objects, ["tfxla_lite_test_nowhere"])


def test_calls_between_objects_resolve_in_one_engine() -> None:
    callee = ir.Module(name="callee")
    function = ir.Function(callee, ir.FunctionType(ir.IntType(32), []), name="tfxla_lite_seven")
    ir.IRBuilder(function.append_basic_block("entry")).ret(ir.IntType(32)(7))
    parts = engine.compile_parts([_caller_module("tfxla_lite_seven"), str(callee)])
    loaded = engine.load_objects(parts.objects)
    call = ctypes.CFUNCTYPE(ctypes.c_int32)(loaded.get_function_address("call_it"))
    assert call() == 8


def _caller_module(callee: str) -> str:
    """`int call_it(void) { return callee() + 1; }` with `callee` declared only."""
    module = ir.Module(name="caller")
    declared = ir.Function(module, ir.FunctionType(ir.IntType(32), []), name=callee)
    function = ir.Function(module, ir.FunctionType(ir.IntType(32), []), name="call_it")
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    builder.ret(builder.add(builder.call(declared, []), ir.IntType(32)(1)))
    return str(module)


@pytest.mark.parametrize("text, message", [
    ("garbage", "parsing error"),
    ("define i32 @f() {\nentry:\n  br label %x\nx:\n  %a = add i32 %a, 1\n  ret i32 %a\n}",
     "reference their own value"),
], ids=["unparsable", "unverifiable"])
def test_a_bad_part_raises_on_its_thread_and_is_reported(text: str, message: str) -> None:
    """Parsing and verifying run on the parts' threads, without llvmlite's checks
    around them: an error must still come back as an exception."""
    good = _caller_module("tfxla_lite_seven")
    with pytest.raises(RuntimeError, match=message):
        engine.compile_parts([good, text])
