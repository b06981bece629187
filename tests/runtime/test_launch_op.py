"""TfxlaLiteLaunch on hand-written kernels: numerics, eager and graph, signature errors,
empty tensors, temp alignment, zero-copy and concurrent launches."""

from __future__ import annotations

import ctypes
import gc
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

from tfxla_lite.runtime import loader

F32_4x3 = (tf.float32, (4, 3))


@pytest.fixture
def add_key(register, kernels) -> str:
    return register(kernels.add_f32(12), 0, [F32_4x3, F32_4x3], [F32_4x3])


def _operands(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((4, 3)).astype(np.float32),
        rng.standard_normal((4, 3)).astype(np.float32),
    )


def test_eager_add(add_key: str) -> None:
    x, y = _operands()
    (result,) = loader.launch([x, y], add_key, [tf.float32], [(4, 3)])
    assert result.dtype == tf.float32 and result.shape == (4, 3)
    np.testing.assert_array_equal(result.numpy(), x + y)


def test_int32_and_numpy_dtype_specs(register, kernels) -> None:
    key = register(kernels.sub_i32(5), 0, [(np.int32, (5,)), ("int32", [5])], [(np.int32, (5,))])
    x = np.arange(5, dtype=np.int32) * 7
    y = np.arange(5, dtype=np.int32)
    (result,) = loader.launch([x, y], key, [np.int32], [(5,)])
    np.testing.assert_array_equal(result.numpy(), x - y)


def test_inside_tf_function(add_key: str) -> None:
    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        (summed,) = loader.launch([x * 2.0, y], add_key, [tf.float32], [(4, 3)])
        return summed - 1.0

    x, y = _operands(1)
    np.testing.assert_allclose(step(x, y).numpy(), 2 * x + y - 1, rtol=1e-6)
    graph_def = step.get_concrete_function(x, y).graph.as_graph_def()
    launches = [node for node in graph_def.node if node.op == loader.OP_TYPE]
    assert len(launches) == 1


def test_partial_output_shape_is_inferred_and_checked(add_key: str) -> None:
    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        (summed,) = loader.launch([x, y], add_key, [tf.float32], [(None, 3)])
        assert summed.shape.as_list() == [None, 3]
        return summed

    x, y = _operands(2)
    np.testing.assert_array_equal(step(x, y).numpy(), x + y)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"output 0 is declared with shape"):
        loader.launch([x, y], add_key, [tf.float32], [(3, 4)])


