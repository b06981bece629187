"""Bounded dynamic dimensions (`f32[<=8,4]`): parsed and printed as XLA does, evaluated
with XLA's semantics (the value is the first `size` elements; reductions fold only
those), and compiled by the CPU backend through `dynamic_padder.pad_dynamic` (buffers at
the bound, sizes as values, padding masked) against the evaluator, padding filled with
NaN so that any read of it shows. What is out of reach is a "not supported" error
naming the instruction. Core test: imports no TensorFlow."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hlo_builders import flatten

from tfxla_lite import cli
from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.dynamic_padder import DynamicShapeError, has_dynamic_shapes, pad_dynamic
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import ParseError, parse_module
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.stablehlo import StableHloError, module_to_stablehlo
from tfxla_lite.hlo.verifier import VerificationError, verify

_REDUCERS = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%max (c: f32[], d: f32[]) -> f32[] {
  %c = f32[] parameter(0)
  %d = f32[] parameter(1)
  ROOT %m = f32[] maximum(f32[] %c, f32[] %d)
}
"""

# Sizes on both dimensions, elementwise ops, sums and maxima over and across the dynamic
# dimensions, get-dimension-size, and results with and without dynamic dimensions.
DYNAMIC = "HloModule dynamic\n" + _REDUCERS + """
ENTRY %main (x: f32[8,4], n: s32[], k: s64[]) -> (f32[<=8,<=4], f32[<=4], f32[<=8], s32[], f32[]) {
  %x = f32[8,4]{1,0} parameter(0)
  %n = s32[] parameter(1)
  %k = s64[] parameter(2)
  %rows = f32[<=8,4]{1,0} set-dimension-size(f32[8,4]{1,0} %x, s32[] %n), dimensions={0}
  %both = f32[<=8,<=4]{1,0} set-dimension-size(f32[<=8,4]{1,0} %rows, s64[] %k), dimensions={1}
  %e = f32[<=8,<=4]{1,0} exponential(f32[<=8,<=4]{1,0} %both)
  %y = f32[<=8,<=4]{1,0} multiply(f32[<=8,<=4]{1,0} %e, f32[<=8,<=4]{1,0} %both)
  %zero = f32[] constant(0)
  %low = f32[] constant(-inf)
  %columns = f32[<=4]{0} reduce(f32[<=8,<=4]{1,0} %y, f32[] %zero), dimensions={0}, to_apply=%add
  %row_max = f32[<=8]{0} reduce(f32[<=8,<=4]{1,0} %y, f32[] %low), dimensions={1}, to_apply=%max
  %count = s32[] get-dimension-size(f32[<=8,<=4]{1,0} %e), dimensions={0}
  %total = f32[] reduce(f32[<=8,<=4]{1,0} %y, f32[] %zero), dimensions={0,1}, to_apply=%add
  ROOT %t = (f32[<=8,<=4]{1,0}, f32[<=4]{0}, f32[<=8]{0}, s32[], f32[]) tuple(%y, %columns,
    %row_max, %count, %total)
}
"""

# Only static results: compile_module compiles it as it is.
STATIC_RESULT = "HloModule static_result\n" + _REDUCERS + """
ENTRY %main (x: f32[6], n: s32[]) -> (f32[], s32[]) {
  %x = f32[6]{0} parameter(0)
  %n = s32[] parameter(1)
  %d = f32[<=6]{0} set-dimension-size(f32[6]{0} %x, s32[] %n), dimensions={0}
  %a = f32[<=6]{0} abs(f32[<=6]{0} %d)
  %zero = f32[] constant(0)
  %sum = f32[] reduce(f32[<=6]{0} %a, f32[] %zero), dimensions={0}, to_apply=%add
  %size = s32[] get-dimension-size(f32[<=6]{0} %a), dimensions={0}
  ROOT %t = (f32[], s32[]) tuple(%sum, %size)
}
"""


