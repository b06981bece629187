"""GPU clusters in a rewritten graph: placement, compile, launch node, DLPack both ways.

The TF side of the GPU backend (`tfxla_lite.codegen.gpu`), outside the compiler core
because it imports TensorFlow. The driver (`tfxla_lite/driver.py`) asks
`placed_gpu(cluster.device)` where TF will run a cluster; a cluster on a GPU compiles
with `compile_cluster` and becomes a `GpuLaunch`, whose nodes the rewrite
(`tfxla_lite/rewrite.py`) emits in place of `TfxlaLiteLaunch`:

    <launch>/gpu_call  EagerPyFunc on the cluster's GPU: TF hands it the input tensors
                       where they are (on the GPU); it runs `GpuLaunch.__call__`
    <launch>/shape_j   EnsureShape per output: the static shapes the consumers saw at
                       trace time (EagerPyFunc's own outputs have unknown shapes)
    <launch>           IdentityN of those: the name every consumer already points at

`GpuLaunch.__call__` hands TF's tensors to CuPy and back over the same memory (DLPack)
around the `GpuExecutable`; int32 crosses `gpu_call` as uint32 (`wire_dtype`: TF's
EagerPyFunc has no GPU kernel for int32). A GPU cluster that does not compile stays in TF
on its GPU, with the reason in the clustering report; one with unknown dimensions becomes
a `GpuDynamicLaunch`, compiling each input signature at first sight. `GpuBackend` is how
this module meets devices; the tests install one that runs on the CPU emulator of
`tests/gpu`. docs/gpu.md ("GPU clusters in `tfxla_lite.function`") gives placement, the
launch node, the stream synchronizations and what has not run on hardware.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.runtime import loader

logger = logging.getLogger("tfxla_lite")

_GPU_DEVICE = re.compile(r"(?:^|/)device:GPU:(\d+|\*)$", re.IGNORECASE)
_CPU_DEVICE = re.compile(r"(?:^|/)device:CPU:(\d+|\*)$", re.IGNORECASE)
# DLPack device types (dlpack.h: kDLCPU, kDLCUDA).
_DLPACK_CPU, _DLPACK_CUDA = 1, 2

TensorSpecLike = tuple[Any, Sequence[int]]  # (tf.DType, static shape)


@functools.lru_cache(maxsize=256)
def gpu_index(device: str) -> int | None:
    """The GPU index a device string names ('/device:GPU:1' → 1, '/GPU:*' → 0), or None
    for any other device (and for ''). Memoized: a launch asks it per tensor per call,
    of the few device strings a process has."""
    match = _GPU_DEVICE.search(device or "")
    if match is None:
        return None
    return 0 if match.group(1) == "*" else int(match.group(1))


class GpuBackend:
    """The GPUs of this process as TF and CuPy see them (CUDA through CuPy)."""

    name = "cupy"

    def tf_gpus(self) -> list[int]:
        """The indices of TF's logical GPU devices."""
        return sorted(i for d in tf.config.list_logical_devices("GPU")
                      if (i := gpu_index(d.name)) is not None)

    def tensor_gpu(self, tensor: Any) -> int | None:
        """The GPU holding eager `tensor`, or None when it is elsewhere."""
        return gpu_index(getattr(tensor, "backing_device", "") or tensor.device)

    def cupy(self) -> Any:
        from tfxla_lite.codegen.gpu.executable import _cupy

        return _cupy()

    def unavailable(self) -> str | None:
        """Why GPU clusters cannot compile here, or None."""
        try:
            cupy = self.cupy()
        except ImportError as error:
            return str(error)
        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as error:  # noqa: BLE001 - no driver, no device
            return f"CuPy finds no CUDA device ({type(error).__name__}: {error})"
        return None if count else "CuPy finds no CUDA device"


_backend: GpuBackend = GpuBackend()


def backend() -> GpuBackend:
    """The backend GPU clusters compile and run with (`use_backend` changes it)."""
    return _backend


@contextlib.contextmanager
def use_backend(new: GpuBackend) -> Iterator[GpuBackend]:
    """Compile and run GPU clusters with `new` inside the block (the tests' emulator)."""
    global _backend
    previous, _backend = _backend, new
    try:
        yield new
    finally:
        _backend = previous


