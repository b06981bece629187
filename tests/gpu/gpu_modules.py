"""Hand-written HLO modules for the GPU backend's tests: every opcode over every element
type it takes, and shapes that reach every kernel template.

`MODULES` maps a name to a builder (a fresh module each call, since compiling optimizes
a module in place); `TEMPLATE_OF` names the template some of them must reach. The nvcc
test compiles all of them; the device tests run them against the evaluator.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hlo"))

from hlo_builders import argmax_reducer, reduce_sum_x_plus_y_times_z  # noqa: E402

from tfxla_lite.hlo.attributes import PaddingConfig, Window  # noqa: E402
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction  # noqa: E402
from tfxla_lite.hlo.opcodes import opcodes_in  # noqa: E402
from tfxla_lite.hlo.shape import Shape  # noqa: E402

FLOATS = ("f16", "bf16", "f32", "f64")
INTEGERS = ("s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64")
ALL_TYPES = ("pred", *INTEGERS, *FLOATS)
_INTEGER_UNARY = ("abs", "negate", "sign", "not", "floor", "ceil", "round-nearest-afz",
                  "round-nearest-even", "copy")
_FLOAT_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
                 "remainder", "atan2")
_INTEGER_BINARY = tuple(op for op in opcodes_in("binary") if op != "atan2")


def new_module(name: str) -> tuple[HloModule, Computation]:
    module = HloModule(name)
    return module, module.new_computation("main", entry=True)


def finish(comp: Computation, results: list[Instruction]) -> None:
    comp.root = results[0] if len(results) == 1 else comp.create("tuple", results)


def reduce(comp: Computation, x: Instruction, dims: tuple[int, ...], kind: str = "add",
           init: float = 0.0) -> Instruction:
    assert comp.module is not None
    reducer = comp.module.reduction_computation(kind, x.shape.element_type)
    start = comp.add_constant(init, x.shape.element_type)
    return comp.create("reduce", [x, start], called_computations=[reducer], dimensions=dims)


def unary(element_type: str) -> HloModule:
    module, comp = new_module(f"unary_{element_type}")
    x = comp.add_parameter(0, Shape(element_type, (7, 33)))
    opcodes = tuple(op for op in opcodes_in("unary") if op not in ("not", "is-finite")) \
        if element_type in FLOATS else _INTEGER_UNARY
    if element_type == "pred":
        opcodes = ("not", "copy")
    results = [comp.create(op, [x]) for op in opcodes]
    if element_type in FLOATS:
        results.append(comp.create("is-finite", [x]))
    finish(comp, results)
    return module


def binary(element_type: str) -> HloModule:
    module, comp = new_module(f"binary_{element_type}")
    shape = Shape(element_type, (5, 41))
    x, y = comp.add_parameter(0, shape), comp.add_parameter(1, shape)
    if element_type == "pred":
        opcodes: tuple[str, ...] = ("and", "or", "xor", "maximum", "minimum")
    elif element_type in FLOATS:
        opcodes = _FLOAT_BINARY
    else:
        opcodes = _INTEGER_BINARY
    results = [comp.create(op, [x, y]) for op in opcodes]
    results += [comp.create("compare", [x, y], direction=d)
                for d in ("EQ", "NE", "LT", "LE", "GT", "GE")]
    predicate = comp.create("compare", [x, y], direction="LT")
    results.append(comp.create("select", [predicate, x, y]))
    if element_type != "pred":
        low, high = comp.add_parameter(2, Shape(element_type)), comp.add_parameter(
            3, Shape(element_type))
        results.append(comp.create("clamp", [low, x, high]))
        results.append(comp.create("clamp", [x, y, x]))
    finish(comp, results)
    return module


def converts() -> HloModule:
    module, comp = new_module("convert_all_pairs")
    results = []
    for n, source in enumerate(ALL_TYPES):
        x = comp.add_parameter(n, Shape(source, (3, 11)))
        for target in ALL_TYPES:
            if target != source:
                results.append(comp.create("convert", [x], shape=Shape(target, (3, 11))))
    finish(comp, results)
    return module


def data_movement(element_type: str) -> HloModule:
    module, comp = new_module(f"data_movement_{element_type}")
    x = comp.add_parameter(0, Shape(element_type, (4, 6, 5)))
    v = comp.add_parameter(1, Shape(element_type, (6,)))
    empty = comp.add_parameter(2, Shape(element_type, (4, 0, 5)))
    start = comp.add_parameter(3, Shape("s32"))
    ustart = comp.add_parameter(4, Shape("u32"))
    scalar = comp.add_parameter(5, Shape(element_type))
    results = [
        comp.create("broadcast", [v], shape=Shape(element_type, (3, 6, 2)), dimensions=(1,)),
        comp.create("broadcast", [scalar], shape=Shape(element_type, (3, 4)), dimensions=()),
        comp.create("reshape", [x], shape=Shape(element_type, (24, 5))),
        comp.create("transpose", [x], dimensions=(2, 0, 1)),
        comp.create("slice", [x], slice=((1, 4, 2), (0, 6, 1), (1, 5, 3))),
        comp.create("concatenate", [x, empty, x], dimensions=(1,)),
        comp.create("reverse", [x], dimensions=(0, 2)),
        comp.create("pad", [x, scalar], padding=PaddingConfig.of((1, -1, 1), (0, 2), (-2, 1, 2))),
        comp.create("dynamic-slice", [x, start, start, start], dynamic_slice_sizes=(2, 3, 5)),
        comp.create("dynamic-update-slice", [x, comp.create(
            "slice", [x], slice=((0, 2, 1), (0, 2, 1), (0, 5, 1))), ustart, ustart, ustart]),
        comp.create("iota", shape=Shape(element_type, (3, 9)), iota_dimension=1),
    ]
    finish(comp, results)
    return module


def gather() -> HloModule:
    module, comp = new_module("gather_rows")
    table = comp.add_parameter(0, Shape("f32", (10, 8)))
    indices = comp.add_parameter(1, Shape("s32", (4, 3)))
    gathered = comp.create("gather", [table, indices], offset_dims=(2,),
                           collapsed_slice_dims=(0,), start_index_map=(0,), index_vector_dim=2,
                           slice_sizes=(1, 8))
    finish(comp, [gathered])
    return module


def scatter_add() -> HloModule:
    module, comp = new_module("scatter_add_rows")
    table = comp.add_parameter(0, Shape("f32", (10, 8)))
    indices = comp.add_parameter(1, Shape("s32", (5, 1)))
    updates = comp.add_parameter(2, Shape("f32", (5, 8)))
    assert comp.module is not None
    scattered = comp.create("scatter", [table, indices, updates],
                            called_computations=[comp.module.reduction_computation("add", "f32")],
                            update_window_dims=(1,), inserted_window_dims=(0,),
                            scatter_dims_to_operand_dims=(0,), index_vector_dim=1)
    finish(comp, [scattered])
    return module


def reduce_window() -> HloModule:
    module, comp = new_module("reduce_window")
    x = comp.add_parameter(0, Shape("f32", (9, 12)))
    assert comp.module is not None
    reducer = comp.module.reduction_computation("maximum", "f32")
    start = comp.add_constant(float("-inf"), "f32")
    window = Window.of((3, 2), (2, 1), ((1, 1), (0, 1)))
    pooled = comp.create("reduce-window", [x, start], called_computations=[reducer],
                         window=window)
    dims = window.dimensions
    dilated = Window((dims[0], type(dims[1])(2, 1, 1, 0, 2, 2)))
    summed = comp.create("reduce-window", [x, comp.add_constant(0.0, "f32")],
                         called_computations=[comp.module.reduction_computation("add", "f32")],
                         window=dilated)
    finish(comp, [pooled, summed])
    return module


def constants() -> HloModule:
    module, comp = new_module("constant_arrays")
    results = []
    rng = np.random.default_rng(0)
    for n, element_type in enumerate(("f32", "f16", "bf16", "f64", "s64", "u8", "pred")):
        x = comp.add_parameter(n, Shape(element_type, (2, 5)))
        values = rng.normal(size=(2, 5)) * 100
        if element_type in FLOATS:
            values[0, :3] = [np.nan, np.inf, -0.0]
        elif element_type != "pred":
            values = np.abs(values)
        table = comp.add_constant(values.astype(np.float64), element_type)
        op = "or" if element_type == "pred" else "add"
        results.append(comp.create(op, [x, table]))
    finish(comp, results)
    return module


def elementwise(dims: tuple[int, ...], element_type: str = "f32") -> HloModule:
    module, comp = new_module(f"elementwise_{'x'.join(map(str, dims))}_{element_type}")
    shape = Shape(element_type, dims)
    x, y = comp.add_parameter(0, shape), comp.add_parameter(1, shape)
    half = comp.create("broadcast", [comp.add_constant(0.5, element_type)], shape=shape,
                       dimensions=())
    finish(comp, [comp.create("add", [comp.create("multiply", [x, half]),
                                      comp.create("tanh", [y])])])
    return module


def reduction(dims: tuple[int, ...], reduced: tuple[int, ...], element_type: str = "f32",
              kind: str = "add") -> HloModule:
    name = f"reduce_{kind}_{'x'.join(map(str, dims))}_over_{''.join(map(str, reduced))}"
    module, comp = new_module(f"{name}_{element_type}")
    x = comp.add_parameter(0, Shape(element_type, dims))
    init = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf"), "and": 1,
            "or": 0, "multiply": 1.0}[kind]
    if element_type in INTEGERS and kind in ("maximum", "minimum"):
        init = 0
    operand = x if element_type == "pred" else comp.create("multiply", [x, x])
    finish(comp, [reduce(comp, operand, reduced, kind, init)])
    return module


def softmax(rows: int, width: int, element_type: str = "f32") -> HloModule:
    module, comp = new_module(f"softmax_{rows}x{width}_{element_type}")
    x = comp.add_parameter(0, Shape(element_type, (rows, width)))
    largest = reduce(comp, x, (1,), "maximum", float("-inf"))
    shifted = comp.create("subtract", [x, comp.create("broadcast", [largest], shape=x.shape,
                                                      dimensions=(0,))])
    e = comp.create("exponential", [shifted])
    total = reduce(comp, e, (1,))
    finish(comp, [comp.create("divide", [e, comp.create("broadcast", [total], shape=x.shape,
                                                        dimensions=(0,))])])
    return module


def layer_norm(rows: int, width: int) -> HloModule:
    module, comp = new_module(f"layer_norm_{rows}x{width}")
    shape = Shape("f32", (rows, width))
    x = comp.add_parameter(0, shape)
    gamma = comp.add_parameter(1, Shape("f32", (width,)))
    scale = comp.create("broadcast", [comp.add_constant(1.0 / width, "f32")],
                        shape=Shape("f32", (rows,)), dimensions=())
    mean = comp.create("multiply", [reduce(comp, x, (1,)), scale])
    centered = comp.create("subtract", [x, comp.create("broadcast", [mean], shape=shape,
                                                       dimensions=(0,))])
    variance = comp.create("multiply", [reduce(comp, comp.create("multiply",
                                                                 [centered, centered]), (1,)),
                                        scale])
    epsilon = comp.create("broadcast", [comp.add_constant(1e-5, "f32")],
                          shape=Shape("f32", (rows,)), dimensions=())
    inverse = comp.create("rsqrt", [comp.create("add", [variance, epsilon])])
    normed = comp.create("multiply", [centered, comp.create("broadcast", [inverse], shape=shape,
                                                            dimensions=(0,))])
    finish(comp, [comp.create("multiply", [normed, comp.create("broadcast", [gamma],
                                                               shape=shape, dimensions=(1,))])])
    return module


def dot(batch: int, m: int, k: int, n: int, element_type: str = "f32",
        epilogue: bool = False) -> HloModule:
    suffix = "_bias_relu" if epilogue else ""
    module, comp = new_module(f"dot_{batch}x{m}x{k}x{n}_{element_type}{suffix}")
    lead = (batch,) if batch else ()
    lhs = comp.add_parameter(0, Shape(element_type, (*lead, m, k)))
    rhs = comp.add_parameter(1, Shape(element_type, (*lead, k, n)))
    batch_dims = (0,) if batch else ()
    product = comp.create("dot", [lhs, rhs], lhs_batch_dims=batch_dims,
                          rhs_batch_dims=batch_dims, lhs_contracting_dims=(len(lead) + 1,),
                          rhs_contracting_dims=(len(lead),))
    if epilogue:
        bias = comp.add_parameter(2, Shape(element_type, (n,)))
        zero = comp.create("broadcast", [comp.add_constant(0.0, element_type)],
                           shape=product.shape, dimensions=())
        biased = comp.create("add", [product, comp.create(
            "broadcast", [bias], shape=product.shape, dimensions=(product.shape.rank - 1,))])
        product = comp.create("maximum", [biased, zero])
    finish(comp, [product])
    return module


def dot_layouts(element_type: str) -> HloModule:
    """Dots with the dimension numbers `dot-folding` leaves (contracting dimensions first
    or last, batch dimensions in the middle, several contracting dimensions, vectors,
    empty operands, batch dimensions of no common stride), each its own entry dot: cuBLAS
    for f16/bf16/f32/f64 (`gemm.py` reads each operand where it lies when strides allow,
    loops over batch dimensions of no common stride, copies what no stride describes),
    the `dot` element generator for the others."""
    module, comp = new_module(f"dot_layouts_{element_type}")
    shapes = {"a": (5, 7), "b": (7, 3), "at": (7, 5), "bt": (3, 7), "batched": (2, 5, 7),
              "batched_rhs": (7, 2, 3), "vector": (7,), "empty": (0, 7),
              "heads": (2, 4, 3, 6), "heads_rhs": (2, 5, 3, 6), "pair": (3, 4, 5),
              "pair_rhs": (3, 5, 2), "middle": (4, 2, 7), "free_first": (4, 3, 5),
              "wide_heads": (20, 2, 3, 4), "wide_heads_rhs": (20, 5, 3, 4)}
    p = {name: comp.add_parameter(n, Shape(element_type, dims))
         for n, (name, dims) in enumerate(shapes.items())}

    def dot_of(lhs: str, rhs: str, lb: tuple[int, ...] = (), rb: tuple[int, ...] = (),
               lc: tuple[int, ...] = (1,), rc: tuple[int, ...] = (0,)) -> Instruction:
        return comp.create("dot", [p[lhs], p[rhs]], lhs_batch_dims=lb, rhs_batch_dims=rb,
                           lhs_contracting_dims=lc, rhs_contracting_dims=rc)

    finish(comp, [
        dot_of("a", "b"), dot_of("at", "b", lc=(0,)), dot_of("a", "bt", rc=(1,)),
        dot_of("at", "bt", lc=(0,), rc=(1,)),
        dot_of("batched", "batched_rhs", lb=(0,), rb=(1,), lc=(2,), rc=(0,)),
        dot_of("vector", "b", lc=(0,)), dot_of("a", "vector", rc=(0,)),
        dot_of("vector", "vector", lc=(0,), rc=(0,)), dot_of("empty", "b"),
        dot_of("a", "empty", lc=(1,), rc=(1,)),
        # attention's q.k^T with heads as a second batch dimension, [b, s, h, d] layout
        dot_of("heads", "heads_rhs", lb=(0, 2), rb=(0, 2), lc=(3,), rc=(3,)),
        # two contracting dimensions around a free one: no GEMM layout without a copy
        dot_of("pair", "pair_rhs", lc=(0, 2), rc=(0, 1)),
        # contracting pairs listed against the strides (read in the order that fits both)
        dot_of("free_first", "pair_rhs", lc=(2, 1), rc=(1, 0)),
        # a batch dimension in the middle of the lhs
        dot_of("middle", "batched_rhs", lb=(1,), rb=(1,), lc=(2,), rc=(0,)),
        # heads under 20 leading batch indices: copied rather than 20 GEMM calls
        dot_of("wide_heads", "wide_heads_rhs", lb=(0, 2), rb=(0, 2), lc=(3,), rc=(3,)),
    ])
    return module


def one_dot(lhs: tuple[int, ...], rhs: tuple[int, ...], element_type: str,
            **numbers: tuple[int, ...]) -> HloModule:
    """One entry dot of two parameters."""
    module, comp = new_module("one_dot")
    a = comp.add_parameter(0, Shape(element_type, lhs))
    b = comp.add_parameter(1, Shape(element_type, rhs))
    finish(comp, [comp.create("dot", [a, b], **numbers)])
    return module


def random_dot(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...],
                                                    dict[str, tuple[int, ...]]]:
    """Random dimension numbers: up to 2 batch, 2 contracting and 2 free dimensions per
    side, each operand's dimensions in a random order, sizes 1 to 4 (0 now and then)."""
    batch = [int(s) for s in rng.integers(1, 4, rng.integers(0, 3))]
    contracting = [int(s) for s in rng.integers(1, 5, rng.integers(0, 3))]
    lhs_free = [int(s) for s in rng.integers(1, 5, rng.integers(0, 3))]
    rhs_free = [int(s) for s in rng.integers(1, 5, rng.integers(0, 3))]
    if rng.random() < 0.05 and contracting:
        contracting[0] = 0

    def operand(free: list[int]) -> tuple[tuple[int, ...], list[int], list[int]]:
        roles = [("b", i) for i in range(len(batch))] + \
            [("c", i) for i in range(len(contracting))] + [("f", i) for i in range(len(free))]
        order = list(rng.permutation(len(roles)))
        placed = [roles[o] for o in order]
        sizes = {"b": batch, "c": contracting, "f": free}
        dims = tuple(sizes[kind][i] for kind, i in placed)
        return (dims, [placed.index(("b", i)) for i in range(len(batch))],
                [placed.index(("c", i)) for i in range(len(contracting))])

    lhs, lb, lc = operand(lhs_free)
    rhs, rb, rc = operand(rhs_free)
    return lhs, rhs, {"lhs_batch_dims": tuple(lb), "rhs_batch_dims": tuple(rb),
                      "lhs_contracting_dims": tuple(lc), "rhs_contracting_dims": tuple(rc)}


