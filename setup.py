"""tfxla-lite: an XLA-style auto-clustering compiler for TensorFlow, written in Python.

`clustering/` and `codegen/` install as `tfxla_lite.clustering` and
`tfxla_lite.codegen`: no generic top-level import name lands in site-packages.
The C++ launch op is not built here (pip's isolated build environment may hold
another TensorFlow than the one that runs it); it is built on first use, or by
`python -m tfxla_lite.runtime.build`, into a cache keyed by the TF version.
"""

from setuptools import setup

PACKAGES = {
    "tfxla_lite": "tfxla_lite",
    "tfxla_lite.hlo": "tfxla_lite/hlo",
    "tfxla_lite.passes": "tfxla_lite/passes",
    "tfxla_lite.runtime": "tfxla_lite/runtime",
    "tfxla_lite.clustering": "clustering",
    "tfxla_lite.codegen": "codegen",
    "tfxla_lite.codegen.cpu": "codegen/cpu",
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
        "test": ["pytest", "hypothesis", "ruff"],
    },
    entry_points={"console_scripts": ["tfxla-lite=tfxla_lite.cli:main"]},
)
