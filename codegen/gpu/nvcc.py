"""Offline checks of generated CUDA with nvcc: compile to PTX, no GPU needed.

Used by the tests (`tests/gpu`) and by anyone checking a dump: `check_ptx(sources,
arch)` writes each source to a temporary folder and compiles all of them in one nvcc
invocation (`nvcc -ptx -arch=sm_XX --Werror all-warnings`), so that many small modules
cost one process start; it returns nvcc's diagnostics per source.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

DEFAULT_ARCHES = ("sm_80", "sm_90")


def find_nvcc() -> str | None:
    """The nvcc on PATH, else under CUDA_HOME / CUDA_PATH / /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


@dataclass
class PtxResult:
    ok: bool
    output: str  # nvcc's messages (errors and warnings)
    ptx: dict[str, str]  # source name -> PTX text, for the sources that compiled


def check_ptx(sources: dict[str, str], arch: str = "sm_80", timeout: float = 300.0
              ) -> PtxResult:
    """Compile every source (name -> CUDA text) to PTX for `arch`, warnings as errors."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (PATH, CUDA_HOME, /usr/local/cuda)")
    with tempfile.TemporaryDirectory(prefix="tfxla_lite_ptx_") as folder:
        names = {}
        for number, (name, text) in enumerate(sources.items()):
            path = os.path.join(folder, f"m{number}.cu")
            with open(path, "w") as handle:
                handle.write(text)
            names[path] = name
        command = [nvcc, "-ptx", f"-arch={arch}", "--std=c++17", "--Werror", "all-warnings",
                   "-odir", folder, *names]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                cwd=folder)
        output = result.stdout + result.stderr
        for path, name in names.items():
            output = output.replace(os.path.basename(path), f"{os.path.basename(path)} "
                                                            f"[{name}]")
        ptx = {}
        for path, name in names.items():
            ptx_path = path[:-3] + ".ptx"
            if os.path.exists(ptx_path):
                with open(ptx_path) as handle:
                    ptx[name] = handle.read()
        return PtxResult(result.returncode == 0 and not output.strip(), output, ptx)


def batch_source(bodies: dict[str, str], element_types: set[str]) -> str:
    """One translation unit holding many programs' bodies (`GpuProgram.body`), each in a
    namespace of its own, after one prelude: nvcc starts once for all of them. Kernels
    get C++ linkage there (`extern "C"` names would clash across namespaces); the code is
    otherwise exactly what each program compiles alone."""
    from tfxla_lite.codegen.gpu.cuda_source import prelude

    parts = [prelude(element_types)]
    for number, (name, body) in enumerate(bodies.items()):
        parts.append(f"// ---- {name}\nnamespace program_{number} {{\n"
                     + body.replace('extern "C" __global__', "__global__") + "}\n")
    return "\n".join(parts)
