"""Column reductions (`codegen/cpu/column_reduction.py`): reduces that keep the input's
minor dimensions, as BatchNorm's statistics and bias gradients do.

Numerics against the evaluator (f32 sums against their exact value rounded, since the
evaluator's own f32 column folds are sequential) over shapes with 0- and 1-sized
dimensions, kept minor parts of 1 to 2100 columns, lead dimensions and size-1 kept
dimensions among the reduced ones; f32, f64, f16, bf16 and s32 (wrapping); NaN and
infinities; sums with an elementwise producer, maxima (no identity: a chunk starts from
its first row) and multi-output fusions with an input-shaped leaf. Every kernel gives
the same bits on 1, 2 and 3 threads, and the kernel is the row-accumulating one.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from codegen_helpers import float32_reference, random_array
from tolerances import assert_close

from tfxla_lite.codegen import Executable, compile_module
from tfxla_lite.codegen.cpu import column_reduction, compiler, multi_output
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.shape import Shape

_NUMPY = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
          "s32": np.int32}


def _reducer(kind: str, t: str) -> str:
    return f"""
%{kind} (x: {t}[], y: {t}[]) -> {t}[] {{
  %x = {t}[] parameter(0)
  %y = {t}[] parameter(1)
  ROOT %r = {t}[] {kind}(%x, %y)
}}
"""


def _dims(dims: tuple[int, ...]) -> str:
    return ",".join(map(str, dims))


def _reduce_text(t: str, dims: tuple[int, ...], reduced: tuple[int, ...],
                 kind: str = "add") -> str:
    """reduce(x * broadcast(scale), init) over `reduced`: the scale runs along the last
    dimension, so the producer reads a broadcast at each element's column."""
    out = tuple(n for d, n in enumerate(dims) if d not in reduced)
    last = len(dims) - 1
    init = "0" if kind == "add" else "-inf"
    return f"""HloModule column
{_reducer(kind, t)}
ENTRY %main (x: {t}[{_dims(dims)}], s: {t}[{dims[-1]}]) -> {t}[{_dims(out)}] {{
  %x = {t}[{_dims(dims)}] parameter(0)
  %s = {t}[{dims[-1]}] parameter(1)
  %b = {t}[{_dims(dims)}] broadcast(%s), dimensions={{{last}}}
  %e = {t}[{_dims(dims)}] multiply(%x, %b)
  %init = {t}[] constant({init})
  ROOT %r = {t}[{_dims(out)}] reduce(%e, %init), dimensions={{{_dims(reduced)}}}, to_apply=%{kind}
}}
"""


def _args(t: str, dims: tuple[int, ...], seed: int = 0, edges: bool = True
          ) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    x = random_array(Shape(t, dims), rng, edges=edges)
    scale = rng.uniform(0.5, 1.5, size=dims[-1]).astype(_NUMPY[t])  # 0 or 1 for s32
    return [x, scale]


def _compile_all(text: str, args: list[np.ndarray]) -> list[list[np.ndarray]]:
    """The results on 1, 2 and 3 threads, checked to be the same bits."""
    results = []
    for threads in (1, 2, 3):
        executable = compile_module(parse_module(text), verify=True, threads=threads,
                                    cache=False)
        results.append(executable(*args))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            bits = np.dtype(f"u{a.dtype.itemsize}")
            np.testing.assert_array_equal(a.view(bits), b.view(bits))
    return results


def _expected(text: str, t: str, args: list[np.ndarray]) -> np.ndarray:
    value = float32_reference(text, args) if t == "f32" else evaluate(parse_module(text), *args)
    return np.asarray(value[0] if isinstance(value, tuple) else value)


SHAPES = [
    ((64, 28, 28, 32), (0, 1, 2)),  # BatchNorm's statistics: many chunks of rows
    ((300, 257), (0,)),  # odd width
    ((1024, 256), (0,)),  # a bias gradient
    ((50, 3), (0,)),  # narrow
    ((400, 12), (0,)),  # narrow, not whole vectors: unrolled scalar accumulators
    ((64, 20, 5), (0, 1)),
    ((70, 1), (0,)),  # one column
    ((2, 2100), (0,)),  # wider than one block of accumulators
    ((5, 40, 17), (1,)),  # a lead dimension
    ((3, 20, 4, 64), (1, 2)),  # a lead dimension, two reduced
    ((40, 1, 9, 32), (0, 2)),  # a size-1 kept dimension among the reduced ones
    ((33, 7, 5), (0,)),  # two kept minor dimensions
    ((2, 300, 1100), (1,)),  # lead indices, blocks of columns and chunks of rows at once
    ((1, 32), (0,)),  # one row
    ((0, 32), (0,)),  # no rows: the init values
    ((16, 0), (0,)),  # no columns
]


