"""The `tfxla-lite` command (also `python -m tfxla_lite.cli`).

- `tfxla-lite demo [EXAMPLE...]`: compile the seed models; show clusters, HLO, timings.
- `tfxla-lite build-op`: build (or find cached) the C++ launch op.
- `tfxla-lite coverage SCRIPT [ARG...] [--json] [--no-tf]`: run SCRIPT with tfxla-lite
  (auto_jit=2); print, per traced function, the compute ops and FLOPs compiled and the
  ops left in TF by reason, beside TF's own auto-clustering (`tfxla_lite/coverage.py`).
- `tfxla-lite opt FILE [-p simplify,cse,dce,fuse,assign-buffers]`: parse HLO text (XLA's
  or ours; `-` reads stdin), run the passes, print the module (and, for a trailing
  `assign-buffers`, the buffer assignment).
- `tfxla-lite run-hlo FILE [--check] [--seed N]`: parse, optimize and compile HLO text
  for this CPU, run it on seeded random inputs and print what comes out; with
  `--check`, compare with the NumPy evaluator. Exit status 0 when it ran (and
  matched), 1 on a mismatch, 2 when the text does not parse, verify or compile
  (opcodes nothing here runs are named first: `not supported: custom-call, ...`).
- `tfxla-lite export-stablehlo FILE [-p PASSES] [-o OUT]`: parse HLO text (after the
  passes asked, none by default), print its entry as StableHLO MLIR text
  (`tfxla_lite/hlo/stablehlo.py`); exit status 2 naming an opcode it cannot write.
- `tfxla-lite aot FILE.py:FUNCTION --signature 'f32[8,784]' ... -o PREFIX` (or an HLO
  text file): PREFIX.o and PREFIX.h, a library that runs without Python or TF
  (`tfxla_lite/aot.py`, docs/aot.md).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

ASSIGN_BUFFERS = "assign-buffers"
EXIT_MISMATCH = 1
EXIT_ERROR = 2

# rtol, atol per element type for --check: the evaluator and the backend differ by
# summation order and vectorized transcendental functions (cf. tests/tolerances.py).
CHECK_TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-10, 1e-12),
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 1e-3),
    "bf16": (2e-2, 1e-2),
}


class CommandError(Exception):
    """A failure the command reports in one message and exit status 2."""


@dataclass(frozen=True)
class HloFileOptions:
    """What `opt` and `run-hlo` were asked, parsed once from the command line."""

    path: str
    pipeline: str
    verify: bool = True
    check: bool = False
    seed: int = 0
    print_large_constants: bool = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tfxla-lite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="compile the seed models; show clusters, HLO, timings",
                        add_help=False)
    commands.add_parser("build-op", help="build (or find cached) the C++ launch op",
                        add_help=False)
    commands.add_parser("coverage", help="run a script with tfxla-lite; report the share of "
                        "ops and FLOPs compiled, beside TF's auto-clustering", add_help=False)
    commands.add_parser("aot", help="compile a TF function or HLO file to an object file and "
                        "a C header that run without Python or TF", add_help=False)
    _add_opt_parser(commands)
    _add_run_hlo_parser(commands)
    _add_export_parser(commands)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from tfxla_lite.demo import main as demo_main

        return demo_main(rest)
    if args.command == "build-op":
        from tfxla_lite.runtime.build import main as build_main

        return build_main(rest)
    if args.command == "coverage":
        from tfxla_lite.coverage import main as coverage_main

        return coverage_main(rest)
    if args.command == "aot":
        from tfxla_lite.aot import main as aot_main

        return aot_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    options = HloFileOptions(path=args.file, pipeline=args.pipeline, verify=args.verify,
                             check=getattr(args, "check", False), seed=getattr(args, "seed", 0),
                             print_large_constants=getattr(args, "print_large_constants", False))
    try:
        if args.command == "opt":
            return run_opt(options)
        if args.command == "export-stablehlo":
            return run_export_stablehlo(options, args.output)
        return run_hlo(options)
    except CommandError as error:
        print(f"tfxla-lite {args.command}: {error}", file=sys.stderr)
        return EXIT_ERROR


def _add_opt_parser(commands: Any) -> None:
    from tfxla_lite.passes import DEFAULT_PIPELINE

    opt = commands.add_parser("opt", help="run HLO passes on an HLO text file, print the result")
    opt.add_argument("file", help="HLO text file ('-' for stdin)")
    opt.add_argument("-p", "--pipeline", default=DEFAULT_PIPELINE,
                     help=f"comma-separated passes, optionally ending in {ASSIGN_BUFFERS} "
                          f"(default: {DEFAULT_PIPELINE})")
    opt.add_argument("--no-verify", dest="verify", action="store_false",
                     help="skip the verifier before and after each pass")
    opt.add_argument("--print-large-constants", action="store_true",
                     help="print every literal instead of eliding big ones as {...}")


def _add_run_hlo_parser(commands: Any) -> None:
    run = commands.add_parser("run-hlo", help="compile an HLO text file for this CPU and run "
                                              "it on random inputs")
    run.add_argument("file", help="HLO text file ('-' for stdin)")
    run.add_argument("--check", action="store_true",
                     help="compare the outputs with the NumPy evaluator (exit 1 on mismatch)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("-p", "--pipeline", default=None,
                     help="passes to run before codegen (default: codegen's own)")
    run.add_argument("--no-verify", dest="verify", action="store_false",
                     help="skip the verifier before and after each pass")


def _add_export_parser(commands: Any) -> None:
    export = commands.add_parser("export-stablehlo",
                                 help="print an HLO text file's entry as StableHLO MLIR text")
    export.add_argument("file", help="HLO text file ('-' for stdin)")
    export.add_argument("-p", "--pipeline", default="",
                        help="passes to run first (default: none, the module as written)")
    export.add_argument("-o", "--output", default=None, help="write here instead of stdout")
    export.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip the verifier")


def run_export_stablehlo(options: HloFileOptions, output: str | None) -> int:
    from tfxla_lite.hlo.stablehlo import StableHloError, module_to_stablehlo

    module = _parse(options.path)
    if options.pipeline or options.verify:
        _optimize(module, options.pipeline, options.verify)
    try:
        text = module_to_stablehlo(module)
    except StableHloError as error:
        raise CommandError(f"{options.path}: {error}") from None
    if output is None:
        sys.stdout.write(text)
    else:
        with open(output, "w") as handle:
            handle.write(text)
    return 0


# -- opt ----------------------------------------------------------------------------------

def split_pipeline(text: str) -> tuple[str, bool]:
    """The pass pipeline without `assign-buffers`, and whether it asked for it (last)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    assign = ASSIGN_BUFFERS in names
    if assign and names.index(ASSIGN_BUFFERS) != len(names) - 1:
        raise CommandError(f"{ASSIGN_BUFFERS} must come last in the pipeline, got {text!r}")
    return ",".join(name for name in names if name != ASSIGN_BUFFERS), assign


