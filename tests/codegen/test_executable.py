"""The Executable and its ABI: golden LLVM IR, kernel counts, argument checks, the raw
`entry` call through ctypes, reentrancy, and the opcode registry's coverage."""

from __future__ import annotations

import ctypes
import re
import threading
from typing import Any

import numpy as np
import pytest
from codegen_helpers import as_args, build, check, compile_unfused

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.shape import Shape

F32 = Shape("f32", (64, 33))


def _add_module():  # type: ignore[no-untyped-def]
    return build("add", [F32, F32], lambda c, ps: [c.create("add", ps)])


def test_golden_add_kernel() -> None:
    executable = compile_module(_add_module())
    assert executable.kernel_count == 1
    # The kernel is a flat loop whose body loads twice, adds with no fast-math flag, stores.
    kernel = executable.llvm_ir[executable.llvm_ir.index("define internal void @\"kernel."):]
    body = kernel[kernel.index("i.body:"):]
    assert re.search(r"load float.*\n.*\n.*load float.*\n\s+%\"?\.?\w*\"? = fadd float %",
                     body), body
    assert re.search(r"store float", body)
    assert not re.search(r"\b(fast|contract|reassoc|nnan|ninf|afn|arcp)\b",
                         executable.llvm_ir + executable.llvm_ir_optimized)
    # The vectorizer turned it into wide vector code for this host.
    assert re.search(r"<(4|8|16) x float>", executable.llvm_ir_optimized)
    assert 'define void @entry(ptr' in executable.llvm_ir_optimized.replace('"', "")


def test_executable_fields() -> None:
    executable = compile_module(_add_module())
    assert executable.parameter_shapes == [F32, F32]
    assert executable.output_shapes == [F32]
    assert executable.entry_address != 0
    assert executable.hlo_text.startswith("HloModule add")
    assert executable.optimized_hlo_text.startswith("HloModule add")
    assert "output" in executable.assignment.to_text()
    assert executable.temp_bytes == 0


def test_argument_checks() -> None:
    executable = compile_module(_add_module())
    x = np.ones(F32.dims, np.float32)
    with pytest.raises(ValueError, match="takes 2 arguments"):
        executable(x)
    with pytest.raises(ValueError, match="argument 1 has dtype float64"):
        executable(x, x.astype(np.float64))
    with pytest.raises(ValueError, match=r"argument 0 has shape \(33, 64\)"):
        executable(x.T.copy(), x)
    # Non-contiguous inputs are copied to row-major first.
    y = np.asfortranarray(np.arange(x.size, dtype=np.float32).reshape(F32.dims))
    (result,) = executable(y, x)
    np.testing.assert_array_equal(result, y + 1)


def test_raw_abi_call() -> None:
    """Call `entry(params, outputs, temp)` directly, as the TF op does; temp may be NULL."""
    executable = compile_module(_add_module())
    x, y = as_args([F32, F32], edges=False)
    out = np.empty(F32.dims, np.float32)
    params = (ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data)
    outputs = (ctypes.c_void_p * 1)(out.ctypes.data)
    entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
        executable.entry_address)
    entry(ctypes.addressof(params), ctypes.addressof(outputs), None)
    np.testing.assert_array_equal(out, x + y)


def test_temp_arena_and_unaligned_buffers() -> None:
    shape = Shape("f32", (5, 7))

    def body(c, ps):  # type: ignore[no-untyped-def]
        product = c.create("multiply", ps)
        return [c.create("add", [c.create("negate", [product]), ps[0]])]

    executable = compile_unfused(build("temps", [shape, shape], body))
    assert executable.temp_bytes >= 2 * shape.byte_size
    raw = np.zeros(shape.byte_size + 4, np.uint8)
    x = raw[4:].view(np.float32).reshape(shape.dims)  # only element-aligned
    x[...] = 2.0
    y = np.full(shape.dims, 3.0, np.float32)
    (result,) = executable(x, y)
    np.testing.assert_array_equal(result, -6.0 + 2.0)


def test_reentrant_threads() -> None:
    shape = Shape("f32", (256, 64))

    def body(c, ps):  # type: ignore[no-untyped-def]
        reducer = c.module.reduction_computation("add", "f32")
        total = c.create("reduce", [c.create("tanh", [ps[0]]), c.add_constant(0.0, "f32")],
                         dimensions=(1,), called_computations=[reducer])
        return [total, c.create("exponential", [ps[0]])]

    executable = check(build("threads", [shape], body), as_args([shape], edges=False),
                       "reduce")
    inputs = [as_args([shape], seed=s, edges=False)[0] for s in range(4)]
    expected = [executable(x) for x in inputs]
    errors: list[str] = []

    def worker(n: int) -> None:
        for _ in range(20):
            results = executable(inputs[n])
            for r, e in zip(results, expected[n]):
                if not np.array_equal(r, e):
                    errors.append(f"thread {n} differs")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_array_shaped_while_compiles() -> None:
    # Calls compile (calls.py; test_multi_output.py checks them), and so do bf16
    # (test_half_float_kernels.py) and control flow (test_control_flow_codegen.py): a while whose
    # state is one array, and whose condition never holds, returns its initial state.
    shape = Shape("f32", (2,))

    def body(c: Any, ps: list[Any]) -> list[Any]:
        condition = c.module.new_computation("condition")
        condition.add_parameter(0, shape)
        condition.root = condition.add_constant(False, "pred")
        step = c.module.new_computation("step")
        step.root = step.create("negate", [step.add_parameter(0, shape)])
        return [c.create("while", ps, called_computations=[condition, step])]

    x = np.array([1.5, -2], np.float32)
    (got,) = compile_module(build("while", [shape], body), cache=False, verify=True)(x)
    np.testing.assert_array_equal(got, x)