def _x(rows: int = 8, columns: int = 4) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(rows, columns)).astype(np.float32)


# -- text and shapes ------------------------------------------------------------------------

def test_dynamic_shapes_print_as_parsed() -> None:
    module = parse_module(DYNAMIC)
    text = module.to_text()
    assert "f32[<=8,<=4]{1,0} set-dimension-size(f32[<=8,4]{1,0} %rows, s64[] %k)" in text
    assert parse_module(text).to_text() == text
    shape = module.entry.root.shape.tuple_shapes[0]
    assert shape.dims == (8, 4) and shape.dynamic == (True, True) and shape.is_dynamic
    assert shape.static() == Shape("f32", (8, 4)) and not shape.static().is_dynamic
    verify(module)


def test_shape_facts() -> None:
    shape = Shape("f32", (8, 4)).with_dynamic(0)
    assert str(shape) == "f32[<=8,4]{1,0}" and shape != Shape("f32", (8, 4))
    assert shape.admits((3, 4)) and shape.admits((0, 4)) and shape.admits((8, 4))
    assert not shape.admits((9, 4)) and not shape.admits((3, 3)) and not shape.admits((3,))
    assert shape.with_dynamic(0, False) == Shape("f32", (8, 4))  # flags all off: static
    assert shape.with_element_type("pred").dynamic == (True, False)
    assert shape.byte_size == 8 * 4 * 4  # the buffer is sized by the bound


def test_unbounded_dimensions_are_refused() -> None:
    with pytest.raises(ParseError, match="not supported: unbounded dynamic dimensions"):
        parse_module("HloModule m\nENTRY e {\n  ROOT p = f32[?,2] parameter(0)\n}\n")


def test_shape_rules_carry_dynamic_dimensions() -> None:
    """XLA's inference: an elementwise result is dynamic where any operand is; a reduce
    keeps its kept dimensions' flags; the verifier checks the printed shapes by them."""
    wrong = DYNAMIC.replace("%columns = f32[<=4]{0} reduce", "%columns = f32[4]{0} reduce")
    message = r"%columns: shape f32\[4\]\{0\} differs from inferred f32\[<=4\]"
    with pytest.raises(VerificationError, match=message):
        verify(parse_module(wrong))


# -- the evaluator ----------------------------------------------------------------------

@pytest.mark.parametrize(("n", "m"), [(3, 2), (8, 4), (0, 4), (5, 0), (1, 1)])
def test_evaluator_computes_over_the_sizes(n: int, m: int) -> None:
    x = _x()
    y, columns, row_max, count, total = evaluate(parse_module(DYNAMIC), x, n, m)
    inside = x[:n, :m]
    expected = np.exp(inside) * inside
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    np.testing.assert_allclose(columns, expected.sum(axis=0), rtol=1e-5, atol=1e-6)
    assert row_max.shape == (n,)
    if m:
        np.testing.assert_allclose(row_max, expected.max(axis=1), rtol=1e-6)
    else:
        assert np.all(row_max == -np.inf)  # the init value of an empty fold
    assert int(count) == n
    np.testing.assert_allclose(total, expected.sum(), rtol=1e-5, atol=1e-6)


def test_a_size_outside_the_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="size 9 outside"):
        evaluate(parse_module(DYNAMIC), _x(), 9, 2)
    with pytest.raises(ValueError, match="size -1 outside"):
        evaluate(parse_module(DYNAMIC), _x(), 3, -1)


