"""The supported-op table of docs/supported_ops.md, generated from the op registry.

Regenerate the page after changing a rule (a test fails while it is out of date):

    python -m tfxla_lite.clustering.supported_ops > docs/supported_ops.md
"""

from __future__ import annotations

from tfxla_lite.clustering.registry import OP_RULES, OpRule

# Ops users meet in training graphs that do not compile, and why. Not exhaustive: any
# op without a rule stays in TF, and `tfxla_lite.explain` names it.
NOT_SUPPORTED: dict[str, str] = {
    "MirrorPadGrad, ReverseSequence": "not lowered yet",
    "Bitcast": "needs a bitcast-convert HLO opcode",
    "ResourceGather, ResourceScatterAdd, ...": "resource ops stay in TF (a variable's "
                                               "read is a cluster input)",
    "SegmentSum (sorted), DynamicStitch with runtime indices": "not lowered yet (gather "
                                                               "and scatter opcodes exist)",
    "StatelessRandomUniformV2 and the other random ops": "stay in TF, so masks are TF's "
                                                         "(TF's XLA draws other numbers)",
    "Einsum with an ellipsis or a repeated label": "not lowered yet (a diagonal needs a gather)",
    "If, While, StatelessIf, StatelessWhile": "control flow is not clustered yet",
}

_ORDER = ("bool", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def _dtypes(rule: OpRule) -> str:
    names = sorted(rule.dtypes, key=lambda d: (_ORDER.index(d) if d in _ORDER else 99, d))
    return ", ".join(names)


def _constant_inputs(rule: OpRule) -> str:
    leading = [f"the first {rule.static_leading}"] if rule.static_leading else []
    return ", ".join(leading + [str(i) for i in rule.static_inputs])


def supported_ops_markdown() -> str:
    """The Markdown page listing every registered TF op with its dtypes and limits."""
    lines = [
        "# Supported TF ops",
        "",
        "Generated from the op registry (`clustering/registry.py` and the `rules_*.py`",
        "files) by `python -m tfxla_lite.clustering.supported_ops > docs/supported_ops.md`;",
        "a test fails when this page is out of date. Every op needs fully static shapes;",
        "*constant inputs* must be compile-time constants (Consts, or integer arithmetic on",
        "them and on static shapes, which is folded). The dtypes bound the op's inputs and",
        "outputs other than its constant inputs. float16 and bfloat16 compute element-wise",
        "in their own type (every result rounded to it); Sum, Prod, Mean, softmax sums and",
        "dots accumulate in float32 and round once, as TF and XLA do; Cumsum, Cumprod and",
        "the segment reductions accumulate in the 2-byte type, as TF's CPU kernels do.",
        "",
        f"{len(OP_RULES)} op types.",
        "",
        "| TF op | dtypes | constant inputs | notes |",
        "| --- | --- | --- | --- |",
    ]
    for op_type in sorted(OP_RULES, key=str.lower):
        rule = OP_RULES[op_type]
        lines.append(f"| {op_type} | {_dtypes(rule)} | {_constant_inputs(rule)} | "
                     f"{rule.note} |".replace("  ", " "))
    lines += ["", "## Not supported", "", "| TF ops | why |", "| --- | --- |"]
    lines += [f"| {ops} | {why} |" for ops, why in NOT_SUPPORTED.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(supported_ops_markdown(), end="")
