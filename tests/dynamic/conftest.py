"""Fixtures for clusters with unknown dimensions: build a program from a concrete
function traced with None dims, in dynamic mode, with the verifier after every pass."""

from __future__ import annotations

import pytest

from tfxla_lite.driver import build_program
from tfxla_lite.options import Options
from tfxla_lite.program import Program
from tfxla_lite.runtime import loader


@pytest.fixture
def build():  # noqa: ANN201
    """build(concrete, jit_compile=None, **kwargs) -> Program in dynamic mode; its keys
    are unregistered when the test ends."""
    programs: list[Program] = []

    def _build(concrete, jit_compile=None, min_cluster_size=1, **kwargs) -> Program:  # noqa: ANN001
        options = Options(min_cluster_size=min_cluster_size, verify=True)
        program = build_program(concrete, jit_compile, options, dynamic=True, **kwargs)
        programs.append(program)
        return program

    yield _build
    for program in programs:
        for dynamic_cluster in program.dynamic_clusters:
            loader.unregister(dynamic_cluster.key)


@pytest.fixture
def stats():  # noqa: ANN201
    """stats(program) -> the launch op's DynamicStats of each of its dynamic clusters."""

    def _stats(program: Program) -> list[loader.DynamicStats]:
        return [loader.dynamic_stats(d.key) for d in program.dynamic_clusters]

    return _stats
