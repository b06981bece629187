"""exp of a nonpositive argument (`math.exp(..., nonpositive=True)`) and the row kernels
that use it (softmax's exp(x - max(x)), `row_kernel._nonpositive_exponentials`), in
a loop interleaved by two.

The form drops exp's upper clamp, so it must give the general exp's bits for every
argument the row kernel can hand it: every float32 <= 0, -inf and NaN. The row kernel
must use it only where the argument is proven nonpositive, and softmax's output must
not change by a bit.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from codegen_helpers import build, naive_assignment
from test_row_kernel import softmax
from tolerances import assert_close

from tfxla_lite.codegen import Executable, compile_module, cpu
from tfxla_lite.codegen.cpu import math, row_kernel
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape

# exp's upper clamp (89.0) as LLVM prints it in optimized IR.
_UPPER_CLAMP = re.compile(r"fcmp ogt .*float.*8\.900000e\+01")
_LOWER_CLAMP = re.compile(r"fcmp olt .*float.*-1\.040000e\+02")


def _exp_kernel(shape: Shape, nonpositive: bool, monkeypatch: pytest.MonkeyPatch
                ) -> Executable:
    """The unfused `exponential` of `shape`, through the general exp or the nonpositive
    form, compiled without the caches (the HLO is the same for both)."""
    with monkeypatch.context() as patch:
        if nonpositive:
            patch.setitem(math.F32_FUNCTIONS, "exponential",
                          functools.partial(math.exp, nonpositive=True))
        module = build("exp", [shape], lambda c, ps: [c.create("exponential", ps)])
        executable = cpu.compile(module, naive_assignment(module), threads=1, cache=False)
    ir_text = executable.llvm_ir_optimized
    assert bool(_UPPER_CLAMP.search(ir_text)) != nonpositive
    assert _LOWER_CLAMP.search(ir_text)
    return executable


def _same_bits(general: Executable, nonpositive: Executable, patterns: np.ndarray) -> None:
    x = patterns.view(np.float32)
    expected, actual = general(x)[0], nonpositive(x)[0]
    differ = expected.view(np.uint32) != actual.view(np.uint32)
    assert not differ.any(), (x[differ][:5], expected[differ][:5], actual[differ][:5])


_CHUNK = 1 << 24


def _nonpositive_patterns() -> list[tuple[int, int]]:
    """Bit ranges [low, high) of every float32 <= 0 or NaN: +0, the positive NaNs, and
    all patterns with the sign bit (-0 to -inf, the negative NaNs)."""
    return [(0, 1), (0x7F800001, 0x80000000), (0x80000000, 1 << 32)]


@pytest.mark.slow
def test_nonpositive_exp_is_the_general_exp_on_every_nonpositive_float(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shape = Shape("f32", (_CHUNK,))
    general = _exp_kernel(shape, False, monkeypatch)
    nonpositive = _exp_kernel(shape, True, monkeypatch)
    for low, high in _nonpositive_patterns():
        for start in range(low, high, _CHUNK):
            patterns = np.arange(start, start + _CHUNK, dtype=np.uint64)
            patterns = np.minimum(patterns, high - 1).astype(np.uint32)
            _same_bits(general, nonpositive, patterns)


def test_nonpositive_exp_is_the_general_exp_on_a_dense_sweep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Every 61st nonpositive bit pattern, every pattern whose result is denormal or
    # rounds to 0 or 1 at the ends (-87.34 to -103.98, -104 and below, near -0), and
    # the special values.
    def bits(value: float) -> int:
        return int(np.array(value, np.float32).view(np.uint32))

    sweep = [np.arange(0x80000000, 1 << 32, 61, dtype=np.uint64),
             np.arange(bits(-87.0), bits(-105.0), dtype=np.uint64),
             np.arange(0x80000000, 0x80000000 + (1 << 20), dtype=np.uint64),
             np.arange(bits(-1e-6), bits(-1e-6) + (1 << 16), dtype=np.uint64),
             np.arange(0x7F800001, 0x80000000, 4099, dtype=np.uint64),
             np.array([0, 0x80000000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
                       0xFFFFFFFF, bits(-104.0), bits(-103.97208), bits(-103.97209),
                       bits(-87.33655), 0x80000001, 0x807FFFFF], dtype=np.uint64)]
    patterns = np.concatenate(sweep).astype(np.uint32)
    shape = Shape("f32", patterns.shape)
    _same_bits(_exp_kernel(shape, False, monkeypatch), _exp_kernel(shape, True, monkeypatch),
               patterns)


# -- the row kernel -------------------------------------------------------------------------

def _check(module: HloModule, args: list[np.ndarray]) -> Executable:
    """Compile through the pipeline with the caches off (a cached kernel emits nothing)
    and compare with the evaluator."""
    expected = evaluate(module, *args)
    executable = compile_module(module, cache=False)
    assert_close(executable(*args)[0], np.asarray(expected[0]), "Softmax")
    return executable


def _softmax_inputs(dims: tuple[int, int], dtype: np.dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(dims) * 30).astype(dtype)
    big = np.finfo(dtype).max
    x[0] = -np.inf  # -inf - -inf: NaN
    x[1, :3] = np.inf  # inf - inf: NaN, the rest -inf
    x[2, 5] = np.nan
    x[3] = 0.0
    x[4] = -0.0
    x[5] = np.finfo(dtype).smallest_subnormal
    x[6, ::2] = -big  # x - max overflows to -inf
    x[7] = big
    x[8, 1] = 200.0  # the rest far below the max: exp rounds to 0 or is denormal
    return x


@pytest.mark.parametrize("dims", [(16, 1024), (12, 100), (9, 7)])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_softmax_uses_the_nonpositive_exp_with_the_same_bits(
        dims: tuple[int, int], dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    shape = Shape(dtype, dims)
    x = _softmax_inputs(dims, shape.numpy_dtype, seed=dims[1])
    module = build("softmax", [shape], lambda c, p: softmax(c, p[0]))
    found = []
    monkeypatch.setattr(row_kernel, "_nonpositive_exponentials",
                        lambda plan, insts: found.append(_REAL(plan, insts)) or found[-1])
    new = _check(module, [x])
    assert found and all(len(f) == 1 for f in found)
    if dtype == "f32":
        assert not _UPPER_CLAMP.search(new.llvm_ir_optimized)
    if dtype == "f32" and dims[1] == 1024:  # the exp loop interleaved: two vectors a turn
        # LLVM picks the vector width per CPU (256 bits on Emerald Rapids, 512 on others)
        vectors = re.findall(r"call <(\d+) x float> @llvm\.ldexp", new.llvm_ir_optimized)
        assert len(vectors) == 2 and int(vectors[0]) >= 8
    monkeypatch.setattr(row_kernel, "_nonpositive_exponentials", lambda plan, insts: [])
    module = build("softmax", [shape], lambda c, p: softmax(c, p[0]))
    old = compile_module(module, cache=False)
    if dtype == "f32":
        assert _UPPER_CLAMP.search(old.llvm_ir_optimized)
    np.testing.assert_array_equal(new(x)[0].view(np.uint16 if dtype == "f16" else np.uint32),
                                  old(x)[0].view(np.uint16 if dtype == "f16" else np.uint32))


_REAL = row_kernel._nonpositive_exponentials


def _peak(comp: Computation, x: Instruction, kind: str = "maximum") -> Instruction:
    assert comp.module is not None
    reducer = comp.module.reduction_computation(kind, x.shape.element_type)
    start = comp.add_constant(float("-inf") if kind == "maximum" else float("inf"),
                              x.shape.element_type)
    peak = comp.create("reduce", [x, start], called_computations=[reducer], dimensions=(1,))
    return comp.create("broadcast", [peak], shape=x.shape, dimensions=(0,))


def _normalized(comp: Computation, argument: Instruction) -> Instruction:
    """exp(argument) / its row sum: a row fusion whose exp is `argument`'s."""
    exponentials = comp.create("exponential", [argument])
    assert comp.module is not None
    reducer = comp.module.reduction_computation("add", "f32")
    total = comp.create("reduce", [exponentials, comp.add_constant(0.0, "f32")],
                        called_computations=[reducer], dimensions=(1,))
    back = comp.create("broadcast", [total], shape=exponentials.shape, dimensions=(0,))
    return comp.create("divide", [exponentials, back])


