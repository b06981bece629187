"""Running GPU executables on TF tensors: DLPack both ways, TF fallback. UNTESTED on a GPU.

The TF side of the GPU backend (`tfxla_lite.codegen.gpu`), outside the compiler core
because it imports TensorFlow. It is written against the documented APIs
(`tf.experimental.dlpack`, CuPy's DLPack support) but has never run on a GPU: no CUDA
device was available when it was written. `docs/gpu.md` says so too.

- `run_on_tensors(executable, *tensors)`: the tensors (on one GPU, where TF placed them)
  become CuPy arrays without a copy (DLPack), the executable runs on that device, and its
  CuPy outputs become TF tensors without a copy. TF and CuPy use different CUDA streams,
  so the device is synchronized before (TF's writes are done) and after (ours are).
- `GpuCluster`: a cluster's HLO compiled for the GPU on first use per device; a cluster
  that does not compile (or inputs that are not all on one GPU) runs its TF fallback
  instead, as TF's `build_xla_ops_pass` falls back from `_XlaCompile`; the reason is
  logged once.
- `gpu_call(cluster, inputs, output_dtypes)`: the same inside a `tf.function`, through
  `tf.py_function` (which runs eagerly, on tensors placed as the graph placed them).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfxla_lite.hlo.ir import HloModule

logger = logging.getLogger("tfxla_lite")

_GPU_DEVICE = re.compile(r"device:GPU:(\d+)$", re.IGNORECASE)


def gpu_index(tensor: Any) -> int | None:
    """The index of the GPU holding `tensor` (an eager tensor), or None when on a CPU."""
    match = _GPU_DEVICE.search(getattr(tensor, "device", "") or "")
    return int(match.group(1)) if match else None


def to_cupy(tensor: Any) -> Any:
    """An eager TF tensor on a GPU as a CuPy array over the same memory."""
    import cupy

    capsule = tf.experimental.dlpack.to_dlpack(tensor)
    try:
        return cupy.from_dlpack(capsule)
    except TypeError:  # CuPy versions that take only objects with __dlpack__
        return cupy.fromDlpack(capsule)


def to_tensor(array: Any) -> Any:
    """A CuPy array as a TF tensor over the same memory."""
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


def run_on_tensors(executable: Any, *tensors: Any) -> list[Any]:
    """Run a `GpuExecutable` on eager TF tensors held by its GPU; TF tensors out."""
    import cupy

    with cupy.cuda.Device(executable.device_id) as device:
        device.synchronize()  # TF's stream has finished writing the inputs
        outputs = executable(*[to_cupy(t) for t in tensors])
        device.synchronize()  # ours has finished writing the outputs
        return [to_tensor(o) for o in outputs]


class GpuCluster:
    """A compiled cluster for the GPU with a TF fallback (see the module docstring).

    `build_module` returns a fresh `HloModule` of the cluster (compiling optimizes it in
    place); `fallback` runs the cluster's TF ops on the same tensors.
    """

    def __init__(self, name: str, build_module: Callable[[], HloModule],
                 fallback: Callable[..., Sequence[Any]]) -> None:
        self.name = name
        self.build_module = build_module
        self.fallback = fallback
        self._executables: dict[int, Any] = {}
        self._refused: str | None = None
        self._lock = threading.Lock()

    @property
    def refused(self) -> str | None:
        """Why the cluster runs in TF, once it was refused."""
        return self._refused

    def _executable(self, device: int) -> Any | None:
        from tfxla_lite.codegen import gpu

        with self._lock:
            if self._refused is not None:
                return None
            if device not in self._executables:
                try:
                    import cupy

                    with cupy.cuda.Device(device):
                        self._executables[device] = gpu.compile_module(self.build_module())
                except Exception as error:  # noqa: BLE001 - any failure falls back to TF
                    self._refused = f"{type(error).__name__}: {error}"
                    logger.warning("tfxla-lite: GPU cluster %s runs in TensorFlow: %s",
                                   self.name, self._refused)
                    return None
            return self._executables[device]

    def __call__(self, *tensors: Any) -> list[Any]:
        devices = {gpu_index(t) for t in tensors}
        device = devices.pop() if len(devices) == 1 else None
        executable = self._executable(device) if device is not None else None
        if executable is None:
            return list(self.fallback(*tensors))
        return run_on_tensors(executable, *tensors)


def gpu_call(cluster: GpuCluster, inputs: Sequence[Any], output_dtypes: Sequence[Any]
             ) -> list[Any]:
    """Call `cluster` from inside a `tf.function` (`tf.py_function`: eager tensors,
    placed where the graph's placer put the call)."""
    results = tf.py_function(lambda *tensors: cluster(*tensors), list(inputs),
                             list(output_dtypes))
    return list(results) if isinstance(results, (list, tuple)) else [results]
