"""Element types and shapes of HLO values, named and printed as XLA does.

The first stop of the data flow's compiler core: every instruction of an
`HloModule` carries a `Shape`, and every layer below (passes, codegen, the
runtime) reads sizes and NumPy dtypes from here. Layouts are always XLA's
default (row-major, printed `{rank-1,...,0}`): this project never changes them.

A dimension may be dynamic with a bound, as XLA prints after `set-dimension-size`
(`f32[<=8,4]`): `dims` holds the bound, which sizes the buffer, and `dynamic` says
which dimensions are dynamic; the size itself is a value at run time (the evaluator's
arrays are that size; compiled code carries it as an s32, `dynamic_padder.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

try:  # bfloat16 has no NumPy dtype of its own; ml_dtypes ships one (TF depends on it).
    import ml_dtypes

    _BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - the core works without it, minus bf16
    _BFLOAT16 = None

# XLA primitive type name -> NumPy dtype.
_NUMPY_DTYPES: dict[str, np.dtype] = {
    "pred": np.dtype(np.bool_),
    "s8": np.dtype(np.int8),
    "s16": np.dtype(np.int16),
    "s32": np.dtype(np.int32),
    "s64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}
if _BFLOAT16 is not None:
    _NUMPY_DTYPES["bf16"] = _BFLOAT16

ELEMENT_TYPES: tuple[str, ...] = tuple(_NUMPY_DTYPES)
FLOAT_TYPES = frozenset({"f16", "bf16", "f32", "f64"})
SIGNED_TYPES = frozenset({"s8", "s16", "s32", "s64"})
UNSIGNED_TYPES = frozenset({"u8", "u16", "u32", "u64"})
INTEGER_TYPES = SIGNED_TYPES | UNSIGNED_TYPES

# The most elements, and bytes, an array may have: XLA's and TF's int64 limit. Codegen
# indexes and sizes buffers in int64, and the runtime passes sizes as int64: a shape past
# the limit would wrap to a wrong size, or make a loop nest that never ends.
MAX_ARRAY_SIZE = 2**63 - 1


class ShapeSizeError(ValueError):
    """An array shape with more elements or bytes than `MAX_ARRAY_SIZE`."""


def numpy_dtype(element_type: str) -> np.dtype:
    """The NumPy dtype that holds values of an XLA element type."""
    try:
        return _NUMPY_DTYPES[element_type]
    except KeyError:
        raise ValueError(f"unknown element type {element_type!r}") from None


def element_type_of(dtype: np.dtype | type | str) -> str:
    """The XLA element type name of a NumPy dtype (or anything np.dtype accepts)."""
    dtype = np.dtype(dtype)
    for name, candidate in _NUMPY_DTYPES.items():
        if candidate == dtype:
            return name
    raise ValueError(f"no XLA element type for NumPy dtype {dtype}")


@dataclass(frozen=True)
class Shape:
    """An array shape (`element_type`, `dims`) or a tuple of shapes (`tuple_shapes`)."""

    element_type: str
    dims: tuple[int, ...] = ()
    tuple_shapes: tuple[Shape, ...] | None = None
    # One flag per dimension, True where `dims` is a dynamic dimension's bound; () when
    # every dimension is static (so static shapes compare and hash as before).
    dynamic: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if self.tuple_shapes is None:
            if self.element_type not in _NUMPY_DTYPES:
                raise ValueError(f"unknown element type {self.element_type!r}")
            object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))
            dynamic = tuple(bool(f) for f in self.dynamic)
            if dynamic and len(dynamic) != len(self.dims):
                raise ValueError(f"{len(dynamic)} dynamic flags for {len(self.dims)} dims")
            object.__setattr__(self, "dynamic", dynamic if any(dynamic) else ())
            if any(d < 0 for d in self.dims):
                raise ValueError(f"negative dimension in {self.dims}")
            count = math.prod(self.dims)
            if count * _NUMPY_DTYPES[self.element_type].itemsize > MAX_ARRAY_SIZE or \
                    any(d > MAX_ARRAY_SIZE for d in self.dims):
                raise ShapeSizeError(
                    f"shape {self.element_type}[{','.join(map(str, self.dims))}] has {count} "
                    f"elements ({count * _NUMPY_DTYPES[self.element_type].itemsize} bytes): "
                    f"an array holds at most 2^63-1 elements and bytes")
            self.__dict__["num_elements"] = count  # the cached_property's slot
        elif self.element_type != "tuple" or self.dims or self.dynamic:
            raise ValueError("a tuple shape has element_type 'tuple' and no dims")

    @staticmethod
    def array(element_type: str, dims: tuple[int, ...] | list[int] = ()) -> Shape:
        return Shape(element_type, tuple(dims))

    @staticmethod
    def tuple_of(shapes: list[Shape] | tuple[Shape, ...]) -> Shape:
        return Shape("tuple", (), tuple(shapes))

    @staticmethod
    def of_array(array: np.ndarray) -> Shape:
        return Shape(element_type_of(array.dtype), tuple(array.shape))

    @property
    def is_tuple(self) -> bool:
        return self.tuple_shapes is not None

    def is_dynamic_dimension(self, dimension: int) -> bool:
        return bool(self.dynamic) and self.dynamic[dimension]

    @cached_property
    def is_dynamic(self) -> bool:
        """Whether this shape, or a shape in this tuple, has a dynamic dimension."""
        if self.tuple_shapes is not None:
            return any(s.is_dynamic for s in self.tuple_shapes)
        return bool(self.dynamic)

    def with_dynamic(self, dimension: int, dynamic: bool = True) -> Shape:
        """This array shape with `dimension` made dynamic (bounded by its size) or static."""
        self._require_array()
        flags = list(self.dynamic or (False,) * len(self.dims))
        flags[dimension] = dynamic
        return Shape(self.element_type, self.dims, None, tuple(flags))

    def static(self) -> Shape:
        """The shape with every dynamic dimension at its bound, static (tuples too)."""
        if self.tuple_shapes is not None:
            return Shape.tuple_of([s.static() for s in self.tuple_shapes])
        return self if not self.dynamic else Shape(self.element_type, self.dims)

    def admits(self, dims: tuple[int, ...]) -> bool:
        """Whether an array of `dims` is a value of this array shape: static dimensions
        equal, dynamic ones at most their bound."""
        if len(dims) != len(self.dims):
            return False
        if not self.dynamic:
            return tuple(dims) == self.dims
        return all(0 <= d <= bound if flag else d == bound
                   for d, bound, flag in zip(dims, self.dims, self.dynamic, strict=True))

    @property
    def rank(self) -> int:
        self._require_array()
        return len(self.dims)

    # Cached: buffer assignment and the scheduler ask for sizes thousands of times per
    # compile (np.prod costs microseconds a call).
    @cached_property
    def num_elements(self) -> int:
        self._require_array()
        return math.prod(self.dims)

    @cached_property
    def numpy_dtype(self) -> np.dtype:
        self._require_array()
        return _NUMPY_DTYPES[self.element_type]

    @cached_property
    def byte_size(self) -> int:
        """Bytes of a dense row-major buffer; a tuple counts its elements' buffers."""
        if self.tuple_shapes is not None:
            return sum(s.byte_size for s in self.tuple_shapes)
        return self.num_elements * self.numpy_dtype.itemsize

    def with_dims(self, dims: tuple[int, ...] | list[int]) -> Shape:
        """A static shape of this element type and `dims`."""
        return Shape(self.element_type, tuple(dims))

    def with_element_type(self, element_type: str) -> Shape:
        return Shape(element_type, self.dims, None, self.dynamic)

    def _require_array(self) -> None:
        if self.tuple_shapes is not None:
            raise ValueError(f"{self} is a tuple shape, not an array")

    def to_text(self, layout: bool = True) -> str:
        """XLA's spelling: `f32[2,3]{1,0}`, `f32[]`, `(f32[2]{0}, s32[])`."""
        return self._text_with_layout if layout else self._text_without_layout

    # Cached: the printer spells each instruction's shape and its operands' (2-3 per
    # instruction), and a compile prints each module twice (lowered and optimized, for
    # the cache keys): the Transformer step's main cluster printed in 13 ms, not 19.
    @cached_property
    def _text_with_layout(self) -> str:
        return self._spelled(True)

    @cached_property
    def _text_without_layout(self) -> str:
        return self._spelled(False)

    def _spelled(self, layout: bool) -> str:
        if self.tuple_shapes is not None:
            return "(" + ", ".join(s.to_text(layout) for s in self.tuple_shapes) + ")"
        sizes = (f"<={d}" if flag else str(d)
                 for d, flag in zip(self.dims, self.dynamic or (False,) * len(self.dims)))
        text = f"{self.element_type}[{','.join(sizes)}]"
        if layout and self.dims:
            text += "{" + ",".join(str(d) for d in reversed(range(len(self.dims)))) + "}"
        return text

    def __str__(self) -> str:
        return self._text_with_layout
