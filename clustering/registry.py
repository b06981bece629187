"""The TF op registry: for each TF op type, its compilability rule and its HLO lowering.

`mark.py` asks `compilability(op)`, `lower.py` calls each op's `lower(ctx, op, operands)`.
One op, one registration: the rules live in the `rules_*.py` files, one per family,
each registering into `OP_RULES` on import; this file holds what they share. A static
input (an axis, a shape) may be any small integer computation of Consts the rules can
lower (the shape arithmetic of gradients): `constant_value` folds it by lowering it and
running the NumPy evaluator, as TF's XLA bridge folds compile-time constants. Lowerings
broadcast every operand to the op's static result shape (`ctx.broadcast_to`).
"""

from __future__ import annotations

import functools
import sysconfig
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.hlo import Computation, HloModule, Instruction, Shape, numpy_dtype

if TYPE_CHECKING:  # TF is heavy; type names only.
    import tensorflow as tf

# TF dtype name -> XLA element type.
_ELEMENT_TYPES: dict[str, str] = {
    "bool": "pred", "int8": "s8", "int16": "s16", "int32": "s32", "int64": "s64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
}

# Dtype sets the rules pick from (TF dtype names). The 2-byte floats compute as XLA
# computes them: element-wise in their own type (each result rounded to it), sums,
# products and dots accumulated in float32 (`LoweringContext.reduce` and `.dot`).
HALF = frozenset({"float16", "bfloat16"})
FLOAT = frozenset({"float32", "float64"}) | HALF
INTEGER = frozenset({"int32", "int64"})
NUMERIC = FLOAT | INTEGER
BOOL = frozenset({"bool"})
ALL = NUMERIC | BOOL

# The same 2-byte floats as HLO element types.
HALF_ELEMENT_TYPES = frozenset({"f16", "bf16"})
# The layouts of TF's convolution, pooling and batch-norm ops (`data_format`).
DATA_FORMATS = ("NHWC", "NCHW", "NDHWC", "NCDHW")

LowerFn = Callable[["LoweringContext", "tf.Operation", list[Any]], list[Instruction]]
CheckFn = Callable[["tf.Operation"], "str | None"]
OutputDimsFn = Callable[["tf.Operation", int], "tuple[int, ...] | None"]


class LoweringError(ValueError):
    """A TF op that its lowering rule cannot express in HLO."""


@dataclass(frozen=True)
class OpRule:
    """How one TF op type compiles.

    `dtypes` bounds the dtypes of every input and output except those listed in
    `static_inputs` (whose values must be compile-time constants: axes, perms) and
    `unused_inputs` (whose values the lowering never reads, e.g. Reshape's shape: the
    static output shape says it). `static_leading` names an integer attr (DynamicStitch's
    `N`): that many leading inputs are static too. `check` rejects op instances the
    lowering cannot handle, returning a reason. `output_dims(op, index)` gives the dims
    of an output that TF's shape inference leaves unknown but the rule knows (None when
    it does not): FusedBatchNormV3's empty reserve space, and the ZerosLike a gradient
    makes of it.
    """

    op_type: str
    lower: LowerFn
    dtypes: frozenset[str]
    static_inputs: tuple[int, ...] = ()
    unused_inputs: tuple[int, ...] = ()
    check: CheckFn | None = None
    note: str = ""
    static_leading: str = ""
    output_dims: OutputDimsFn | None = None

    def _static(self, op: tf.Operation) -> tuple[int, ...]:
        leading = tuple(range(int(op.get_attr(self.static_leading)))) \
            if self.static_leading else ()
        return self.static_inputs + leading

    def static_input_indices(self, op: tf.Operation) -> list[int]:
        return _normalize(self._static(op), len(op.inputs))

    def value_free_indices(self, op: tf.Operation) -> set[int]:
        """Inputs whose runtime values the lowering does not take as operands."""
        return set(_normalize(self._static(op) + self.unused_inputs, len(op.inputs)))


OP_RULES: dict[str, OpRule] = {}


