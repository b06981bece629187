"""Convolution throughput: tfxla-lite's convolution kernels against TF's (oneDNN), forward,
backprop-input and backprop-filter, on the convolution shapes of the model zoo's CNNs,
interleaved in one process (`tfxla_lite.timing.compare`).

Run: .venv/bin/python benchmarks/convolution.py [--models small_cnn,resnet50,mobilenetv2]
     [--directions forward,input,filter] [--limit N] [--match TEXT] [--xla] [--gemm-path]
     [--placed tf|lite]
     .venv/bin/python benchmarks/convolution.py --zoo small_cnn,resnet50 [--steps infer]
The shapes are those of the zoo's models (`benchmarks/zoo.py`: small_cnn at batch 64,
ResNet50 64×64 and MobileNetV2 96×96 at batch 16, depthwise layers included), read off
the Keras layers, each distinct shape once with how often it occurs. Per shape and
direction it prints tfxla-lite's speed as a share of TF's (`lite/tf`: TF's time over
tfxla-lite's, above 1 is faster) and, with `--xla`, TF's XLA's, with `--gemm-path`
tfxla-lite's with the direct register blocks switched off (`--placed tf` keeps only the
shapes and directions the default rule leaves on TF); then the total per model and
direction (each shape weighted by its count). Each
tfxla-lite variant is compiled with `compile_convolutions` (every convolution on our
kernels) and checked against TF's result. Ratios hold on a busy machine; absolute
figures do not (the load average is printed). `--zoo` times the zoo's steps with the
convolutions placed three ways instead (`zoo_placements`).
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from benchmarks.workloads import measured_options  # noqa: E402
from tfxla_lite.timing import compare  # noqa: E402

DIRECTIONS = ("forward", "input", "filter")


@dataclass(frozen=True)
class ConvShape:
    """One convolution of a model: NHWC input, HWIO filter (HWCM when depthwise)."""

    input: tuple[int, int, int, int]
    filter: tuple[int, int, int, int]
    stride: int
    padding: str
    depthwise: bool

    def __str__(self) -> str:
        kind = "dw" if self.depthwise else "conv"
        n, h, w, c = self.input
        kh, kw, _, o = self.filter
        outputs = c * o if self.depthwise else o
        return f"{kind} {kh}x{kw}/{self.stride} {self.padding} {n}x{h}x{w}x{c}->{outputs}"

    @property
    def flops(self) -> int:
        n, h, w, _ = self.input
        out_h, out_w = (-(-h // self.stride), -(-w // self.stride)) if self.padding == "SAME" \
            else ((h - self.filter[0]) // self.stride + 1, (w - self.filter[1]) // self.stride + 1)
        return 2 * n * out_h * out_w * int(np.prod(self.filter))


def model_shapes(name: str) -> Counter[ConvShape]:
    """The distinct convolution shapes of the zoo model `name`, with their counts."""
    import keras

    if name == "small_cnn":
        layers = [keras.Input((28, 28, 1), batch_size=64)]
        for n in (32, 64):
            layers += [keras.layers.Conv2D(n, 3, padding="same"), keras.layers.MaxPooling2D()]
        model, batch = keras.Sequential(layers), 64
    else:
        constructor, side = {"resnet50": ("ResNet50", 64),
                             "mobilenetv2": ("MobileNetV2", 96)}[name]
        model = getattr(keras.applications, constructor)(
            weights=None, input_shape=(side, side, 3), classes=10)
        batch = 16
    shapes: Counter[ConvShape] = Counter()
    for layer in model.layers:
        if not isinstance(layer, keras.layers.Conv2D | keras.layers.DepthwiseConv2D):
            continue
        depthwise = isinstance(layer, keras.layers.DepthwiseConv2D)
        _, h, w, c = layer.input.shape
        kernel = tuple(layer.kernel.shape)
        shapes[ConvShape((batch, h, w, c), kernel, layer.strides[0], layer.padding.upper(),
                         depthwise)] += 1
    return shapes


def _functions(shape: ConvShape, direction: str) -> tuple[Callable[..., tf.Tensor],
                                                          list[tf.Tensor]]:
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(shape.input).astype(np.float32))
    w = tf.constant(rng.standard_normal(shape.filter).astype(np.float32) * 0.1)
    strides = [1, shape.stride, shape.stride, 1]
    conv = tf.nn.depthwise_conv2d if shape.depthwise else tf.nn.conv2d
    y = conv(x, w, strides, shape.padding)
    dy = tf.constant(rng.standard_normal(y.shape).astype(np.float32))
    if direction == "forward":
        return (lambda x, w: conv(x, w, strides, shape.padding)), [x, w]
    ops = tf.raw_ops
    if direction == "input":
        op = ops.DepthwiseConv2dNativeBackpropInput if shape.depthwise \
            else ops.Conv2DBackpropInput
        return (lambda w, dy: op(input_sizes=list(shape.input), filter=w, out_backprop=dy,
                                 strides=strides, padding=shape.padding)), [w, dy]
    op = ops.DepthwiseConv2dNativeBackpropFilter if shape.depthwise \
        else ops.Conv2DBackpropFilter
    return (lambda x, dy: op(input=x, filter_sizes=list(shape.filter), out_backprop=dy,
                             strides=strides, padding=shape.padding)), [x, dy]


def _lite(fn: Callable[..., tf.Tensor], args: list[tf.Tensor], gemm_path: bool
          ) -> Callable[..., tf.Tensor]:
    """tfxla-lite's function of `fn`, compiled (and its tiers done) now; with `gemm_path`
    the direct register blocks are switched off while it compiles."""
    from tfxla_lite.codegen.cpu import convolution_filter_direct, convolution_gemm

    plans = convolution_gemm.direct_plan, convolution_filter_direct.direct_plan
    if gemm_path:
        convolution_gemm.direct_plan = convolution_filter_direct.direct_plan = \
            lambda conv: None
    try:
        function = tl.function(fn, jit_compile=True,
                               options=measured_options(compile_convolutions=True))
        function(*args)
        tl.wait_for_compiles()  # steady state is the O3 code's (tiered compiles)
    finally:
        convolution_gemm.direct_plan, convolution_filter_direct.direct_plan = plans
    return function


def on_tf(shape: ConvShape, direction: str) -> bool:
    """Whether the default rule (`clustering/rules_conv_cost.py`) leaves `direction` of
    `shape` on TF's kernel."""
    from tfxla_lite.clustering.rules_conv import CONVOLUTION_OPS
    from tfxla_lite.clustering.rules_conv_cost import tf_kernel_faster

    fn, args = _functions(shape, direction)
    graph = tf.function(fn).get_concrete_function(*args).graph
    return any(tf_kernel_faster(op) for op in graph.get_operations()
               if op.type in CONVOLUTION_OPS)


