"""DLPack interchange with array-api-strict, the Array API standard's reference namespace
(``xp.from_dlpack``, ``Array.__dlpack__`` with the standard's ``max_version``, ``device`` and
``copy`` keywords).

array-api-strict wraps NumPy arrays: an Array's memory is a NumPy array's, writable. Its
addresses are read through ``np.from_dlpack`` (the namespace has no pointer of its own).
"""

from __future__ import annotations

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")
xp = pytest.importorskip("array_api_strict")

# Every dtype of the standard (which has no float16 or bfloat16), the same names in tensorbridge.
STANDARD_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def address(x):
    return np.from_dlpack(x).__array_interface__["data"][0]


def owned_sample(name, n=8):
    """A tensorbridge tensor of ``name`` whose bytes are 1, 2, 3, ... (bool: alternating)."""
    dtype = getattr(tb, name)
    if name == "bool":
        return tb.tensor([False, True] * (n // 2))
    return tb.frombuffer(bytearray(range(1, n * dtype.itemsize + 1)), dtype=dtype).clone()


def tb_bytes(t):
    return bytes(t.contiguous().as_memoryview())


@pytest.mark.parametrize("name", STANDARD_DTYPES)
def test_every_dtype_both_ways(name):
    """Every standard dtype crosses both ways with its bytes and without a copy."""
    owned = owned_sample(name)
    x = xp.from_dlpack(owned)
    assert x.dtype == getattr(xp, name)
    assert address(x) == owned.data_ptr()
    y = xp.asarray(x, copy=True)  # the namespace's own memory
    for convert in (tb.from_dlpack, tb.asarray):
        t = convert(y)
        assert t.dtype is getattr(tb, name)
        assert t.data_ptr() == address(y)
        assert tb_bytes(t) == tb_bytes(owned)
        assert not t.is_readonly


def test_shapes_and_strides_both_ways():
    """Arrays of every rank import with their shape and strides; views go out with theirs."""
    for shape in [(), (0,), (5,), (2, 3), (2, 3, 4)]:
        x = xp.reshape(xp.arange(int(np.prod(shape)), dtype=xp.float32), shape)
        t = tb.from_dlpack(x)
        assert t.shape == shape
        assert t.tolist() == np.from_dlpack(x).tolist()
    s = tb.arange(12, dtype=tb.float32).reshape(3, 4)
    for view in (s[:, ::2], s.T, s[1:]):
        y = xp.from_dlpack(view)
        a = np.from_dlpack(y)
        assert a.shape == tuple(view.shape)
        assert a.strides == tuple(4 * k for k in view.stride())
        assert address(y) == view.data_ptr()
        assert a.tolist() == view.tolist()
        t = tb.from_dlpack(y)
        assert t.stride() == view.stride() and t.data_ptr() == view.data_ptr()


def test_writes_seen_both_ways():
    """Memory is shared both ways: a write on either side is seen on the other."""
    s = tb.arange(6, dtype=tb.float32)
    x = xp.from_dlpack(s)
    s[0] = 42.0
    assert float(x[0]) == 42.0
    x[1] = -1.0
    assert s.tolist()[1] == -1.0


def test_standard_copy_and_device_keywords():
    """The standard's copy and device keywords work both ways: copy=True copies, copy=False and
    the CPU device share."""
    s = tb.arange(6, dtype=tb.float32)
    assert address(xp.from_dlpack(s, copy=False)) == s.data_ptr()
    copied = xp.from_dlpack(s, copy=True)
    assert address(copied) != s.data_ptr()
    assert np.from_dlpack(copied).tolist() == s.tolist()
    assert address(xp.from_dlpack(s, device=xp.asarray(0).device)) == s.data_ptr()
    x = xp.arange(6, dtype=xp.float32)
    assert tb.from_dlpack(x, copy=False).data_ptr() == address(x)
    c = tb.from_dlpack(x, copy=True)
    assert c.data_ptr() != address(x) and c.tolist() == np.from_dlpack(x).tolist()
    assert tb.from_dlpack(x, device="cpu").data_ptr() == address(x)


def test_namespace_dtypes_as_arguments():
    """dtype arguments take the namespace's dtypes (tb.zeros(2, dtype=xp.float32))."""
    for name in STANDARD_DTYPES:
        assert tb.zeros(2, dtype=getattr(xp, name)).dtype is getattr(tb, name)