def run_opt(options: HloFileOptions) -> int:
    from tfxla_lite.hlo.printer import module_to_text
    from tfxla_lite.passes import assign_buffers

    pipeline, assign = split_pipeline(options.pipeline)
    module = _parse(options.path)
    _optimize(module, pipeline, options.verify)
    print(module_to_text(module, print_large_constants=options.print_large_constants), end="")
    if assign:
        print()
        print(assign_buffers(module).to_text())
    return 0


# -- run-hlo ------------------------------------------------------------------------------

def random_inputs(module: Any, seed: int) -> list[np.ndarray]:
    """One array per entry parameter: floats standard normal, integers in [-5, 5]
    (unsigned [0, 10]), preds fair coin flips."""
    rng = np.random.default_rng(seed)
    inputs = []
    for param in module.entry.parameters:
        shape = param.shape
        if shape.is_tuple:
            raise CommandError(f"parameter %{param.name} has tuple shape {shape}; "
                               "run-hlo feeds arrays only")
        dtype = shape.numpy_dtype
        if shape.element_type == "pred":
            value = rng.integers(0, 2, size=shape.dims).astype(bool)
        elif shape.element_type.startswith("u"):
            value = rng.integers(0, 11, size=shape.dims).astype(dtype)
        elif shape.element_type.startswith("s"):
            value = rng.integers(-5, 6, size=shape.dims).astype(dtype)
        else:
            value = rng.standard_normal(size=shape.dims).astype(dtype)
        inputs.append(np.asarray(value, dtype=dtype))
    return inputs


