"""`python -m benchmarks.arena`: the temp arena after buffer assignment, TF's XLA
against tfxla-lite, module by module.

For every case (the test corpus of `tests/corpus/tf_functions.py` and the larger
`ARENA_CASES` below), a subprocess runs the function under TF's XLA
(`tf.function(jit_compile=True)`) with `XLA_FLAGS=--xla_dump_to=DIR`, which must be
set before TF starts XLA. From each module's dump:

- XLA's temp bytes: the sizes of the allocations its `*buffer-assignment.txt` tags
  `preallocated-temp`, the one arena its CPU runtime allocates per call for values
  that are not parameters, outputs or constants (what its heap simulator packed);
  its maybe-live-out allocations (outputs, which also host some temporaries) are
  reported beside it, without the tuple of output pointers.
- tfxla-lite's temp bytes: `BufferAssignment.temp_bytes` for the module XLA started
  from (`*.before_optimizations.txt`, the `'hlo'` stage), after the default pipeline;
  its output bytes are the sizes of the outputs, which also host some temporaries.

Both place buffers at 64-byte aligned offsets and end the arena at the end of its
last buffer. Results go to `benchmarks/results/arena.json`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS_FILE = ROOT / "tests" / "corpus" / "tf_functions.py"
RESULTS = ROOT / "benchmarks" / "results" / "arena.json"
BUFFER_ASSIGNMENT_SUFFIX = ".cpu_after_optimizations-buffer-assignment.txt"


# --- XLA's buffer-assignment dump --------------------------------------------------

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+), (.*):$")
_VALUE = re.compile(r"^ value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")


@dataclass(frozen=True)
class XlaAllocation:
    index: int
    size: int
    tags: str  # e.g. "parameter 1, shape |f32[4]| at ShapeIndex {}", "preallocated-temp"
    values: tuple[tuple[str, int, int, str], ...]  # (name, size, offset, shape)

    @property
    def is_temp(self) -> bool:
        return "preallocated-temp" in self.tags

    @property
    def is_live_out(self) -> bool:
        return "maybe-live-out" in self.tags

    @property
    def is_tuple(self) -> bool:
        """The table of output pointers of a tuple-shaped result (no array data)."""
        return bool(self.values) and all(shape.startswith("(") for *_, shape in self.values)


def parse_xla_buffer_assignment(text: str) -> list[XlaAllocation]:
    """The allocations of XLA's `*-buffer-assignment.txt` (the part before the values)."""
    headers: list[tuple[int, int, str]] = []
    values: list[list[tuple[str, int, int, str]]] = []
    for line in text.splitlines():
        if line.startswith(("Total bytes used", "Used values")):
            break
        match = _ALLOCATION.match(line)
        if match:
            headers.append((int(match[1]), int(match[2]), match[3]))
            values.append([])
            continue
        value = _VALUE.match(line)
        if value and values:
            values[-1].append((value[1], int(value[2]), int(value[3]), value[4]))
    return [XlaAllocation(index, size, tags, tuple(vals))
            for (index, size, tags), vals in zip(headers, values, strict=True)]


def xla_temp_bytes(allocations: Sequence[XlaAllocation]) -> int:
    return sum(a.size for a in allocations if a.is_temp)


def xla_live_out_bytes(allocations: Sequence[XlaAllocation]) -> int:
    return sum(a.size for a in allocations if a.is_live_out and not a.is_tuple)


# --- tfxla-lite's plan for the same module -----------------------------------------

@dataclass(frozen=True)
class OurPlan:
    temp_bytes: int
    temp_bytes_without_reuse: int
    output_bytes: int
    hosted_in_outputs: int  # temporaries that live in an output buffer
    temp_bytes_by_opcode: dict[str, int]  # arena values' bytes by defining opcode


def plan_module(hlo_text: str, pipeline: str | None = None) -> OurPlan:
    """Parse `hlo_text`, run `pipeline` (None: the default one) and buffer assignment."""
    from tfxla_lite.hlo.parser import parse_module
    from tfxla_lite.passes import DEFAULT_PIPELINE, assign_buffers, optimize

    module = optimize(parse_module(hlo_text), pipeline or DEFAULT_PIPELINE)
    assignment = assign_buffers(module)
    root = module.entry.root
    outputs = list(root.operands) if root.opcode == "tuple" else [root]
    output_names = {o.name for o in outputs}
    hosted = sum(1 for name, s in assignment.slices.items()
                 if s.kind == "output" and name not in output_names)
    opcode_of = {inst.name: inst.opcode for inst in module.entry.instructions}
    by_opcode: dict[str, int] = {}
    for name, s in assignment.slices.items():
        if s.kind == "temp":
            opcode = opcode_of[name.split("{")[0]]  # a leaf `fusion{1}` of `fusion`
            by_opcode[opcode] = by_opcode.get(opcode, 0) + s.size
    return OurPlan(assignment.temp_bytes, assignment.temp_bytes_without_reuse,
                   sum(o.shape.byte_size for o in outputs), hosted, by_opcode)


