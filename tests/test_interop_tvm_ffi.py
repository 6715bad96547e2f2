"""DLPack interchange with Apache TVM FFI on the CPU (tvm_ffi.from_dlpack, tvm_ffi.Tensor.__dlpack__).

A ``tvm_ffi.Tensor`` is a view of someone else's memory (here NumPy's or tensorbridge's), writable;
TVM FFI carries every DLPack dtype, and names all but the complex ones.
"""

from __future__ import annotations

import gc
import weakref

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")
tvm_ffi = pytest.importorskip("tvm_ffi")

# Every tensorbridge dtype TVM FFI takes (its names differ for float4 only).
TVM_DTYPES = {
    "bool": "bool",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float64": "float64",
    "float8_e3m4": "float8_e3m4",
    "float8_e4m3": "float8_e4m3",
    "float8_e4m3b11fnuz": "float8_e4m3b11fnuz",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2": "float8_e5m2",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu",
    "float4_e2m1fn_x2": "float4_e2m1fnx2",
}


def owned_sample(name, n=8):
    """A tensorbridge tensor of ``name`` whose bytes are 1, 2, 3, ... (bool: alternating)."""
    dtype = getattr(tb, name)
    if name == "bool":
        return tb.tensor([False, True] * (n // 2))
    return tb.frombuffer(bytearray(range(1, n * dtype.itemsize + 1)), dtype=dtype).clone()


def tb_bytes(t):
    return bytes(t.contiguous().as_memoryview())


@pytest.mark.parametrize("name", sorted(TVM_DTYPES))
def test_every_dtype_both_ways(name):
    """Every dtype TVM FFI takes crosses both ways with its bytes, over one memory."""
    owned = owned_sample(name)
    y = tvm_ffi.from_dlpack(owned)
    assert str(y.dtype) == TVM_DTYPES[name]
    assert y.data_ptr() == owned.data_ptr()
    assert tuple(y.shape) == tuple(owned.shape)
    for convert in (tb.from_dlpack, tb.asarray):
        t = convert(y)
        assert t.dtype is getattr(tb, name)
        assert t.data_ptr() == y.data_ptr()
        assert tb_bytes(t) == tb_bytes(owned)
        assert not t.is_readonly


def test_complex_passes_through_tvm_ffi_unnamed():
    """TVM FFI carries a complex tensor both ways, but has no name for its dtype (DLPack's
    kDLComplex): reading ``dtype`` raises TVM FFI's own ValueError."""
    t = tb.tensor([1 + 2j, 3 - 4j], dtype=tb.complex64)
    y = tvm_ffi.from_dlpack(t)
    with pytest.raises(ValueError, match="type_code=5"):
        str(y.dtype)
    back = tb.from_dlpack(y)
    assert back.dtype is tb.complex64 and back.data_ptr() == t.data_ptr()
    assert back.tolist() == [1 + 2j, 3 - 4j]


def test_tensor_made_by_tvm_ffi_from_numpy():
    """A TVM FFI tensor over a NumPy array imports with its shape, strides and address."""
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    y = tvm_ffi.from_dlpack(a)
    t = tb.from_dlpack(y)
    assert t.shape == (2, 3, 4) and t.stride() == (12, 4, 1)
    assert t.data_ptr() == y.data_ptr() == a.ctypes.data
    assert t.tolist() == a.tolist()
    v = tvm_ffi.from_dlpack(a[:, 1:, ::2])
    tv = tb.from_dlpack(v)
    assert tv.shape == (2, 2, 2) and tv.stride() == tuple(v.strides)
    assert tv.tolist() == a[:, 1:, ::2].tolist()


def test_strides_to_tvm_ffi():
    """Strided views reach TVM FFI with their strides and address; require_contiguous is TVM's."""
    s = tb.arange(12, dtype=tb.float32).reshape(3, 4)
    for view in (s[:, ::2], s.T, s[1:]):
        y = tvm_ffi.from_dlpack(view)
        assert tuple(y.shape) == tuple(view.shape)
        assert tuple(y.strides) == view.stride()
        assert y.data_ptr() == view.data_ptr()
        assert np.from_dlpack(y).tolist() == view.tolist()


def test_writes_seen_both_ways():
    """Memory is shared both ways: a write through either side is seen on the other."""
    s = tb.arange(6, dtype=tb.float32)
    y = tvm_ffi.from_dlpack(s)
    s[0] = 42.0
    assert np.from_dlpack(y)[0] == 42.0
    a = np.zeros(6, dtype=np.float32)
    t = tb.from_dlpack(tvm_ffi.from_dlpack(a))
    t[1] = -1.0
    assert a[1] == -1.0


def test_tensorbridge_memory_lives_while_tvm_holds_it():
    """A TVM FFI tensor keeps tensorbridge's memory after every tensorbridge object is gone."""
    t = tb.arange(64, dtype=tb.float32)
    alive = weakref.ref(t)
    y = tvm_ffi.from_dlpack(t)
    del t
    gc.collect()
    assert np.from_dlpack(y)[63] == 63.0
    del y
    gc.collect()
    assert alive() is None
