"""The model zoo (issue 19): real Keras models with random weights, trained and run for
inference under plain tf.function, TF's XLA and tfxla-lite, interleaved in one process.

Run: .venv/bin/python -m benchmarks.zoo [MODEL ...] [--quick] [--steps train,fit,infer]
     [--repeats N] [--json PATH]
     (MODEL: mlp, transformer, lstm, small_cnn, resnet50, mobilenetv2; default all)

Each model gives steps the way Keras users write them: a `GradientTape` training step
that ends in the optimizer's `apply_gradients` ("train"), inference as
`model(x, training=False)` ("infer") and, for the MLP and the LSTM, Keras's own
`train_step` through `model.compile(jit_compile=...)` and `train_on_batch` ("fit";
tfxla-lite's variant is made under `tl.enable()`, so Keras's `tf.function(jit_compile=True)`
is tfxla-lite's).

tfxla-lite's variant of a train or infer step is must-compile where tfxla-lite compiles
the whole trace, else auto-clustering (`min_cluster_size=1`, as `benchmarks/run.py`):
never TF's XLA in its place, so that its row measures tfxla-lite. Per step it reports
the medians of interleaved repeats (`tfxla_lite.timing.compare`), the speed-ups, the
launch ops that run in one step (both launch op types, counted by the op library: a
launch inside a loop left in TF counts once per iteration), the share of the step's FLOPs
inside compiled clusters (`tfxla_lite.coverage`, with convolution gradients counted at
their real cost) and the first call (trace + compile + run) of each of the three. A
variant that fails (TF's XLA refusing a model, say) prints its error in the row. The
goals of issue 19 are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/zoo.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from benchmarks.report import geomean  # noqa: E402
from benchmarks.run import forget_conversions, private_cache, warm_up  # noqa: E402
from benchmarks.workloads import (  # noqa: E402
    adam_step,
    measured_options,
    transformer_encoder_adam,
)
from tfxla_lite import api, coverage  # noqa: E402
from tfxla_lite.timing import compare  # noqa: E402

COMPILERS = ("tf_function", "xla", "lite")
GOAL_VS_TF_FUNCTION, GOAL_VS_XLA, GOAL_GEOMEAN_VS_TF_FUNCTION = 1.0, 1.25, 1.5
# -- the models ------------------------------------------------------------------------------

@dataclass
class Variant:
    """One compiler's form of a step: `call` runs one step; after the first call,
    `function()` gives the tf.function (or tfxla-lite Function) that runs it and its
    arguments, for counting launches and reading the clustering report."""

    call: Callable[[], object]
    function: Callable[[], tuple[Any, tuple]]
    mode: str = ""


@dataclass(frozen=True)
class ZooStep:
    model: str
    mode: str  # "train" (GradientTape), "fit" (Keras's train_step), "infer"
    description: str
    # compiler name ("tf_function", "xla" or "lite") -> its variant; called once per
    # compiler, after `prepare()` built the model (shared by the three where a step is a
    # plain function, one model each for "fit")
    prepare: Callable[[], Callable[[str], Variant]]


def _function_variants(fn: Callable[..., Any], args: list[tf.Tensor]
                       ) -> Callable[[str], Variant]:
    """The three compilers' forms of a step that is a Python function of tensors."""
    def variant(compiler: str) -> Variant:
        if compiler == "lite":
            return _lite_variant(fn, args)
        wrapped = tf.function(fn, jit_compile=compiler == "xla")
        return Variant(lambda: wrapped(*args), lambda: (wrapped, tuple(args)))
    return variant


def _lite_variant(fn: Callable[..., Any], args: list[tf.Tensor]) -> Variant:
    """Must-compile where tfxla-lite compiles the whole trace, else auto-clustering;
    decided on the first call, which the variant's `call` is."""
    chosen: dict[str, Any] = {}

    def call() -> object:
        if "function" in chosen:
            return chosen["function"](*args)
        lite = tl.function(fn, jit_compile=True, options=measured_options())
        try:
            result = lite(*args)
            chosen.update(function=lite, mode="jit")
        except tl.CompilationError:
            forget_conversions()
            lite = tl.function(fn, min_cluster_size=1)
            result = lite(*args)
            chosen.update(function=lite, mode="auto")
        variant.mode = chosen["mode"]
        return result

    variant = Variant(call, lambda: (chosen["function"], tuple(args)))
    return variant