# --- the cases ----------------------------------------------------------------------

@dataclass(frozen=True)
class ArenaCase:
    name: str
    fn: Callable[..., Any]
    inputs: tuple[tuple[str, tuple[int, ...]], ...]


def arena_cases() -> list[ArenaCase]:
    """Larger and more varied functions than the test corpus: model pieces at sizes
    where the arena matters (imports TensorFlow)."""
    import tensorflow as tf

    f32, s32 = "float32", "int32"

    def dense(x: Any, w: Any, b: Any) -> Any:
        return tf.nn.relu(x @ w + b)

    def layer_norm(x: Any, gamma: Any, beta: Any) -> Any:
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta

    def attention(q: Any, k: Any, v: Any) -> Any:
        scores = tf.matmul(q, k, transpose_b=True) / 8.0
        return tf.matmul(tf.nn.softmax(scores), v)

    def mlp_grads(x: Any, y: Any, w1: Any, w2: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch([w1, w2])
            loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ w1) @ w2 - y))
        return (loss, *tape.gradient(loss, [w1, w2]))

    def softmax_xent_grads(x: Any, labels: Any, w: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(w)
            logits = x @ w
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits))
        return loss, tape.gradient(loss, w)

    def lstm_cell(x: Any, h: Any, c: Any, w: Any, u: Any, b: Any) -> Any:
        i, f, g, o = tf.split(x @ w + h @ u + b, 4, axis=1)
        c2 = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        return tf.sigmoid(o) * tf.tanh(c2), c2

    def adam(w: Any, g: Any, m: Any, v: Any) -> Any:
        m2 = 0.9 * m + 0.1 * g
        v2 = 0.999 * v + 0.001 * g * g
        return w - 1e-3 * m2 / (tf.sqrt(v2) + 1e-7), m2, v2

    def pairwise_distances(x: Any, y: Any) -> Any:
        xx = tf.reduce_sum(x * x, axis=1, keepdims=True)
        yy = tf.reduce_sum(y * y, axis=1)
        return tf.sqrt(tf.maximum(xx + yy - 2.0 * tf.matmul(x, y, transpose_b=True), 0.0))

    def ffn_block(x: Any, w1: Any, w2: Any, gamma: Any, beta: Any) -> Any:
        return layer_norm(x + tf.nn.gelu(x @ w1, approximate=True) @ w2, gamma, beta)

    def batch_norm_train(x: Any, gamma: Any, beta: Any) -> Any:
        mean, var = tf.nn.moments(x, axes=[0])
        return tf.nn.batch_normalization(x, mean, var, beta, gamma, 1e-3), mean, var

    return [
        ArenaCase("mlp_forward_b64", lambda x, w1, b1, w2, b2: dense(x, w1, b1) @ w2 + b2,
                  ((f32, (64, 256)), (f32, (256, 512)), (f32, (512,)), (f32, (512, 128)),
                   (f32, (128,)))),
        ArenaCase("mlp_softmax_b32", lambda x, w1, b1, w2: tf.nn.softmax(dense(x, w1, b1) @ w2),
                  ((f32, (32, 128)), (f32, (128, 256)), (f32, (256,)), (f32, (256, 10)))),
        ArenaCase("residual_dense", lambda x, w, b: x + dense(x, w, b),
                  ((f32, (128, 256)), (f32, (256, 256)), (f32, (256,)))),
        ArenaCase("attention_4x64x32", attention,
                  ((f32, (4, 64, 32)), (f32, (4, 64, 32)), (f32, (4, 64, 32)))),
        ArenaCase("layer_norm_256x256", layer_norm,
                  ((f32, (256, 256)), (f32, (256,)), (f32, (256,)))),
        ArenaCase("softmax_1024x256", lambda x: tf.nn.softmax(x), ((f32, (1024, 256)),)),
        ArenaCase("log_softmax_512x100", lambda x: tf.nn.log_softmax(x), ((f32, (512, 100)),)),
        ArenaCase("gelu_tanh_64x1024", lambda x: tf.nn.gelu(x, approximate=True),
                  ((f32, (64, 1024)),)),
        ArenaCase("mlp_grads", mlp_grads,
                  ((f32, (32, 64)), (f32, (32, 16)), (f32, (64, 128)), (f32, (128, 16)))),
        ArenaCase("softmax_xent_grads", softmax_xent_grads,
                  ((f32, (64, 32)), (s32, (64,)), (f32, (32, 10)))),
        ArenaCase("lstm_cell", lstm_cell,
                  ((f32, (16, 32)), (f32, (16, 64)), (f32, (16, 64)), (f32, (32, 256)),
                   (f32, (64, 256)), (f32, (256,)))),
        ArenaCase("adam_update", adam, ((f32, (256, 256)),) * 4),
        ArenaCase("pairwise_distances", pairwise_distances,
                  ((f32, (128, 16)), (f32, (96, 16)))),
        ArenaCase("ffn_block", ffn_block,
                  ((f32, (32, 64)), (f32, (64, 256)), (f32, (256, 64)), (f32, (64,)),
                   (f32, (64,)))),
        ArenaCase("batch_norm_train", batch_norm_train,
                  ((f32, (128, 64)), (f32, (64,)), (f32, (64,)))),
        ArenaCase("row_stats", lambda x: (tf.reduce_mean(x, 1), tf.math.reduce_std(x, 1),
                                          tf.reduce_max(x, 1) - tf.reduce_min(x, 1)),
                  ((f32, (512, 128)),)),
        ArenaCase("l2_normalize", lambda x: tf.math.l2_normalize(x, axis=1),
                  ((f32, (256, 128)),)),
        ArenaCase("sigmoid_xent", lambda z, t: tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=t, logits=z)),
                  ((f32, (256, 64)), (f32, (256, 64)))),
        ArenaCase("outer_sum_reduce", lambda x, y: tf.reduce_sum(
            x[:, None, :] * y[None, :, :], axis=2), ((f32, (64, 32)), (f32, (48, 32)))),
        ArenaCase("transpose_chain", lambda x, y: tf.transpose(x) @ y + tf.transpose(
            tf.tanh(x)) @ y, ((f32, (64, 96)), (f32, (64, 32)))),
        ArenaCase("one_hot_embedding", lambda i, table: tf.one_hot(i, 100) @ table,
                  ((s32, (64,)), (f32, (100, 32)))),
        ArenaCase("argmax_large", lambda x: tf.argmax(x, axis=1, output_type=tf.int32),
                  ((f32, (256, 100)),)),
        ArenaCase("masked_select", lambda x, y: tf.where(x > y, tf.exp(x), tf.exp(y) * 2.0)
                  + tf.where(x < 0.0, x, -y), ((f32, (256, 256)), (f32, (256, 256)))),
        ArenaCase("poly_multi_output", lambda x: (x * x * x - 2.0 * x, tf.sin(x) * tf.cos(x),
                                                  tf.reduce_sum(x * x)),
                  ((f32, (512, 128)),)),
        ArenaCase("max_pool_reshape", lambda x: tf.reduce_max(
            tf.reshape(x, (32, 16, 2, 16, 2)), axis=(2, 4)), ((f32, (32, 32, 32)),)),
        ArenaCase("dense_tanh_concat", lambda x, w: tf.concat(
            [tf.tanh(x @ w), tf.sigmoid(x @ w)], axis=1), ((f32, (64, 64)), (f32, (64, 128)))),
    ]


