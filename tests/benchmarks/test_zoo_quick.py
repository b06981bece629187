"""The model-zoo benchmark (`benchmarks/zoo.py`): its quick mode prints the full table,
a variant that fails prints its error in its row, and what it counts (launches,
convolution FLOPs, the goals) is right on steps small enough to check by hand.

No timing is asserted: only the shape of the output and the counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` is the repository's, not this folder
COLUMNS = ["model", "step", "tf.function ms", "XLA ms", "tfxla-lite ms", "vs tf.function",
           "vs XLA", "launches/step", "FLOPs compiled", "first call tf / XLA / lite ms",
           "tfxla-lite mode", "errors"]


def _run_quick(*arguments: str) -> str:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-m", "benchmarks.zoo", "--quick", "--repeats",
                             "1", *arguments], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _table_rows(output: str) -> list[list[str]]:
    lines = [line for line in output.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == COLUMNS
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def _check_rows(rows: list[list[str]], expected: set[tuple[str, str]]) -> None:
    assert {(row[0], row[1]) for row in rows} == expected
    for row in rows:
        assert len(row) == len(COLUMNS)
        assert row[-1] == "-", row  # no errors
        for cell in row[2:5]:
            assert float(cell) > 0
        for cell in row[5:7]:
            assert cell.endswith("x") and float(cell[:-1]) > 0
        assert int(row[7]) >= 1  # every quick step launches compiled code
        assert row[8].endswith("%") and 0 < int(row[8][:-1]) <= 100
        assert all(float(ms) > 0 for ms in row[9].split(" / "))
        assert row[10] in {"jit", "auto"}


def test_quick_mlp_prints_every_column() -> None:
    # Keras's fit path and inference: the fewest compiles that still cover must-compile
    # (inference) and auto-clustering (Dropout's random numbers) in one short run.
    output = _run_quick("mlp", "--steps", "fit,infer")
    assert "load average:" in output
    _check_rows(_table_rows(output), {("mlp", "fit"), ("mlp", "infer")})
    assert output.count("every step >=") == 2 and "geometric mean >= 1.5x" in output


@pytest.mark.slow
def test_quick_runs_every_quick_model() -> None:
    output = _run_quick()
    _check_rows(_table_rows(output), {("mlp", "train"), ("mlp", "fit"), ("mlp", "infer"),
                                      ("small_cnn", "train"), ("small_cnn", "infer")})


def test_a_failing_xla_variant_prints_its_error_in_the_row() -> None:
    import tensorflow as tf

    from benchmarks import zoo

    def step(x: tf.Tensor) -> tf.Tensor:
        # TF's XLA has no kernel for AsString; TF runs it, tfxla-lite leaves it to TF.
        return tf.strings.length(tf.strings.as_string(x * 2.0 + 1.0))

    built = zoo.ZooStep("strings", "infer", "XLA refuses it",
                        lambda: zoo._function_variants(step, [tf.ones((4,))]))
    row = zoo.measure(built, repeats=1)
    assert set(row.errors) == {"xla"} and row.errors["xla"]
    assert set(row.ms) == {"tf_function", "lite"} and row.lite_mode == "auto"
    text = zoo.table([row])
    assert "xla: " in text.splitlines()[-1]
    goals = zoo.goals([row])
    assert not goals[1]["met"] and "not measured" in goals[1]["detail"]


def test_launches_and_flop_share_of_a_conv_step() -> None:
    import tensorflow as tf

    from benchmarks import zoo
    from tfxla_lite import coverage

    kernel = tf.Variable(tf.ones((3, 3, 2, 4)))

    def step(x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            y = tf.nn.conv2d(x, kernel, 1, "SAME")
            loss = tf.reduce_sum(tf.tanh(y) * 3.0 + 1.0)
        return tape.gradient(loss, kernel)

    x = tf.ones((1, 8, 8, 2))
    with zoo.built_programs() as programs:
        variant = zoo._lite_variant(step, [x])
        variant.call()
    assert variant.mode == "jit"  # must-compile compiles every convolution
    graph = programs[0].graph
    convolutions = {op.type: coverage.op_flops(op) for op in graph.get_operations()
                    if op.type.startswith("Conv2D")}
    # 8x8x4 outputs, 3x3 taps, 2 input channels: 2 * 256 * 18 for the forward and for
    # each gradient alike (the trace holds the input's gradient too, pruned by TF later).
    same = 2 * 256 * 18
    assert convolutions == {"Conv2D": same, "Conv2DBackpropFilter": same,
                            "Conv2DBackpropInput": same}
    share = zoo.flop_share(programs)
    assert share == 1.0  # the whole step, convolutions included, in one program
    assert zoo.launch_count(variant.call) >= 1


def test_goals_say_what_is_missed_and_by_how_much() -> None:
    from benchmarks import zoo

    fast = zoo.Row("a", "train", "", ms={"tf_function": 4.0, "xla": 3.0, "lite": 1.0})
    slow = zoo.Row("b", "infer", "", ms={"tf_function": 1.0, "xla": 1.0, "lite": 2.0})
    goals = zoo.goals([fast, slow])
    assert [g["met"] for g in goals] == [False, False, False]
    assert "b infer 0.50x" in goals[0]["detail"] and "a train" not in goals[0]["detail"]
    assert "b infer 0.50x" in goals[1]["detail"]
    assert goals[2]["detail"].startswith("1.41x over 2 steps")
    assert [g["met"] for g in zoo.goals([fast])] == [True, True, True]
