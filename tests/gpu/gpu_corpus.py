"""The TF-printed HLO corpus (`tests/corpus/tf_functions.py`) for GPU runs without TF.

TF's own XLA prints each corpus function's HLO (`experimental_get_compiler_ir`, stages
'hlo' and 'optimized_hlo'). The GPU machines have CuPy but no TensorFlow, so the texts
are kept in `corpus_hlo.json` beside this file, with each case's tolerance entry:

    python tests/gpu/gpu_corpus.py          # rewrite corpus_hlo.json (needs TF)

`corpus()` reads the file; `printed()` prints the texts afresh (needs TF), which a test
compares with the file, so that it cannot go stale unnoticed; `check(name)` runs one
module through the GPU backend against the NumPy evaluator.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SNAPSHOT = HERE / "corpus_hlo.json"
STAGES = ("hlo", "optimized_hlo")


def corpus_inputs(case: Any) -> list[np.ndarray]:
    """The inputs the nvcc test traces each case with (shapes and dtypes are what count)."""
    rng = np.random.default_rng(0)
    inputs = []
    for dtype, shape in case.inputs:
        if dtype == "bool":
            inputs.append(rng.random(shape) < 0.5)
        elif dtype == "int32":
            inputs.append(rng.integers(-5, 6, size=shape).astype(np.int32))
        else:
            inputs.append(rng.standard_normal(shape).astype(dtype))
    return inputs


def printed() -> dict[str, dict[str, str]]:
    """`{case.stage: {"hlo": text, "tolerance": entry}}`, printed by TF's XLA now."""
    import tensorflow as tf

    for path in (HERE.parent / "corpus", HERE.parent):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from tf_functions import CASES

    texts = {}
    for case in CASES:
        function = tf.function(case.fn, jit_compile=True)
        inputs = corpus_inputs(case)
        for stage in STAGES:
            text = function.experimental_get_compiler_ir(*inputs)(stage=stage)
            texts[f"{case.name}.{stage}"] = {"hlo": text, "tolerance": case.tolerance}
    return texts


def comparable(texts: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """`texts` with TF's process-wide function counters (`a_inference__lambda__679__`)
    replaced by 'N' and the source files of the ops' metadata cut to what follows
    `site-packages/` (the virtual environment's path is the checkout's, different on
    every clone): what TF prints depends on both, so the snapshot check compares the
    rest."""
    def portable(text: str) -> str:
        text = re.sub(r"_\d+__", "_N__", text)
        return re.sub(r'source_file="[^"]*/site-packages/', 'source_file=".../site-packages/',
                      text)

    return {name: {**entry, "hlo": portable(entry["hlo"])} for name, entry in texts.items()}


def corpus() -> dict[str, dict[str, str]]:
    """The stored texts, or {} when the file is missing."""
    if not SNAPSHOT.exists():
        return {}
    return json.loads(SNAPSHOT.read_text())


def check(name: str) -> None:
    """Stored module `name` compiled for the GPU (or the emulator standing in for it)
    against the NumPy evaluator, within its case's tolerance entry."""
    from hlo_builders import flatten, random_arguments
    from tolerances import assert_close

    from tfxla_lite.codegen.gpu import compile_module
    from tfxla_lite.hlo.evaluator import evaluate
    from tfxla_lite.hlo.parser import parse_module

    entry = corpus()[name]
    args = random_arguments(parse_module(entry["hlo"]))
    expected = flatten(evaluate(parse_module(entry["hlo"]), *args))
    outputs = compile_module(parse_module(entry["hlo"]), verify=True).run_numpy(*args)
    assert len(outputs) == len(expected), name
    for got, wanted in zip(outputs, expected):
        assert_close(np.asarray(got), np.asarray(wanted), entry["tolerance"])


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(printed(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT} ({SNAPSHOT.stat().st_size} bytes)")