def placed_gpu(device: str, gpu_backend: GpuBackend | None = None) -> int | None:
    """The GPU TF runs a cluster of ops placed on `device` on, or None for a CPU.

    '' (no explicit placement) is TF's default placement: the first GPU when TF has one.
    A GPU TF does not have is soft-placed on the CPU by TF, so it is None too.
    """
    gpus = (gpu_backend or _backend).tf_gpus()
    if not device:
        return gpus[0] if gpus else None
    if _CPU_DEVICE.search(device):
        return None
    index = gpu_index(device)
    return index if index is not None and index in gpus else None


def compile_cluster(module: HloModule, device: int, pipeline: str | None = None,
                    verify: bool = False) -> Any:
    """`module` compiled for GPU `device` (a `GpuExecutable`); raises, saying why, when it
    cannot be (the driver then leaves the cluster to TF)."""
    reason = _backend.unavailable()
    if reason is not None:
        raise RuntimeError(f"GPU:{device}: the GPU backend is unavailable: {reason}")
    from tfxla_lite.codegen import gpu

    try:
        with _backend.cupy().cuda.Device(device):
            return gpu.compile_module(module, pipeline=pipeline, verify=verify)
    except Exception as error:
        raise RuntimeError(f"GPU:{device}: {type(error).__name__}: {error}") from error


# -- DLPack ---------------------------------------------------------------------------------

class _Capsule:
    """A DLPack capsule with the protocol's two methods, which `from_dlpack` functions
    (CuPy's, NumPy's) take where a bare capsule is deprecated."""

    def __init__(self, capsule: Any, device: tuple[int, int]) -> None:
        self._capsule, self._device = capsule, device

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule  # the device is synchronized around the launch

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def to_device_array(tensor: Any, device: int, cupy: Any) -> Any:
    """An eager TF tensor as a CuPy array over the same memory (no copy)."""
    capsule = tf.experimental.dlpack.to_dlpack(tensor)
    on_gpu = gpu_index(getattr(tensor, "backing_device", "") or tensor.device) is not None
    wrapped = _Capsule(capsule, (_DLPACK_CUDA, device) if on_gpu else (_DLPACK_CPU, 0))
    try:
        return cupy.from_dlpack(wrapped)
    except TypeError:  # CuPy before the protocol took objects: the capsule itself
        return cupy.fromDlpack(capsule)


def to_tensor(array: Any) -> Any:
    """A CuPy array as a TF tensor over the same memory (no copy). `stream=-1`: DLPack's
    "establish no order"; the launch has waited for CuPy's stream already, and CuPy would
    otherwise record an event on its stream and make the legacy stream wait on it, per
    output, whenever its current stream is not the legacy one."""
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__(stream=-1))


def run_on_tensors(executable: Any, tensors: Sequence[Any], cupy: Any,
                   on_device: Sequence[bool] | None = None) -> list[Any]:
    """Run a `GpuExecutable` on eager TF tensors; TF tensors out (on its GPU).

    Tensors on the executable's GPU (`on_device[i]`, default all) are handed over by
    DLPack; any other is copied over (defensive: EagerPyFunc's GPU kernel declares no
    host-memory input, so TF should deliver every input in device memory).
    """
    on_device = [True] * len(tensors) if on_device is None else on_device
    with cupy.cuda.Device(executable.device_id) as device:
        device.synchronize()  # TF's stream has finished writing the inputs
        arrays = [to_device_array(t, executable.device_id, cupy) if there
                  else cupy.asarray(t.numpy()) for t, there in zip(tensors, on_device)]
        outputs = executable(*arrays)
        cupy.cuda.get_current_stream().synchronize()  # ours has written the outputs
        return [to_tensor(o) for o in outputs]


# TF's EagerPyFunc has a GPU kernel for every numeric type but int32 (py_func.cc's
# `gpu_types`: TF keeps int32 on GPUs in host memory by convention). A launch node with
# an int32 input or output would have no GPU kernel: TF would soft-place it on the CPU,
# copy its inputs to the host and, worse, accept the GPU-backed tensors it returns as host
# tensors. So int32 crosses the node as uint32, reinterpreted by a Bitcast on each side
# (free: the same bytes), and the launch views the arrays as int32 again.
_WIRE_TYPES = {tf.int32: tf.uint32}


def wire_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype a value of `dtype` has between the launch node's Bitcasts."""
    return _WIRE_TYPES.get(dtype, dtype)


# -- the launch -----------------------------------------------------------------------------

_live_lock = threading.Lock()
# token -> the EagerFunc TF's py-function registry holds only weakly: launch nodes find
# their function by token for as long as the process runs, like the executable registry
# of the CPU launch op (tfxla_lite/runtime/loader.py).
_live: dict[str, Any] = {}


