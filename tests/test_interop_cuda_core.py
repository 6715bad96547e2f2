"""Interchange with cuda.core's StridedMemoryView on the CPU (``StridedMemoryView.from_dlpack``
with ``stream_ptr=-1``: no stream, host memory).

cuda.core views memory without owning it: a view of a tensor is the tensor's memory, with its
strides in elements and its read-only flag (from the versioned capsule's READ_ONLY flag). Nothing
here touches the CUDA driver: without a GPU, cuda.core loads it only for device memory and for
``from_array_interface``.
"""

from __future__ import annotations

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")
# cuda.core needs cuda.bindings (cuda-bindings, or cuda-core's cu12/cu13 extras): without it,
# importing cuda.core raises ImportError (not ModuleNotFoundError), and cuda.core counts as absent.
pytest.importorskip("cuda.core", exc_type=ImportError)
StridedMemoryView = pytest.importorskip("cuda.core.utils", exc_type=ImportError).StridedMemoryView

# Every dtype cuda.core's view reads as a NumPy dtype, the same names in tensorbridge (it refuses
# bfloat16 and float8 itself).
VIEW_DTYPES = [
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
    "complex64",
    "complex128",
]


def view_of(obj):
    return StridedMemoryView.from_dlpack(obj, stream_ptr=-1)


def owned_sample(name, n=8):
    """A tensorbridge tensor of ``name`` whose bytes are 1, 2, 3, ... (bool: alternating)."""
    dtype = getattr(tb, name)
    if name == "bool":
        return tb.tensor([False, True] * (n // 2))
    return tb.frombuffer(bytearray(range(1, n * dtype.itemsize + 1)), dtype=dtype).clone()


def tb_bytes(t):
    return bytes(t.contiguous().as_memoryview())


@pytest.mark.parametrize("name", VIEW_DTYPES)
def test_every_dtype_both_ways(name):
    """Every shared dtype crosses both ways over one memory, with its bytes."""
    owned = owned_sample(name)
    v = view_of(owned)
    assert v.dtype == np.dtype(name)
    assert v.ptr == owned.data_ptr()
    assert not v.readonly and not v.is_device_accessible
    for convert in (tb.from_dlpack, tb.asarray):
        t = convert(v)
        assert t.dtype is getattr(tb, name)
        assert t.data_ptr() == v.ptr
        assert tb_bytes(t) == tb_bytes(owned)


def test_strides_both_ways():
    """Views keep their shape and strides (in elements) both ways."""
    s = tb.arange(12, dtype=tb.float32).reshape(3, 4)
    for view in (s, s[:, ::2], s.T, s[1:]):
        v = view_of(view)
        assert v.shape == tuple(view.shape)
        assert v.strides == view.stride()
        assert v.ptr == view.data_ptr()
        t = tb.from_dlpack(v)
        assert t.shape == view.shape and t.stride() == view.stride()
        assert t.data_ptr() == view.data_ptr() and t.tolist() == view.tolist()


def test_numpy_through_cuda_core():
    """A view of a NumPy array imports over NumPy's memory; a write is seen by NumPy."""
    a = np.zeros((2, 3), dtype=np.float32)
    t = tb.from_dlpack(view_of(a))
    assert t.data_ptr() == a.ctypes.data and t.shape == (2, 3)
    t[1, 2] = 5.0
    assert a[1, 2] == 5.0


def test_read_only_crosses_both_ways():
    """A read-only tensor gives a read-only view; a view of read-only memory imports read-only."""
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    t = tb.asarray(a)
    assert t.is_readonly
    v = view_of(t)
    assert v.readonly
    back = tb.from_dlpack(v)
    assert back.is_readonly and back.data_ptr() == a.ctypes.data
    with pytest.raises(ValueError, match="read-only"):
        back[0] = 1.0
