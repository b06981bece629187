"""Control flow (tfxla_lite/control_flow.py): the bodies of tf.while_loop and tf.cond are
clustered inside, the While and If ops stay in TF and call the rewritten functions.
That is the path of a loop or branch that cannot join a cluster whole as HLO control
flow (tests/clustering/test_control_flow_lowering.py): these tests take it for every
loop, with `hlo_control_flow=False`.

Results are checked against plain TF; launch ops are counted in the rewritten
functions of the program's graph library.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite import coverage
from tfxla_lite.clustering.body_graphs import CONTROL_FLOW_OPS
from tfxla_lite.driver import build_program
from tfxla_lite.options import Options
from tfxla_lite.program import Program
from tfxla_lite.rewrite import LAUNCH_OP_TYPE
from tfxla_lite.runtime import loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerances import assert_close, tolerance  # noqa: E402 - tests/tolerances.py, by path


def _launches_by_function(f: tl.Function, *args: object) -> dict[str, int]:
    """Launch ops in each function of the rewritten program's library, by function name."""
    library = f.get_concrete_function(*args).graph.as_graph_def().library
    return {fd.signature.name: sum(n.op == LAUNCH_OP_TYPE for n in fd.node_def)
            for fd in library.function}


def _launches_in(counts: dict[str, int], original: str) -> int:
    return sum(n for name, n in counts.items() if f"tfxla_lite_{original}" in name)


@pytest.fixture(autouse=True)
def _bodies_one_by_one():  # noqa: ANN202
    before = tl.get_options().hlo_control_flow
    tl.set_options(hlo_control_flow=False)
    yield
    tl.set_options(hlo_control_flow=before)


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def dynamic_build():  # noqa: ANN201
    """dynamic_build(fn, *specs) -> Program of `fn` traced with these (None-dim) specs, in
    dynamic mode as the patched tf.function builds Keras steps; its keys are
    unregistered when the test ends."""
    programs: list[Program] = []

    def build(fn, *specs):  # noqa: ANN001, ANN202
        concrete = tf.function(fn).get_concrete_function(*specs)
        program = build_program(concrete, None, Options(min_cluster_size=1, verify=True,
                                                         hlo_control_flow=False),
                                dynamic=True)
        programs.append(program)
        return program

    yield build
    for program in programs:
        for dynamic_cluster in program.all_dynamic_clusters():
            loader.unregister(dynamic_cluster.key)


