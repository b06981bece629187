"""tfxla-lite's temp arena against XLA's, module by module (issue #3's acceptance).

For every case of the corpus (`tf_functions.CASES`) and of `benchmarks.arena`'s larger
`arena_cases()`, TF's own XLA compiles the function in a subprocess that dumps each
module (`--xla_dump_to`); our default pipeline and buffer assignment then run on the
module XLA started from. The temp arena we allocate per call must be no larger than
XLA's preallocated-temp allocation, for every module, with no exception. Definitions:
`benchmarks/arena.py`.

The XLA run happens once per session (about 10 s of TF start-up and XLA compiles).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tf_functions import CASES  # noqa: E402

from benchmarks.arena import (  # noqa: E402
    Row,
    XlaModule,
    _arguments,
    arena_cases,
    compare,
    corpus_cases,
    dump_xla_modules,
    parse_xla_buffer_assignment,
    xla_live_out_bytes,
    xla_temp_bytes,
)
from tfxla_lite.codegen import compile_module  # noqa: E402
from tfxla_lite.hlo.evaluator import evaluate  # noqa: E402
from tfxla_lite.hlo.parser import parse_module  # noqa: E402

NAMES = [c.name for c in CASES] + [c.name for c in arena_cases()]


@pytest.fixture(scope="session")
def xla_modules() -> dict[str, XlaModule]:
    return {m.case: m for m in dump_xla_modules()}


@pytest.fixture(scope="session")
def rows(xla_modules: dict[str, XlaModule]) -> dict[str, Row]:
    return {row.module: row for row in compare(list(xla_modules.values()))}


def test_the_corpus_has_forty_modules_or_more(xla_modules: dict[str, XlaModule]) -> None:
    assert sorted(xla_modules) == sorted(NAMES)
    assert len(xla_modules) >= 40
    assert len(set(NAMES)) == len(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_arena_is_no_larger_than_xlas(rows: dict[str, Row], name: str) -> None:
    row = rows[name]
    # On failure the row names the opcodes whose values fill our arena.
    assert row.tfxla_lite_temp_bytes <= row.xla_temp_bytes, row


def test_outputs_match_xlas_live_out_allocations(rows: dict[str, Row]) -> None:
    # The two sides hold the same outputs: XLA's live-out allocations (tuple tables
    # aside) have exactly the outputs' sizes, as ours do.
    for row in rows.values():
        assert row.tfxla_lite_output_bytes == row.xla_live_out_bytes, row


def test_hosting_in_outputs_and_reuse_matter_on_the_corpus(rows: dict[str, Row]) -> None:
    # Not a tautology: each mechanism must change some module's arena.
    assert any(r.tfxla_lite_temps_in_outputs for r in rows.values())
    assert any(r.tfxla_lite_temp_bytes < r.tfxla_lite_temp_bytes_without_reuse
               for r in rows.values())


# An excerpt of a real dump (TF 2.21, softmax of f32[4,16], thread-local values cut).
SOFTMAX_DUMP = """BufferAssignment:
allocation 0: size 256, output shape is |f32[4,16]|, maybe-live-out:
 value: <24 subtract_exponential_fusion @0> (size=256,offset=0): f32[4,16]{1,0}
 value: <27 broadcast_divide_fusion @0> (size=256,offset=0): f32[4,16]{1,0}
allocation 1: size 256, parameter 0, shape |f32[4,16]| at ShapeIndex {}:
 value: <21 arg0.1 @0> (size=256,offset=0): f32[4,16]{1,0}
allocation 2: size 16, output shape is |(f32[4,16], f32[])|, maybe-live-out:
 value: <28 XLA_Retvals.5{} @0> (size=16,offset=0): (f32[4,16]{1,0}, f32[])
allocation 3: size 4, constant:
 value: <22 Softmax.1 @0> (size=4,offset=0): f32[]
allocation 4: size 4, thread-local:
 value: <2 Softmax.7 @0> (size=4,offset=0): f32[]
allocation 10: size 80, preallocated-temp:
 value: <23 wrapped_reduce @0> (size=16,offset=0): f32[4]{0}
 value: <26 wrapped_reduce.1 @0> (size=16,offset=64): f32[4]{0}

Total bytes used: 560 (560B)

Used values:
<0 Softmax.5 @0>
 positions:
  Softmax.5
"""


def test_parses_xlas_buffer_assignment_dump() -> None:
    allocations = parse_xla_buffer_assignment(SOFTMAX_DUMP)
    assert [a.index for a in allocations] == [0, 1, 2, 3, 4, 10]
    assert xla_temp_bytes(allocations) == 80
    assert xla_live_out_bytes(allocations) == 256  # the tuple table is not data
    temp = allocations[-1]
    assert temp.is_temp and not temp.is_live_out
    assert temp.values == (("wrapped_reduce", 16, 0, "f32[4]{0}"),
                           ("wrapped_reduce.1", 16, 64, "f32[4]{0}"))
    assert allocations[2].is_tuple and not allocations[0].is_tuple


# Modules whose plans use each mechanism: row fusions and a dot writing into the output
# buffer (in place, output hosting), an in-place convert of element type (one-hot), a
# rescheduled transpose, multi-output training steps (an LSTM cell as one loop kernel
# of two outputs), a slice of a concatenate and a concatenate of activations fused into
# loops, argmax's iota fused into its variadic reduce.
COMPILED = ("mlp_softmax_b32", "ffn_block", "one_hot_embedding", "transpose_chain",
            "softmax_xent_grads", "lstm_cell", "batch_norm_train", "attention_4x64x32",
            "concat_slice", "dense_tanh_concat", "argmax_large")


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_plans_compute_what_the_evaluator_does(
        xla_modules: dict[str, XlaModule], name: str) -> None:
    case = {c.name: c for c in corpus_cases() + arena_cases()}[name]
    args = _arguments(case)
    executable = compile_module(parse_module(xla_modules[name].hlo_text), verify=True)
    assert executable.temp_bytes <= xla_temp_bytes(
        parse_xla_buffer_assignment(xla_modules[name].buffer_assignment))
    expected = evaluate(parse_module(xla_modules[name].hlo_text), *args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = executable(*args)
    assert len(got) == len(expected)
    for n, (a, b) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"{name} output {n}")
