"""The compiler core (hlo, passes, codegen) imports and is tested without TensorFlow."""

from __future__ import annotations

import pathlib
import subprocess
import sys

TESTS = pathlib.Path(__file__).parents[1]
BLOCK_TENSORFLOW = "import sys; sys.modules['tensorflow'] = None\n"  # any import then fails


def test_core_imports_without_tensorflow() -> None:
    code = (
        "import sys\n"
        "import tfxla_lite, tfxla_lite.hlo, tfxla_lite.hlo.evaluator, tfxla_lite.passes\n"
        "import tfxla_lite.codegen, tfxla_lite.hlo.parser, tfxla_lite.hlo.cost_analysis\n"
        "assert 'tensorflow' not in sys.modules, 'the core imported TensorFlow'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_core_test_suites_pass_with_tensorflow_unimportable() -> None:
    code = BLOCK_TENSORFLOW + (
        "import pytest\n"
        f"sys.exit(pytest.main([{str(TESTS / 'hlo')!r}, {str(TESTS / 'passes')!r}, "
        f"{str(TESTS / 'codegen')!r}, '-q', '-x', '-p', 'no:cacheprovider', "
        "'-m', 'not slow']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