def _keras_fit_variants(build: Callable[[], Any], loss: str, x: tf.Tensor, y: tf.Tensor
                        ) -> Callable[[str], Variant]:
    """Keras's own train step: one model per compiler, `model.compile(jit_compile=...)`
    and `train_on_batch`; tfxla-lite's made under `tl.enable()`."""
    import keras

    def variant(compiler: str) -> Variant:
        keras.utils.set_random_seed(0)
        model = build()
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss,
                      jit_compile=compiler != "tf_function")

        def call() -> object:
            if compiler == "lite" and model.train_function is None:
                # Keras makes its step's tf.function on the first call, here patched.
                tl.enable()
                try:
                    return model.train_on_batch(x, y)
                finally:
                    tl.disable()
            return model.train_on_batch(x, y)

        def function() -> tuple[Any, tuple]:
            # `train_function` calls `one_step_on_data`, Keras's tf.function, through a
            # functools.wraps wrapper that converts optionals.
            step = inspect.getclosurevars(model.train_function).nonlocals["one_step_on_data"]
            return step.__wrapped__, ((x, y, None),)

        return Variant(call, function)
    return variant


def _tensor(shape: tuple[int, ...], seed: int) -> tf.Tensor:
    rng = np.random.default_rng(seed)
    return tf.constant(rng.standard_normal(shape).astype(np.float32))


def _labels(batch: int, classes: int, seed: int) -> tf.Tensor:
    return tf.constant(np.random.default_rng(seed).integers(0, classes, (batch,)), tf.int32)


def _sparse_cross_entropy(y: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    import keras

    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                       from_logits=True))


def _classifier_steps(name: str, description: str, build: Callable[[], Any],
                      x: Callable[[], tf.Tensor], classes: int, batch: int,
                      fit: bool = False) -> list[ZooStep]:
    """Train (and, with `fit`, Keras fit) and infer steps of a classifier from logits."""
    import keras

    def model() -> Any:
        keras.utils.set_random_seed(0)
        return build()

    def train() -> Callable[[str], Variant]:
        return _function_variants(adam_step(model(), _sparse_cross_entropy),
                                  [x(), _labels(batch, classes, 1)])

    def infer() -> Callable[[str], Variant]:
        built = model()
        return _function_variants(lambda x: built(x, training=False), [x()])

    def keras_fit() -> Callable[[str], Variant]:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return _keras_fit_variants(build, loss, x(), _labels(batch, classes, 1))

    steps = [ZooStep(name, "train", f"{description}; GradientTape + Adam", train)]
    if fit:
        steps.append(ZooStep(name, "fit", f"{description}; compile/train_on_batch, Adam",
                             keras_fit))
    return steps + [ZooStep(name, "infer", f"{description}; model(x, training=False)", infer)]


def mlp(quick: bool) -> list[ZooStep]:
    import keras

    batch, sizes = (8, [32, 16, 16, 4]) if quick else (128, [784, 512, 256, 10])

    def build() -> Any:
        layers: list[Any] = [keras.Input((sizes[0],))]
        for units in sizes[1:-1]:
            layers += [keras.layers.Dense(units), keras.layers.BatchNormalization(),
                       keras.layers.ReLU(), keras.layers.Dropout(0.2)]
        return keras.Sequential(layers + [keras.layers.Dense(sizes[-1])])

    return _classifier_steps("mlp", f"MLP {'-'.join(map(str, sizes))} (BatchNorm, Dropout), "
                             f"batch {batch}", build, lambda: _tensor((batch, sizes[0]), 2),
                             sizes[-1], batch, fit=True)


