"""DLPack interchange with TensorFlow on the CPU (tf.experimental.dlpack, tf.Tensor.__dlpack__).

TensorFlow and PaddlePaddle crash when both are imported into one process (Paddle after
TensorFlow), and pytest-xdist workers run many test files each: no pytest process imports
TensorFlow. Every check runs in one child interpreter (one TensorFlow import for the file), which
prints one JSON line of results that the tests read; the tests skip when TensorFlow is not
installed, found without importing it.

TensorFlow's eager tensors are immutable, as JAX's arrays are: a tensor imported from TensorFlow is
read-only in tensorbridge (``copy=True`` gives a writable copy). What TensorFlow itself refuses
(non-contiguous strides, float8) is asserted as TensorFlow's behaviour.
"""

from __future__ import annotations

import importlib.util

import pytest
from tests.conftest import run_in_subprocess, run_script_for_result

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed"
    ),
]

# TensorFlow's C++ logging (oneDNN, CPU features) off: the child's stderr is kept for failures.
_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}

_CHECKS = r'''
import json, traceback
import numpy as np
import ml_dtypes
import tensorflow as tf
import tensorbridge as tb

CHECKS = {}


def check(f):
    CHECKS[f.__name__] = f
    return f


# Every dtype TensorFlow and tensorbridge share through DLPack (same names in both).
SHARED = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]


def np_sample(name, n=8):
    """A NumPy array of ``name`` whose bytes are 1, 2, 3, ... (bool: alternating)."""
    if name == "bool":
        return np.array([False, True] * (n // 2))
    dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    return np.arange(1, n * dtype.itemsize + 1, dtype=np.uint8).view(dtype)


def tb_bytes(t):
    return bytes(t.contiguous().as_memoryview())


def address(x):
    """Where a TensorFlow CPU tensor's memory is: np.asarray shares it (EagerTensor.__array__)."""
    return np.asarray(x).__array_interface__["data"][0]


@check
def every_dtype_from_tensorflow():
    for name in SHARED:
        a = np_sample(name)
        x = tf.constant(a)
        for convert in (tb.from_dlpack, tb.asarray):
            t = convert(x)
            assert t.dtype is getattr(tb, name), (name, t.dtype)
            assert tb_bytes(t) == a.tobytes(), name
            assert t.data_ptr() == address(x), name
            assert t.is_readonly, name


@check
def every_dtype_to_tensorflow():
    for name in SHARED:
        a = np_sample(name)
        owned = tb.frombuffer(bytearray(a.tobytes()), dtype=getattr(tb, name)).clone()
        y = tf.experimental.dlpack.from_dlpack(owned.__dlpack__())
        assert y.dtype.name == name, (name, y.dtype)
        assert np.asarray(y).tobytes() == a.tobytes(), name
        assert address(y) == owned.data_ptr(), name


@check
def shapes_and_strides_from_tensorflow():
    for shape in [(), (0,), (5,), (2, 3), (2, 3, 4), (1,) * 8]:
        a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        x = tf.constant(a)
        t = tb.from_dlpack(x)
        assert t.shape == shape, shape
        if a.size:  # an empty tensor's strides address nothing: any are right
            assert t.stride() == tuple(s // 4 for s in a.strides), (shape, t.stride())
        assert t.tolist() == a.tolist(), shape


@check
def shapes_to_tensorflow():
    for shape in [(), (0,), (5,), (2, 3), (2, 3, 4)]:
        t = tb.arange(max(1, int(np.prod(shape))), dtype=tb.int32)[: int(np.prod(shape))]
        t = t.reshape(shape)
        y = tf.experimental.dlpack.from_dlpack(t.__dlpack__())
        assert tuple(y.shape) == shape, shape
        assert y.numpy().tolist() == t.tolist(), shape


@check
def write_in_tensorbridge_seen_by_tensorflow():
    t = tb.arange(6, dtype=tb.float32)
    y = tf.experimental.dlpack.from_dlpack(t.__dlpack__())
    t[0] = 42.0
    assert float(y[0]) == 42.0


@check
def tensorflow_tensor_is_read_only():
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    t = tb.from_dlpack(x)
    assert t.is_readonly
    try:
        t[0, 0] = 5.0
    except ValueError:
        pass
    else:
        raise AssertionError("a write to a TensorFlow tensor's memory was accepted")
    assert not t.numpy().flags.writeable
    assert x.numpy()[0, 0] == 0.0
    c = tb.from_dlpack(x, copy=True)
    assert not c.is_readonly and c.data_ptr() != address(x)
    c[0, 0] = 5.0
    assert x.numpy()[0, 0] == 0.0 and c.tolist()[0] == [5.0, 1.0, 2.0]
    d = tb.asarray(x, copy=True)
    assert not d.is_readonly and d.data_ptr() != address(x)


@check
def variable_through_array():
    v = tf.Variable(np.arange(4, dtype=np.float32))
    t = tb.asarray(v)
    assert t.dtype is tb.float32 and t.tolist() == [0.0, 1.0, 2.0, 3.0]
    # Variable.__array__ returns a new array (self.numpy(), a copy) each time: asarray copies,
    # and copy=False is refused.
    assert not t.is_readonly
    t[0] = 9.0
    assert float(v[0]) == 0.0
    try:
        tb.asarray(v, copy=False)
    except ValueError:
        pass
    else:
        raise AssertionError("asarray(tf.Variable, copy=False) did not refuse the copy")


@check
def tensorflow_dtypes_as_arguments():
    for tf_dtype, expected in [(tf.float32, tb.float32), (tf.int64, tb.int64),
                               (tf.bool, tb.bool), (tf.bfloat16, tb.bfloat16),
                               (tf.complex128, tb.complex128)]:
        t = tb.zeros(2, dtype=tf_dtype)
        assert t.dtype is expected, (tf_dtype, t.dtype)
        assert tb.full((2,), 1, dtype=tf_dtype).dtype is expected


@check
def tensorflow_refuses_strides_and_float8():
    # TensorFlow's own refusals (tensorflow/c/eager/dlpack.cc): it takes only row-major
    # strides, and has no DLPack float8 (kDLFloat8_* type codes).
    try:
        tf.experimental.dlpack.from_dlpack(tb.arange(6, dtype=tb.float32)[::2].__dlpack__())
    except tf.errors.InvalidArgumentError as exc:
        assert "strides" in str(exc), exc
    else:
        raise AssertionError("TensorFlow took a strided tensor")
    try:
        tf.experimental.dlpack.from_dlpack(tb.zeros(2, dtype=tb.float8_e4m3fn).__dlpack__())
    except tf.errors.InvalidArgumentError as exc:
        assert "Type Code" in str(exc), exc
    else:
        raise AssertionError("TensorFlow took float8")
    # A copy with row-major strides goes.
    y = tf.experimental.dlpack.from_dlpack(tb.arange(6, dtype=tb.float32)[::2].contiguous().__dlpack__())
    assert y.numpy().tolist() == [0.0, 2.0, 4.0]


results = {}
for name, f in CHECKS.items():
    try:
        f()
        results[name] = "ok"
    except BaseException as exc:
        results[name] = "".join(traceback.format_exception(exc)[-3:]).strip()
print("RESULT " + json.dumps(results))
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every check of this file, run once in a child interpreter that imports TensorFlow."""
    return run_script_for_result(_CHECKS, tmp_path_factory.mktemp("tensorflow"), env=_ENV)[1]


def _passed(results, name):
    assert results[name] == "ok", results[name]


def test_every_dtype_from_tensorflow(results):
    """Every shared dtype imports from TensorFlow with its bytes, without a copy, read-only."""
    _passed(results, "every_dtype_from_tensorflow")


def test_every_dtype_to_tensorflow(results):
    """Every shared dtype reaches TensorFlow with its bytes, over tensorbridge's own memory."""
    _passed(results, "every_dtype_to_tensorflow")


def test_shapes_and_strides_from_tensorflow(results):
    """TensorFlow tensors of every rank import with their shape and row-major strides."""
    _passed(results, "shapes_and_strides_from_tensorflow")


def test_shapes_to_tensorflow(results):
    """Tensors of every rank, empty and 0-d too, reach TensorFlow with their shape and values."""
    _passed(results, "shapes_to_tensorflow")


def test_write_in_tensorbridge_seen_by_tensorflow(results):
    """TensorFlow shares an exported tensor's memory: a write in tensorbridge is seen there."""
    _passed(results, "write_in_tensorbridge_seen_by_tensorflow")


def test_tensorflow_tensor_is_read_only(results):
    """A TensorFlow tensor imports read-only (a write raises ValueError, numpy() is read-only);
    copy=True gives a writable copy."""
    _passed(results, "tensorflow_tensor_is_read_only")


def test_variable_through_array(results):
    """asarray takes a tf.Variable through __array__: a copy, and copy=False is refused."""
    _passed(results, "variable_through_array")


def test_tensorflow_dtypes_as_arguments(results):
    """dtype arguments take TensorFlow's dtypes (tb.zeros(2, dtype=tf.float32))."""
    _passed(results, "tensorflow_dtypes_as_arguments")


def test_tensorflow_refuses_strides_and_float8(results):
    """TensorFlow's own refusals of non-contiguous strides and float8 reach the caller cleanly."""
    _passed(results, "tensorflow_refuses_strides_and_float8")


def test_tensorflow_string_tensor_aborts_the_consumer():
    """TensorFlow's DLPack export of a string tensor aborts the process whoever consumes it
    (TensorFlow's defect: it has no DLPack dtype for strings and CHECK-fails instead of raising),
    so it is tried only in a child, which dies of SIGABRT."""
    proc = run_in_subprocess(
        """
        import tensorflow as tf
        import tensorbridge as tb
        x = tf.constant(["a", "b"])
        try:
            tb.from_dlpack(x)
        except Exception as exc:
            print("REFUSED", type(exc).__name__)
        """,
        env=_ENV,
    )
    assert proc.returncode < 0 or "REFUSED" in proc.stdout, (proc.returncode, proc.stderr[-2000:])