def corpus_cases() -> list[ArenaCase]:
    """The test corpus (`tests/corpus/tf_functions.py`, imports TensorFlow)."""
    spec = importlib.util.spec_from_file_location("tfxla_lite_corpus_cases", CORPUS_FILE)
    assert spec is not None and spec.loader is not None
    corpus = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = corpus  # dataclasses look their module up
    spec.loader.exec_module(corpus)
    return [ArenaCase(c.name, c.fn, c.inputs) for c in corpus.CASES]


def _arguments(case: ArenaCase, seed: int = 0) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = []
    for dtype, shape in case.inputs:
        if dtype == "bool":
            arrays.append(rng.random(shape) < 0.5)
        elif dtype == "int32":
            arrays.append(rng.integers(0, 10, size=shape).astype(np.int32))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


def _xla_worker(dump: Path, names: Sequence[str]) -> None:
    """In a process whose XLA_FLAGS dump to `dump`: run each case under TF's XLA and
    write `manifest.json`, case name -> the dump prefix of its module."""
    import tensorflow as tf

    cases = {c.name: c for c in corpus_cases() + arena_cases()}
    manifest: dict[str, str] = {}
    for name in names or list(cases):
        case = cases[name]

        def run(*args: Any, fn: Callable[..., Any] = case.fn) -> Any:
            return fn(*args)

        run.__name__ = f"arena_{name}"
        before = set(dump.glob(f"*{BUFFER_ASSIGNMENT_SUFFIX}"))
        tf.function(run, jit_compile=True)(*_arguments(case))
        new = sorted(set(dump.glob(f"*{BUFFER_ASSIGNMENT_SUFFIX}")) - before)
        if len(new) != 1:
            raise RuntimeError(f"case {name}: {len(new)} XLA modules compiled, expected 1")
        manifest[name] = new[0].name[:-len(BUFFER_ASSIGNMENT_SUFFIX)]
    (dump / "manifest.json").write_text(json.dumps(
        {"tensorflow": tf.__version__, "modules": manifest}, indent=1))