def random_dot_cases(element_type: str, count: int
                     ) -> Iterator[tuple[str, HloModule, list[np.ndarray]]]:
    """`count` random dots of `element_type` (`random_dot`, a seed per type) with small
    integer operands, so that every product and f32 sum is exact and a dot's result is
    the evaluator's bits on any backend: (label, module, arguments)."""
    rng = np.random.default_rng({"f32": 1, "f16": 2, "bf16": 3, "f64": 4}[element_type])
    for case in range(count):
        lhs, rhs, numbers = random_dot(rng)
        module = one_dot(lhs, rhs, element_type, **numbers)
        dtype = module.entry.parameters[0].shape.numpy_dtype
        args = [rng.integers(-3, 4, d).astype(dtype) for d in (lhs, rhs)]
        yield f"case {case}: {lhs} . {rhs} {numbers}", module, args


def half_sums(element_type: str) -> HloModule:
    """Sums and a product of 2-byte floats in every template (a thread per short row, a
    warp or block per row, columns, a split full reduction, a row fusion): they accumulate
    in f32 and round once, as on the CPU (`elemental.accumulates_in_f32`)."""
    module, comp = new_module(f"half_sums_{element_type}")
    rows = comp.add_parameter(0, Shape(element_type, (6, 3000)))
    short = comp.add_parameter(1, Shape(element_type, (40, 12)))
    flat = comp.add_parameter(2, Shape(element_type, (1 << 16,)))
    small = comp.add_parameter(3, Shape(element_type, (8, 40)))
    shifted = comp.create("subtract", [rows, comp.create(
        "broadcast", [reduce(comp, rows, (1,))], shape=rows.shape, dimensions=(0,))])
    finish(comp, [reduce(comp, rows, (1,)), reduce(comp, rows, (0,)), reduce(comp, short, (1,)),
                  reduce(comp, flat, (0,)), reduce(comp, small, (1,), "multiply", 1.0),
                  shifted])
    return module


