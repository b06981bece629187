"""`tfxla_lite.enable()`: `tf.function` everywhere in the process goes through tfxla-lite.

Zero-code auto-clustering, as `TF_XLA_FLAGS=--tf_xla_auto_jit=2` is for XLA: `enable()`
replaces the `function` attribute of the `tensorflow` module and its public aliases
(user code and Keras look it up there; TF's internals are left alone). `jit_compile=True`
goes to `tfxla_lite.function`, which falls back to TF's own XLA where it cannot compile
(`xla_fallback.py`); `jit_compile=None` under `auto_jit` 1 or 2 auto-clusters; anything
else is the original `tf.function`. `disable()` puts the originals back; both are
idempotent. TensorFlow is imported only inside `enable()`, since the start-up hook
(`_startup.py`) may fire while this module imports it. docs/usage.md.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfxla_lite.flags import configure_logging, get_options
from tfxla_lite.options import Options
from tfxla_lite.original_function import replaced_tf_function, set_replaced_tf_function
from tfxla_lite.stats import PROCESS_STATS

logger = logging.getLogger("tfxla_lite")

# tf.function keywords tfxla_lite.function has no equivalent for: a function that uses
# one of them is left to the original tf.function.
_UNSUPPORTED_KEYWORDS = ("experimental_implements", "experimental_attributes")


@dataclass
class _PatchState:
    """What `enable()` changed, so that `disable()` can put it back (TF's own
    `tf.function` is kept in `tfxla_lite.original_function`)."""

    patched_modules: list[Any] = field(default_factory=list)
    options: Options | None = None  # None: the process's options at each tf.function call
    summary_registered: bool = False


_STATE = _PatchState()


def is_enabled() -> bool:
    return replaced_tf_function() is not None


def enable(options: Options | None = None) -> None:
    """Route `tf.function` through tfxla-lite (see the module docstring).

    `options` are used for every function made while enabled; None reads the
    process's options (`TFXLA_LITE_FLAGS`, `set_options`) at each `tf.function` call.
    Calling it again only replaces the options.
    """
    _STATE.options = options
    if options is not None:
        configure_logging(options)
    if not _STATE.summary_registered:
        _STATE.summary_registered = True
        atexit.register(_log_summary)
    if is_enabled():
        return
    import tensorflow as tf  # here, not at the top: see the module docstring

    original = tf.function
    wrapper = _make_wrapper(original)
    modules = [module for module in _public_tensorflow_modules()
               if module.__dict__.get("function") is original]
    for module in modules:
        module.function = wrapper
    set_replaced_tf_function(original)
    _STATE.patched_modules = modules
    logger.debug("tfxla-lite: tf.function patched in %s", ", ".join(m.__name__ for m in modules))


def disable() -> None:
    """Put TensorFlow's `tf.function` back; functions already made stay as they are."""
    original = replaced_tf_function()
    if original is None:
        return
    for module in _STATE.patched_modules:
        module.function = original
    set_replaced_tf_function(None)
    _STATE.patched_modules, _STATE.options = [], None


def enable_from_environment() -> bool:
    """Enable when `TFXLA_LITE_FLAGS` asks for auto-jit (the start-up hook's call).

    A malformed `TFXLA_LITE_FLAGS` raises `FlagError` here, at `import tensorflow`.
    """
    if get_options().auto_jit > 0:
        enable()
        return True
    return False


def _public_tensorflow_modules() -> list[Any]:
    # `tensorflow` and its generated API modules (`tensorflow._api.v2.compat.v1`, ...),
    # which hold `tf.function` and the compat aliases; not `tensorflow.python.*`.
    return [module for name, module in list(sys.modules.items())
            if module is not None and (name == "tensorflow" or name.startswith("tensorflow._api."))]


def _current_options() -> Options:
    return _STATE.options if _STATE.options is not None else get_options()


def _make_wrapper(original: Callable) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def function(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        func = bound.arguments.get("func")
        if func is None:  # @tf.function(...) with arguments: return the decorator
            arguments = {k: v for k, v in bound.arguments.items() if k != "func"}
            return lambda f: function(f, **arguments)
        choice = _choose(func, bound.arguments, _current_options())
        if choice is None:
            return original(*args, **kwargs)
        return choice

    function.__doc__ = ("tfxla-lite's tf.function (tfxla_lite.enable()); TensorFlow's is "
                        "tfxla_lite.original_function.original_tf_function().\n\n"
                        f"{original.__doc__}")
    return function


def _choose(func: Callable, arguments: dict[str, Any], options: Options) -> Any:
    """The tfxla-lite Function for this tf.function call, or None for the original."""
    from tfxla_lite.api import Function  # imports TensorFlow: see the module docstring

    jit_compile = arguments.get("jit_compile")
    if jit_compile is None:
        jit_compile = arguments.get("experimental_compile")  # TF's deprecated spelling
    if jit_compile is False or (jit_compile is None and options.auto_jit <= 0):
        return None
    if any(arguments.get(name) is not None for name in _UNSUPPORTED_KEYWORDS):
        return None
    if isinstance(func, Function):
        return func
    # tfxla-lite's own tf.functions (the rewritten graph, the tracer) stay TF's: wrapping
    # them would compile the compiler's output again, without end.
    module = getattr(func, "__module__", None) or ""
    if module == "tfxla_lite" or module.startswith("tfxla_lite."):
        return None
    if hasattr(func, "python_function") and hasattr(func, "get_concrete_function"):
        func = func.python_function  # an existing tf.function: compile what it wraps
    reduce_retracing = arguments.get("reduce_retracing") or arguments.get(
        "experimental_relax_shapes")  # TF's deprecated spelling
    return Function(func, jit_compile=True if jit_compile else None,
                    input_signature=arguments.get("input_signature"),
                    autograph=arguments.get("autograph", True), options=options,
                    jit_compile_fallback=not options.strict_jit_compile,
                    reduce_retracing=bool(reduce_retracing),
                    experimental_autograph_options=arguments.get(
                        "experimental_autograph_options"))


def _log_summary() -> None:
    if _current_options().auto_jit > 0 or PROCESS_STATS.functions:
        logger.info("%s", PROCESS_STATS.summary())
