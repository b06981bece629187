"""Fixtures for the launch op tests: the op library (built once per session) and tiny
hand-written LLVM kernels with the launch ABI, JIT-compiled by llvmlite, so that the
runtime is tested without the codegen backends."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import llvmlite.binding as llvm
import pytest

from tfxla_lite.runtime import loader

_keys = itertools.count()


@pytest.fixture(scope="session")
def op_library() -> loader.OpLibrary:
    """Builds (first run: ~10 s) or finds the cached library, and loads it."""
    return loader.load_library()


@dataclass
class JitKernel:
    """A compiled kernel; `engine` owns the machine code at `address`."""

    engine: llvm.ExecutionEngine
    address: int


def jit_compile(ir_text: str, name: str = "entry") -> JitKernel:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(ir_text)
    module.verify()
    target_machine = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(module, target_machine)
    engine.finalize_object()
    return JitKernel(engine=engine, address=engine.get_function_address(name))


def elementwise_ir(count: int, llvm_type: str, body: Callable[[str, str], list[str]]) -> str:
    """`entry` computing outputs[0][i] = f(params[0][i], params[1][i]) for i < count;
    `body(a, b)` returns instructions that end by defining %r."""
    lines = "\n  ".join(body("%a", "%b"))
    return f"""
define void @entry(ptr %params, ptr %outputs, ptr %temp) {{
start:
  %x = load ptr, ptr %params
  %y.slot = getelementptr ptr, ptr %params, i64 1
  %y = load ptr, ptr %y.slot
  %out = load ptr, ptr %outputs
  br label %check
check:
  %i = phi i64 [0, %start], [%next, %body]
  %done = icmp sge i64 %i, {count}
  br i1 %done, label %exit, label %body
body:
  %pa = getelementptr {llvm_type}, ptr %x, i64 %i
  %a = load {llvm_type}, ptr %pa
  %pb = getelementptr {llvm_type}, ptr %y, i64 %i
  %b = load {llvm_type}, ptr %pb
  {lines}
  %pr = getelementptr {llvm_type}, ptr %out, i64 %i
  store {llvm_type} %r, ptr %pr
  %next = add i64 %i, 1
  br label %check
exit:
  ret void
}}
"""


def add_f32_ir(count: int) -> str:
    return elementwise_ir(count, "float", lambda a, b: [f"%r = fadd float {a}, {b}"])


def sub_i32_ir(count: int) -> str:
    return elementwise_ir(count, "i32", lambda a, b: [f"%r = sub i32 {a}, {b}"])


def triple_via_temp_ir(count: int) -> str:
    """outputs[0] = 3 * params[0] through temp (temp[i] = 2x, then out = temp[i] + x);
    outputs[1] (int64 scalar) = the temp address modulo 64."""
    return f"""
define void @entry(ptr %params, ptr %outputs, ptr %temp) {{
start:
  %x = load ptr, ptr %params
  %out = load ptr, ptr %outputs
  %misalign.slot = getelementptr ptr, ptr %outputs, i64 1
  %misalign = load ptr, ptr %misalign.slot
  %address = ptrtoint ptr %temp to i64
  %remainder = urem i64 %address, 64
  store i64 %remainder, ptr %misalign
  br label %fill
fill:
  %i = phi i64 [0, %start], [%i.next, %fill.body]
  %fill.done = icmp sge i64 %i, {count}
  br i1 %fill.done, label %read, label %fill.body
fill.body:
  %px = getelementptr float, ptr %x, i64 %i
  %vx = load float, ptr %px
  %twice = fmul float %vx, 2.0
  %pt = getelementptr float, ptr %temp, i64 %i
  store float %twice, ptr %pt
  %i.next = add i64 %i, 1
  br label %fill
read:
  %j = phi i64 [0, %fill], [%j.next, %read.body]
  %read.done = icmp sge i64 %j, {count}
  br i1 %read.done, label %exit, label %read.body
read.body:
  %pt2 = getelementptr float, ptr %temp, i64 %j
  %vt = load float, ptr %pt2
  %px2 = getelementptr float, ptr %x, i64 %j
  %vx2 = load float, ptr %px2
  %sum = fadd float %vt, %vx2
  %po = getelementptr float, ptr %out, i64 %j
  store float %sum, ptr %po
  %j.next = add i64 %j, 1
  br label %read
exit:
  ret void
}}
"""


# outputs[0] (int64[2]) = [address of params[0], address of outputs[0]].
ADDRESSES_IR = """
define void @entry(ptr %params, ptr %outputs, ptr %temp) {
start:
  %x = load ptr, ptr %params
  %out = load ptr, ptr %outputs
  %x.address = ptrtoint ptr %x to i64
  %out.address = ptrtoint ptr %out to i64
  store i64 %x.address, ptr %out
  %second = getelementptr i64, ptr %out, i64 1
  store i64 %out.address, ptr %second
  ret void
}
"""


def iota_i32_ir(count: int) -> str:
    """No inputs; outputs[0][i] = i."""
    return f"""
define void @entry(ptr %params, ptr %outputs, ptr %temp) {{
start:
  %out = load ptr, ptr %outputs
  br label %check
check:
  %i = phi i64 [0, %start], [%next, %body]
  %done = icmp sge i64 %i, {count}
  br i1 %done, label %exit, label %body
body:
  %value = trunc i64 %i to i32
  %p = getelementptr i32, ptr %out, i64 %i
  store i32 %value, ptr %p
  %next = add i64 %i, 1
  br label %check
exit:
  ret void
}}
"""


@pytest.fixture(scope="session")
def kernels() -> SimpleNamespace:
    """The IR builders and `jit_compile`, as a fixture: test modules import nothing
    from conftest (its import name depends on how pytest was started)."""
    return SimpleNamespace(
        jit_compile=jit_compile,
        add_f32=add_f32_ir,
        sub_i32=sub_i32_ir,
        triple_via_temp=triple_via_temp_ir,
        iota_i32=iota_i32_ir,
        addresses=ADDRESSES_IR,
        empty="define void @entry(ptr %params, ptr %outputs, ptr %temp) {\n  ret void\n}",
    )


@pytest.fixture
def register(op_library: loader.OpLibrary):
    """register(ir_text, temp_bytes, input_specs, output_specs) -> a fresh key; every
    key registered through it is unregistered when the test ends."""
    keys: list[str] = []

    def _register(ir_text: str, temp_bytes: int, input_specs, output_specs) -> str:
        kernel = jit_compile(ir_text)
        key = f"test_kernel_{next(_keys)}"
        loader.register_executable(
            key, kernel.address, temp_bytes, input_specs, output_specs, owner=kernel
        )
        keys.append(key)
        return key

    yield _register
    for key in keys:
        loader.unregister(key)
