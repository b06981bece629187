"""Builders and checks shared by the CPU codegen tests.

`naive_assignment` is a stand-in `BufferAssignment` (every temp in its own slice)
for modules compiled without the pass pipeline, so that unfused ops and hand-built
fusions reach the backend exactly as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tolerances import assert_close

from tfxla_lite.codegen import Executable, compile_module, cpu
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes.buffer_assignment import BufferSlice


@dataclass
class NaiveAssignment:
    slices: dict[str, BufferSlice]
    temp_bytes: int
    temp_bytes_without_reuse: int

    def slice_of(self, instruction: Instruction) -> BufferSlice:
        return self.slices[instruction.name]

    def to_text(self) -> str:
        return "\n".join(f"%{name}: {s}" for name, s in self.slices.items())


def naive_assignment(module: HloModule) -> NaiveAssignment:
    entry = module.entry
    assert entry is not None and entry.root is not None
    root = entry.root
    outputs = list(root.operands) if root.opcode == "tuple" else [root]
    slices: dict[str, BufferSlice] = {}
    offset = 0
    for inst in entry.instructions:
        if inst.opcode == "tuple":
            continue
        size = inst.shape.byte_size
        if inst.opcode == "parameter":
            slices[inst.name] = BufferSlice("parameter", inst.parameter_number, 0, size)
        elif inst.opcode == "constant":
            slices[inst.name] = BufferSlice("constant", 0, 0, size)
        elif inst in outputs:
            slices[inst.name] = BufferSlice("output", outputs.index(inst), 0, size)
        else:
            slices[inst.name] = BufferSlice("temp", 0, offset, size)
            offset += (size + 63) // 64 * 64
    return NaiveAssignment(slices, offset, offset)


def compile_unfused(module: HloModule) -> Executable:
    """Compile as written: every entry op is its own kernel."""
    return cpu.compile(module, naive_assignment(module))


def new_module(name: str = "test") -> tuple[HloModule, Computation]:
    module = HloModule(name)
    return module, module.new_computation("main", entry=True)


def build(name: str, parameter_shapes: Sequence[Shape],
          body: Callable[[Computation, list[Instruction]], Instruction | list[Instruction]]
          ) -> HloModule:
    """A module whose entry computes `body(params)`; a list of results becomes a tuple."""
    module, comp = new_module(name)
    params = [comp.add_parameter(n, s) for n, s in enumerate(parameter_shapes)]
    result = body(comp, params)
    results = result if isinstance(result, list) else [result]
    comp.root = comp.create("tuple", results)
    return module


def float32_reference(text: str, args: Sequence[np.ndarray]) -> Any:
    """The evaluator's result for HLO `text` computed in f64 and rounded to f32 (`text`
    must have no other float type): a reference for float sums, where the evaluator's
    own f32 folds keep the order of NumPy's reductions (row-major, one accumulator,
    along a column), which loses more than the kernels' blocked order."""
    assert not re.search(r"\b(f16|bf16|f64)\[", text), "f32 modules only"
    wide = parse_module(text.replace("f32[", "f64["))
    result = evaluate(wide, *[a.astype(np.float64) if a.dtype == np.float32 else a
                              for a in args])

    def narrow(value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(narrow(v) for v in value)
        value = np.asarray(value)
        return value.astype(np.float32) if value.dtype == np.float64 else value

    return narrow(result)


def check(module: HloModule, args: Sequence[np.ndarray], op_type: str,
          fused: bool = True) -> Executable:
    """Compile `module` (through the pipeline, or unfused) and compare with the evaluator."""
    expected = evaluate(module, *args)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    executable = compile_module(module) if fused else compile_unfused(module)
    actual = executable(*args)
    assert len(actual) == len(expected)
    for n, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, op_type, context=f"output {n}")
    return executable


FLOAT_EDGES = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 1e-30,
               3.0, 100.0]


def random_array(shape: Shape, rng: np.random.Generator, low: float = -4.0, high: float = 4.0,
                 edges: bool = True) -> np.ndarray:
    """Random values of `shape`, with float edge values (NaN, ±inf, ±0) sprinkled in."""
    dtype = shape.numpy_dtype
    dims = shape.dims
    if dtype == np.bool_:
        return rng.random(dims) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(max(int(low), info.min), min(int(high), info.max) + 1, size=dims)
        array = values.astype(dtype)
        if edges and array.size:
            specials = [0, 1, info.max, info.min] + ([-1] if dtype.kind == "i" else [])
            flat = array.reshape(-1)
            for value in specials[: flat.size]:
                flat[rng.integers(flat.size)] = value
        return array
    array = rng.uniform(low, high, size=dims).astype(dtype)
    if edges and array.size:
        flat = array.reshape(-1)
        for n, value in enumerate(FLOAT_EDGES[: max(1, flat.size // 2)]):
            flat[n % flat.size] = value
    return array


def as_args(shapes: Sequence[Shape], seed: int = 0, **kwargs: Any) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [random_array(s, rng, **kwargs) for s in shapes]


# Parallel kernels (softmax rows, tanh of a transposed product, column sums) and a
# dot: entry launches tasks that lie in other parts.
PARTS_HLO = """
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
