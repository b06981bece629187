"""Sizes handed to the op library are checked against int64 first: ctypes wraps a larger
Python int silently (2^64 + 5 arrives as 5), which would make a wrong-sized arena or
output."""

from __future__ import annotations

import pytest

from tfxla_lite.runtime import loader


@pytest.mark.parametrize("temp_bytes", [-1, 2**63 - 1, 2**64 + 5])
def test_temp_bytes_past_int64_are_refused(op_library: loader.OpLibrary, kernels,
                                           temp_bytes: int) -> None:
    kernel = kernels.jit_compile(kernels.empty)
    with pytest.raises(ValueError, match="temp_bytes"):
        loader.register_executable("size_limit_temp", kernel.address, temp_bytes, [], [],
                                   owner=kernel)
    assert not loader.unregister("size_limit_temp")


@pytest.mark.parametrize("shape", [[2**64 + 3], [2**31, 2**31, 8], [2**62, 2]])
def test_output_shapes_past_int64_are_refused(op_library: loader.OpLibrary, kernels,
                                              shape: list[int]) -> None:
    kernel = kernels.jit_compile(kernels.empty)
    with pytest.raises(ValueError, match=r"2\^63-1"):
        loader.register_executable("size_limit_shape", kernel.address, 0, [],
                                   [("float32", shape)], owner=kernel)
    assert not loader.unregister("size_limit_shape")


def test_op_library_refuses_temp_bytes_it_cannot_align(op_library: loader.OpLibrary,
                                                       kernels) -> None:
    """The C++ side checks too, for callers other than `register_executable`."""
    import ctypes

    kernel = kernels.jit_compile(kernels.empty)
    status = op_library.cdll.tfxla_lite_register(
        b"size_limit_direct", ctypes.c_void_p(kernel.address), 2**63 - 10, 0, None, None,
        None, 0, None, None, None, None)
    assert status == -1
