"""Kernels with several outputs against the evaluator: multi-output fusions (loop kind,
reduction kind with row, column and split full reductions, reductions with
input-shaped outputs), variadic reduces (argmax) fused and unfused, tuples and
get-tuple-elements in the entry; serial and parallel, bit-identical for any thread
count."""

from __future__ import annotations

import re

import numpy as np
import pytest
from codegen_helpers import as_args, compile_unfused, float32_reference
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.shape import Shape

ADD = """
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}
"""

ARGMAX = """
%argmax (a: f32[], i: s32[], b: f32[], j: s32[]) -> (f32[], s32[]) {
  %a = f32[] parameter(0)
  %i = s32[] parameter(1)
  %b = f32[] parameter(2)
  %j = s32[] parameter(3)
  %ge = pred[] compare(%a, %b), direction=GE
  %eq = pred[] compare(%a, %b), direction=EQ
  %low = s32[] minimum(%i, %j)
  %value = f32[] select(%ge, %a, %b)
  %index = s32[] select(%ge, %i, %j)
  %tie = s32[] select(%eq, %low, %index)
  ROOT %pair = (f32[], s32[]) tuple(%value, %tie)
}
"""


def _flat(value: object) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [a for v in value for a in _flat(v)]
    return [np.asarray(value)]


def _check(text: str, args: list[np.ndarray], op_type: str = "reduce",
           kernels: int | None = None) -> None:
    """Evaluator against the compiled module, serial and on 1, 2 and 3 threads; the
    compiled results must not depend on the thread count."""
    # f32 sums are checked against their exact value (rounded): the evaluator's f32 folds
    # along a column are sequential, and lose more than the kernels' blocked sums.
    f32 = not re.search(r"\b(f16|bf16|f64)\[", text)
    expected = _flat(float32_reference(text, args) if f32 else evaluate(parse_module(text), *args))
    results = []
    for threads in (1, 2, 3):
        executable = compile_module(parse_module(text), verify=True, threads=threads,
                                    cache=False)
        if kernels is not None:
            assert executable.kernel_count == kernels
        actual = executable(*args)
        assert len(actual) == len(expected)
        for n, (got, wanted) in enumerate(zip(actual, expected, strict=True)):
            assert_close(got, wanted, op_type, context=f"output {n}, {threads} threads")
        results.append(actual)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def _args(*shapes: tuple[int, ...], dtype: str = "f32") -> list[np.ndarray]:
    return as_args([Shape(dtype, s) for s in shapes], edges=False)


@pytest.mark.parametrize("dims", [(300, 257), (5, 3), (0, 4)])
@pytest.mark.parametrize("transposed", [False, True])
def test_loop_fusion_with_two_outputs(dims: tuple[int, ...], transposed: bool) -> None:
    a, b = dims
    # The transpose makes the kernel index multi-dimensional (no flat loop).
    y_of = f"%t = f32[{a},{b}] transpose(%q), dimensions={{1,0}}" if transposed else \
        f"%t = f32[{a},{b}] negate(%q)"
    q_dims = f"{b},{a}" if transposed else f"{a},{b}"
    text = f"""HloModule loop_mof
%fused (p: f32[{a},{b}], q: f32[{q_dims}]) -> (f32[{a},{b}], f32[{a},{b}]) {{
  %p = f32[{a},{b}] parameter(0)
  %q = f32[{q_dims}] parameter(1)
  {y_of}
  %sum = f32[{a},{b}] add(%p, %t)
  %product = f32[{a},{b}] multiply(%p, %t)
  ROOT %both = (f32[{a},{b}], f32[{a},{b}]) tuple(%sum, %product)
}}
ENTRY %main (x: f32[{a},{b}], y: f32[{q_dims}]) -> (f32[{a},{b}], f32[{a},{b}]) {{
  %x = f32[{a},{b}] parameter(0)
  %y = f32[{q_dims}] parameter(1)
  %f = (f32[{a},{b}], f32[{a},{b}]) fusion(%x, %y), kind=kLoop, calls=%fused
  %g0 = f32[{a},{b}] get-tuple-element(%f), index=0
  %g1 = f32[{a},{b}] get-tuple-element(%f), index=1
  ROOT %out = (f32[{a},{b}], f32[{a},{b}]) tuple(%g0, %g1)
}}
"""
    _check(text, _args((a, b), tuple(int(d) for d in q_dims.split(","))), "multiply",
           kernels=1)


