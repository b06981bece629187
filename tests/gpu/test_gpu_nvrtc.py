"""NVRTC (what `cupy.RawModule` compiles with at run time) accepts every generated
program whole, with the executable's own options; no GPU needed, but CuPy and libnvrtc
must load. Skipped otherwise, with the reason."""

from __future__ import annotations

import pytest
from gpu_modules import MODULES

from tfxla_lite.codegen.gpu import emit_module
from tfxla_lite.codegen.gpu.executable import NVRTC_OPTIONS, include_options


def _nvrtc() -> object:
    try:
        import cupy
        from cupy_backends.cuda.libs import nvrtc
    except Exception as error:  # noqa: BLE001 - any import failure
        pytest.skip(f"no CuPy ({type(error).__name__}: {error})")
    try:
        nvrtc.getVersion()
    except Exception as error:  # noqa: BLE001 - libnvrtc not found
        pytest.skip(f"no libnvrtc ({type(error).__name__}: {str(error)[:200]})")
    return cupy, nvrtc


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_gpu_programs_compile_with_nvrtc(arch: str) -> None:
    cupy, nvrtc = _nvrtc()
    options = [*NVRTC_OPTIONS, *include_options(cupy), f"-arch={arch}"]
    failures = {}
    for name, build in MODULES.items():
        program, _, _ = emit_module(build())
        handle = nvrtc.createProgram(program.source, f"{name}.cu", [], [])
        try:
            nvrtc.compileProgram(handle, options)
            ptx = nvrtc.getPTX(handle)
            for kernel in program.kernel_names:
                assert f".entry {kernel}(" in ptx.decode() if isinstance(ptx, bytes) \
                    else f".entry {kernel}(" in ptx, (name, kernel)
        except nvrtc.NVRTCError:
            failures[name] = nvrtc.getProgramLog(handle)[:2000]
        finally:
            nvrtc.destroyProgram(handle)
    assert not failures, failures
