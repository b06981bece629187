"""The HLO that XLA and JAX print today, through the parser: module header attributes,
stack-frame tables, XLA's metadata keys and attributes, tiled and memory-space layouts,
async and copy wrappers. Computable modules are checked against NumPy and round-trip;
opcodes nothing can run give "not supported: <opcode>"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hlo_builders import reduce_sum_x_plus_y_times_z
from hypothesis import given, settings
from hypothesis import strategies as st
from xla_dump_texts import ASYNC_WRAPPERS, JAX_LOWERED, XLA_SCHEDULED

from tfxla_lite import cli
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.parser import ParseError, parse_module
from tfxla_lite.hlo.printer import RawAttribute, module_to_text
from tfxla_lite.hlo.stack_frames import StackFrameIndex
from tfxla_lite.hlo.verifier import VerificationError, verify


def _assert_fixed_point(text: str) -> str:
    module = parse_module(text)
    printed = module_to_text(module)
    for long_operands in (True, False):
        once = module_to_text(parse_module(printed), long_operands=long_operands)
        assert module_to_text(parse_module(once), long_operands=long_operands) == once
    assert module_to_text(parse_module(printed)) == printed
    return printed


def _instruction(module, name: str):
    return next(i for c in module.computations for i in c.instructions if i.name == name)


def test_jax_lowered_module_parses_verifies_and_computes() -> None:
    module = parse_module(JAX_LOWERED)
    verify(module)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    t, s = evaluate(module, x, w)
    expected = np.tanh(x.astype(np.float64) @ w)
    np.testing.assert_allclose(t, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, expected.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_scheduled_dump_with_tiled_layouts_parses_verifies_and_computes() -> None:
    module = parse_module(XLA_SCHEDULED)
    verify(module)
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    scale = np.arange(8, dtype=np.float32) / 4
    out = evaluate(module, x, scale)
    np.testing.assert_allclose(out, np.exp(x * scale).reshape(32), rtol=1e-6)


@pytest.mark.parametrize("text", [JAX_LOWERED, XLA_SCHEDULED, ASYNC_WRAPPERS])
def test_print_parse_print_is_a_fixed_point(text: str) -> None:
    _assert_fixed_point(text)


def test_module_header_attributes_are_kept_and_the_entry_layout_recomputed() -> None:
    module = parse_module(XLA_SCHEDULED)
    assert list(module.attributes) == ["is_scheduled", "entry_computation_layout",
                                       "frontend_attributes"]
    assert module.attributes["frontend_attributes"] == '{fingerprint_before_lhs="3f1c"}'
    header = module_to_text(module).split("\n", 1)[0]
    # The IR is row-major: the layout printed back is the module's, without tiles.
    assert header == ('HloModule jit_step, is_scheduled=true, entry_computation_layout='
                      '{(f32[4,8]{1,0}, f32[8]{0})->f32[32]{0}}, '
                      'frontend_attributes={fingerprint_before_lhs="3f1c"}')
    jax_header = module_to_text(parse_module(JAX_LOWERED)).split("\n", 1)[0]
    assert "allow_spmd_sharding_propagation_to_output={true,false}" in jax_header


def test_stack_frame_tables_resolve_frames_and_print_back() -> None:
    module = parse_module(JAX_LOWERED)
    frames = module.stack_frames
    assert frames is not None
    assert frames.file_names[0] == "/home/user/model.py"
    assert frames.location(2) == ("/home/user/model.py", 12, "f")
    assert frames.location(3) == ("/home/user/model.py", 13, "f")
    assert frames.location(1) == ("/home/user/model.py", 20, "<module>")
    assert frames.location(4) is None
    assert _instruction(module, "reduce.11").metadata["stack_frame_id"] == 3
    printed = module_to_text(module)
    # Where XLA prints them: after the header, before the first computation.
    assert printed.index("FileNames\n1 \"/home/user/model.py\"") < printed.index("%region_0.7")
    assert "3 {file_location_id=3 parent_frame_id=1}" in printed


def test_tables_after_the_computations_are_read_too() -> None:
    head, tables_and_rest = JAX_LOWERED.split("\nFileNames\n", 1)
    tables, rest = tables_and_rest.split("\nregion_0.7", 1)
    moved = head + "\nregion_0.7" + rest + "\nFileNames\n" + tables
    module = parse_module(moved)
    assert module.stack_frames is not None and module.stack_frames.location(2)[1] == 12
    assert module_to_text(module) == module_to_text(parse_module(JAX_LOWERED))


@pytest.mark.parametrize("old, new, message", [
    ("2 {file_location_id=1 parent_frame_id=1}", "2 {file_location_id=9 parent_frame_id=1}",
     "file_location_id=9 is not an id in FileLocations"),
    ("3 {file_location_id=3 parent_frame_id=1}", "3 {file_location_id=3 parent_frame_id=7}",
     "parent_frame_id=7 is not an id in StackFrames"),
    ('2 "<module>"', '3 "<module>"', "FunctionNames ids count from 1 in order"),
    ("stack_frame_id=3}\n}", "stack_frame_id=4}\n}", "stack_frame_id=4 is not a frame"),
    ("line=13 end_line", "line=x end_line", "FileLocations entry 3 takes key=integer"),
    ("\nStackFrames\n", "\nFileNames\n", "the FileNames table is given twice"),
    ('1 "f"', "1 f", "expected a string"),
])
def test_malformed_tables_are_parse_errors(old: str, new: str, message: str) -> None:
    assert old in JAX_LOWERED
    with pytest.raises(ParseError, match=message):
        parse_module(JAX_LOWERED.replace(old, new, 1))


def test_verifier_errors_name_the_source_line_of_the_stack_frame() -> None:
    text = JAX_LOWERED.replace("tanh.4 = f32[2,4]{1,0} tanh(dot.3)",
                               "tanh.4 = f32[2,4]{1,0} tanh-ish(dot.3)")
    with pytest.raises(VerificationError, match="not supported: tanh-ish") as error:
        verify(parse_module(text))
    assert "from TF op jit(f)/tanh (?) at /home/user/model.py:12" in str(error.value)


def test_metadata_keys_are_kept_verbatim() -> None:
    module = parse_module(XLA_SCHEDULED)
    metadata = _instruction(module, "multiply.1").metadata
    assert metadata == {"op_name": "jit(step)/mul", "stack_frame_id": 1,
                        "deduplicated_name": "multiply", "scheduling_name": "multiply.1"}
    assert _instruction(module, "exponential.1").metadata["preserve_layout"] == "true"
    text = ('HloModule m\nENTRY e {\n  ROOT p = f32[] parameter(0), metadata={op_type="A" '
            'op_name="a=\\"b\\"" profile_type={1,2} source_line=4 source_column=2 '
            'custom_key=word}\n}\n')
    metadata = parse_module(text).entry.root.metadata
    assert metadata["op_name"] == 'a="b"'
    assert isinstance(metadata["profile_type"], RawAttribute)
    assert metadata["source_column"] == 2 and metadata["custom_key"] == "word"
    printed = _assert_fixed_point(text)
    assert ('metadata={op_type="A" op_name="a=\\"b\\"" source_line=4 source_column=2 '
            'profile_type={1,2} custom_key=word}') in printed
    with pytest.raises(ParseError, match="metadata op_type given twice"):
        parse_module(text.replace('op_name="a', 'op_type="a'))


def test_xla_attributes_are_kept_verbatim() -> None:
    module = parse_module(XLA_SCHEDULED)
    fusion = _instruction(module, "fusion")
    assert fusion.attributes["statistics"] == "{visualizing_index=1,stat-1=33,stat-2=44}"
    assert fusion.attributes["backend_config"].startswith('{"flag_configs":[]')
    assert _instruction(module, "Arg_0.1").attributes["origin"] == '{{"x"}}'
    jax = parse_module(JAX_LOWERED)
    assert _instruction(jax, "tuple.13").attributes["sharding"] == \
        "{{replicated}, {maximal device=0}}"
    custom = _instruction(parse_module(ASYNC_WRAPPERS), "custom-call")
    assert custom.attributes["custom_call_target"] == '"my_ffi"'
    assert custom.attributes["api_version"] == "API_VERSION_TYPED_FFI"
    assert custom.attributes["operand_layout_constraints"] == "{f32[4]{0}}"


def test_bitcast_that_only_moves_memory_space_keeps_its_meaning() -> None:
    module = parse_module(XLA_SCHEDULED)
    bitcast = _instruction(module, "bitcast.2")
    assert bitcast.opcode == "bitcast" and bitcast.shape == bitcast.operand(0).shape


@pytest.mark.parametrize("source, target", [
    ("f32[4,8]{1,0:T(8,128)}", "f32[32]{0}"),  # tiles regrouped into a row-major vector
    ("f32[4,8]{1,0:T(8,128)}", "f32[4,8]{1,0:T(2,128)}"),  # other tiles
    ("f32[4,8]{1,0:T(8,128)}", "f32[4,8]{0,1:T(8,128)}"),  # other order, same tiles
    ("f32[4,8]{1,0}", "f32[4,8]{1,0:E(16)}"),  # element size
])
def test_bitcast_across_tiled_layouts_is_not_supported(source: str, target: str) -> None:
    text = (f"HloModule m\nENTRY e {{\n  p = {source} parameter(0)\n"
            f"  ROOT b = {target} bitcast(p)\n}}\n")
    with pytest.raises(ParseError, match="not supported: bitcast between tiled layouts"):
        parse_module(text)
    # Without the tiles the row-major rules apply, and the same text parses.
    plain = text.replace(":T(8,128)", "").replace(":T(2,128)", "").replace(":E(16)", "")
    parse_module(plain)


def test_bitcast_of_one_tiled_element_is_a_reshape() -> None:
    text = ("HloModule m\nENTRY e {\n  p = f32[]{:T(128)} parameter(0)\n"
            "  ROOT b = f32[1,1]{1,0:T(2,128)} bitcast(p)\n}\n")
    module = parse_module(text)
    np.testing.assert_array_equal(evaluate(module, np.float32(3)), [[3]])


def test_tiled_layouts_elsewhere_are_read_and_dropped() -> None:
    text = ("HloModule m\nENTRY e {\n  p = f32[3,5]{0,1:T(2,128)(2,1)E(32)S(2)} parameter(0)\n"
            "  s = f32[]{:T(128)} constant(2)\n"
            "  b = f32[3,5]{0,1:T(2,128)} broadcast(s), dimensions={}\n"
            "  ROOT m = f32[3,5]{1,0} multiply(p, b)\n}\n")
    module = parse_module(text)
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    np.testing.assert_array_equal(evaluate(module, x), 2 * x)
    with pytest.raises(ParseError, match="expected '}' closing a layout"):
        parse_module(text.replace("E(32)S(2)}", "E(32)S(2)\n"))


def test_async_and_copy_wrappers_parse_and_the_verifier_names_them() -> None:
    module = parse_module(ASYNC_WRAPPERS)
    start = _instruction(module, "async-start")
    assert start.attributes["calls"] == "%wrapped_negate"
    assert start.attributes["async_execution_thread"] == '"parallel_thread"'
    wrapped = next(c for c in module.computations if c.name == "wrapped_negate")
    assert wrapped.attributes == {"execution_thread": '"parallel_thread"'}
    assert '}, execution_thread="parallel_thread"\n' in module_to_text(module)
    assert _instruction(module, "copy-done").operand(0).opcode == "copy-start"
    with pytest.raises(VerificationError, match="not supported: copy-start"):
        verify(module)


def _run_hlo(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "module.hlo"
    path.write_text(text)
    status = cli.main(["run-hlo", str(path), "--check"])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def test_run_hlo_lists_the_opcodes_nothing_runs(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    status, output = _run_hlo(tmp_path, ASYNC_WRAPPERS, capsys)
    assert status == cli.EXIT_ERROR
    assert "not supported: copy-start, copy-done, async-start, async-done, custom-call" \
        in output


WHILE_TEXT = """HloModule w
%cond (c: s32[]) -> pred[] {
  %c = s32[] parameter(0)
  %k = s32[] constant(3)
  ROOT %lt = pred[] compare(%c, %k), direction=LT
}
%body (b: s32[]) -> s32[] {
  %b = s32[] parameter(0)
  %one = s32[] constant(1)
  ROOT %add = s32[] add(%b, %one)
}
ENTRY %main (p: s32[]) -> s32[] {
  %p = s32[] parameter(0)
  ROOT %w = s32[] while(%p), condition=%cond, body=%body
}
"""


def test_run_hlo_compiles_a_while_loop(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    status, output = _run_hlo(tmp_path, WHILE_TEXT, capsys)
    assert status == 0, output
    assert "check: 1 output(s) match the evaluator" in output


def test_run_hlo_names_an_opcode_the_cpu_backend_lacks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Every opcode the evaluator runs compiles today, so the backend's refusal is staged:
    # the CLI must turn it into `not supported: <opcode>`, not a traceback.
    import tfxla_lite.codegen as codegen

    def refuse(*args: object, **kwargs: object) -> None:
        raise NotImplementedError("CPU backend: opcode 'while' is not supported here")

    monkeypatch.setattr(codegen, "compile_module", refuse)
    status, output = _run_hlo(tmp_path, WHILE_TEXT, capsys)
    assert status == cli.EXIT_ERROR
    assert "not supported: while" in output


def test_run_hlo_compiles_a_jax_module_and_matches_the_evaluator(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, output = _run_hlo(tmp_path, JAX_LOWERED, capsys)
    assert status == 0, output
    assert "check: 2 output(s) match the evaluator" in output


@pytest.mark.parametrize("shape, message", [
    ("token[]", "not supported: unknown element type 'token'"),
    ("c64[2]", "not supported: unknown element type 'c64'"),
    ("f32[?]", "not supported: unbounded dynamic dimensions"),
])
def test_types_the_ir_lacks_are_named(shape: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_module(f"HloModule m\nENTRY e {{\n  ROOT p = {shape} parameter(0)\n}}\n")


# -- the new structures survive print → parse exactly ---------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@st.composite
def _modules_with_xla_notes(draw: st.DrawFn) -> HloModule:
    """reduce_sum(x + y * z) carrying random stack-frame tables, header and computation
    attributes and metadata of every kind the parser keeps."""
    module = reduce_sum_x_plus_y_times_z()
    files = draw(st.lists(_TEXT, min_size=1, max_size=3))
    functions = draw(st.lists(_TEXT, min_size=1, max_size=3))
    locations = draw(st.lists(st.builds(
        lambda f, g, line: {"file_name_id": f, "function_name_id": g, "line": line,
                            "end_line": line},
        st.integers(1, len(files)), st.integers(1, len(functions)), st.integers(0, 10**6)),
        min_size=1, max_size=3))
    frames: list[dict[str, int]] = []
    for _ in range(draw(st.integers(1, 4))):
        frames.append({"file_location_id": draw(st.integers(1, len(locations))),
                       "parent_frame_id": draw(st.integers(0, len(frames)))})
    module.stack_frames = StackFrameIndex(files, functions, locations, frames)
    module.attributes = draw(st.dictionaries(
        st.sampled_from(("is_scheduled", "alias_passthrough_params", "frontend_attributes",
                         "allow_spmd_sharding_propagation_to_output", "num_partitions")),
        st.sampled_from(("true", "{true}", '{a="b,c"}', "2", "{{0,1}}")), max_size=3))
    for comp in module.computations:
        if comp is not module.entry and draw(st.booleans()):
            comp.attributes = {"execution_thread": '"side"'}
        for inst in comp.instructions:
            inst.metadata = draw(st.fixed_dictionaries({}, optional={
                "op_type": _TEXT.filter(bool), "op_name": _TEXT.filter(bool),
                "source_file": _TEXT.filter(bool), "source_line": st.integers(1, 10**6),
                "source_column": st.integers(1, 200),
                "stack_frame_id": st.integers(1, len(frames)),
                "deduplicated_name": _TEXT.filter(bool),
                "preserve_layout": st.just(RawAttribute("true")),
                "profile_type": st.just(RawAttribute("{1,2}"))}))
    return module


@settings(max_examples=80, deadline=None)
@given(_modules_with_xla_notes())
def test_tables_attributes_and_metadata_survive_a_round_trip(module: HloModule) -> None:
    text = module_to_text(module)
    again = parse_module(text)
    assert again.stack_frames == module.stack_frames
    assert again.attributes == {**module.attributes,
                                "entry_computation_layout": again.attributes.get(
                                    "entry_computation_layout")}
    for comp in module.computations:
        twin = next(c for c in again.computations if c.name == comp.name)
        assert twin.attributes == comp.attributes
        for inst, copy in zip(comp.instructions, twin.instructions, strict=True):
            assert copy.metadata == inst.metadata
    assert module_to_text(again) == text