def transformer(quick: bool) -> list[ZooStep]:
    batch, sequence, vocabulary, features, heads, blocks = (
        (2, 8, 50, 16, 2, 1) if quick else (16, 64, 1000, 64, 4, 2))
    workload = transformer_encoder_adam(batch, sequence, vocabulary, features, heads, blocks)

    def train() -> Callable[[str], Variant]:
        step, args = workload.make()
        return _function_variants(step, args)

    def infer() -> Callable[[str], Variant]:
        step, args = workload.make()
        built = inspect.getclosurevars(step).nonlocals["model"]  # the step's own model
        return _function_variants(lambda x: built(x, training=False), args[:1])

    return [ZooStep("transformer", "train", workload.description, train),
            ZooStep("transformer", "infer", f"{workload.description.split(', Adam')[0]}, "
                    f"inference, batch {batch}", infer)]


def lstm(quick: bool) -> list[ZooStep]:
    import keras

    batch, sequence, vocabulary, features, units, classes = (
        (4, 6, 20, 8, 8, 3) if quick else (32, 50, 1000, 64, 128, 5))

    def build() -> Any:
        return keras.Sequential([keras.Input((sequence,), dtype="int32"),
                                 keras.layers.Embedding(vocabulary, features),
                                 keras.layers.LSTM(units), keras.layers.Dense(classes)])

    def tokens() -> tf.Tensor:
        rng = np.random.default_rng(3)
        return tf.constant(rng.integers(0, vocabulary, (batch, sequence)), tf.int32)

    return _classifier_steps("lstm", f"LSTM classifier (embedding {vocabulary}x{features}, "
                             f"{units} units, seq {sequence}), batch {batch}", build, tokens,
                             classes, batch, fit=True)


def small_cnn(quick: bool) -> list[ZooStep]:
    import keras

    batch, side, filters = (4, 12, (4, 8)) if quick else (64, 28, (32, 64))

    def build() -> Any:
        layers: list[Any] = [keras.Input((side, side, 1))]
        for n in filters:
            layers += [keras.layers.Conv2D(n, 3, padding="same"),
                       keras.layers.BatchNormalization(), keras.layers.ReLU(),
                       keras.layers.MaxPooling2D()]
        return keras.Sequential(layers + [keras.layers.Flatten(), keras.layers.Dense(10)])

    return _classifier_steps("small_cnn", f"Conv/BatchNorm/MaxPool CNN {side}x{side}, "
                             f"batch {batch}", build, lambda: _tensor((batch, side, side, 1), 4),
                             10, batch)


def _application(name: str, constructor: str, side: int, batch: int) -> list[ZooStep]:
    import keras

    def build() -> Any:
        return getattr(keras.applications, constructor)(
            weights=None, input_shape=(side, side, 3), classes=10, classifier_activation=None)

    return _classifier_steps(name, f"keras.applications.{constructor} {side}x{side}, random "
                             f"weights, batch {batch}", build,
                             lambda: _tensor((batch, side, side, 3), 5), 10, batch)


def resnet50(quick: bool) -> list[ZooStep]:
    return _application("resnet50", "ResNet50", 32 if quick else 64, 2 if quick else 16)


def mobilenetv2(quick: bool) -> list[ZooStep]:
    return _application("mobilenetv2", "MobileNetV2", 32 if quick else 96, 2 if quick else 16)


MODELS: dict[str, Callable[[bool], list[ZooStep]]] = {
    "mlp": mlp, "transformer": transformer, "lstm": lstm, "small_cnn": small_cnn,
    "resnet50": resnet50, "mobilenetv2": mobilenetv2}
QUICK_MODELS = ("mlp", "small_cnn")


def zoo(names: list[str], quick: bool) -> list[ZooStep]:
    return [step for name in names for step in MODELS[name](quick)]


# -- what is counted -------------------------------------------------------------------------

def launch_count(call: Callable[[], object]) -> int:
    """Launch ops (`TfxlaLiteLaunch` and `TfxlaLiteVariableLaunch`) that run during one
    `call()`, as the op library counts them: nodes that a graph holds but never runs
    (a branch not taken, a trace a caller does not use) do not count."""
    from tfxla_lite.runtime import loader

    before = loader.launch_timing().launches
    call()
    return loader.launch_timing().launches - before