def register(
    *op_types: str,
    dtypes: frozenset[str],
    static_inputs: tuple[int, ...] = (),
    unused_inputs: tuple[int, ...] = (),
    check: CheckFn | None = None,
    note: str = "",
    static_leading: str = "",
    output_dims: OutputDimsFn | None = None,
) -> Callable[[LowerFn], LowerFn]:
    """Register `lower` for each of `op_types`; negative input indices count from the end.
    `note` is the limit users read in docs/supported_ops.md."""

    def decorate(lower: LowerFn) -> LowerFn:
        for op_type in op_types:
            if op_type in OP_RULES:
                raise ValueError(f"TF op type {op_type} registered twice")
            OP_RULES[op_type] = OpRule(op_type, lower, dtypes, static_inputs, unused_inputs,
                                       check, note, static_leading, output_dims)
        return lower

    return decorate


def _normalize(indices: Sequence[int], count: int) -> list[int]:
    return sorted({i % count for i in indices if -count <= i < count})


# -- dtypes and shapes ---------------------------------------------------------------------
def element_type(dtype: tf.DType) -> str:
    """The XLA element type of a TF dtype; LoweringError when XLA has none."""
    try:
        return _ELEMENT_TYPES[dtype.base_dtype.name]
    except KeyError:
        raise LoweringError(f"no HLO element type for TF dtype {dtype.name}") from None


def value_range(element_type_name: str) -> tuple[Any, Any]:
    """The lowest and highest finite values of an XLA element type (bf16 included)."""
    dtype = numpy_dtype(element_type_name)
    if dtype.name == "bfloat16":
        import ml_dtypes  # TF's own dependency: NumPy has no bfloat16 finfo

        info: Any = ml_dtypes.finfo(dtype)
    else:
        info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    return info.min, info.max


def static_dims(tensor: tf.Tensor) -> tuple[int, ...] | None:
    """The tensor's dims when its shape is fully known, else None."""
    shape = tensor.shape
    if shape.rank is None or any(d is None for d in shape.as_list()):
        return None
    return tuple(int(d) for d in shape.as_list())


def same_dims_as_input(input_index: int) -> OutputDimsFn:
    """`OpRule.output_dims` of an op whose outputs have the dims of one of its inputs."""

    def dims(op: tf.Operation, index: int) -> tuple[int, ...] | None:
        return known_dims(op.inputs[input_index])

    return dims


def variable_spec(handle: tf.Tensor) -> tuple[tf.DType, tuple[int, ...]] | None:
    """The dtype and static dims of the variable a resource tensor holds (its handle
    data, which a tf.function's captured variables carry), or None where unknown."""
    from tensorflow.python.framework import dtypes
    from tensorflow.python.ops import handle_data_util

    data = handle_data_util.get_resource_handle_data(handle)
    if not data.is_set or len(data.shape_and_type) != 1:
        return None
    found = data.shape_and_type[0]
    if found.shape.unknown_rank or any(d.size < 0 for d in found.shape.dim):
        return None
    return dtypes.as_dtype(found.dtype), tuple(int(d.size) for d in found.shape.dim)


def tensor_shape(tensor: tf.Tensor) -> Shape:
    """The HLO shape of `tensor`; of a resource tensor, its variable's value."""
    if tensor.dtype.base_dtype.name == "resource":
        spec = variable_spec(tensor)
        if spec is None:
            raise LoweringError(f"variable {tensor.name} has no known dtype and static shape")
        return Shape(element_type(spec[0]), spec[1])
    dims = static_dims(tensor)
    if dims is None:
        raise LoweringError(f"shape of {tensor.name} is not fully static: {tensor.shape}")
    return Shape(element_type(tensor.dtype), dims)


def known_dims(tensor: tf.Tensor) -> tuple[int, ...] | None:
    """The tensor's static dims, or those of its folded constant value (BroadcastGradientArgs
    has outputs of unknown shape whose values are known at compile time)."""
    dims = static_dims(tensor)
    if dims is not None:
        return dims
    rule = OP_RULES.get(tensor.op.type)
    if rule is not None and rule.output_dims is not None:
        dims = rule.output_dims(tensor.op, tensor.value_index)
        if dims is not None:
            return dims
    value = constant_value(tensor)
    return None if value is None else tuple(value.shape)


# Folding stops at results larger than this: static inputs are axes and shapes.
_FOLD_LIMIT = 1 << 12
_FOLDABLE_DTYPES = frozenset({"int32", "int64", "bool"})


def attribute(op: tf.Operation, name: str, default: Any) -> Any:
    """`op`'s attribute `name` (strings decoded), or `default` where the op has none."""
    try:
        value = op.get_attr(name)
    except ValueError:
        return default
    return value.decode() if isinstance(value, bytes) else value


