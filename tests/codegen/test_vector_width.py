"""The `prefer_vector_width` option: it reaches LLVM's target machine and the kernel
cache's keys, and the code of either width computes the same bits (codegen/cpu/engine.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest

from tfxla_lite import flags
from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu import engine, kernel_cache
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.options import Options, OptionsError

AVX512 = "+avx512f" in engine.host_description()["features"].split(",")
needs_avx512 = pytest.mark.skipif(not AVX512, reason="the preference applies to AVX-512 CPUs")


@pytest.fixture(autouse=True)
def fresh_options(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(flags.ENVIRONMENT_VARIABLE, raising=False)
    flags.PROCESS_OPTIONS.reset()
    yield
    flags.PROCESS_OPTIONS.reset()


def _module(body: str, computations: str = "") -> str:
    return f"HloModule m\n{computations}\nENTRY e {{\n{body}\n}}\n"


ADD = "add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT s = f32[] add(a, b) }"
MAX = "max { a = f32[] parameter(0) b = f32[] parameter(1) ROOT s = f32[] maximum(a, b) }"
CASES = {
    "tanh": _module("p = f32[4099] parameter(0)\nROOT t = f32[4099] tanh(p)"),
    "logistic_exp": _module("p = f32[4099] parameter(0)\nl = f32[4099] logistic(p)\n"
                            "x = f32[4099] exponential(p)\nROOT m = f32[4099] multiply(l, x)"),
    "half_tanh": _module("p = f16[1027] parameter(0)\nROOT t = f16[1027] tanh(p)"),
    "row_sum": _module("p = f32[67,1031] parameter(0)\nz = f32[] constant(0)\n"
                       "ROOT r = f32[67] reduce(p, z), dimensions={1}, to_apply=add", ADD),
    "column_sum": _module("p = f32[1031,67] parameter(0)\nz = f32[] constant(0)\n"
                          "ROOT r = f32[67] reduce(p, z), dimensions={0}, to_apply=add", ADD),
    "softmax": _module(
        "p = f32[33,517] parameter(0)\nninf = f32[] constant(-inf)\nz = f32[] constant(0)\n"
        "m = f32[33] reduce(p, ninf), dimensions={1}, to_apply=max\n"
        "mb = f32[33,517] broadcast(m), dimensions={0}\nd = f32[33,517] subtract(p, mb)\n"
        "x = f32[33,517] exponential(d)\n"
        "s = f32[33] reduce(x, z), dimensions={1}, to_apply=add\n"
        "sb = f32[33,517] broadcast(s), dimensions={0}\nROOT o = f32[33,517] divide(x, sb)",
        ADD + "\n" + MAX),
    "dot": _module("a = f32[19,133] parameter(0)\nb = f32[133,71] parameter(1)\n"
                   "ROOT d = f32[19,71] dot(a, b), lhs_contracting_dims={1}, "
                   "rhs_contracting_dims={0}"),
}


def _arguments(text: str) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    arrays = []
    for parameter in parse_module(text).entry.parameters:
        dtype = np.float16 if parameter.shape.element_type == "f16" else np.float32
        values = rng.standard_normal(parameter.shape.dims) * 4
        flat = values.reshape(-1)
        flat[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-30][:flat.size]
        arrays.append(values.astype(dtype))
    return arrays


def _compile(text: str, width: str, threads: int = 1) -> object:
    flags.set_options(prefer_vector_width=width)
    return compile_module(parse_module(text), cache="off", threads=threads)


def test_option_is_checked_and_parsed() -> None:
    assert Options().prefer_vector_width == "auto"
    with pytest.raises(OptionsError, match="prefer_vector_width"):
        Options(prefer_vector_width="1024")
    assert flags.parse_flags("--prefer_vector_width=512") == {"prefer_vector_width": "512"}
    with pytest.raises(ValueError, match="prefer_vector_width"):
        engine.vector_width("wide")


@needs_avx512
def test_setting_reaches_target_features() -> None:
    host = engine.host_description()["features"]
    assert engine.target_features("256") == host + ",+prefer-256-bit"
    assert engine.target_features("512") == host + ",-prefer-256-bit"
    cpu = engine.host_description()["cpu"]
    expected = "512" if cpu in engine.AUTO_512_CPUS else "llvm"
    assert engine.vector_width("auto") == expected
    flags.set_options(prefer_vector_width="256")
    assert engine.vector_width() == "256"
    assert engine.target_features() == host + ",+prefer-256-bit"


def test_without_avx512_the_features_are_the_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_host_cpu", lambda: ("x86_64-unknown-linux-gnu",
                                                      "znver3", "+avx2,+fma"))
    for width in ("auto", "256", "512"):
        assert engine.vector_width(width) == "llvm"
        assert engine.target_features(width) == "+avx2,+fma"


@needs_avx512
def test_compiled_code_uses_the_preferred_width() -> None:
    """The loop vectorizer's widest float vector in the optimized module follows the
    option: 8 lanes at 256 bits, 16 at 512."""
    widths = {}
    for width in ("256", "512"):
        code = _compile(CASES["tanh"], width).llvm_ir_optimized
        widths[width] = max(int(n) for n in re.findall(r"<(\d+) x float>", code))
    assert widths == {"256": 8, "512": 16}


@needs_avx512
def test_cache_keys_differ_between_widths() -> None:
    def key() -> str:
        return kernel_cache.kernel_fingerprint("HloModule m", "assignment", (), 1, "c")

    keys = {}
    for width in ("256", "512"):
        flags.set_options(prefer_vector_width=width)
        keys[width] = key()
    assert keys["256"] != keys["512"]
    # Memory cache: the code compiled under one width is not served for the other.
    text = CASES["tanh"].replace("4099", "4111")
    flags.set_options(prefer_vector_width="256")
    compile_module(parse_module(text), cache="memory", threads=1)
    again = compile_module(parse_module(text), cache="memory", threads=1)
    flags.set_options(prefer_vector_width="512")
    other = compile_module(parse_module(text), cache="memory", threads=1)
    assert "<16 x float>" in other.llvm_ir_optimized
    assert "<16 x float>" not in again.llvm_ir_optimized


@needs_avx512
@pytest.mark.parametrize("name", sorted(CASES))
def test_both_widths_compute_the_same_bits(name: str) -> None:
    """No fast-math flag lets LLVM reorder a floating-point reduction, so the width
    changes how many lanes run at once, never the result; for any thread count."""
    arguments = _arguments(CASES[name])
    results = [[np.asarray(r) for r in _compile(CASES[name], width, threads)(*arguments)]
               for width in ("256", "512") for threads in (1, 2)]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
