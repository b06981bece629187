"""`while-dot-hoist` (tfxla_lite/passes/while_dot_hoist.py, not in the default pipeline:
run here after while-licm): a loop body's dot of item t of a loop-invariant list by a
loop-invariant matrix becomes one dot of the whole list before the loop. Compiled
results against the evaluator (loops of 0, 1 and many iterations, an index the
dynamic-slice clamps, a 2-D list, a nested loop, a list the caller still reads), which
loops keep their dot (one that may stop early, an unknown trip count), and Keras
recurrent layers against TF."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule, Instruction
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.passes.pipeline import DEFAULT_PIPELINE, optimize
from tfxla_lite.passes.while_dot_hoist import minimum_trip_count

PIPELINE = DEFAULT_PIPELINE.replace("while-licm,", "while-licm,while-dot-hoist,")


def rnn(steps: int, bound: str = "", index: str = "i", list_dims: str = "",
        item: str = "  x = f32[4,3] reshape(xs)\n", result: str = "") -> str:
    """h <- tanh(x_t . W + h . U) over a list X[T, 4, 3] (or `list_dims`) the body reads
    item `index` of, while i < `bound` (a constant, default T, or `n` for the entry's
    parameter); the entry returns h (or `result`)."""
    list_dims = list_dims or f"{steps},4,3"
    bound = bound or str(steps)
    limit = "  n = s32[] get-tuple-element(p), index=4\n" if bound == "n" else \
        f"  n = s32[] constant({bound})\n"
    result = result or "f32[4,5] get-tuple-element(loop), index=1"
    item_dims = list_dims.split(",", 1)[1]
    zeros = ", zero" * list_dims.count(",")
    state = f"(s32[], f32[4,5], f32[{list_dims}], f32[3,5], s32[], f32[5,5])"
    return f"""
HloModule rnn

cond {{
  p = {state} parameter(0)
  i = s32[] get-tuple-element(p), index=0
{limit}  ROOT lt = pred[] compare(i, n), direction=LT
}}

body {{
  p = {state} parameter(0)
  i = s32[] get-tuple-element(p), index=0
  h = f32[4,5] get-tuple-element(p), index=1
  list = f32[{list_dims}] get-tuple-element(p), index=2
  w = f32[3,5] get-tuple-element(p), index=3
  n = s32[] get-tuple-element(p), index=4
  u = f32[5,5] get-tuple-element(p), index=5
  one = s32[] constant(1)
  five = s32[] constant(5)
  zero = s32[] constant(0)
  i1 = s32[] add(i, one)
  i5 = s32[] add(i, five)
  xs = f32[1,{item_dims}] dynamic-slice(list, {index}{zeros}), dynamic_slice_sizes={{1,{item_dims}}}
{item}  xw = f32[4,5] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  hu = f32[4,5] dot(h, u), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  z = f32[4,5] add(xw, hu)
  h1 = f32[4,5] tanh(z)
  ROOT t = {state} tuple(i1, h1, list, w, n, u)
}}

ENTRY main {{
  list = f32[{list_dims}] parameter(0)
  w = f32[3,5] parameter(1)
  u = f32[5,5] parameter(2)
  h = f32[4,5] parameter(3)
  n = s32[] parameter(4)
  zero = s32[] constant(0)
  init = {state} tuple(zero, h, list, w, n, u)
  loop = {state} while(init), condition=cond, body=body
  ROOT r = {result}
}}
"""


def inputs(steps: int, list_shape: tuple[int, ...] | None = None, trips: int = 0
           ) -> list[Any]:
    rng = np.random.default_rng(steps)
    shape = list_shape or (steps, 4, 3)
    return [rng.standard_normal(shape).astype(np.float32) * 0.5,
            rng.standard_normal((3, 5)).astype(np.float32) * 0.5,
            rng.standard_normal((5, 5)).astype(np.float32) * 0.5,
            rng.standard_normal((4, 5)).astype(np.float32) * 0.5, np.int32(trips)]


def check(text: str, args: list[Any]) -> HloModule:
    """Compile `text`, compare with the evaluator, and return the compiled module."""
    expected = evaluate(parse_module(text), *args)
    expected = expected if isinstance(expected, (tuple, list)) else [expected]
    module = parse_module(text)
    got = compile_module(module, PIPELINE, cache=False, verify=True)(*args)
    for g, e in zip(got, expected, strict=True):
        assert_close(g, np.asarray(e), "model gradient", "while-dot-hoist")
    return module


def body_dots(module: HloModule) -> list[Instruction]:
    """The dots the (outermost) loop's body runs, fused or not."""
    loop = next(i for i in module.entry.instructions if i.opcode == "while")
    body = loop.called_computations[1]
    found = [i for i in body.instructions if i.opcode == "dot"]
    for inst in body.instructions:
        if inst.opcode == "fusion":
            found += [i for i in inst.fused_computation.instructions if i.opcode == "dot"]
    return found


