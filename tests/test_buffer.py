"""frombuffer: PyTorch's validation order and messages, every kind of exporter, and the guarantees
PyTorch 2.13 lacks: the buffer export is held while any view lives,
sizes are checked without overflow, read-only buffers give read-only tensors on every way out.

Where NumPy accepts a case, values and data pointers are compared with ``numpy.frombuffer``.
"""

from __future__ import annotations

import array
import ctypes
import gc
import mmap
import pickle
import re
import sys
import warnings
from multiprocessing import shared_memory

import pytest

import tensorbridge as tb
from tensorbridge import _capi, _dlpack_abi

B8 = bytes(range(1, 9))  # b'\x01\x02...\x08'
NUMPY_DTYPES = ["uint8", "int16", "int32", "int64", "float32", "float64", "complex128", "bool"]


def _np():
    return pytest.importorskip("numpy")


def _buffer_address(obj) -> int:
    """The address of ``obj``'s buffer, as NumPy sees it."""
    np = _np()
    return np.frombuffer(obj, dtype=np.uint8).ctypes.data


def _frombuffer_b8(**kwargs):
    return tb.frombuffer(bytearray(B8), **kwargs)


# -------------------------------------------------------------------------------------------------
# The examples of torch.frombuffer's documentation


def test_documented_example_shares_memory_with_array():
    """frombuffer over array('i') shares memory: writing the tensor changes the array."""
    a = array.array("i", [1, 2, 3])
    t = tb.frombuffer(a, dtype=tb.int32)
    assert repr(t) == "tensor([1, 2, 3], dtype=tensorbridge.int32)"
    t[0] = -1
    assert a == array.array("i", [-1, 2, 3])


def test_documented_example_reinterprets_bytes():
    """Four signed chars read as one little-endian int32."""
    t = tb.frombuffer(array.array("b", [-1, 0, 0, 0]), dtype=tb.int32)
    assert repr(t) == "tensor([255], dtype=tensorbridge.int32)"


def test_byte_to_int():
    """int8 [-1, 0, 0, 0, -1, 0, 0, 0] read as int32 is [255, 255] (little-endian)."""
    t = tb.frombuffer(array.array("b", [-1, 0, 0, 0, -1, 0, 0, 0]), dtype=tb.int32)
    assert t.tolist() == [255, 255]


# -------------------------------------------------------------------------------------------------
# Argument parsing: step 1 of PyTorch's order, before the buffer is looked at


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda: tb.frombuffer(bytearray(B8)), "dtype"),
        (lambda: tb.frombuffer(bytearray(B8), tb.uint8), "positional"),
        (lambda: _frombuffer_b8(dtype=None), "argument 'dtype' must be"),
        (
            lambda: _frombuffer_b8(dtype=tb.uint8, device="cpu"),
            "unexpected keyword argument 'device'",
        ),
        (
            lambda: _frombuffer_b8(dtype=tb.uint8, count=2.0),
            re.escape("frombuffer(): argument 'count' must be int, not float"),
        ),
        (
            lambda: _frombuffer_b8(dtype=tb.uint8, offset=1.0),
            re.escape("frombuffer(): argument 'offset' must be int, not float"),
        ),
        (
            lambda: _frombuffer_b8(dtype=tb.uint8, count=True),
            re.escape("frombuffer(): argument 'count' must be int, not bool"),
        ),
        (
            lambda: _frombuffer_b8(dtype=tb.float32, requires_grad=1),
            re.escape("frombuffer(): argument 'requires_grad' must be bool, not int"),
        ),
        # Arguments come before the buffer: a list with a bad dtype is a TypeError.
        (lambda: tb.frombuffer([1], dtype=None), "argument 'dtype' must be"),
        (lambda: tb.frombuffer([1], dtype=tb.uint8, count=1.0), "argument 'count' must be int"),
    ],
)
def test_argument_type_errors(call, pattern):
    """Missing, positional, None or unknown arguments and non-int counts are TypeErrors."""
    with pytest.raises(TypeError, match=pattern):
        call()