def test_a_dynamic_parameter_takes_arrays_up_to_its_bound() -> None:
    text = """HloModule p
ENTRY %main (x: f32[<=5]) -> (f32[<=5], s32[]) {
  %x = f32[<=5]{0} parameter(0)
  %n = f32[<=5]{0} negate(f32[<=5]{0} %x)
  %s = s32[] get-dimension-size(f32[<=5]{0} %n), dimensions={0}
  ROOT %t = (f32[<=5]{0}, s32[]) tuple(%n, %s)
}
"""
    negated, size = evaluate(parse_module(text), np.arange(3, dtype=np.float32))
    assert negated.tolist() == [-0.0, -1.0, -2.0] and int(size) == 3
    with pytest.raises(ValueError, match="expected f32\\[<=5\\]"):
        evaluate(parse_module(text), np.zeros(6, np.float32))
    with pytest.raises(DynamicShapeError, match="entry parameter"):
        compile_module(parse_module(text))


_TRANSPOSE = """HloModule b
ENTRY %main (x: f32[8,2], n: s32[]) -> f32[2,<=8] {
  %x = f32[8,2]{1,0} parameter(0)
  %n = s32[] parameter(1)
  %d = f32[<=8,2]{1,0} set-dimension-size(f32[8,2]{1,0} %x, s32[] %n), dimensions={0}
  ROOT %t = f32[2,<=8]{1,0} transpose(f32[<=8,2]{1,0} %d), dimensions={1,0}
}
"""


def test_other_opcodes_over_a_dynamic_dimension_are_named() -> None:
    """A transpose (or reshape, slice, dot, ...) over a dynamic dimension: a clear error,
    from the evaluator and from the compiler alike, never a number."""
    with pytest.raises(DynamicShapeError, match=r"not supported: transpose .*\(%t\)"):
        evaluate(parse_module(_TRANSPOSE), np.zeros((8, 2), np.float32), 3)
    with pytest.raises(DynamicShapeError, match=r"not supported: transpose .*\(%t\)"):
        pad_dynamic(parse_module(_TRANSPOSE), sizes_as_outputs=True)


# Softmax over a dynamic dimension, as XLA writes it: the maximum and the sum broadcast
# back statically (%bm, %bs) and meet the dynamic values in elementwise ops, which read
# them at the dynamic result's indices; and a broadcast that carries a dynamic dimension
# along (%rows: the row sums over the dynamic rows, broadcast back).
SOFTMAX = "HloModule softmax\n" + _REDUCERS + """
ENTRY %main (x: f32[3,6], n: s32[]) -> f32[3,<=6] {
  %x = f32[3,6]{1,0} parameter(0)
  %n = s32[] parameter(1)
  %d = f32[3,<=6]{1,0} set-dimension-size(f32[3,6]{1,0} %x, s32[] %n), dimensions={1}
  %low = f32[] constant(-inf)
  %zero = f32[] constant(0)
  %m = f32[3]{0} reduce(f32[3,<=6]{1,0} %d, f32[] %low), dimensions={1}, to_apply=%max
  %bm = f32[3,6]{1,0} broadcast(f32[3]{0} %m), dimensions={0}
  %s = f32[3,<=6]{1,0} subtract(f32[3,<=6]{1,0} %d, f32[3,6]{1,0} %bm)
  %e = f32[3,<=6]{1,0} exponential(f32[3,<=6]{1,0} %s)
  %sum = f32[3]{0} reduce(f32[3,<=6]{1,0} %e, f32[] %zero), dimensions={1}, to_apply=%add
  %bs = f32[3,6]{1,0} broadcast(f32[3]{0} %sum), dimensions={0}
  ROOT %y = f32[3,<=6]{1,0} divide(f32[3,<=6]{1,0} %e, f32[3,6]{1,0} %bs)
}
"""


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("n", [1, 4, 6])
def test_softmax_over_a_dynamic_dimension(n: int) -> None:
    x = _x(3, 6)
    y = evaluate(parse_module(SOFTMAX), x, n)
    np.testing.assert_allclose(y, _softmax(x[:, :n]), rtol=1e-6)
    module = parse_module(SOFTMAX)
    results = pad_dynamic(module, sizes_as_outputs=True)
    assert results is not None
    padded = x.copy()
    padded[:, n:] = np.nan
    got = results.unpad(compile_module(module, verify=True)(padded, np.int32(n)))
    np.testing.assert_allclose(got[0], _softmax(x[:, :n]), rtol=1e-5)


