"""Data-movement and source opcodes (broadcast, reshape, transpose, slice, concatenate,
iota, constant), fused with elementwise consumers and unfused, against the evaluator."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_helpers import as_args, build, check

from tfxla_lite.hlo.shape import Shape


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("element_type", ["f32", "s32", "pred", "f64"])
def test_broadcast(element_type: str, fused: bool) -> None:
    shapes = [Shape(element_type, ()), Shape(element_type, (3,)), Shape(element_type, (1, 4)),
              Shape(element_type, (0,)), Shape(element_type, (2, 3))]

    def body(c, ps):  # type: ignore[no-untyped-def]
        def bcast(p, dims, out):  # type: ignore[no-untyped-def]
            return c.create("broadcast", [p], shape=Shape(element_type, out), dimensions=dims)
        return [bcast(ps[0], (), (2, 5)), bcast(ps[1], (1,), (4, 3)),
                bcast(ps[1], (0,), (3, 2, 5)), bcast(ps[2], (0, 2), (1, 3, 4)),
                bcast(ps[3], (1,), (2, 0)), bcast(ps[4], (2, 0), (3, 4, 2)),
                bcast(ps[0], (), ())]

    check(build("broadcast", shapes, body), as_args(shapes, seed=2), "broadcast", fused)


@pytest.mark.parametrize("fused", [True, False])
def test_reshape_bitcast_transpose(fused: bool) -> None:
    x = Shape("f32", (2, 3, 4))
    y = Shape("f32", (0, 5))

    def body(c, ps):  # type: ignore[no-untyped-def]
        reshaped = c.create("reshape", [ps[0]], shape=Shape("f32", (6, 4)))
        return [
            c.create("negate", [reshaped]),
            c.create("bitcast", [ps[0]], shape=Shape("f32", (24,))),
            c.create("transpose", [ps[0]], dimensions=(2, 0, 1)),
            c.create("transpose", [reshaped], dimensions=(1, 0)),
            c.create("reshape", [c.create("transpose", [ps[0]], dimensions=(1, 2, 0))],
                     shape=Shape("f32", (3, 8))),
            c.create("transpose", [ps[1]], dimensions=(1, 0)),
            c.create("reshape", [ps[1]], shape=Shape("f32", (5, 0, 2))),
        ]

    check(build("movement", [x, y], body), as_args([x, y]), "transpose", fused)


@pytest.mark.parametrize("fused", [True, False])
def test_slice(fused: bool) -> None:
    x = Shape("s32", (7, 9))

    def body(c, ps):  # type: ignore[no-untyped-def]
        return [c.create("slice", ps, slice=((1, 6, 2), (0, 9, 3))),
                c.create("slice", ps, slice=((0, 7, 1), (4, 5, 1))),
                c.create("slice", ps, slice=((3, 3, 1), (0, 9, 1))),
                c.create("add", [c.create("slice", ps, slice=((0, 3, 1), (0, 3, 1))),
                                 c.create("slice", ps, slice=((4, 7, 1), (6, 9, 1)))])]

    check(build("slice", [x], body), as_args([x], low=-100, high=100), "slice", fused)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("element_type", ["f32", "pred"])
def test_concatenate(element_type: str, fused: bool) -> None:
    shapes = [Shape(element_type, (2, 3)), Shape(element_type, (2, 0)),
              Shape(element_type, (2, 5)), Shape(element_type, (4, 3))]

    def body(c, ps):  # type: ignore[no-untyped-def]
        return [c.create("concatenate", ps[:3], dimensions=(1,)),
                c.create("concatenate", [ps[0], ps[3], ps[0]], dimensions=(0,)),
                c.create("concatenate", [ps[1], ps[1]], dimensions=(1,))]

    check(build("concatenate", shapes, body), as_args(shapes, seed=4), "concatenate", fused)


@pytest.mark.parametrize("element_type", ["s32", "f32", "u8", "f64"])
def test_iota(element_type: str) -> None:
    def body(c, ps):  # type: ignore[no-untyped-def]
        results = []
        for dims, axis in (((5,), 0), ((3, 4), 1), ((3, 4), 0), ((2, 0), 1)):
            iota = c.create("iota", shape=Shape(element_type, dims), iota_dimension=axis)
            results.append(iota)
        first = results[0]
        results.append(c.create("add", [first, c.create("convert", ps,
                                                          element_type=element_type)]))
        return results

    x = Shape("s32", (5,))
    check(build("iota", [x], body), as_args([x], low=0, high=3), "iota")


def test_constants() -> None:
    """Scalar constants become immediates, array constants read-only globals."""
    x = Shape("f32", (2, 3))
    table = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    flags = np.array([True, False, True])

    def body(c, ps):  # type: ignore[no-untyped-def]
        scale = c.create("broadcast", [c.add_constant(1.5, "f32")], shape=x, dimensions=())
        pred = c.create("broadcast", [c.add_constant(flags)], shape=Shape("pred", (2, 3)),
                        dimensions=(1,))
        scaled = c.create("multiply", [ps[0], scale])
        return [c.create("add", [scaled, c.add_constant(table)]),
                c.create("select", [pred, ps[0], scaled])]

    executable = check(build("constants", [x], body), as_args([x]), "add")
    assert "internal unnamed_addr constant" in executable.llvm_ir


def test_entry_level_constant_output() -> None:
    """A constant or parameter that is an output is copied (add-output-copies or memcpy)."""
    x = Shape("f32", (3,))
    module = build("const_out", [x], lambda c, ps: [c.add_constant(np.ones(3, np.float32)),
                                                   ps[0], c.create("negate", ps)])
    args = as_args([x])
    check(module, args, "copy")
    module = build("const_out", [x], lambda c, ps: [c.add_constant(np.ones(3, np.float32)),
                                                   ps[0], c.create("negate", ps)])
    check(module, args, "copy", fused=False)


def test_fused_mixed_kernel() -> None:
    """Softmax-like: broadcast + reduce + elementwise, one row fusion (`fuse-rows`)."""
    x = Shape("f32", (4, 6))

    def body(c, ps):  # type: ignore[no-untyped-def]
        reducer = c.module.reduction_computation("maximum", "f32")
        init = c.add_constant(-np.inf, "f32")
        row_max = c.create("reduce", [ps[0], init], dimensions=(1,),
                           called_computations=[reducer])
        shifted = c.create("subtract", [ps[0], c.create("broadcast", [row_max], shape=x,
                                                          dimensions=(0,))])
        exp = c.create("exponential", [shifted])
        adder = c.module.reduction_computation("add", "f32")
        total = c.create("reduce", [exp, c.add_constant(0.0, "f32")], dimensions=(1,),
                         called_computations=[adder])
        return [c.create("divide", [exp, c.create("broadcast", [total], shape=x,
                                                    dimensions=(0,))])]

    executable = check(build("softmax", [x], body), as_args([x], edges=False), "exponential")
    assert executable.kernel_count == 1