def entry_dot_shapes(module: HloModule) -> list[tuple[int, ...]]:
    found = []
    for inst in module.entry.instructions:
        comps = [inst.fused_computation] if inst.opcode == "fusion" else []
        for i in [inst, *(j for c in comps for j in c.instructions)]:
            if i.opcode == "dot":
                found.append(i.shape.dims)
    return found


@pytest.mark.parametrize("steps", [1, 2, 7])
def test_the_input_projection_leaves_the_loop(steps: int) -> None:
    module = check(rnn(steps), inputs(steps))
    # Only h . U stays in the body; x . W runs once over all T x 4 rows before it.
    assert [d.operand(1).shape.dims for d in body_dots(module)] == [(5, 5)]
    assert (steps * 4, 5) in entry_dot_shapes(module)
    # The list itself is no longer loop state (nothing reads it in the body). A list of
    # one item is read whole (simplify) and its dot leaves by while-licm instead.
    loop = next(i for i in module.entry.instructions if i.opcode == "while")
    assert steps == 1 or all(s.dims != (steps, 4, 3) for s in loop.shape.tuple_shapes)


def test_an_index_past_the_end_reads_the_last_item_as_before() -> None:
    """The body reads item i + 5, which the dynamic-slice clamps to T - 1."""
    module = check(rnn(7, index="i5"), inputs(7))
    assert len(body_dots(module)) == 1


def test_a_two_dimensional_list_of_single_rows() -> None:
    """X[T, 3]: the item is [1, 3] without a reshape."""
    text = rnn(6, list_dims="6,3", item="  x = f32[1,3] reshape(xs)\n")
    text = text.replace("f32[4,5]", "f32[1,5]")
    args = inputs(6, (6, 3))
    args[3] = args[3][:1]
    module = check(text, args)
    assert len(body_dots(module)) == 1 and (6, 5) in entry_dot_shapes(module)


@pytest.mark.parametrize("bound", [0, 3])
def test_a_loop_that_stops_before_the_end_of_the_list_keeps_its_dot(bound: int) -> None:
    """0 or 3 iterations over a list of 7: the whole-list dot would cost more."""
    module = check(rnn(7, bound=str(bound)), inputs(7))
    assert len(body_dots(module)) == 2


@pytest.mark.parametrize("trips", [0, 1, 7])
def test_an_unknown_trip_count_keeps_the_dot(trips: int) -> None:
    module = check(rnn(7, bound="n"), inputs(7, trips=trips))
    assert len(body_dots(module)) == 2


def test_a_list_the_caller_reads_after_the_loop_stays_loop_state() -> None:
    text = rnn(5, result="f32[5,4,3] get-tuple-element(loop), index=2")
    module = check(text, inputs(5))
    assert len(body_dots(module)) == 1


NESTED = """
HloModule nested

inner_cond {
  p = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  six = s32[] constant(6)
  ROOT lt = pred[] compare(i, six), direction=LT
}

inner_body {
  p = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  h = f32[4,5] get-tuple-element(p), index=1
  list = f32[6,4,3] get-tuple-element(p), index=2
  w = f32[3,5] get-tuple-element(p), index=3
  one = s32[] constant(1)
  zero = s32[] constant(0)
  i1 = s32[] add(i, one)
  xs = f32[1,4,3] dynamic-slice(list, i, zero, zero), dynamic_slice_sizes={1,4,3}
  x = f32[4,3] reshape(xs)
  xw = f32[4,5] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  z = f32[4,5] add(xw, h)
  h1 = f32[4,5] tanh(z)
  ROOT t = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) tuple(i1, h1, list, w)
}

outer_cond {
  p = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) parameter(0)
  k = s32[] get-tuple-element(p), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(k, three), direction=LT
}

outer_body {
  p = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) parameter(0)
  k = s32[] get-tuple-element(p), index=0
  h = f32[4,5] get-tuple-element(p), index=1
  list = f32[6,4,3] get-tuple-element(p), index=2
  w = f32[3,5] get-tuple-element(p), index=3
  one = s32[] constant(1)
  zero = s32[] constant(0)
  k1 = s32[] add(k, one)
  half = f32[] constant(0.5)
  halves = f32[6,4,3] broadcast(half), dimensions={}
  scaled = f32[6,4,3] multiply(list, halves)
  init = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) tuple(zero, h, scaled, w)
  inner = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) while(init), condition=inner_cond,
    body=inner_body
  h1 = f32[4,5] get-tuple-element(inner), index=1
  ROOT t = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) tuple(k1, h1, scaled, w)
}

ENTRY main {
  list = f32[6,4,3] parameter(0)
  w = f32[3,5] parameter(1)
  h = f32[4,5] parameter(2)
  zero = s32[] constant(0)
  init = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) tuple(zero, h, list, w)
  loop = (s32[], f32[4,5], f32[6,4,3], f32[3,5]) while(init), condition=outer_cond,
    body=outer_body
  ROOT r = f32[4,5] get-tuple-element(loop), index=1
}
"""


