"""The HLO text parser: XLA's spellings, round trips with the printer, errors, fuzzing."""

from __future__ import annotations

import numpy as np
import pytest
from hlo_builders import (
    check_lines,
    flatten,
    new_module,
    parameters,
    random_arguments,
    reduce,
    reduce_sum_x_plus_y_times_z,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xla_dump_texts import ASYNC_WRAPPERS, JAX_LOWERED, XLA_SCHEDULED

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.parser import ParseError, parse_module
from tfxla_lite.hlo.printer import RawAttribute, module_to_text
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import VerificationError, verify
from tfxla_lite.passes import optimize

# What TF's XLA prints for stage='optimized_hlo' (trimmed): scheduled-module header,
# short-form operands, layouts (one non-default), fusions, frontend attributes.
XLA_OPTIMIZED = """\
HloModule a_inference_f_18__.4, is_scheduled=true, alias_passthrough_params=true, \
entry_computation_layout={(f32[4,8]{1,0}, f32[8,3]{1,0})->(f32[4]{0}, f32[3,4]{1,0})}

%region_0.1 (Softmax.5: f32[], Softmax.6: f32[]) -> f32[] {
  %Softmax.5 = f32[] parameter(0), metadata={op_name="Softmax"}
  %Softmax.6 = f32[] parameter(1), metadata={op_name="Softmax"}
  ROOT %Softmax.7 = f32[] maximum(%Softmax.5, %Softmax.6), metadata={op_type="Softmax" \
op_name="Softmax"}
}

%wrapped_reduce_computation (param_0.7: f32[4,3], param_1.9: f32[]) -> f32[4] {
  %param_0.7 = f32[4,3]{1,0} parameter(0)
  %param_1.9 = f32[] parameter(1)
  ROOT %Softmax.8 = f32[4]{0} reduce(%param_0.7, %param_1.9), dimensions={1}, \
to_apply=%region_0.1, metadata={op_type="Softmax" op_name="Softmax"}
}

%wrapped_copy_computation (param_0.9: f32[3,4]) -> f32[3,4] {
  %param_0.9 = f32[3,4]{0,1} parameter(0)
  ROOT %copy.1 = f32[3,4]{1,0} copy(%param_0.9), metadata={op_name="XLA_Retvals"}
}

ENTRY %a_inference_f_18__.4 (arg0.1: f32[4,8], arg1.1: f32[8,3]) -> (f32[4], f32[3,4]) {
  %arg0.1 = f32[4,8]{1,0} parameter(0), parameter_replication={false}, \
metadata={op_name="XLA_Args"}
  %arg1.1 = f32[8,3]{1,0} parameter(1), parameter_replication={false}, \
metadata={op_name="XLA_Args"}
  %Softmax.28 = f32[] constant(-inf), metadata={op_type="Softmax" op_name="Softmax" \
source_file="/x/ops.py" source_line=1221}
  %matmul.2 = f32[4,3]{1,0} dot(%arg0.1, %arg1.1), lhs_contracting_dims={1}, \
rhs_contracting_dims={0}, frontend_attributes={grad_x="false",grad_y="false"}, \
metadata={op_type="MatMul" op_name="matmul"}
  %wrapped_reduce = f32[4]{0} fusion(%matmul.2, %Softmax.28), kind=kLoop, \
calls=%wrapped_reduce_computation
  %bitcast = f32[3,4]{0,1} bitcast(%matmul.2), metadata={op_type="Transpose" op_name="t"}
  %wrapped_copy = f32[3,4]{1,0} fusion(%bitcast), kind=kLoop, calls=%wrapped_copy_computation
  ROOT %tuple = (f32[4]{0}, f32[3,4]{1,0}) tuple(%wrapped_reduce, %wrapped_copy)
}
"""


def test_xla_optimized_module_parses_verifies_and_computes() -> None:
    module = parse_module(XLA_OPTIMIZED)
    verify(module)
    assert module.name == "a_inference_f_18__.4"
    assert module.entry is not None and module.entry.name == "a_inference_f_18__.4"
    names = {c.name: c for c in module.computations}
    assert names["wrapped_reduce_computation"].is_fusion_computation
    assert not names["region_0.1"].is_fusion_computation
    dot = next(i for i in module.entry.instructions if i.opcode == "dot")
    assert dot.attributes["lhs_contracting_dims"] == (1,)
    assert dot.attributes["frontend_attributes"] == '{grad_x="false",grad_y="false"}'
    assert dot.metadata == {"op_type": "MatMul", "op_name": "matmul"}
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    w = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
    row_max, transposed = evaluate(module, x, w)
    np.testing.assert_allclose(row_max, (x @ w).max(axis=1), rtol=1e-5)
    # The bitcast to layout {0,1} is a transpose of the row-major value.
    np.testing.assert_allclose(transposed, (x @ w).T, rtol=1e-5)


def test_bitcast_between_layouts_becomes_row_major_ops() -> None:
    module = parse_module(XLA_OPTIMIZED)
    entry = module.entry
    assert entry is not None
    bitcast_result = next(i for i in entry.instructions if i.name == "bitcast")
    assert bitcast_result.opcode == "transpose"
    assert bitcast_result.dimensions == (1, 0)
    # A bitcast within default layouts stays a bitcast.
    plain = parse_module("""HloModule m
ENTRY e {
  p = f32[4,3]{1,0} parameter(0)
  ROOT b = f32[2,6]{1,0} bitcast(p)
}""")
    assert plain.entry is not None and plain.entry.root is not None
    assert plain.entry.root.opcode == "bitcast"


@pytest.mark.parametrize("source_layout,target_layout", [
    ("{1,0,2}", "{2,1,0}"), ("{0,1,2}", "{0,2,1}"), ("{2,1,0}", "{1,2,0}"), ("{0,2,1}", "{0,1}"),
])
def test_bitcast_reinterprets_physical_bytes(source_layout: str, target_layout: str) -> None:
    source = tuple(int(d) for d in source_layout.strip("{}").split(","))
    target = tuple(int(d) for d in target_layout.strip("{}").split(","))
    dims_in = (2, 3, 4)
    dims_out = (6, 4) if len(target) == 2 else (4, 2, 3)
    text = f"""HloModule m
ENTRY e {{
  p = f32[2,3,4]{{2,1,0}} parameter(0)
  c = f32[2,3,4]{source_layout} copy(p)
  ROOT b = f32[{','.join(map(str, dims_out))}]{target_layout} bitcast(c)
}}"""
    x = np.arange(24, dtype=np.float32).reshape(dims_in)
    # The bytes of `c` in memory: dims ordered major-to-minor by its layout.
    physical = np.transpose(x, tuple(reversed(source))).reshape(-1)
    order = tuple(reversed(target))
    expected = np.transpose(physical.reshape([dims_out[d] for d in order]),
                            np.argsort(order))
    module = parse_module(text)
    verify(module)
    np.testing.assert_array_equal(evaluate(module, x), expected)


def test_bare_names_comments_default_entry_and_root() -> None:
    module = parse_module("""
HloModule bare  // a comment
add (a: f32[], b: f32[]) -> f32[] {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
main {
  x = f32[2,3]{1,0:T(8,128)} parameter(0)  /* tiled layout, skipped */
  zero = f32[] constant(0)
  n = f32[2,3] negate(f32[2,3]{1,0} x)
  r = f32[2]{0} reduce(n, zero), dimensions={1}, to_apply=add
}""")
    verify(module)
    assert module.entry is not None and module.entry.name == "main"
    assert module.entry.root is not None and module.entry.root.name == "r"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(evaluate(module, x), -x.sum(axis=1))


def test_uses_before_definitions_are_ordered() -> None:
    module = parse_module("""HloModule m
ENTRY e {
  ROOT y = f32[2]{0} negate(x)
  x = f32[2]{0} parameter(0)
}""")
    verify(module)
    assert module.entry is not None
    assert [i.name for i in module.entry.instructions] == ["x", "y"]


def test_unknown_attributes_are_kept_verbatim_and_printed_back() -> None:
    text = """HloModule m, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

ENTRY %e (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0), sharding={replicated}, parameter_replication={false}
  ROOT %c = f32[4]{0} custom-call(f32[4]{0} %p), custom_call_target="foo", \
backend_config={"a":[1,2],"b":"x,y"}, api_version=API_VERSION_STATUS_RETURNING
}
"""
    module = parse_module(text)
    assert module.entry is not None
    root = module.entry.root
    assert root is not None and root.opcode == "custom-call"
    assert isinstance(root.attributes["backend_config"], RawAttribute)
    assert root.attributes["backend_config"] == '{"a":[1,2],"b":"x,y"}'
    assert root.attributes["custom_call_target"] == '"foo"'
    assert module.to_text() == text


def test_unknown_opcode_parses_and_is_reported_by_name() -> None:
    module = parse_module("""HloModule m
ENTRY e {
  p = s32[2]{0} parameter(0)
  ROOT q = s32[2]{0} popcnt(p)
}""")
    with pytest.raises(VerificationError, match="unknown opcode 'popcnt'"):
        verify(module)
    with pytest.raises(NotImplementedError, match="'popcnt'"):
        evaluate(module, np.zeros(2, np.int32))


@pytest.mark.parametrize("literal,element_type,dims,expected", [
    ("1.5", "f32", (), np.float32(1.5)),
    ("-inf", "f32", (), np.float32(-np.inf)),
    ("-0", "f64", (), np.float64(-0.0)),
    ("true", "pred", (), np.True_),
    ("{ { 1, 2 }, { 3, 4 } }", "s32", (2, 2), np.array([[1, 2], [3, 4]], np.int32)),
    ("{1,2,3}", "u8", (3,), np.array([1, 2, 3], np.uint8)),
    ("{true, false}", "pred", (2,), np.array([True, False])),
    ("{ nan, 1e-05, 3.40282347e+38 }", "f32", (3,),
     np.array([np.nan, 1e-5, 3.40282347e38], np.float32)),
    ("{-2147483648, 2147483647}", "s32", (2,), np.array([-2**31, 2**31 - 1], np.int32)),
    ("{}", "f32", (0,), np.zeros((0,), np.float32)),
    ("{ {}, {} }", "f32", (2, 0), np.zeros((2, 0), np.float32)),
])
def test_literals(literal: str, element_type: str, dims: tuple[int, ...],
                  expected: np.ndarray) -> None:
    shape = Shape(element_type, dims)
    module = parse_module(f"HloModule m\nENTRY e {{\n  ROOT c = {shape} constant({literal})\n}}")
    assert module.entry is not None and module.entry.root is not None
    value = module.entry.root.literal
    assert value.dtype == shape.numpy_dtype and value.shape == dims
    np.testing.assert_array_equal(value, expected)
    assert np.signbit(value).tolist() == np.signbit(np.asarray(expected)).tolist()


def test_elided_constants_raise_unless_filled() -> None:
    text = "HloModule m\nENTRY e {\n  ROOT c = f32[2,40]{1,0} constant({...})\n}"
    with pytest.raises(ParseError, match="elided") as info:
        parse_module(text)
    assert (info.value.line, info.value.column) == (3, 36)
    module = parse_module(text, fill_elided_constants=True)
    assert module.entry is not None and module.entry.root is not None
    assert not module.entry.root.literal.any()


# -- errors -------------------------------------------------------------------------------

GOOD = """HloModule m
ENTRY e {
  p = f32[2]{0} parameter(0)
  ROOT n = f32[2]{0} negate(p)
}"""


@pytest.mark.parametrize("old,new,message,line", [
    ("HloModule", "HloModul", "expected 'HloModule'", 1),
    ("negate(p)", "negate(q)", "operand %q is not defined", 4),
    ("negate(p)", "negate(p", "',' or ')' between operands", 5),
    ("f32[2]{0} parameter", "c64[2]{0} parameter", "unknown element type 'c64'", 3),
    ("f32[2]{0} parameter", "f32[?]{0} parameter", "unbounded dynamic dimensions", 3),
    ("f32[2]{0} negate", "f32[2]{1} negate", "not a permutation", 4),
    ("parameter(0)", "parameter(x)", "expected a parameter number", 3),
    ("ROOT n", "ROOT p", "defined twice", 4),
    ("  ROOT n = f32[2]{0} negate(p)\n", "  ROOT n = f32[2]{0} negate(f32[3] p)\n",
     "written as f32[3]{0} but is f32[2]{0}", 4),
    ("negate(p)", "negate(p), metadata={op_type=\"x}", "unterminated string", 4),
    ("negate(p)", "negate(p), dimensions={1,}", "expected an integer", 4),
    ("negate(p)", "negate(p), foo=(", "unbalanced brackets", 5),
    ("negate(p)", "negate(p), to_apply=nowhere", "computation %nowhere is not defined", 4),
    ("parameter(0)", "parameter(1)", "numbered [1], not 0..0", 2),
    ("\n}", "", "expected '}' closing computation %e", 4),
])
def test_errors_point_at_the_text(old: str, new: str, message: str, line: int) -> None:
    with pytest.raises(ParseError) as info:
        parse_module(GOOD.replace(old, new, 1))
    error = info.value
    assert message in str(error)
    assert error.line == line
    # The message shows the line and a caret under the column.
    text_line, caret_line = str(error).splitlines()[1:3]
    assert caret_line.index("^") <= len(text_line)


def test_error_message_format() -> None:
    with pytest.raises(ParseError) as info:
        parse_module(GOOD.replace("negate(p)", "negate(p) junk"))
    assert str(info.value) == (
        "line 4, column 32: expected an attribute or the next instruction, found 'junk'\n"
        "    ROOT n = f32[2]{0} negate(p) junk\n"
        "                                 ^")
    assert isinstance(info.value, ValueError)


def test_cycles_are_errors() -> None:
    with pytest.raises(ParseError, match="cycle"):
        parse_module("HloModule m\nENTRY e {\n  a = f32[] negate(b)\n  ROOT b = f32[] negate(a)\n}")


# -- round trips --------------------------------------------------------------------------

def _assorted_module() -> HloModule:
    """One of nearly every opcode and attribute the printer writes."""
    module, comp = new_module("assorted")
    x, y, i = parameters(comp, Shape("f32", (2, 3)), Shape("f32", (3, 4)), Shape("s32", (2, 3)))
    dot = comp.create("dot", [x, y], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    t = comp.create("transpose", [dot], dimensions=(1, 0),
                    metadata={"op_type": "Transpose", "op_name": 'a/"quoted"\\name',
                              "source_file": "m.py", "source_line": 7})
    s = comp.create("slice", [t], slice=((0, 4, 2), (1, 2, 1)))
    b = comp.create("broadcast", [x], shape=Shape("f32", (4, 2, 3)), dimensions=(1, 2))
    c = comp.create("compare", [x, comp.create("negate", [x])], direction="GE")
    conv = comp.create("convert", [i], element_type="f32")
    sel = comp.create("select", [c, x, conv])
    clamp = comp.create("clamp", [comp.add_constant(-1.0, "f32"), sel,
                                  comp.add_constant(1.0, "f32")])
    iota = comp.create("iota", shape=Shape("s32", (2, 3)), iota_dimension=1)
    cat = comp.create("concatenate", [i, iota], dimensions=(0,))
    consts = [comp.add_constant(np.array([[1.5, -0.0], [np.inf, np.nan]], np.float32)),
              comp.add_constant(np.array([True, False])),
              comp.add_constant(np.arange(6, dtype=np.int64).reshape(2, 3)),
              comp.add_constant(np.array([1e-3, 2.5], np.float16)),
              comp.add_constant(np.float64(np.pi))]
    r = comp.create("reshape", [clamp], shape=Shape("f32", (3, 2)))
    m = reduce(comp, r, (0,), "maximum", -np.inf)
    pair = comp.create("tuple", [m, s])
    gte = comp.create("get-tuple-element", [pair], index=1)
    comp.root = comp.create("tuple", [gte, b, cat, *consts, m])
    return module


def _builder_modules() -> list[HloModule]:
    modules = [reduce_sum_x_plus_y_times_z(), _assorted_module()]
    softmax, comp = new_module("softmax")
    (x,) = parameters(comp, Shape("f32", (4, 8)))
    row_max = reduce(comp, x, (1,), "maximum", -np.inf)
    e = comp.create("exponential", [comp.create(
        "subtract", [x, comp.create("broadcast", [row_max], shape=x.shape, dimensions=(0,))])])
    total = reduce(comp, e, (1,), "add")
    comp.root = comp.create("divide", [e, comp.create("broadcast", [total], shape=x.shape,
                                                      dimensions=(0,))])
    modules.append(softmax)
    return modules


def _assert_fixed_point(module: HloModule) -> None:
    for long_operands in (True, False):
        text = module_to_text(module, long_operands=long_operands, print_large_constants=True)
        again = parse_module(text)
        verify(again)
        assert module_to_text(again, long_operands=long_operands,
                              print_large_constants=True) == text


@pytest.mark.parametrize("index", range(3))
@pytest.mark.parametrize("pipeline", ["", "dce", "dce,fuse,dce,add-output-copies"])
def test_print_parse_print_is_a_fixed_point(index: int, pipeline: str) -> None:
    module = _builder_modules()[index]
    optimize(module, pipeline, verify=True)
    _assert_fixed_point(module)


def test_parsed_module_computes_what_the_original_does() -> None:
    for module in _builder_modules():
        args = random_arguments(module, seed=3)
        if module.name == "assorted":
            args[2] = args[2].astype(np.int32)
        again = parse_module(module_to_text(module, print_large_constants=True))
        for a, b in zip(flatten(evaluate(module, *args)), flatten(evaluate(again, *args))):
            np.testing.assert_array_equal(a, b)


def test_large_constants_round_trip_when_printed() -> None:
    module, comp = new_module("big")
    comp.root = comp.add_constant(np.linspace(-1, 1, 300, dtype=np.float32).reshape(3, 100))
    _assert_fixed_point(module)
    elided = module.to_text()
    check_lines(elided, r"constant\(\{\.\.\.\}\)")
    assert parse_module(elided, fill_elided_constants=True).to_text() == elided


@st.composite
def _random_elementwise_modules(draw: st.DrawFn) -> HloModule:
    module, comp = new_module("random")
    shape = Shape("f32", (3, 4))
    values = parameters(comp, *[shape] * draw(st.integers(1, 3)))
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(("unary", "binary", "reduce", "constant")))
        pick = st.sampled_from(values)
        if kind == "unary":
            values.append(comp.create(draw(st.sampled_from(("negate", "exponential", "tanh"))),
                                      [draw(pick)]))
        elif kind == "binary":
            values.append(comp.create(draw(st.sampled_from(("add", "multiply", "maximum"))),
                                      [draw(pick), draw(pick)]))
        elif kind == "reduce":
            row = reduce(comp, draw(pick), (1,), draw(st.sampled_from(("add", "maximum"))))
            values.append(comp.create("broadcast", [row], shape=shape, dimensions=(0,)))
        else:
            value = draw(st.floats(width=32, allow_nan=True, allow_infinity=True))
            scalar = comp.add_constant(value, "f32")
            values.append(comp.create("add", [draw(pick), comp.create(
                "broadcast", [scalar], shape=shape, dimensions=())]))
    outputs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    comp.root = comp.create("tuple", outputs)
    if draw(st.booleans()):
        optimize(module, verify=True)
    return module


@settings(max_examples=60, deadline=None)
@given(_random_elementwise_modules())
def test_random_modules_round_trip(module: HloModule) -> None:
    _assert_fixed_point(module)


# -- fuzzing: any mutation parses or raises ParseError, nothing else ------------------------

_SEEDS = [XLA_OPTIMIZED, GOOD, _assorted_module().to_text(),
          module_to_text(reduce_sum_x_plus_y_times_z(), long_operands=False),
          JAX_LOWERED, XLA_SCHEDULED, ASYNC_WRAPPERS]
_NOISE = list("{}[]()%=,:;\"\\ \n-.0123456789xTe") + ["->", "{...}", "/*", "ROOT ", "nan",
                                                       "f32[", "s32[]", "pred", "99999999999"]


@st.composite
def _mutations(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(_SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(("delete", "insert", "truncate", "duplicate")))
        if kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 12)):]
        elif kind == "insert":
            text = text[:at] + draw(st.sampled_from(_NOISE)) + text[at:]
        elif kind == "truncate":
            text = text[:at]
        else:
            end = min(len(text), at + draw(st.integers(1, 40)))
            text = text[:at] + text[at:end] + text[at:]
    return text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_mutated_text_parses_or_raises_parse_error(text: str) -> None:
    try:
        module = parse_module(text, fill_elided_constants=True)
    except ParseError as error:
        assert error.line >= 1 and error.column >= 1
        return
    # Whatever parses prints and parses again.
    parse_module(module_to_text(module, print_large_constants=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(_NOISE + ["HloModule", "ENTRY", " a", "b", "=", "f32[2]"]),
                max_size=40))
