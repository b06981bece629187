"""float16 and bfloat16 kernels against the NumPy evaluator: bf16 is stored as its 16
high bits and computed in f32, rounded to nearest even after every op (as the
evaluator, which computes bf16 in f32 through ml_dtypes); f16 computes in LLVM's half."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from codegen_helpers import as_args, build, check

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.shape import Shape

BF16 = np.dtype(ml_dtypes.bfloat16)


def _model(c: Computation, ps: list[Instruction]) -> list[Instruction]:
    """relu(x @ w + b), a row softmax with f32 sums, a max-reduce and converts."""
    x, w, bias = ps
    etype = x.shape.element_type
    assert c.module is not None
    y = c.create("dot", [x, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    y = c.create("add", [y, c.create("broadcast", [bias], shape=y.shape, dimensions=(1,))])
    y = c.create("maximum", [y, c.create("broadcast", [c.add_constant(0.0, etype)],
                                         shape=y.shape, dimensions=())])
    e = c.create("exponential", [y])
    wide = c.create("convert", [e], element_type="f32")
    total = c.create("reduce", [wide, c.add_constant(0.0, "f32")],
                     called_computations=[c.module.reduction_computation("add", "f32")],
                     dimensions=(1,))
    total = c.create("convert", [total], element_type=etype)
    softmax = c.create("divide", [e, c.create("broadcast", [total], shape=e.shape,
                                              dimensions=(0,))])
    peak = c.create("reduce", [y, c.add_constant(-np.inf, etype)],
                    called_computations=[c.module.reduction_computation("maximum", etype)],
                    dimensions=(0,))
    return [softmax, peak, c.create("convert", [y], element_type="f64")]


@pytest.mark.parametrize("element_type", ["bf16", "f16"])
@pytest.mark.parametrize("fused", [False, True])
def test_dense_relu_softmax(element_type: str, fused: bool) -> None:
    shapes = [Shape(element_type, (6, 5)), Shape(element_type, (5, 4)),
              Shape(element_type, (4,))]
    check(build("dense", shapes, _model), as_args(shapes, low=-2, high=2), "Softmax",
          fused=fused)


def test_bf16_rounds_to_nearest_even_and_keeps_specials() -> None:
    """Converts from f32 and f64 and an add, on values halfway between bf16 neighbours."""
    halfway = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, np.nan, np.inf,
                        -np.inf, -0.0, 1e-40, 65504.0, 2**-133, 0.0], np.float32)
    f32, f64 = Shape("f32", halfway.shape), Shape("f64", halfway.shape)

    def body(c: Computation, ps: list[Instruction]) -> list[Instruction]:
        a = c.create("convert", [ps[0]], element_type="bf16")
        b = c.create("convert", [ps[1]], element_type="bf16")
        return [a, b, c.create("add", [a, a]), c.create("convert", [a], element_type="f32")]

    module = build("round", [f32, f64], body)
    results = compile_module(module)(halfway, halfway.astype(np.float64))
    want = halfway.astype(BF16)
    for got in results[:2]:
        assert got.dtype == BF16
        np.testing.assert_array_equal(got.view(np.uint16) & 0xFFBF,
                                      want.view(np.uint16) & 0xFFBF)  # quiet bit aside
    with np.errstate(over="ignore"):
        doubled = (want.astype(np.float32) * 2).astype(BF16).astype(np.float32)
    np.testing.assert_array_equal(results[2].astype(np.float32), doubled)
    np.testing.assert_array_equal(results[3], want.astype(np.float32))
    check(module, [halfway, halfway.astype(np.float64)], "convert")
