"""The compiler core (hlo, passes, codegen) imports and runs without TensorFlow."""

from __future__ import annotations

import subprocess
import sys


def test_core_imports_without_tensorflow() -> None:
    code = (
        "import sys\n"
        "import tfxla_lite, tfxla_lite.hlo, tfxla_lite.hlo.evaluator, tfxla_lite.passes\n"
        "import tfxla_lite.codegen\n"
        "assert 'tensorflow' not in sys.modules, 'the core imported TensorFlow'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