def constant_value(tensor: tf.Tensor) -> np.ndarray | None:
    """The compile-time value of `tensor`: a Const's value (directly or through Identity
    ops), or the folded value of a small integer computation of such values.

    Marking, `dynamic.is_static` and lowering ask again and again for the same tensors
    (a fold lowers and evaluates HLO): answers are kept per graph, whose ops never
    change once made, and handed out as copies.
    """
    try:
        known = _CONSTANTS.setdefault(tensor.graph, {})
    except TypeError:  # a graph without weak references: no memo
        known = {}
    if tensor.name not in known:
        known[tensor.name] = _constant_value(tensor)
    value = known[tensor.name]
    return None if value is None else value.copy()


_CONSTANTS: weakref.WeakKeyDictionary[Any, dict[str, np.ndarray | None]] = (
    weakref.WeakKeyDictionary())


def _constant_value(tensor: tf.Tensor) -> np.ndarray | None:
    from tensorflow.python.framework import tensor_util

    op = tensor.op
    while op.type in ("Identity", "StopGradient") and op.inputs:
        tensor = op.inputs[0]
        op = tensor.op
    if op.type == "Const":
        return tensor_util.MakeNdarray(op.get_attr("value"))
    return _fold(tensor)


def _fold(tensor: tf.Tensor) -> np.ndarray | None:
    """Lower `tensor`'s op on constant operands and evaluate it, or None when it is not a
    compile-time constant (a runtime input, a stateful op, a float, too large, no rule)."""
    from tfxla_lite.hlo.evaluator import evaluate

    op = tensor.op
    rule = OP_RULES.get(op.type)
    if rule is None or not all(t.dtype.base_dtype.name in _FOLDABLE_DTYPES
                               for t in op.outputs):
        return None
    try:
        if op.op_def.is_stateful:
            return None
    except (AttributeError, ValueError):
        return None
    value_free = rule.value_free_indices(op)
    module = HloModule(f"fold_{op.type}")
    entry = module.new_computation("main", entry=True)
    ctx = LoweringContext(module, entry)
    ctx.begin(op)
    operands: list[Any] = []
    for i, source in enumerate(op.inputs):
        if i in value_free:
            operands.append(None)
            continue
        if source.dtype.base_dtype.name not in rule.dtypes:
            return None
        value = constant_value(source)
        if value is None or value.size > _FOLD_LIMIT:
            return None
        operands.append(ctx.constant(value, element_type(source.dtype)))
    try:
        if rule.check is not None and rule.check(op) is not None:
            return None
        results = rule.lower(ctx, op, operands)
        entry.root = entry.create("tuple", results)
        values = evaluate(module)
    except Exception:  # noqa: BLE001 - folding is best effort; the op then stays a runtime value
        return None
    result = np.asarray(values[tensor.value_index])
    return result if result.size <= _FOLD_LIMIT else None


# -- source locations ------------------------------------------------------------------------
_PACKAGE_DIRS = tuple(str(p) for p in (Path(__file__).resolve().parent,
                                       Path(__file__).resolve().parents[1] / "tfxla_lite"))
# Installed packages and the standard library (pytest, absl, Keras, TF: never the user's).
_INSTALLED_DIRS = tuple(sorted({path for key in ("stdlib", "platstdlib", "purelib", "platlib")
                                if (path := sysconfig.get_paths().get(key))}, key=len,
                               reverse=True))
_INSTALLED_MARKERS = ("/site-packages/", "/dist-packages/", "<frozen ", "<string>")
# TF's own internals: the frames under the library call that made an op (not Keras's
# `keras/src/backend/tensorflow/`, which is that library call).
_TENSORFLOW_MARKERS = ("/site-packages/tensorflow/", "/dist-packages/tensorflow/",
                       "/tensorflow/python/")


@dataclass(frozen=True)
class SourceFrames:
    """Where an op was made: the user's frame and, when a library (Keras, ...) made the
    op for it, that library's innermost frame, each `(filename, line)` or None."""

    user: tuple[str, int] | None
    library: tuple[str, int] | None

    @property
    def primary(self) -> tuple[str, int] | None:
        """The frame HLO metadata and dumps name: the user's, else the library's."""
        return self.user if self.user is not None else self.library

    def __str__(self) -> str:
        """'model.py:12 (via keras/src/layers/convolutional/base_conv.py:250)'."""
        if self.user is None:
            return "" if self.library is None else _short(self.library)
        text = f"{self.user[0]}:{self.user[1]}"
        return text if self.library is None else f"{text} (via {_short(self.library)})"


