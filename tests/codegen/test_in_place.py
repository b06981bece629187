"""In-place buffer reuse end to end: an elementwise kernel that overwrites its dying
operand's temp is emitted without `noalias` on that output and computes what the
evaluator computes; kernels whose operand is read at other indices never reuse."""

from __future__ import annotations

import re

import numpy as np
from codegen_helpers import as_args, build, check

from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.shape import Shape

X, W = Shape("f32", (64, 32)), Shape("f32", (32, 32))


def _dot(c: Computation, a: Instruction, b: Instruction) -> Instruction:
    return c.create("dot", [a, b], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))


def _output_attributes(llvm_ir: str, kernel: str) -> str:
    match = re.search(rf'define internal void @"?{re.escape(kernel)}"?\(ptr ([^%]*)%"?output',
                      llvm_ir)
    assert match, f"no kernel {kernel} in the IR"
    return match.group(1)


def test_elementwise_kernel_overwrites_its_dying_operand() -> None:
    def body(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        # A temp, dead after the activation reads it (not a dot, which would take the
        # activation into its kernel as a kOutput epilogue, nor data movement, which
        # `fuse` takes into the activation's kernel): a column reduction's kernel.
        pairs = c.create("broadcast", [ps[0]], shape=Shape("f32", (2, *X.dims)),
                         dimensions=(1, 2))
        assert c.module is not None
        h = c.create("reduce", [pairs, c.add_constant(0.0, "f32")], dimensions=(0,),
                     called_computations=[c.module.reduction_computation("add", "f32")])
        # relu, not tanh: exact, so only the dot's order separates kernel and evaluator
        # (a few-ulp tanh difference, cancelling in the dot, exceeded MatMul's tolerance).
        relu = c.create("maximum", [h, c.create("broadcast", [c.add_constant(0.0, "f32")],
                                                shape=X, dimensions=())])
        activation = c.create("add", [relu, ps[0]])
        return [_dot(c, activation, ps[1])]

    executable = check(build("mlp", [X, W], body), as_args([X, W], edges=False), "MatMul")
    assignment = executable.assignment
    assert len(assignment.in_place) == 1
    (user, donor), = assignment.in_place.items()
    assert assignment.slice_of(user) == assignment.slice_of(donor)
    assert executable.temp_bytes == X.byte_size  # was 2 * X.byte_size
    fusion_kernel = "kernel." + user.replace("-", "_")
    # The kernel reads the reused operand through its output pointer (one pointer, same
    # index: vectorized without runtime alias checks, compiler.py `_reused_operand`).
    assert "noalias" not in _output_attributes(executable.llvm_ir, fusion_kernel + ".in_place")
    # The plan makes the output that operand's buffer on every call: no other variant.
    assert not re.search(rf'define internal void @"?{re.escape(fusion_kernel)}"?\(',
                         executable.llvm_ir)


def test_no_reuse_when_the_operand_is_read_at_other_indices() -> None:
    def body(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        h = _dot(c, ps[0], ps[1])
        flipped = c.create("reverse", [h], dimensions=(1,))
        return [_dot(c, c.create("add", [flipped, ps[0]]), ps[1])]

    executable = check(build("reversed", [X, W], body), as_args([X, W], edges=False), "MatMul")
    assert executable.assignment.in_place == {}
    # h dies before the output dot is defined, so it lives in that output's buffer
    # (buffer assignment's output hosting); the fusion reading it keeps its own temp.
    assert executable.assignment.slice_of("dot").kind == "output"
    assert executable.temp_bytes == X.byte_size
    kernels = [line for line in executable.llvm_ir.splitlines()
               if line.startswith("define internal void") and "fusion" in line]
    assert kernels
    for line in kernels:
        assert "noalias" in line.split("%")[0]  # distinct buffers keep noalias


def test_no_reuse_of_parameters_or_into_outputs() -> None:
    def body(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        return [c.create("negate", [c.create("exponential", ps)])]

    shape = Shape("f32", (1000,))
    executable = check(build("chain", [shape], body), as_args([shape]), "exponential")
    assert executable.assignment.in_place == {}
    assert executable.temp_bytes == 0


def test_in_place_chain_of_unfused_elementwise_kernels_is_correct() -> None:
    shape = Shape("f32", (4096,))

    def body(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        value = _dot(c, ps[0], ps[1])
        value = c.create("reshape", [value], shape=shape)
        for opcode in ("exponential", "negate", "tanh", "abs"):
            value = c.create(opcode, [value])
        return [c.create("reduce", [value, c.add_constant(0.0, "f32")], dimensions=(0,),
                         called_computations=[c.module.reduction_computation("add", "f32")])]

    module = build("unfused", [Shape("f32", (64, 32)), Shape("f32", (32, 64))], body)
    args = as_args([Shape("f32", (64, 32)), Shape("f32", (32, 64))], edges=False)
    executable = check(module, [a / 8 for a in args], "Sum")
    assert np.isfinite(executable(*[a / 8 for a in args])[0]).all()
    assert executable.temp_bytes <= 2 * shape.byte_size