def row_statistics(rows: int, width: int, reduced: tuple[int, ...] = (1,)) -> HloModule:
    """Sibling reductions of one input and an elementwise result of it: one multi-output
    fusion (`multi-output-fusion`)."""
    module, comp = new_module(f"statistics_{rows}x{width}_over_{''.join(map(str, reduced))}")
    x = comp.add_parameter(0, Shape("f32", (rows, width)))
    e = comp.create("exponential", [x])
    total = reduce(comp, e, reduced)
    squares = reduce(comp, comp.create("multiply", [x, x]), reduced)
    largest = reduce(comp, x, reduced, "maximum", float("-inf"))
    finish(comp, [total, squares, largest, e])
    return module


def reduce_with_loops(dims: tuple[int, ...], reduced: tuple[int, ...],
                      element_type: str = "f32", loops: int = 1) -> HloModule:
    """A sum of exp(x) and a max of x with one or two elementwise results of their input
    shape (exp(x); x * y + y): one multi-output fusion, whose reduction loop stores the
    elementwise results too (`kernels.plan_multi_output`)."""
    name = f"reduce_with_loops_{'x'.join(map(str, dims))}_over_{''.join(map(str, reduced))}"
    module, comp = new_module(f"{name}_{element_type}_{loops}")
    x = comp.add_parameter(0, Shape(element_type, dims))
    e = comp.create("exponential", [x])
    results = [reduce(comp, e, reduced), e,
               reduce(comp, x, reduced, "maximum", float("-inf"))]
    if loops == 2:
        y = comp.add_parameter(1, Shape(element_type, dims))
        results.append(comp.create("add", [comp.create("multiply", [x, y]), y]))
    finish(comp, results)
    return module


