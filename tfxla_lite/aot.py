"""Ahead-of-time libraries from TF functions and HLO files: `tfxla-lite aot`.

The TF-facing front of `codegen/cpu/aot.py` (which makes the object and the header from
an HLO module, without TF): a Python function is traced with `tf.function` for the given
argument shapes, and its whole graph must compile, as one cluster, the way a
`jit_compile=True` function must (every op marked compilable by `clustering/mark.py`,
lowered by `clustering/lower.py`); otherwise `AotError` names each op that cannot and
why. The library's arguments are the function's arguments in order, its results the
function's flattened outputs in order. Nothing here runs at the library's run time.

    tfxla-lite aot model.py:forward --signature 'f32[8,784]' -o libforward
    tfxla-lite aot module.hlo -o libmodule          # parameters as the module declares

Python: `compile_library(fn, ['f32[8,784]'], output='libforward')`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tfxla_lite.codegen.cpu import aot as core
from tfxla_lite.codegen.cpu.aot import PARALLEL_MODES, AotError, AotLibrary
from tfxla_lite.hlo import HloModule
from tfxla_lite.hlo.shape import Shape

__all__ = ["AotError", "AotLibrary", "compile_hlo_library", "compile_library", "lower_function",
           "main", "parse_signature"]

# Ops a traced function holds that carry no computation: its arguments, and control
# plumbing with no output.
_ARGUMENT_OPS = frozenset({"Placeholder", "NoOp"})


def parse_signature(text: str) -> Shape:
    """`'f32[8,784]'` (XLA's spelling; `'f32[]'` a scalar) as a `Shape`."""
    found = re.fullmatch(r"\s*([a-z]+[0-9]*)\[\s*([0-9,\s]*)\]\s*", text)
    if found is None:
        raise AotError(f"signature {text!r} is not an element type and dimensions, such as "
                       "'f32[8,784]'")
    dims = [d.strip() for d in found.group(2).split(",") if d.strip()]
    try:
        return Shape(found.group(1), tuple(int(d) for d in dims))
    except ValueError as error:
        raise AotError(f"signature {text!r}: {error}") from None


def load_function(target: str) -> Callable:
    """The function `path/to/module.py:name` names (the module is imported from its file)."""
    path, _, name = target.rpartition(":")
    if not path.endswith(".py") or not name:
        raise AotError(f"{target!r} is not FILE.py:FUNCTION")
    if not os.path.isfile(path):
        raise AotError(f"{path}: no such file")
    module_name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    function = getattr(module, name, None)
    if not callable(function):
        raise AotError(f"{path} has no function {name!r}")
    return function


def lower_function(function: Callable, signature: Sequence[Shape | str],
                   name: str | None = None) -> HloModule:
    """The HLO of `function` traced for `signature`, its whole graph as one cluster.

    Refused (`AotError`): a signature TF cannot trace the function with, a function that
    captures tensors or variables (a library has no state: make them constants inside
    the function, or arguments), and any op that cannot compile, each named with why.
    """
    import tensorflow as tf  # here: an HLO file compiles without importing TF

    from tfxla_lite.assertions import dropped_nodes
    from tfxla_lite.clustering.cluster import Cluster
    from tfxla_lite.clustering.inline import inline_function_calls
    from tfxla_lite.clustering.lower import lower_cluster
    from tfxla_lite.clustering.mark import MarkOptions, mark

    shapes = [parse_signature(s) if isinstance(s, str) else s for s in signature]
    python_function = getattr(function, "python_function", function)
    title = name or getattr(python_function, "__name__", "function")
    specs = [tf.TensorSpec(s.dims, tf.as_dtype(s.numpy_dtype), name=f"arg{n}")
             for n, s in enumerate(shapes)]
    spelled = ", ".join(s.to_text(layout=False) for s in shapes)
    try:
        concrete = tf.function(python_function).get_concrete_function(*specs)
    except (TypeError, ValueError) as error:
        raise AotError(f"{title} cannot be traced with the signature ({spelled}): "
                       f"{error}") from None
    if concrete.captured_inputs:
        raise AotError(f"{title} captures {len(concrete.captured_inputs)} tensor(s) or "
                       "variable(s); a library takes only its arguments: create the values "
                       "inside the function (constants) or pass them as arguments")
    graph = inline_function_calls(concrete.graph) or concrete.graph
    # Assertions and what only they read are left out, as must-compile leaves them.
    dropped = dropped_nodes(graph, _assertion_ifs(graph))
    # Convolutions, linear algebra and resizes compile even where TF's kernels would be
    # faster: a library has no TF to fall back to.
    decisions = mark(graph, MarkOptions())
    refused = [d for d in decisions.values() if not d.compilable
               and d.op_type not in _ARGUMENT_OPS and d.op_name not in dropped]
    if refused:
        lines = "\n".join(f"  {d.op_type} {d.op_name}: {d.reason}"
                          + (f" ({d.source})" if d.source else "") for d in refused)
        raise AotError(f"{title} cannot be compiled whole (must-compile); ops that cannot "
                       f"compile:\n{lines}")
    cluster = Cluster(
        name=title,
        op_names=[op.name for op in graph.get_operations()
                  if op.type not in _ARGUMENT_OPS and op.name not in dropped],
        inputs=[t.name for t in concrete.inputs],
        outputs=[t.name for t in concrete.outputs])
    try:
        return lower_cluster(graph, cluster, name=title)
    except Exception as error:  # a lowering rule's refusal, said as such
        raise AotError(f"{title} cannot be lowered to HLO: {type(error).__name__}: "
                       f"{error}") from None


def _assertion_ifs(graph: Any) -> set[str]:
    """The If ops of `graph` that only guard assertions (`tf.debugging.assert_*`): both
    branches hold nothing but assertions and plumbing, one of them an assertion, as
    `driver.compile_bodies` finds them for must-compile."""
    from tfxla_lite.assertions import assertion_only, dropped_nodes
    from tfxla_lite.clustering.body_graphs import body_calls, function_graph
    from tfxla_lite.clustering.control_flow_ops import IF_OPS

    if not any(op.type in IF_OPS for op in graph.get_operations()):
        return set()
    library = {f.signature.name: f for f in graph.as_graph_def(add_shapes=True).library.function}
    branches: dict[str, list[tuple[bool, bool]]] = {}
    for call in body_calls(graph, library):
        if call.op_type in IF_OPS:
            branch = function_graph(library, call)
            dropped = dropped_nodes(branch)
            branches.setdefault(call.node, []).append(
                (bool(dropped), assertion_only(branch, dropped)))
    return {node for node, pair in branches.items()
            if len(pair) == 2 and any(d for d, _ in pair) and all(a for _, a in pair)}


def compile_library(function: Callable, signature: Sequence[Shape | str],
                    output: str | None = None, name: str | None = None,
                    parallel: str = "serial", threads: int | None = None) -> AotLibrary:
    """`function` traced for `signature` and compiled ahead of time (`lower_function`,
    then `codegen/cpu/aot.compile_library`); written to `<output>.o` and `<output>.h`
    when `output` is given. `name` (default: the function's) names `<name>_run`."""
    python_function = getattr(function, "python_function", function)
    name = name or _c_name(getattr(python_function, "__name__", "function"))
    module = lower_function(function, signature, name)
    library = core.compile_library(module, name, parallel_mode=parallel, threads=threads)
    if output is not None:
        library.write(output)
    return library


def compile_hlo_library(text: str, output: str | None = None, name: str | None = None,
                        signature: Sequence[Shape | str] = (), parallel: str = "serial",
                        threads: int | None = None) -> AotLibrary:
    """HLO text compiled ahead of time. `signature`, when given, must be the entry's
    parameter shapes (a check that the library is the one the caller expects)."""
    from tfxla_lite.hlo.parser import ParseError, parse_module

    try:
        module = parse_module(text)
    except ParseError as error:
        raise AotError(f"the HLO text does not parse: {error}") from None
    if signature:
        expected = [parse_signature(s) if isinstance(s, str) else s for s in signature]
        actual = [p.shape for p in module.entry.parameters]
        if expected != actual:
            raise AotError(
                "signature mismatch: the module's parameters are ("
                + ", ".join(s.to_text(layout=False) for s in actual) + "), the signature says ("
                + ", ".join(s.to_text(layout=False) for s in expected) + ")")
    library = core.compile_library(module, name or _c_name(module.name), parallel_mode=parallel,
                                   threads=threads)
    if output is not None:
        library.write(output)
    return library


def _c_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return name if re.match(r"[A-Za-z_]", name) else "_" + name


def main(argv: list[str] | None = None) -> int:
    """`tfxla-lite aot TARGET [--signature S ...] -o PREFIX`: exit 0, or 2 with the reason."""
    parser = argparse.ArgumentParser(
        prog="tfxla-lite aot", description="compile a TF function or an HLO file to an object "
        "file and a C header (PREFIX.o, PREFIX.h) that run without Python or TF")
    parser.add_argument("target", help="FILE.py:FUNCTION, or an HLO text file")
    parser.add_argument("-s", "--signature", nargs="+", action="extend", default=[],
                        help="argument shapes in order, such as 'f32[8,784]' (required for "
                             "a function; for an HLO file, checked against its parameters)")
    parser.add_argument("-o", "--output", required=True, help="PREFIX of PREFIX.o and PREFIX.h")
    parser.add_argument("--name", default=None,
                        help="C name: the library exports NAME_run (default: the function's "
                             "or module's name)")
    parser.add_argument("--parallel", choices=PARALLEL_MODES, default="serial",
                        help="serial (no runtime), or openmp (libgomp; link with -fopenmp)")
    parser.add_argument("--threads", type=int, default=None,
                        help="with --parallel=openmp, how many threads kernels are cut into "
                             "parts for (default: this machine's CPUs; the team itself is "
                             "libgomp's, OMP_NUM_THREADS)")
    args = parser.parse_args(argv)
    try:
        if re.search(r"\.py:[^:/]+$", args.target):
            if not args.signature:
                raise AotError("a function needs --signature, one shape per argument")
            library = compile_library(load_function(args.target), args.signature,
                                      args.output, args.name, args.parallel, args.threads)
        else:
            try:
                with open(args.target, encoding="utf-8") as handle:
                    text = handle.read()
            except OSError as error:
                raise AotError(f"cannot read {args.target}: {error}") from None
            library = compile_hlo_library(text, args.output, args.name, args.signature,
                                          args.parallel, args.threads)
    except AotError as error:
        print(f"tfxla-lite aot: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}.o and {args.output}.h: {library.name}_run, "
          f"{len(library.parameter_shapes)} argument(s), {len(library.output_shapes)} "
          f"result(s), {library.temp_bytes} bytes of temp; needs "
          f"{', '.join(library.libraries) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