def _sum_and_sum_of_squares(dims: tuple[int, ...], reduced: tuple[int, ...]) -> str:
    shape = ",".join(map(str, dims))
    kept = ",".join(str(d) for n, d in enumerate(dims) if n not in reduced)
    red = ",".join(map(str, reduced))
    return f"""HloModule moments
{ADD}
%fused (p: f32[{shape}]) -> (f32[{kept}], f32[{kept}]) {{
  %p = f32[{shape}] parameter(0)
  %zero = f32[] constant(0)
  %square = f32[{shape}] multiply(%p, %p)
  %s1 = f32[{kept}] reduce(%p, %zero), dimensions={{{red}}}, to_apply=%add
  %s2 = f32[{kept}] reduce(%square, %zero), dimensions={{{red}}}, to_apply=%add
  ROOT %both = (f32[{kept}], f32[{kept}]) tuple(%s1, %s2)
}}
ENTRY %main (x: f32[{shape}]) -> (f32[{kept}], f32[{kept}]) {{
  %x = f32[{shape}] parameter(0)
  ROOT %f = (f32[{kept}], f32[{kept}]) fusion(%x), kind=kInput, calls=%fused
}}
"""


@pytest.mark.parametrize("dims,reduced", [
    ((512, 300), (1,)),  # rows, split between threads by row
    ((300, 512), (0,)),  # columns, split by kept input column
    ((4, 64, 300), (0, 2)),  # a column reduction with an inner reduced dimension
    ((512, 300), (0, 1)),  # a full reduction of 153600 elements: fixed chunks
    ((7, 3), (0, 1)),  # a small full reduction: serial
    ((0, 5), (1,)),
])
def test_sibling_reductions(dims: tuple[int, ...], reduced: tuple[int, ...]) -> None:
    _check(_sum_and_sum_of_squares(dims, reduced), _args(dims), kernels=1)


@pytest.mark.parametrize("reduced", [(1,), (0,)])
def test_reduction_with_an_input_shaped_output(reduced: tuple[int, ...]) -> None:
    """exp(x) is needed by a reduction and outside: one kernel writes both."""
    kept = 300 if reduced == (1,) else 257
    text = f"""HloModule softmax_like
{ADD}
%fused (p: f32[300,257]) -> (f32[{kept}], f32[300,257]) {{
  %p = f32[300,257] parameter(0)
  %zero = f32[] constant(0)
  %e = f32[300,257] exponential(%p)
  %s = f32[{kept}] reduce(%e, %zero), dimensions={{{reduced[0]}}}, to_apply=%add
  ROOT %both = (f32[{kept}], f32[300,257]) tuple(%s, %e)
}}
ENTRY %main (x: f32[300,257]) -> (f32[{kept}], f32[300,257]) {{
  %x = f32[300,257] parameter(0)
  ROOT %f = (f32[{kept}], f32[300,257]) fusion(%x), kind=kInput, calls=%fused
}}
"""
    _check(text, _args((300, 257)), "reduce", kernels=1)


