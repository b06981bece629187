"""Loads the TfxlaLiteLaunch op and keeps the process-wide executable registry.

Where it sits: codegen produces an executable whose entry point has the ABI
`void entry(void** params, void** outputs, void* temp)`; `register_executable` puts
its address under a key in the C++ registry (through ctypes), and the graph rewrite
emits `launch(...)` nodes, which find it by that key at run time.

`tf.load_op_library` and `ctypes.CDLL` open the same file, and share its static state
(checked on TF 2.21), so what ctypes registers is what the kernel sees.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import tensorflow as tf

from tfxla_lite.runtime import build

OP_TYPE = "TfxlaLiteLaunch"
# Must match kAbiVersion in launch_op.cc.
ABI_VERSION = 1

TensorSpecLike = tuple[Any, Sequence[int]]  # (tf.DType | numpy dtype | str, static shape)


@dataclass(frozen=True)
class OpLibrary:
    """The loaded op library: the TF op module and the same file opened by ctypes."""

    path: str
    module: ModuleType
    cdll: ctypes.CDLL


_load_lock = threading.Lock()
_library: OpLibrary | None = None
# key -> the object whose lifetime keeps the entry point's machine code mapped.
_owners: dict[str, Any] = {}
_owners_lock = threading.Lock()


def load_library() -> OpLibrary:
    """Builds the op library if it is not cached, then loads it once per process."""
    global _library
    with _load_lock:
        if _library is None:
            path = str(build.build_op_library())
            module = tf.load_op_library(path)
            cdll = ctypes.CDLL(path)
            _declare_c_functions(cdll)
            version = cdll.tfxla_lite_abi_version()
            if version != ABI_VERSION:
                raise RuntimeError(
                    f"{path} has launch ABI {version}, this tfxla_lite expects {ABI_VERSION}"
                )
            _library = OpLibrary(path=path, module=module, cdll=cdll)
        return _library


def load_ops() -> ModuleType:
    """The op module (`load_ops().tfxla_lite_launch(...)`); registers the op with TF.

    Call it before `tf.graph_util.import_graph_def` of a graph holding launch nodes.
    """
    return load_library().module


def _declare_c_functions(cdll: ctypes.CDLL) -> None:
    int_p = ctypes.POINTER(ctypes.c_int)
    int64_p = ctypes.POINTER(ctypes.c_int64)
    cdll.tfxla_lite_register.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int,
        int_p,
        int_p,
        int64_p,
        ctypes.c_int,
        int_p,
        int_p,
        int64_p,
    ]
    cdll.tfxla_lite_register.restype = ctypes.c_int
    cdll.tfxla_lite_unregister.argtypes = [ctypes.c_char_p]
    cdll.tfxla_lite_unregister.restype = ctypes.c_int
    cdll.tfxla_lite_registry_size.argtypes = []
    cdll.tfxla_lite_registry_size.restype = ctypes.c_int64
    cdll.tfxla_lite_abi_version.argtypes = []
    cdll.tfxla_lite_abi_version.restype = ctypes.c_int


def as_tf_dtype(dtype: Any) -> tf.DType:
    """tf.DType, numpy dtype or type, or a name such as "float32" -> tf.DType."""
    if isinstance(dtype, tf.DType):
        return dtype
    return tf.as_dtype(np.dtype(dtype))


def _static_shape(shape: Any, what: str) -> tuple[int, ...]:
    dims = tf.TensorShape(shape)
    if not dims.is_fully_defined():
        raise ValueError(f"{what}: shape {dims} is not static; an executable has fixed shapes")
    return tuple(int(d) for d in dims.as_list())


def _flatten_specs(specs: Sequence[TensorSpecLike], what: str) -> tuple[int, Any, Any, Any]:
    """Specs -> (count, dtype enums, ranks, all dims concatenated) as ctypes arrays."""
    dtypes, ranks, dims = [], [], []
    for index, (dtype, shape) in enumerate(specs):
        dtypes.append(as_tf_dtype(dtype).as_datatype_enum)
        static = _static_shape(shape, f"{what} {index}")
        ranks.append(len(static))
        dims.extend(static)
    # One spare element each, so that no array is empty (a NULL pointer is fine too).
    return (
        len(dtypes),
        (ctypes.c_int * (len(dtypes) + 1))(*dtypes),
        (ctypes.c_int * (len(ranks) + 1))(*ranks),
        (ctypes.c_int64 * (len(dims) + 1))(*dims),
    )


def register_executable(
    key: str,
    entry_address: int,
    temp_bytes: int,
    input_specs: Sequence[TensorSpecLike],
    output_specs: Sequence[TensorSpecLike],
    owner: Any = None,
) -> None:
    """Makes `key` launchable: `launch(..., key)` will call `entry_address`.

    `entry_address` is the address of a function with the launch ABI (for example
    llvmlite's `get_function_address`); `owner` is any object that keeps its code
    alive (the executable, its JIT engine) and is held until `unregister(key)`.
    Specs are (dtype, static shape) pairs, in argument order. Registering a key
    again replaces the executable.
    """
    if not key:
        raise ValueError("register_executable: the key must be a non-empty string")
    if not entry_address:
        raise ValueError(f"register_executable({key!r}): entry_address is null")
    if temp_bytes < 0:
        raise ValueError(f"register_executable({key!r}): temp_bytes {temp_bytes} < 0")
    n_in, in_dtypes, in_ranks, in_dims = _flatten_specs(input_specs, "input")
    n_out, out_dtypes, out_ranks, out_dims = _flatten_specs(output_specs, "output")
    cdll = load_library().cdll
    with _owners_lock:
        status = cdll.tfxla_lite_register(
            key.encode(),
            ctypes.c_void_p(entry_address),
            int(temp_bytes),
            n_in,
            in_dtypes,
            in_ranks,
            in_dims,
            n_out,
            out_dtypes,
            out_ranks,
            out_dims,
        )
        if status < 0:
            raise ValueError(f"register_executable({key!r}): the op library rejected the specs")
        _owners[key] = owner


def unregister(key: str) -> bool:
    """Removes `key`; returns whether it was registered.

    Launches already running keep the registry entry they read, but not the code:
    release the owner only when no launch of `key` can still be running.
    """
    cdll = load_library().cdll
    with _owners_lock:
        removed = bool(cdll.tfxla_lite_unregister(key.encode()))
        _owners.pop(key, None)
    return removed


def registry_size() -> int:
    """How many executables are registered in this process (as the C++ side counts)."""
    return int(load_library().cdll.tfxla_lite_registry_size())


def launch(
    inputs: Sequence[Any],
    key: str,
    output_dtypes: Sequence[Any],
    output_shapes: Sequence[Any],
    name: str | None = None,
) -> list[tf.Tensor]:
    """Runs the executable registered under `key`; eager or while tracing a graph.

    `output_shapes` may leave dimensions unknown (None) for shape inference; the
    executable's registered shapes are what run, and they must be compatible.
    """
    output_dtypes = [as_tf_dtype(dtype) for dtype in output_dtypes]
    output_shapes = [tf.TensorShape(shape) for shape in output_shapes]
    if len(output_dtypes) != len(output_shapes):
        raise ValueError(
            f"launch({key!r}): {len(output_dtypes)} output dtypes, {len(output_shapes)} shapes"
        )
    results = load_ops().tfxla_lite_launch(
        args=list(inputs),
        key=key,
        Tout=output_dtypes,
        output_shapes=output_shapes,
        name=name,
    )
    if not output_dtypes:
        # With no outputs the generated wrapper returns the Operation (graph) or None.
        return []
    return list(results)
