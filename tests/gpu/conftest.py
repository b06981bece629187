"""Shared setup of the GPU backend's tests: import paths, and why device tests skip.

The CUDA emitter and the nvcc checks need no GPU; tests that run kernels take the
`cuda_device` fixture, which skips with the reason (no CuPy, no CUDA device).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
for path in (_HERE, _HERE.parent, _HERE.parent / "hlo", _HERE.parent / "corpus"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def device_skip_reason() -> str | None:
    """Why kernels cannot run here, or None when a CUDA device is usable through CuPy."""
    try:
        import cupy
    except Exception as error:  # noqa: BLE001 - any import failure
        return f"no CuPy ({type(error).__name__}: {error}); pip install 'tfxla-lite[gpu]'"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as error:  # noqa: BLE001 - no driver or no device
        return f"no GPU: CuPy finds no CUDA device ({type(error).__name__}: {error})"
    return None if count else "no GPU: CuPy finds no CUDA device"


@pytest.fixture(scope="session")
def cuda_device() -> object:
    reason = device_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    import cupy

    return cupy


def _use_fake_cupy(monkeypatch: pytest.MonkeyPatch, emulate: bool) -> object:
    import fake_cupy

    from tfxla_lite.codegen.gpu import cublaslt
    from tfxla_lite.codegen.gpu import executable as executable_module

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy.module(emulate=emulate))
    monkeypatch.setattr(executable_module, "_modules", {})
    # The stand-in CuPy's pointers are host memory: never the real libcublasLt. Fusions
    # cuBLASLt would take run unfused unless a test asks for the model (`fake_lt`).
    if not cublaslt._override:  # `fake_lt` may have installed the model first
        monkeypatch.setattr(cublaslt, "_override", [(None, "fake CuPy: no cuBLASLt")])
    recorder = fake_cupy.Recorder()
    monkeypatch.setattr(fake_cupy, "RECORDER", recorder)
    return recorder


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> object:
    """CuPy replaced by `fake_cupy` running kernels on the CPU emulator of the CUDA
    built-ins; returns the recorder of what the backend asked CuPy for."""
    return _use_fake_cupy(monkeypatch, emulate=True)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> object:
    """CuPy replaced by `fake_cupy` that records launches without running kernels (its
    cuBLAS model still computes); returns the recorder."""
    return _use_fake_cupy(monkeypatch, emulate=False)


@pytest.fixture
def emulated_gpu(monkeypatch: pytest.MonkeyPatch) -> object:
    """TF 'has' GPU:0 (`EmulatedGpuBackend`); CuPy is the emulating stand-in. Yields the
    launch recorder. Skips without TF, and where TF has a real GPU (whose tensors the
    emulator cannot read: test_gpu_function_on_a_real_gpu runs instead)."""
    tf = pytest.importorskip("tensorflow", reason="no TensorFlow: the TF entry is not tested")
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("TF has a real GPU, whose tensors the emulator cannot read: "
                    "test_gpu_function_on_a_real_gpu runs instead")
    from emulated_backend import EmulatedGpuBackend

    from tfxla_lite.runtime import gpu_launch

    recorder = _use_fake_cupy(monkeypatch, emulate=True)
    with gpu_launch.use_backend(EmulatedGpuBackend()):
        yield recorder


@pytest.fixture
def fake_lt(monkeypatch: pytest.MonkeyPatch) -> object:
    """cuBLASLt replaced by its model (`fake_cublaslt`), bound through the backend's own
    ctypes prototypes; use with `fake_gpu` or `emulated` (after them). Returns the model;
    the test fails if a callback raised. Either order with those fixtures works."""
    import fake_cublaslt

    from tfxla_lite.codegen.gpu import cublaslt

    model = fake_cublaslt.FakeCublasLt()
    monkeypatch.setattr(cublaslt, "_override",
                        [(cublaslt.Library(model.address_of, "fake_cublaslt"), "")])
    yield model
    assert not model.errors, model.errors