def _argmax(dims: tuple[int, ...], reduced: tuple[int, ...], fused: bool) -> str:
    shape = ",".join(map(str, dims))
    kept = ",".join(str(d) for n, d in enumerate(dims) if n not in reduced)
    red = ",".join(map(str, reduced))
    iota_dim = reduced[-1]

    def reduce(x: str) -> str:
        return f"reduce(%{x}, %iota, %low, %zero), dimensions={{{red}}}, to_apply=%argmax"

    header = f"(f32[{kept}], s32[{kept}])"
    body = f"""  %iota = s32[{shape}] iota(), iota_dimension={iota_dim}
  %low = f32[] constant(-inf)
  %zero = s32[] constant(0)"""
    if fused:
        return f"""HloModule argmax
{ARGMAX}
%fused (p: f32[{shape}]) -> {header} {{
  %p = f32[{shape}] parameter(0)
{body}
  ROOT %r = {header} {reduce("p")}
}}
ENTRY %main (x: f32[{shape}]) -> s32[{kept}] {{
  %x = f32[{shape}] parameter(0)
  %f = {header} fusion(%x), kind=kLoop, calls=%fused
  ROOT %index = s32[{kept}] get-tuple-element(%f), index=1
}}
"""
    return f"""HloModule argmax
{ARGMAX}
ENTRY %main (x: f32[{shape}]) -> (s32[{kept}], f32[{kept}]) {{
  %x = f32[{shape}] parameter(0)
{body}
  %r = {header} {reduce("x")}
  %index = s32[{kept}] get-tuple-element(%r), index=1
  %value = f32[{kept}] get-tuple-element(%r), index=0
  %one = s32[] constant(1)
  %ones = s32[{kept}] broadcast(%one), dimensions={{}}
  %next = s32[{kept}] add(%index, %ones)
  ROOT %out = (s32[{kept}], f32[{kept}]) tuple(%next, %value)
}}
"""


@pytest.mark.parametrize("fused", [True, False])
def test_small_argmax_against_the_evaluator(fused: bool) -> None:
    x = _args((4, 7))[0]
    x[1, 2] = x[1, 5] = 9.0  # a tie: the lower index wins
    _check(_argmax((4, 7), (1,), fused), [x], "ArgMax")


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dims,reduced", [
    ((400, 700), (1,)),  # rows
    ((700, 400), (0,)),  # columns
    ((200000,), (0,)),  # a full reduction in chunks
])
def test_argmax_against_numpy(dims: tuple[int, ...], reduced: tuple[int, ...],
                              fused: bool) -> None:
    """Big enough for parallel kernels (the evaluator's Python reducer would be slow)."""
    x = _args(dims)[0]
    x.reshape(-1)[::97] = 3.5  # ties: the lowest index wins, whatever the fold order
    axis = reduced[0]
    index = np.argmax(x, axis=axis).astype(np.int32)
    expected = [index] if fused else [index + 1, np.max(x, axis=axis)]
    results = []
    for threads in (1, 3):
        executable = compile_module(parse_module(_argmax(dims, reduced, fused)), verify=True,
                                    threads=threads, cache=False)
        actual = executable(x)
        for got, wanted in zip(actual, expected, strict=True):
            np.testing.assert_array_equal(got, wanted)
        results.append(actual)


def test_argmax_and_max_share_one_kernel() -> None:
    """A variadic reduce and a plain reduce over the same rows, as one fusion."""
    text = f"""HloModule argmax_and_sum
{ADD}
{ARGMAX}
%fused (p: f32[64,300]) -> ((f32[64], s32[64]), f32[64]) {{
  %p = f32[64,300] parameter(0)
  %iota = s32[64,300] iota(), iota_dimension=1
  %low = f32[] constant(-inf)
  %zero = s32[] constant(0)
  %fzero = f32[] constant(0)
  %r = (f32[64], s32[64]) reduce(%p, %iota, %low, %zero), dimensions={{1}}, to_apply=%argmax
  %s = f32[64] reduce(%p, %fzero), dimensions={{1}}, to_apply=%add
  ROOT %all = ((f32[64], s32[64]), f32[64]) tuple(%r, %s)
}}
ENTRY %main (x: f32[64,300]) -> ((f32[64], s32[64]), f32[64]) {{
  %x = f32[64,300] parameter(0)
  ROOT %f = ((f32[64], s32[64]), f32[64]) fusion(%x), kind=kInput, calls=%fused
}}
"""
    _check(text, _args((64, 300)), kernels=1)


