"""Convolution modules shared by the HLO, CPU and GPU convolution tests: one convolution
of given operands, and random ones over every attribute."""

from __future__ import annotations

import numpy as np

from tfxla_lite.hlo.attributes import Window, WindowDimension
from tfxla_lite.hlo.convolution import ConvolutionDimensions
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape


def convolution_module(lhs: Shape, rhs: Shape, window: Window, dnums: ConvolutionDimensions,
                       feature_groups: int = 1, batch_groups: int = 1) -> HloModule:
    module = HloModule("convolution")
    comp = module.new_computation("main", entry=True)
    x, w = comp.add_parameter(0, lhs), comp.add_parameter(1, rhs)
    attributes: dict = {"window": window, "dim_labels": dnums}
    if feature_groups != 1:
        attributes["feature_group_count"] = feature_groups
    if batch_groups != 1:
        attributes["batch_group_count"] = batch_groups
    comp.root = comp.create("convolution", [x, w], **attributes)
    return module


def random_case(seed: int) -> tuple[Shape, Shape, Window, ConvolutionDimensions, int, int]:
    """A random convolution: 1-3 spatial dims, any layouts, strides, dilations, padding
    (negative too), reversal, feature or batch groups."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4))
    groups = int(rng.choice([1, 2, 3]))
    batch_grouped = groups > 1 and rng.random() < 0.4
    group_inputs = int(rng.integers(1, 3))
    outputs = groups * int(rng.integers(1, 3))
    batch = int(rng.integers(1, 3)) * (groups if batch_grouped else 1)
    features = group_inputs * (1 if batch_grouped else groups)
    dims = []
    for _ in range(n):
        size = int(rng.integers(1, 4))
        dims.append(WindowDimension(
            size=size, stride=int(rng.integers(1, 3)),
            padding_low=int(rng.integers(-1, 3)), padding_high=int(rng.integers(-1, 3)),
            window_dilation=int(rng.integers(1, 3)), base_dilation=int(rng.integers(1, 3)),
            window_reversal=bool(rng.random() < 0.3)))
    window = Window(tuple(dims))
    lhs_perm, rhs_perm, out_perm = (rng.permutation(n + 2) for _ in range(3))
    dnums = ConvolutionDimensions(
        int(lhs_perm[0]), int(lhs_perm[1]), tuple(int(d) for d in lhs_perm[2:]),
        int(rhs_perm[0]), int(rhs_perm[1]), tuple(int(d) for d in rhs_perm[2:]),
        int(out_perm[0]), int(out_perm[1]), tuple(int(d) for d in out_perm[2:]))
    lhs_dims = [0] * (n + 2)
    lhs_dims[dnums.input_batch], lhs_dims[dnums.input_feature] = batch, features
    rhs_dims = [0] * (n + 2)
    rhs_dims[dnums.kernel_input_feature] = group_inputs
    rhs_dims[dnums.kernel_output_feature] = outputs
    for i, d in enumerate(dims):
        lhs_dims[dnums.input_spatial[i]] = int(rng.integers(2, 6))
        rhs_dims[dnums.kernel_spatial[i]] = d.size
    element_type = str(rng.choice(["f32", "f64", "s32", "f16"]))
    return (Shape(element_type, tuple(lhs_dims)), Shape(element_type, tuple(rhs_dims)), window,
            dnums, 1 if batch_grouped else groups, groups if batch_grouped else 1)
