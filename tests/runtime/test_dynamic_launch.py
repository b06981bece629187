"""Dynamic keys of TfxlaLiteLaunch on hand-written kernels: one compile callback per new
input signature (shapes, and values of value-keyed inputs), cached; refusals, errors and
the megamorphic stop; TfxlaLiteCompile; callbacks from TF's own threads."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

from tfxla_lite.runtime import loader

_keys = itertools.count()


class AddCompiler:
    """Compiles `outputs[0] = params[0] + params[1]` for each requested shape; refuses
    the sizes in `refuse`, raises for those in `fail`, stops at `stop_after` compiles."""

    def __init__(self, kernels, refuse=(), fail=(), stop_after=None) -> None:  # noqa: ANN001
        self.kernels = kernels
        self.refuse, self.fail, self.stop_after = set(refuse), set(fail), stop_after
        self.requests: list[loader.SpecializationRequest] = []
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, request: loader.SpecializationRequest):  # noqa: ANN204
        with self.lock:
            self.requests.append(request)
            self.threads.add(threading.current_thread().name)
            size = int(np.prod(request.shapes[0]))
            if self.stop_after is not None and len(self.requests) > self.stop_after:
                return loader.Refusal(for_all_new=True)
            if size in self.refuse:
                return loader.Refusal()
            if size in self.fail:
                raise RuntimeError(f"no kernel for {size} elements")
            kernel = self.kernels.jit_compile(self.kernels.add_f32(size))
            return loader.Specialization(kernel.address, 0, (0, 1),
                                         ((tf.float32, request.shapes[0]),), owner=kernel)


@pytest.fixture
def dynamic_key(op_library):  # noqa: ANN001, ANN201
    keys: list[str] = []

    def make(compile_function, specs=((tf.float32, (None, 3)),) * 2, value_inputs=()):  # noqa: ANN001, ANN202
        key = f"test_dynamic_{next(_keys)}"
        loader.register_dynamic(key, list(specs), list(value_inputs), compile_function)
        keys.append(key)
        return key

    yield make
    for key in keys:
        loader.unregister(key)


def _pair(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, 3)).astype(np.float32),
            rng.standard_normal((rows, 3)).astype(np.float32))


def test_compiles_once_per_shape(dynamic_key, kernels) -> None:  # noqa: ANN001
    compiler = AddCompiler(kernels)
    key = dynamic_key(compiler)
    for rows in (2, 5, 2, 7, 5, 0):
        x, y = _pair(rows, rows)
        (result,) = loader.launch([x, y], key, [tf.float32], [(None, 3)])
        assert result.shape == (rows, 3)
        np.testing.assert_array_equal(result.numpy(), x + y)
    assert [r.shapes[0] for r in compiler.requests] == [(2, 3), (5, 3), (7, 3), (0, 3)]
    assert loader.dynamic_stats(key) == loader.DynamicStats(4, 0, False)


def test_rank_or_dtype_mismatch_is_invalid_argument(dynamic_key, kernels) -> None:  # noqa: ANN001
    key = dynamic_key(AddCompiler(kernels))
    x = np.ones((2, 3, 1), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 0 has shape"):
        loader.launch([x, x], key, [tf.float32], [None])
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 0 has shape"):
        loader.launch([np.ones((2, 4), np.float32)] * 2, key, [tf.float32], [None])
    with pytest.raises(tf.errors.InvalidArgumentError, match="dtype"):
        loader.launch([np.ones((2, 3), np.int32)] * 2, key, [tf.float32], [None])


def test_refusal_and_failure(dynamic_key, kernels) -> None:  # noqa: ANN001
    compiler = AddCompiler(kernels, refuse={3}, fail={9})
    key = dynamic_key(compiler)
    x2, x1, x3 = (np.ones((rows, 3), np.float32) for rows in (2, 1, 3))
    assert bool(loader.compiled_for([x2, x2], key))
    assert not bool(loader.compiled_for([x1, x1], key))
    with pytest.raises(tf.errors.InvalidArgumentError, match="refused them"):
        loader.launch([x1, x1], key, [tf.float32], [(None, 3)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="no kernel for 9 elements"):
        loader.compiled_for([x3, x3], key)
    # A refusal is cached; a failure is asked again.
    with pytest.raises(tf.errors.InvalidArgumentError, match="no kernel for 9 elements"):
        loader.launch([x3, x3], key, [tf.float32], [(None, 3)])
    sizes = [int(np.prod(r.shapes[0])) for r in compiler.requests]
    assert sizes == [6, 3, 9, 9]
    assert loader.dynamic_stats(key) == loader.DynamicStats(1, 1, False)


def test_refuse_all_stops_asking(dynamic_key, kernels) -> None:  # noqa: ANN001
    compiler = AddCompiler(kernels, stop_after=2)
    key = dynamic_key(compiler)
    results = [bool(loader.compiled_for([np.ones((rows, 3), np.float32)] * 2, key))
               for rows in (1, 2, 3, 4, 5, 1, 2)]
    assert results == [True, True, False, False, False, True, True]
    assert len(compiler.requests) == 3  # the third signature stopped the cluster
    assert loader.dynamic_stats(key) == loader.DynamicStats(2, 1, True)


def test_value_keyed_inputs_and_params(dynamic_key, kernels) -> None:  # noqa: ANN001
    """Input 1 is value-keyed and not a param: its value selects the kernel."""
    requests = []

    def compile_function(request):  # noqa: ANN001, ANN202
        requests.append(request)
        (count,) = request.values[1].tolist()
        kernel = kernels.jit_compile(kernels.sub_i32(count))
        # entry gets (input 0, input 0): x - x == 0, from the params chosen here.
        return loader.Specialization(kernel.address, 0, (0, 0), ((tf.int32, (count,)),),
                                     owner=kernel)

    key = dynamic_key(compile_function, specs=[(tf.int32, (None,)), (tf.int32, (1,))],
                      value_inputs=[1])
    x = np.arange(5, dtype=np.int32)
    for count in (5, 5, 4):
        (result,) = loader.launch([x, np.array([count], np.int32)], key, [tf.int32], [(None,)])
        np.testing.assert_array_equal(result.numpy(), np.zeros(count, np.int32))
    assert [r.values[1].tolist() for r in requests] == [[5], [4]]


def test_graph_mode_threads(dynamic_key, kernels) -> None:  # noqa: ANN001
    """Callbacks come from TF's threads while Python threads wait in TF: no deadlock.
    Two launches may ask for one new signature at once (the compile function dedupes)."""
    compiler = AddCompiler(kernels)
    key = dynamic_key(compiler)

    @tf.function(input_signature=[tf.TensorSpec([None, 3])] * 2)
    def double_sum(x, y):  # noqa: ANN001, ANN202
        (summed,) = loader.launch([x, y], key, [tf.float32], [(None, 3)])
        return summed * 2.0

    def run(rows: int) -> bool:
        x, y = _pair(rows, rows)
        return np.allclose(double_sum(x, y).numpy(), 2 * (x + y))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(run, [1, 2, 3, 4, 5, 6] * 4))
    assert {r.shapes[0][0] for r in compiler.requests} == {1, 2, 3, 4, 5, 6}
    assert loader.dynamic_stats(key).compiled == 6


def test_unregister_removes_dynamic_key(op_library, kernels) -> None:  # noqa: ANN001
    key = f"test_dynamic_{next(_keys)}"
    before = loader.registry_size()
    loader.register_dynamic(key, [(tf.float32, (None, 3))] * 2, [], AddCompiler(kernels))
    assert loader.registry_size() == before + 1
    assert loader.unregister(key)
    assert loader.dynamic_stats(key) is None
    with pytest.raises(tf.errors.NotFoundError):
        loader.launch([np.ones((1, 3), np.float32)] * 2, key, [tf.float32], [(None, 3)])


def test_unknown_rank_is_rejected(op_library) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="unknown rank"):
        loader.register_dynamic("test_dynamic_bad", [(tf.float32, None)], [], lambda r: None)