def test_get_tuple_element_aliases_its_leaf() -> None:
    """An output that is a get-tuple-element of a fusion is that leaf's buffer: no copy."""
    module = parse_module(_argmax((4, 7), (1,), fused=True))
    root = module.entry.root
    executable = compile_module(module, cache=False)
    assignment = executable.assignment
    assert root.opcode == "get-tuple-element"
    assert assignment.slice_of(root) == assignment.slice_of("f", (1,))
    assert assignment.slice_of("f", (1,)).kind == "output"
    assert assignment.slice_of("f", (0,)).kind == "temp"
    assert "memcpy" not in executable.llvm_ir


def _compile_and_check(text: str, args: list[np.ndarray], kernels: int) -> None:
    expected = _flat(evaluate(parse_module(text), *args))
    for threads in (1, 2):
        executable = compile_module(parse_module(text), verify=True, threads=threads,
                                    cache=False)
        assert executable.kernel_count == kernels
        for got, wanted in zip(executable(*args), expected, strict=True):
            assert_close(got, wanted, "reduce")


@pytest.mark.parametrize("reduced", [1, 0])
def test_pipeline_fuses_moments_into_one_kernel(reduced: int) -> None:
    """reduce_sum(x) and reduce_sum(x*x) through the default pipeline: one kernel."""
    kept = 300 - 300 * reduced + 256 * reduced
    text = f"""HloModule moments
{ADD}
ENTRY %main (x: f32[256,300]) -> (f32[{kept}], f32[{kept}]) {{
  %x = f32[256,300] parameter(0)
  %zero = f32[] constant(0)
  %s1 = f32[{kept}] reduce(%x, %zero), dimensions={{{reduced}}}, to_apply=%add
  %square = f32[256,300] multiply(%x, %x)
  %s2 = f32[{kept}] reduce(%square, %zero), dimensions={{{reduced}}}, to_apply=%add
  ROOT %out = (f32[{kept}], f32[{kept}]) tuple(%s1, %s2)
}}
"""
    _compile_and_check(text, _args((256, 300)), kernels=1)


def test_pipeline_fuses_a_producer_into_its_reduction() -> None:
    """exp(x) is read by a row sum and by a divide: the sum's kernel also writes exp(x)."""
    text = f"""HloModule producer
{ADD}
ENTRY %main (x: f32[256,300]) -> (f32[256], f32[256,300]) {{
  %x = f32[256,300] parameter(0)
  %zero = f32[] constant(0)
  %e = f32[256,300] exponential(%x)
  %s = f32[256] reduce(%e, %zero), dimensions={{1}}, to_apply=%add
  %half = f32[] constant(0.5)
  %halves = f32[256,300] broadcast(%half), dimensions={{}}
  %scaled = f32[256,300] multiply(%e, %halves)
  ROOT %out = (f32[256], f32[256,300]) tuple(%s, %scaled)
}}
"""
    module = parse_module(text)
    executable = compile_module(module, cache=False)
    assert "multi_output" in executable.optimized_hlo_text
    assert executable.kernel_count == 2  # the reduction with exp(x), then the scaling
    _compile_and_check(text, _args((256, 300)), kernels=2)