def flop_share(programs: list[Any]) -> float | None:
    """Share of the FLOPs of tfxla-lite's programs inside compiled clusters
    (`coverage.function_coverage`: convolutions and their gradients at 2 FLOPs per
    multiply-add, pooling by window size)."""
    compiled = left = 0.0
    for program in programs:
        counted = coverage.function_coverage(program)
        compiled += counted.flops_compiled
        left += counted.flops_left
    return compiled / (compiled + left) if compiled + left else None


@contextlib.contextmanager
def built_programs() -> Iterator[list[Any]]:
    """Within the block, every program tfxla-lite builds is appended to the list (the
    hook `tfxla_lite.coverage.record` uses, keeping the programs themselves)."""
    programs: list[Any] = []
    build = api.build_program

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        program = build(*args, **kwargs)
        programs.append(program)
        return program

    api.build_program = recording_build
    try:
        yield programs
    finally:
        api.build_program = build


def _lite_mode(variant: Variant) -> str:
    if variant.mode:
        return variant.mode
    function, args = variant.function()
    if not isinstance(function, tl.Function):
        return "TF"
    report = function.explain(*args)
    fallback = report.jit_compile_fallback
    if fallback is None:
        return "jit" if report.jit_compile else "auto"
    return "XLA fallback" if fallback.runs_on_xla else "auto"


# -- one step --------------------------------------------------------------------------------

@dataclass
class Row:
    model: str
    mode: str
    description: str
    ms: dict[str, float] = field(default_factory=dict)
    first_call_ms: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    launches: dict[str, int] = field(default_factory=dict)
    lite_mode: str = ""
    compiled_flop_share: float | None = None

    def speedup(self, baseline: str) -> float | None:
        if baseline in self.ms and "lite" in self.ms:
            return self.ms[baseline] / self.ms["lite"]
        return None


