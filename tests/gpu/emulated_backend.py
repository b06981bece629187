"""A GPU backend for TF tests on machines without a GPU: the CPU emulator behind the
launch interface of `tfxla_lite/runtime/gpu_launch.py`.

`EmulatedGpuBackend` tells the compiler that TF has a GPU:0, so clusters placed there
(explicitly, or by default placement) compile with the real GPU backend, into a real
`GpuExecutable`, and become real launch nodes (EagerPyFunc → EnsureShape → IdentityN)
in the rewritten graph. With `fake_cupy.module(emulate=True)` installed as `cupy`, the
executable's kernels run on the CPU emulator (`cuda_emulator`), and the DLPack hand-over
of the launch (`to_device_array`, `to_tensor`) is the real code over host memory.

What differs from a GPU: TF has no GPU here, so its soft placement runs the launch
nodes on the CPU and the tensors they receive are CPU tensors, which this backend
counts as GPU:0's; no CUDA streams (synchronizing does nothing).
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.runtime.gpu_launch import GpuBackend, gpu_index


class EmulatedGpuBackend(GpuBackend):
    name = "emulated"

    def __init__(self, gpus: tuple[int, ...] = (0,)) -> None:
        self.gpus = list(gpus)

    def tf_gpus(self) -> list[int]:
        return list(self.gpus)

    def tensor_gpu(self, tensor: Any) -> int | None:
        device = getattr(tensor, "backing_device", "") or tensor.device
        index = gpu_index(device)
        if index is None and "CPU" in device.upper() and self.gpus:
            return self.gpus[0]  # soft placement put the GPU launch node on the CPU
        return index
