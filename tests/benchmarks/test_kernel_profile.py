"""benchmarks/kernel_profile.py: every kernel of an executable compiled inside
`profiling()` is counted, labelled (dots by their GEMM schedule), and computes what it
computed without the counters; outside the block nothing is wrapped any more."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import kernel_profile  # noqa: E402
from tfxla_lite.codegen import Executable, compile_module, cpu  # noqa: E402
from tfxla_lite.hlo.ir import HloModule  # noqa: E402
from tfxla_lite.hlo.shape import Shape  # noqa: E402


def _dense_then_sum() -> HloModule:
    """tanh(x @ w) (one kOutput kernel), then its column sums (a reduction kernel)."""
    module = HloModule("profiled")
    comp = module.new_computation("main", entry=True)
    x = comp.add_parameter(0, Shape("f32", (256, 128)))
    w = comp.add_parameter(1, Shape("f32", (128, 96)))
    product = comp.create("dot", [x, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    activated = comp.create("tanh", [product])
    total = comp.create("reduce", [activated, comp.add_constant(0.0, "f32")], dimensions=(0,),
                        called_computations=[module.reduction_computation("add", "f32")])
    comp.root = comp.create("tuple", [activated, total])
    return module


def test_profiled_kernels_are_counted_and_compute_the_same() -> None:
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((256, 128)).astype(np.float32),
            rng.standard_normal((128, 96)).astype(np.float32)]
    plain = compile_module(_dense_then_sum(), cache=False)
    original = cpu.compile
    with kernel_profile.profiling() as profile:
        profiled = compile_module(_dense_then_sum())
    assert cpu.compile is original  # unwrapped again
    assert len(profile.executables) == 1
    profiled(*args)
    profile.reset()
    for _ in range(3):
        results = profiled(*args)
    for got, expected in zip(results, plain(*args), strict=True):
        np.testing.assert_array_equal(got, expected)
    kernels = profile.kernels(calls=3)
    assert len(kernels) == profiled.kernel_count == 2
    dots = [k for k in kernels if k.is_dot]
    assert len(dots) == 1 and "GEMM 256x96x128" in dots[0].label
    assert all(0 < k.min_seconds <= k.total_seconds * 1.000001 for k in kernels)
    assert "kernels: 2;" in kernel_profile.report(kernels, top=5)


def test_a_tiered_compile_is_profiled_as_its_o3_code() -> None:
    """The driver asks for a tiered compile by default; its executable's counters would be
    the quick tier's, which stop at the swap to the O3 code. Inside `profiling()` the O3
    code is compiled at once, and its counters are read."""
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((256, 128)).astype(np.float32),
            rng.standard_normal((128, 96)).astype(np.float32)]
    for flags in ({"tiered": True}, {"background": True}):
        with kernel_profile.profiling() as profile:
            profiled = compile_module(_dense_then_sum(), **flags)
        assert type(profiled) is Executable  # neither tiered nor pending
        profiled(*args)
        profile.reset()
        for _ in range(2):
            profiled(*args)
        kernels = profile.kernels(calls=2)
        assert len(kernels) == 2
        assert all(k.total_seconds > 0 for k in kernels)
