"""tfxla-lite: an XLA-style auto-clustering compiler for TensorFlow, written in Python.

`clustering/` and `codegen/` install as `tfxla_lite.clustering` and
`tfxla_lite.codegen`: no generic top-level import name lands in site-packages.
The C++ launch op is not built here (pip's isolated build environment may hold
another TensorFlow than the one that runs it); it is built on first use, or by
`python -m tfxla_lite.runtime.build`, into a cache keyed by the TF version.

`tfxla_lite_startup.pth` goes to the root of site-packages, for regular and
editable installs alike (see `BuildPyWithStartupHook`): it is the zero-code
auto-jit hook, inert unless `TFXLA_LITE_FLAGS` is set (`tfxla_lite/_startup.py`).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

STARTUP_HOOK = os.path.join("tfxla_lite", "tfxla_lite_startup.pth")


class BuildPyWithStartupHook(build_py):
    """build_py, plus the start-up `.pth` at the top of what gets installed.

    A regular build puts it at the root of `build_lib`, so the wheel has it at the
    root of purelib (site-packages). An editable build (PEP 660) installs only its
    own finder from `build_lib`; there, files in the unpacked editable wheel (the
    `install_lib` that `editable_wheel` sets up) are what lands in site-packages.
    (`data_files` would install under sys.prefix, not site-packages.)
    """

    def run(self) -> None:
        super().run()
        target = self.build_lib
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        self.mkpath(target)
        self.copy_file(STARTUP_HOOK, os.path.join(target, os.path.basename(STARTUP_HOOK)))

    def get_outputs(self, include_bytecode: bool = True) -> list:
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, os.path.basename(STARTUP_HOOK)))
        return outputs


PACKAGES = {
    "tfxla_lite": "tfxla_lite",
    "tfxla_lite.hlo": "tfxla_lite/hlo",
    "tfxla_lite.passes": "tfxla_lite/passes",
    "tfxla_lite.runtime": "tfxla_lite/runtime",
    "tfxla_lite.report_html": "tfxla_lite/report_html",
    "tfxla_lite.clustering": "clustering",
    "tfxla_lite.codegen": "codegen",
    "tfxla_lite.codegen.cpu": "codegen/cpu",
    "tfxla_lite.codegen.gpu": "codegen/gpu",
}

setup(
    name="tfxla-lite",
    version="0.1.0",
    description="XLA-style auto-clustering compiler for TensorFlow, in Python",
    python_requires=">=3.10",
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    package_data={"tfxla_lite.runtime": ["*.cc"]},
    install_requires=["numpy", "llvmlite>=0.44", "networkx"],
    extras_require={
        "tf": ["tensorflow-cpu>=2.16"],
        "test": ["pytest", "pytest-xdist", "hypothesis", "ruff"],
        # Only the benchmark suite's plot needs it (`python -m benchmarks`).
        "bench": ["matplotlib>=3.7"],
        # The GPU backend (codegen/gpu): CuPy built for the CUDA 12 or 13 runtime.
        "gpu": ["cupy-cuda12x>=13"],
        "gpu-cuda13": ["cupy-cuda13x>=13"],
    },
    entry_points={"console_scripts": ["tfxla-lite=tfxla_lite.cli:main"]},
    cmdclass={"build_py": BuildPyWithStartupHook},
)
