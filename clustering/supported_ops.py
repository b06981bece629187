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
    "Variables of unknown shape, in clusters of unknown dimensions or on a GPU":
        "their reads and writes stay in TF (a read is then a cluster input)",
    "ResourceApplyAdadelta, ResourceApplyFtrl, ResourceSparseApply*, ...":
        "not lowered yet (the optimizers Keras 3 and tf.compat.v1 use most are)",
    "SegmentSum (sorted), DynamicStitch with runtime indices": "not lowered yet (gather "
                                                               "and scatter opcodes exist)",
    "StatelessTruncatedNormalV2, StatelessTruncatedNormal":
        "stay in TF: TF's kernel redraws each group of outputs until they fall within 2 "
        "standard deviations, a data-dependent loop, and the CPU backend compiles no while",
    "StatelessRandomGetAlg": "stateful in TF's op registry (its value depends on the "
                             "device), so not a compile-time alg; TF's Python API passes a "
                             "constant alg instead",
    "StatelessRandomUniformV2 etc. with the ThreeFry alg, or an alg known only at run time":
        "stay in TF (only TF's Philox is reproduced)",
    "Einsum with an ellipsis or a repeated label": "not lowered yet (a diagonal needs a gather)",
    "If, While, StatelessIf, StatelessWhile": "control flow is not clustered yet",
}