def compare(actual: np.ndarray, expected: np.ndarray, element_type: str) -> str | None:
    """None when `actual` matches `expected` (per-dtype tolerance), else what differs."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return f"got {actual.dtype}{list(actual.shape)}, expected " \
               f"{expected.dtype}{list(expected.shape)}"
    if element_type not in CHECK_TOLERANCES:
        bad = actual != expected
    else:
        rtol, atol = CHECK_TOLERANCES[element_type]
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        bad = ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{int(bad.sum())} of {bad.size} elements differ; at {index}: got "
            f"{actual[index]!r}, expected {expected[index]!r}")


def run_hlo(options: HloFileOptions) -> int:
    from tfxla_lite.codegen import compile_module
    from tfxla_lite.hlo.dynamic_padder import pad_dynamic
    from tfxla_lite.hlo.evaluator import evaluate

    text = _read(options.path)
    module = _parse_text(text, options.path)
    reference = _parse_text(text, options.path)  # compile_module rewrites `module`
    unknown = unsupported_opcodes(module)
    if unknown:
        quoted = ", ".join(repr(opcode) for opcode in unknown)
        raise CommandError(f"{options.path}: not supported: {', '.join(unknown)} (unknown "
                           f"opcode{'s' if len(unknown) > 1 else ''} {quoted}: the text parses "
                           f"and prints with `tfxla-lite opt -p '' --no-verify`, but nothing "
                           f"evaluates or compiles it)")
    inputs = random_inputs(module, options.seed)
    try:
        # A dynamic result comes back with its sizes, to cut it to them (hlo_text.md).
        dynamic_results = pad_dynamic(module, sizes_as_outputs=True)
        executable = compile_module(module, options.pipeline, verify=options.verify)
    except NotImplementedError as error:  # an opcode or form the CPU backend lacks
        named = re.search(r"opcode '([^']+)'", str(error))
        what = named.group(1) if named else "by the CPU backend"
        raise CommandError(f"cannot compile {options.path}: not supported: {what} "
                           f"({error})") from None
    except Exception as error:  # any backend failure is reported, not raised
        raise CommandError(f"cannot compile {options.path}: {type(error).__name__}: "
                           f"{error}") from None
    try:
        outputs = executable(*inputs)
    except Exception as error:
        raise CommandError(f"running {options.path} failed: {type(error).__name__}: "
                           f"{error}") from None
    if dynamic_results is not None:
        outputs = dynamic_results.unpad(outputs)
    for n, output in enumerate(outputs):
        print(f"output {n}: {_summary(output)}")
    if not options.check:
        return 0
    try:
        expected = _flatten(evaluate(reference, *inputs))
    except Exception as error:
        raise CommandError(f"the evaluator cannot run {options.path}: "
                           f"{type(error).__name__}: {error}") from None
    if len(expected) != len(outputs):
        print(f"check: {len(outputs)} outputs, the evaluator gives {len(expected)}")
        return EXIT_MISMATCH
    failures = 0
    for n, (actual, wanted) in enumerate(zip(outputs, expected)):
        problem = compare(np.asarray(actual), np.asarray(wanted), _element_type(wanted))
        if problem:
            failures += 1
            print(f"check: output {n} MISMATCH: {problem}")
    if failures:
        return EXIT_MISMATCH
    print(f"check: {len(outputs)} output(s) match the evaluator")
    return 0


def unsupported_opcodes(module: Any) -> list[str]:
    """The opcodes of `module` that tfxla-lite has no rules for, each once, in text order
    (XLA's `custom-call`, `async-start`, `copy-start`, collectives, ...)."""
    from tfxla_lite.hlo.opcodes import OPCODES

    found: dict[str, None] = {}
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode == "custom-call":  # named by its target: `custom-call lapack_spotrf`
                target = str(inst.attributes.get("custom_call_target", "")).strip('"')
                found[f"custom-call {target}".strip()] = None
            elif inst.opcode not in OPCODES:
                found[inst.opcode] = None
    return list(found)


def _summary(array: np.ndarray) -> str:
    from tfxla_lite.hlo.shape import Shape

    text = Shape.of_array(array).to_text(layout=False)
    if array.size == 0:
        return text + " (empty)"
    flat = array.reshape(-1)
    head = ", ".join(str(v) for v in flat[:4]) + (", ..." if flat.size > 4 else "")
    if array.dtype.kind in "fiu" and array.dtype != np.bool_:
        wide = flat.astype(np.float64)
        return (f"{text} min={np.nanmin(wide):.6g} max={np.nanmax(wide):.6g} "
                f"mean={np.mean(wide):.6g} [{head}]") if not np.isnan(wide).all() else \
            f"{text} [{head}]"
    return f"{text} [{head}]"


def _element_type(array: np.ndarray) -> str:
    from tfxla_lite.hlo.shape import element_type_of

    return element_type_of(np.asarray(array).dtype)


def _flatten(value: Any) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [array for element in value for array in _flatten(element)]
    return [np.asarray(value)]


# -- shared -------------------------------------------------------------------------------

def _read(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as error:
        raise CommandError(f"cannot read {path}: {error}") from None


def _parse_text(text: str, path: str) -> Any:
    from tfxla_lite.hlo.parser import ParseError, parse_module

    try:
        return parse_module(text)
    except ParseError as error:
        raise CommandError(f"{'<stdin>' if path == '-' else path}:{error}") from None


def _parse(path: str) -> Any:
    return _parse_text(_read(path), path)


def _optimize(module: Any, pipeline: str, verify: bool) -> None:
    from tfxla_lite.hlo.verifier import VerificationError
    from tfxla_lite.passes import optimize, parse_pipeline

    try:
        parse_pipeline(pipeline)
    except ValueError as error:
        raise CommandError(str(error)) from None
    try:
        optimize(module, pipeline, verify=verify)
    except VerificationError as error:
        raise CommandError(f"verification failed {error}") from None


if __name__ == "__main__":
    sys.exit(main())