def test_index_objects_are_ints():
    """count and offset take __index__ objects (NumPy integers), as PyTorch's parser does."""
    np = _np()
    t = _frombuffer_b8(dtype=tb.uint8, count=np.int64(2), offset=np.int32(3))
    assert t.tolist() == [4, 5]


def test_dtype_by_name():
    """dtype may be given by name, like every tensorbridge dtype= argument."""
    assert _frombuffer_b8(dtype="uint8").dtype is tb.uint8


# -------------------------------------------------------------------------------------------------
# Length checks: PyTorch's type and text, verbatim

_REQUESTED = (
    "requested buffer length ({}) after offset ({} bytes) must not be greater than "
    "actual buffer length (8 bytes)"
)

LENGTH_CASES = [
    # (buffer, kwargs, PyTorch's message)
    (bytearray(), {"dtype": tb.uint8}, "both buffer length (0) and count (-1) must not be 0"),
    (b"", {"dtype": tb.uint8}, "both buffer length (0) and count (-1) must not be 0"),
    (
        bytearray(B8),
        {"dtype": tb.uint8, "count": 0},
        "both buffer length (8) and count (0) must not be 0",
    ),
    (
        bytearray(),
        {"dtype": tb.uint8, "count": 0},
        "both buffer length (0) and count (0) must not be 0",
    ),
    (
        bytearray(B8),
        {"dtype": tb.uint8, "offset": -1},
        "offset (-1 bytes) must be non-negative and no greater than buffer length (8 bytes) minus 1",
    ),
    (
        bytearray(B8),
        {"dtype": tb.uint8, "offset": 8},
        "offset (8 bytes) must be non-negative and no greater than buffer length (8 bytes) minus 1",
    ),
    (
        bytearray(B8),
        {"dtype": tb.uint8, "offset": 9},
        "offset (9 bytes) must be non-negative and no greater than buffer length (8 bytes) minus 1",
    ),
    (
        bytearray(7),
        {"dtype": tb.int32},
        "buffer length (7 bytes) after offset (0 bytes) must be a multiple of element size (4)",
    ),
    (
        bytearray(B8),
        {"dtype": tb.int32, "offset": 1},
        "buffer length (7 bytes) after offset (1 bytes) must be a multiple of element size (4)",
    ),
    (bytearray(B8), {"dtype": tb.int32, "count": 3}, _REQUESTED.format("3 * 4 bytes", 0)),
    (
        bytearray(B8),
        {"dtype": tb.int32, "count": 2, "offset": 1},
        _REQUESTED.format("2 * 4 bytes", 1),
    ),
    (
        bytearray(B8),
        {"dtype": tb.uint8, "count": 2**62},
        _REQUESTED.format("4611686018427387904 * 1 bytes", 0),
    ),
]


@pytest.mark.parametrize(("buffer", "kwargs", "text"), LENGTH_CASES)
def test_length_errors_keep_torch_text(buffer, kwargs, text):
    """Every length error is a ValueError containing PyTorch's message verbatim."""
    with pytest.raises(ValueError, match=re.escape(text)):
        tb.frombuffer(buffer, **kwargs)


