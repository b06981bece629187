"""The GPU kernel of HLO `rng-bit-generator` (codegen/gpu/random_bits.py): its CUDA
compiles with nvcc, and on the CPU emulator (`cuda_emulator`, through the whole
`GpuExecutable`) the bits and the advanced state are the evaluator's bit for bit (the
evaluator being XLA's CPU backend's, checked against TF's XLA in
tests/clustering/test_rules_linalg.py): both algorithms, 2- and 3-word Philox states,
8- to 64-bit outputs, signed and unsigned, scalars, empty outputs, ThreeFry's split
along the first even dimension or the largest odd one, and a counter that carries into
its high word."""

from __future__ import annotations

import cuda_emulator
import fake_cupy
import numpy as np
import pytest

from tfxla_lite.codegen.gpu import compile_module, emit_module
from tfxla_lite.codegen.gpu.nvcc import DEFAULT_ARCHES, batch_source, check_ptx, find_nvcc
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

needs_gxx = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")


def _module(algorithm: str, words: int, etype: str, dims: tuple[int, ...]) -> str:
    bits = f"{etype}[{','.join(map(str, dims))}]"
    return f"""HloModule rng
ENTRY %main (s: u64[{words}]) -> (u64[{words}], {bits}) {{
  %s = u64[{words}]{{0}} parameter(0)
  ROOT %r = (u64[{words}]{{0}}, {bits}) rng-bit-generator(u64[{words}]{{0}} %s),
    algorithm={algorithm}
}}
"""


CASES = [("rng_philox", 3, "u32", (37,)), ("rng_default", 2, "u64", (5, 3)),
         ("rng_philox", 3, "s8", (7, 2)), ("rng_philox", 2, "s16", (3,)),
         ("rng_philox", 3, "s64", ()), ("rng_philox", 3, "u32", (0,)),
         ("rng_three_fry", 2, "u32", (4, 5)), ("rng_three_fry", 2, "u32", (3, 5)),
         ("rng_three_fry", 2, "s32", ()), ("rng_three_fry", 2, "s64", (6,)),
         ("rng_three_fry", 2, "u8", (3, 2, 3)), ("rng_three_fry", 2, "u16", (7,)),
         ("rng_three_fry", 2, "u32", (0, 3))]
STATES = {2: np.array([0x0123456789ABCDEF, 2**64 - 3], np.uint64),
          3: np.array([42, 2**64 - 5, 7], np.uint64)}  # low words about to carry


@needs_gxx
@pytest.mark.parametrize(("algorithm", "words", "etype", "dims"), CASES)
def test_gpu_rng_bit_generator_matches_the_evaluator_bit_for_bit(
        emulated: fake_cupy.Recorder, algorithm: str, words: int, etype: str,
        dims: tuple[int, ...]) -> None:
    text = _module(algorithm, words, etype, dims)
    state = STATES[words]
    want_state, want_bits = evaluate(parse_module(text), state)
    got_state, got_bits = compile_module(parse_module(text), verify=True).run_numpy(state)
    assert got_state.tobytes() == want_state.tobytes()
    assert got_bits.dtype == want_bits.dtype and got_bits.shape == want_bits.shape
    assert got_bits.tobytes() == want_bits.tobytes()


def test_gpu_rng_plans_a_thread_per_counter() -> None:
    program, _, _ = emit_module(parse_module(_module("rng_philox", 3, "u32", (37,))))
    (plan,) = [t.plan for t in program.thunks if t.plan.kind == "random"]
    assert plan.launch is not None and plan.launch.units == 10  # ceil(37 / 4)
    program, _, _ = emit_module(parse_module(_module("rng_three_fry", 2, "u32", (3, 5))))
    (plan,) = [t.plan for t in program.thunks if t.plan.kind == "random"]
    assert plan.launch is not None and plan.launch.units == 9  # halves of [3, 3]
    program, _, _ = emit_module(parse_module(_module("rng_philox", 3, "u32", (0,))))
    (plan,) = [t.plan for t in program.thunks if t.plan.kind == "random"]
    assert plan.launch is not None and plan.launch.units == 1  # the state is still written


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit)")
def test_gpu_rng_kernels_compile_with_nvcc() -> None:
    bodies = {f"rng_{n}": emit_module(parse_module(_module(*case)), verify=True)[0].body
              for n, case in enumerate(CASES)}
    source = batch_source(bodies, set())
    for arch in DEFAULT_ARCHES:
        result = check_ptx({"batch": source}, arch)
        assert result.ok, f"nvcc -arch={arch}:\n{result.output[:8000]}"