# Multi-output fusions whose loop results the reduction loop cannot store, as XLA's
# optimized HLO could hold them (`multi-output-fusion` makes none of them): a result of
# the reduce's output shape, one reading a reduce of the fusion (x - its row max), and a
# full reduction (one block) with a result of its input shape of more than
# `kernels.ONE_BLOCK_LOOP_MAX` elements.
LOOPS_APART_HLO = """HloModule loops_apart

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%fused_output_shape (p0: f32[20,70], p1: f32[20]) -> (f32[20], f32[20]) {
  %p0 = f32[20,70]{1,0} parameter(0)
  %p1 = f32[20]{0} parameter(1)
  %zero = f32[] constant(0)
  %total = f32[20]{0} reduce(%p0, %zero), dimensions={1}, to_apply=%add
  %e = f32[20]{0} exponential(%p1)
  ROOT %tuple = (f32[20]{0}, f32[20]{0}) tuple(%total, %e)
}

%max (c: f32[], d: f32[]) -> f32[] {
  %c = f32[] parameter(0)
  %d = f32[] parameter(1)
  ROOT %larger = f32[] maximum(%c, %d)
}

%fused_reads_reduce (q0: f32[20,70]) -> (f32[20], f32[20,70]) {
  %q0 = f32[20,70]{1,0} parameter(0)
  %zero.1 = f32[] constant(-inf)
  %total.1 = f32[20]{0} reduce(%q0, %zero.1), dimensions={1}, to_apply=%max
  %spread = f32[20,70]{1,0} broadcast(%total.1), dimensions={0}
  %centered = f32[20,70]{1,0} subtract(%q0, %spread)
  ROOT %tuple.1 = (f32[20]{0}, f32[20,70]{1,0}) tuple(%total.1, %centered)
}

%fused_full (r0: f32[160,128]) -> (f32[], f32[160,128]) {
  %r0 = f32[160,128]{1,0} parameter(0)
  %zero.2 = f32[] constant(0)
  %total.2 = f32[] reduce(%r0, %zero.2), dimensions={0,1}, to_apply=%add
  %e.2 = f32[160,128]{1,0} exponential(%r0)
  ROOT %tuple.2 = (f32[], f32[160,128]{1,0}) tuple(%total.2, %e.2)
}

ENTRY %main (x: f32[20,70], z: f32[20], w: f32[20,70], v: f32[160,128]) -> RESULTS {
  %x = f32[20,70]{1,0} parameter(0)
  %z = f32[20]{0} parameter(1)
  %w = f32[20,70]{1,0} parameter(2)
  %v = f32[160,128]{1,0} parameter(3)
  %first = (f32[20]{0}, f32[20]{0}) fusion(%x, %z), kind=kInput, calls=%fused_output_shape
  %second = (f32[20]{0}, f32[20,70]{1,0}) fusion(%w), kind=kInput, calls=%fused_reads_reduce
  %third = (f32[], f32[160,128]{1,0}) fusion(%v), kind=kInput, calls=%fused_full
  %g0 = f32[20]{0} get-tuple-element(%first), index=0
  %g1 = f32[20]{0} get-tuple-element(%first), index=1
  %g2 = f32[20]{0} get-tuple-element(%second), index=0
  %g3 = f32[20,70]{1,0} get-tuple-element(%second), index=1
  %g4 = f32[] get-tuple-element(%third), index=0
  %g5 = f32[160,128]{1,0} get-tuple-element(%third), index=1
  ROOT %out = RESULTS tuple(%g0, %g1, %g2, %g3, %g4, %g5)
}
""".replace(
    "RESULTS", "(f32[20]{0}, f32[20]{0}, f32[20]{0}, f32[20,70]{1,0}, f32[], f32[160,128]{1,0})")