ROW_CENTERED = "HloModule centered\n" + _REDUCERS + """
ENTRY %main (x: f32[8,4], n: s32[]) -> f32[<=8,4] {
  %x = f32[8,4]{1,0} parameter(0)
  %n = s32[] parameter(1)
  %d = f32[<=8,4]{1,0} set-dimension-size(f32[8,4]{1,0} %x, s32[] %n), dimensions={0}
  %zero = f32[] constant(0)
  %rows = f32[<=8]{0} reduce(f32[<=8,4]{1,0} %d, f32[] %zero), dimensions={1}, to_apply=%add
  %b = f32[<=8,4]{1,0} broadcast(f32[<=8]{0} %rows), dimensions={0}
  ROOT %c = f32[<=8,4]{1,0} subtract(f32[<=8,4]{1,0} %d, f32[<=8,4]{1,0} %b)
}
"""


@pytest.mark.parametrize("n", [0, 5, 8])
def test_a_broadcast_carries_the_dynamic_dimension(n: int) -> None:
    x = _x()
    expected = x[:n] - x[:n].sum(axis=1, keepdims=True)
    np.testing.assert_allclose(evaluate(parse_module(ROW_CENTERED), x, n), expected, rtol=1e-6)
    module = parse_module(ROW_CENTERED)
    results = pad_dynamic(module, sizes_as_outputs=True)
    assert results is not None
    (got,) = results.unpad(compile_module(module, verify=True)(x, np.int32(n)))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    wrong = ROW_CENTERED.replace("%b = f32[<=8,4]{1,0} broadcast", "%b = f32[8,<=4]{1,0} broadcast")
    with pytest.raises(VerificationError, match="a dynamic dimension not the operand's"):
        verify(parse_module(wrong.replace("f32[<=8,4]{1,0} %b)", "f32[8,<=4]{1,0} %b)")))


def test_mismatched_elementwise_sizes_are_refused() -> None:
    text = """HloModule mismatch
ENTRY %main (x: f32[4], n: s32[], k: s32[]) -> f32[<=4] {
  %x = f32[4]{0} parameter(0)
  %n = s32[] parameter(1)
  %k = s32[] parameter(2)
  %a = f32[<=4]{0} set-dimension-size(f32[4]{0} %x, s32[] %n), dimensions={0}
  %b = f32[<=4]{0} set-dimension-size(f32[4]{0} %x, s32[] %k), dimensions={0}
  ROOT %s = f32[<=4]{0} add(f32[<=4]{0} %a, f32[<=4]{0} %b)
}
"""
    with pytest.raises(ValueError, match="dynamic sizes"):
        evaluate(parse_module(text), np.ones(4, np.float32), 1, 3)


# -- compiled (CPU) against the evaluator ----------------------------------------------------

def test_padding_makes_the_module_static() -> None:
    module = parse_module(DYNAMIC)
    results = pad_dynamic(module, sizes_as_outputs=True)
    assert results is not None and not has_dynamic_shapes(module)
    verify(module)
    text = module.to_text()
    assert "set-dimension-size" not in text and "get-dimension-size" not in text
    assert "iota" in text and "select" in text  # the reductions' padding is masked
    assert results.leaves == 5 and set(results.sizes) == {(0, 0), (0, 1), (1, 0), (2, 0)}
    assert pad_dynamic(parse_module(DYNAMIC.replace("<=", ""))) is None  # nothing dynamic