# Where TF's kernels and XLA disagree: (TF ops, TF's CPU kernel, TF's XLA, tfxla-lite),
# measured with TF 2.21 (tests/clustering/test_semantics_vs_tf.py and
# test_half_float_sums_tf.py check the rows that follow XLA).
SEMANTICS: tuple[tuple[str, str, str, str], ...] = (
    ("GatherV2, Gather, GatherNd: an index out of range", "raises InvalidArgumentError",
     "clamps the index into the operand", "as XLA"),
    ("ScatterNd, TensorScatterUpdate/Add/Max/Min: an index out of range",
     "raises InvalidArgumentError", "drops that update", "as XLA"),
    ("UnsortedSegmentSum/Prod/Max/Min: a segment id >= num_segments",
     "raises InvalidArgumentError (drops negative ids)", "drops that row", "as XLA"),
    ("SparseSoftmaxCrossEntropyWithLogits: a label out of range",
     "raises InvalidArgumentError", "NaN loss for that row", "as XLA"),
    ("Div, FloorDiv, TruncateDiv, FloorMod, TruncateMod: an integer divided by zero",
     "raises (InvalidArgumentError; InternalError for the Truncate ones)",
     "x / 0 = -1, x % 0 = x", "as XLA"),
    ("Mean of integers over an empty axis", "0", "-1 (0 / 0)", "as XLA"),
    ("Pow of integers to a negative exponent", "raises InvalidArgumentError",
     "0, or ±1 for a base of ±1", "as XLA"),
    ("TopKV2 (so tf.sort, tf.argsort) over NaN", "no defined order (its comparator leaves "
     "NaN unordered)", "by sign bit: NaN above +inf, a negated NaN below -inf",
     "NaN above +inf whatever its sign (tf.sort puts NaN first)"),
    ("MatrixBandPart: num_lower or num_upper past the matrix", "raises InvalidArgumentError",
     "keeps the whole band on that side", "as XLA"),
    ("Cast of NaN, ±inf or an out-of-range float to an integer", "INT_MIN (x86)",
     "saturates at the integer's bounds; NaN gives 0", "as XLA"),
    ("Sign(-0.0)", "0.0", "-0.0", "as XLA"),
    ("Cholesky of a matrix that is not positive definite", "NaN below the diagonal, the "
     "upper triangle left unwritten", "NaN below the diagonal, zeros above", "as XLA"),
    ("MatrixTriangularSolve with a zero on the diagonal", "inf, -inf or NaN by substitution",
     "NaN (its blocked solve inverts the diagonal blocks)", "as TF's kernel"),
    ("Assert (`tf.debugging.assert_*`, `tf.debugging.Assert`) with a false condition",
     "raises InvalidArgumentError", "compiled to nothing: never checked (tf2xla's Assert "
     "kernel only logs 'Ignoring Assert operator')", "`jit_compile=True`: as XLA, the "
     "Assert, its message's string constants, the condition computed only for it and the "
     "AssertGuard `If` around it are left out (`tfxla_lite/assertions.py`); auto mode: the "
     "Assert stays in TF and is checked, as plain TF checks it"),
    ("Sum, Mean, Prod of float16", "accumulate in float16: a column of 4096 ones sums to "
     "2048, a mean can overflow to inf", "accumulate in float32, round once", "as XLA"),
    ("Max, Min reductions over a NaN", "NaN", "can drop it: reduce_max([1, NaN, 3]) is 3",
     "as TF (NaN)"),
    ("Softmax of a row holding NaN", "oneDNN's kernel (the default on x86): NaN where "
     "the input is NaN, 0 in the rest of the row; Eigen's (TF_ENABLE_ONEDNN_OPTS=0): NaN "
     "across the row", "NaN across the row", "as XLA (and TF's Eigen kernel)"),
    ("MaxPool (2-D and 3-D) over NaN, or a window of -inf", "skips NaN; a window of "
     "NaN or -inf gives the lowest finite value", "skips NaN; a window of -inf gives -inf",
     "as TF"),
    ("MaxPoolGrad among equal maxima, and over NaN", "the first maximum in row-major "
     "window order; a NaN only when it is first", "the first maximum, but the element "
     "after a NaN replaces it (select-and-scatter with ge)", "as TF"),
    ("Cumsum, Cumprod of float16/bfloat16", "accumulate in the 2-byte type",
     "accumulate in float32", "as TF"),
    ("StatelessRandomUniform(V2), ...UniformInt(V2), ...UniformFullInt(V2), "
     "StatelessRandomNormal(V2), StatelessRandomGetKeyCounter(Alg): a seed or key and "
     "counter", "Philox-4x32-10, TF's bits-to-number conversions, Box-Muller with glibc's "
     "logf and sincosf",
     "other numbers for the same seed (XLA's own bit generator and conversions)",
     "as TF, bit for bit (so Keras Dropout masks are TF's)"),
    ("ResizeBilinear over ±inf or NaN, and its rounding", "float32 blend of the two rows "
     "and two columns each output reads, top + (bottom - top) * lerp: a NaN or inf reaches "
     "only those outputs (inf next to a finite value gives NaN where lerp is 0)",
     "a convolution with the interpolation weights: NaN spreads to more outputs, finite "
     "results differ slightly (other weights arithmetic)", "as TF"),
    ("ResizeNearestNeighborGrad", "runs", "no kernel: `jit_compile=True` fails on it",
     "compiled, TF's values"),
)

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
        "dots accumulate in float32 and round once, as TF's XLA does (TF's own float16",
        "reductions accumulate in float16); Cumsum, Cumprod and the segment reductions",
        "accumulate in the 2-byte type, as TF's CPU kernels do.",
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
    lines += [
        "", "## Semantics that differ from TF", "",
        "A compiled op computes what TF's XLA computes. Where that differs from TF's own",
        "kernels, tfxla-lite follows XLA, in auto-clustering as in must-compile mode: TF's",
        "auto-clustering (`TF_XLA_FLAGS=--tf_xla_auto_jit=2`) compiles these ops too and",
        "gives XLA's values, so a program that TF's kernels would stop with an error runs",
        "on with a clamped index or a made-up quotient. Keep an op in TF where the error",
        "matters: leave it out of `--ops_to_cluster`, or validate the indices before it.",
        "",
        "| TF ops and inputs | TF's CPU kernel | TF's XLA | tfxla-lite |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {' | '.join(row)} |" for row in SEMANTICS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(supported_ops_markdown(), end="")