def loops_apart() -> HloModule:
    from tfxla_lite.hlo.parser import parse_module

    return parse_module(LOOPS_APART_HLO)


def argmax(dims: tuple[int, ...], axis: int, element_type: str = "f32") -> HloModule:
    """TF's ArgMax as XLA lowers it: a variadic reduce over (values, iota) whose reducer
    keeps the larger value and, on ties, the smaller index."""
    module, comp = new_module(f"argmax_{'x'.join(map(str, dims))}_axis{axis}_{element_type}")
    reducer = argmax_reducer(module, element_type, "argmax_reducer")
    x = comp.add_parameter(0, Shape(element_type, dims))
    positions = comp.create("iota", shape=Shape("s32", dims), iota_dimension=axis)
    reduced = comp.create("reduce", [x, positions, comp.add_constant(float("-inf"), element_type),
                                     comp.add_constant(0, "s32")],
                          called_computations=[reducer], dimensions=(axis,))
    finish(comp, [comp.create("get-tuple-element", [reduced], index=1),
                  comp.create("get-tuple-element", [reduced], index=0)])
    return module


def arg_reduce(dims: tuple[int, ...], axis: int, element_type: str = "f32",
               kind: str = "max") -> HloModule:
    """TF's ArgMax (ArgMin with `kind="min"`) as TF's XLA prints it (`minmax_func`: GE or
    LE keeps the left pair, EQ takes the smaller index), over `axis` of `dims`: a 1-D
    input is a full reduction. Returns the index and the value."""
    name = f"arg{kind}_{'x'.join(map(str, dims))}_axis{axis}_{element_type}"
    module, comp = new_module(name)
    reducer = module.new_computation(f"{name}_reducer")
    scalar, index = Shape(element_type, ()), Shape("s32", ())
    lhs_value = reducer.add_parameter(0, scalar, "lhs_value")
    lhs_index = reducer.add_parameter(1, index, "lhs_index")
    rhs_value = reducer.add_parameter(2, scalar, "rhs_value")
    rhs_index = reducer.add_parameter(3, index, "rhs_index")
    keep = reducer.create("compare", [lhs_value, rhs_value],
                          direction="GE" if kind == "max" else "LE")
    tie = reducer.create("compare", [lhs_value, rhs_value], direction="EQ")
    value = reducer.create("select", [keep, lhs_value, rhs_value])
    chosen = reducer.create("select", [tie, reducer.create("minimum", [lhs_index, rhs_index]),
                                       reducer.create("select", [keep, lhs_index, rhs_index])])
    reducer.root = reducer.create("tuple", [value, chosen])
    x = comp.add_parameter(0, Shape(element_type, dims))
    positions = comp.create("iota", shape=Shape("s32", dims), iota_dimension=axis)
    init = float("-inf") if kind == "max" else float("inf")
    reduced = comp.create("reduce", [x, positions, comp.add_constant(init, element_type),
                                     comp.add_constant(0, "s32")],
                          called_computations=[reducer], dimensions=(axis,))
    finish(comp, [comp.create("get-tuple-element", [reduced], index=1),
                  comp.create("get-tuple-element", [reduced], index=0)])
    return module