def _recurrence(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return i + 1, tf.tanh(tf.matmul(h, w) + 0.5) * 0.9 + h * 0.1

    _, h = tf.while_loop(lambda i, h: i < 6, body, (tf.constant(0), x))
    return h


def test_while_body_is_clustered_and_matches_tf() -> None:
    rng = _rng()
    x = rng.normal(size=(4, 8)).astype(np.float32)
    w = (rng.normal(size=(8, 8)) * 0.3).astype(np.float32)
    f = tl.function(_recurrence)
    assert_close(f(x, w).numpy(), tf.function(_recurrence)(x, w).numpy(), "MatMul", "6 steps")
    report = tl.explain(f, x, w)
    body_clusters = [c for c in report.compiled_clusters if c.name.startswith("while_body")]
    assert body_clusters, report
    assert any(op_type == "MatMul" for c in body_clusters for _, op_type in c.ops)
    assert [n.op_type for n in report.fallbacks if n.op_type in CONTROL_FLOW_OPS] == \
        ["StatelessWhile"]
    counts = _launches_by_function(f, x, w)
    assert _launches_in(counts, "while_body") >= 1, counts


def test_cond_branches_are_clustered_and_both_run() -> None:
    def branchy(x: tf.Tensor) -> tf.Tensor:
        return tf.cond(tf.reduce_sum(x) > 0.0,
                       lambda: tf.exp(x * 0.5) + tf.sigmoid(x) * 2.0 - 1.0,
                       lambda: tf.tanh(x - 1.0) * 3.0 + tf.abs(x) - 0.25)

    f = tl.function(branchy)
    x = np.abs(_rng().normal(size=(3, 5)).astype(np.float32))
    # One program: the predicate is data, both branches run. exp(x/2) + 2 sigmoid(x) - 1
    # is >= 1 for x >= 0 (no cancellation): the ops' own tolerance.
    assert_close(f(x).numpy(), tf.function(branchy)(x).numpy(), "Exp")
    # 3 tanh(-x - 1) cancels against x - 0.25, so a tanh ulp is worth up to 3 of the
    # result: allow 3 times the `Tanh` tolerance in tanh's ulps, plus the three roundings
    # after it (of 3 tanh, of the sum, of the result) on each side.
    ours, theirs = f(-x).numpy(), tf.function(branchy)(-x).numpy()
    t = np.abs(np.tanh(-x.astype(np.float64) - 1.0)).astype(np.float32)
    bound = (3 * tolerance("Tanh").ulps * np.spacing(t) + np.spacing(3 * t)
             + np.spacing(np.abs(x - 3 * t)) + np.spacing(np.abs(theirs)))
    assert (np.abs(ours - theirs) <= bound).all(), (ours, theirs, bound)
    counts = _launches_by_function(f, x)
    assert _launches_in(counts, "cond_true") == 1 and _launches_in(counts, "cond_false") == 1
    assert len(f._programs) == 1


def test_loop_carried_unknown_batch_compiles_per_shape(dynamic_build) -> None:  # noqa: ANN001
    w = (_rng().normal(size=(8, 8)) * 0.3).astype(np.float32)
    program = dynamic_build(_recurrence, tf.TensorSpec((None, 8), tf.float32),
                            tf.TensorSpec((8, 8), tf.float32))
    plain = tf.function(_recurrence)
    for batch in (3, 5, 3):
        x = _rng().normal(size=(batch, 8)).astype(np.float32)
        assert_close(program.run(x, w).numpy(), plain(x, w).numpy(), "MatMul",
                     f"batch {batch}")
    in_bodies = [d for body in program.bodies for d in body.program.dynamic_clusters]
    assert in_bodies and all(len(d.specializations) == 2 for d in in_bodies)


def test_gradient_through_while_loop() -> None:
    rng = _rng()
    x = rng.normal(size=(4, 8)).astype(np.float32)
    w0 = (rng.normal(size=(8, 8)) * 0.3).astype(np.float32)

    def loss_and_gradient(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(w)
            loss = tf.reduce_sum(tf.square(_recurrence(x, w)))
        return loss, tape.gradient(loss, w)

    f = tl.function(loss_and_gradient)
    loss, gradient = f(x, w0)
    want_loss, want_gradient = tf.function(loss_and_gradient)(x, w0)
    assert_close(loss.numpy(), want_loss.numpy(), "Sum")
    assert_close(gradient.numpy(), want_gradient.numpy(), "MatMul")
    counts = _launches_by_function(f, x, w0)
    forward = sum(n for name, n in counts.items()
                  if "tfxla_lite_while_body" in name and "grad" not in name)
    backward = sum(n for name, n in counts.items() if "tfxla_lite_" in name and "grad" in name)
    assert forward >= 1 and backward >= 1, counts


def test_nested_loops_and_a_variable_updated_in_the_body() -> None:
    v = tf.Variable(tf.zeros((4, 4)))

    def nested(x: tf.Tensor) -> tf.Tensor:
        def outer_body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            def inner_body(j: tf.Tensor, g: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                return j + 1, tf.sin(g) * 0.5 + tf.cos(g * 2.0) + 0.1

            _, g = tf.while_loop(lambda j, g: j < 3, inner_body, (tf.constant(0), h))
            v.assign_add(g * 0.25 + 1.0)
            return i + 1, g + tf.tanh(v.read_value())

        _, h = tf.while_loop(lambda i, h: i < 4, outer_body, (tf.constant(0), x))
        return h

    x = _rng().normal(size=(4, 4)).astype(np.float32)
    want = tf.function(nested)(x).numpy()
    want_v = v.numpy()
    v.assign(tf.zeros((4, 4)))
    f = tl.function(nested)
    got = f(x).numpy()
    # 12 chained sin/cos steps: ulp-level differences compound, so the accumulating entry.
    assert_close(got, want, "Sum", "nested loops of sin and cos")
    assert_close(v.numpy(), want_v, "Sum", "variable after the loop")
    counts = _launches_by_function(f, x)
    inner = [name for name, n in counts.items() if n and "while_while_body" in name]
    assert inner, counts  # the inner loop's body, itself inside the outer body
    # The outer body is rewritten too (its own ops are too few to cluster): its loop calls
    # the rewritten inner body.
    assert any(name.startswith("__inference_tfxla_lite_while_body") for name in counts), counts


def test_must_compile_tolerates_the_loop_and_reports_its_body() -> None:
    w = (_rng().normal(size=(8, 8)) * 0.3).astype(np.float32)
    x = _rng().normal(size=(4, 8)).astype(np.float32)
    f = tl.function(_recurrence, jit_compile=True)
    assert_close(f(x, w).numpy(), tf.function(_recurrence)(x, w).numpy(), "MatMul")

    def unsupported_in_body(x: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return i + 1, tf.strings.to_number(tf.strings.as_string(h)) + 1.0

        return tf.while_loop(lambda i, h: i < 2, body, (tf.constant(0), x))[1]

    with pytest.raises(tl.CompilationError, match="AsString"):
        tl.function(unsupported_in_body, jit_compile=True)(x)


def test_coverage_counts_loop_bodies_per_iteration() -> None:
    def bounded(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        def body(h: tf.Tensor) -> tuple[tf.Tensor]:
            return (tf.tanh(tf.matmul(h, w) + 0.5) * 0.9,)

        return tf.while_loop(lambda h: tf.reduce_sum(h) < 1e9, body, (x,),
                             maximum_iterations=6)[0]

    rng = _rng()
    x = rng.normal(size=(4, 8)).astype(np.float32)
    w = (rng.normal(size=(8, 8)) * 0.3).astype(np.float32)
    f = tl.function(bounded)
    assert_close(f(x, w).numpy(), tf.function(bounded)(x, w).numpy(), "MatMul")
    (program,) = f._programs.values()
    share = coverage.function_coverage(program)
    body_flops = 6 * (2 * 4 * 8 * 8 + 3 * 4 * 8)  # 6 trips of a dot and 3 element-wise ops
    assert share.flops_compiled >= body_flops, share
    assert share.flop_share > 0.9, share
    loop = program.graph.get_operation_by_name("while")
    assert coverage.body_weight(loop, "body", 64) == 6.0
    assert coverage.body_weight(loop, "cond", 64) == 7.0


def _reshaping_loop(x: tf.Tensor) -> tf.Tensor:
    shape = tf.shape(x)  # computed outside, a loop invariant inside

    def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        flat = tf.reshape(tf.tanh(h) * 0.5 + 0.25, [-1])
        return i + 1, tf.reshape(tf.exp(-flat) + flat, shape)

    return tf.while_loop(lambda i, h: i < 3, body, (tf.constant(0), x))[1]


@pytest.mark.parametrize("batch", [4, None], ids=["static", "unknown batch"])
def test_loop_invariant_shape_compiles_inside_the_body(batch: int | None,
                                                       dynamic_build) -> None:  # noqa: ANN001
    # The shape reaches the body as a loop variable: a constant there when it is known,
    # else a value-keyed input (only shapes determine it), so the Reshape compiles.
    program = dynamic_build(_reshaping_loop, tf.TensorSpec((batch, 6), tf.float32))
    plain = tf.function(_reshaping_loop)
    for rows in (4, 2) if batch is None else (4,):
        x = _rng().normal(size=(rows, 6)).astype(np.float32)
        assert_close(program.run(x).numpy(), plain(x).numpy(), "Exp", f"{rows} rows")
    reshapes = [name for c in program.report.compiled_clusters for name, op_type in c.ops
                if op_type == "Reshape" and name.startswith("while_body")]
    assert len(reshapes) == 2, program.report


def test_gradient_loop_pops_shapes_as_shapes(dynamic_build) -> None:  # noqa: ANN001
    # With an unknown batch, while_v2 pushes the shapes the gradient needs (of the
    # broadcasting add and multiply) onto TensorLists in the forward loop; the gradient
    # loop pops them, and they are value-keyed like shapes, so BroadcastGradientArgs and
    # the Reshapes after the reductions compile with the rest of the gradient body.
    bias = (_rng().normal(size=(8,)) * 0.1).astype(np.float32)

    def loss_and_gradient(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return i + 1, tf.tanh(tf.matmul(h, w) + h * bias)

        with tf.GradientTape() as tape:
            tape.watch(w)
            h = tf.while_loop(lambda i, h: i < 4, body, (tf.constant(0), x))[1]
            loss = tf.reduce_sum(h * h)
        return loss, tape.gradient(loss, w)

    w = (_rng().normal(size=(8, 8)) * 0.3).astype(np.float32)
    program = dynamic_build(loss_and_gradient, tf.TensorSpec((None, 8), tf.float32),
                            tf.TensorSpec((8, 8), tf.float32))
    plain = tf.function(loss_and_gradient)
    for rows in (5, 3):
        x = _rng().normal(size=(rows, 8)).astype(np.float32)
        (loss, gradient), (want_loss, want_gradient) = program.run(x, w), plain(x, w)
        assert_close(loss.numpy(), want_loss.numpy(), "Sum", f"{rows} rows")
        assert_close(gradient.numpy(), want_gradient.numpy(), "MatMul", f"{rows} rows")
    report = program.report
    gradient_body = [n for n in report.fallbacks if "_grad" in n.op_name.split("/")[0]]
    assert gradient_body, report
    assert not [n for n in gradient_body
                if n.op_type in ("BroadcastGradientArgs", "Reshape", "Sum", "MatMul")], report


def test_loop_over_an_optional_with_colocated_reads(caplog: pytest.LogCaptureFixture) -> None:
    # Keras' loop over steps: the condition reads an Optional loop variable with
    # OptionalHasValue, colocated with that argument; the body's graph must import.
    data = _rng().uniform(-1, 1, (5, 4, 3)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(data)

    def steps(iterator: tf.data.Iterator) -> tf.Tensor:
        def cond(i: tf.Tensor, total: tf.Tensor, optional: tf.experimental.Optional
                 ) -> tf.Tensor:
            return tf.logical_and(i < 3, optional.has_value())

        def body(i: tf.Tensor, total: tf.Tensor, optional: tf.experimental.Optional
                 ) -> tuple[tf.Tensor, tf.Tensor, tf.experimental.Optional]:
            x = optional.get_value()
            total += tf.reduce_sum(tf.tanh(x) * 2.0 + tf.exp(-x) * 0.5)
            return i + 1, total, iterator.get_next_as_optional()

        start = (tf.constant(0), tf.constant(0.0), iterator.get_next_as_optional())
        return tf.while_loop(cond, body, start)[1]

    f = tl.function(steps)
    with caplog.at_level("WARNING", logger="tfxla_lite"):
        got = f(iter(dataset))
    assert_close(got.numpy(), tf.function(steps)(iter(dataset)).numpy(), "Sum")
    assert not [r for r in caplog.records if "stays as it is" in r.getMessage()]
    counts = _launches_by_function(f, iter(dataset))
    assert _launches_in(counts, "while_body") >= 1, counts
