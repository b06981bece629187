"""Loops split where a concatenate's operands meet (`data_movement.last_dimension_pieces`):
which concatenates split a kernel's innermost loop, and kLoop and column-reduction
kernels that run those pieces, against the evaluator with NaN, infinities and -0.0."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu import data_movement
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.parser import parse_module

LOOP = """
HloModule loop_pieces

ENTRY main {
  a = f32[5,40] parameter(0)
  b = f32[5,24] parameter(1)
  c = f32[5,64] parameter(2)
  ea = f32[5,40] exponential(a)
  nb = f32[5,24] negate(b)
  cat = f32[5,64] concatenate(ea, nb), dimensions={1}
  ROOT m = f32[5,64] multiply(cat, c)
}
"""

# An LSTM's gate gradients: four pieces, their column sums and the concatenation itself.
COLUMNS = """
HloModule column_pieces

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY main {
  a = f32[32,16] parameter(0)
  b = f32[32,16] parameter(1)
  ta = f32[32,16] tanh(a)
  mb = f32[32,16] multiply(b, b)
  sa = f32[32,16] subtract(a, b)
  cat = f32[32,64] concatenate(ta, mb, sa, b), dimensions={1}
  zero = f32[] constant(0)
  r = f32[64] reduce(cat, zero), dimensions={0}, to_apply=add
  ROOT t = (f32[64], f32[32,64]) tuple(r, cat)
}
"""


def _instruction(module: HloModule, name: str):  # noqa: ANN202 (an Instruction)
    assert module.entry is not None
    return next(i for i in module.entry.instructions if i.name == name)


def test_pieces_of_a_concatenate_along_the_last_dimension() -> None:
    module = parse_module(LOOP)
    multiply = _instruction(module, "m")
    assert data_movement.last_dimension_pieces([multiply]) == [(0, 40), (40, 64)]
    assert data_movement.last_dimension_pieces([_instruction(module, "c")]) == [(0, 64)]
    columns = parse_module(COLUMNS)
    assert data_movement.last_dimension_pieces([_instruction(columns, "cat")]) == [
        (0, 16), (16, 32), (32, 48), (48, 64)]


def test_no_pieces_across_other_dimensions_or_too_many_operands() -> None:
    rows = parse_module(LOOP.replace("f32[5,40] parameter(0)", "f32[2,64] parameter(0)")
                        .replace("f32[5,24] parameter(1)", "f32[3,64] parameter(1)")
                        .replace("f32[5,40] exponential", "f32[2,64] exponential")
                        .replace("f32[5,24] negate", "f32[3,64] negate")
                        .replace("dimensions={1}", "dimensions={0}"))
    assert data_movement.last_dimension_pieces([_instruction(rows, "m")]) == [(0, 64)]
    count = data_movement.MAX_PIECES + 1
    operands = ", ".join(f"p{n}" for n in range(count))
    many = "\n".join(f"  p{n} = f32[2,3] parameter({n})" for n in range(count))
    width = 3 * count
    text = (f"HloModule many\n\nENTRY main {{\n{many}\n"
            f"  ROOT cat = f32[2,{width}] concatenate({operands}), dimensions={{1}}\n}}\n")
    module = parse_module(text)
    assert data_movement.last_dimension_pieces([_instruction(module, "cat")]) == [(0, width)]


def _loops(llvm_ir: str, name: str) -> list[str]:
    """The header blocks of the loops called `name` in `llvm_ir`."""
    return re.findall(rf'^"?{name}\.header(?:\.\d+)?"?:', llvm_ir, re.MULTILINE)


def _edge_values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = values.reshape(-1)
    flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
    return values


def _check(text: str, shapes: list[tuple[int, ...]]) -> object:
    args = [_edge_values(shape, n) for n, shape in enumerate(shapes)]
    expected = evaluate(parse_module(text), *args)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    executable = compile_module(parse_module(text), cache=False, verify=True)
    got = executable(*args)
    for g, e in zip(got, expected, strict=True):
        assert_close(np.asarray(g), np.asarray(e), "Tanh", "concatenate pieces")
    return executable


def test_a_loop_kernel_runs_each_piece_in_a_loop_of_its_own() -> None:
    executable = _check(LOOP, [(5, 40), (5, 24), (5, 64)])
    assert executable.kernel_count == 1
    assert len(_loops(executable.llvm_ir, "piece")) == 2


@pytest.mark.parametrize("threads", [1, 2])
def test_a_column_reduction_of_a_concatenate_folds_each_piece_apart(threads: int) -> None:
    args = [_edge_values((32, 16), n) for n in range(2)]
    expected = evaluate(parse_module(COLUMNS), *args)
    executable = compile_module(parse_module(COLUMNS), cache=False, verify=True,
                                threads=threads)
    got = executable(*args)
    for g, e in zip(got, expected, strict=True):
        assert_close(np.asarray(g), np.asarray(e), "reduce", "concatenate pieces")
    assert len(_loops(executable.llvm_ir, "column")) >= 4
