"""Training step time under MultiWorkerMirroredStrategy, 1 and 2 workers on loopback.

Run: .venv/bin/python -m benchmarks.multi_worker [--repeats N] [--steps-per-call K]
     [--width W] [--batch B] [--json PATH]

For each cluster size (1, then 2 worker processes started by
`tests/distribute/cluster.py`, TF_CONFIG on 127.0.0.1 ports), every worker builds one
strategy and times, interleaved in one process (`tfxla_lite.timing.compare`), three
variants of the same data-parallel training step of an MLP on the global batch B:
plain TF (`tf.function`), tfxla-lite (`tl.function(jit_compile=True)`) and the
collective alone (the all-reduce of tensors of the gradients' shapes, as the step does
it). Bursts are one call each, so that both workers make the same calls in the same
order (a collective waits for its peer). Printed per cluster size: the median seconds
per step of each, tfxla-lite's as a multiple of TF's, and the collective's share of
each step. Worker 0's figures are reported; the load average before and after the run
is printed with them. On a shared machine only ratios taken in one run mean something.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # `python benchmarks/multi_worker.py`
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "distribute"))


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


# -- one worker ---------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    """One task: times the three variants and writes OUT/worker_<index>.json."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    import tfxla_lite as tl
    from tfxla_lite.runtime import loader
    from tfxla_lite.timing import compare

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    replicas = strategy.num_replicas_in_sync
    per_replica = args.batch // replicas
    rng = np.random.default_rng(task["index"])
    x = rng.normal(size=(per_replica, args.width)).astype(np.float32)
    y = rng.normal(size=(per_replica, 1)).astype(np.float32)
    shards = [strategy.experimental_distribute_values_from_function(
        lambda ctx, a=a: tf.constant(a)) for a in (x, y)]

    def make_step(function: object) -> object:
        with strategy.scope():
            layers = [tf.Variable(rng.normal(size=shape).astype(np.float32) * 0.05)
                      for shape in ((args.width, args.width), (args.width,),
                                    (args.width, args.width), (args.width,),
                                    (args.width, 1), (1,))]

        def replica_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                h = tf.nn.relu(xb @ layers[0] + layers[1])
                h = tf.nn.relu(h @ layers[2] + layers[3])
                loss = tf.reduce_sum(tf.square(h @ layers[4] + layers[5] - yb)) / args.batch
            grads = tape.gradient(loss, layers)
            grads = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, grads)
            for variable, grad in zip(layers, grads):
                variable.assign_sub(0.01 * grad)
            return loss

        @function
        def step(xb: object, yb: object) -> tf.Tensor:
            for _ in range(args.steps_per_call):
                loss = strategy.run(replica_step, args=(xb, yb))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

        return lambda: step(*shards), layers

    tf_step, layers = make_step(tf.function)
    lite_step, _ = make_step(tl.function(jit_compile=True))
    launches = loader.launch_timing().launches
    lite_step()
    launches = loader.launch_timing().launches - launches
    if launches == 0:
        raise SystemExit("tfxla-lite's step ran no launch op: nothing was compiled")

    @tf.function
    def collective() -> object:
        def replica_fn() -> object:
            values = [tf.ones_like(v) for v in layers]
            for _ in range(args.steps_per_call):
                values = tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, values)
            return values[-1]

        return strategy.run(replica_fn)

    times = compare({"tf": tf_step, "tfxla_lite": lite_step, "collective": collective},
                    repeats=args.repeats, min_burst_seconds=0.0)
    result = {name: seconds / args.steps_per_call for name, seconds in times.items()}
    result.update(replicas=replicas, launches_per_call=launches)
    out = Path(args.worker) / f"worker_{task['index']}.json"
    out.write_text(json.dumps(result))


# -- the driver ----------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict:
    import cluster

    results = {}
    for workers in (1, 2):
        with tempfile.TemporaryDirectory(prefix="tfxla_lite-mw-") as out:
            argv = ["--worker", out, "--repeats", str(args.repeats), "--width",
                    str(args.width), "--batch", str(args.batch), "--steps-per-call",
                    str(args.steps_per_call)]
            cluster.run_cluster(Path(__file__), {"worker": workers}, argv, Path(out) / "logs",
                                timeout=args.timeout)
            results[workers] = json.loads((Path(out) / "worker_0.json").read_text())
    return results


def report(results: dict, before: str, after: str) -> str:
    lines = ["workers  TF step    tfxla-lite step  lite/TF  collective  share of TF / lite step"]
    for workers, r in results.items():
        lines.append(f"{workers:>7}  {r['tf'] * 1e3:7.3f} ms  {r['tfxla_lite'] * 1e3:10.3f} ms"
                     f"  {r['tfxla_lite'] / r['tf']:7.2f}  {r['collective'] * 1e3:7.3f} ms"
                     f"  {r['collective'] / r['tf']:6.1%} / "
                     f"{r['collective'] / r['tfxla_lite']:6.1%}")
    lines.append(f"load average before: {before}, after: {after}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps-per-call", type=int, default=1)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a task of the cluster
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    before = load_average()
    results = run(args)
    print(report(results, before, load_average()))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "load_before": before,
                                         "load_after": load_average()}, indent=1))


if __name__ == "__main__":
    main()