def test_random_text_raises_only_parse_error(tokens: list[str]) -> None:
    try:
        parse_module("HloModule m\n" + "".join(tokens))
    except ParseError:
        pass


@pytest.mark.parametrize("text", [
    "HloModule m\nENTRY e {\n  ROOT c = f32[99999999999,99999999999]{1,0} constant({...})\n}",
    "HloModule m\nENTRY e {\n  ROOT c = f32[" + ",".join(["1"] * 200) + "] constant({})\n}",
    "HloModule m\nENTRY e {\n  ROOT c = " + "(" * 500 + "f32[]" + ")" * 500 + " tuple()\n}",
])
def test_resource_limits_are_parse_errors(text: str) -> None:
    with pytest.raises(ParseError):
        parse_module(text, fill_elided_constants=True)


# -- print(parse(t)) is a fixed point for every t the parser accepts ------------------------

# Every way an instruction names computations: while, both conditional forms, fusion,
# reduce and call.
CONTROL = """\
HloModule control

%cond (c.p: s32[]) -> pred[] {
  %c.p = s32[] parameter(0)
  %c.k = s32[] constant(3)
  ROOT %c.lt = pred[] compare(%c.p, %c.k), direction=LT
}

%body (b.p: s32[]) -> s32[] {
  %b.p = s32[] parameter(0)
  %b.one = s32[] constant(1)
  ROOT %b.add = s32[] add(%b.p, %b.one)
}

%sum (a.x: f32[], a.y: f32[]) -> f32[] {
  %a.x = f32[] parameter(0)
  %a.y = f32[] parameter(1)
  ROOT %a.add = f32[] add(%a.x, %a.y)
}

%fused (f.p: f32[4]) -> f32[4] {
  %f.p = f32[4]{0} parameter(0)
  ROOT %f.neg = f32[4]{0} negate(%f.p)
}

ENTRY %main (p: s32[], x: f32[4], q: pred[]) -> (s32[], f32[], f32[4], s32[], s32[], s32[]) {
  %p = s32[] parameter(0)
  %x = f32[4]{0} parameter(1)
  %q = pred[] parameter(2)
  %w = s32[] while(%p), condition=%cond, body=%body
  %z = f32[] constant(0)
  %r = f32[] reduce(%x, %z), dimensions={0}, to_apply=%sum
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused
  %c = s32[] conditional(%q, %p, %p), true_computation=%body, false_computation=%body
  %i = s32[] conditional(%p, %p, %p), branch_computations={%body, %body}
  %k = s32[] call(%p), to_apply=%body
  ROOT %t = (s32[], f32[], f32[4]{0}, s32[], s32[], s32[]) tuple(%w, %r, %f, %c, %i, %k)
}
"""