CALLS = """HloModule calls
%scale (a: f32[6,5], b: f32[6,5]) -> f32[6,5] {
  %a = f32[6,5] parameter(0)
  %b = f32[6,5] parameter(1)
  %t = f32[6,5] multiply(%a, %b)
  ROOT %u = f32[6,5] add(%t, %a)
}
%twice (p: f32[6,5]) -> (f32[6,5], f32[5,6]) {
  %p = f32[6,5] parameter(0)
  %once = f32[6,5] call(%p, %p), to_apply=%scale
  %flipped = f32[5,6] transpose(%once), dimensions={1,0}
  ROOT %pair = (f32[6,5], f32[5,6]) tuple(%once, %flipped)
}
ENTRY %main (x: f32[6,5], y: f32[6,5]) -> (f32[6,5], f32[6,5], f32[5,6]) {
  %x = f32[6,5] parameter(0)
  %y = f32[6,5] parameter(1)
  %c1 = f32[6,5] call(%x, %y), to_apply=%scale
  %c2 = f32[6,5] call(%y, %x), to_apply=%scale
  %sum = f32[6,5] add(%c1, %c2)
  %nested = (f32[6,5], f32[5,6]) call(%sum), to_apply=%twice
  %n0 = f32[6,5] get-tuple-element(%nested), index=0
  %n1 = f32[5,6] get-tuple-element(%nested), index=1
  ROOT %out = (f32[6,5], f32[6,5], f32[5,6]) tuple(%sum, %n0, %n1)
}
"""


def test_calls_compile_inlined_and_as_written() -> None:
    """Through the pipeline (call-inliner: nested calls, two calls of one computation,
    a tuple-shaped call), and as written (the `call` generator)."""
    args = _args((6, 5), (6, 5))
    expected = _flat(evaluate(parse_module(CALLS), *args))
    executable = compile_module(parse_module(CALLS), verify=True, cache=False)
    assert "call(" not in executable.optimized_hlo_text
    for got, wanted in zip(executable(*args), expected, strict=True):
        assert_close(got, wanted, "multiply")
    text = """HloModule call_as_written
%scale (a: f32[6,5], b: f32[6,5]) -> f32[6,5] {
  %a = f32[6,5] parameter(0)
  %b = f32[6,5] parameter(1)
  %t = f32[6,5] multiply(%a, %b)
  ROOT %u = f32[6,5] add(%t, %a)
}
ENTRY %main (x: f32[6,5], y: f32[6,5]) -> f32[6,5] {
  %x = f32[6,5] parameter(0)
  %y = f32[6,5] parameter(1)
  %c1 = f32[6,5] call(%x, %y), to_apply=%scale
  ROOT %out = (f32[6,5]) tuple(%c1)
}
"""
    module = parse_module(text)
    executable = compile_unfused(module)  # no passes: the call is a kernel of its own
    assert executable.kernel_count == 1
    expected = _flat(evaluate(parse_module(text), *args))
    for got, wanted in zip(executable(*args), expected, strict=True):
        assert_close(got, wanted, "multiply")


def test_reduction_reading_its_input_shaped_output_across_rows() -> None:
    """The sum of row i reads column i of exp(x) too: exp(x) must not be read back from
    rows other threads (or later iterations) have not stored yet."""
    text = f"""HloModule across_rows
{ADD}
%fused (p: f32[320,320]) -> (f32[320], f32[320,320]) {{
  %p = f32[320,320] parameter(0)
  %zero = f32[] constant(0)
  %e = f32[320,320] exponential(%p)
  %t = f32[320,320] transpose(%e), dimensions={{1,0}}
  %both = f32[320,320] add(%e, %t)
  %s = f32[320] reduce(%both, %zero), dimensions={{1}}, to_apply=%add
  ROOT %out = (f32[320], f32[320,320]) tuple(%s, %e)
}}
ENTRY %main (x: f32[320,320]) -> (f32[320], f32[320,320]) {{
  %x = f32[320,320] parameter(0)
  ROOT %f = (f32[320], f32[320,320]) fusion(%x), kind=kInput, calls=%fused
}}
"""
    _check(text, _args((320, 320)), kernels=1)


