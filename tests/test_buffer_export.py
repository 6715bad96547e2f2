"""Exporting host tensors: ``Tensor.as_memoryview()`` and ``Tensor.__buffer__`` (PEP 688:
``memoryview(t)`` on Python 3.12+), and ``Tensor.__array_interface__``.

Checked for every dtype and every layout of the matrix: format, shape, pointer, read-only flag, the
refusals (non-contiguous, non-host, writable request on a read-only tensor, format request for a
dtype without one), and that each export keeps the memory alive on its own.
"""

from __future__ import annotations

import gc
import hashlib
import struct
import sys
import weakref

import pytest

import tensorbridge as tb
from tensorbridge import _capi, _exports, _storage
from tensorbridge._device import Device
from tensorbridge._storage import Storage
from tensorbridge._tensor import Tensor

needs_pep688 = pytest.mark.skipif(
    sys.version_info < (3, 12), reason="memoryview(obj) calls __buffer__ from Python 3.12"
)

FORMATS = {
    tb.bool: "?",
    tb.uint8: "B",
    tb.uint16: "H",
    tb.uint32: "I",
    tb.uint64: "Q",
    tb.int8: "b",
    tb.int16: "h",
    tb.int32: "i",
    tb.int64: "q",
    tb.float16: "e",
    tb.float32: "f",
    tb.float64: "d",
    tb.complex64: "Zf",
    tb.complex128: "Zd",
}
RAW_FORMATS = {
    tb.bfloat16: "H",
    tb.complex32: "I",
    tb.float8_e4m3fn: "B",
    tb.float8_e5m2: "B",
    tb.float8_e8m0fnu: "B",
    tb.float4_e2m1fn_x2: "B",
}
CONTIGUOUS_LAYOUTS = {"c_order", "zero_d", "empty", "offset"}
FAKE_CUDA_PTR = 0x7F00_0000_0000  # never mapped on the host


def _np():
    return pytest.importorskip("numpy")


def _sample(dtype, shape=(2, 3)) -> Tensor:
    """A tensor of ``dtype`` whose bytes are 0, 1, 2, ... (valid bit patterns for every dtype)."""
    n = dtype.itemsize
    for s in shape:
        n *= s
    return tb.frombuffer(bytearray(i % 251 for i in range(n)), dtype=dtype).reshape(shape)


def _cuda_tensor() -> Tensor:
    storage = Storage(FAKE_CUDA_PTR, 16, Device("cuda", 0), False, None)
    return Tensor._new(storage, 0, (4,), (1,), tb.float32)


# -------------------------------------------------------------------------------------------------
# as_memoryview / __buffer__


@pytest.mark.parametrize("dtype", list(FORMATS), ids=lambda d: d.name)
def test_memoryview_has_the_dtype_format_and_shape(dtype):
    """Dtypes with a PEP 3118 format export with it, with the tensor's shape and bytes."""
    t = _sample(dtype)
    mv = t.as_memoryview()
    assert mv.format == FORMATS[dtype]
    assert mv.shape == (2, 3)
    assert mv.itemsize == dtype.itemsize
    assert mv.strides == (3 * dtype.itemsize, dtype.itemsize)
    assert mv.c_contiguous
    assert not mv.readonly
    assert mv.tobytes() == bytes(t._bytes("test"))


@pytest.mark.parametrize("dtype", list(FORMATS), ids=lambda d: d.name)
def test_memoryview_values_through_numpy(dtype):
    """NumPy reads the exported memoryview as the same values at the same address, every format."""
    np = _np()
    t = _sample(dtype) if dtype is not tb.bool else tb.tensor([[1, 0, 1], [0, 0, 1]], dtype=tb.bool)
    a = np.asarray(t.as_memoryview())
    assert a.dtype == np.dtype(dtype.typestr)
    assert a.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(a, np.array(t.tolist(), dtype=a.dtype))