@pytest.mark.parametrize("dims,reduced", SHAPES)
@pytest.mark.parametrize("t", ["f32", "f64", "f16", "bf16", "s32"])
def test_sums(t: str, dims: tuple[int, ...], reduced: tuple[int, ...]) -> None:
    if t != "f32" and np.prod(dims) > 1 << 16:
        pytest.skip("the big shapes once, in f32")
    text = _reduce_text(t, dims, reduced)
    args = _args(t, dims)
    expected = _expected(text, t, args)
    for results in _compile_all(text, args):
        assert_close(results[0], expected, "reduce")


@pytest.mark.parametrize("dims,reduced", [s for s in SHAPES if np.prod(s[0]) <= 1 << 16])
@pytest.mark.parametrize("t", ["f32", "bf16"])
def test_maxima(t: str, dims: tuple[int, ...], reduced: tuple[int, ...]) -> None:
    text = _reduce_text(t, dims, reduced, kind="maximum")
    args = _args(t, dims)
    expected = evaluate(parse_module(text), *args)
    for results in _compile_all(text, args):
        assert_close(results[0], np.asarray(expected), "maximum")


def test_nan_and_infinities_propagate() -> None:
    dims = (200, 3, 48)
    text = _reduce_text("f32", dims, (0, 1))
    x, scale = _args("f32", dims, edges=False)
    x[17, 1, 5] = np.nan
    x[150, 0, 7] = np.inf
    x[3, 2, 8], x[190, 2, 8] = np.inf, -np.inf
    x[100, 1, 9] = -np.inf
    result = _compile_all(text, [x, scale])[0][0]
    assert np.isnan(result[5]) and np.isnan(result[8])
    assert result[7] == np.inf and result[9] == -np.inf
    assert np.isfinite(np.delete(result, [5, 7, 8, 9])).all()


def test_sums_are_blocked() -> None:
    """50176 rows of values in [0, 1): a sequential f32 sum is off by about 1e-5
    relative, the chunked one within a few ulp of the exact sum."""
    dims = (50176, 32)
    text = _reduce_text("f32", dims, (0,))
    x = np.random.default_rng(1).uniform(0.0, 1.0, size=dims).astype(np.float32)
    scale = np.ones(32, np.float32)
    result = _compile_all(text, [x, scale])[0][0]
    exact = x.astype(np.float64).sum(axis=0)
    assert np.max(np.abs(result - exact) / exact) < 1e-6


def _bn_gradient_text(dims: tuple[int, ...]) -> str:
    """sum(dy * (x - mean)) and sum(dy) over all but the last dimension, and dy * x (an
    input-shaped output): one multi-output kernel."""
    c = dims[-1]
    last = len(dims) - 1
    reduced = _dims(tuple(range(last)))
    shape = f"f32[{_dims(dims)}]"
    return f"""HloModule bn_gradient
{_reducer("add", "f32")}
%fused (x: {shape}, dy: {shape}, m: f32[{c}]) -> (f32[{c}], f32[{c}], {shape}) {{
  %x = {shape} parameter(0)
  %dy = {shape} parameter(1)
  %m = f32[{c}] parameter(2)
  %mb = {shape} broadcast(%m), dimensions={{{last}}}
  %d = {shape} subtract(%x, %mb)
  %p = {shape} multiply(%dy, %d)
  %q = {shape} multiply(%dy, %x)
  %zero = f32[] constant(0)
  %r1 = f32[{c}] reduce(%p, %zero), dimensions={{{reduced}}}, to_apply=%add
  %r2 = f32[{c}] reduce(%dy, %zero), dimensions={{{reduced}}}, to_apply=%add
  ROOT %t = (f32[{c}], f32[{c}], {shape}) tuple(%r1, %r2, %q)
}}
ENTRY %main (x: {shape}, dy: {shape}, m: f32[{c}]) -> (f32[{c}], f32[{c}], {shape}) {{
  %x = {shape} parameter(0)
  %dy = {shape} parameter(1)
  %m = f32[{c}] parameter(2)
  ROOT %f = (f32[{c}], f32[{c}], {shape}) fusion(%x, %dy, %m), kind=kInput, calls=%fused
}}
"""


