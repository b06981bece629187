"""The user API: `tfxla_lite.function`, a drop-in for `tf.function`, and `explain`.

The first step of the data flow: a call is keyed by its input signature
(shapes, dtypes, Python values); a new signature is traced with `tf.function`
and handed to `tfxla_lite.compiler.build_program`; the program is cached and
called. `jit_compile=True` must compile every computational op,
`jit_compile=None` (the default) compiles what it can and leaves the rest to
TensorFlow, `jit_compile=False` is plain `tf.function`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfxla_lite import options as options_module
from tfxla_lite.compiler import CompilationError, Program, build_program
from tfxla_lite.options import Options
from tfxla_lite.report import ClusteringReport

logger = logging.getLogger("tfxla_lite")

__all__ = ["CompilationError", "ClusteringReport", "Function", "explain", "function"]


def _leaf_key(value: Any) -> Any:
    if isinstance(value, (tf.Tensor, np.ndarray)):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, tf.Variable):
        return ("variable", id(value))
    if isinstance(value, (int, float, bool, str, type(None))):
        return ("value", type(value).__name__, value)
    return ("object", id(value))


class Function:
    """A callable like `tf.function(fn)` whose clusters run as tfxla-lite executables."""

    def __init__(self, fn: Callable, jit_compile: bool | None = None,
                 input_signature: Sequence[tf.TensorSpec] | None = None,
                 autograph: bool = True, options: Options | None = None,
                 name: str | None = None) -> None:
        self.python_function = fn
        self.jit_compile = jit_compile
        self.input_signature = input_signature
        self.options = options if options is not None else options_module.DEFAULT_OPTIONS
        functools.update_wrapper(self, fn)
        self._name = name or getattr(fn, "__name__", "function")
        # The user's own tf.function: it checks input_signature and is what
        # jit_compile=False runs. Tracing for compilation uses a copy without the
        # signature, so that every call is traced with its concrete shapes.
        self._tf_function = tf.function(fn, input_signature=input_signature,
                                        autograph=autograph, jit_compile=False)
        self._tracer = tf.function(fn, autograph=autograph, jit_compile=False)
        try:
            self._signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self._signature = None
        self._programs: dict[Any, Program] = {}

    # -- calling -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.jit_compile is False:
            return self._tf_function(*args, **kwargs)
        args, kwargs = self._canonical(args, kwargs)
        program = self._program(args, kwargs)
        if program.concrete_run is not None:
            return program.concrete_run(*args, **kwargs)
        return program.run(*args, **kwargs)  # type: ignore[misc]

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        # Methods: bind like a function would.
        if instance is None:
            return self
        return functools.partial(self.__call__, instance)

    def _canonical(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Arguments bound to positions, as both traced functions will see them."""
        if self.input_signature is not None:
            flat = tf.nest.flatten(args)
            specs = tf.nest.flatten(self.input_signature)
            if len(flat) != len(specs) or kwargs:
                raise TypeError(f"{self._name} takes {len(specs)} arguments matching its "
                                f"input_signature, got {len(flat)}")
            tensors = []
            for value, spec in zip(flat, specs):
                tensor = tf.convert_to_tensor(value, dtype=spec.dtype)
                if not spec.shape.is_compatible_with(tensor.shape):
                    raise ValueError(f"{self._name}: argument of shape {tensor.shape} does not "
                                     f"match input_signature {spec}")
                tensors.append(tensor)
            return tuple(tf.nest.pack_sequence_as(args, tensors)), {}
        if self._signature is None or not kwargs:
            return args, kwargs
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs
        bound.apply_defaults()
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
            concrete = self._tracer.get_concrete_function(*args, **kwargs)
            try:
                program = build_program(concrete, self.jit_compile, self.options)
                # Trace the rewritten graph now, so that a failure to import it is a
                # compile-time failure (and a fallback in auto mode), not a call error.
                program.concrete_run = program.run.get_concrete_function(  # type: ignore[union-attr]
                    *args, **kwargs)
            except CompilationError:
                raise
            except Exception as error:  # noqa: BLE001 - auto mode never fails the call
                if self.jit_compile:
                    raise CompilationError(f"tfxla-lite could not compile {self._name}: "
                                           f"{type(error).__name__}: {error}") from error
                logger.warning("tfxla-lite: %s runs in TensorFlow: %s", self._name, error)
                report = ClusteringReport(self._name, self.jit_compile,
                                          note=f"whole function left to TensorFlow: "
                                               f"{type(error).__name__}: {error}")
                program = Program(concrete, report, run=self._tracer)
            if key is not None:
                self._programs[key] = program
        return program

    # -- inspection ----------------------------------------------------------------------
    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The concrete function of the rewritten program (launch ops in its graph)."""
        if self.jit_compile is False:
            return self._tf_function.get_concrete_function(*args, **kwargs)
        args, kwargs = self._canonical(args, kwargs)
        program = self._program(args, kwargs)
        return program.run.get_concrete_function(*args, **kwargs)  # type: ignore[union-attr]

    def experimental_get_compiler_ir(self, *args: Any, **kwargs: Any) -> Callable[..., str]:
        """As TF's: `f.experimental_get_compiler_ir(x)(stage='optimized_hlo')`.

        Stages: 'hlo' (as lowered from TF), 'optimized_hlo' (after the passes,
        fusion computations included), 'buffer_assignment', 'llvm' (optimized
        LLVM IR) and 'llvm_unoptimized'; one block per compiled cluster.
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
             min_cluster_size: int | None = None) -> Any:
    """`tf.function` with tfxla-lite compilation; usable as `@function` or `@function(...)`."""
    if min_cluster_size is not None:
        base = options if options is not None else options_module.DEFAULT_OPTIONS
        options = base.with_changes(min_cluster_size=min_cluster_size)

    def decorate(f: Callable) -> Function:
        return Function(f, jit_compile=jit_compile, input_signature=input_signature,
                        autograph=autograph, options=options)

    return decorate(fn) if fn is not None else decorate


def explain(f: Any, *args: Any, **kwargs: Any) -> ClusteringReport:
    """The clustering report of `f` for these arguments: clusters, their ops, and every
    node left in TensorFlow with the reason. `f` is a `tfxla_lite.function` or a plain
    Python function / `tf.function` (explained as auto-clustering)."""
    if not isinstance(f, Function):
        python_function = getattr(f, "python_function", f)
        f = Function(python_function, jit_compile=None)
    return f.explain(*args, **kwargs)