def transpose(dims: tuple[int, ...], permutation: tuple[int, ...], element_type: str = "f32",
              fused: bool = False, reshape_to: tuple[int, ...] | None = None) -> HloModule:
    """transpose(x), or (`fused`) transpose(x + y) * z + transpose(y): elementwise work on
    both sides of two transposes of one permutation; `reshape_to`: the result reshaped."""
    name = f"transpose_{'x'.join(map(str, dims))}_{''.join(map(str, permutation))}"
    module, comp = new_module(f"{name}_{element_type}{'_fused' if fused else ''}")
    x = comp.add_parameter(0, Shape(element_type, dims))
    if fused:
        y = comp.add_parameter(1, Shape(element_type, dims))
        moved = comp.create("transpose", [comp.create("add", [x, y])], dimensions=permutation)
        z = comp.add_parameter(2, moved.shape)
        result = comp.create("add", [comp.create("multiply", [moved, z]),
                                     comp.create("transpose", [y], dimensions=permutation)])
    else:
        result = comp.create("transpose", [x], dimensions=permutation)
    if reshape_to is not None:
        result = comp.create("reshape", [result], shape=Shape(element_type, reshape_to))
    finish(comp, [result])
    return module


def huge_elementwise() -> HloModule:
    """Over 2^31 elements: 64-bit indices (emitted and compiled only, never run)."""
    module, comp = new_module("elementwise_huge")
    shape = Shape("u8", (3, 1 << 30))
    x = comp.add_parameter(0, shape)
    finish(comp, [comp.create("add", [x, x])])
    return module


def row_vector_mixed() -> HloModule:
    """An elementwise loop, a column reduction, a split full reduction and a row reduction,
    each of its own f32 parameter (no sibling fusion): only the row kernel reads by
    vector (`test_gpu_row_vectors.py`)."""
    module, comp = new_module("row_vector_mixed")
    shape = Shape("f32", (256, 256))
    x, y, z, v = (comp.add_parameter(n, shape) for n in range(4))
    y, z, v = (comp.create("multiply", [p, p]) for p in (y, z, v))  # sums that do not cancel
    finish(comp, [comp.create("exponential", [x]), reduce(comp, y, (0,)),
                  reduce(comp, z, (0, 1)), reduce(comp, v, (1,))])
    return module