@pytest.mark.parametrize("dims", [(64, 14, 14, 64), (9, 5, 3), (1, 7)])
def test_multi_output_gradient(dims: tuple[int, ...]) -> None:
    text = _bn_gradient_text(dims)
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(d).astype(np.float32) for d in (dims, dims, dims[-1:])]
    expected = float32_reference(text, args)
    for results in _compile_all(text, args):
        for n, (got, wanted) in enumerate(zip(results, expected, strict=True)):
            assert_close(got, wanted, "reduce", context=f"output {n}")


def _fusion(executable: Executable) -> Instruction:
    (fusion,) = [i for i in executable.module.entry.instructions if i.opcode == "fusion"]
    return fusion


def test_the_row_accumulating_kernel_is_chosen() -> None:
    text = _reduce_text("f32", (64, 28, 28, 32), (0, 1, 2))
    executable = compile_module(parse_module(text), cache=False)
    assert executable.kernel_count == 1
    fusion = _fusion(executable)
    partition = compiler.plan_partition(fusion)
    assert partition.kind == "columns" and partition.has_partials
    plan = column_reduction.plan([fusion.fused_computation.root])
    assert plan is not None
    assert (plan.lead, plan.rows, plan.width) == ((), (64, 28, 28), (32,))
    assert plan.units == plan.chunks == partition.total > 1
    # One loop over units of rows, accumulating whole rows of columns: no walk over
    # the input's dimensions one by one.
    assert "unit.header" in executable.llvm_ir and "row.header" in executable.llvm_ir
    assert "i0.header" not in executable.llvm_ir
    gradient = compile_module(parse_module(_bn_gradient_text((64, 14, 14, 64))), cache=False)
    assert multi_output.plan(_fusion(gradient)).kind == "columns"


@pytest.mark.parametrize("width,scalar", [(5, True), (12, True), (24, False), (40, False)])
def test_narrow_rows_keep_their_accumulators_in_registers(width: int, scalar: bool) -> None:
    """A column loop narrower than 32 and not whole 8-lane vectors is unrolled, not
    vectorized: LLVM's masked vector form would load and store the accumulators
    through memory (masked stores do not forward to loads)."""
    text = _reduce_text("f32", (4096, width), (0,))
    executable = compile_module(parse_module(text), cache=False)
    assert ("llvm.loop.unroll.full" in executable.llvm_ir) == scalar
    assert ("llvm.masked" in executable.llvm_ir_optimized) == (not scalar and width % 8 != 0)


@pytest.mark.parametrize("dims,reduced", [
    ((8, 5, 8, 32), (1, 3)),  # reduced dimensions around a kept one
    ((64, 32), (1,)),  # a row reduction
])
def test_other_layouts_keep_their_kernels(dims: tuple[int, ...], reduced: tuple[int, ...]
                                          ) -> None:
    text = _reduce_text("f32", dims, reduced)
    executable = compile_module(parse_module(text), cache=False)
    assert compiler.plan_partition(_fusion(executable)).kind != "columns"
    args = _args("f32", dims)
    assert_close(executable(*args)[0], _expected(text, "f32", args), "reduce")


def test_a_computed_reducer_folds_in_order_from_init() -> None:
    """x + y*y is not one associative op: starting a chunk from its first row or
    combining chunks would change the result, so the generic kernel folds it."""
    text = """HloModule sum_of_squares
%sum_sq (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %bb = f32[] multiply(%b, %b)
  ROOT %r = f32[] add(%a, %bb)
}
ENTRY %main (x: f32[300,32]) -> f32[32] {
  %x = f32[300,32] parameter(0)
  %init = f32[] constant(1)
  ROOT %r = f32[32] reduce(%x, %init), dimensions={0}, to_apply=%sum_sq
}
"""
    executable = compile_module(parse_module(text), cache=False)
    reduce = executable.module.entry.root
    reduce = reduce.operand(0) if reduce.opcode == "tuple" else reduce
    assert column_reduction.plan([reduce]) is None
    x = np.random.default_rng(3).uniform(-2.0, 2.0, size=(300, 32)).astype(np.float32)
    assert_close(executable(x)[0], np.asarray(evaluate(parse_module(text), x)), "reduce")
