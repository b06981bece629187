"""Small builders of HLO modules by hand, shared by tests/hlo, tests/passes and tests/gpu."""

from __future__ import annotations

import re

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape


def new_module(name: str = "test") -> tuple[HloModule, Computation]:
    module = HloModule(name)
    return module, module.new_computation("main", entry=True)


def parameters(comp: Computation, *shapes: Shape) -> list[Instruction]:
    return [comp.add_parameter(n, shape) for n, shape in enumerate(shapes)]


def reduce(comp: Computation, x: Instruction, dims: tuple[int, ...], kind: str = "add",
           init: float = 0.0) -> Instruction:
    assert comp.module is not None
    element_type = x.shape.element_type
    reducer = comp.module.reduction_computation(kind, element_type)
    zero = comp.add_constant(init, element_type)
    return comp.create("reduce", [x, zero], called_computations=[reducer], dimensions=dims)


def reduce_sum_x_plus_y_times_z(shape: Shape | None = None) -> HloModule:
    """`reduce_sum(x + y*z)` over all dimensions, the fusion showcase."""
    shape = shape or Shape("f32", (4, 8))
    module, comp = new_module("reduce_sum")
    x, y, z = parameters(comp, shape, shape, shape)
    total = comp.create("add", [x, comp.create("multiply", [y, z])])
    comp.root = reduce(comp, total, tuple(range(shape.rank)))
    return module


def argmax_reducer(module: HloModule, element_type: str, name: str) -> Computation:
    """TF's ArgMax reducer over (value, s32 index) pairs, as XLA lowers it: keeps the
    larger value and, on ties, the smaller index."""
    reducer = module.new_computation(name)
    scalar, index = Shape(element_type, ()), Shape("s32", ())
    lhs_value = reducer.add_parameter(0, scalar, "lhs_value")
    lhs_index = reducer.add_parameter(1, index, "lhs_index")
    rhs_value = reducer.add_parameter(2, scalar, "rhs_value")
    rhs_index = reducer.add_parameter(3, index, "rhs_index")
    keep = reducer.create("compare", [lhs_value, rhs_value], direction="GE")
    tie = reducer.create("compare", [lhs_value, rhs_value], direction="EQ")
    value = reducer.create("select", [keep, lhs_value, rhs_value])
    chosen = reducer.create("select", [tie, reducer.create("minimum", [lhs_index, rhs_index]),
                                       reducer.create("select", [keep, lhs_index, rhs_index])])
    reducer.root = reducer.create("tuple", [value, chosen])
    return reducer


def check_lines(text: str, *patterns: str) -> None:
    """FileCheck-like: each pattern (a regex) matches a later line than the previous one."""
    lines = text.splitlines()
    at = 0
    for pattern in patterns:
        for n in range(at, len(lines)):
            if re.search(pattern, lines[n]):
                at = n + 1
                break
        else:
            raise AssertionError(f"CHECK not found after line {at}: {pattern!r}\n{text}")


def count(comp: Computation, opcode: str) -> int:
    return sum(1 for inst in comp.instructions if inst.opcode == opcode)




def flatten(value: object) -> list:
    """The arrays of an evaluator result, tuples flattened (output copies add a tuple)."""
    if isinstance(value, tuple):
        return [a for v in value for a in flatten(v)]
    return [value]


def random_arguments(module: HloModule, seed: int = 0) -> list:
    import numpy as np

    rng = np.random.default_rng(seed)
    assert module.entry is not None
    return [rng.normal(size=p.shape.dims).astype(p.shape.numpy_dtype)
            for p in module.entry.parameters]


# Values a rewrite most easily gets wrong: signed zeros, infinities, NaN, and the
# integer extremes.
FLOAT_EDGES = (-0.0, 0.0, float("inf"), float("-inf"), float("nan"), 1.5, -2.0, 3.0e38)


def edge_arguments(module: HloModule, seed: int = 0) -> list:
    """One argument per entry parameter, each starting with the edge values of its type."""
    import numpy as np

    rng = np.random.default_rng(seed)
    assert module.entry is not None
    args = []
    for p in module.entry.parameters:
        dtype = p.shape.numpy_dtype
        n = p.shape.num_elements
        if dtype.kind == "f" or dtype.name == "bfloat16":
            edges = np.array(FLOAT_EDGES, dtype=np.float64)
            values = np.concatenate([edges, rng.normal(size=n) * 4])[:n]
            if n > len(edges):  # keep the edges, shuffled, so each lands anywhere
                values = rng.permutation(values)
        elif dtype == np.bool_:
            values = rng.integers(0, 2, size=n).astype(bool)
        else:
            info = np.iinfo(dtype)
            edges = np.array([0, 1, info.max, info.min, -1 if info.min else 2], dtype=np.int64)
            values = np.concatenate([edges, rng.integers(-50 if info.min else 0, 50, size=n)])
            values = rng.permutation(values[:n])
        args.append(values.astype(dtype).reshape(p.shape.dims))
    return args


def assert_same_bits(actual: object, expected: object) -> None:
    """Equal arrays, bit for bit: -0.0 differs from 0.0; any NaN equals any NaN."""
    import numpy as np

    actual_arrays, expected_arrays = flatten(actual), flatten(expected)
    assert len(actual_arrays) == len(expected_arrays)
    for a, b in zip(actual_arrays, expected_arrays, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
            nan = np.isnan(a.astype(np.float64))
            np.testing.assert_array_equal(nan, np.isnan(b.astype(np.float64)))
            a, b = a[~nan], b[~nan]
        bits = np.dtype(f"u{a.dtype.itemsize}")
        np.testing.assert_array_equal(np.ascontiguousarray(a).view(bits),
                                      np.ascontiguousarray(b).view(bits))
