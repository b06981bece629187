"""The user API: `tfxla_lite.function`, a drop-in for `tf.function`, and `explain`.

The first step of the data flow: a call is keyed by its input signature
(shapes, dtypes, Python values); a new signature is traced with `tf.function`
and handed to `tfxla_lite.driver.build_program`; the program is cached and
called. `jit_compile=True` must compile every computational op,
`jit_compile=None` (the default) compiles what it can and leaves the rest to
TensorFlow, `jit_compile=False` is plain `tf.function`. A function takes the
process's options (`tfxla_lite.flags`) when it is made, unless given its own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.eager.polymorphic_function import (
    concrete_function,
    function_type_utils,
    polymorphic_function,
)
from tensorflow.python.saved_model import save_context

from tfxla_lite import distributed, dump, gradients, xla_fallback
from tfxla_lite.autograph_cache import conversions_cached
from tfxla_lite.collector import collector_paused
from tfxla_lite.driver import build_program
from tfxla_lite.flags import get_options
from tfxla_lite.options import Options
from tfxla_lite.original_function import original_tf_function
from tfxla_lite.program import CompilationError, Program
from tfxla_lite.report import ClusteringReport, JitCompileFallback
from tfxla_lite.rewrite import COMPILE_OP_TYPE, LAUNCH_OP_TYPE, VARIABLE_LAUNCH_OP_TYPE
from tfxla_lite.stats import PROCESS_STATS, compute_op_count

logger = logging.getLogger("tfxla_lite")

__all__ = ["CompilationError", "ClusteringReport", "Function", "explain", "function"]


def _leaf_key(value: Any) -> Any:
    if isinstance(value, (tf.Tensor, np.ndarray)):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, tf.TypeSpec):  # get_concrete_function(tf.TensorSpec(...))
        return ("spec", value)
    if isinstance(value, tf.Variable):
        return ("variable", id(value))
    if isinstance(value, (int, float, bool, str, type(None))):
        return ("value", type(value).__name__, value)
    spec = getattr(value, "_type_spec", None)  # composites: iterators, ragged, optionals
    if spec is not None:
        try:
            hash(spec)
            return ("composite", spec)
        except TypeError:
            pass
    return ("object", id(value))


class Function(polymorphic_function.Function):
    """A callable like `tf.function(fn)` whose clusters run as tfxla-lite executables.

    It is the user's own `tf.function` (a subclass of TF's `Function`, made with the
    same arguments), so that TF's machinery treats it as one: binding (`function_type`,
    `input_signature`, methods through `__get__`), `pretty_printed_concrete_signatures`
    and saving (`tf.saved_model.save` writes TF's own traces, never a launch op). Only
    calling it (and `get_concrete_function` outside a save) goes through tfxla-lite.

    When `jit_compile=True` cannot compile a trace, it falls back (TF's XLA for the whole
    trace, or auto-clustering: `tfxla_lite.xla_fallback`) with one warning, unless its
    options say `strict_jit_compile`; `jit_compile_fallback=True` falls back even then.
    """

    def __init__(self, fn: Callable, jit_compile: bool | None = None,
                 input_signature: Sequence[tf.TensorSpec] | None = None,
                 autograph: bool = True, options: Options | None = None,
                 name: str | None = None, jit_compile_fallback: bool = False,
                 reduce_retracing: bool = False,
                 experimental_autograph_options: Any = None,
                 experimental_attributes: dict[str, Any] | None = None) -> None:
        # The keywords after `jit_compile_fallback` are those TF's `__get__` passes
        # when it makes the per-instance copy of a method (`class_method_to_instance_method`).
        super().__init__(fn, name or getattr(fn, "__name__", "function"),
                         input_signature=input_signature, autograph=autograph,
                         jit_compile=jit_compile, reduce_retracing=reduce_retracing,
                         experimental_autograph_options=experimental_autograph_options,
                         experimental_attributes=experimental_attributes)
        self.jit_compile = jit_compile
        self.options = options if options is not None else get_options()
        self.jit_compile_fallback = jit_compile_fallback
        self._fallback_warned = False
        self._method_of: Function | None = None
        self._serializing = 0
        # Not `updated=__dict__`: a callable object's attributes (a Keras model's
        # `jit_compile`) must not overwrite this Function's own.
        functools.update_wrapper(self, fn, updated=())
        # Tracing for compilation uses a tf.function without the signature, so that
        # every call is traced with its concrete shapes; TF's own traces (this object's
        # base class) are what jit_compile=False runs and what a save writes.
        self._tracer = tf.function(fn, autograph=autograph, jit_compile=False)
        self._programs: dict[Any, Program] = {}

    # -- calling -------------------------------------------------------------------------
    # Called inside another tf.function (Keras' train step inside its loop function),
    # autograph would otherwise convert this method and, through it, the whole compiler.
    @tf.autograph.experimental.do_not_convert
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.jit_compile is False or _TF_TRACES.depth:
            return super().__call__(*args, **kwargs)
        if not kwargs and all(isinstance(a, tf.Tensor) for a in args):
            # Positional tensors of a signature compiled before, whose binding by TF was
            # checked then (`_flat_call`): what TF's structured call ends in, without
            # binding the arguments again (10-20 us a call: a latency-bound step is a
            # few hundred). Keyed as `_key` keys them.
            program = self._programs.get(tuple((tuple(a.shape), a.dtype) for a in args))
            if program is not None and program.flat_call:
                run = program.concrete_run
                return run._call_flat(list(args), run.captured_inputs)
        args, kwargs = self._canonical(args, kwargs)
        program = self._program(args, kwargs)
        run = program.concrete_run
        if program.flat_call:
            return run._call_flat(list(args), run.captured_inputs)
        if program.custom_gradients and _gradient_may_be_taken():
            if self.jit_compile:
                return self._custom_gradient_on_xla(program, args, kwargs)
            # Its custom gradient needs the trace's own graph (program.Program); inside
            # another tf.function that is compiled, the trace is inlined and clustered there.
            run = program.concrete_function
        return run(*args, **kwargs)

    def _custom_gradient_on_xla(self, program: Program, args: tuple, kwargs: dict) -> Any:
        """A must-compile trace whose custom gradient may be taken runs on TF's XLA, as
        plain TF runs it: the gradient needs TF's own trace, and that trace, inlined
        into a caller's auto-clustering (clustering/inline.py) or run on TF's kernels,
        would lose must-compile (ops with no TF CPU kernel, e.g. Conv3D over groups)."""
        note = ("a custom gradient may be taken (a tape, or a caller's graph), which "
                "needs TF's trace: it runs on TF's XLA, as jit_compile=True asks")
        if program.report.note is None:
            program.report.note = note
        if not self._fallback_warned:
            self._fallback_warned = True
            logger.warning("tfxla-lite: %s (jit_compile=True) runs with TF's XLA: %s",
                           self._name, note)
        with tf_traces_inside():
            return self._xla_function()(*args, **kwargs)

    def _xla_function(self) -> Any:
        """TF's own `tf.function(jit_compile=True)` of the Python function (the patched
        one would come back here), made once."""
        xla = self.__dict__.get("_xla_fallback_function")
        if xla is None:
            xla = original_tf_function()(self.python_function, jit_compile=True,
                                         autograph=getattr(self, "_autograph", True))
            self.__dict__["_xla_fallback_function"] = xla
        return xla

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        # TF's own: one copy per instance (weakly bound, cached while the instance
        # lives), whose signature has no `self`; it takes this function's settings.
        bound = super().__get__(instance, owner)
        if isinstance(bound, Function) and bound is not self and bound._method_of is None:
            bound._method_of = self
            bound.options = self.options
            bound.jit_compile_fallback = self.jit_compile_fallback
        return bound

    def _canonical(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Arguments bound as TF binds them: positions, defaults, `input_signature`
        (values converted to its dtypes; a mismatch raises TF's `TypeError`)."""
        bound = function_type_utils.canonicalize_function_inputs(
            args, kwargs, self.function_type, self._default_values)
        return tuple(bound.args), dict(bound.kwargs)

    def _key(self, args: tuple, kwargs: dict) -> Any:
        if not kwargs and all(isinstance(a, (tf.Tensor, np.ndarray)) for a in args):
            # The common call, keyed without tf.nest (this is on every call's path).
            return tuple((tuple(a.shape), a.dtype) for a in args)
        leaves = tf.nest.flatten((args, kwargs))
        structure = repr(tf.nest.map_structure(lambda _: 0, (args, kwargs)))
        return structure, tuple(_leaf_key(v) for v in leaves)

    def _program(self, args: tuple, kwargs: dict) -> Program:
        try:
            key = self._key(args, kwargs)
            hash(key)
        except TypeError:
            key = None
        program = self._programs.get(key) if key is not None else None
        if program is None:
            program = self._compile(args, kwargs)
            if program.custom_gradients and program.concrete_function is not None:
                program.custom_gradients = _overrides_reach_outputs(
                    program.concrete_function.graph)
            program.flat_call = (not program.custom_gradients
                                 and _flat_call(program.concrete_run, args, kwargs))
            if key is not None:
                self._programs[key] = program
        return program

    def _compile(self, args: tuple, kwargs: dict) -> Program:
        """Trace this signature and build its program, applying the fallback policies."""
        with collector_paused(self.options.pause_collector):
            return self._compile_unpaused(args, kwargs)

    def _compile_unpaused(self, args: tuple, kwargs: dict) -> Program:
        with conversions_cached(cache=self.options.cache):
            concrete = self._tracer.get_concrete_function(*args, **kwargs)
        refusal = distributed.remote_refusal()
        if refusal is not None:
            return self._left_to_tf(concrete, refusal)
        try:
            program = self._build(concrete, self.jit_compile, self.options, args, kwargs)
        except CompilationError as error:
            if not self.jit_compile or not (self.jit_compile_fallback
                                            or not self.options.strict_jit_compile):
                raise
            # jit_compile=True asks for TF's XLA, which compiles what tfxla-lite cannot
            # (and some programs need XLA to run at all): tfxla_lite/xla_fallback.py
            # decides between TF's XLA for the whole trace and auto-clustering.
            program = self._fall_back(concrete, error, args, kwargs)
        PROCESS_STATS.record(program.report)
        if self.options.clustering_debug:
            logger.info("%s", program.report)
        return program

    def _left_to_tf(self, concrete: Any, reason: str) -> Program:
        """TF's trace, run as it is, for a trace that will run in another process
        (`distributed.remote_refusal`); warned once, raised under strict_jit_compile."""
        if self.jit_compile and self.options.strict_jit_compile:
            raise CompilationError(f"tfxla-lite cannot compile {self._name}: {reason}")
        if not self._fallback_warned:
            self._fallback_warned = True
            logger.warning("tfxla-lite: %s runs in TensorFlow: %s", self._name, reason)
        report = ClusteringReport(self._name, self.jit_compile,
                                  note=f"whole function left to TensorFlow: {reason}")
        dump.dump_trace(self.options, concrete.graph, report)
        PROCESS_STATS.record(report)
        return Program(concrete, report, run=self._tracer, concrete_run=concrete)

    def _fall_back(self, concrete: Any, error: CompilationError, args: tuple,
                   kwargs: dict) -> Program:
        """The program of a `jit_compile=True` trace tfxla-lite cannot compile whole: TF's
        XLA runs it, or auto-clustering does (`xla_fallback.choose`), warned once."""
        choice = xla_fallback.choose(error.offending, concrete.graph)
        message = str(error.message)
        if choice.target == xla_fallback.AUTO:
            where = "auto-clustering (TF's kernels run what tfxla-lite leaves to them)"
            program = self._build(concrete, None, self.options.with_changes(min_cluster_size=1),
                                  args, kwargs)
            program.report.jit_compile_fallback = JitCompileFallback(
                xla_fallback.AUTO, "every op tfxla-lite cannot compile is one it leaves to "
                "TF's kernels (random numbers, TensorLists, shapes unknown when tracing)",
                choice.deciding)
        else:
            where = "TF's XLA, whole"
            xla = self._xla_function()
            with tf_traces_inside():
                refusal = xla_fallback.xla_refusal(xla, concrete, args, kwargs)
                if refusal is not None:
                    raise CompilationError(f"{message}\nTF's XLA cannot compile it either "
                                           f"(nor can plain TF with jit_compile=True): "
                                           f"{refusal}", error.offending) from error
                xla_concrete = xla.get_concrete_function(*args, **kwargs)
            deciding = choice.deciding
            reason = ("tfxla-lite cannot compile " + ", ".join(
                sorted({node.op_type for node in deciding})) if deciding
                else _first_lines(message, 1))
            report = ClusteringReport(
                self._name, True, fallbacks=list(error.offending),
                note=f"whole trace runs on TF's XLA (jit_compile=True fallback): {reason}",
                jit_compile_fallback=JitCompileFallback(
                    xla_fallback.XLA, reason, deciding, compute_op_count(
                        op.type for op in concrete.graph.get_operations())))
            program = Program(xla_concrete, report, run=xla, concrete_run=xla_concrete,
                              graph=concrete.graph)
            dump.dump_trace(self.options, concrete.graph, report)
        if not self._fallback_warned:
            self._fallback_warned = True
            logger.warning("tfxla-lite: %s (jit_compile=True) runs with %s: %s", self._name,
                           where, _first_lines(message, 6))
        return program

    def _build(self, concrete: Any, jit_compile: bool | None, options: Options, args: tuple,
               kwargs: dict) -> Program:
        try:
            program = build_program(concrete, jit_compile, options, dynamic=True)
            if not program.has_launches:
                # Nothing to launch: run the trace as it is rather than a re-import of it.
                program.run, program.concrete_run = self._tracer, concrete
            else:
                # Trace the rewritten graph now, so that a failure to import it is a
                # compile-time failure (and a fallback in auto mode), not a call error.
                program.concrete_run = program.run.get_concrete_function(  # type: ignore
                    *args, **kwargs)
        except CompilationError:
            raise
        except Exception as error:  # noqa: BLE001 - auto mode never fails the call
            if jit_compile:
                raise CompilationError(f"tfxla-lite could not compile {self._name}: "
                                       f"{type(error).__name__}: {error}") from error
            logger.warning("tfxla-lite: %s runs in TensorFlow: %s", self._name, error)
            report = ClusteringReport(self._name, jit_compile,
                                      note=f"whole function left to TensorFlow: "
                                           f"{type(error).__name__}: {error}")
            program = Program(concrete, report, run=self._tracer, concrete_run=concrete)
            dump.dump_trace(options, concrete.graph, report)
        return program

    # -- inspection ----------------------------------------------------------------------
    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The concrete function of the compiled program (launch ops in its graph), for
        tensors or `tf.TensorSpec`s; while being saved, TF's own trace instead."""
        if self.jit_compile is False:
            return super().get_concrete_function(*args, **kwargs)
        if self._serializing or save_context.in_save_context():
            return self._original_concrete_function(*args, **kwargs)
        if not args and not kwargs and self.input_signature is not None:
            args = tuple(self.input_signature)
        args, kwargs = self._canonical(args, kwargs)
        compiled = self._program(args, kwargs).concrete_run
        if isinstance(compiled, concrete_function.ConcreteFunction):
            # Given to `tf.saved_model.save` (as a signature, say), it must save TF's trace.
            specs = tf.nest.map_structure(_spec_of, (args, kwargs))
            compiled.__class__ = _CompiledConcreteFunction
            compiled._tfxla_lite_original = functools.partial(
                self._original_concrete_function, *specs[0], **specs[1])
        return compiled

    def _original_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        # The signatures called before are traced first, in their order, as plain TF
        # traced them: a trace of wider shapes made first would serve them instead.
        self._list_all_concrete_functions()
        return super().get_concrete_function(*args, **kwargs)

    def experimental_get_tracing_count(self) -> int:
        if self.jit_compile is False:
            return super().experimental_get_tracing_count()
        return self._tracer.experimental_get_tracing_count()

    # -- saving: TF's own traces -----------------------------------------------------------
    def _list_all_concrete_functions(self) -> list[Any]:
        """TF's own traces of every signature called or asked for (the saver's list, and
        `pretty_printed_concrete_signatures`'): the compiled calls traced only the tracer,
        so each of its signatures is traced by TF's own function here."""
        if self.input_signature is not None:
            super().get_concrete_function()
        elif self.jit_compile is not False:
            for concrete in self._tracer._list_all_concrete_functions():
                # Unnamed, as the specs of the tensors TF's own function was called with.
                args, kwargs = tf.nest.map_structure(_unnamed, concrete.structured_input_signature)
                super().get_concrete_function(*args, **kwargs)
        return list(self._function_cache.values())

    def _list_all_concrete_functions_for_serialization(self) -> list[Any]:
        # TF's, whose `get_concrete_function` calls must give TF's traces, not programs.
        self._serializing += 1
        try:
            return super()._list_all_concrete_functions_for_serialization()
        finally:
            self._serializing -= 1

    def experimental_get_compiler_ir(self, *args: Any, **kwargs: Any) -> Callable[..., str]:
        """As TF's: `f.experimental_get_compiler_ir(x)(stage='optimized_hlo')`.

        Stages: 'hlo' (as lowered from TF), 'optimized_hlo' (after the passes,
        fusion computations included), 'buffer_assignment', 'llvm' (optimized
        LLVM IR), 'llvm_unoptimized' and 'stablehlo' (the cluster as StableHLO MLIR
        text, `tfxla_lite/hlo/stablehlo.py`); one block per compiled cluster. GPU
        clusters have 'cuda' and 'kernel_plan' instead of the 'llvm' stages
        (`Program.compiler_ir`).
        """
        args, kwargs = self._canonical(args, kwargs)
        program = self._program(args, kwargs)

        def compiler_ir(stage: str = "hlo", device_name: str | None = None) -> str:
            return program.compiler_ir(stage)

        return compiler_ir

    def explain(self, *args: Any, **kwargs: Any) -> ClusteringReport:
        args, kwargs = self._canonical(args, kwargs)
        if self.jit_compile is False:
            return ClusteringReport(self._name, False)
        return self._program(args, kwargs).report

    def __repr__(self) -> str:
        return f"<tfxla_lite.Function {self._name} jit_compile={self.jit_compile}>"


