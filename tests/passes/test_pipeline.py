"""The pipeline: parsing, the default list, verification after each pass."""

from __future__ import annotations

import numpy as np
import pytest
from hlo_builders import count, flatten, random_arguments, reduce_sum_x_plus_y_times_z

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.verifier import VerificationError
from tfxla_lite.passes import DEFAULT_PIPELINE, PASSES, optimize, parse_pipeline
from tfxla_lite.passes.base import Pass


def test_registry_and_parsing() -> None:
    assert DEFAULT_PIPELINE == "dce,fuse,dce,add-output-copies"
    assert [p.name for p in parse_pipeline(DEFAULT_PIPELINE)] == [
        "dce", "fuse", "dce", "add-output-copies"]
    assert [p.name for p in parse_pipeline(" fuse , ")] == ["fuse"]
    assert parse_pipeline("") == []
    for name, cls in PASSES.items():
        assert cls.name == name and issubclass(cls, Pass) and cls.__doc__
        assert name == name.lower() and " " not in name and "_" not in name
    with pytest.raises(ValueError, match="unknown pass 'cse'"):
        parse_pipeline("dce,cse")


def test_default_pipeline_on_reduce_sum() -> None:
    module = reduce_sum_x_plus_y_times_z()
    args = random_arguments(module)
    before = evaluate(module, *args)
    assert optimize(module, verify=True) is module
    assert count(module.entry, "fusion") == 1
    assert module.entry.root.opcode == "tuple"
    (after,) = flatten(evaluate(module, *args))
    np.testing.assert_allclose(after, before, rtol=1e-5)


def test_verify_names_the_pass_that_broke_the_module() -> None:
    class Breaker(Pass):
        name = "breaker"

        def run(self, module) -> bool:
            module.entry.root = None
            return True

    PASSES["breaker"] = Breaker
    try:
        with pytest.raises(VerificationError, match="after pass breaker"):
            optimize(reduce_sum_x_plus_y_times_z(), "dce,breaker", verify=True)
    finally:
        del PASSES["breaker"]