@pytest.mark.parametrize(("buffer", "kwargs", "text"), LENGTH_CASES)
def test_length_errors_match_torch(buffer, kwargs, text):
    """torch.frombuffer raises the same type, and its message is a substring of ours."""
    torch = pytest.importorskip("torch")
    torch_kwargs = {**kwargs, "dtype": getattr(torch, kwargs["dtype"].name)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's read-only warning for bytes
        with pytest.raises(ValueError) as torch_error:
            torch.frombuffer(buffer, **torch_kwargs)
    with pytest.raises(ValueError) as tb_error:
        tb.frombuffer(buffer, **kwargs)
    assert str(torch_error.value) in str(tb_error.value)


@pytest.mark.parametrize(
    ("dtype", "count"),
    [
        (tb.float32, 2**62 + 1),
        (tb.float64, 2**61 + 1),
        (tb.uint8, 2**64 + 5),
        (tb.complex128, 2**60 + 1),
    ],
)
def test_overflowing_counts_are_rejected(dtype, count):
    """A count whose byte size wraps a 64-bit size_t is refused (PyTorch 2.13 accepts it)."""
    text = f"requested buffer length ({count} * {dtype.itemsize} bytes)"
    with pytest.raises(ValueError, match=re.escape(text)):
        tb.frombuffer(bytearray(8), dtype=dtype, count=count)


def test_failed_call_releases_the_export_at_once():
    """After a length error the bytearray is resizable, while the exception (and frame) lives."""
    ba = bytearray(B8)
    with pytest.raises(ValueError) as info:
        tb.frombuffer(ba, dtype=tb.int32, count=3)
    assert info.value.__traceback__ is not None
    ba.append(0)
    assert len(ba) == 9


def test_requires_grad():
    """requires_grad makes a leaf for floating dtypes; integer dtypes get PyTorch's RuntimeError."""
    assert _frombuffer_b8(dtype=tb.float32, requires_grad=True).requires_grad
    assert _frombuffer_b8(dtype=tb.complex64, requires_grad=True).requires_grad
    ba = bytearray(8)
    text = "Only Tensors of floating point and complex dtype can require gradients"
    for dtype in (tb.int32, tb.bool, tb.uint8):
        with pytest.raises(RuntimeError, match=text):
            tb.frombuffer(ba, dtype=dtype, requires_grad=True)
    ba.append(0)  # the failed calls released their exports


# -------------------------------------------------------------------------------------------------
# Valid requests


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"dtype": tb.uint8}, list(B8)),
        ({"dtype": tb.uint8, "offset": 7}, [8]),
        ({"dtype": tb.uint8, "count": -2}, list(B8)),
        ({"dtype": tb.uint8, "count": -100, "offset": 6}, [7, 8]),
        ({"dtype": tb.int32, "count": 1, "offset": 1}, [int.from_bytes(B8[1:5], "little")]),
        ({"dtype": tb.int16, "count": 2, "offset": 3}, [0x0504, 0x0706]),
        ({"dtype": tb.int64, "count": 1}, [int.from_bytes(B8, "little")]),
    ],
)
def test_counts_and_offsets(kwargs, expected):
    """Negative counts mean "all"; any offset works; misaligned multi-byte reads are right."""
    assert sys.byteorder == "little"
    assert _frombuffer_b8(**kwargs).tolist() == expected


def test_result_layout():
    """1-D, stride (1,), storage offset 0, storage at buf + offset holding count * itemsize."""
    ba = bytearray(B8)
    t = tb.frombuffer(ba, dtype=tb.int16, count=2, offset=2)
    assert tuple(t.shape) == (2,)
    assert t.stride() == (1,)
    assert t.storage_offset() == 0
    assert t.is_contiguous()
    assert t._storage.nbytes == 4
    assert t.data_ptr() == _buffer_address(ba) + 2


def test_bool_reads_nonzero_bytes_as_true():
    """bool over bytes 00 01 02 reads [False, True, True] (no validation, as PyTorch)."""
    assert tb.frombuffer(bytearray(b"\x00\x01\x02"), dtype=tb.bool).tolist() == [False, True, True]


@pytest.mark.parametrize(
    "dtype",
    [tb.bfloat16, tb.complex64, tb.float8_e4m3fn, tb.uint16, tb.float16],
    ids=lambda d: d.name,
)
def test_raw_reinterpretation(dtype):
    """Any dtype reinterprets the bytes: the tensor's packed bytes are the buffer's bytes."""
    t = _frombuffer_b8(dtype=dtype)
    assert t.numel() == 8 // dtype.itemsize
    assert bytes(t._bytes("test")) == B8