@pytest.mark.parametrize(("n", "m"), [(3, 2), (8, 4), (0, 3), (6, 0), (11, 7)])
def test_cpu_matches_the_evaluator(n: int, m: int) -> None:
    """Padding holds NaN: a reduction that read it would be NaN. A size past the bound
    (11, 7) behaves as XLA's padder makes it: every element counts, and
    get-dimension-size says the size given."""
    x = _x()
    module = parse_module(DYNAMIC)
    results = pad_dynamic(module, sizes_as_outputs=True)
    assert results is not None
    padded = np.full_like(x, np.nan)
    padded[:n, :m] = x[:n, :m]
    got = results.unpad(compile_module(module, verify=True)(padded, np.int32(n), np.int64(m)))
    expected = flatten(evaluate(parse_module(DYNAMIC), x, min(n, 8), min(m, 4)))
    if n > 8:
        expected[3] = np.int32(n)
    assert [g.shape for g in got] == [np.shape(e) for e in expected]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [0, 2, 6])
def test_compile_module_pads_a_module_with_static_results(n: int) -> None:
    x = np.array([1, -2, np.nan, 4, np.inf, -6], np.float32)
    x[n:] = np.nan
    total, size = compile_module(parse_module(STATIC_RESULT))(x, np.int32(n))
    want_total, want_size = evaluate(parse_module(STATIC_RESULT), x, n)
    np.testing.assert_allclose(total, want_total)
    assert int(size) == int(want_size) == n


def test_a_dynamic_result_needs_its_sizes() -> None:
    """compile_module returns arrays only: a result whose size is known at run time is
    refused there (pad_dynamic(sizes_as_outputs=True) hands the sizes out)."""
    with pytest.raises(DynamicShapeError, match="not supported: the entry's result %t"):
        compile_module(parse_module(DYNAMIC))


def test_a_static_set_dimension_size_leaves_the_value() -> None:
    """XLA's builder prints set-dimension-size static when the size is the static one;
    XLA's verifier accepts it and the size is not read (tests/hlo/test_linalg_and_bit_ops
    has it in XLA-printed text)."""
    text = STATIC_RESULT.replace("%d = f32[<=6]{0} set-dimension-size",
                                 "%d = f32[6]{0} set-dimension-size")
    text = re.sub(r"f32\[<=6\]", "f32[6]", text)
    module = parse_module(text)
    verify(module)
    x = np.arange(6, dtype=np.float32)
    total, size = evaluate(module, x, 2)
    assert float(total) == 15.0 and int(size) == 6
    assert [float(total), int(size)] == [float(v) for v in compile_module(module)(x, np.int32(2))]


def test_stablehlo_export_refuses_dynamic_dimensions() -> None:
    with pytest.raises(StableHloError, match="not supported: dynamic dimensions"):
        module_to_stablehlo(parse_module(DYNAMIC))


def test_simplify_leaves_dynamic_sizes_to_the_padder() -> None:
    """simplify drops a static set-dimension-size and folds a static get-dimension-size;
    a dynamic one it leaves alone (folding it to the bound would be a wrong number)."""
    from tfxla_lite.passes.simplify import AlgebraicSimplifier

    module = parse_module(STATIC_RESULT)
    AlgebraicSimplifier().run(module)
    text = module.to_text()
    assert "set-dimension-size" in text and "get-dimension-size" in text


CLAMPED_SIZE = "HloModule clamped\n" + _REDUCERS + """
ENTRY %main (x: f32[6,3], n: s32[]) -> (f32[<=6,3], f32[3]) {
  %x = f32[6,3]{1,0} parameter(0)
  %n = s32[] parameter(1)
  %zero_size = s32[] constant(0)
  %bound = s32[] constant(6)
  %size = s32[] clamp(s32[] %zero_size, s32[] %n, s32[] %bound)
  %d = f32[<=6,3]{1,0} set-dimension-size(f32[6,3]{1,0} %x, s32[] %size), dimensions={0}
  %e = f32[<=6,3]{1,0} exponential(f32[<=6,3]{1,0} %d)
  %zero = f32[] constant(0)
  %sum = f32[3]{0} reduce(f32[<=6,3]{1,0} %e, f32[] %zero), dimensions={0}, to_apply=%add
  ROOT %t = (f32[<=6,3]{1,0}, f32[3]{0}) tuple(%e, %sum)
}
"""