_ROUND_TRIP_CORPUS = [CONTROL, XLA_OPTIMIZED, GOOD, _assorted_module().to_text(),
                      JAX_LOWERED, XLA_SCHEDULED, ASYNC_WRAPPERS]
_COMPUTATION_NAMES = ("%cond", "%body", "%sum", "%fused", "%region_0.1",
                      "%wrapped_reduce_computation")
_CALLED_KEYS = ("to_apply", "calls", "condition", "body", "true_computation",
                "false_computation")
_OPCODES = ("fusion", "while", "conditional", "call", "reduce", "map", "custom-call",
            "negate", "tuple", "sort", "add")


@st.composite
def _attribute_mutations(draw: st.DrawFn) -> str:
    """A corpus module with some instructions' attributes or opcodes changed: called
    computations added, renamed to another role, or given to another opcode; plain
    attributes added."""
    lines = draw(st.sampled_from(_ROUND_TRIP_CORPUS)).split("\n")
    sites = [n for n, line in enumerate(lines) if " = " in line and line.startswith("  ")]
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.sampled_from(sites))
        kind = draw(st.sampled_from(("add", "rename", "opcode", "plain", "layout")))
        name = draw(st.sampled_from(_COMPUTATION_NAMES))
        if kind == "add":
            key = draw(st.sampled_from(_CALLED_KEYS + ("branch_computations",)))
            value = "{%body, " + name + "}" if key == "branch_computations" else name
            lines[n] += f", {key}={value}"
        elif kind == "rename":
            old, new = draw(st.lists(st.sampled_from(_CALLED_KEYS), min_size=2, max_size=2,
                                     unique=True))
            lines[n] = lines[n].replace(f"{old}=", f"{new}=")
        elif kind == "opcode":
            old, new = draw(st.lists(st.sampled_from(_OPCODES), min_size=2, max_size=2,
                                     unique=True))
            lines[n] = lines[n].replace(f" {old}(", f" {new}(")
        elif kind == "layout":  # tiles and memory spaces, which bitcasts care about
            lines[n] = lines[n].replace("{1,0}", draw(st.sampled_from((
                "{1,0:T(8,128)}", "{0,1}", "{1,0:S(1)}", "{1,0:T(2,128)(2,1)E(16)}"))), 1)
        else:
            lines[n] += ", " + draw(st.sampled_from((
                "kind=kLoop", "dimensions={0}", "index=0", "sharding={replicated}",
                'backend_config="x"', "frontend_attributes={a=\"b\"}", "is_stable=true",
                'metadata={op_type="T" op_name="a/b" source_line=3}', "select=" + name,
                'metadata={op_name="j" stack_frame_id=1 scheduling_name="s" preserve_layout=true'
                ' profile_type={1}}', "statistics={visualizing_index=1,stat-1=3}",
                'origin={{"x"}}', "backend_config={\"a\":[{\"b\":1}]}")))
    return "\n".join(lines)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_attribute_mutations())
