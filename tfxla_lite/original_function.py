"""TensorFlow's own `tf.function`, kept while `tfxla_lite.enable()` has replaced it.

`enable()` (tfxla_lite/autojit.py) puts tfxla-lite's `function` in the tensorflow
modules; what tfxla-lite makes itself (rewritten graphs, loop bodies, TF's XLA for a
fallback) must be TF's own, or tfxla-lite would compile its own output again. This
module sits below the API, the driver and autojit, so that all of them can ask for it
without importing each other. It imports TensorFlow only when asked: the start-up hook
imports autojit, and so this module, while TensorFlow may itself be importing.
"""

from __future__ import annotations

from collections.abc import Callable


class _Replaced:
    """The `tf.function` that `enable()` replaced; None while tfxla-lite is disabled."""

    function: Callable | None = None


def replaced_tf_function() -> Callable | None:
    """TF's `tf.function` while `enable()` has replaced it, else None."""
    return _Replaced.function


def set_replaced_tf_function(original: Callable | None) -> None:
    """Record TF's `tf.function` as replaced (autojit's `enable`), or None (`disable`)."""
    _Replaced.function = original


def original_tf_function() -> Callable:
    """TensorFlow's own `tf.function`, whether or not tfxla-lite is enabled."""
    if _Replaced.function is not None:
        return _Replaced.function
    import tensorflow as tf  # here, not at the top: see the module docstring

    return tf.function
