"""Where a `jit_compile=True` trace runs when tfxla-lite cannot compile it whole.

`tfxla_lite.api` compiles a `jit_compile=True` trace as one must-compile program. When
that raises `CompilationError` and the function may fall back (everything but
`--strict_jit_compile`), `choose` decides, from what could not be compiled:

- **TF's XLA, whole**, the default: what plain TF runs for it, and some programs need
  XLA to run at all (Keras's grouped and channels-first 3-D convolutions, which TF's
  CPU kernels refuse).
- **auto-clustering**, when every op left over is one tfxla-lite leaves to TF's kernels
  by design in every mode (random number generation, TensorList and other variant or
  resource plumbing, ops refused only for shapes unknown when tracing, ops kept out by
  `--ops_to_cluster`, calls of functions TF's XLA compiles itself): TF's XLA would run
  such CNN and RNN steps several times slower than plain TF on CPU and draw other
  random numbers.
- **raise**, when TF's XLA refuses the trace as well (checked by converting it to HLO):
  plain TF with `jit_compile=True` fails too, so tfxla-lite fails with both reasons.

docs/usage.md ("Auto-clustering without code changes") states the same for users.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tfxla_lite.clustering.mark import (
    COLLECTIVE_REASON,
    PLUMBING_REASON,
    RESOURCE_REASON,
    VARIANT_REASON,
)
from tfxla_lite.report import FallbackNode

XLA = "xla"
AUTO = "auto"

# Reasons of ops whose TF kernels run them and which tfxla-lite leaves to TF in any mode.
_KEPT_REASONS = frozenset({PLUMBING_REASON, RESOURCE_REASON, VARIANT_REASON, COLLECTIVE_REASON})
_KEPT_REASON_PATTERNS = re.compile(
    r"(rank|shape) of (in|out)put \d+ (unknown|not fully static)"
    r"|input \d+ (must be a constant|decides an output shape)"
    r"|op type \w+ (is on the denylist|is not in --ops_to_cluster|runs on TF's kernel)"
    # A TensorList whose shape or size is not static, or that would cross a cluster's
    # edge (clustering/rules_control_flow.py): TF's list kernels run it.
    r"|TensorList")
_CALL_OP_TYPES = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
# The function attribute TF's `jit_compile=True` sets: TF's XLA compiles such a call.
_XLA_MUST_COMPILE = "_XlaMustCompile"
# TF's XLA refusing a trace, as `experimental_get_compiler_ir` words it (other errors
# there are about describing the inputs, and say nothing about the trace).
_XLA_REFUSAL = ("Detected unsupported operations", "tf2xla conversion failed")


@dataclass(frozen=True)
class Choice:
    """Where the trace runs (`XLA` or `AUTO`), and the ops that decided it."""

    target: str
    deciding: tuple[FallbackNode, ...]


def choose(offending: list[FallbackNode], graph: tf.Graph | None) -> Choice:
    """TF's XLA unless every op tfxla-lite could not compile is one TF's kernels run by
    design (module docstring). No offending op (an internal failure): TF's XLA."""
    needs_xla = tuple(node for node in offending if not _kept_in_tf(node, graph))
    if needs_xla or not offending:
        return Choice(XLA, needs_xla)
    return Choice(AUTO, tuple(offending))


def _kept_in_tf(node: FallbackNode, graph: tf.Graph | None) -> bool:
    if is_random_op(node.op_type) or node.reason in _KEPT_REASONS:
        return True
    if _KEPT_REASON_PATTERNS.match(node.reason):
        return True
    return node.op_type in _CALL_OP_TYPES and graph is not None and _calls_xla(graph,
                                                                              node.op_name)


def is_random_op(op_type: str) -> bool:
    """TF's random number ops, stateful and stateless: the ones tfxla-lite does not lower
    (stateful ops, truncated normals) stay in TF by design, drawing TF's numbers."""
    return ("Random" in op_type or op_type.startswith("Rng")
            or op_type in ("TruncatedNormal", "Multinomial", "StatelessMultinomial",
                           "StatelessTruncatedNormal", "StatelessTruncatedNormalV2",
                           "StatelessParameterizedTruncatedNormal"))


def _calls_xla(graph: tf.Graph, op_name: str) -> bool:
    """Whether op `op_name` of `graph` calls a function TF's XLA must compile."""
    try:
        name = graph.get_operation_by_name(op_name).get_attr("f").name
        definition = graph._get_function(name).cached_definition  # noqa: SLF001
        return bool(definition.attr[_XLA_MUST_COMPILE].b)
    except Exception:  # noqa: BLE001 - not in this graph (a body's op), or no such function
        return False


def xla_refusal(xla_function: Any, concrete: Any, args: tuple, kwargs: dict) -> str | None:
    """TF's XLA's reason for refusing the trace, or None when it converts it to HLO or
    when it cannot be asked (inputs it cannot describe: variables, unknown dimensions
    inside another function's trace): in doubt, TF's XLA is tried at the call."""
    call_args = _described(args, kwargs, concrete)
    if call_args is None:
        return None
    try:
        xla_function.experimental_get_compiler_ir(*call_args[0], **call_args[1])(stage="hlo")
    except Exception as error:  # noqa: BLE001 - XLA's errors come as ValueError
        text = str(error)
        if any(marker in text for marker in _XLA_REFUSAL):
            return _first_line_of_xla(text)
    return None


def _described(args: tuple, kwargs: dict, concrete: Any) -> tuple[tuple, dict] | None:
    """Arguments `experimental_get_compiler_ir` takes: all eager tensors and Python
    values, or else all `tf.TensorSpec`s of static shape (the trace's own signature)."""
    leaves = tf.nest.flatten((args, kwargs))
    if all(isinstance(leaf, (tf.Tensor, int, float, bool)) and not isinstance(leaf, tf.Variable)
           and (not isinstance(leaf, tf.Tensor) or hasattr(leaf, "numpy")) for leaf in leaves):
        return args, kwargs
    try:
        spec_args, spec_kwargs = concrete.structured_input_signature
    except Exception:  # noqa: BLE001 - not a traced ConcreteFunction
        return None
    specs = tf.nest.flatten((spec_args, spec_kwargs))
    if all(type(spec) is tf.TensorSpec and spec.shape.is_fully_defined() for spec in specs):
        return tuple(spec_args), dict(spec_kwargs)
    return None


def _first_line_of_xla(text: str) -> str:
    """XLA's refusal without its stack trace: 'Detected unsupported operations ...: AsString
    (No registered 'AsString' OpKernel for XLA_CPU_JIT devices ...)'."""
    for line in text.splitlines():
        if any(marker in line for marker in _XLA_REFUSAL):
            return line.strip().removeprefix("Failed getting HLO text: ").strip("'")
    return text.splitlines()[0] if text else text