def test_print_of_any_accepted_text_is_a_fixed_point(text: str) -> None:
    try:
        module = parse_module(text)
    except ParseError:
        return
    for long_operands in (True, False):
        printed = module_to_text(module, long_operands=long_operands,
                                 print_large_constants=True)
        again = module_to_text(parse_module(printed), long_operands=long_operands,
                               print_large_constants=True)
        assert again == printed


def test_corpus_parses_and_is_a_fixed_point() -> None:
    """The mutations start from modules the parser accepts (else the test above would
    only ever see ParseError)."""
    for text in _ROUND_TRIP_CORPUS:
        if text is ASYNC_WRAPPERS:  # parses and prints, but the verifier names its opcodes
            printed = module_to_text(parse_module(text))
            assert module_to_text(parse_module(printed)) == printed
            continue
        _assert_fixed_point(parse_module(text))


@pytest.mark.parametrize(("attributes", "message"), [
    ("kind=kLoop, calls=%fused, to_apply=%sum", "fusion names .* calls=; found to_apply=, calls="),
    ("kind=kLoop, to_apply=%fused", "found to_apply="),
])
def test_called_computations_an_opcode_does_not_take_are_errors(attributes: str,
                                                                message: str) -> None:
    """Once printed as `calls=%fused, %sum`, which the parser then refused."""
    text = CONTROL.replace("kind=kLoop, calls=%fused", attributes)
    with pytest.raises(ParseError, match=message):
        parse_module(text)


