"""The GPU element generators of bitcast-convert, reduce-precision and the pass-through
ops (codegen/gpu/bit_ops.py), and the dynamic padder's modules on the GPU backend: their
CUDA compiles with nvcc, and on the CPU emulator (`cuda_emulator`, through the whole
`GpuExecutable`) their results are the evaluator's, bit for bit where the result is
bits: every float type's edge values (NaN, infinities, -0.0, values past a narrower
format's range, subnormals), every width pair of bitcast-convert, and formats down to
no mantissa bits."""

from __future__ import annotations

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from gpu_checks import assert_matches, edge_arguments, element_type
from hlo_builders import flatten

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.codegen.gpu.nvcc import DEFAULT_ARCHES, batch_source, check_ptx, find_nvcc
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")


def _reduce_precision(etype: str, exponent: int, mantissa: int) -> str:
    return f"""HloModule reduce_precision
ENTRY %main (x: {etype}[37]) -> {etype}[37] {{
  %x = {etype}[37]{{0}} parameter(0)
  %n = {etype}[37]{{0}} negate({etype}[37]{{0}} %x)
  ROOT %r = {etype}[37]{{0}} reduce-precision({etype}[37]{{0}} %n),
    exponent_bits={exponent}, mantissa_bits={mantissa}
}}
"""


def _bitcast(source: str, target: str, source_dims: str, target_dims: str) -> str:
    """x's bits as `target`, and back. Back from f16/bf16 is not checked: their values
    compute in float, which keeps no signaling NaN (docs/gpu.md)."""
    if target in ("f16", "bf16"):
        return f"""HloModule bitcast_convert
ENTRY %main (x: {source}[{source_dims}]) -> {target}[{target_dims}] {{
  %x = {source}[{source_dims}] parameter(0)
  ROOT %b = {target}[{target_dims}] bitcast-convert({source}[{source_dims}] %x)
}}
"""
    return f"""HloModule bitcast_convert
ENTRY %main (x: {source}[{source_dims}]) -> ({target}[{target_dims}], {source}[{source_dims}]) {{
  %x = {source}[{source_dims}] parameter(0)
  %b = {target}[{target_dims}] bitcast-convert({source}[{source_dims}] %x)
  %back = {source}[{source_dims}] bitcast-convert({target}[{target_dims}] %b)
  ROOT %t = ({target}[{target_dims}], {source}[{source_dims}]) tuple(%b, %back)
}}
"""


REDUCE_PRECISION = {
    "f32_to_f16": _reduce_precision("f32", 5, 10),
    "f32_to_bf16": _reduce_precision("f32", 8, 7),
    "f32_to_e4m3": _reduce_precision("f32", 4, 3),
    "f32_no_mantissa": _reduce_precision("f32", 8, 0),
    "f64_to_f32": _reduce_precision("f64", 8, 23),
    "f64_to_e5m2": _reduce_precision("f64", 5, 2),
    "f16_to_e5m2": _reduce_precision("f16", 5, 2),
    "f16_wider_format": _reduce_precision("f16", 8, 23),
    "bf16_to_e4m3": _reduce_precision("bf16", 4, 3),
}
BITCASTS = {
    "f32_u32": _bitcast("f32", "u32", "5,3", "5,3"),
    "f64_s64": _bitcast("f64", "s64", "7", "7"),
    "f16_s16": _bitcast("f16", "s16", "9", "9"),
    "bf16_u16": _bitcast("bf16", "u16", "9", "9"),
    "f32_u16_pieces": _bitcast("f32", "u16", "3,5", "3,5,2"),
    "f64_u8_pieces": _bitcast("f64", "u8", "4", "4,8"),
    "f16_s8_pieces": _bitcast("f16", "s8", "6", "6,2"),
    "s32_bf16_pieces": _bitcast("s32", "bf16", "2,3", "2,3,2"),
}
PASS_THROUGH = """HloModule pass_through
ENTRY %main (x: f32[4,6]) -> (f32[4,6], s32[]) {
  %x = f32[4,6]{1,0} parameter(0)
  %size = s32[] get-dimension-size(f32[4,6]{1,0} %x), dimensions={1}
  %same = f32[4,6]{1,0} set-dimension-size(f32[4,6]{1,0} %x, s32[] %size), dimensions={1}
  %barrier = f32[4,6]{1,0} opt-barrier(f32[4,6]{1,0} %same)
  %twice = f32[4,6]{1,0} add(f32[4,6]{1,0} %barrier, f32[4,6]{1,0} %barrier)
  ROOT %t = (f32[4,6]{1,0}, s32[]) tuple(%twice, %size)
}
"""
# Dynamic dimensions, made static by the dynamic padder before the GPU backend: the sum
# and maximum fold the first n elements of each row, the padding masked.
DYNAMIC = """HloModule dynamic
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

ENTRY %main (x: f32[5,40], n: s32[]) -> (f32[5], f32[5], s32[]) {
  %x = f32[5,40]{1,0} parameter(0)
  %n = s32[] parameter(1)
  %d = f32[5,<=40]{1,0} set-dimension-size(f32[5,40]{1,0} %x, s32[] %n), dimensions={1}
  %e = f32[5,<=40]{1,0} exponential(f32[5,<=40]{1,0} %d)
  %zero = f32[] constant(0)
  %low = f32[] constant(-inf)
  %sum = f32[5]{0} reduce(f32[5,<=40]{1,0} %e, f32[] %zero), dimensions={1}, to_apply=%add
  %top = f32[5]{0} reduce(f32[5,<=40]{1,0} %d, f32[] %low), dimensions={1}, to_apply=%max
  %size = s32[] get-dimension-size(f32[5,<=40]{1,0} %e), dimensions={1}
  ROOT %t = (f32[5]{0}, f32[5]{0}, s32[]) tuple(%sum, %top, %size)
}
"""
MODULES = {**REDUCE_PRECISION, **BITCASTS, "pass_through": PASS_THROUGH, "dynamic": DYNAMIC}


