"""Random TF graphs over the op registry, for differential fuzzing against TF.

A graph is a few inputs (one dtype and one shape each: scalars, 0- and 1-sized dims
included) and a chain of steps; each step applies one registered TF op (`OP_SPECS`) to
values made before it. Every value is an output of the function, so that a mismatch is
pinned on the first op whose inputs agree bit for bit and whose output does not
(`test_differential_fuzz.py`). Inputs carry edge values (NaN, ±inf, ±0.0, integer
extremes) drawn by hypothesis, so a failure shrinks to a small reproducer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import tensorflow as tf
from hypothesis import strategies as st

from tfxla_lite.clustering.registry import OP_RULES

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64")
NUMERIC = FLOATS + INTS
BOOL = ("bool",)
ALL_DTYPES = NUMERIC + BOOL
# Shapes with 0- and 1-sized dims and scalars: where index arithmetic goes wrong.
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,), (3,), (0,), (2, 3), (1, 3), (2, 0), (2, 1, 2))

Builder = Callable[[list[tf.Tensor]], tf.Tensor]
# plan(draw, operand shapes) -> builder; draws the op's attributes (axes, sizes) up front.
Plan = Callable[[Any, list[tuple[int, ...]]], Builder]


@dataclass(frozen=True)
class OpSpec:
    """How the fuzzer builds one TF op: its operand count, the dtypes its first operand
    may have, the rank it needs, and `plan`, which draws attributes and returns the
    builder. `same_dtype`: every operand has the first one's dtype (else the second is
    the bool condition of a select, see `operand_dtypes`)."""

    op_type: str
    arity: int
    dtypes: tuple[str, ...]
    plan: Plan
    min_rank: int = 0
    operand_dtypes: Callable[[str], tuple[str, ...]] | None = None
    nonempty: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _fixed(fn: Callable[..., tf.Tensor]) -> Plan:
    return lambda draw, shapes: lambda xs: fn(*xs)


def _raw(name: str, **attrs: Any) -> Plan:
    op = getattr(tf.raw_ops, name)
    if name in _UNARY_RAW:
        return _fixed(lambda x: op(x=x, **attrs))
    return _fixed(lambda x, y: op(x=x, y=y, **attrs))


_UNARY_RAW = frozenset({
    "Abs", "Neg", "Exp", "Expm1", "Log", "Log1p", "Sqrt", "Rsqrt", "Reciprocal", "Inv",
    "Square", "Sin", "Cos", "Tan", "Atan", "Tanh", "Sigmoid", "Erf", "Erfc", "Floor", "Ceil",
    "Rint", "Round", "Sign", "IsFinite", "IsInf", "IsNan", "OnesLike", "ZerosLike",
    "LogicalNot"})
_GRAD_RAW = ("ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "SoftplusGrad", "SoftsignGrad",
             "LeakyReluGrad")
_Y_DY_GRAD_RAW = ("SigmoidGrad", "TanhGrad", "SqrtGrad", "RsqrtGrad", "ReciprocalGrad",
                  "InvGrad")


def _axis(draw: Any, rank: int) -> int:
    return draw(st.integers(-rank, rank - 1)) if rank else 0


def _reduction(name: str) -> Plan:
    op = getattr(tf.raw_ops, name)

    def plan(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
        rank = len(shapes[0])
        axes = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank)) \
            if rank else []
        keep = draw(st.booleans())
        return lambda xs: op(input=xs[0], axis=tf.constant(axes, tf.int32), keep_dims=keep)

    return plan


def _arg_reduction(name: str) -> Plan:
    op = getattr(tf.raw_ops, name)

    def plan(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
        axis = _axis(draw, len(shapes[0]))
        out = draw(st.sampled_from((tf.int32, tf.int64)))
        return lambda xs: op(input=xs[0], dimension=tf.constant(axis), output_type=out)

    return plan


def _scan(name: str) -> Plan:
    op = getattr(tf.raw_ops, name)

    def plan(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
        axis = _axis(draw, len(shapes[0]))
        exclusive, reverse = draw(st.booleans()), draw(st.booleans())
        return lambda xs: op(x=xs[0], axis=tf.constant(axis), exclusive=exclusive,
                             reverse=reverse)

    return plan


def _reverse(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    rank = len(shapes[0])
    axes = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank)) if rank else []
    return lambda xs: tf.raw_ops.ReverseV2(tensor=xs[0], axis=tf.constant(axes, tf.int32))


def _roll(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    axis, shift = _axis(draw, len(shapes[0])), draw(st.integers(-4, 4))
    return lambda xs: tf.roll(xs[0], shift, axis)


def _transpose(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    perm = draw(st.permutations(range(len(shapes[0]))))
    return lambda xs: tf.transpose(xs[0], perm)


def _reshape_flat(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    return lambda xs: tf.reshape(xs[0], [-1])


def _expand(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    axis = draw(st.integers(-len(shapes[0]) - 1, len(shapes[0])))
    return lambda xs: tf.expand_dims(xs[0], axis)


def _squeeze(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    return lambda xs: tf.squeeze(xs[0])


def _tile(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    multiples = draw(st.lists(st.integers(0, 2), min_size=len(shapes[0]),
                              max_size=len(shapes[0])))
    return lambda xs: tf.tile(xs[0], multiples)


def _pad(name: str) -> Plan:
    def plan(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
        widths = [[draw(st.integers(0, 2)), draw(st.integers(0, 2))] for _ in shapes[0]]
        if name == "PadV2":
            value = draw(st.sampled_from((0, 1, -1)))
            return lambda xs: tf.raw_ops.PadV2(input=xs[0], paddings=widths,
                                               constant_values=tf.cast(value, xs[0].dtype))
        if name == "MirrorPad":
            mode = draw(st.sampled_from(("REFLECT", "SYMMETRIC")))
            limit = 0 if mode == "REFLECT" else 1
            widths = [[min(a, d - 1 + limit), min(b, d - 1 + limit)] if d else [0, 0]
                      for (a, b), d in zip(widths, shapes[0])]
            widths = [[max(a, 0), max(b, 0)] for a, b in widths]
            return lambda xs: tf.raw_ops.MirrorPad(input=xs[0], paddings=widths, mode=mode)
        return lambda xs: tf.raw_ops.Pad(input=xs[0], paddings=widths)

    return plan


def _slice(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    begin = [draw(st.integers(0, d)) for d in shapes[0]]
    size = [draw(st.integers(0, d - b)) for b, d in zip(begin, shapes[0])]
    return lambda xs: tf.slice(xs[0], begin, size)


def _strided_slice(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    keys = []
    for d in shapes[0]:
        start, stop = draw(st.integers(-d - 1, d + 1)), draw(st.integers(-d - 1, d + 1))
        step = draw(st.sampled_from((1, 2, -1, -2)))
        keys.append(slice(start, stop, step))
    return lambda xs: xs[0][tuple(keys)]


def _concat(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    axis = _axis(draw, len(shapes[0]))
    return lambda xs: tf.concat([xs[0], xs[0]], axis)


def _pack(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    axis = draw(st.integers(0, len(shapes[0])))
    return lambda xs: tf.stack([xs[0], xs[0]], axis)


def _unpack(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    axis = _axis(draw, len(shapes[0]))
    return lambda xs: tf.unstack(xs[0], axis=axis)[-1] if shapes[0][axis] else tf.identity(xs[0])


def _split(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    axis = _axis(draw, len(shapes[0]))
    return lambda xs: tf.split(xs[0], 1, axis)[0]


def _broadcast(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    lead = draw(st.sampled_from((0, 1, 2)))
    return lambda xs: tf.broadcast_to(xs[0], (lead,) + shapes[0])


def _gather(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    axis = draw(st.integers(0, len(shapes[0]) - 1))
    size = shapes[0][axis]
    indices = draw(st.lists(st.integers(0, max(size - 1, 0)), max_size=4)) if size else []
    return lambda xs: tf.gather(xs[0], tf.constant(indices, tf.int32), axis=axis)


def _one_hot(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    depth = draw(st.integers(0, 4))
    return lambda xs: tf.one_hot(xs[0], depth)


def _top_k(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    k = draw(st.integers(0, shapes[0][-1]))
    return lambda xs: tf.math.top_k(xs[0], k).values


def _band(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    lower, upper = draw(st.integers(-1, 2)), draw(st.integers(-1, 2))
    return lambda xs: tf.linalg.band_part(xs[0], lower, upper)


def _clip(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    low, high = sorted((draw(st.integers(-3, 3)), draw(st.integers(-3, 3))))
    return lambda xs: tf.raw_ops.ClipByValue(t=xs[0], clip_value_min=tf.cast(low, xs[0].dtype),
                                             clip_value_max=tf.cast(high, xs[0].dtype))


def _cast(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    target = draw(st.sampled_from(ALL_DTYPES))
    return lambda xs: tf.cast(xs[0], target)


def _leaky(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    alpha = draw(st.sampled_from((0.2, 0.0, -0.5, 1.5)))
    return lambda xs: tf.nn.leaky_relu(xs[0], alpha)


def _softmax(name: str) -> Plan:
    op = getattr(tf.raw_ops, name)
    return _fixed(lambda x: op(logits=x))


def _matmul(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    return lambda xs: tf.linalg.matmul(xs[0], xs[0], transpose_b=True)


def _bias_add(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    return lambda xs: tf.nn.bias_add(xs[0], tf.ones(shapes[0][-1:], xs[0].dtype))


def _select(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
    return lambda xs: tf.raw_ops.SelectV2(condition=xs[1], t=xs[0], e=-xs[0]) \
        if xs[0].dtype != tf.bool else tf.raw_ops.SelectV2(condition=xs[1], t=xs[0], e=xs[1])


def _segment(name: str) -> Plan:
    op = getattr(tf.raw_ops, name)

    def plan(draw: Any, shapes: list[tuple[int, ...]]) -> Builder:
        rows, segments = shapes[0][0], draw(st.integers(0, 3))
        ids = draw(st.lists(st.integers(0, max(segments - 1, 0)), min_size=rows,
                            max_size=rows))
        return lambda xs: op(data=xs[0], segment_ids=tf.constant(ids, tf.int32),
                             num_segments=segments)

    return plan


def _float_input(dtype: str) -> tuple[str, ...]:
    return (dtype, "bool")


def _specs() -> list[OpSpec]:
    specs: list[OpSpec] = []
    float_unary = ("Exp", "Expm1", "Log", "Log1p", "Sqrt", "Rsqrt", "Reciprocal", "Inv",
                   "Sin", "Cos", "Tan", "Atan", "Tanh", "Sigmoid", "Erf", "Erfc", "Floor",
                   "Ceil", "Rint", "Round", "IsFinite", "IsInf", "IsNan")
    specs += [OpSpec(n, 1, FLOATS, _raw(n)) for n in float_unary]
    specs += [OpSpec(n, 1, NUMERIC, _raw(n)) for n in ("Abs", "Neg", "Square", "Sign")]
    specs += [OpSpec(n, 1, ALL_DTYPES, _raw(n)) for n in ("OnesLike", "ZerosLike")]
    specs.append(OpSpec("LogicalNot", 1, BOOL, _raw("LogicalNot")))
    specs += [OpSpec(n, 1, FLOATS, _fixed(getattr(tf.nn, f))) for n, f in (
        ("Relu", "relu"), ("Relu6", "relu6"), ("Elu", "elu"), ("Selu", "selu"),
        ("Softplus", "softplus"), ("Softsign", "softsign"))]
    specs.append(OpSpec("LeakyRelu", 1, FLOATS, _leaky))
    specs += [OpSpec(n, 1, ALL_DTYPES, _fixed(getattr(tf.raw_ops, n) and (
        lambda x, _n=n: getattr(tf.raw_ops, _n)(input=x)))) for n in (
        "Identity", "Snapshot", "StopGradient")]
    binary_numeric = ("Add", "AddV2", "Sub", "Mul", "Div", "FloorDiv", "FloorMod",
                      "TruncateDiv", "TruncateMod", "Maximum", "Minimum", "Pow",
                      "SquaredDifference")
    specs += [OpSpec(n, 2, NUMERIC, _raw(n)) for n in binary_numeric]
    specs += [OpSpec(n, 2, FLOATS, _raw(n)) for n in (
        "RealDiv", "DivNoNan", "Xdivy", "Xlogy", "Xlog1py", "Atan2")]
    specs += [OpSpec(n, 2, NUMERIC, _raw(n)) for n in (
        "Less", "LessEqual", "Greater", "GreaterEqual")]
    specs += [OpSpec(n, 2, ALL_DTYPES, _raw(n)) for n in ("Equal", "NotEqual")]
    specs += [OpSpec(n, 2, BOOL, _raw(n)) for n in ("LogicalAnd", "LogicalOr")]
    specs += [OpSpec(n, 2, INTS, _raw(n)) for n in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")]
    specs += [OpSpec(n, 2, FLOATS, _fixed(lambda g, x, _n=n: getattr(tf.raw_ops, _n)(
        gradients=g, features=x))) for n in _GRAD_RAW]
    specs += [OpSpec(n, 2, FLOATS, _fixed(lambda y, dy, _n=n: getattr(tf.raw_ops, _n)(
        y=y, dy=dy))) for n in _Y_DY_GRAD_RAW]
    specs.append(OpSpec("AddN", 2, NUMERIC, _fixed(lambda x, y: tf.math.add_n([x, y, x]))))
    specs.append(OpSpec("SelectV2", 2, ALL_DTYPES, _select, operand_dtypes=_float_input))
    specs.append(OpSpec("Select", 2, ALL_DTYPES, _fixed(
        lambda x, c: tf.raw_ops.Select(condition=c, x=x, y=tf.zeros_like(x))),
        operand_dtypes=_float_input))
    specs.append(OpSpec("ClipByValue", 1, NUMERIC, _clip))
    specs += [OpSpec(n, 1, NUMERIC, _reduction(n)) for n in ("Sum", "Mean", "Prod", "Max",
                                                             "Min")]
    specs += [OpSpec(n, 1, BOOL, _reduction(n)) for n in ("All", "Any")]
    specs += [OpSpec(n, 1, NUMERIC + BOOL, _arg_reduction(n), min_rank=1, nonempty=True)
              for n in ("ArgMax", "ArgMin")]
    specs += [OpSpec(n, 1, NUMERIC, _scan(n), min_rank=1) for n in ("Cumsum", "Cumprod")]
    specs.append(OpSpec("CumulativeLogsumexp", 1, FLOATS, _scan("CumulativeLogsumexp"),
                        min_rank=1))
    specs.append(OpSpec("L2Loss", 1, FLOATS, _fixed(tf.nn.l2_loss)))
    specs += [OpSpec(n, 1, FLOATS, _softmax(n), min_rank=1) for n in ("Softmax",
                                                                      "LogSoftmax")]
    specs.append(OpSpec("ReverseV2", 1, ALL_DTYPES, _reverse))
    specs.append(OpSpec("Roll", 1, ALL_DTYPES, _roll, min_rank=1))
    specs.append(OpSpec("Transpose", 1, ALL_DTYPES, _transpose))
    specs.append(OpSpec("Reshape", 1, ALL_DTYPES, _reshape_flat))
    specs.append(OpSpec("ExpandDims", 1, ALL_DTYPES, _expand))
    specs.append(OpSpec("Squeeze", 1, ALL_DTYPES, _squeeze))
    specs.append(OpSpec("Tile", 1, ALL_DTYPES, _tile))
    specs += [OpSpec(n, 1, NUMERIC, _pad(n)) for n in ("Pad", "PadV2", "MirrorPad")]
    specs.append(OpSpec("Slice", 1, ALL_DTYPES, _slice))
    specs.append(OpSpec("StridedSlice", 1, ALL_DTYPES, _strided_slice, min_rank=1))
    specs.append(OpSpec("ConcatV2", 1, ALL_DTYPES, _concat, min_rank=1))
    specs.append(OpSpec("Pack", 1, ALL_DTYPES, _pack))
    specs.append(OpSpec("Unpack", 1, ALL_DTYPES, _unpack, min_rank=1))
    specs.append(OpSpec("Split", 1, ALL_DTYPES, _split, min_rank=1))
    specs.append(OpSpec("BroadcastTo", 1, ALL_DTYPES, _broadcast))
    specs.append(OpSpec("GatherV2", 1, ALL_DTYPES, _gather, min_rank=1))
    specs.append(OpSpec("OneHot", 1, INTS, _one_hot))
    specs.append(OpSpec("TopKV2", 1, FLOATS + INTS, _top_k, min_rank=1))
    specs.append(OpSpec("MatrixBandPart", 1, ALL_DTYPES, _band, min_rank=2))
    specs.append(OpSpec("Cast", 1, ALL_DTYPES, _cast))
    specs.append(OpSpec("MatMul", 1, FLOATS + ("int32",), _matmul, min_rank=2))
    specs.append(OpSpec("BiasAdd", 1, NUMERIC, _bias_add, min_rank=2))
    specs += [OpSpec(n, 1, NUMERIC, _segment(n), min_rank=1) for n in (
        "UnsortedSegmentSum", "UnsortedSegmentProd", "UnsortedSegmentMax",
        "UnsortedSegmentMin")]
    specs.append(OpSpec("Shape", 1, ALL_DTYPES, _fixed(tf.shape)))
    specs.append(OpSpec("Size", 1, ALL_DTYPES, _fixed(tf.size)))
    specs.append(OpSpec("Rank", 1, ALL_DTYPES, _fixed(tf.rank)))
    # Only the dtypes each lowering registers: a must-compile refusal of another dtype is
    # a missing lowering, which docs/supported_ops.md lists, not a wrong value.
    return [replace(s, dtypes=tuple(d for d in s.dtypes if d in OP_RULES[s.op_type].dtypes))
            for s in specs if s.op_type in OP_RULES]


OP_SPECS: tuple[OpSpec, ...] = tuple(_specs())


def _values(dtype: str) -> st.SearchStrategy[Any]:
    if dtype == "bool":
        return st.booleans()
    if dtype in INTS:
        info = np.iinfo(dtype)
        return st.one_of(st.integers(-6, 6), st.sampled_from((int(info.min), int(info.max))))
    edges = st.sampled_from((np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 0.5, 65504.0,
                             1e-8, 1e30))
    # hypothesis favours whole numbers; fractions are where rounding ops differ
    fractions = st.integers(-8000, 8000).map(lambda k: k / 1000.0)
    return st.one_of(st.floats(-8, 8, width=32), fractions, edges)


@dataclass
class RandomGraph:
    """A drawn graph: inputs (NumPy arrays) and steps (op type, builder, operand indices
    into the value list: the inputs first, then each step's result in order)."""

    inputs: list[np.ndarray]
    steps: list[tuple[str, Builder, tuple[int, ...]]]

    def function(self) -> Callable[..., list[tf.Tensor]]:
        steps = self.steps

        def graph(*xs: tf.Tensor) -> list[tf.Tensor]:
            values = list(xs)
            for _, build, operands in steps:
                values.append(build([values[i] for i in operands]))
            return values[len(xs):]

        return graph

    def describe(self) -> str:
        lines = [f"x{i}: {a.dtype}{list(a.shape)} = {a.tolist()!r}"
                 for i, a in enumerate(self.inputs)]
        count = len(self.inputs)
        lines += [f"v{count + k} = {op}({', '.join(f'v{i}' for i in operands)})"
                  for k, (op, _, operands) in enumerate(self.steps)]
        return "\n".join(lines)


def _array(draw: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    size = int(np.prod(shape, dtype=np.int64))
    elements = draw(st.lists(_values(dtype), min_size=size, max_size=size))
    numpy_dtype = tf.as_dtype(dtype).as_numpy_dtype
    with np.errstate(over="ignore", invalid="ignore"):
        return np.array(elements, dtype=np.float64 if dtype in FLOATS else None).astype(
            numpy_dtype).reshape(shape) if size else np.zeros(shape, numpy_dtype)


@st.composite
def random_graphs(draw: Any, dtypes: Sequence[str] = ALL_DTYPES, max_steps: int = 4
                  ) -> RandomGraph:
    """A graph whose first input has one of `dtypes`; a condition input when needed."""
    dtype = draw(st.sampled_from(list(dtypes)))
    shape = draw(st.sampled_from(SHAPES))
    inputs = [_array(draw, dtype, shape)]
    if draw(st.booleans()):  # a second input: a scalar or the same shape, for broadcasting
        inputs.append(_array(draw, dtype, draw(st.sampled_from(((), shape)))))
    inputs.append(_array(draw, "bool", shape))
    meta = [(a.dtype.name if a.dtype.name != "bool" else "bool", a.shape) for a in inputs]
    steps: list[tuple[str, Builder, tuple[int, ...]]] = []
    with tf.Graph().as_default():  # shapes and dtypes of each step, from TF's own inference
        values = [tf.compat.v1.placeholder(tf.as_dtype(d), s) for d, s in meta]
        for _ in range(draw(st.integers(1, max_steps))):
            step = _draw_step(draw, values)
            if step is None:
                break
            steps.append(step[0])
            values.append(step[1])
    return RandomGraph(inputs, steps)


def _draw_step(draw: Any, values: list[tf.Tensor]) -> tuple[tuple, tf.Tensor] | None:
    for _ in range(8):
        first = draw(st.integers(0, len(values) - 1))
        x = values[first]
        dtype, shape = x.dtype.name, tuple(x.shape.as_list())
        candidates = [s for s in OP_SPECS if dtype in s.dtypes and len(shape) >= s.min_rank
                      and not (s.nonempty and 0 in shape)]
        if not candidates:
            continue
        spec = draw(st.sampled_from(candidates))
        operands = [first]
        wanted = spec.operand_dtypes(dtype) if spec.operand_dtypes else (dtype,) * spec.arity
        for want in wanted[1:spec.arity]:
            fits = [i for i, v in enumerate(values) if v.dtype.name == want
                    and tuple(v.shape.as_list()) in (shape, ())]
            if not fits:
                break
            operands.append(draw(st.sampled_from(fits)))
        if len(operands) < spec.arity:
            continue
        build = spec.plan(draw, [tuple(values[i].shape.as_list()) for i in operands])
        try:
            result = build([values[i] for i in operands])
        except (TypeError, ValueError, tf.errors.OpError):
            continue  # TF refuses these attributes or dtypes: draw another op
        if isinstance(result, (list, tuple)) or not result.shape.is_fully_defined():
            continue
        return (spec.op_type, build, tuple(operands)), result
    return None