@st.composite
def _sharing_modules(draw: st.DrawFn) -> str:
    """Random kernels over one array: row/column reductions (add, max, argmax) of
    elementwise functions of it, and loops over it, outputs in any mix, so that the
    pipeline forms sibling and producer-consumer multi-output fusions."""
    rows, columns = draw(st.sampled_from([(256, 300), (5, 7), (1, 9)]))
    lines, outputs = [f"  %x = f32[{rows},{columns}] parameter(0)",
                      "  %zero = f32[] constant(0)", "  %low = f32[] constant(-inf)",
                      "  %izero = s32[] constant(0)"], []
    values = ["x"]
    for n in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "argmax"]))
        x = draw(st.sampled_from(values))
        if kind == "unary":
            op = draw(st.sampled_from(["exponential", "negate", "abs", "tanh"]))
            lines.append(f"  %v{n} = f32[{rows},{columns}] {op}(%{x})")
            values.append(f"v{n}")
        elif kind == "binary":
            y = draw(st.sampled_from(values))
            op = draw(st.sampled_from(["add", "multiply", "maximum"]))
            lines.append(f"  %v{n} = f32[{rows},{columns}] {op}(%{x}, %{y})")
            values.append(f"v{n}")
        else:
            axis = draw(st.sampled_from([0, 1]))
            kept = columns if axis == 0 else rows
            if kind == "reduce":
                reducer, init = draw(st.sampled_from([("add", "zero"), ("max", "low")]))
                lines.append(f"  %v{n} = f32[{kept}] reduce(%{x}, %{init}), "
                             f"dimensions={{{axis}}}, to_apply=%{reducer}")
                outputs.append((f"v{n}", f"f32[{kept}]"))
            else:
                lines.append(f"  %i{n} = s32[{rows},{columns}] iota(), iota_dimension={axis}")
                lines.append(f"  %r{n} = (f32[{kept}], s32[{kept}]) reduce(%{x}, %i{n}, %low, "
                             f"%izero), dimensions={{{axis}}}, to_apply=%argmax")
                lines.append(f"  %v{n} = s32[{kept}] get-tuple-element(%r{n}), index=1")
                outputs.append((f"v{n}", f"s32[{kept}]"))
    for value in draw(st.lists(st.sampled_from(values[1:] or values), max_size=2)):
        outputs.append((value, f"f32[{rows},{columns}]"))
    outputs = list(dict.fromkeys(outputs)) or [("x", f"f32[{rows},{columns}]")]
    result = "(" + ", ".join(shape for _, shape in outputs) + ")"
    lines.append(f"  ROOT %out = {result} tuple(" +
                 ", ".join(f"%{name}" for name, _ in outputs) + ")")
    return (f"HloModule sharing\n{ADD}\n%max (a: f32[], b: f32[]) -> f32[] {{\n"
            "  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n"
            "  ROOT %m = f32[] maximum(%a, %b)\n}\n" + ARGMAX +
            f"\nENTRY %main (x: f32[{rows},{columns}]) -> {result} {{\n" +
            "\n".join(lines) + "\n}\n")


_NUMPY = {"exponential": np.exp, "negate": np.negative, "abs": np.abs, "tanh": np.tanh,
          "add": np.add, "multiply": np.multiply, "maximum": np.maximum}


def _argmax_inputs(text: str, x: np.ndarray) -> dict[str, tuple[np.ndarray, int]]:
    """For each argmax output of a `_sharing_modules` text, the float64 values it ranks
    and the axis it ranks them along (the generator's ops recomputed in NumPy)."""
    values: dict[str, np.ndarray] = {"x": x.astype(np.float64)}
    ranked: dict[str, tuple[np.ndarray, int]] = {}
    for line in text.splitlines():
        if m := re.match(r"  %(v\d+) = f32\[[\d,]+\] (\w+)\(%(\w+)(?:, %(\w+))?\)$", line):
            name, op, a, b = m.groups()
            values[name] = _NUMPY[op](values[a], *([values[b]] if b else []))
        elif m := re.match(r"  %r(\d+) = .* reduce\(%(\w+), .*dimensions=\{(\d)\}", line):
            ranked[f"v{m.group(1)}"] = (values[m.group(2)], int(m.group(3)))
    return ranked