def _error(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return (text[0] if text else type(error).__name__)[:160]


def measure(step: ZooStep, repeats: int) -> Row:
    row = Row(step.model, step.mode, step.description)
    try:
        make = step.prepare()
    except Exception as error:  # noqa: BLE001 - a model that cannot be built is a row too
        row.errors = {c: _error(error) for c in COMPILERS}
        return row
    variants: dict[str, Variant] = {}
    for compiler in COMPILERS:
        forget_conversions()  # each first call converts the step's source itself
        try:
            variant = make(compiler)
            with built_programs() as programs:
                start = time.perf_counter()
                variant.call()
                row.first_call_ms[compiler] = (time.perf_counter() - start) * 1e3
            if compiler == "lite":
                tl.wait_for_compiles()  # steady state is the O3 code's (tiered compiles)
                row.compiled_flop_share = flop_share(programs)
                row.lite_mode = _lite_mode(variant)
            row.launches[compiler] = launch_count(variant.call)
            variants[compiler] = variant
        except Exception as error:  # noqa: BLE001 - printed in the row, the run goes on
            row.errors[compiler] = _error(error)
    if variants:
        try:
            times = compare({c: v.call for c, v in variants.items()}, repeats=repeats)
            row.ms = {c: t * 1e3 for c, t in times.items()}
        except Exception as error:  # noqa: BLE001
            row.errors["timing"] = _error(error)
    return row


# -- the report ------------------------------------------------------------------------------

HEADER = ("| model | step | tf.function ms | XLA ms | tfxla-lite ms | vs tf.function "
          "| vs XLA | launches/step | FLOPs compiled | first call tf / XLA / lite ms "
          "| tfxla-lite mode | errors |")


def _number(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(rows: list[Row]) -> str:
    lines = [HEADER, "| --- | --- |" + " ---: |" * 8 + " --- | --- |"]
    for r in rows:
        first = " / ".join(_number(r.first_call_ms.get(c), ".0f") for c in COMPILERS)
        share = r.compiled_flop_share
        errors = "; ".join(f"{c}: {e}" for c, e in r.errors.items()).replace("|", "/")
        lines.append(
            f"| {r.model} | {r.mode} | {_number(r.ms.get('tf_function'), '.3f')} "
            f"| {_number(r.ms.get('xla'), '.3f')} | {_number(r.ms.get('lite'), '.3f')} "
            f"| {_number(r.speedup('tf_function'), '.2f')}x | {_number(r.speedup('xla'), '.2f')}x "
            f"| {_number(r.launches.get('lite'), 'd')} "
            f"| {'-' if share is None else f'{share:.0%}'} | {first} | {r.lite_mode or '-'} "
            f"| {errors or '-'} |")
    return "\n".join(lines)


def goals(rows: list[Row]) -> list[dict[str, Any]]:
    """Issue 19's goals for the zoo: every step >= 1.0x tf.function and >= 1.25x TF's XLA,
    the geometric mean >= 1.5x tf.function; each with what is missed and by how much."""
    def missed(baseline: str, goal: float) -> tuple[list[str], int]:
        measured = [(r, r.speedup(baseline)) for r in rows]
        below = [f"{r.model} {r.mode} {s:.2f}x" for r, s in measured
                 if s is not None and s < goal]
        unmeasured = sum(1 for _, s in measured if s is None)
        return below, unmeasured

    results = []
    for baseline, goal, label in [("tf_function", GOAL_VS_TF_FUNCTION, "tf.function"),
                                  ("xla", GOAL_VS_XLA, "TF's XLA")]:
        below, unmeasured = missed(baseline, goal)
        detail = ("below: " + ", ".join(below)) if below else "all steps measured meet it"
        if unmeasured:
            detail += f"; {unmeasured} step(s) not measured (errors in their rows)"
        results.append({"goal": f"every step >= {goal:.2f}x {label}",
                         "met": not below and not unmeasured, "detail": detail})
    speedups = [s for s in (r.speedup("tf_function") for r in rows) if s is not None]
    mean = geomean(speedups)
    short = mean < GOAL_GEOMEAN_VS_TF_FUNCTION
    results.append({"goal": f"geometric mean >= {GOAL_GEOMEAN_VS_TF_FUNCTION:.1f}x tf.function",
                    "met": not short,
                    "detail": f"{mean:.2f}x over {len(speedups)} steps"
                    + (f" ({mean / GOAL_GEOMEAN_VS_TF_FUNCTION:.0%} of the goal)" if short
                       else "")})
    return results


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help=f"names (default: all): {', '.join(MODELS)}")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny sizes of {', '.join(QUICK_MODELS)} (unless named), "
                             "3 repeats")
    parser.add_argument("--steps", default="train,fit,infer",
                        help="which steps of each model, comma-separated (default all)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (11)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    unknown = [n for n in args.models if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    names = args.models or list(QUICK_MODELS if args.quick else MODELS)
    repeats = args.repeats or (3 if args.quick else 11)
    os.environ["TFXLA_LITE_CACHE_DIR"] = str(private_cache())  # cold first calls
    print(f"load average: {_load()}; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    warm_up()  # no step's first call pays a compiler's one-time costs
    rows = []
    started = time.time()
    kinds = set(args.steps.split(","))
    for step in [s for s in zoo(names, args.quick) if s.mode in kinds]:
        row = measure(step, repeats)
        rows.append(row)
        print(f"{row.model} {row.mode}: " + ", ".join(
            f"{c} {row.ms[c]:.3f} ms" for c in COMPILERS if c in row.ms)
            + (f"; errors {row.errors}" if row.errors else "") + f" (load {_load()})",
            flush=True)
    print(f"\n{'quick' if args.quick else 'full'} run, {time.time() - started:.0f} s, "
          f"load average {_load()}; speed-ups are tf.function (or XLA) ms / tfxla-lite ms\n")
    print(table(rows))
    print("\ngoals (issue 19), printed, not asserted:")
    results = goals(rows)
    for goal in results:
        print(f"  {'met   ' if goal['met'] else 'MISSED'} {goal['goal']}: {goal['detail']}")
    if args.json is not None:
        args.json.write_text(json.dumps({"load_average": os.getloadavg(),
                                         "rows": [r.__dict__ for r in rows],
                                         "goals": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
