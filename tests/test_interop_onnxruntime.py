"""DLPack interchange with ONNX Runtime on the CPU (OrtValue.from_dlpack, OrtValue.__dlpack__).

ONNX Runtime's pybind11 ``OrtValue`` (``OrtValue._ortvalue``) offers ``__dlpack__(self, stream=None)``
with no keyword for ``max_version``: tensorbridge falls back to a legacy capsule for it, through
``from_dlpack`` and ``asarray`` alike. ``ortvalue_from_numpy`` wraps the array's memory, so the
memory of every OrtValue here is a NumPy array's, writable.
"""

from __future__ import annotations

import gc
import weakref

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")
ort = pytest.importorskip("onnxruntime")

# Every dtype ONNX Runtime and tensorbridge share through DLPack (NumPy's names in both).
ORT_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]
# OrtValue.data_type() names.
ORT_TYPE_NAMES = {"float32": "tensor(float)", "float64": "tensor(double)"}


def np_sample(name, n=8):
    """A NumPy array of ``name`` whose bytes are 1, 2, 3, ... (bool: alternating)."""
    if name == "bool":
        return np.array([False, True] * (n // 2))
    return np.arange(1, n * np.dtype(name).itemsize + 1, dtype=np.uint8).view(name)


def tb_bytes(t):
    return bytes(t.contiguous().as_memoryview())


@pytest.mark.parametrize("name", ORT_DTYPES)
def test_every_dtype_from_onnxruntime(name):
    """The pybind11 OrtValue and its wrapper import with their bytes, over the same memory."""
    a = np_sample(name)
    value = ort.OrtValue.ortvalue_from_numpy(a)
    for producer in (value._ortvalue, value):
        for convert in (tb.from_dlpack, tb.asarray):
            t = convert(producer)
            assert t.dtype is getattr(tb, name)
            assert tb_bytes(t) == a.tobytes()
            assert t.data_ptr() == value.data_ptr() == a.ctypes.data
            assert not t.is_readonly


@pytest.mark.parametrize("name", ORT_DTYPES)
def test_every_dtype_to_onnxruntime(name):
    """OrtValue.from_dlpack takes a tensor (or its capsule) over tensorbridge's memory."""
    a = np_sample(name)
    owned = tb.frombuffer(bytearray(a.tobytes()), dtype=getattr(tb, name)).clone()
    for producer in (owned, owned.__dlpack__()):
        value = ort.OrtValue.from_dlpack(producer)
        assert value.data_type() == ORT_TYPE_NAMES.get(name, f"tensor({name})")
        assert value.data_ptr() == owned.data_ptr()
        assert value.numpy().tobytes() == a.tobytes()


def test_shapes_and_strides_from_onnxruntime():
    """OrtValues of every rank import with their shape and row-major strides."""
    for shape in [(), (0,), (5,), (2, 3), (2, 3, 4)]:
        a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        t = tb.from_dlpack(ort.OrtValue.ortvalue_from_numpy(a)._ortvalue)
        assert t.shape == shape
        if a.size:
            assert t.stride() == tuple(s // 4 for s in a.strides)
        assert t.tolist() == a.tolist()


def test_shapes_to_onnxruntime():
    """Tensors of every rank reach ONNX Runtime with their shape and values."""
    for shape in [(), (5,), (2, 3), (2, 3, 4)]:
        t = tb.arange(int(np.prod(shape)), dtype=tb.float32).reshape(shape)
        value = ort.OrtValue.from_dlpack(t)
        assert tuple(value.shape()) == shape
        assert value.numpy().tolist() == t.tolist()


def test_writes_seen_both_ways():
    """Memory is shared both ways: a write on one side is read on the other."""
    a = np.arange(6, dtype=np.float32)
    t = tb.from_dlpack(ort.OrtValue.ortvalue_from_numpy(a)._ortvalue)
    t[0] = 42.0
    assert a[0] == 42.0
    owned = tb.arange(6, dtype=tb.float32)
    value = ort.OrtValue.from_dlpack(owned)
    owned[1] = -1.0
    assert value.numpy()[1] == -1.0


def test_memory_lives_while_the_tensor_does():
    """A tensor imported from an OrtValue keeps its memory after the OrtValue and array are gone."""
    a = np.arange(64, dtype=np.float32)
    alive = weakref.ref(a)
    value = ort.OrtValue.ortvalue_from_numpy(a)
    t = tb.from_dlpack(value._ortvalue)
    del a, value
    gc.collect()
    assert t.tolist()[63] == 63.0
    del t
    gc.collect()
    assert alive() is None


def test_onnxruntime_public_ortvalue_has_no_to_dlpack():
    """ONNX Runtime's CPU build exports only through __dlpack__: the public OrtValue has no
    to_dlpack (ONNX Runtime's own surface, not a tensorbridge refusal)."""
    assert not hasattr(ort.OrtValue, "to_dlpack")
    assert hasattr(ort.OrtValue, "__dlpack__")
