"""The supported-op table of docs/supported_ops.md, generated from the op registry.

Regenerate the page after changing a rule (a test fails while it is out of date):

    python -m tfxla_lite.clustering.supported_ops > docs/supported_ops.md
"""

from __future__ import annotations

from tfxla_lite.clustering.registry import OP_RULES, OpRule

# Ops users meet in training graphs that do not compile, and why. Not exhaustive: any
# op without a rule stays in TF, and `tfxla_lite.explain` names it.
NOT_SUPPORTED: dict[str, str] = {
    "Cumsum, Cumprod": "need a reduce-window (or scan) HLO opcode",
    "StridedSlice with negative strides, ReverseV2": "need a reverse HLO opcode",
    "Bitcast": "needs a bitcast-convert HLO opcode",
    "Erfc in float64": "Cephes' polynomials are float32's; float64 needs its own",
    "MirrorPad": "needs a reverse HLO opcode",
    "GatherV2, ScatterNd, ResourceGather": "need gather/scatter HLO opcodes",
    "Einsum with an ellipsis or a repeated label": "not lowered yet (a diagonal needs a gather)",
    "If, While, StatelessIf, StatelessWhile": "control flow is not clustered yet",
}

_ORDER = ("bool", "int32", "int64", "float32", "float64")


def _dtypes(rule: OpRule) -> str:
    names = sorted(rule.dtypes, key=lambda d: (_ORDER.index(d) if d in _ORDER else 99, d))
    return ", ".join(names)


def _constant_inputs(rule: OpRule) -> str:
    return ", ".join(str(i) for i in rule.static_inputs)


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
        "outputs other than its constant inputs.",
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