@pytest.mark.parametrize("np_dtype", NUMPY_DTYPES)
def test_with_count_and_offset_matches_numpy(np_dtype):
    """Counts -1..5 (not 0), every aligned offset: values and pointer of np.frombuffer."""
    np = _np()
    arr = np.arange(1, 10).astype(np_dtype)
    dtype = getattr(tb, np_dtype)
    for count in (-1, 1, 2, 3, 4, 5):
        for first in range(arr.size):
            if count > 0 and first + count > arr.size:
                continue
            offset = first * arr.itemsize
            expected = np.frombuffer(memoryview(arr), dtype=arr.dtype, count=count, offset=offset)
            t = tb.frombuffer(memoryview(arr), dtype=dtype, count=count, offset=offset)
            assert t.tolist() == expected.tolist()
            assert t.data_ptr() == expected.ctypes.data


@pytest.mark.parametrize("np_dtype", NUMPY_DTYPES)
def test_invalid_positional_args(np_dtype):
    """The messages of torch's test_invalid_positional_args, by regex, per dtype."""
    np = _np()
    arr = np.arange(1, 10).astype(np_dtype)
    mv = memoryview(arr)
    dtype = getattr(tb, np_dtype)
    size, itemsize = arr.nbytes, arr.itemsize
    with pytest.raises(ValueError, match=r"both buffer length \(0\) and count"):
        tb.frombuffer(memoryview(np.array([], dtype=np_dtype)), dtype=dtype)
    with pytest.raises(ValueError, match=r"both buffer length .* and count \(0\)"):
        tb.frombuffer(mv, dtype=dtype, count=0)
    for offset in (-itemsize, size):
        pattern = rf"offset \({offset} bytes\) must be non-negative and no greater than"
        with pytest.raises(ValueError, match=pattern):
            tb.frombuffer(mv, dtype=dtype, offset=offset)
    if itemsize > 1:
        pattern = rf"buffer length \({size - 1} bytes\) after offset \(1 bytes\) must be"
        with pytest.raises(ValueError, match=pattern):
            tb.frombuffer(mv, dtype=dtype, offset=1)
    for first in range(arr.size):
        count = arr.size - first + 1
        pattern = rf"requested buffer length \({count} \* {itemsize} bytes\) after offset"
        with pytest.raises(ValueError, match=pattern):
            tb.frombuffer(mv, dtype=dtype, count=count, offset=first * itemsize)


@pytest.mark.parametrize("np_dtype", NUMPY_DTYPES)
def test_shared_buffer(np_dtype):
    """For each valid (count, offset) tensor and array see each other's writes."""
    np = _np()
    dtype = getattr(tb, np_dtype)
    for count in (-1, 1, 3):
        for first in range(5 if count < 0 else 6 - count):
            arr = np.arange(1, 6).astype(np_dtype)
            t = tb.frombuffer(arr, dtype=dtype, count=count, offset=first * arr.itemsize)
            t.fill_(0)
            assert not arr[first : first + t.numel()].any()
            arr[first] = 1
            assert t[0].item() == arr[first].item()


# -------------------------------------------------------------------------------------------------
# Exporters


def _filled_mmap():
    m = mmap.mmap(-1, 8)
    m[:] = B8
    return m


WRITABLE_EXPORTERS = {
    "bytearray": lambda: bytearray(B8),
    "memoryview": lambda: memoryview(bytearray(B8)),
    "array": lambda: array.array("B", B8),
    "mmap": _filled_mmap,
    "ctypes_array": lambda: (ctypes.c_uint8 * 8)(*B8),
    "pickle_buffer": lambda: pickle.PickleBuffer(bytearray(B8)),
}


@pytest.mark.parametrize("name", list(WRITABLE_EXPORTERS))
def test_writable_exporters_share_memory(name):
    """Each writable exporter gives a writable tensor over its own memory."""
    obj = WRITABLE_EXPORTERS[name]()
    t = tb.frombuffer(obj, dtype=tb.uint8)
    assert t.tolist() == list(B8)
    assert not t.is_readonly
    t[0] = 42
    assert memoryview(obj).cast("B")[0] == 42