@pytest.mark.parametrize("dtype", list(RAW_FORMATS), ids=lambda d: d.name)
def test_formatless_dtypes_export_raw_bits(dtype):
    """bfloat16, float8, float4, complex32 export their raw bits as same-size unsigned ints."""
    t = _sample(dtype)
    mv = t.as_memoryview()
    assert mv.format == RAW_FORMATS[dtype]
    assert mv.shape == (2, 3)
    assert mv.itemsize == dtype.itemsize
    raw = bytes(t._bytes("test"))
    assert mv.tolist() == [list(row) for row in struct.iter_unpack(f"={3 * mv.format}", raw)]


@pytest.mark.parametrize("dtype", list(RAW_FORMATS), ids=lambda d: d.name)
def test_formatless_dtypes_refuse_a_format_request(dtype):
    """A consumer asking for the element format (PyBUF_FORMAT) gets BufferError, not a misread."""
    with pytest.raises(BufferError, match="no format for"):
        _sample(dtype).__buffer__(_capi.PY_BUF_FULL_RO)


def test_layout_matrix(layout):
    """Contiguous layouts export their elements at data_ptr; others refuse, naming contiguous()."""
    name, t = layout
    if name in CONTIGUOUS_LAYOUTS:
        mv = t.as_memoryview()
        assert mv.shape == tuple(t.shape)
        assert mv.tobytes() == bytes(t._bytes("test"))
        if t.numel():
            np = _np()
            assert np.asarray(mv).ctypes.data == t.data_ptr()
    else:
        with pytest.raises(BufferError, match=r"contiguous\(\)"):
            t.as_memoryview()
        assert t.contiguous().as_memoryview().tobytes() == bytes(t._bytes("test"))


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3), (0, 0)])
def test_empty_shapes(shape):
    """Zero-size shapes export (memoryview.cast cannot make them): right shape, no bytes."""
    mv = tb.zeros(shape, dtype=tb.float32).as_memoryview()
    assert mv.shape == shape
    assert mv.nbytes == 0
    assert mv.format == "f"


def test_zero_d():
    """A 0-d tensor exports a 0-d memoryview."""
    mv = tb.tensor(2.5).as_memoryview()
    assert mv.shape == ()
    assert mv.tolist() == 2.5


def test_memory_is_shared_both_ways():
    """Writes through the memoryview reach the tensor, and the other way round."""
    t = tb.zeros(4, dtype=tb.int32)
    mv = t.as_memoryview()
    mv[1] = 7
    t[2] = 9
    assert t.tolist() == [0, 7, 9, 0]
    assert mv.tolist() == [0, 7, 9, 0]


def test_memoryview_keeps_memory_alive():
    """The memoryview, and anything sliced or cast from it, keeps the memory alive after del t."""
    t = tb.arange(6, dtype=tb.int64).reshape(2, 3)
    mv = t.as_memoryview()
    part = mv.cast("B").cast("q")[3:]
    del t, mv
    gc.collect()
    churn = [tb.full((6,), -1, dtype=tb.int64) for _ in range(50)]  # reuse freed blocks, if any
    assert part.tolist() == [3, 4, 5]
    del churn, part
    gc.collect()
    assert not _exports._VIEWS


