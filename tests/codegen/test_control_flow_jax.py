"""JAX-printed control flow (`lax.scan`, `lax.while_loop`, `lax.fori_loop`, nested
loops, `lax.cond`, `lax.switch`) compiled by the CPU backend: each module of
tests/hlo/jax_control_flow (as lowered, and as XLA's CPU pipeline optimized it, with
its own fusions inside the loop bodies) parses, compiles, and matches both the
evaluator and the outputs JAX computed (`make_texts.py` wrote them), and
`tfxla-lite run-hlo --check` runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tolerances import assert_close

from tfxla_lite import cli
from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

CORPUS = Path(__file__).resolve().parent.parent / "hlo" / "jax_control_flow"
TEXTS = sorted(CORPUS.glob("*.hlo"))
OPCODES = {"while", "conditional"}


def _leaves(value: object) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)):
        return [leaf for element in value for leaf in _leaves(element)]
    return [np.asarray(value)]


def _case(path: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    data = np.load(CORPUS / (path.name.split(".")[0] + ".npz"))
    count = sum(key.startswith("arg") for key in data.files)
    return ([data[f"arg{n}"] for n in range(count)],
            [data[f"out{n}"] for n in range(len(data.files) - count)])


def test_the_corpus_is_there() -> None:
    names = {path.name.split(".")[0] for path in TEXTS}
    assert {"scan_cumulative", "while_doubling", "fori_nested", "cond_true",
            "switch_out_of_range", "scan_tensor_list"} <= names
    assert len(TEXTS) == 2 * len(names)  # lowered and optimized, each


@pytest.mark.parametrize("path", TEXTS, ids=[p.name for p in TEXTS])
def test_jax_module_compiles_and_matches_jax_and_the_evaluator(path: Path) -> None:
    text = path.read_text()
    module = parse_module(text)
    assert OPCODES & {i.opcode for c in module.computations for i in c.instructions}
    args, jax_outputs = _case(path)
    expected = _leaves(evaluate(parse_module(text), *args))
    got = compile_module(module, cache=False, verify=True)(*args)
    assert len(got) == len(expected) == len(jax_outputs)
    for actual, evaluated, jax_value in zip(got, expected, jax_outputs, strict=True):
        assert_close(actual, evaluated, "model gradient", path.name)
        assert_close(actual, jax_value.astype(actual.dtype), "model gradient", path.name)


# while_doubling's trip count depends on its inputs: under run-hlo's random ones (a
# negative start never reaches the limit) it would not end.
RANDOM_SAFE = [p for p in TEXTS if not p.name.startswith("while_doubling")]


@pytest.mark.parametrize("path", RANDOM_SAFE, ids=[p.name for p in RANDOM_SAFE])
def test_run_hlo_check_runs_jax_control_flow(path: Path, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    assert cli.main(["run-hlo", str(path), "--check", "--seed", "1"]) == 0
    assert "match the evaluator" in capsys.readouterr().out


@pytest.mark.parametrize("name,leaf", [("scan_cumulative", 2), ("scan_tensor_list", 1),
                                       ("scan_cumulative.optimized", 2),
                                       ("scan_tensor_list.optimized", 1)])
def test_scans_stack_their_outputs_in_place(name: str, leaf: int) -> None:
    """The buffer a scan stacks its per-step outputs in is updated in place, even where
    buffer assignment would otherwise host a temp in that output of the body, and in
    XLA's optimized text, where the update is a dynamic-update-slice fusion."""
    executable = compile_module(parse_module((CORPUS / f"{name}.hlo").read_text()), cache=False)
    first = next(iter(executable.assignment.control_flow.values()))
    assert leaf in first.in_place and leaf not in first.scratch