def test_a_loop_inside_a_loop_body() -> None:
    """The inner loop's list changes every outer iteration: its whole-list dot runs in
    the outer body, once per outer iteration."""
    rng = np.random.default_rng(5)
    args = [rng.standard_normal((6, 4, 3)).astype(np.float32),
            rng.standard_normal((3, 5)).astype(np.float32) * 0.5,
            rng.standard_normal((4, 5)).astype(np.float32)]
    expected = evaluate(parse_module(NESTED), *args)
    module = parse_module(NESTED)
    (got,) = compile_module(module, PIPELINE, cache=False, verify=True)(*args)
    assert_close(got, np.asarray(expected), "model gradient", "while-dot-hoist nested")
    outer = next(i for i in module.entry.instructions if i.opcode == "while")
    inner = next(i for i in outer.called_computations[1].instructions if i.opcode == "while")
    assert not [i for c in module.computations if c in _called(inner)
                for i in c.instructions if i.opcode == "dot"]


def _called(inst: Instruction) -> list[Any]:
    found, stack = [], list(inst.called_computations)
    while stack:
        comp = stack.pop()
        found.append(comp)
        stack += [c for i in comp.instructions for c in i.called_computations]
    return found


def test_trip_counts_of_conjunctions_of_counters() -> None:
    """Keras's loop condition: i < T and k < maximum_iterations (an invariant element)."""
    text = """
HloModule trips

cond {
  p = (s32[], s32[], s32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  k = s32[] get-tuple-element(p), index=1
  m = s32[] get-tuple-element(p), index=2
  nine = s32[] constant(9)
  a = pred[] compare(i, nine), direction=LT
  b = pred[] compare(k, m), direction=LE
  ROOT both = pred[] and(a, b)
}

body {
  p = (s32[], s32[], s32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  k = s32[] get-tuple-element(p), index=1
  m = s32[] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  k1 = s32[] add(one, k)
  ROOT t = (s32[], s32[], s32[]) tuple(i1, k1, m)
}

ENTRY main {
  start = s32[] constant(2)
  m = s32[] constant(5)
  init = (s32[], s32[], s32[]) tuple(start, start, m)
  ROOT loop = (s32[], s32[], s32[]) while(init), condition=cond, body=body
}
"""
    module = parse_module(text)
    loop = module.entry.root
    assert minimum_trip_count(loop) == min(9 - 2, 5 - 2 + 1)
    assert minimum_trip_count(loop) == evaluate(parse_module(text))[0] - 2
    optimize(module, PIPELINE)  # nothing to hoist; the loop keeps its state
    assert len(module.entry.root.shape.tuple_shapes) == 3


@pytest.mark.parametrize("layer", ["LSTM", "GRU", "SimpleRNN"])
def test_keras_recurrent_inference_matches_tf(layer: str) -> None:
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    import tfxla_lite as tl
    from tfxla_lite.flags import get_options

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((9, 6)), getattr(keras.layers, layer)(8),
                              keras.layers.Dense(3)])
    x = tf.constant(np.random.default_rng(0).standard_normal((5, 9, 6)).astype(np.float32))
    want = model(x, training=False).numpy()
    options = get_options().with_changes(pipeline=PIPELINE, strict_jit_compile=True)
    got = tl.function(lambda x: model(x, training=False), jit_compile=True,
                      options=options)(x).numpy()
    assert_close(got, want, "model gradient", f"Keras {layer} inference")