class LaunchArgumentError(tf.errors.InvalidArgumentError, ValueError):
    """Tensors a GPU launch was not compiled for. Also a ValueError, which is what TF's
    EagerPyFunc kernel turns into INVALID_ARGUMENT (any other exception is UNKNOWN)."""


def _invalid(message: str) -> LaunchArgumentError:
    return LaunchArgumentError(None, None, message)


def _shape_text(dtype: tf.DType, shape: Sequence[int | None]) -> str:
    return f"{dtype.name}[{','.join('?' if d is None else str(d) for d in shape)}]"


def _fits(dims: tuple[int, ...], shape: tuple[int | None, ...]) -> bool:
    """Whether concrete `dims` fit `shape`, whose unknown dimensions are None."""
    return len(dims) == len(shape) and all(w is None or d == w for d, w in zip(dims, shape))


def _dims(shape: Any) -> tuple[int | None, ...]:
    """Static or partial dims (None where unknown) of a shape-like of known rank."""
    return tuple(tf.TensorShape(shape).as_list())


class GpuLaunch:
    """One compiled GPU cluster of a rewritten graph (see the module docstring).

    What a call needs beyond the tensors is worked out here, once: the dtypes on the
    wire (int32 as uint32), which inputs and outputs to reinterpret, and that the
    executable's outputs are the static shapes the graph promised (so a call checks its
    inputs only: the outputs are those shapes by construction).
    """

    def __init__(self, key: str, executable: Any, device: int,
                 input_specs: Sequence[TensorSpecLike],
                 output_specs: Sequence[TensorSpecLike]) -> None:
        from tensorflow.python.ops import script_ops

        self.key = key
        self.executable = executable
        self.device = device
        self.backend = _backend
        self.input_specs = [(tf.as_dtype(d), _dims(s)) for d, s in input_specs]
        self.output_specs = [(tf.as_dtype(d), _dims(s)) for d, s in output_specs]
        self._check_outputs()
        # What EagerPyFunc hands over and takes back, and the NumPy dtype to view each
        # array as inside (None: as it comes).
        self._wire_inputs = [(wire_dtype(d), s) for d, s in self.input_specs]
        self._input_views = [d.as_numpy_dtype if wire_dtype(d) != d else None
                             for d, _ in self.input_specs]
        self._output_views = [wire_dtype(d).as_numpy_dtype if wire_dtype(d) != d else None
                              for d, _ in self.output_specs]
        self._cupy: Any = None
        self.calls = 0
        self.copied_inputs = 0  # inputs TF delivered off the GPU, copied onto it
        function = script_ops.EagerFunc(self, [wire_dtype(d) for d, _ in self.output_specs],
                                        False)
        self.token = script_ops._py_funcs.insert(function)
        with _live_lock:
            _live[self.token] = function

    @property
    def device_name(self) -> str:
        return f"/device:GPU:{self.device}"

    def _check_outputs(self) -> None:
        """The executable's outputs are the static shapes and dtypes the graph's consumers
        saw, checked once here instead of on every call."""
        shapes = getattr(self.executable, "output_shapes", None)
        if shapes is None:
            return
        made = [(tf.as_dtype(s.numpy_dtype), tuple(s.dims)) for s in shapes]
        if made != self.output_specs:
            raise ValueError(f"tfxla-lite GPU launch {self.key}: the executable makes "
                             f"{[_shape_text(*m) for m in made]}, the graph expects "
                             f"{[_shape_text(*o) for o in self.output_specs]}")

    def check_inputs(self, tensors: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
        """Raises unless `tensors` are what the launch was compiled for; their shapes."""
        if len(tensors) != len(self._wire_inputs):
            raise _invalid(f"tfxla-lite GPU launch {self.key}: {len(self.input_specs)} "
                           f"inputs expected, got {len(tensors)}")
        shapes = []
        for i, (tensor, (dtype, shape)) in enumerate(zip(tensors, self._wire_inputs)):
            dims = tuple(tensor.shape)
            if tensor.dtype != dtype or (dims != shape and not _fits(dims, shape)):
                raise _invalid(f"tfxla-lite GPU launch {self.key}: input {i} is "
                               f"{_shape_text(tensor.dtype, tensor.shape)}, compiled for "
                               f"{_shape_text(dtype, shape)}")
            shapes.append(dims)
        return tuple(shapes)

    def __call__(self, *tensors: Any) -> list[Any]:
        """Run on eager tensors (what TF's EagerPyFunc kernel passes); TF tensors out."""
        self.check_inputs(tensors)
        return self._launch(self.executable, tensors, self._input_views)

    def _launch(self, executable: Any, tensors: Sequence[Any],
                input_views: Sequence[Any]) -> list[Any]:
        """Run `executable` on `tensors` (its parameters, on the wire, checked)."""
        cupy = self._cupy
        if cupy is None:
            cupy = self._cupy = self.backend.cupy()
        tensor_gpu = self.backend.tensor_gpu
        with cupy.cuda.Device(self.device) as device:
            # TF's stream has finished writing the inputs (docs/gpu.md: the two syncs).
            device.synchronize()
            arrays = []
            for tensor, view in zip(tensors, input_views):
                if tensor_gpu(tensor) == self.device:
                    array = to_device_array(tensor, self.device, cupy)
                else:  # defensive: TF should deliver every input on the GPU
                    self.copied_inputs += 1
                    array = cupy.asarray(tensor.numpy())
                arrays.append(array if view is None else array.view(view))
            outputs = executable.run_checked(cupy, arrays)
            # Ours has written the outputs: only CuPy's stream, not the whole device (TF's
            # consumers are enqueued after this host call returns, so they follow it).
            cupy.cuda.get_current_stream().synchronize()
        self.calls += 1
        return [to_tensor(o if view is None else o.view(view))
                for o, view in zip(outputs, self._output_views)]

    def fill_nodes(self, graph_def: tf.compat.v1.GraphDef, node: Any) -> None:
        """Turn `node` (named as the launch, with the cluster's data and control inputs)
        into `<node>/gpu_call` → `<node>/shape_j` → IdentityN `<node>`, all on the GPU."""
        data = [name for name in node.input if not name.startswith("^")]
        control = [name for name in node.input if name.startswith("^")]
        for i, (dtype, _) in enumerate(self.input_specs):
            if wire_dtype(dtype) != dtype:
                data[i] = self._bitcast(graph_def, f"{node.name}/wire_in_{i}", data[i],
                                        dtype, wire_dtype(dtype))
        call = graph_def.node.add()
        call.name = f"{node.name}/gpu_call"
        call.op = "EagerPyFunc"
        call.device = self.device_name
        call.input.extend(data + control)
        call.attr["token"].s = self.token.encode()
        call.attr["is_async"].b = False
        call.attr["Tin"].list.type.extend(wire_dtype(d).as_datatype_enum
                                          for d, _ in self.input_specs)
        call.attr["Tout"].list.type.extend(wire_dtype(d).as_datatype_enum
                                           for d, _ in self.output_specs)
        del node.input[:]
        for j, (dtype, shape) in enumerate(self.output_specs):
            produced = f"{call.name}:{j}"
            if wire_dtype(dtype) != dtype:
                produced = self._bitcast(graph_def, f"{node.name}/wire_out_{j}", produced,
                                         wire_dtype(dtype), dtype)
            ensure = graph_def.node.add()
            ensure.name = f"{node.name}/shape_{j}"
            ensure.op = "EnsureShape"
            ensure.device = self.device_name
            ensure.input.append(produced)
            ensure.attr["T"].type = dtype.as_datatype_enum
            ensure.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
            node.input.append(ensure.name)
        node.op = "IdentityN"
        node.device = self.device_name
        node.attr["T"].list.type.extend(d.as_datatype_enum for d, _ in self.output_specs)

    def _bitcast(self, graph_def: tf.compat.v1.GraphDef, name: str, source: str,
                 from_type: tf.DType, to_type: tf.DType) -> str:
        """A Bitcast node on the launch's GPU (same bytes, another dtype); its output."""
        cast = graph_def.node.add()
        cast.name = name
        cast.op = "Bitcast"
        cast.device = self.device_name
        cast.input.append(source)
        cast.attr["T"].type = from_type.as_datatype_enum
        cast.attr["type"].type = to_type.as_datatype_enum
        return name


# -- clusters with unknown dimensions ------------------------------------------------------

@dataclass(frozen=True)
class GpuSpecialization:
    """A GPU executable for one input signature of a cluster with unknown dimensions.
    `param_inputs`: the launch inputs passed to it, in order (value-keyed inputs are
    embedded in its code); `output_specs`: its outputs' dtypes and static shapes."""

    executable: Any
    param_inputs: tuple[int, ...]
    output_specs: tuple[TensorSpecLike, ...]


class GpuDynamicLaunch(GpuLaunch):
    """A GPU cluster with unknown dimensions, compiled per input signature at run time.

    The same nodes as a `GpuLaunch` (the EnsureShapes keep the unknown dimensions); a call
    works out its signature as the CPU launch op does (every input's shape, the values of
    the value-keyed ones) and looks it up in its cache, as the op's. A new one goes to
    `specialize` (a `tfxla_lite.dynamic.DynamicCluster` of this GPU, which compiles it with
    `compile_cluster`, counts it against the auto-mode bound and logs the bound once),
    which answers a `GpuSpecialization`, a `loader.Refusal`, or raises (must-compile: the
    error, as the CPU launch op reports it). For a refused signature the cluster's own TF
    ops (`fallback`, a ConcreteFunction over the launch inputs) run on this GPU, from
    inside the launch: the CPU's `StatelessIf` on `TfxlaLiteCompile` needs the C++ op,
    whose kernel is CPU-only.
    """

    def __init__(self, key: str, device: int, input_specs: Sequence[TensorSpecLike],
                 output_specs: Sequence[TensorSpecLike], value_inputs: Sequence[int],
                 specialize: Callable[[loader.SpecializationRequest], Any],
                 fallback: Any = None) -> None:
        super().__init__(key, None, device, input_specs, output_specs)
        self.value_inputs = tuple(value_inputs)
        self.specialize = specialize
        self.fallback = fallback
        self._input_dtypes = tuple(d for d, _ in self.input_specs)
        self._cache: dict[Any, GpuSpecialization | None] = {}  # signature -> None: refused
        self._lock = threading.Lock()
        self.refuses_all_new = False
        self.refused = 0
        self.fallback_calls = 0

    def stats(self) -> loader.DynamicStats:
        """Signatures compiled and refused, as `loader.dynamic_stats` counts a CPU key's."""
        compiled = sum(s is not None for s in self._cache.values())
        return loader.DynamicStats(compiled, self.refused, self.refuses_all_new)

    def __call__(self, *tensors: Any) -> list[Any]:
        shapes = self.check_inputs(tensors)
        values = {j: self._host_value(j, tensors[j]) for j in self.value_inputs}
        request = loader.SpecializationRequest(self._input_dtypes, shapes, values)
        specialization = self._specialization(request)
        if specialization is None:
            return self._run_fallback(tensors)
        params = [tensors[j] for j in specialization.param_inputs]
        views = [self._input_views[j] for j in specialization.param_inputs]
        return self._launch(specialization.executable, params, views)

    def _host_value(self, j: int, tensor: Any) -> Any:
        """A value-keyed input's value (a few integers; int32 arrives as uint32)."""
        array = tensor.numpy()
        view = self._input_views[j]
        return array if view is None else array.view(view)

    def _specialization(self, request: loader.SpecializationRequest
                        ) -> GpuSpecialization | None:
        signature = request.signature
        found = self._cache.get(signature, False)
        if found is not False:
            return found
        # Serialized, as the launch op serializes a cluster's misses: the counts stay exact.
        with self._lock:
            if signature in self._cache:
                return self._cache[signature]
            if self.refuses_all_new:
                return None
            try:
                result = self.specialize(request)
            except Exception as error:
                raise _invalid(f"tfxla-lite GPU launch {self.key}: compiling for these input "
                               f"shapes failed: {type(error).__name__}: {error}") from error
            if isinstance(result, loader.Refusal):
                self.refused += 1
                if result.for_all_new:
                    self.refuses_all_new = True
                    return None
                result = None
            self._cache[signature] = result
            return result

    def _run_fallback(self, tensors: Sequence[Any]) -> list[Any]:
        """The cluster's TF ops on this GPU, on the launch inputs; wire dtypes out."""
        if self.fallback is None:
            raise _invalid(f"tfxla-lite GPU launch {self.key}: no code for these input "
                           "shapes and no fallback")
        self.fallback_calls += 1
        inputs = [t if wire_dtype(d) == d else tf.bitcast(t, d)
                  for t, (d, _) in zip(tensors, self.input_specs)]
        with tf.device(self.device_name):
            outputs = self.fallback(*inputs)
        return [o if wire_dtype(d) == d else tf.bitcast(o, wire_dtype(d))
                for o, (d, _) in zip(tf.nest.flatten(outputs), self.output_specs)]