def _check_argmax(got: np.ndarray, wanted: np.ndarray, ranked: np.ndarray, axis: int) -> None:
    """An argmax may pick another index than the evaluator's only where the values it
    ranks tie within the functions' error (tanh and exp are approximations here, a few
    ulp apart from NumPy's): the value at the chosen index must be the row's maximum to
    within 1e-6 of it."""
    rows = np.moveaxis(ranked, axis, -1)
    best = rows.max(axis=-1)
    chosen = np.take_along_axis(rows, got.astype(np.int64)[..., None], axis=-1)[..., 0]
    differ = got != wanted
    assert np.all(chosen[differ] >= best[differ] - 1e-6 * np.abs(best[differ])), (
        got[differ], wanted[differ])


@settings(max_examples=25, deadline=None)
@given(_sharing_modules())
def test_random_sharing_graphs_compile_to_the_evaluator(text: str) -> None:
    dims = parse_module(text).entry.parameters[0].shape.dims
    x = _args(dims)[0] / 4  # exp and sums stay finite
    expected = _flat(evaluate(parse_module(text), x))
    root = parse_module(text).entry.root
    names = [o.name for o in root.operands] if root.opcode == "tuple" else [root.name]
    ranked = _argmax_inputs(text, x)
    results = []
    for threads in (1, 2):
        executable = compile_module(parse_module(text), verify=True, threads=threads,
                                    cache=False)
        actual = executable(x)
        for name, got, wanted in zip(names, actual, expected, strict=True):
            if name in ranked:
                _check_argmax(np.asarray(got), np.asarray(wanted), *ranked[name])
            else:
                assert_close(got, wanted, "reduce")
        results.append(actual)
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


def test_multi_output_loop_kernel_writes_a_leaf_in_place() -> None:
    """exp(x) dies at the two-output loop kernel, which reads it elementwise: a leaf
    takes its buffer, and the kernel (all leaves computed before any is stored) still
    computes what the evaluator does."""
    text = """HloModule in_place
%fused (p: f32[300,257], q: f32[300,257]) -> (f32[300,257], f32[300,257]) {
  %p = f32[300,257] parameter(0)
  %q = f32[300,257] parameter(1)
  %sum = f32[300,257] add(%p, %q)
  %product = f32[300,257] multiply(%p, %q)
  ROOT %both = (f32[300,257], f32[300,257]) tuple(%sum, %product)
}
ENTRY %main (x: f32[300,257], y: f32[300,257]) -> (f32[300,257], f32[300,257]) {
  %x = f32[300,257] parameter(0)
  %y = f32[300,257] parameter(1)
  %e = f32[300,257] exponential(%x)
  %f = (f32[300,257], f32[300,257]) fusion(%e, %y), kind=kLoop, calls=%fused
  %g0 = f32[300,257] get-tuple-element(%f), index=0
  %g1 = f32[300,257] get-tuple-element(%f), index=1
  %n0 = f32[300,257] negate(%g0)
  %n1 = f32[300,257] negate(%g1)
  ROOT %out = (f32[300,257], f32[300,257]) tuple(%n0, %n1)
}
"""
    x, y = _args((300, 257), (300, 257))
    args = [x, np.abs(y)]  # exp(x) + y cancels nowhere: the exp tolerance applies
    executable = compile_module(parse_module(text), pipeline="add-output-copies",
                                cache=False)
    assert any(donor == "e" for donor in executable.assignment.in_place.values())
    expected = _flat(evaluate(parse_module(text), *args))
    for got, wanted in zip(executable(*args), expected, strict=True):
        assert_close(got, wanted, "exponential")