@pytest.mark.parametrize("seed", ["0", "1"])  # sizes 0 (clamped from -5) and 4
def test_run_hlo_cuts_dynamic_results_to_size(tmp_path: Path, seed: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`tfxla-lite run-hlo --check` on a module with a dynamic result: the outputs come
    back cut to their sizes and match the evaluator."""
    path = tmp_path / "module.hlo"
    path.write_text(CLAMPED_SIZE)
    status = cli.main(["run-hlo", str(path), "--check", "--seed", seed])
    output = capsys.readouterr().out
    assert status == 0, output
    assert "check: 2 output(s) match the evaluator" in output
    size = int(np.clip(cli.random_inputs(parse_module(CLAMPED_SIZE), int(seed))[1], 0, 6))
    assert f"output 0: f32[{size},3]" in output


ARGMAX = """HloModule argmax
%argmax (a: f32[], i: s32[], b: f32[], j: s32[]) -> (f32[], s32[]) {
  %a = f32[] parameter(0)
  %i = s32[] parameter(1)
  %b = f32[] parameter(2)
  %j = s32[] parameter(3)
  %ge = pred[] compare(f32[] %a, f32[] %b), direction=GE
  %v = f32[] select(pred[] %ge, f32[] %a, f32[] %b)
  %k = s32[] select(pred[] %ge, s32[] %i, s32[] %j)
  ROOT %t = (f32[], s32[]) tuple(%v, %k)
}

ENTRY %main (x: f32[3,7], n: s32[]) -> (f32[3], s32[3]) {
  %x = f32[3,7]{1,0} parameter(0)
  %n = s32[] parameter(1)
  %d = f32[3,<=7]{1,0} set-dimension-size(f32[3,7]{1,0} %x, s32[] %n), dimensions={1}
  %io = s32[3,7]{1,0} iota(), iota_dimension=1
  %di = s32[3,<=7]{1,0} set-dimension-size(s32[3,7]{1,0} %io, s32[] %n), dimensions={1}
  %lo = f32[] constant(-inf)
  %z = s32[] constant(0)
  ROOT %r = (f32[3]{0}, s32[3]{0}) reduce(f32[3,<=7]{1,0} %d, s32[3,<=7]{1,0} %di,
    f32[] %lo, s32[] %z), dimensions={1}, to_apply=%argmax
}
"""


@pytest.mark.parametrize("n", [1, 4, 7])
def test_a_variadic_reduce_masks_every_input(n: int) -> None:
    """ArgMax over a dynamic row: padding of 100 would win if it were read."""
    x = _x(3, 7)
    x[:, n:] = 100
    value, index = evaluate(parse_module(ARGMAX), x, n)
    np.testing.assert_array_equal(index, np.argmax(x[:, :n], axis=1))
    np.testing.assert_array_equal(value, x[:, :n].max(axis=1))
    got = compile_module(parse_module(ARGMAX), verify=True)(x, np.int32(n))
    np.testing.assert_array_equal(got[0], value)
    np.testing.assert_array_equal(got[1], index)


def test_the_backends_refuse_a_dynamic_size_the_padder_did_not_take(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a path reach codegen without the padder, get-dimension-size of a dynamic
    dimension is an error in both backends, not the bound."""
    from tfxla_lite.codegen.gpu import emit_module
    from tfxla_lite.passes import pipeline

    monkeypatch.setattr(pipeline, "pad_dynamic", lambda module: None)
    with pytest.raises(NotImplementedError, match=r"reads a dynamic size|dynamic set-dim"):
        compile_module(parse_module(STATIC_RESULT), pipeline="")
    with pytest.raises(NotImplementedError, match=r"reads a dynamic size|dynamic set-dim"):
        emit_module(parse_module(STATIC_RESULT), pipeline="")
