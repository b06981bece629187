"""The StableHLO export's text, structurally (no JAX, no TF): one golden module, every op
family's spelling, tuples flattened, exact constants, refusals by name, the CLI verb.
test_stablehlo_jax.py (slow) has JAX's MLIR bindings parse, verify and run it."""
# ruff: noqa: E501  (XLA prints each instruction on one line, however long)

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from test_linalg_and_bit_ops import XLA_TEXT
from xla_dump_texts import ASYNC_WRAPPERS, JAX_LOWERED

from tfxla_lite import cli
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.stablehlo import (
    StableHloError,
    dense_literal,
    module_to_stablehlo,
    tensor_type,
)

GOLDEN_HLO = """\
HloModule golden

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (x: f32[2,3], y: u8[3]) -> (f32[2], pred[2,3]) {
  %x = f32[2,3]{1,0} parameter(0)
  %y = u8[3]{0} parameter(1)
  %zero = f32[] constant(0)
  %sum = f32[2]{0} reduce(f32[2,3]{1,0} %x, f32[] %zero), dimensions={1}, to_apply=%add
  %big = f32[2,3]{1,0} broadcast(f32[] %zero), dimensions={}
  %lt = pred[2,3]{1,0} compare(f32[2,3]{1,0} %x, f32[2,3]{1,0} %big), direction=LT
  ROOT %out = (f32[2]{0}, pred[2,3]{1,0}) tuple(f32[2]{0} %sum, pred[2,3]{1,0} %lt)
}
"""

GOLDEN_STABLEHLO = """\
module @golden {
  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xui8>) -> (tensor<2xf32>, tensor<2x3xi1>) {
    %v1 = "stablehlo.constant"() <{value = dense<"0x00000000"> : tensor<f32>}> : () -> tensor<f32>
    %v5 = "stablehlo.reduce"(%arg0, %v1) <{dimensions = array<i64: 1>}> ({
    ^bb0(%v2: tensor<f32>, %v3: tensor<f32>):
      %v4 = "stablehlo.add"(%v2, %v3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%v4) : (tensor<f32>) -> ()
    }) : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    %v6 = "stablehlo.broadcast_in_dim"(%v1) <{broadcast_dimensions = array<i64>}> : (tensor<f32>) -> tensor<2x3xf32>
    %v7 = "stablehlo.compare"(%arg0, %v6) <{compare_type = #stablehlo<comparison_type FLOAT>, comparison_direction = #stablehlo<comparison_direction LT>}> : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    "func.return"(%v5, %v7) : (tensor<2xf32>, tensor<2x3xi1>) -> ()
  }
}
"""


def test_golden_module() -> None:
    assert module_to_stablehlo(parse_module(GOLDEN_HLO)) == GOLDEN_STABLEHLO


def _ops(text: str) -> list[str]:
    return re.findall(r'"((?:stablehlo|chlo|func)\.[a-z_]+)"', text)


def test_linear_algebra_bits_and_tuples() -> None:
    text = module_to_stablehlo(parse_module(XLA_TEXT))
    ops = _ops(text)
    for op in ("stablehlo.cholesky", "stablehlo.triangular_solve", "stablehlo.reduce_precision",
               "stablehlo.bitcast_convert", "stablehlo.rng_bit_generator",
               "stablehlo.get_dimension_size", "stablehlo.optimization_barrier"):
        assert op in ops, op
    assert "transpose_a = #stablehlo<transpose ADJOINT>" in text
    assert "rng_algorithm = #stablehlo<rng_algorithm DEFAULT>" in text
    assert "exponent_bits = 8 : i32, mantissa_bits = 7 : i32" in text
    # The rng's two results, the barrier's flattened pair; tuples leave no trace.
    assert re.search(r'%v\d+:2 = "stablehlo.rng_bit_generator"', text)
    assert re.search(r'"stablehlo.optimization_barrier"\(%v\d+, %v\d+\) : \(tensor<2x3x3xf32>, '
                     r'tensor<2x3x4xf32>\) -> \(tensor<2x3x3xf32>, tensor<2x3x4xf32>\)', text)
    assert "tuple" not in text
    # set-dimension-size is the value itself; four results, as the HLO root's leaves.
    assert "set_dimension_size" not in text
    assert re.search(r'"func.return"\(%v\d+#0, %v\d+#1, %v\d+#1, %v\d+\) : \(tensor<2x3x3xf32>, '
                     r'tensor<2x3x4xf32>, tensor<5xui32>, tensor<i32>\)', text)


def test_jax_module_with_its_tables() -> None:
    text = module_to_stablehlo(parse_module(JAX_LOWERED))
    assert text.startswith("module @") and '"func.return"' in text
    assert len(re.findall(r"^  func\.func public @main", text, re.M)) == 1


@pytest.mark.parametrize("array, shape, literal", [
    (np.array([1.0, 2.0], np.float32), Shape("f32", (2,)),
     'dense<"0x0000803F00000040"> : tensor<2xf32>'),
    (np.full((2, 2), np.nan, np.float64), Shape("f64", (2, 2)),
     'dense<"0x000000000000F87F"> : tensor<2x2xf64>'),
    (np.array([True, False]), Shape("pred", (2,)), "dense<[true, false]> : tensor<2xi1>"),
    (np.array(True), Shape("pred", ()), "dense<true> : tensor<i1>"),
    (np.zeros((0, 3), np.int32), Shape("s32", (0, 3)), "dense<> : tensor<0x3xi32>"),
    (np.array([-1], np.int8), Shape("s8", (1,)), 'dense<"0xFF"> : tensor<1xi8>'),
])
def test_dense_literals_are_exact(array: np.ndarray, shape: Shape, literal: str) -> None:
    assert dense_literal(array, shape) == literal


def test_element_types() -> None:
    spelled = [tensor_type(Shape(t, (2,))) for t in ("pred", "s8", "u16", "u64", "bf16", "f16")]
    assert spelled == ["tensor<2xi1>", "tensor<2xi8>", "tensor<2xui16>", "tensor<2xui64>",
                       "tensor<2xbf16>", "tensor<2xf16>"]
    assert tensor_type(Shape("f32", ())) == "tensor<f32>"


def test_refuses_opcodes_by_name() -> None:
    with pytest.raises(StableHloError, match="not supported in StableHLO export: copy-start"):
        module_to_stablehlo(parse_module(ASYNC_WRAPPERS))
    smallest = parse_module("HloModule m\n\nENTRY %e {\n  %x = f32[5]{0} parameter(0)\n"
                            "  ROOT %t = (f32[2]{0}, s32[2]{0}) topk(f32[5]{0} %x), k=2, "
                            "largest=false\n}\n")
    with pytest.raises(StableHloError, match="topk with largest=false"):
        module_to_stablehlo(smallest)


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "golden.hlo"
    path.write_text(GOLDEN_HLO)
    assert cli.main(["export-stablehlo", str(path)]) == 0
    assert capsys.readouterr().out == GOLDEN_STABLEHLO
    out = tmp_path / "golden.mlir"
    assert cli.main(["export-stablehlo", str(path), "-p", "simplify,dce", "-o", str(out)]) == 0
    assert out.read_text().startswith("module @golden {")
    wrappers = tmp_path / "async.hlo"
    wrappers.write_text(ASYNC_WRAPPERS)
    assert cli.main(["export-stablehlo", str(wrappers), "--no-verify"]) == cli.EXIT_ERROR
    assert "not supported in StableHLO export: copy-start" in capsys.readouterr().err
    assert cli.main(["export-stablehlo", str(wrappers)]) == cli.EXIT_ERROR
    assert "not supported: copy-start" in capsys.readouterr().err