def test_multi_output_leaf_in_place_of_a_temp_vectorizes() -> None:
    """A leaf that takes a dying temp's buffer reads that operand through its own output
    pointer: the optimized loop is vector code with no runtime check of the two pointers
    (which fails when they are one buffer and sends every element down the scalar
    loop), and it computes what the evaluator does."""
    text = """HloModule in_place_temp
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
%fused (p: f32[300,256], q: f32[300,256]) -> (f32[300,256], f32[300,256]) {
  %p = f32[300,256] parameter(0)
  %q = f32[300,256] parameter(1)
  %sum = f32[300,256] add(%p, %q)
  %product = f32[300,256] multiply(%p, %q)
  ROOT %both = (f32[300,256], f32[300,256]) tuple(%sum, %product)
}
ENTRY %main (x: f32[300,256], y: f32[300,256]) -> (f32[300], f32[300]) {
  %x = f32[300,256] parameter(0)
  %y = f32[300,256] parameter(1)
  %e = f32[300,256] exponential(%x)
  %f = (f32[300,256], f32[300,256]) fusion(%e, %y), kind=kLoop, calls=%fused
  %g0 = f32[300,256] get-tuple-element(%f), index=0
  %g1 = f32[300,256] get-tuple-element(%f), index=1
  %zero = f32[] constant(0)
  %r0 = f32[300] reduce(%g0, %zero), dimensions={1}, to_apply=%add
  %r1 = f32[300] reduce(%g1, %zero), dimensions={1}, to_apply=%add
  ROOT %out = (f32[300], f32[300]) tuple(%r0, %r1)
}
"""
    x, y = _args((300, 256), (300, 256))
    args = [x, np.abs(y)]
    executable = compile_module(parse_module(text), pipeline="add-output-copies",
                                cache=False)
    assert re.search(r"%f\{0\} [^\n]* in place of %e", executable.assignment_text)
    task = re.search(r'define internal void @"?kernel\.f\.task"?\(.*?\n}',
                     executable.llvm_ir_optimized, re.S)
    assert task is not None, "no task function of the kernel"
    assert "diff.check" not in task.group(0) and "memcheck" not in task.group(0)
    assert "x float>" in task.group(0)
    expected = _flat(evaluate(parse_module(text), *args))
    for got, wanted in zip(executable(*args), expected, strict=True):
        assert_close(got, wanted, "exponential")


@pytest.mark.parametrize("dims,reduced", [((6, 5, 40), (1, 2)), ((3, 70), (1,)),
                                          ((2, 33, 4), (0, 1))])
def test_variadic_reduce_over_several_dimensions(dims: tuple[int, ...],
                                                 reduced: tuple[int, ...]) -> None:
    """Rows long enough for interleaved lanes, an outer reduced dimension around them,
    and a column form; ties resolved to the lower index either way."""
    x = np.round(_args(dims)[0])  # many ties
    for fused in (True, False):
        _check(_argmax(dims, reduced, fused), [x], "ArgMax")


def test_get_tuple_element_of_a_variadic_reduce_inside_a_kernel() -> None:
    """argmax then a convert, all in one single-output kernel: the reduce's struct is
    taken apart inside the kernel."""
    text = f"""HloModule argmax_convert
{ARGMAX}
%fused (p: f32[64,300]) -> s64[64] {{
  %p = f32[64,300] parameter(0)
  %iota = s32[64,300] iota(), iota_dimension=1
  %low = f32[] constant(-inf)
  %zero = s32[] constant(0)
  %r = (f32[64], s32[64]) reduce(%p, %iota, %low, %zero), dimensions={{1}}, to_apply=%argmax
  %index = s32[64] get-tuple-element(%r), index=1
  ROOT %wide = s64[64] convert(%index)
}}
ENTRY %main (x: f32[64,300]) -> s64[64] {{
  %x = f32[64,300] parameter(0)
  ROOT %f = s64[64] fusion(%x), kind=kLoop, calls=%fused
}}
"""
    x = _args((64, 300))[0]
    executable = compile_module(parse_module(text), verify=True, cache=False)
    assert executable.kernel_count == 1
    np.testing.assert_array_equal(executable(x)[0], np.argmax(x, axis=1))
