"""Runs of generated kernels on the CUDA emulator shared by the GPU test files: with the
parameters placed as CuPy places them (or misaligned), and on one block against three."""

from __future__ import annotations

from typing import Any

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from gpu_modules import MODULES
from hlo_builders import random_arguments

from tfxla_lite.codegen.gpu import compile_module


def run_placed(name: str, args: list[np.ndarray], misalign: bool = False) -> list[np.ndarray]:
    """Run module `name` on the emulator with every parameter placed as CuPy would
    (256-byte aligned), or 2 bytes off (`misalign`)."""
    executable = compile_module(MODULES[name](), verify=True)
    inputs = []
    for array in args:
        shift = 2 if misalign else 0
        raw = fake_cupy._aligned_zeros((array.nbytes + shift,), np.uint8)
        view = raw[shift:shift + array.nbytes].view(array.dtype).reshape(array.shape)
        view[...] = array
        inputs.append(fake_cupy.FakeArray(view, raw, shift))
    cupy = fake_cupy.module(emulate=True)
    return [np.asarray(o.array) for o in executable.run_checked(cupy, inputs)]


def assert_same_bits_on_one_and_three_blocks(name: str,
                                             monkeypatch: pytest.MonkeyPatch) -> Any:
    """Module `name`'s first output on a grid of one block and of three: the same bits
    (grid-stride loops and fixed fold orders)."""
    args = random_arguments(MODULES[name]())
    results = []
    for blocks in (1, 3):
        monkeypatch.setattr(cuda_emulator, "MAX_BLOCKS", blocks)
        results.append(compile_module(MODULES[name]()).run_numpy(*args)[0])
    assert results[0].tobytes() == results[1].tobytes()
    return results[0]