def test_reimported_graph_def_runs(add_key: str) -> None:
    """The graph rewrite re-imports GraphDefs holding launch nodes."""

    @tf.function
    def original(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return loader.launch([x, y], add_key, [tf.float32], [(4, 3)], name="cluster_0")[0]

    spec = tf.TensorSpec((4, 3), tf.float32)
    concrete = original.get_concrete_function(spec, spec)
    graph_def = concrete.graph.as_graph_def(add_shapes=True)
    inputs = [t.name for t in concrete.inputs]
    output = concrete.outputs[0].name

    @tf.function(input_signature=[spec, spec])
    def reimported(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        loader.load_ops()  # the op must be registered before import
        (result,) = tf.graph_util.import_graph_def(
            graph_def, input_map={inputs[0]: x, inputs[1]: y}, return_elements=[output]
        )
        return result

    x, y = _operands(3)
    np.testing.assert_array_equal(reimported(x, y).numpy(), x + y)


def test_unused_launch_is_pruned() -> None:
    """Stateless: a launch whose result is unused never runs, even with an unknown key."""

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        loader.launch([x], "never_registered", [tf.float32], [(2,)])
        return x + 1.0

    np.testing.assert_array_equal(step(tf.zeros(2)).numpy(), [1.0, 1.0])


@pytest.mark.parametrize(
    ("x_shape", "y_dtype", "message"),
    [
        ((3, 4), tf.float32, r"input 0 has shape \[3,4\] but the executable expects \[4,3\]"),
        ((12,), tf.float32, r"input 0 has shape \[12\] but the executable expects \[4,3\]"),
        ((4, 3), tf.int32, r"input 1 has dtype int32 but the executable expects float"),
    ],
)
def test_signature_mismatch_is_invalid_argument(
    add_key: str, x_shape: tuple[int, ...], y_dtype: tf.DType, message: str
) -> None:
    x = tf.zeros(x_shape, tf.float32)
    y = tf.zeros((4, 3), y_dtype)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        loader.launch([x, y], add_key, [tf.float32], [(4, 3)])


def test_signature_mismatch_inside_tf_function(add_key: str) -> None:
    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return loader.launch([x, y], add_key, [tf.float32], [None])[0]

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"input 1 has shape \[2,6\]"):
        step(tf.zeros((4, 3)), tf.zeros((2, 6)))


def test_wrong_arity_and_output_dtype(add_key: str) -> None:
    x, y = _operands()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"got 1 inputs"):
        loader.launch([x], add_key, [tf.float32], [(4, 3)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"the node has 2 outputs"):
        loader.launch([x, y], add_key, [tf.float32] * 2, [(4, 3)] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"output 0 is declared int32"):
        loader.launch([x, y], add_key, [tf.int32], [(4, 3)])


def test_unknown_key_is_not_found(op_library) -> None:
    with pytest.raises(tf.errors.NotFoundError, match=r"no executable is registered under key"):
        loader.launch([tf.zeros(2)], "no_such_key", [tf.float32], [(2,)])


def test_empty_tensors(register, kernels) -> None:
    spec = (tf.float32, (2, 0))
    key = register(kernels.add_f32(0), 0, [spec, spec], [spec])
    (result,) = loader.launch([tf.zeros((2, 0)), tf.zeros((2, 0))], key, [tf.float32], [(2, 0)])
    assert result.shape == (2, 0)


def test_no_inputs_and_no_outputs(register, kernels) -> None:
    iota = register(kernels.iota_i32(5), 0, [], [(tf.int32, (5,))])
    (result,) = loader.launch([], iota, [tf.int32], [(5,)])
    np.testing.assert_array_equal(result.numpy(), np.arange(5))

    # Stateless with no outputs: TF may skip running it at all (eager does).
    nothing = register(kernels.empty, 0, [], [])
    assert loader.launch([], nothing, [], []) == []


@pytest.mark.parametrize("count", [1, 7, 1000])
def test_temp_arena_is_aligned_and_usable(register, kernels, count: int) -> None:
    key = register(
        kernels.triple_via_temp(count),
        4 * count,
        [(tf.float32, (count,))],
        [(tf.float32, (count,)), (tf.int64, ())],
    )
    x = np.linspace(-1, 1, count, dtype=np.float32)
    for _ in range(5):  # different arenas, each aligned
        tripled, misalignment = loader.launch([x], key, [tf.float32, tf.int64], [(count,), ()])
        np.testing.assert_allclose(tripled.numpy(), 3 * x, rtol=1e-6)
        assert int(misalignment) == 0


def test_buffers_are_zero_copy_and_aligned(register, kernels) -> None:
    """Each kernel reports [address of its input, address of its output]: the second
    launch must read the very buffer the first one wrote (numpy() of an EagerTensor
    copies in TF 2.21, so addresses are compared launch to launch)."""
    from_f32 = register(kernels.addresses, 0, [(tf.float32, (16,))], [(tf.int64, (2,))])
    from_i64 = register(kernels.addresses, 0, [(tf.int64, (2,))], [(tf.int64, (2,))])
    x = tf.random.uniform((16,))
    (first,) = loader.launch([x], from_f32, [tf.int64], [(2,)])
    (again,) = loader.launch([x], from_f32, [tf.int64], [(2,)])
    (second,) = loader.launch([first], from_i64, [tf.int64], [(2,)])
    x_address, first_output = (int(a) for a in first.numpy())
    second_input, second_output = (int(a) for a in second.numpy())
    assert int(again.numpy()[0]) == x_address, "the same input tensor, the same buffer"
    assert second_input == first_output, "an output feeds the next launch in place"
    assert len({x_address, first_output, second_output}) == 3, "outputs alias nothing"
    for address in (x_address, first_output, second_output):
        assert address % 64 == 0


def test_concurrent_launches(add_key: str) -> None:
    @tf.function
    def in_graph(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return loader.launch([x, y], add_key, [tf.float32], [(4, 3)])[0]

    def worker(seed: int) -> bool:
        x, y = _operands(seed)
        for _ in range(50):
            (eager,) = loader.launch([x, y], add_key, [tf.float32], [(4, 3)])
            if not np.array_equal(eager.numpy(), x + y):
                return False
            if not np.array_equal(in_graph(x, y).numpy(), x + y):
                return False
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(worker, range(16)))


def test_register_replace_unregister_and_owner_lifetime(op_library, kernels) -> None:
    spec = (tf.float32, (3,))
    first = kernels.jit_compile(kernels.add_f32(3))
    second = kernels.jit_compile(kernels.sub_i32(3))
    owner_ref = weakref.ref(first)
    # Earlier tests' programs unregister their keys when collected: collect them first, so
    # that only this test's keys change the count below.
    gc.collect()
    size = loader.registry_size()
    loader.register_executable("lifetime", first.address, 0, [spec, spec], [spec], owner=first)
    del first
    gc.collect()
    assert owner_ref() is not None, "the registry keeps the owner alive"
    assert loader.registry_size() == size + 1

    i32 = (tf.int32, (3,))
    loader.register_executable("lifetime", second.address, 0, [i32, i32], [i32], owner=second)
    assert loader.registry_size() == size + 1  # replaced, not added
    gc.collect()
    assert owner_ref() is None, "replacing a key releases the old owner"
    (result,) = loader.launch([[5, 5, 5], [1, 2, 3]], "lifetime", [tf.int32], [(3,)])
    np.testing.assert_array_equal(result.numpy(), [4, 3, 2])

    assert loader.unregister("lifetime") is True
    assert loader.unregister("lifetime") is False
    assert loader.registry_size() == size
    with pytest.raises(tf.errors.NotFoundError):
        loader.launch([[5, 5, 5], [1, 2, 3]], "lifetime", [tf.int32], [(3,)])


@pytest.mark.parametrize(
    ("address", "temp_bytes", "specs", "message"),
    [
        (0, 0, [(tf.float32, (2,))], "entry_address is null"),
        (1, -1, [(tf.float32, (2,))], "temp_bytes"),
        (1, 0, [(tf.float32, (None, 2))], "not static"),
        (1, 0, [(tf.float32, None)], "not static"),
    ],
)
def test_register_rejects_bad_arguments(
    op_library, address: int, temp_bytes: int, specs, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        loader.register_executable("bad", address, temp_bytes, specs, [])
    with pytest.raises(tf.errors.NotFoundError):
        loader.launch([tf.zeros(2)], "bad", [tf.float32], [(2,)])


def test_c_register_rejects_invalid_specs(op_library) -> None:
    """The C entry point validates too: ctypes callers bypass the Python checks."""

    def c_register(dtype: int, dim: int) -> int:
        return op_library.cdll.tfxla_lite_register(
            b"c_level",
            ctypes.c_void_p(1),
            0,
            1,
            (ctypes.c_int * 1)(dtype),
            (ctypes.c_int * 1)(1),
            (ctypes.c_int64 * 1)(dim),
            0,
            None,
            None,
            None,
            None,  # no forwarding
        )

    assert c_register(9999, 2) == -1  # no such DataType
    assert c_register(tf.float32.as_datatype_enum + 100, 2) == -1  # a reference type
    assert c_register(tf.float32.as_datatype_enum, -1) == -1  # negative dimension
    assert op_library.cdll.tfxla_lite_unregister(b"c_level") == 0