# Arguments not proven nonpositive: the max of another array, a min, the reversed
# difference, a sum.
UNPROVEN = {
    "max of another row": lambda c, x, y: c.create("subtract", [x, _peak(c, y)]),
    "min": lambda c, x, y: c.create("subtract", [x, _peak(c, x, "minimum")]),
    "reversed": lambda c, x, y: c.create("subtract", [_peak(c, x), x]),
    "plus the max": lambda c, x, y: c.create("add", [x, _peak(c, x)]),
}


@pytest.mark.parametrize("case", sorted(UNPROVEN))
def test_unproven_arguments_keep_the_general_exp(case: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shape = Shape("f32", (8, 256))
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape.dims) * 40).astype(np.float32)
    y = (rng.standard_normal(shape.dims) * 40).astype(np.float32)
    x[0, 0], y[1, 1] = 95.0, -np.inf
    found = []
    monkeypatch.setattr(row_kernel, "_nonpositive_exponentials",
                        lambda plan, insts: found.append(_REAL(plan, insts)) or found[-1])
    module = build("exp_row", [shape, shape],
                   lambda c, p: _normalized(c, UNPROVEN[case](c, p[0], p[1])))
    executable = _check(module, [x, y])
    assert found and not any(found)
    assert _UPPER_CLAMP.search(executable.llvm_ir_optimized)


def test_logistic_keeps_its_bits_with_the_nonpositive_exp(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """logistic takes exp(-|x|) through the nonpositive form (-|x| <= 0 or NaN): the same
    bits as through the general exp, over every 1021st float32 pattern and the edges."""
    shape = Shape("f32", (1 << 22,))
    general_exp = math.exp

    def kernel(general: bool) -> Executable:
        with monkeypatch.context() as patch:
            if general:
                patch.setattr(math, "exp", lambda ctx, x, nonpositive=False:
                              general_exp(ctx, x))
            module = build("logistic", [shape], lambda c, ps: [c.create("logistic", ps)])
            executable = cpu.compile(module, naive_assignment(module), threads=1, cache=False)
        assert bool(_UPPER_CLAMP.search(executable.llvm_ir_optimized)) == general
        return executable

    general, nonpositive = kernel(True), kernel(False)
    patterns = (np.arange(1 << 22, dtype=np.uint64) * 1021 % (1 << 32)).astype(np.uint32)
    edges = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 1,
                      0x80000001, 0x42B20000, 0xC2B20000, 0x42D00000, 0xC2D00000],
                     dtype=np.uint32)
    patterns[:edges.size] = edges
    _same_bits(general, nonpositive, patterns)