def test_ctypes_structure():
    """A ctypes Structure is an exporter like any other (its format is ignored)."""

    class Pair(ctypes.Structure):
        _fields_ = (("a", ctypes.c_int32), ("b", ctypes.c_int32))

    pair = Pair(7, 9)
    t = tb.frombuffer(pair, dtype=tb.int32)
    assert t.tolist() == [7, 9]
    t[1] = -1
    assert pair.b == -1


def test_multiprocessing_shared_memory():
    """A SharedMemory block is shared, and cannot be closed while a view lives."""
    shm = shared_memory.SharedMemory(create=True, size=16)
    try:
        t = tb.frombuffer(shm.buf, dtype=tb.int32)
        t[2] = 123456
        assert int.from_bytes(bytes(shm.buf[8:12]), sys.byteorder) == 123456
        view = t[1:]
        del t
        with pytest.raises(BufferError):
            shm.close()
        del view
        gc.collect()
        shm.close()
    finally:
        shm.unlink()


def test_multidimensional_memoryview_is_flattened():
    """A 2-D C-contiguous memoryview gives all its elements, flattened (as PyTorch)."""
    mv = memoryview(bytearray(range(12))).cast("B", (3, 4))
    assert tb.frombuffer(mv, dtype=tb.uint8).tolist() == list(range(12))


def test_sliced_memoryview():
    """A contiguous slice of a memoryview starts at the slice."""
    ba = bytearray(B8)
    t = tb.frombuffer(memoryview(ba)[2:6], dtype=tb.uint8)
    assert t.tolist() == [3, 4, 5, 6]
    assert t.data_ptr() == _buffer_address(ba) + 2


@pytest.mark.parametrize(
    "make",
    [
        lambda: memoryview(bytearray(B8))[::2],
        lambda: _np().arange(8)[::2],
        lambda: _np().ones((3, 2), order="F"),
    ],
    ids=["memoryview_step", "ndarray_step", "ndarray_fortran"],
)
def test_non_contiguous_is_runtime_error_with_reason(make):
    """A strided exporter is PyTorch's RuntimeError, with the exporter's reason added."""
    with pytest.raises(RuntimeError, match="could not retrieve buffer from object") as info:
        tb.frombuffer(make(), dtype=tb.uint8)
    assert "contiguous" in str(info.value)


@pytest.mark.parametrize(
    "obj", [[1, 2], 3, "abc", None, object()], ids=["list", "int", "str", "None", "object"]
)
def test_not_a_buffer(obj):
    """Objects without the buffer protocol: PyTorch's ValueError text."""
    text = re.escape("object does not implement Python buffer protocol.")
    with pytest.raises(ValueError, match=text):
        tb.frombuffer(obj, dtype=tb.uint8)


def test_torch_tensor_is_not_a_buffer():
    """A torch tensor exports no buffer: the same ValueError."""
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="does not implement Python buffer protocol"):
        tb.frombuffer(torch.arange(4), dtype=tb.uint8)


def test_array_format_is_ignored():
    """array('d') read as int8 gives its raw bytes: the buffer format does not matter here."""
    a = array.array("d", [1.0])
    assert bytes(tb.frombuffer(a, dtype=tb.int8)._bytes("test")) == a.tobytes()


def test_numpy_arrays():
    """NumPy arrays share memory (2-D flattened); a read-only one gives a read-only tensor."""
    np = _np()
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    t = tb.frombuffer(a, dtype=tb.int32)
    assert t.tolist() == list(range(6))
    assert t.data_ptr() == a.ctypes.data
    a.flags.writeable = False
    r = tb.frombuffer(a, dtype=tb.int32)
    assert r.is_readonly
    with pytest.raises(ValueError, match="read-only"):
        r[0] = 1


# -------------------------------------------------------------------------------------------------
# Read-only buffers: read-only tensors, no warning, enforced on every path