def source_frames(op: tf.Operation) -> SourceFrames:
    """The frames that made `op`: the user's is the innermost one outside installed
    packages, the standard library and tfxla-lite; the library's is the innermost one
    outside TF's own internals and tfxla-lite, kept only when it is not the user's.

    Marking and lowering both ask for every op, and a traceback's frames are made one
    by one on access: the answer is kept per graph, and frames are read innermost first
    only until the user's (`StackTrace` indexes without converting the whole stack).
    """
    try:
        known = _SOURCES.setdefault(op.graph, {})
    except TypeError:  # a graph without weak references: no memo
        known = {}
    frames_of_op = known.get(op.name)
    if frames_of_op is not None:
        return frames_of_op
    user = library = None
    try:
        frames = op.traceback
        count = len(frames)
    except Exception:  # noqa: BLE001 - ops imported from a GraphDef carry no traceback
        count = 0
    for index in range(count - 1, -1, -1):
        frame = frames[index]
        filename = str(frame.filename)
        if not _is_installed_file(filename):
            user = (filename, int(frame.lineno))
            break
        if library is None and not _is_tensorflow_file(filename):
            library = (filename, int(frame.lineno))
    frames_of_op = SourceFrames(user, library)
    known[op.name] = frames_of_op
    return frames_of_op


def source_location(op: tf.Operation) -> tuple[str, int] | None:
    """The frame that names `op` in HLO metadata, dumps and errors (`SourceFrames.primary`)."""
    return source_frames(op).primary


_SOURCES: weakref.WeakKeyDictionary[Any, dict[str, SourceFrames]] = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=4096)
def _is_installed_file(filename: str) -> bool:
    """Not the user's: tfxla-lite, the standard library, an installed package; but a test
    file is the user's wherever it lies (Keras's own `*_test.py` in site-packages)."""
    name = filename.rsplit("/", 1)[-1]
    if name.endswith("_test.py") or (name.startswith("test_") and name.endswith(".py")):
        return False
    return (filename.startswith(_PACKAGE_DIRS) or filename.startswith(_INSTALLED_DIRS)
            or any(marker in filename for marker in _INSTALLED_MARKERS))


@functools.lru_cache(maxsize=4096)
def _is_tensorflow_file(filename: str) -> bool:
    return (filename.startswith(_PACKAGE_DIRS) or "<frozen " in filename
            or any(marker in filename for marker in _TENSORFLOW_MARKERS))


def _short(frame: tuple[str, int]) -> str:
    """An installed file by its path inside site-packages ('keras/src/...'), with its line."""
    filename = frame[0]
    for marker in _INSTALLED_MARKERS[:2]:
        if marker in filename:
            filename = filename.rsplit(marker, 1)[1]
            break
    else:
        for directory in _INSTALLED_DIRS:
            if filename.startswith(directory + "/"):
                filename = filename[len(directory) + 1:]
                break
    return f"{filename}:{frame[1]}"


def op_metadata(op: tf.Operation) -> dict[str, Any]:
    """HLO metadata naming the TF op and the user's source line it came from."""
    metadata: dict[str, Any] = {"op_type": op.type, "op_name": op.name}
    location = source_location(op)
    if location is not None:
        metadata["source_file"], metadata["source_line"] = location
    return metadata