def _exact(actual: list[np.ndarray], expected: list[np.ndarray], what: str) -> None:
    """Bit for bit, except a NaN's payload in a float result: values compute in their
    compute type, and an f16/bf16 NaN stored from float comes out quiet."""
    assert len(actual) == len(expected), what
    for n, (got, wanted) in enumerate(zip(actual, expected, strict=True)):
        got, wanted = np.asarray(got), np.asarray(wanted)
        assert got.dtype == wanted.dtype and got.shape == wanted.shape, (what, n)
        if element_type(got.dtype) is not None:
            with np.errstate(invalid="ignore"):  # casting NaN from bf16 warns
                nan, got_nan = np.isnan(wanted.astype(np.float64)), np.isnan(got.astype(np.float64))
            np.testing.assert_array_equal(got_nan, nan, err_msg=what)
            got, wanted = got[~nan], wanted[~nan]
        assert got.tobytes() == wanted.tobytes(), (what, n, got, wanted)


@needs_gxx
@pytest.mark.parametrize("name", sorted({**REDUCE_PRECISION, **BITCASTS}))
def test_gpu_bit_ops_match_the_evaluator_bit_for_bit(emulated: fake_cupy.Recorder,
                                                    name: str) -> None:
    module = parse_module(MODULES[name])
    args = edge_arguments(module, seed=3)
    expected = flatten(evaluate(module, *args))
    got = compile_module(parse_module(MODULES[name]), verify=True).run_numpy(*args)
    _exact(got, expected, name)
    assert emulated.launches


@needs_gxx
def test_gpu_pass_through_ops(emulated: fake_cupy.Recorder) -> None:
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    got = compile_module(parse_module(PASS_THROUGH), verify=True).run_numpy(x)
    _exact(got, [x + x, np.array(6, np.int32)], "pass_through")


@needs_gxx
@pytest.mark.parametrize("n", [0, 1, 17, 40])
def test_gpu_dynamic_reductions_match_the_evaluator(emulated: fake_cupy.Recorder,
                                                    n: int) -> None:
    """The padding holds NaN and +inf: a fold that read it would show it."""
    x = np.random.default_rng(n).normal(size=(5, 40)).astype(np.float32)
    padded = x.copy()
    padded[:, n:] = np.nan
    padded[1, n:] = np.inf
    expected = flatten(evaluate(parse_module(DYNAMIC), x, np.int32(n)))
    got = compile_module(parse_module(DYNAMIC), verify=True).run_numpy(padded, np.int32(n))
    assert_matches(got, expected, f"dynamic n={n}")


def test_gpu_emits_no_dynamic_dimension_ops() -> None:
    """The padder ran first: the kernels know static shapes only."""
    program, _, texts = emit_module(parse_module(DYNAMIC), verify=True)
    assert "<=" in texts[0] and "<=" not in texts[1]
    assert "dimension-size" not in texts[1]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit)")
def test_gpu_bit_ops_compile_with_nvcc() -> None:
    bodies = {name: emit_module(parse_module(text), verify=True)[0].body
              for name, text in MODULES.items()}
    source = batch_source(bodies, {"f16", "bf16"})
    for arch in DEFAULT_ARCHES:
        result = check_ptx({"batch": source}, arch)
        assert result.ok, f"nvcc -arch={arch}:\n{result.output[:8000]}"