def _readonly_ndarray():
    np = _np()
    a = np.frombuffer(bytearray(B8), dtype=np.uint8)
    a.flags.writeable = False
    return a


READONLY_EXPORTERS = {
    "bytes": lambda: B8,
    "readonly_memoryview": lambda: memoryview(bytearray(B8)).toreadonly(),
    "readonly_ndarray": _readonly_ndarray,
    "pickle_buffer_of_bytes": lambda: pickle.PickleBuffer(B8),
}


@pytest.mark.parametrize("name", list(READONLY_EXPORTERS))
def test_readonly_exporters_give_readonly_tensors_without_warning(name):
    """A read-only exporter gives a read-only tensor and no warning (PyTorch warns, then writes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = tb.frombuffer(READONLY_EXPORTERS[name](), dtype=tb.uint8)
    assert t.is_readonly
    assert t.tolist() == list(B8)


def test_non_writable_buffer():
    """bytes: read-only tensor, and writes raise instead of mutating the bytes."""
    data = bytes(B8)
    t = tb.frombuffer(data, dtype=tb.uint8)
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 0
    assert data == B8


def test_mmap_access_read(tmp_path):
    """An ACCESS_READ mmap gives a read-only tensor; the map cannot close while it lives."""
    path = tmp_path / "data.bin"
    path.write_bytes(B8)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    t = tb.frombuffer(m, dtype=tb.uint8)
    assert t.is_readonly
    assert t.tolist() == list(B8)
    with pytest.raises(BufferError):
        m.close()
    del t
    gc.collect()
    m.close()


def _versioned_flags(capsule) -> int:
    pointer = _capi.PyCapsule_GetPointer(capsule, _dlpack_abi.DLTENSOR_VERSIONED)
    return _dlpack_abi.DLManagedTensorVersioned.from_address(pointer).flags


def _needs_dlpack_export():
    try:
        tb.arange(1).__dlpack__(max_version=(1, 0))
    except NotImplementedError:
        pytest.skip("tensorbridge._dlpack is still a placeholder: no DLPack export to check")


def _writes(v):
    """Every way to write into a tensor: fill_, zero_, copy_, setitem."""
    source = v.clone()
    return [lambda: v.fill_(1), v.zero_, lambda: v.copy_(source), lambda: v.__setitem__(..., 1)]


def test_readonly_enforced_on_every_view_and_write():
    """setitem, fill_, copy_ and zero_ raise on the tensor and on every view of it."""
    t = tb.frombuffer(bytes(B8), dtype=tb.uint8)
    views = [t, t[1:], t[::2], t.view(tb.int8), t.reshape(2, 4), t.reshape(2, 4).T, t[3]]
    for v in views:
        assert v.is_readonly
        for write in _writes(v):
            with pytest.raises(ValueError, match="read-only"):
                write()
    assert t.tolist() == list(B8)


def test_readonly_enforced_on_buffer_exports():
    """The memoryview export is read-only and refuses a writable request; so says the interface."""
    t = tb.frombuffer(bytes(B8), dtype=tb.uint8)
    mv = t.as_memoryview()
    assert mv.readonly
    with pytest.raises(TypeError):
        mv[0] = 1
    with pytest.raises(BufferError, match="read-only"):
        t.__buffer__(_capi.PY_BUF_WRITABLE)
    assert t.__array_interface__["data"][1] is True


def test_readonly_enforced_in_numpy():
    """numpy.asarray of a read-only tensor is a read-only array."""
    np = _np()
    a = np.asarray(tb.frombuffer(bytes(B8), dtype=tb.uint8))
    assert not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1


def test_readonly_enforced_in_dlpack_export():
    """A versioned DLPack export of a read-only tensor has READ_ONLY; a legacy one is refused."""
    _needs_dlpack_export()
    t = tb.frombuffer(bytes(B8), dtype=tb.uint8)
    capsule = t.__dlpack__(max_version=(1, 0))
    assert _versioned_flags(capsule) & _dlpack_abi.DLPACK_FLAG_BITMASK_READ_ONLY
    with pytest.raises(BufferError):
        t.__dlpack__()
    np = _np()
    if np.lib.NumpyVersion(np.__version__) < "2.1.0":
        with pytest.raises(BufferError, match="read-only"):  # it asks for a legacy capsule
            np.from_dlpack(t)
    else:
        assert not np.from_dlpack(t).flags.writeable


def test_writable_buffer_dlpack_is_not_readonly():
    """A writable buffer's DLPack export has no READ_ONLY flag."""
    _needs_dlpack_export()
    capsule = _frombuffer_b8(dtype=tb.uint8).__dlpack__(max_version=(1, 0))
    assert not _versioned_flags(capsule) & _dlpack_abi.DLPACK_FLAG_BITMASK_READ_ONLY