# -- the lowering context --------------------------------------------------------------------
class LoweringContext:
    """Builds instructions for the TF op being lowered, stamping its metadata on each."""

    def __init__(self, module: HloModule, computation: Computation) -> None:
        self.module = module
        self.computation = computation
        self.op: tf.Operation | None = None
        self.metadata: dict[str, Any] = {}
        # Resource handle tensor name -> the variable's value so far in the cluster
        # (rules_variables.py): reads see earlier writes of the same lowering.
        self.variables: dict[str, Instruction] = {}

    def begin(self, op: tf.Operation) -> None:
        """Start lowering `op`: later instructions carry its metadata."""
        self.op = op
        self.metadata = op_metadata(op)

    # -- instruction builders --
    def emit(self, opcode: str, operands: Sequence[Instruction], shape: Shape | None = None,
             called_computations: Sequence[Computation] = (), **attributes: Any) -> Instruction:
        return self.computation.create(opcode, list(operands), shape=shape,
                                       called_computations=called_computations,
                                       metadata=self.metadata, **attributes)

    def constant(self, value: Any, element_type_name: str) -> Instruction:
        inst = self.computation.add_constant(value, element_type_name)
        inst.metadata.update(self.metadata)
        return inst

    def full(self, value: Any, shape: Shape) -> Instruction:
        """`value` broadcast to `shape` (a scalar constant when `shape` is a scalar)."""
        scalar = self.constant(value, shape.element_type)
        if not shape.dims:
            return scalar
        return self.emit("broadcast", [scalar], shape=shape, dimensions=())

    def reshape(self, x: Instruction, dims: Sequence[int]) -> Instruction:
        dims = tuple(int(d) for d in dims)
        if x.shape.dims == dims:
            return x
        if int(np.prod(dims, dtype=np.int64)) != x.shape.num_elements:
            raise LoweringError(f"cannot reshape {x.shape} to {dims}")
        return self.emit("reshape", [x], shape=x.shape.with_dims(dims))

    def convert(self, x: Instruction, element_type_name: str) -> Instruction:
        if x.shape.element_type == element_type_name:
            return x
        return self.emit("convert", [x], element_type=element_type_name)

    def broadcast_to(self, x: Instruction, dims: Sequence[int]) -> Instruction:
        """Broadcast `x` to `dims` by NumPy's rules: right-aligned, size-1 dims stretch."""
        dims = tuple(int(d) for d in dims)
        source = x.shape.dims
        if source == dims:
            return x
        offset = len(dims) - len(source)
        if offset < 0:
            raise LoweringError(f"cannot broadcast {x.shape} to {dims}")
        kept = []
        for i, size in enumerate(source):
            target = dims[i + offset]
            if size == target:
                kept.append(i)
            elif size != 1:
                raise LoweringError(f"cannot broadcast {x.shape} to {dims}")
        if len(kept) != len(source):  # drop the stretched size-1 dims first
            x = self.reshape(x, [source[i] for i in kept])
        return self.emit("broadcast", [x], shape=x.shape.with_dims(dims),
                         dimensions=tuple(i + offset for i in kept))

    def reduce(self, x: Instruction, axes: Sequence[int], kind: str, init: Any) -> Instruction:
        """Reduce `x` over `axes` with the scalar computation `kind`, from `init`. Sums and
        products of 2-byte floats accumulate in f32 (XLA's SumAccumulationType)."""
        etype = x.shape.element_type
        if kind in ("add", "multiply") and etype in HALF_ELEMENT_TYPES:
            wide = self.reduce(self.convert(x, "f32"), axes, kind, init)
            return self.convert(wide, etype)
        computation = self.module.reduction_computation(kind, etype)
        return self.emit("reduce", [x, self.constant(init, etype)],
                         called_computations=[computation], dimensions=tuple(sorted(axes)))

    def dot(self, a: Instruction, b: Instruction, **dimensions: Any) -> Instruction:
        """HLO `dot`; 2-byte floats multiply and accumulate in f32, then round once (what
        XLA's CPU backend does with their dots)."""
        etype = a.shape.element_type
        if etype not in HALF_ELEMENT_TYPES:
            return self.emit("dot", [a, b], **dimensions)
        wide = self.emit("dot", [self.convert(a, "f32"), self.convert(b, "f32")], **dimensions)
        return self.convert(wide, etype)

    # -- facts about the op being lowered --
    def output_shape(self, index: int = 0) -> Shape:
        assert self.op is not None
        tensor = self.op.outputs[index]
        dims = known_dims(tensor)
        if dims is None:
            raise LoweringError(f"shape of {tensor.name} is not fully static: {tensor.shape}")
        return Shape(element_type(tensor.dtype), dims)

    def static_input(self, index: int) -> np.ndarray:
        """The compile-time value of the op's input `index` (a Const, maybe via Identity)."""
        assert self.op is not None
        value = constant_value(self.op.inputs[index])
        if value is None:
            raise LoweringError(f"input {index} of {self.op.name} must be a constant")
        return value