def measure(shape: ConvShape, direction: str, xla: bool, gemm_path: bool = False
            ) -> dict[str, float]:
    """Seconds per call of TF's kernel, tfxla-lite's (with `gemm_path` also its GEMM
    path's, the direct register blocks off; with `xla` TF's XLA's), interleaved."""
    fn, args = _functions(shape, direction)
    variants = {"tf": tf.function(fn), "lite": _lite(fn, args, False)}
    if gemm_path:
        variants["gemm"] = _lite(fn, args, True)
    if xla:
        variants["xla"] = tf.function(fn, jit_compile=True)
    expected = variants["tf"](*args).numpy()
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    for name in ("lite", "gemm")[:1 + gemm_path]:
        np.testing.assert_allclose(variants[name](*args).numpy(), expected, rtol=1e-3,
                                   atol=1e-4 * scale)
    return compare({k: (lambda f=f: f(*args).numpy()) for k, f in variants.items()},
                   repeats=7)


def zoo_placements(names: list[str], modes: list[str]) -> None:
    """The zoo's steps (`benchmarks/zoo.py`) with each convolution placed by the default
    rule (`clustering/rules_conv_cost.py`), all of them on TF's kernels, and all compiled
    (`compile_convolutions`), against tf.function, interleaved: the rule's check on
    whole models, where cluster boundaries and fusions count too."""
    import importlib

    from benchmarks import zoo
    from tfxla_lite.flags import get_options, set_options

    # The module (the package's `mark` is its function of that name).
    mark_module = importlib.import_module("tfxla_lite.clustering.mark")

    rule = mark_module.tf_kernel_faster
    for step in zoo.zoo(names, quick=False):
        if step.mode not in modes:
            continue
        make = step.prepare()
        variants = {"tf": make("tf_function")}
        placements = {"rule": (rule, False), "on_tf": (lambda op: True, False),
                      "all": (rule, True)}
        before = get_options()
        for name, (choice, every) in placements.items():
            mark_module.tf_kernel_faster = choice
            set_options(compile_convolutions=every)
            try:
                variants[name] = make("lite")
                variants[name].call()  # traces and compiles under this placement
                tl.wait_for_compiles()
            finally:
                mark_module.tf_kernel_faster = rule
                set_options(compile_convolutions=before.compile_convolutions)
        seconds = compare({k: v.call for k, v in variants.items()}, repeats=5)
        print(f"{step.model} {step.mode}: load {os.getloadavg()[0]:.1f}; speed-up over "
              "tf.function: " + ", ".join(f"{k} {seconds['tf'] / seconds[k]:.2f}x"
                                          for k in placements), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="small_cnn,resnet50,mobilenetv2")
    parser.add_argument("--directions", default=",".join(DIRECTIONS))
    parser.add_argument("--limit", type=int, default=0,
                        help="per model, only the N shapes of most FLOPs")
    parser.add_argument("--match", default="",
                        help="only shapes whose name contains this (e.g. 'dw', '1x1')")
    parser.add_argument("--xla", action="store_true", help="time TF's XLA too")
    parser.add_argument("--gemm-path", action="store_true", help="time tfxla-lite with "
                        "the direct register blocks off too (patches and library GEMMs)")
    parser.add_argument("--placed", choices=("tf", "lite"), default=None,
                        help="only the shapes and directions the default rule leaves on "
                             "TF's kernel (tf) or compiles (lite)")
    parser.add_argument("--zoo", default="", help="instead: these zoo models' steps with "
                        "convolutions placed by the rule, all on TF, all compiled")
    parser.add_argument("--steps", default="train,infer", help="with --zoo")
    args = parser.parse_args()
    print(f"load {open('/proc/loadavg').read().strip()}")
    if args.zoo:
        zoo_placements(args.zoo.split(","), args.steps.split(","))
        return
    for model in args.models.split(","):
        shapes = model_shapes(model)
        chosen = sorted((s for s in shapes if args.match in str(s)),
                        key=lambda s: -s.flops * shapes[s])
        if args.limit:
            chosen = chosen[:args.limit]
        for direction in args.directions.split(","):
            totals: Counter[str] = Counter()
            measured = 0
            for shape in chosen:
                if args.placed and on_tf(shape, direction) != (args.placed == "tf"):
                    continue
                seconds = measure(shape, direction, args.xla, args.gemm_path)
                measured += 1
                for k, s in seconds.items():
                    totals[k] += s * shapes[shape]
                extra = "".join(f", {k}/tf {seconds['tf'] / seconds[k]:.2f}"
                                for k in ("gemm", "xla") if k in seconds)
                print(f"{model} {direction:7} {shape} x{shapes[shape]}: "
                      f"{shape.flops / seconds['tf'] / 1e9:.1f} GFLOP/s tf, "
                      f"lite/tf {seconds['tf'] / seconds['lite']:.2f}{extra}", flush=True)
            if not measured:
                continue
            extra = "".join(f", {k}/tf {totals['tf'] / totals[k]:.2f}"
                            for k in ("gemm", "xla") if k in totals)
            print(f"{model} {direction} total ({measured} shapes): lite/tf "
                  f"{totals['tf'] / totals['lite']:.2f}{extra}; load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