def function(fn: Callable | None = None, *, jit_compile: bool | None = None,
             input_signature: Sequence[tf.TensorSpec] | None = None, autograph: bool = True,
             options: Options | None = None,
             min_cluster_size: int | None = None, reduce_retracing: bool = False,
             experimental_autograph_options: Any = None,
             experimental_relax_shapes: bool | None = None,
             experimental_compile: bool | None = None) -> Any:
    """`tf.function` with tfxla-lite compilation; usable as `@function` or `@function(...)`.
    Takes `tf.function`'s keywords, its deprecated spellings `experimental_relax_shapes`
    (`reduce_retracing`) and `experimental_compile` (`jit_compile`) included, so that
    swapping one decorator for the other changes nothing else."""
    if min_cluster_size is not None:
        base = options if options is not None else get_options()
        options = base.with_changes(min_cluster_size=min_cluster_size)
    if jit_compile is None:
        jit_compile = experimental_compile
    reduce_retracing = bool(reduce_retracing or experimental_relax_shapes)

    def decorate(f: Callable) -> Function:
        return Function(f, jit_compile=jit_compile, input_signature=input_signature,
                        autograph=autograph, options=options,
                        reduce_retracing=reduce_retracing,
                        experimental_autograph_options=experimental_autograph_options)

    return decorate(fn) if fn is not None else decorate


