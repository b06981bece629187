"""The benchmark suite: tf.function, TF's XLA and tfxla-lite side by side, in one run.

`python -m benchmarks [--quick]` (or `python benchmarks/run.py`) measures every
workload of `benchmarks/workloads.py` and writes `benchmarks/results/latest.json`,
`docs/benchmarks.md` (its results section) and `docs/benchmarks.png`; see
`docs/benchmarks.md` for what is measured and how to read it.
"""