def test_readonly_survives_pickling():
    """A pickled read-only tensor comes back read-only."""
    t = tb.frombuffer(bytes(B8), dtype=tb.uint8)
    for protocol in (2, 5):
        assert pickle.loads(pickle.dumps(t, protocol=protocol)).is_readonly


# -------------------------------------------------------------------------------------------------
# The export is held (PyTorch releases it at once)


def test_bytearray_cannot_be_resized_while_a_view_lives():
    """Resizing raises BufferError while the tensor or any view lives, and works afterwards."""
    ba = bytearray(B8)
    t = tb.frombuffer(ba, dtype=tb.uint8)
    view = t[2:]
    del t
    gc.collect()
    with pytest.raises(BufferError, match="Existing exports of data: object cannot be re-sized"):
        ba.extend(b"123")
    with pytest.raises(BufferError):
        del ba[0]
    assert view.tolist() == list(B8[2:])
    del view
    gc.collect()
    ba.extend(b"123")
    assert len(ba) == 11


def test_mmap_cannot_be_closed_while_a_view_lives():
    """mmap.close() raises BufferError while a view lives (PyTorch closes it, then segfaults)."""
    m = _filled_mmap()
    t = tb.frombuffer(m, dtype=tb.uint8)[4:]
    with pytest.raises(BufferError, match="exported pointers exist"):
        m.close()
    assert t.tolist() == list(B8[4:])
    del t
    gc.collect()
    m.close()
    assert m.closed


def test_memoryview_cannot_be_released_while_a_view_lives():
    """memoryview.release() raises BufferError while a view lives, and works afterwards."""
    mv = memoryview(bytearray(B8))
    t = tb.frombuffer(mv, dtype=tb.uint8)
    with pytest.raises(BufferError):
        mv.release()
    del t
    gc.collect()
    mv.release()


@pytest.mark.skipif(not hasattr(sys, "getrefcount"), reason="CPython refcounts")
def test_exporter_refcount():
    """The exporter's references come with the storage: views add none; all go with it."""
    ba = bytearray(B8)
    before = sys.getrefcount(ba)
    t = tb.frombuffer(ba, dtype=tb.uint8)
    held = sys.getrefcount(ba)
    assert held > before
    view = t[1:]
    del t
    assert sys.getrefcount(ba) == held
    del view
    gc.collect()
    assert sys.getrefcount(ba) == before


def test_exporter_outlives_its_name():
    """The tensor keeps the exporter alive after the caller drops it."""
    t = _frombuffer_b8(dtype=tb.uint8)
    gc.collect()
    assert t.tolist() == list(B8)


def test_exit_with_live_views_is_clean(subprocess_run):
    """Exiting with live frombuffer tensors (bytearray, mmap) leaks quietly, never crashes."""
    result = subprocess_run("""
        import mmap
        import tensorbridge as tb
        ba = bytearray(64)
        m = mmap.mmap(-1, 64)
        keep = [tb.frombuffer(ba, dtype=tb.float32), tb.frombuffer(m, dtype=tb.int8)[3:],
                tb.frombuffer(b"x", dtype=tb.uint8)]
        keep.append(keep)  # a cycle, collected late
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert result.stderr == ""