@dataclass(frozen=True)
class XlaModule:
    case: str
    hlo_text: str  # before XLA's optimizations: the 'hlo' stage
    buffer_assignment: str
    tensorflow: str = ""  # the version whose XLA compiled it


def dump_xla_modules(names: Sequence[str] = (), directory: Path | None = None
                     ) -> list[XlaModule]:
    """Run the cases (all of them by default) under TF's XLA in a subprocess that dumps
    every module; return each one's HLO before optimizations and buffer assignment."""
    with tempfile.TemporaryDirectory(prefix="tfxla_lite_arena_") as scratch:
        dump = directory or Path(scratch)
        env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump}", TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.arena", "--xla-worker", str(dump), *names],
            env=env, cwd=ROOT, capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"the XLA dump run failed:\n{result.stderr[-3000:]}")
        manifest = json.loads((dump / "manifest.json").read_text())
        return [XlaModule(case, (dump / f"{prefix}.before_optimizations.txt").read_text(),
                          (dump / f"{prefix}{BUFFER_ASSIGNMENT_SUFFIX}").read_text(),
                          manifest["tensorflow"])
                for case, prefix in manifest["modules"].items()]


# --- the comparison -----------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    module: str
    xla_temp_bytes: int
    tfxla_lite_temp_bytes: int
    ratio: float | None  # tfxla-lite / XLA; None when XLA's is 0
    xla_live_out_bytes: int
    tfxla_lite_output_bytes: int
    tfxla_lite_temp_bytes_without_reuse: int
    tfxla_lite_temps_in_outputs: int
    # Our arena's values, bytes by defining opcode: where a value XLA fuses away stays.
    tfxla_lite_temp_bytes_by_opcode: dict[str, int]

    @property
    def within_xla(self) -> bool:
        return self.tfxla_lite_temp_bytes <= self.xla_temp_bytes


def compare(modules: Sequence[XlaModule]) -> list[Row]:
    rows = []
    for module in modules:
        xla = parse_xla_buffer_assignment(module.buffer_assignment)
        ours = plan_module(module.hlo_text)
        xla_temp = xla_temp_bytes(xla)
        rows.append(Row(module.case, xla_temp, ours.temp_bytes,
                        ours.temp_bytes / xla_temp if xla_temp else None,
                        xla_live_out_bytes(xla), ours.output_bytes,
                        ours.temp_bytes_without_reuse, ours.hosted_in_outputs,
                        ours.temp_bytes_by_opcode))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    lines = [f"{'module':<22} {'XLA temp B':>10} {'tfxla-lite temp B':>17} {'ratio':>6} "
             f"{'XLA live-out B':>14} {'tfxla-lite out B':>16}",
             "-" * 100]
    for r in rows:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else (
            "=" if r.tfxla_lite_temp_bytes == 0 else "inf")
        lines.append(f"{r.module:<22} {r.xla_temp_bytes:>10} {r.tfxla_lite_temp_bytes:>17} "
                     f"{ratio:>6} {r.xla_live_out_bytes:>14} {r.tfxla_lite_output_bytes:>16}")
    within = sum(r.within_xla for r in rows)
    xla_total = sum(r.xla_temp_bytes for r in rows)
    ours_total = sum(r.tfxla_lite_temp_bytes for r in rows)
    lines += ["-" * 100,
              f"{len(rows)} modules; tfxla-lite's arena <= XLA's in {within}; "
              f"total {ours_total} B against XLA's {xla_total} B"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.arena", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write results")
    parser.add_argument("--xla-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.xla_worker is not None:
        _xla_worker(args.xla_worker, args.cases)
        return 0
    began = time.perf_counter()
    modules = dump_xla_modules(args.cases)
    rows = compare(modules)
    print(format_table(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "definitions": {
            "xla_temp_bytes": "sum of XLA's preallocated-temp allocations "
                              "(cpu_after_optimizations-buffer-assignment.txt)",
            "tfxla_lite_temp_bytes": "BufferAssignment.temp_bytes after the default "
                                     "pipeline, on XLA's before_optimizations module",
            "xla_live_out_bytes": "XLA's maybe-live-out allocations, tuple tables excluded",
            "tfxla_lite_output_bytes": "the sizes of the module's outputs",
        },
        "tensorflow": modules[0].tensorflow if modules else None,
        "seconds": round(time.perf_counter() - began, 2),
        "rows": [asdict(r) for r in rows],
    }, indent=1) + "\n")
    # Issue #3's acceptance: fails where any module's arena is larger than XLA's.
    return 0 if all(r.within_xla for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
