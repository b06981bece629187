"""Ahead-of-time libraries from HLO (`codegen/cpu/aot.py`), without TF: a C program built
with the system compiler against the object and its header computes what the evaluator
does, and needs nothing beyond libc, libm, libgomp and OpenBLAS."""

from __future__ import annotations

import numpy as np
import pytest
from aot_c_program import (
    ALLOWED_SHARED,
    build,
    object_symbols,
    run,
    shared_libraries,
)
from tolerances import assert_close

from tfxla_lite.codegen.cpu.aot import AotError, compile_library, undefined_symbols
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

# A dense layer, a softmax over its rows and a row sum: a dot, reductions, exp, divide.
MLP_SOFTMAX = """HloModule mlp_softmax
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[8,784] parameter(0)
  w = f32[784,128] parameter(1)
  bias = f32[128] parameter(2)
  d = f32[8,128] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  bb = f32[8,128] broadcast(bias), dimensions={1}
  h = f32[8,128] add(d, bb)
  ninf = f32[] constant(-inf)
  m = f32[8] reduce(h, ninf), dimensions={1}, to_apply=max
  mb = f32[8,128] broadcast(m), dimensions={0}
  centered = f32[8,128] subtract(h, mb)
  e = f32[8,128] exponential(centered)
  zero = f32[] constant(0)
  s = f32[8] reduce(e, zero), dimensions={1}, to_apply=add
  sb = f32[8,128] broadcast(s), dimensions={0}
  p = f32[8,128] divide(e, sb)
  total = f32[] reduce(h, zero), dimensions={0,1}, to_apply=add
  ROOT out = (f32[8,128], f32[8], f32[]) tuple(p, m, total)
}
"""

# Big enough that its kernels take the thread team (parallel.PARALLEL_MIN_WORK), with a
# temp buffer between two kernels that cannot fuse (a transpose feeding a reduction).
TEAM_KERNELS = """HloModule team_kernels
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[512,256] parameter(0)
  y = f32[512,256] parameter(1)
  xy = f32[512,256] multiply(x, y)
  t = f32[512,256] tanh(xy)
  zero = f32[] constant(0)
  r = f32[512] reduce(t, zero), dimensions={1}, to_apply=add
  c = f32[512] reduce(t, zero), dimensions={1}, to_apply=add
  ROOT out = (f32[512,256], f32[512], f32[512]) tuple(t, r, c)
}
"""


def _inputs(module_text: str, seed: int = 0) -> list[np.ndarray]:
    module = parse_module(module_text)
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(p.shape.dims).astype(p.shape.numpy_dtype)
              for p in module.entry.parameters]
    arrays[0].reshape(-1)[:4] = [np.nan, np.inf, -np.inf, -0.0]
    return arrays


def _expected(module_text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    result = evaluate(parse_module(module_text), *inputs)
    return list(result) if isinstance(result, tuple) else [result]


@pytest.mark.parametrize("text,name,mode", [
    (MLP_SOFTMAX, "mlp_softmax", "serial"),
    (TEAM_KERNELS, "team", "openmp"),
])
def test_c_program_matches_the_evaluator(tmp_path, text, name, mode):
    library = compile_library(parse_module(text), name, parallel_mode=mode, threads=2)
    program = build(library, tmp_path)
    inputs = _inputs(text)
    results = run(program, library, inputs)
    for got, want in zip(results, _expected(text, inputs), strict=True):
        assert_close(got, want, "dot" if name == "mlp_softmax" else "reduce", name)
    if mode == "openmp":  # the team's size never changes a bit
        for got, again in zip(results, run(program, library, inputs, threads=3), strict=True):
            np.testing.assert_array_equal(got.view(np.uint32), again.view(np.uint32))
    # Nothing outside libc, libm, libgomp (and OpenBLAS when a dot calls it) is needed,
    # and the run function is the one symbol the object exports.
    assert object_symbols(tmp_path / f"{name}.o", "-g", "--defined-only") == [f"{name}_run"]
    needed = object_symbols(tmp_path / f"{name}.o", "-u")
    assert needed == undefined_symbols(library.object_code)
    assert {lib for _, lib in library.symbols} <= {"libc", "libm", "libgcc", "libgomp"}
    assert all(any(s.startswith(a) for a in ALLOWED_SHARED) for s in shared_libraries(program))
    assert ("GOMP_parallel" in needed) == (mode == "openmp")
    assert "libgomp" in library.libraries if mode == "openmp" else "libgomp" not in str(
        shared_libraries(program))
    # One exported definition: the run function.
    header = library.header
    assert f"int {name}_run(const void** inputs, void** outputs, void* temp);" in header
    assert f"#define {name.upper()}_TEMP_BYTES {library.temp_bytes}" in header


def test_header_states_shapes_and_sizes():
    library = compile_library(parse_module(MLP_SOFTMAX), "mlp")
    header = library.header
    assert "#define MLP_NUM_INPUTS 3" in header and "#define MLP_NUM_OUTPUTS 3" in header
    assert "#define MLP_INPUT_BYTES {25088, 401408, 512}" in header
    assert "#define MLP_OUTPUT_BYTES {4096, 32, 4}" in header
    assert "#define MLP_INPUT0_DIMS {8, 784}" in header
    assert "#define MLP_OUTPUT2_RANK 0" in header and "#define MLP_OUTPUT2_DIMS {0}" in header
    assert "typedef float mlp_output1_t;" in header
    assert "#define MLP_TEMP_ALIGNMENT 64" in header


@pytest.mark.parametrize("name,mode,threads,message", [
    ("2fast", "serial", None, "not a C identifier"),
    ("ok", "threads", None, "parallel must be one of serial, openmp"),
    ("ok", "openmp", 0, "thread count must be at least 1, got 0"),
])
def test_bad_arguments_are_refused(name, mode, threads, message):
    with pytest.raises(AotError, match=message):
        compile_library(parse_module(MLP_SOFTMAX), name, parallel_mode=mode, threads=threads)


def test_tuple_parameter_is_refused():
    text = """HloModule tuple_in
ENTRY main {
  p = (f32[2], f32[2]) parameter(0)
  a = f32[2] get-tuple-element(p), index=0
  b = f32[2] get-tuple-element(p), index=1
  ROOT s = f32[2] add(a, b)
}
"""
    with pytest.raises(AotError, match="tuple shape"):
        compile_library(parse_module(text), "tuple_in")


@pytest.mark.slow
def test_library_gemm_links_against_openblas(tmp_path):
    """A dot the emitter hands to the library GEMM needs OpenBLAS, and only that."""
    text = """HloModule gemm
ENTRY main {
  x = f64[256,512] parameter(0)
  w = f64[512,384] parameter(1)
  ROOT d = f64[256,384] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    library = compile_library(parse_module(text), "gemm")
    assert [lib for _, lib in library.symbols] == ["openblas"]
    program = build(library, tmp_path)
    inputs = _inputs(text, seed=1)
    (got,) = run(program, library, inputs)
    assert_close(got, _expected(text, inputs)[0], "dot", "gemm")
    assert all(any(s.startswith(a) for a in ALLOWED_SHARED) for s in shared_libraries(program))