@pytest.mark.parametrize(("old", "new"), [
    ("condition=%cond, body=%body", "body=%body"),
    ("condition=%cond, body=%body", "to_apply=%body"),
    ("true_computation=%body, false_computation=%body", "true_computation=%body"),
    ("branch_computations={%body, %body}", "true_computation=%body, false_computation=%body"),
])
def test_incomplete_or_mixed_roles_are_errors(old: str, new: str) -> None:
    with pytest.raises(ParseError):
        parse_module(CONTROL.replace(old, new))


@pytest.mark.parametrize(("old", "new"), [
    ("ROOT %b.add = s32[] add(%b.p, %b.one)", "ROOT %b.add = s32[] call(%b.p), to_apply=%body"),
    ("%c.k = s32[] constant(3)", "%c.k = s32[] call(%c.p), to_apply=%main"),
    # the cycle through while's second callee
    ("%b.one = s32[] constant(1)", "%b.one = s32[] while(%b.p), condition=%cond, body=%body"),
])
def test_recursive_calls_are_errors(old: str, new: str) -> None:
    """A cycle of calls once parsed, and printed its computations in another order each
    time (callees first has no answer for it)."""
    assert old in CONTROL
    with pytest.raises(ParseError, match="calls it back"):
        parse_module(CONTROL.replace(old, new))