def explain(f: Any, *args: Any, **kwargs: Any) -> ClusteringReport:
    """The clustering report of `f` for these arguments: clusters, their ops, and every
    node left in TensorFlow with the reason. `f` is a `tfxla_lite.function` or a plain
    Python function / `tf.function` (explained as auto-clustering)."""
    if not isinstance(f, Function):
        python_function = getattr(f, "python_function", f)
        f = Function(python_function, jit_compile=None)
    return f.explain(*args, **kwargs)


def _flat_call(concrete: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a call with arguments like these reaches `concrete`'s flat inputs as they
    are: positional tensors only, each bound to the input at its position (TF's own
    binding of these arguments, checked once). Anything else (nested structures,
    Python values, keywords) keeps TF's structured call."""
    if kwargs or not args or not all(isinstance(a, tf.Tensor) for a in args):
        return False
    try:
        function_type = concrete.function_type
        bound = function_type_utils.canonicalize_function_inputs(args, {}, function_type)
        flat = function_type.unpack_inputs(bound)
    except Exception:  # noqa: BLE001 - TF's internals moved, or an unusual signature
        return False
    return (callable(getattr(concrete, "_call_flat", None)) and len(flat) == len(args)
            and all(f is a for f, a in zip(flat, args)))


class _CompiledConcreteFunction(concrete_function.ConcreteFunction):
    """A compiled program's concrete function as `Function.get_concrete_function` returns
    it: called while TF saves (the signature functions `tf.saved_model.save` traces), it
    calls TF's own trace of the same arguments instead, so that the SavedModel holds TF's
    graph and no launch op. Both take the trace's flat inputs in TF's order."""

    _tfxla_lite_original: Callable[[], Any]

    def _call_flat(self, tensor_inputs: Any, captured_inputs: Any) -> Any:
        if save_context.in_save_context():
            original = self._tfxla_lite_original()
            return original._call_flat(tensor_inputs, original.captured_inputs)
        return super()._call_flat(tensor_inputs, captured_inputs)


def _spec_of(value: Any) -> Any:
    return tf.TensorSpec.from_tensor(value) if isinstance(value, tf.Tensor) else value


def _unnamed(value: Any) -> Any:
    return tf.TensorSpec(value.shape, value.dtype) if type(value) is tf.TensorSpec else value


def _first_lines(text: str, count: int) -> str:
    lines = text.splitlines()
    more = f"\n  ... {len(lines) - count} more" if len(lines) > count else ""
    return "\n".join(lines[:count]) + more


class _TracesState(threading.local):
    depth = 0


# While TF's XLA traces a function, the tfxla-lite functions it calls must give TF's own
# traces: XLA cannot compile a launch op.
_TF_TRACES = _TracesState()


@contextlib.contextmanager
def tf_traces_inside() -> Any:
    """Within it, calls of tfxla-lite functions on this thread run TF's own traces."""
    _TF_TRACES.depth += 1
    try:
        yield
    finally:
        _TF_TRACES.depth -= 1


# -- gradients of launch nodes (tfxla_lite/gradients.py) -------------------------------------
# One compiled gradient function per distinct cluster and gradient mask, the least
# recently used dropped past the bound (each keeps its own per-shape programs).
_GRADIENT_FUNCTIONS: OrderedDict[gradients.LaunchGradient, Function] = OrderedDict()
_MAX_GRADIENT_FUNCTIONS = 256


def _gradient_function(gradient: gradients.LaunchGradient) -> Function:
    function = _GRADIENT_FUNCTIONS.get(gradient)
    if function is None:
        # Auto-clustering with clusters of any size: the backward pass compiles what it
        # can and never fails where TF's own gradient would run.
        options = get_options().with_changes(min_cluster_size=1)
        function = Function(gradient, jit_compile=None, autograph=False, options=options,
                            name="tfxla_lite_launch_gradient")
        _GRADIENT_FUNCTIONS[gradient] = function
        while len(_GRADIENT_FUNCTIONS) > _MAX_GRADIENT_FUNCTIONS:
            _GRADIENT_FUNCTIONS.popitem(last=False)
    else:
        _GRADIENT_FUNCTIONS.move_to_end(gradient)
    return function


@tf.RegisterGradient(VARIABLE_LAUNCH_OP_TYPE)
@tf.RegisterGradient(LAUNCH_OP_TYPE)
def _launch_op_gradient(op: tf.Operation, *output_gradients: Any) -> list[Any]:
    gradient, arguments = gradients.launch_gradient(op, output_gradients)
    if gradient is None:
        return [None] * len(op.inputs)
    return gradient.input_gradients(_gradient_function(gradient)(*arguments))


# Its boolean output only selects a branch of the StatelessIf it feeds.
tf.no_gradient(COMPILE_OP_TYPE)


def _gradient_may_be_taken() -> bool:
    """Whether a call now may be differentiated: a tape is recording (eager), or the call
    goes into a graph, which TF may differentiate later."""
    return not tf.executing_eagerly() or record.could_possibly_record()


def _overrides_reach_outputs(graph: tf.Graph) -> bool:
    """Whether an op whose gradient is overridden (`driver.has_gradient_overrides`), or
    a call of a function holding one, is upstream of an output of `graph` by data edges.
    Only then can differentiating the trace reach its custom gradient, which needs the
    trace's own graph; else the compiled program serves every call (launch ops have their
    own gradients, tfxla_lite/gradients.py). Keras's train step under a distribution
    strategy holds one (the all-reduce of the gradients) that feeds only variable writes."""
    library = graph.as_graph_def().library.function
    holding = {f.signature.name for f in library
               if any("_gradient_op_type" in n.attr for n in f.node_def)}
    calls = {f.signature.name: {*_called(f.node_def)} for f in library}
    grew = True
    while grew:  # functions calling a holder hold one too
        more = {name for name, callees in calls.items() if callees & holding} - holding
        holding |= more
        grew = bool(more)

    def overridden(op: tf.Operation) -> bool:
        return ("_gradient_op_type" in op.node_def.attr or op.type in holding
                or bool(set(_called([op.node_def])) & holding))

    seen: set[str] = set()
    stack = [t.op for t in getattr(graph, "outputs", []) if isinstance(t, tf.Tensor)]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if overridden(op):
            return True
        stack.extend(t.op for t in op.inputs)
    return False


def _called(nodes: Any) -> Any:
    """The function names the nodes' attributes name (calls, control-flow bodies)."""
    for node in nodes:
        yield node.op
        for value in node.attr.values():
            if value.HasField("func"):
                yield value.func.name
            yield from (f.name for f in value.list.func)
