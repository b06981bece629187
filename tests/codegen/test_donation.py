"""Input forwarding: the (output, parameter) pairs an executable may write in place, and
the results when the output really is the parameter's buffer."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable

import numpy as np
from codegen_helpers import as_args, build
from test_row_kernel import layer_norm, softmax
from tolerances import assert_close

from tfxla_lite.codegen import Executable, compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.shape import Shape

X = Shape("f32", (64, 96))


def _run_in_place(executable: Executable, args: list[np.ndarray]) -> list[np.ndarray]:
    """Call entry with each donated output in its parameter's own buffer."""
    inputs = [np.array(a, copy=True) for a in args]
    outputs = [np.empty(s.dims, s.numpy_dtype) for s in executable.output_shapes]
    for j, i in executable.donations:
        outputs[j] = inputs[i]
    params = (ctypes.c_void_p * len(inputs))(*[a.ctypes.data for a in inputs])
    results = (ctypes.c_void_p * len(outputs))(*[o.ctypes.data for o in outputs])
    temp = np.empty(executable.temp_bytes + 64, np.uint8)
    pointer = temp.ctypes.data + (-temp.ctypes.data % 64)
    executable._entry(ctypes.addressof(params), ctypes.addressof(results), pointer)
    return outputs


def _check_in_place(name: str, shapes: list[Shape], body: Callable, op_type: str,
                    donations: tuple[tuple[int, int], ...]) -> None:
    args = as_args(shapes, edges=False)
    expected = evaluate(build(name, shapes, body), *args)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    executable = compile_module(build(name, shapes, body), donate=range(len(shapes)))
    assert executable.donations == donations
    for actual, want in zip(_run_in_place(executable, args), expected, strict=True):
        assert_close(actual, want, op_type)


def test_elementwise_kernel_writes_over_its_parameter() -> None:
    def body(c: Computation, p: list[Instruction]) -> list[Instruction]:
        return [c.create("tanh", [c.create("add", [p[0], p[1]])])]

    _check_in_place("add_tanh", [X, X], body, "Tanh", ((0, 0),))


def test_row_fusions_write_over_their_rows() -> None:
    _check_in_place("softmax", [X], lambda c, p: [softmax(c, p[0])], "Softmax", ((0, 0),))
    affine = Shape("f32", (96,))
    _check_in_place("layer_norm", [X, affine, affine], lambda c, p: [layer_norm(c, *p)],
                    "Mean", ((0, 0),))


def test_no_donation_when_read_elsewhere_or_at_other_indices() -> None:
    def twice(c: Computation, p: list[Instruction]) -> list[Instruction]:
        return [c.create("negate", p), c.create("exponential", p)]  # two readers

    def flipped(c: Computation, p: list[Instruction]) -> list[Instruction]:
        return [c.create("add", [p[0], c.create("transpose", [p[0]], dimensions=(1, 0))])]

    def converted(c: Computation, p: list[Instruction]) -> list[Instruction]:
        return [c.create("convert", p, element_type="f64")]

    square = Shape("f32", (32, 32))
    assert compile_module(build("twice", [X], twice), donate=[0]).donations == ()
    assert compile_module(build("flipped", [square], flipped), donate=[0]).donations == ()
    assert compile_module(build("converted", [X], converted), donate=[0]).donations == ()


def test_donated_kernel_has_an_in_place_variant() -> None:
    # The launcher runs one range function when the output is the parameter's buffer
    # (reading it through the output pointer), the noalias one otherwise; both vectorize.
    def body(c: Computation, p: list[Instruction]) -> list[Instruction]:
        return [c.create("exponential", [c.create("multiply", [p[0], p[0]])])]

    executable = compile_module(build("square", [X], body), donate=[0])
    assert executable.donations == ((0, 0),)
    ranges = dict(re.findall(r'define internal void @"?(kernel[\w.]*?)"?\(ptr ([^%]*)%"?output',
                             executable.llvm_ir))
    in_place = [name for name in ranges if name.endswith(".in_place")]
    assert len(in_place) == 1 and "noalias" not in ranges[in_place[0]]
    assert "noalias" in ranges[in_place[0].removesuffix(".in_place")]
    assert "icmp eq i64" in executable.llvm_ir  # the launcher compares the two pointers
    optimized = executable.llvm_ir_optimized
    assert "<16 x float>" in optimized or "<8 x float>" in optimized
    assert not re.search(r"call float @llvm\.", optimized), "a scalar path was left"


def test_only_named_parameters_are_donated() -> None:
    def body(c: Computation, p: list[Instruction]) -> list[Instruction]:
        return [c.create("add", [p[0], p[1]])]

    assert compile_module(build("add", [X, X], body)).donations == ()
    assert compile_module(build("add", [X, X], body), donate=[1]).donations == ((0, 1),)
    assert ".in_place" not in compile_module(build("add", [X, X], body)).llvm_ir
