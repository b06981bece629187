"""Golden text of XLA's HLO format as the printer writes it."""

from __future__ import annotations

import numpy as np
from hlo_builders import new_module, parameters, reduce, reduce_sum_x_plus_y_times_z

from tfxla_lite.hlo.printer import format_literal, instruction_to_text
from tfxla_lite.hlo.shape import Shape


def test_reduce_sum_module_text() -> None:
    assert reduce_sum_x_plus_y_times_z(Shape("f32", (4, 8))).to_text() == """\
HloModule reduce_sum, entry_computation_layout={(f32[4,8]{1,0}, f32[4,8]{1,0}, f32[4,8]{1,0})->f32[]}

%add_f32 (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(f32[] %x, f32[] %y)
}

ENTRY %main (param_0: f32[4,8], param_1: f32[4,8], param_2: f32[4,8]) -> f32[] {
  %param_0 = f32[4,8]{1,0} parameter(0)
  %param_1 = f32[4,8]{1,0} parameter(1)
  %param_2 = f32[4,8]{1,0} parameter(2)
  %multiply = f32[4,8]{1,0} multiply(f32[4,8]{1,0} %param_1, f32[4,8]{1,0} %param_2)
  %add = f32[4,8]{1,0} add(f32[4,8]{1,0} %param_0, f32[4,8]{1,0} %multiply)
  %constant = f32[] constant(0)
  ROOT %reduce = f32[] reduce(f32[4,8]{1,0} %add, f32[] %constant), dimensions={0,1}, to_apply=%add_f32
}
"""  # noqa: E501


def test_attributes_and_metadata() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, Shape("f32", (2, 3)))
    t = comp.create("transpose", [x], dimensions=(1, 0),
                    metadata={"op_type": "Transpose", "op_name": "model/t",
                              "source_file": "m.py", "source_line": 7})
    s = comp.create("slice", [t], slice=((0, 3, 2), (1, 2, 1)))
    b = comp.create("broadcast", [x], shape=Shape("f32", (4, 2, 3)), dimensions=(1, 2))
    c = comp.create("compare", [x, x], direction="LT")
    comp.root = comp.create("tuple", [s, b, c])
    assert instruction_to_text(t) == (
        '%transpose = f32[3,2]{1,0} transpose(f32[2,3]{1,0} %param_0), dimensions={1,0}, '
        'metadata={op_type="Transpose" op_name="model/t" source_file="m.py" source_line=7}')
    assert instruction_to_text(s).endswith("slice={[0:3:2], [1:2]}")
    assert instruction_to_text(b).endswith("dimensions={1,2}")
    assert instruction_to_text(c).endswith("direction=LT")
    assert instruction_to_text(comp.root, long_operands=False) == (
        "%tuple = (f32[2,1]{1,0}, f32[4,2,3]{2,1,0}, pred[2,3]{1,0}) "
        "tuple(%slice, %broadcast, %compare)")


def test_literals() -> None:
    assert format_literal(np.array([[1, 2], [3, 4]], np.int32), "s32") == "{ { 1, 2 }, { 3, 4 } }"
    assert format_literal(np.array([np.nan, -np.inf, -0.0, 0.1], np.float32), "f32") == \
        "{ nan, -inf, -0, 0.100000001 }"
    assert format_literal(np.array(True), "pred") == "true"
    assert format_literal(np.zeros(100, np.float32), "f32") == "{...}"


def test_reduce_with_own_names_prints_callee_first() -> None:
    module, comp = new_module("m")
    (x,) = parameters(comp, Shape("s32", (5,)))
    comp.root = reduce(comp, x, (0,), "maximum", np.iinfo(np.int32).min)
    text = module.to_text()
    assert text.index("%maximum_s32 (") < text.index("ENTRY %main")
    assert "constant(-2147483648)" in text