def row_vector_of_product() -> HloModule:
    """Row sums of a dot's product: a row reduction reading a temp of the arena."""
    module, comp = new_module("row_vector_of_product")
    lhs = comp.add_parameter(0, Shape("f32", (8, 16)))
    rhs = comp.add_parameter(1, Shape("f32", (16, 32)))
    product = comp.create("dot", [lhs, rhs], lhs_contracting_dims=(1,),
                          rhs_contracting_dims=(0,))
    finish(comp, [reduce(comp, comp.create("exponential", [product]), (1,))])
    return module


Builder = Callable[[], HloModule]
MODULES: dict[str, Builder] = {}
for _type in ALL_TYPES:
    MODULES[f"unary_{_type}"] = lambda t=_type: unary(t)
    MODULES[f"binary_{_type}"] = lambda t=_type: binary(t)
for _type in ("f32", "f16", "s64", "pred"):
    MODULES[f"data_movement_{_type}"] = lambda t=_type: data_movement(t)
MODULES.update({
    "convert_all_pairs": converts,
    "gather_rows": gather,
    "reduce_window": reduce_window,
    "scatter_add_rows": scatter_add,
    "constant_arrays": constants,
    "elementwise_vectorized": lambda: elementwise((64, 256)),
    "elementwise_odd": lambda: elementwise((3, 7)),
    "elementwise_f16": lambda: elementwise((64, 256), "f16"),
    "reduce_sum_x_plus_y_times_z": lambda: reduce_sum_x_plus_y_times_z(),
    "reduce_sum_split": lambda: reduce_sum_x_plus_y_times_z(Shape("f32", (512, 1024))),
    "row_reduce_short": lambda: reduction((300, 8), (1,)),
    "row_reduce_warp": lambda: reduction((300, 100), (1,)),
    "row_reduce_block": lambda: reduction((30, 3000), (1,)),
    "row_reduce_wide": lambda: reduction((3, 20000), (1,), "f64"),
    "row_reduce_max_f16": lambda: reduction((40, 700), (1,), "f16", "maximum"),
    "row_reduce_s32": lambda: reduction((40, 70), (1,), "s32"),
    "row_reduce_u8_max": lambda: reduction((40, 70), (1,), "u8", "maximum"),
    "row_reduce_pred_and": lambda: reduction((40, 70), (1,), "pred", "and"),
    "column_reduce": lambda: reduction((1000, 64), (0,)),
    "middle_reduce": lambda: reduction((4, 50, 6), (1,), "f64", "minimum"),
    "column_reduce_bf16": lambda: reduction((100, 30), (0,), "bf16"),
    "softmax": lambda: softmax(64, 1000),
    "softmax_warp_rows": lambda: softmax(100, 40),
    "softmax_f16": lambda: softmax(16, 300, "f16"),
    "layer_norm": lambda: layer_norm(32, 768),
    "dot": lambda: dot(0, 16, 32, 8),
    "dot_batched": lambda: dot(3, 4, 8, 5),
    "dot_epilogue": lambda: dot(0, 16, 32, 8, epilogue=True),
    "dot_s32": lambda: dot(0, 4, 6, 3, "s32"),
    "dot_f16": lambda: dot(2, 8, 16, 8, "f16"),
    **{f"dot_layouts_{t}": lambda t=t: dot_layouts(t) for t in ("f32", "f16", "bf16", "s32")},
    "half_sums_f16": lambda: half_sums("f16"),
    "half_sums_bf16": lambda: half_sums("bf16"),
    "elementwise_huge": huge_elementwise,
    "multi_output_rows_warp": lambda: row_statistics(64, 300),
    "multi_output_rows_block": lambda: row_statistics(16, 3000),
    "multi_output_columns": lambda: row_statistics(500, 40, (0,)),
    # Multi-output fusions whose reduction loop also stores elementwise results (one or
    # two; widths off the vector and block multiples), and ones that keep a second kernel.
    "loops_rows_warp_f32": lambda: reduce_with_loops((37, 301), (1,)),
    "loops_rows_warp_f32_two": lambda: reduce_with_loops((9, 64), (1,), loops=2),
    "loops_rows_warp_f16_two": lambda: reduce_with_loops((13, 44), (1,), "f16", 2),
    "loops_rows_block_bf16": lambda: reduce_with_loops((5, 1030), (1,), "bf16"),
    "loops_rows_block_f32_two": lambda: reduce_with_loops((3, 2000), (1,), loops=2),
    "loops_columns_f32": lambda: reduce_with_loops((70, 45), (0,)),
    "loops_columns_f16_two": lambda: reduce_with_loops((33, 40), (0,), "f16", 2),
    "loops_middle_bf16_two": lambda: reduce_with_loops((7, 33, 5), (1,), "bf16", 2),
    "loops_columns_one_block": lambda: reduce_with_loops((128, 10), (0,)),  # a bias gradient
    "loops_apart": loops_apart,
    "argmax_rows": lambda: argmax((40, 70), 1),
    "argmax_wide_rows": lambda: argmax((6, 5000), 1, "f16"),
    "argmax_columns": lambda: argmax((300, 20), 0, "f64"),
    # Variadic reductions split over blocks: all elements, and a few long rows.
    "argmax_full_split": lambda: arg_reduce((70001,), 0),
    "argmin_full_split_f16": lambda: arg_reduce((66000,), 0, "f16", "min"),
    "argmax_few_rows_split": lambda: arg_reduce((3, 65600), 1),
    "argmin_few_rows_split_bf16": lambda: arg_reduce((2, 70000), 1, "bf16", "min"),
    # Tiled transposes (32x32 tiles: edge tiles wherever a side is not a multiple of 32).
    "transpose_2d": lambda: transpose((64, 96), (1, 0)),
    "transpose_edges_f16": lambda: transpose((33, 70), (1, 0), "f16"),
    "transpose_edges_bf16": lambda: transpose((45, 40), (1, 0), "bf16"),
    "transpose_edges_s32": lambda: transpose((40, 33), (1, 0), "s32"),
    "transpose_batched": lambda: transpose((3, 40, 50), (0, 2, 1)),
    "transpose_rotate": lambda: transpose((5, 20, 34), (2, 0, 1)),
    "transpose_fused_f32": lambda: transpose((37, 50), (1, 0), fused=True),
    "transpose_fused_f16": lambda: transpose((2, 40, 17), (0, 2, 1), "f16", fused=True),
    "transpose_fused_bf16": lambda: transpose((50, 37), (1, 0), "bf16", fused=True),
    "transpose_fused_s32": lambda: transpose((20, 48), (1, 0), "s32", fused=True),
    "transpose_heads_merged": lambda: transpose((2, 2, 20, 18), (0, 3, 1, 2),
                                                reshape_to=(2, 18, 40)),
    "transpose_minor_kept": lambda: transpose((2, 5, 3, 8), (0, 2, 1, 3)),
    "transpose_tiny": lambda: transpose((4, 4), (1, 0)),
    # Row kernels' vector loads (`test_gpu_row_vectors.py`): widths with and without a
    # multiple of the vector (4 floats, 8 halves).
    "row_vector_sum_f32": lambda: reduction((6, 64), (1,)),
    "row_vector_sum_f16": lambda: reduction((5, 48), (1,), "f16"),
    "row_vector_sum_bf16": lambda: reduction((5, 48), (1,), "bf16"),
    "row_vector_max_block_f32": lambda: reduction((3, 1024), (1,), "f32", "maximum"),
    "row_vector_sum_odd_f32": lambda: reduction((6, 37), (1,)),
    "row_vector_sum_odd_f16": lambda: reduction((5, 44), (1,), "f16"),
    "row_vector_softmax_f32": lambda: softmax(6, 64),
    "row_vector_softmax_f16": lambda: softmax(4, 48, "f16"),
    "row_vector_softmax_odd_f32": lambda: softmax(6, 30),
    "row_vector_layer_norm": lambda: layer_norm(4, 36),
    # Column kernels' vector loads (`test_gpu_column_vectors.py`): G outputs a thread where
    # the kept minor dimension is a multiple of G (4 floats, 8 halves).
    "column_vector_sum_f32": lambda: reduction((50, 64), (0,)),
    "column_vector_sum_f16": lambda: reduction((40, 48), (0,), "f16"),
    "column_vector_max_bf16": lambda: reduction((6, 7, 16), (0, 1), "bf16", "maximum"),
    "column_vector_partial_tile": lambda: reduction((9, 136), (0,)),  # tiles of 128 + 8
    "column_vector_argmax_f32": lambda: argmax((100, 24), 0),
    "column_vector_odd_f32": lambda: reduction((50, 30), (0,)),  # 30 columns: no vectors
    "row_vector_mixed": row_vector_mixed,
    "row_vector_of_product": row_vector_of_product,
})

# The template a module's main (last) kernel must use (checked by the emitter tests).
TEMPLATE_OF = {
    "elementwise_vectorized": "loop",
    "reduce_sum_split": "split-reduction",
    "row_reduce_short": "loop",
    "row_reduce_warp": "row-reduction",
    "row_reduce_block": "row-reduction",
    "column_reduce": "column-reduction",
    "middle_reduce": "column-reduction",
    "softmax": "row-fusion",
    "layer_norm": "row-fusion",
    "dot": "dot",
    "dot_epilogue": "dot-epilogue",
    "dot_s32": "loop",
    "multi_output_rows_warp": "multi-output",
    "multi_output_columns": "multi-output",
    "argmax_rows": "row-reduction",
    "argmax_columns": "column-reduction",
    "argmax_full_split": "split-reduction",
    "argmax_few_rows_split": "split-reduction",
    "transpose_2d": "transpose",
    "transpose_fused_f16": "transpose",
    "transpose_heads_merged": "transpose",
    "transpose_minor_kept": "loop",
    "transpose_tiny": "loop",
}
# Modules too big to allocate: compiled, never run.
NOT_RUN = frozenset({"elementwise_huge"})
