"""benchmarks/matmul.py --split-cost: its tiled product covers every element of the
output with the right sum, for splits that leave short last tiles, and its cost
report names the schedule's split; forced splits and strategies give TF's result."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import matmul  # noqa: E402
from tfxla_lite.codegen.cpu import dot as dot_codegen  # noqa: E402
from tfxla_lite.codegen.cpu import engine  # noqa: E402

pytestmark = pytest.mark.skipif(engine.gemm("f32") is None, reason="no OpenBLAS")


@pytest.mark.parametrize(("m", "k", "n", "tiles_m", "tiles_n"),
                         [(37, 23, 53, 2, 3), (70, 9, 33, 4, 2), (16, 5, 16, 1, 1)])
def test_tiled_product_matches_numpy(m: int, k: int, n: int, tiles_m: int, tiles_n: int
                                     ) -> None:
    rng = np.random.default_rng(m + k + n)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)  # a tile left out stays NaN
    matmul.tiled_product(a, b, c, tiles_m, tiles_n)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, expected, rtol=0, atol=2 * k * np.finfo(np.float32).eps)


def test_tiled_product_rejects_bad_shapes() -> None:
    a, b = np.zeros((4, 3), np.float32), np.zeros((5, 2), np.float32)
    with pytest.raises(ValueError, match="float32 m×k @ k×n"):
        matmul.tiled_product(a, b, np.zeros((4, 2), np.float32), 1, 1)


def test_split_cost_report_names_the_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    samples = matmul.split_cost(64, 32, 96, [(1, 2)], repeats=2)
    assert set(samples) == {(1, 1), (1, 2)} and all(len(v) == 2 for v in samples.values())
    matmul.main(["--split-cost", "512", "--split", "2x2"])
    lines = capsys.readouterr().out.splitlines()
    assert any("512x512x512 2x1 tiles (schedule)" in line for line in lines)
    assert any("512x512x512 2x2 tiles:" in line for line in lines)


def test_forced_split_matches_tf_and_restores_the_schedule(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """`--split` without `--split-cost`: the kernel compiled with a forced 2×3 split of a
    96×64 by 64×80 product (short last tiles) gives TF's result; the schedule and cache
    setting are back afterwards, and other shapes keep their schedules."""
    m, k, n = 96, 64, 80
    forced = matmul.forced_schedule(m, k, n, 2, 3)(
        dot_codegen.GemmPlan(m, n, k, False, k, False, n, (), (), ()))
    assert (forced.tiles_m, forced.tiles_n, forced.block_m, forced.block_n) == (2, 3, 48, 32)
    other = dot_codegen.GemmPlan(m, n, 32, False, 32, False, n, (), (), ())
    assert matmul.forced_schedule(m, k, n, 2, 3)(other) == dot_codegen.schedule(other)
    rng = np.random.default_rng(11)
    a = tf.constant(rng.uniform(-1, 1, (m, k)).astype(np.float32))
    w = tf.constant(rng.uniform(-1, 1, (k, n)).astype(np.float32))
    used: list[tuple[int, int]] = []  # the splits the compile asked the schedule for
    forced_schedule = matmul.forced_schedule

    def spy(*shape_and_split: int) -> Callable[[dot_codegen.GemmPlan], dot_codegen.DotSchedule]:
        schedule = forced_schedule(*shape_and_split)

        def recorded(plan: dot_codegen.GemmPlan) -> dot_codegen.DotSchedule:
            sched = schedule(plan)
            used.append((sched.tiles_m, sched.tiles_n))
            return sched
        return recorded

    monkeypatch.setattr(matmul, "forced_schedule", spy)
    before = dot_codegen.schedule, os.environ.get("TFXLA_LITE_CACHE")
    run = matmul.compile_forced(lambda x, y: tf.nn.relu(tf.matmul(x, y)), (a, w), m, k, n,
                                (2, 3))
    assert (dot_codegen.schedule, os.environ.get("TFXLA_LITE_CACHE")) == before
    assert (2, 3) in used
    assert_close(run().numpy(), tf.nn.relu(tf.matmul(a, w)).numpy(), "MatMul", "2x3 tiles")


def test_forced_strategy_matches_tf_and_restores_the_choice() -> None:
    """`--strategy library` on a product register blocks would compute: the kernel then
    calls the library, gives TF's result, and the strategy rule is back afterwards."""
    m, k, n = 64, 96, 80
    plan = dot_codegen.GemmPlan(m, n, k, False, k, False, n, (), (), ())
    assert dot_codegen.choose_strategy(plan) == "blocked"
    assert matmul.forced_strategy(m, k, n, "library")(plan) == "library"
    other = dot_codegen.GemmPlan(m, n, 32, False, 32, False, n, (), (), ())
    assert matmul.forced_strategy(m, k, n, "library")(other) == "blocked"
    rng = np.random.default_rng(12)
    a = tf.constant(rng.uniform(-1, 1, (m, k)).astype(np.float32))
    w = tf.constant(rng.uniform(-1, 1, (k, n)).astype(np.float32))
    before = dot_codegen.choose_strategy, dot_codegen.schedule, os.environ.get("TFXLA_LITE_CACHE")
    run = matmul.compile_forced(lambda x, y: tf.matmul(x, y), (a, w), m, k, n, "library")
    assert (dot_codegen.choose_strategy, dot_codegen.schedule,
            os.environ.get("TFXLA_LITE_CACHE")) == before
    assert_close(run().numpy(), tf.matmul(a, w).numpy(), "MatMul", "library forced")


def test_batched_and_transposed_shapes_parse_and_run(capsys: pytest.CaptureFixture) -> None:
    """B*MxKxN[.ta][.tb]: what tf.matmul is given and what `dot.schedule` is asked for;
    one small such shape through the three compilers (TF's result checked inside)."""
    gemm = matmul.parse_gemm("64*64x16x64.tb")
    assert (gemm.batch, gemm.m, gemm.k, gemm.n, gemm.transpose_a, gemm.transpose_b) == (
        64, 64, 16, 64, False, True)
    assert str(gemm) == "64*64x16x64.tb" and gemm.flops == 2.0 * 64 * 64 * 16 * 64
    assert matmul.parse_gemm("512") == matmul.Gemm(512, 512, 512)
    for bad in ("4*512", "64x16", "3*4x5x6.tc"):
        with pytest.raises(ValueError):
            matmul.parse_gemm(bad)
    with pytest.raises(ValueError):
        matmul.parse_shape("1024x64x64.tb")  # the split and strategy modes take plain ones
    assert matmul.describe_schedule(0, 0, 0, gemm).startswith("blocked")  # a copy of B
    assert matmul.main(["4*48x32x40.ta"]) == 0
    assert "4*48x32x40.ta" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        matmul.main(["4*48x32x40.ta", "--dense"])
