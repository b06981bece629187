"""compare with type=TOTALORDER (XLA's total order of floats: -NaN < -inf < ... < -0.0 <
+0.0 < ... < inf < +NaN), evaluated and compiled, every direction, f16/f32/f64."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from codegen_helpers import compile_unfused

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.printer import module_to_text

DIRECTIONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
              "GT": np.greater, "GE": np.greater_equal}


def _ordered_values(dtype: np.dtype) -> np.ndarray:
    """Distinct values in increasing total order."""
    nan = np.array(np.nan, dtype)
    negative_nan = np.copysign(nan, np.array(-1, dtype))
    values = [negative_nan, -np.inf, -2.5, -1e-3, -0.0, 0.0, 1e-3, 2.5, np.inf, nan]
    return np.array(values, dtype)


@pytest.mark.parametrize("element_type", ["f16", "f32", "f64"])
@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_total_order_compare(element_type: str, direction: str) -> None:
    dtype = np.dtype({"f16": np.float16, "f32": np.float32, "f64": np.float64}[element_type])
    ordered = _ordered_values(dtype)
    assert np.signbit(ordered[0]) and np.isnan(ordered[0]) and not np.signbit(ordered[-1])
    pairs = list(itertools.product(range(len(ordered)), repeat=2))
    a = np.array([ordered[i] for i, _ in pairs], dtype)
    b = np.array([ordered[j] for _, j in pairs], dtype)
    expected = DIRECTIONS[direction](np.array([i for i, _ in pairs]),
                                     np.array([j for _, j in pairs]))
    n = len(pairs)
    text = f"""HloModule total_order
ENTRY %main (a: {element_type}[{n}], b: {element_type}[{n}]) -> pred[{n}] {{
  %a = {element_type}[{n}] parameter(0)
  %b = {element_type}[{n}] parameter(1)
  ROOT %c = pred[{n}] compare(%a, %b), direction={direction}, type=TOTALORDER
}}
"""
    module = parse_module(text)
    assert "type=TOTALORDER" in module_to_text(module)
    np.testing.assert_array_equal(evaluate(module, a, b), expected)
    np.testing.assert_array_equal(compile_unfused(parse_module(text))(a, b)[0], expected)
    np.testing.assert_array_equal(compile_module(parse_module(text), cache=False)(a, b)[0],
                                  expected)