def test_memoryview_in_a_reference_cycle_is_collected_safely(subprocess_run):
    """A memoryview (and a slice) caught in a garbage cycle is collected without crashing.

    CPython < 3.13 crashed in the collector when a view of a view sat in unreachable garbage.
    """
    proc = subprocess_run(
        """
        import gc, tensorbridge as tb
        from tensorbridge import _exports
        for _ in range(3):
            t = tb.arange(24, dtype=tb.int32)[7:]
            mv = t.as_memoryview()
            part = mv[1:]
            cycle = [mv, part]
            cycle.append(cycle)
            del mv, part, cycle, t
            gc.collect()
        assert not _exports._VIEWS, _exports._VIEWS
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_memoryview_of_a_bytearray_view_keeps_the_export():
    """A memoryview of a frombuffer tensor keeps the bytearray locked after the tensor is gone."""
    ba = bytearray(8)
    mv = tb.frombuffer(ba, dtype=tb.uint8).as_memoryview()
    gc.collect()
    with pytest.raises(BufferError):
        ba.append(0)
    del mv
    gc.collect()
    ba.append(0)


def test_readonly_tensor_exports_readonly():
    """A read-only tensor exports a read-only view, and a writable request is a BufferError."""
    t = tb.frombuffer(b"\x01\x02\x03\x04", dtype=tb.uint8)
    mv = t.as_memoryview()
    assert mv.readonly
    with pytest.raises(TypeError):
        mv[0] = 0
    with pytest.raises(BufferError, match="read-only"):
        t.__buffer__(_capi.PY_BUF_WRITABLE)
    assert t.__buffer__(_capi.PY_BUF_FULL_RO).readonly


def test_non_host_tensor_refused():
    """Memory that is not on the host is never exported as a buffer."""
    with pytest.raises(BufferError, match="cuda:0"):
        _cuda_tensor().as_memoryview()


@needs_pep688
def test_pep688_memoryview():
    """memoryview(t) goes through __buffer__: format, shape, shared memory, lifetime past del t."""
    t = tb.arange(6, dtype=tb.float32).reshape(2, 3)
    mv = memoryview(t)
    assert (mv.format, mv.shape) == ("f", (2, 3))
    mv[0, 1] = 10.0
    assert t[0, 1].item() == 10.0
    del t
    gc.collect()
    assert mv.tolist() == [[0.0, 10.0, 2.0], [3.0, 4.0, 5.0]]


@needs_pep688
def test_pep688_refusals():
    """memoryview(t) refuses non-contiguous and formatless tensors; byte consumers get raw bits."""
    with pytest.raises(BufferError, match=r"contiguous\(\)"):
        memoryview(tb.arange(6).reshape(2, 3).T)
    bf16 = _sample(tb.bfloat16)
    with pytest.raises(BufferError, match="no format"):
        memoryview(bf16)
    assert hashlib.sha256(bf16).digest() == hashlib.sha256(bytes(bf16._bytes("test"))).digest()
    assert bytes(tb.arange(3, dtype=tb.uint8)) == b"\x00\x01\x02"


@needs_pep688
def test_pep688_numpy_uses_the_buffer():
    """On 3.12+ NumPy takes the buffer first: complex64 arrives as complex64 ('Zf'), shared."""
    np = _np()
    t = tb.tensor([1 + 2j, 3j], dtype=tb.complex64)
    a = np.asarray(t)
    assert a.dtype == np.complex64
    assert a.ctypes.data == t.data_ptr()


@needs_pep688
def test_pep688_frombuffer_of_a_tensor():
    """On 3.12+ a tensor is itself a buffer exporter: frombuffer views its bytes and holds it."""
    t = tb.arange(4, dtype=tb.int16)
    raw = tb.frombuffer(t, dtype=tb.uint8)
    assert raw.data_ptr() == t.data_ptr()
    raw[0] = 7
    del t
    gc.collect()
    assert raw.tolist() == [7, 0, 1, 0, 2, 0, 3, 0]


def test_dunder_buffer_direct_call():
    """__buffer__ called directly returns a self-sufficient memoryview on every Python version."""
    t = tb.arange(4, dtype=tb.int16)
    mv = t.__buffer__(_capi.PY_BUF_FULL_RO)
    del t
    gc.collect()
    assert mv.tolist() == [0, 1, 2, 3]


# -------------------------------------------------------------------------------------------------
# __array_interface__


def test_array_interface_dict():
    """Version 3, native typestr, byte strides (None when contiguous), (pointer, read-only) data."""
    t = tb.arange(12, dtype=tb.int32).reshape(3, 4)
    iface = t.__array_interface__
    assert iface == {
        "version": 3,
        "shape": (3, 4),
        "typestr": "<i4",
        "data": (t.data_ptr(), False),
        "strides": None,
    }
    view = t[:, 1::2].T
    assert view.__array_interface__["strides"] == (8, 16)
    assert view.__array_interface__["data"] == (t.data_ptr() + 4, False)
    assert tb.tensor([True]).__array_interface__["typestr"] == "|b1"


def test_array_interface_layout_matrix(layout):
    """numpy.asarray shares memory with every layout of the matrix, with the same values."""
    np = _np()
    _, t = layout
    a = np.asarray(t)
    assert a.shape == tuple(t.shape)
    assert a.tolist() == t.tolist()
    if t.numel():
        assert a.__array_interface__["data"][0] == t.data_ptr()
        assert tuple(s // t.itemsize for s in a.strides) == t.stride()


@pytest.mark.parametrize(
    "dtype",
    [tb.bfloat16, tb.float8_e4m3fn, tb.complex32, tb.float4_e2m1fn_x2],
    ids=lambda d: d.name,
)
def test_array_interface_absent_for_dtypes_numpy_lacks(dtype):
    """No typestr, no interface: hasattr() is False, so NumPy tries its other protocols."""
    assert not hasattr(_sample(dtype), "__array_interface__")


def test_array_interface_absent_for_device_memory():
    """A CUDA tensor has no __array_interface__ (hasattr is False)."""
    assert not hasattr(_cuda_tensor(), "__array_interface__")


def test_numpy_keeps_the_tensor_alive():
    """The array NumPy builds holds the tensor, so the memory outlives every other name.

    Before 3.12 NumPy uses __array_interface__ and makes the tensor the array's base; from 3.12 it
    takes the buffer first, and the buffer's exporter record holds the tensor.
    """
    np = _np()
    t = tb.arange(5, dtype=tb.float64)
    alive = weakref.ref(t)
    a = np.asarray(t)
    if sys.version_info < (3, 12):
        assert a.base is t
    del t
    gc.collect()
    assert alive() is not None
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    del a
    gc.collect()
    assert alive() is None


def test_numpy_writes_reach_the_tensor():
    """numpy.asarray(t) is zero-copy both ways, and a read-only tensor gives a read-only array."""
    np = _np()
    t = tb.zeros(3, dtype=tb.int64)
    np.asarray(t)[1] = 5
    assert t.tolist() == [0, 5, 0]
    r = tb.frombuffer(b"\x00" * 8, dtype=tb.int64)
    assert not np.asarray(r).flags.writeable


# ------------------------------------------------------------------------------------------- probes
class _Refusing:
    """An exporter whose ``__buffer__`` (PEP 688) fails with the error it is given."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __buffer__(self, flags: int) -> memoryview:
        raise self.error


@needs_pep688
@pytest.mark.parametrize("error", [BufferError("no"), ValueError("no"), TypeError("no")])
def test_a_failed_buffer_request_is_no_buffer_to_a_probe(error):
    assert _capi.PyObject_CheckBuffer(_Refusing(error)) == 1  # the type implements the protocol
    assert _storage.offers_buffer(_Refusing(error)) is False


@needs_pep688
def test_a_probe_of_a_bfloat16_tensor_says_memoryview_gets_no_buffer():
    t = tb.zeros(4, dtype=tb.bfloat16)
    with pytest.raises(BufferError, match="format"):
        memoryview(t)
    assert _storage.offers_buffer(t) is False
    assert _storage.offers_buffer(t, _capi.PY_BUF_SIMPLE) is True  # the raw bytes, no format
    assert _storage.offers_buffer(tb.zeros(4, dtype=tb.float32)) is True


def test_a_probe_holds_no_export():
    data = bytearray(8)
    assert _storage.offers_buffer(data) is True
    data.extend(b"x")  # BufferError while an export is held
    assert _storage.offers_buffer(object()) is False
    assert _storage.offers_buffer(b"", _capi.PY_BUF_WRITABLE) is False  # bytes refuse writes
