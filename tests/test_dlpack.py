"""DLPack import and export within tensorbridge, and against producers crafted with ctypes."""

from __future__ import annotations

import ctypes
import gc
import math
import sys
import threading
import weakref

import pytest

import tensorbridge as tb
from tensorbridge import _cuda, _dlpack, _dlpack_c, _dlpack_export, _exports, _native, _native_py
from tensorbridge._dlpack_abi import (
    DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPACK_MAJOR_VERSION,
    DLManagedTensor,
    DLManagedTensorVersioned,
)
from tensorbridge._dtype import ALL_DTYPES
from tensorbridge._tensor import _from_bytes

from .conftest import native_twins

_get_name = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

CONSUMED_TEXT = (
    "from_dlpack received an invalid capsule. Note that DLTensor capsules can be consumed only "
    "once, so you might have already constructed a tensor from it once."
)


def capsule_name(capsule) -> bytes:
    return ctypes.string_at(_get_name(capsule))


def managed_struct(capsule):
    """The ctypes mirror of the capsule's managed tensor (versioned or legacy)."""
    name = capsule_name(capsule)
    mirror = DLManagedTensorVersioned if name.endswith(b"versioned") else DLManagedTensor
    return mirror.from_address(_get_pointer(capsule, name))


def sample(dtype, n=6):
    """A 1-D tensor of ``dtype`` with distinct raw bytes (every bit pattern is a valid element)."""
    return _from_bytes(bytes(range(1, n * dtype.itemsize + 1)), (n,), dtype)


def raw(t) -> bytes:
    return bytes(t._bytes("test"))


def check_view(t, src, *, shared=True):
    """``t`` views ``src``: pointer, shape, strides, dtype, device, read-only flag, owner."""
    assert t.shape == src.shape
    assert t.dtype is src.dtype
    assert t.device == src.device
    assert t.is_readonly == src.is_readonly
    assert raw(t) == raw(src)
    if shared and src.numel():
        assert t.data_ptr() == src.data_ptr()
        assert t.stride() == src.stride()
        assert t._storage.owner is not None


class Producer:
    """Exposes only a tensor's ``__dlpack__``/``__dlpack_device__`` (no alias shortcut)."""

    def __init__(self, t):
        self.t = t
        self.calls = []

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self.t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


# ----------------------------------------------------------------------------------- the C layout
def test_struct_formats_match_the_ctypes_declaration():
    """The struct formats used to read capsules have the size of the ctypes declaration."""
    assert _dlpack_c.VERSIONED.size == ctypes.sizeof(DLManagedTensorVersioned) == 80
    assert _dlpack_c.LEGACY.size == ctypes.sizeof(DLManagedTensor) == 64
    assert _native_py._block_layout(True, 3)[2] == 80
    assert _native_py._block_layout(False, 3)[2] == 64


def test_export_writes_one_block_with_shape_and_strides():
    """The exported struct, shape and strides are one allocation; strides are filled in."""
    t = tb.arange(24).reshape(2, 3, 4)[:, ::2]
    cap = t.__dlpack__(max_version=(1, 0))
    m = managed_struct(cap)
    base = ctypes.addressof(m)
    dl = m.dl_tensor
    assert ctypes.cast(dl.shape, ctypes.c_void_p).value == base + 80
    assert ctypes.cast(dl.strides, ctypes.c_void_p).value == base + 80 + 8 * 3
    assert [dl.shape[i] for i in range(3)] == [2, 2, 4]
    assert [dl.strides[i] for i in range(3)] == [12, 8, 1]
    assert (m.version.major, m.version.minor) == (1, 3)
    assert (m.flags, dl.byte_offset, dl.data) == (0, 0, t.data_ptr())
    assert (dl.device.device_type, dl.device.device_id) == (1, 0)
    assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (0, 64, 1)
    assert m.deleter


def _written(versioned, address_and_block, ndim):
    """The bytes of a managed struct with its shape and strides, its own addresses zeroed."""
    address = address_and_block[0]  # the tuple keeps the block, and so the struct, alive
    struct_type = DLManagedTensorVersioned if versioned else DLManagedTensor
    header = ctypes.sizeof(struct_type)
    raw = bytearray(ctypes.string_at(address, header + 16 * ndim))
    m = struct_type.from_buffer(raw)
    assert m.manager_ctx == address
    assert ctypes.cast(m.dl_tensor.shape, ctypes.c_void_p).value == address + header
    assert ctypes.cast(m.dl_tensor.strides, ctypes.c_void_p).value == address + header + 8 * ndim
    m.manager_ctx = None
    m.dl_tensor.shape = m.dl_tensor.strides = None
    del m
    return bytes(raw)


@pytest.mark.parametrize("versioned", [True, False])
@pytest.mark.parametrize(
    ("shape", "strides"),
    [((), ()), ((3,), (1,)), ((2, 0, 5), (2**63 - 1, -(2**63), 0)), (tb.Size([4, 1]), (-1, 7))],
)
def test_both_managed_struct_writers_write_the_same_struct(versioned, shape, strides):
    """Every field lands where dlpack.h puts it. The compiled build writes the struct from C, byte
    for byte what the pure-Python build packs with `struct`; both refuse a value past its field."""
    fields = (
        versioned,
        (1, 3),
        0xDE1E7E,
        3,
        2**64 - 1,
        (2, 2**31 - 1),
        (255, 255, 65535),
        2**64 - 1,
    )
    writers = [twin.new_managed for twin in native_twins()]
    written = {_written(versioned, w(*fields, shape, strides), len(shape)) for w in writers}
    assert len(written) == 1
    raw = bytearray(written.pop())
    m = (DLManagedTensorVersioned if versioned else DLManagedTensor).from_buffer(raw)
    dl = m.dl_tensor
    if versioned:
        assert (m.version.major, m.version.minor, m.flags) == (1, 3, 3)
    assert ctypes.cast(m.deleter, ctypes.c_void_p).value == 0xDE1E7E
    assert (dl.data, dl.device.device_type, dl.device.device_id) == (2**64 - 1, 2, 2**31 - 1)
    assert (dl.ndim, dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (len(shape), 255, 255, 65535)
    assert dl.byte_offset == 2**64 - 1
    dims = (ctypes.c_int64 * (2 * len(shape))).from_buffer(raw, ctypes.sizeof(m))
    assert tuple(dims) == (*shape, *strides)
    del m, dl, dims
    for writer in writers:
        with pytest.raises(OverflowError):
            writer(*fields[:4], 2**64, *fields[5:], shape, strides)  # data past 64 bits
        with pytest.raises(OverflowError):
            writer(*fields[:5], (2, 2**31), *fields[6:], shape, strides)  # device_id past int32
        with pytest.raises(OverflowError):
            writer(*fields[:6], (255, 256, 1), *fields[7:], shape, strides)  # bits past uint8
        with pytest.raises(OverflowError):
            writer(*fields, (*shape, 2**63), (*strides, 1))  # a dimension past int64


def test_both_managed_struct_readers_read_what_dlpack_h_puts_there():
    """The compiled build loads a producer's struct, shape and strides from C; the pure-Python
    build unpacks them with `struct`. Both read every field where dlpack.h puts it, at an address
    of any alignment, and leave an address outside the readable range to `read`."""
    readers = [(twin.read_versioned, twin.read_dims) for twin in native_twins()]
    assert (_dlpack_c.read_versioned, _dlpack_c.read_dims) == readers[-1]
    raw = (ctypes.c_char * (ctypes.sizeof(DLManagedTensorVersioned) + 1 + 7 * 8))()
    address = ctypes.addressof(raw) + 1  # odd: no field is aligned
    m = DLManagedTensorVersioned.from_address(address)
    dims = (ctypes.c_int64 * 7).from_address(address + ctypes.sizeof(m))
    dims[:] = [2**63 - 1, 0, 3, -(2**63), -1, 5, 1]  # shape (3), then strides (3), apart
    m.version.major, m.version.minor, m.manager_ctx, m.flags = 2**32 - 1, 3, 0xC0DE, 2**64 - 1
    m.deleter = ctypes.cast(0xDE1E7E, type(m.deleter))
    dl = m.dl_tensor
    dl.data, dl.device.device_type, dl.device.device_id = 2**64 - 1, 13, -(2**31)
    dl.ndim, dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = -7, 17, 4, 2
    dl.shape = ctypes.cast(address + ctypes.sizeof(m), type(dl.shape))
    dl.strides = ctypes.cast(address + ctypes.sizeof(m) + 32, type(dl.strides))
    dl.byte_offset = 2**64 - 1
    word = int.from_bytes(bytes(dl.dtype), sys.byteorder)
    shape_p, strides_p = address + ctypes.sizeof(m), address + ctypes.sizeof(m) + 32
    expected = (2**32 - 1, 3, 0xC0DE, 0xDE1E7E, 2**64 - 1, 2**64 - 1, 13, -(2**31), -7, word)
    for read_versioned, read_dims in readers:
        # Another major version: nothing behind its pointers is read.
        assert read_versioned(address, 64) == (*expected, shape_p, strides_p, 2**64 - 1, None)
        assert read_dims(shape_p, strides_p, 3) == ((2**63 - 1, 0, 3), (-1, 5, 1))
        assert read_dims(shape_p, strides_p, 0) == ((), ())
        for outside in (0, sys.maxsize - 4, 2**64 - 8):  # 0, or past sys.maxsize
            assert read_versioned(outside, 64) is None
            assert read_dims(outside, strides_p, 1) is None
            assert read_dims(shape_p, outside, 1) is None
    # This major version: the shape and strides come with the struct, for 0 < ndim <= max_ndim
    # and non-NULL pointers only (else None, and the caller judges them).
    m.version.major, dl.ndim = DLPACK_MAJOR_VERSION, 3
    fields = (DLPACK_MAJOR_VERSION, *expected[1:8], 3, word, shape_p, strides_p, 2**64 - 1)
    for read_versioned, _read_dims in readers:
        assert read_versioned(address, 64) == (*fields, ((2**63 - 1, 0, 3), (-1, 5, 1)))
        assert read_versioned(address, 2) == (*fields, None)
    dl.strides = None
    for read_versioned, _read_dims in readers:
        assert read_versioned(address, 64) == (*fields[:11], 0, fields[12], None)
    del m, dl, dims


def test_export_zero_d_and_empty_pointers():
    """0-d exports non-NULL shape/strides; a size-0 tensor exports NULL data."""
    m = managed_struct(tb.tensor(3.5).__dlpack__(max_version=(1, 0)))
    assert m.dl_tensor.ndim == 0
    assert m.dl_tensor.shape
    assert m.dl_tensor.strides
    m = managed_struct(tb.zeros(0, 3).__dlpack__(max_version=(1, 0)))
    assert m.dl_tensor.data is None
    assert m.dl_tensor.strides


@pytest.mark.parametrize(
    ("max_version", "name"),
    [
        (None, b"dltensor"),
        ((0, 8), b"dltensor"),
        ((1, 0), b"dltensor_versioned"),
        ((2, 0), b"dltensor_versioned"),
        ([1, 5], b"dltensor_versioned"),
    ],
)
def test_capsule_name_follows_max_version(max_version, name):
    """None/(0, x) give a legacy capsule, (1, x)/(2, x) a versioned (1, 3) one; both import."""
    t = tb.arange(5)
    cap = t.__dlpack__(max_version=max_version)
    assert capsule_name(cap) == name
    if name == b"dltensor_versioned":
        assert managed_struct(cap).version.major == 1
    assert tb.from_dlpack(cap).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("max_version", [1, (1,), (1, 0, 0), ("1", 0), (1.0, 0), (True, 0), "10"])
def test_max_version_must_be_a_pair_of_ints(max_version):
    """A malformed max_version is a TypeError."""
    with pytest.raises(TypeError, match="max_version"):
        tb.arange(3).__dlpack__(max_version=max_version)


@pytest.mark.parametrize("stream", [object(), 1.5, True, "0"])
def test_stream_must_be_an_int(stream):
    """stream must be None or an int (bool and float too are refused), as PyTorch checks."""
    with pytest.raises(TypeError, match="stream must be ``int`` or ``none``"):
        tb.arange(3).__dlpack__(stream=stream)


@pytest.mark.parametrize("stream", [0, 1, 2, 5, -2])
def test_cpu_stream_must_be_none_or_minus_one(stream):
    """A CPU tensor refuses stream values other than None and -1 with a BufferError."""
    with pytest.raises(BufferError, match=r"stream should be None on cpu\."):
        tb.arange(3).__dlpack__(stream=stream)


def test_cpu_stream_none_and_minus_one_are_accepted():
    """stream=None and stream=-1 export a CPU tensor."""
    for stream in (None, -1):
        assert tb.from_dlpack(tb.arange(3).__dlpack__(stream=stream)).tolist() == [0, 1, 2]


@pytest.mark.parametrize("dl_device", [(1, 0), (1, 1), (tb.DLDeviceType.kDLCPU, 0)])
def test_dl_device_cpu_is_accepted(dl_device):
    """dl_device=(1, id) exports a CPU tensor without copying."""
    t = tb.arange(4)
    assert tb.from_dlpack(t.__dlpack__(dl_device=dl_device)).data_ptr() == t.data_ptr()


@pytest.mark.parametrize("kind", [16, 3, 13, 99, 2, 10])
def test_dl_device_elsewhere_is_refused(kind):
    """Devices other than the tensor's own are a BufferError naming the device type."""
    with pytest.raises(BufferError, match=f"Unsupported device_type: {kind}"):
        tb.arange(4).__dlpack__(max_version=(1, 0), dl_device=(kind, 0))


def test_dl_device_elsewhere_with_copy_false_uses_torch_text():
    """A device change with copy=False is refused with PyTorch's wording."""
    with pytest.raises(
        BufferError, match=r"cannot move \(i\.e\. copy=False\) tensor from cpu to cuda:0"
    ):
        tb.arange(4).__dlpack__(dl_device=(2, 0), copy=False)


@pytest.mark.parametrize("dl_device", ["cpu", [1, 0], (1,), (1.0, 0), None.__class__])
def test_dl_device_must_be_a_tuple_of_two_ints(dl_device):
    """dl_device of the wrong type is a TypeError."""
    with pytest.raises(TypeError, match="dl_device"):
        tb.arange(4).__dlpack__(dl_device=dl_device)


@pytest.mark.parametrize("copy", ["yes", 1, 0.0])
def test_export_copy_must_be_a_bool(copy):
    """copy must be True, False or None."""
    with pytest.raises(TypeError, match="copy must be"):
        tb.arange(4).__dlpack__(copy=copy)


def test_export_copy_true_copies_and_flags_it():
    """copy=True exports new memory flagged IS_COPIED; copy=False and None share."""
    t = tb.arange(4)
    cap = t.__dlpack__(max_version=(1, 0), copy=True)
    assert managed_struct(cap).flags == DLPACK_FLAG_BITMASK_IS_COPIED
    c = tb.from_dlpack(cap)
    assert c.data_ptr() != t.data_ptr()
    assert c.tolist() == t.tolist()
    assert c._storage.is_copied
    for copy in (False, None):
        assert (
            tb.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=copy)).data_ptr() == t.data_ptr()
        )


def test_export_positional_argument_is_refused():
    """__dlpack__ takes keyword arguments only."""
    with pytest.raises(TypeError):
        tb.arange(3).__dlpack__(None)


def test_requires_grad_is_refused_with_torch_text():
    """A tensor that requires grad is refused by __dlpack__, to_dlpack and from_dlpack."""
    t = tb.arange(3, dtype=tb.float32).requires_grad_()
    text = "Can't export tensors that require gradient, use tensor.detach()"
    with pytest.raises(BufferError, match=r"require gradient, use tensor\.detach\(\)") as info:
        t.__dlpack__()
    assert text in str(info.value)
    with pytest.raises(BufferError, match="require gradient"):
        tb.utils.dlpack.to_dlpack(t)
    with pytest.raises(BufferError, match="require gradient"):
        tb.from_dlpack(t)
    assert tb.from_dlpack(t.detach()).tolist() == [0.0, 1.0, 2.0]


def test_to_dlpack_needs_a_tensor():
    """to_dlpack of a non-tensor is a TypeError naming the type."""
    with pytest.raises(TypeError, match="list"):
        tb.utils.dlpack.to_dlpack([1, 2])


def test_dlpack_device_of_a_cpu_tensor():
    """__dlpack_device__ is (kDLCPU, 0), an IntEnum member and an int."""
    kind, index = tb.arange(3).__dlpack_device__()
    assert (kind, index) == (1, 0)
    assert kind is tb.DLDeviceType.kDLCPU


# -------------------------------------------------------------------------------- read-only data
def read_only_tensor(crafted):
    producer = crafted((1.0, 2.0, 3.0), flags=DLPACK_FLAG_BITMASK_READ_ONLY)
    t = tb.from_dlpack(producer.capsule)
    return t, producer


def test_read_only_capsule_imports_read_only(crafted):
    """A READ_ONLY capsule gives a read-only tensor: writes raise (PyTorch 2.13 ignores the flag)."""
    t, _ = read_only_tensor(crafted)
    assert t.is_readonly
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 5.0
    assert t.tolist() == [1.0, 2.0, 3.0]


def test_read_only_tensor_export(crafted):
    """A read-only tensor exports versioned with READ_ONLY, never legacy (unless copied)."""
    t, _ = read_only_tensor(crafted)
    cap = t.__dlpack__(max_version=(1, 0))
    assert managed_struct(cap).flags == DLPACK_FLAG_BITMASK_READ_ONLY
    assert tb.from_dlpack(cap).is_readonly
    for export in (
        t.__dlpack__,
        lambda: t.__dlpack__(max_version=(0, 9)),
        lambda: tb.utils.dlpack.to_dlpack(t),
    ):
        with pytest.raises(BufferError, match="read-only"):
            export()
    copied = tb.from_dlpack(t.__dlpack__(copy=True))
    assert not copied.is_readonly
    assert copied.tolist() == [1.0, 2.0, 3.0]


def test_writable_versioned_and_legacy_import_writable(crafted):
    """Versioned capsules without READ_ONLY and legacy ones (PyTorch's policy) import writable."""
    for versioned in (True, False):
        producer = crafted((1.0, 2.0), versioned=versioned)
        t = tb.from_dlpack(producer.capsule)
        t[0] = 9.0
        assert not t.is_readonly
        assert t.tolist() == [9.0, 2.0]


# ------------------------------------------------------------------------------ negative strides
def test_negative_strides_export_a_flagged_copy():
    """Negative strides export a compact copy flagged IS_COPIED (pytorch/pytorch#188023)."""
    t = tb.arange(6)[::-1]
    cap = t.__dlpack__(max_version=(1, 0))
    m = managed_struct(cap)
    assert m.flags == DLPACK_FLAG_BITMASK_IS_COPIED
    assert m.dl_tensor.strides[0] == 1
    c = tb.from_dlpack(cap)
    assert c.tolist() == [5, 4, 3, 2, 1, 0]
    assert c.data_ptr() != t.data_ptr()
    assert tb.from_dlpack(tb.utils.dlpack.to_dlpack(t)).tolist() == [5, 4, 3, 2, 1, 0]


def test_negative_strides_with_copy_false_are_refused():
    """copy=False cannot export negative strides."""
    with pytest.raises(BufferError, match="negative strides"):
        tb.arange(6)[::-1].__dlpack__(copy=False)


# Negative strides that address nothing: on dimensions of size 1, or in a tensor without elements.
_IDLE_NEGATIVE = [((1, 4), (-4, 1)), ((3, 1), (1, -7)), ((0, 3), (-1, 1)), ((2, 0), (-5, -1))]


@pytest.mark.parametrize(("shape", "strides"), _IDLE_NEGATIVE)
@pytest.mark.parametrize("copy", [None, False])
def test_idle_negative_strides_export_without_a_copy(shape, strides, copy):
    """Negative strides that address nothing need no copy: the export shares the memory (no
    IS_COPIED, also with copy=False) and writes them as their absolute values, which PyTorch
    takes."""
    base = tb.arange(64, dtype=tb.float32)
    t = base.as_strided(shape, strides, 20)
    cap = t.__dlpack__(max_version=(1, 0), copy=copy)
    m = managed_struct(cap)
    assert m.flags == 0
    assert [m.dl_tensor.strides[i] for i in range(len(shape))] == [abs(s) for s in strides]
    again = tb.from_dlpack(cap)
    assert again.shape == t.shape
    if t.numel():
        assert again.data_ptr() == t.data_ptr()
        assert again.tolist() == t.tolist()


@pytest.mark.parametrize(
    ("shape", "strides"), [*_IDLE_NEGATIVE, ((2, 3), (3, -1)), ((2, 1), (-4, -4)), ((2,), (-1,))]
)
def test_one_negative_stride_rule_for_dlpack_and_torch(shape, strides):
    """``__dlpack__`` copies exactly the tensors ``torch()`` refuses for their negative strides:
    one rule decides both."""
    t = tb.arange(64, dtype=tb.float32).as_strided(shape, strides, 20)
    copied = bool(managed_struct(t.__dlpack__(max_version=(1, 0))).flags)
    assert copied == _dlpack_export.has_negative_stride(t.shape, t.stride())
    assert copied == (
        len(shape)
        and min(shape) > 0
        and any(s < 0 and n > 1 for n, s in zip(shape, strides, strict=True))
    )


def test_negative_strides_import_as_they_are(crafted):
    """A capsule with negative strides imports as a view (no copy), values in order."""
    producer = crafted((1.0, 2.0, 3.0, 4.0), shape=(4,), strides=(-1,))
    producer.managed.dl_tensor.byte_offset = 12  # the first element is the last value
    t = tb.from_dlpack(producer.capsule)
    assert t.stride() == (-1,)
    assert t.tolist() == [4.0, 3.0, 2.0, 1.0]
    assert t.data_ptr() == ctypes.addressof(producer.buffer) + 12


# -------------------------------------------------------------------------------- import: errors
def test_not_a_producer_error_is_public():
    """The error for a non-producer is ``tensorbridge.NotDLPackError``: exported, named in
    tracebacks as tensorbridge's, and both a TypeError and an AttributeError."""
    with pytest.raises(tb.NotDLPackError) as info:
        tb.from_dlpack([1, 2])
    cls = type(info.value)
    assert cls is tb.NotDLPackError
    assert f"{cls.__module__}.{cls.__qualname__}" == "tensorbridge.NotDLPackError"
    assert issubclass(cls, TypeError)
    assert issubclass(cls, AttributeError)
    assert "NotDLPackError" in tb.__all__
    import pickle

    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is tb.NotDLPackError
    assert str(again) == str(info.value)


def test_every_exception_class_a_user_can_meet_is_public():
    """Every exception class the library modules define is exported from tensorbridge under its
    name, with ``__module__`` "tensorbridge" (the doctor and CLI catch their own internally)."""
    import importlib
    import pkgutil

    found = []
    for info in pkgutil.iter_modules(tb.__path__):
        if info.name in ("_doctor", "_cli", "__main__"):
            continue
        if info.name == "_native_c" and not _native.COMPILED:
            continue  # compiled only, and not loaded with TENSORBRIDGE_NO_EXTENSIONS=1
        module = importlib.import_module(f"tensorbridge.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__.startswith("tensorbridge")
            ):
                found.append(value)
    assert found
    for cls in found:
        assert cls.__module__ == "tensorbridge", cls
        assert getattr(tb, cls.__name__) is cls
        assert cls.__name__ in tb.__all__


@pytest.mark.parametrize("device", [5, "cpu", (2,), (1, 0, 0), ("a", 0), (True, 0), 1.5])
def test_malformed_dlpack_device_is_a_type_error(device):
    """A ``__dlpack_device__`` that does not return a pair of ints is a TypeError naming it;
    ``__dlpack__`` is not called."""
    calls = []

    class Broken:
        def __dlpack__(self, **kwargs):
            calls.append(kwargs)
            raise AssertionError("not reached")

        def __dlpack_device__(self):
            return device

    with pytest.raises(TypeError, match=r"__dlpack_device__\(\) must return a \(device_type, "):
        tb.from_dlpack(Broken())
    assert calls == []


@pytest.mark.parametrize("device", [[1, 0], (tb.DLDeviceType.kDLCPU, 0)])
def test_dlpack_device_as_list_or_enum_is_accepted(device):
    """A list or an IntEnum pair (PyTorch returns its DLDeviceType) is a valid device pair."""
    x = tb.arange(3)

    class Producer2:
        def __dlpack__(self, **kwargs):
            return x.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return device

    assert tb.from_dlpack(Producer2()).data_ptr() == x.data_ptr()


@pytest.mark.parametrize("obj", [[1, 2], 5, None, object(), "abc"])
def test_non_producer_is_a_type_error_naming_the_type(obj):
    """Neither producer nor capsule: a TypeError (and AttributeError) naming the type."""
    with pytest.raises(TypeError, match=type(obj).__name__) as info:
        tb.from_dlpack(obj)
    assert isinstance(info.value, AttributeError)


def test_producer_methods_are_looked_up_on_the_instance():
    """``__dlpack__`` and ``__dlpack_device__`` are found as any attribute is: on the type, in the
    instance, or through ``__getattr__``; an error raised inside either passes through unchanged."""
    x = tb.arange(4.0)

    class Proxy:  # forwards every attribute it lacks
        def __init__(self, target):
            self.target = target

        def __getattr__(self, name):
            return getattr(self.target, name)

    class Bare:
        pass

    bare = Bare()
    bare.__dlpack__, bare.__dlpack_device__ = x.__dlpack__, x.__dlpack_device__

    class Shadowed:  # the instance's own methods come first, as for any attribute
        def __dlpack__(self, **kwargs):
            raise AssertionError("the instance's __dlpack__ was passed over")

        def __dlpack_device__(self):
            raise AssertionError("the instance's __dlpack_device__ was passed over")

    shadowed = Shadowed()
    shadowed.__dlpack__, shadowed.__dlpack_device__ = x.__dlpack__, x.__dlpack_device__
    for producer in (Proxy(x), bare, shadowed, Proxy(x)):  # the second Proxy: the type is known
        assert tb.from_dlpack(producer).data_ptr() == x.data_ptr()
    # Proxy and Bare are looked up with getattr; Shadowed's are called as methods
    assert [_dlpack._PRODUCERS[id(c)].methods for c in (Proxy, Bare, Shadowed)] == [
        False,
        False,
        True,
    ]

    class Failing:
        def __dlpack__(self, **kwargs):
            return x.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            raise AttributeError("lost its device")

    for _ in range(2):
        with pytest.raises(AttributeError, match="lost its device") as info:
            tb.from_dlpack(Failing())
        assert not isinstance(info.value, tb.NotDLPackError)


def test_foreign_capsule_is_a_type_error_naming_it(crafted):
    """A capsule of another kind is a TypeError naming the capsule, and is left as it is."""
    producer = crafted(name=b"arrow_array")
    with pytest.raises(TypeError, match="arrow_array"):
        tb.from_dlpack(producer.capsule)
    assert capsule_name(producer.capsule) == b"arrow_array"


def test_producer_returning_a_non_capsule():
    """A __dlpack__ that returns something other than a capsule is a TypeError naming both types."""

    class Broken:
        def __dlpack__(self, **kwargs):
            return [1, 2]

    with pytest.raises(TypeError, match=r"Broken\.__dlpack__\(\) returned an object of type list"):
        tb.from_dlpack(Broken())


def test_reused_capsule_raises_torch_text():
    """A consumed capsule raises RuntimeError with PyTorch's text, word for word."""
    for cap in (
        tb.utils.dlpack.to_dlpack(tb.arange(3)),
        tb.arange(3).__dlpack__(max_version=(1, 0)),
    ):
        tb.from_dlpack(cap)
        with pytest.raises(RuntimeError) as info:
            tb.from_dlpack(cap)
        assert str(info.value) == CONSUMED_TEXT


@pytest.mark.parametrize("device", [0, 1.0, ("cpu",), b"cpu"])
def test_device_argument_type(device):
    """device must be a string or a tensorbridge.device: anything else is a TypeError."""
    with pytest.raises(TypeError, match="device"):
        tb.from_dlpack(tb.arange(3), device=device)


def test_device_argument_unknown_name():
    """An unknown device name is a ValueError (array API: from_dlpack(x, device='gpu'))."""
    with pytest.raises(ValueError, match="gpu"):
        tb.from_dlpack(tb.arange(3), device="gpu")


def test_copy_argument_type():
    """copy must be True, False or None."""
    with pytest.raises(TypeError, match="copy"):
        tb.from_dlpack(tb.arange(3), copy="no")


@pytest.mark.parametrize("device", ["cpu", tb.device("cpu"), None])
def test_import_copy_semantics(device):
    """copy=None/False share memory, copy=True does not (values equal either way)."""
    t = tb.arange(5)
    p = Producer(t)
    assert tb.from_dlpack(p, device=device, copy=False).data_ptr() == t.data_ptr()
    assert tb.from_dlpack(p, device=device).data_ptr() == t.data_ptr()
    c = tb.from_dlpack(p, device=device, copy=True)
    assert c.data_ptr() != t.data_ptr()
    assert c.tolist() == t.tolist()
    assert p.calls[-1]["copy"] is True
    assert p.calls[0]["max_version"] == (1, 3)


def test_import_cross_device_without_copy_is_a_value_error():
    """A device change with copy=False is a ValueError with PyTorch's text; nothing is requested."""
    p = Producer(tb.arange(3))
    with pytest.raises(ValueError, match=r"cannot move .* tensor from .*") as info:
        tb.from_dlpack(p, device="cuda", copy=False)
    assert (
        "cannot move DLPack tensor from device (<DLDeviceType.kDLCPU: 1>, 0) to (2, 0) "
        "without copying. "
        "Set copy=None or copy=True."
    ) in str(info.value)
    assert p.calls == []


def test_import_cross_device_request_goes_to_the_producer():
    """device='cuda' is asked of the producer (dl_device); a CPU tensor refuses: BufferError."""
    p = Producer(tb.arange(3))
    with pytest.raises(BufferError, match="Unsupported device_type: 2"):
        tb.from_dlpack(p, device="cuda:0")
    assert p.calls[0]["dl_device"] == (2, 0)


def test_copy_true_keeps_a_producer_copy(crafted):
    """copy=True keeps an IS_COPIED capsule as it is; without the flag tensorbridge copies."""
    flagged = crafted((1.0, 2.0), flags=DLPACK_FLAG_BITMASK_IS_COPIED)
    t = tb.from_dlpack(flagged, copy=True)
    assert t.data_ptr() == ctypes.addressof(flagged.buffer)
    assert t._storage.is_copied
    ignored = crafted((1.0, 2.0))  # a producer that ignores copy=True, as JAX can
    t = tb.from_dlpack(ignored, copy=True)
    assert t.data_ptr() != ctypes.addressof(ignored.buffer)
    assert t.tolist() == [1.0, 2.0]


def test_capsule_with_copy_and_device(crafted):
    """Capsule + copy/device: copied or viewed locally, never an AssertionError."""
    t = tb.arange(3)
    assert tb.from_dlpack(tb.utils.dlpack.to_dlpack(t), copy=False).data_ptr() == t.data_ptr()
    c = tb.from_dlpack(tb.utils.dlpack.to_dlpack(t), copy=True)
    assert c.data_ptr() != t.data_ptr()
    assert c.tolist() == [0, 1, 2]
    assert tb.from_dlpack(tb.utils.dlpack.to_dlpack(t), device="cpu").data_ptr() == t.data_ptr()
    pinned = crafted((1.0, 2.0), device=(3, 0))
    v = tb.from_dlpack(pinned.capsule, device="cpu")
    assert v.device == tb.device("cpu")
    assert v.tolist() == [1.0, 2.0]


def test_capsule_that_would_need_a_move_is_a_value_error(crafted):
    """A CUDA capsule with device='cpu' or copy=True: ValueError with torch's text, unconsumed."""
    producer = crafted((1.0, 2.0), device=(2, 0))
    for kwargs in ({"device": "cpu"}, {"copy": True}):
        with pytest.raises(
            ValueError,
            match=r"device and copy kwargs not supported when ext_tensor is "
            "already a DLPack capsule.",
        ):
            tb.from_dlpack(producer.capsule, **kwargs)
        assert not producer.consumed


def test_version_2_capsule_is_refused_and_left_unconsumed(crafted):
    """A versioned capsule of major version 2 is a BufferError; the capsule keeps its name."""
    producer = crafted(version=(2, 0))
    with pytest.raises(BufferError, match="major version"):
        tb.from_dlpack(producer.capsule)
    assert not producer.consumed
    assert producer.deleter_calls == 0
    producer.capsule = None
    assert producer.deleter_calls == 1


# --------------------------------------------------------------------------------- import: fallback
class OldProducer:
    """A pre-2023.12 producer: ``__dlpack__(self, stream=None)``."""

    def __init__(self, t):
        self.t = t
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return tb.utils.dlpack.to_dlpack(self.t)

    def __dlpack_device__(self):
        return (1, 0)


def test_old_signature_producer_falls_back_and_imports_writable():
    """A producer whose signature rejects max_version is called again without keywords."""
    p = OldProducer(tb.arange(3))
    t = tb.from_dlpack(p)
    assert p.calls == 1
    assert t.tolist() == [0, 1, 2]
    assert not t.is_readonly


@pytest.mark.parametrize(
    ("kwargs", "shared"),
    [({"copy": True}, False), ({"copy": False}, True), ({"device": "cpu"}, True)],
)
def test_old_signature_host_producer_meets_device_and_copy(kwargs, shared):
    """A host producer that takes no max_version/dl_device/copy (NumPy before 2.1) is asked again
    without them: copy=True is met by a copy made after the import, copy=False and the host
    device hold anyway."""
    t = tb.arange(3)
    p = OldProducer(t)
    out = tb.from_dlpack(p, **kwargs)
    assert p.calls == 1
    assert out.tolist() == [0, 1, 2]
    assert (out.data_ptr() == t.data_ptr()) is shared


class OldDeviceProducer(OldProducer):
    """An old-signature producer of (never dereferenced) CUDA memory; records its keywords."""

    def __init__(self, t):
        super().__init__(t)
        self.streams = []

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return super().__dlpack__()

    def __dlpack_device__(self):
        return (2, 0)


def _device_tensor():
    return tb.from_pointer(0x10000, (3,), tb.float32, device="cuda:0")


@pytest.mark.parametrize("kwargs", [{"copy": True}, {"device": "cpu"}])
def test_old_signature_device_producer_is_not_asked_to_drop_a_request(kwargs):
    """Device memory cannot be copied or moved by tensorbridge: an old-signature producer that
    cannot take the request gets a TypeError naming the keywords, and is not called again."""
    p = OldDeviceProducer(_device_tensor())
    with pytest.raises(TypeError, match=r"does not take the keywords .*'(copy|dl_device)'"):
        tb.from_dlpack(p, **kwargs)
    assert p.calls == 0


def test_old_signature_device_producer_keeps_its_stream():
    """Asked again without max_version, an old device producer still gets ``stream=1``."""
    t = _device_tensor()
    p = OldDeviceProducer(t)
    out = tb.from_dlpack(p, copy=False)
    assert p.streams == [1]
    assert out.device == tb.device("cuda:0")
    assert out.data_ptr() == t.data_ptr()


def test_unrelated_type_error_is_not_retried():
    """A TypeError raised inside a current producer propagates, and it is called once."""
    calls = []

    class Broken:
        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            calls.append(max_version)
            raise TypeError("bad keyword handling inside the producer")

    with pytest.raises(TypeError, match="inside the producer"):
        tb.from_dlpack(Broken())
    assert calls == [(1, 3)]


def test_var_keyword_producer_is_not_retried():
    """A producer taking **kwargs did not reject the keywords: its TypeError propagates."""

    class Kw:
        def __dlpack__(self, **kwargs):
            raise TypeError("unexpected keyword argument 'max_version' (from deeper down)")

    with pytest.raises(TypeError, match="deeper down"):
        tb.from_dlpack(Kw())


def test_cpu_producer_gets_no_stream():
    """A CPU producer is asked with max_version=(1, 3) only, no stream (NumPy refuses any)."""
    p = Producer(tb.arange(3))
    tb.from_dlpack(p)
    assert p.calls == [{"max_version": (1, 3)}]


@pytest.mark.parametrize(("device", "stream"), [((2, 0), 1), ((10, 1), 0)])
def test_gpu_producer_gets_the_legacy_default_stream(crafted, device, stream):
    """CUDA producers get stream=1, ROCm producers stream=0 (the legacy default streams)."""
    recorded = []

    class Recorder(crafted):
        def __dlpack__(self, **kwargs):
            recorded.append(kwargs)
            return super().__dlpack__(**kwargs)

    t = tb.from_dlpack(Recorder((1.0, 2.0), device=device))
    assert recorded == [{"max_version": (1, 3), "stream": stream}]
    assert t.device.dlpack_type == device[0]


# ----------------------------------------------------------------------------- import: every field
def test_byte_offset_is_added(crafted):
    """The first element is at data + byte_offset."""
    producer = crafted((7.0, 8.0), byte_offset=8)
    t = tb.from_dlpack(producer.capsule)
    assert t.data_ptr() == ctypes.addressof(producer.buffer) + 8
    assert t.tolist() == [7.0, 8.0]


@pytest.mark.parametrize(
    ("versioned", "version"), [(False, None), (True, (1, 0)), (True, (1, 1)), (True, (1, 3))]
)
def test_null_strides_mean_row_major(crafted, versioned, version):
    """NULL strides (legacy, pre-1.2, and leniently from newer producers) are row-major."""
    producer = crafted(
        tuple(float(i) for i in range(6)),
        shape=(2, 3),
        versioned=versioned,
        version=version or (1, 3),
    )
    t = tb.from_dlpack(producer.capsule)
    assert t.stride() == (3, 1)
    assert t.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_zero_d_with_null_shape(crafted):
    """A 0-d tensor with NULL shape and strides (DLPack 1.3) imports."""
    producer = crafted((2.5,), shape=(), null_shape=True, null_strides=True)
    t = tb.from_dlpack(producer.capsule)
    assert t.shape == ()
    assert t.item() == 2.5


def test_size_zero_with_null_data(crafted):
    """A size-0 tensor with NULL data and odd strides imports as an empty tensor."""
    producer = crafted((), shape=(0, 3), strides=(7, -5), data=0)
    t = tb.from_dlpack(producer.capsule)
    assert t.shape == (0, 3)
    assert t.numel() == 0
    assert t.tolist() == []


def test_zero_strides_and_size_one_dims(crafted):
    """Stride 0 broadcasts; size-1 dims accept any stride."""
    producer = crafted((1.0, 2.0), shape=(3, 1, 2), strides=(0, 12345, 1))
    t = tb.from_dlpack(producer.capsule)
    assert t.stride() == (0, 12345, 1)
    assert t.tolist() == [[[1.0, 2.0]]] * 3
    assert t._storage.nbytes == 8


def test_sixty_four_dims(crafted):
    """ndim = 64 imports."""
    producer = crafted((3.0,), shape=(1,) * 64)
    t = tb.from_dlpack(producer.capsule)
    assert t.ndim == 64
    assert t.numel() == 1
    assert t.reshape(1).tolist() == [3.0]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_every_dtype_code_imports(crafted, dtype):
    """Each DLPack (code, bits, lanes) with a tensorbridge dtype imports as that dtype."""
    producer = crafted(
        tuple(range(1, 1 + 2 * dtype.itemsize)), fmt="B", dtype=dtype.dlpack, shape=(2,)
    )
    t = tb.from_dlpack(producer.capsule)
    assert t.dtype is dtype
    assert raw(t) == bytes(range(1, 1 + 2 * dtype.itemsize))


def test_dtype_table_matches_dlpack_and_torch():
    """The DLPack (code, bits, lanes) triples are dlpack.h's, as PyTorch 2.13 uses them."""
    expected = {
        "bool": (6, 8, 1),
        "uint8": (1, 8, 1),
        "int64": (0, 64, 1),
        "float16": (2, 16, 1),
        "bfloat16": (4, 16, 1),
        "complex32": (5, 32, 1),
        "complex128": (5, 128, 1),
        "float8_e3m4": (7, 8, 1),
        "float8_e4m3": (8, 8, 1),
        "float8_e4m3b11fnuz": (9, 8, 1),
        "float8_e4m3fn": (10, 8, 1),
        "float8_e4m3fnuz": (11, 8, 1),
        "float8_e5m2": (12, 8, 1),
        "float8_e5m2fnuz": (13, 8, 1),
        "float8_e8m0fnu": (14, 8, 1),
        "float4_e2m1fn_x2": (17, 4, 2),
    }
    for name, triple in expected.items():
        assert getattr(tb, name).dlpack == triple


@pytest.mark.parametrize(
    ("dtype", "words"),
    [
        ((2, 32, 4), "lanes=4"),
        ((99, 8, 1), "code=99"),
        ((2, 24, 1), "bits=24"),
        ((3, 64, 1), "code=3"),
        ((17, 4, 1), "code=17, bits=4, lanes=1"),
        ((16, 6, 1), "code=16"),
        ((15, 8, 1), "code=15"),
        ((6, 1, 1), "code=6, bits=1"),
        ((5, 48, 1), "bits=48"),
        ((0, 64, 0), "lanes=0"),
    ],
)
def test_unsupported_dtypes_are_buffer_errors(crafted, dtype, words):
    """An unsupported (code, bits, lanes) is a BufferError naming all three; capsule unused."""
    producer = crafted(dtype=dtype)
    with pytest.raises(BufferError, match=words):
        tb.from_dlpack(producer.capsule)
    assert not producer.consumed


def test_read_only_and_is_copied_flags_are_recorded(crafted):
    """READ_ONLY makes the storage read-only; IS_COPIED is recorded on the storage."""
    t = tb.from_dlpack(crafted(flags=DLPACK_FLAG_BITMASK_IS_COPIED).capsule)
    assert t._storage.is_copied
    assert not t.is_readonly
    t = tb.from_dlpack(crafted(flags=3).capsule)
    assert t._storage.is_copied
    assert t.is_readonly


@pytest.mark.parametrize("kind", [3, 11, 13])
def test_host_accessible_devices_are_readable(crafted, kind):
    """Pinned and managed memory are read on the host, and re-exported with their device."""
    producer = crafted((1.0, 2.0), device=(kind, 0))
    t = tb.from_dlpack(producer.capsule)
    assert t.tolist() == [1.0, 2.0]
    assert t.device.dlpack_type == kind
    m = managed_struct(t.__dlpack__(max_version=(1, 0)))
    assert m.dl_tensor.device.device_type == kind
    assert m.dl_tensor.data == t.data_ptr()
    assert tb.from_dlpack(t.__dlpack__(max_version=(1, 0), dl_device=(1, 0))).device == tb.device(
        "cpu"
    )


@pytest.mark.parametrize("kind", [2, 10, 14])
def test_device_memory_is_carried_not_read(crafted, kind):
    """Device memory keeps device and pointer through import and re-export; never read."""
    fake = 0x7F0000001000  # never dereferenced: any value works
    producer = crafted(
        (),
        shape=(4, 2),
        strides=(2, 1),
        data=fake,
        device=(kind, 1),
        dtype=(0, 32, 1),
        byte_offset=0,
    )
    t = tb.from_dlpack(producer.capsule)
    assert t.device.dlpack_type == kind
    assert t.device.index == 1
    assert t.data_ptr() == fake
    assert t._storage.nbytes == 32
    with pytest.raises(BufferError):
        t.tolist()
    m = managed_struct(t[1:].__dlpack__(max_version=(1, 0)))
    assert (m.dl_tensor.device.device_type, m.dl_tensor.device.device_id) == (kind, 1)
    assert m.dl_tensor.data == fake + 8
    assert m.dl_tensor.byte_offset == 0
    assert t.__dlpack_device__() == (kind, 1)
    with pytest.raises(BufferError, match="cannot copy"):
        t.__dlpack__(max_version=(1, 0), copy=True)
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 0), dl_device=(1, 0))


@pytest.mark.parametrize("kind", [4, 7, 8, 15, 18])
def test_opaque_handle_keeps_byte_offset(crafted, kind):
    """Where data may be a handle (OpenCL, Metal, ...) byte_offset is kept, never folded in."""
    handle = 0x1234
    producer = crafted((), shape=(3,), strides=(1,), data=handle, device=(kind, 0), byte_offset=16)
    t = tb.from_dlpack(producer.capsule)
    assert t._storage.ptr == handle
    assert t.storage_offset() == 4
    assert t._storage.nbytes == 28
    m = managed_struct(t[1:].__dlpack__(max_version=(1, 0)))
    assert (m.dl_tensor.data, m.dl_tensor.byte_offset) == (handle, 20)
    assert m.dl_tensor.device.device_type == kind


def test_opaque_handle_with_unaligned_offset_is_refused(crafted):
    """A handle offset that is not a whole number of elements cannot be expressed: BufferError."""
    producer = crafted((), shape=(3,), strides=(1,), data=0x1234, device=(8, 0), byte_offset=6)
    with pytest.raises(BufferError, match="byte_offset 6"):
        tb.from_dlpack(producer.capsule)


def test_cuda_stream_validation(crafted):
    """On CUDA, stream 0 is refused (ambiguous); None, -1, 1 and 2 need no synchronisation."""
    t = tb.from_dlpack(crafted((), shape=(2,), data=0x10000, device=(2, 0)).capsule)
    with pytest.raises(BufferError, match="unsupported stream on CUDA: 0"):
        t.__dlpack__(stream=0)
    for stream in (None, -1, 1, 2):
        assert (
            capsule_name(t.__dlpack__(stream=stream, max_version=(1, 0))) == b"dltensor_versioned"
        )


def test_cuda_raw_stream_without_a_driver(crafted, monkeypatch):
    """A raw CUDA stream needs the CUDA driver; without one it is a clean BufferError."""
    t = tb.from_dlpack(crafted((), shape=(2,), data=0x10000, device=(2, 0)).capsule)
    monkeypatch.setattr(_cuda, "driver", lambda: None)
    with pytest.raises(BufferError, match="CUDA driver"):
        t.__dlpack__(stream=12345)


class FakeCudaLibrary:
    """Stands in for libcuda: records each driver call; ``fail`` names one that returns an error."""

    def __init__(self, fail=None):
        self.calls = []
        self.fail = fail

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, *(_value(a) for a in args)))
            if name in ("cuDevicePrimaryCtxRetain", "cuEventCreate"):
                args[0]._obj.value = 0xC0 if name.endswith("Retain") else 0xE0
            return 700 if name == self.fail else 0

        setattr(self, name, call)
        return call


def _value(arg):
    arg = getattr(arg, "_obj", arg)
    return getattr(arg, "value", arg)


@pytest.mark.parametrize("fail", [None, "cuStreamWaitEvent"])
def test_cuda_raw_stream_is_ordered_after_the_legacy_stream(crafted, monkeypatch, fail):
    """A raw stream waits on an event recorded on the legacy stream, in the primary context; on a
    driver error everything acquired is released and the error is a BufferError."""
    lib = FakeCudaLibrary(fail)
    driver = _cuda.load(lib)
    monkeypatch.setattr(_cuda, "driver", lambda: driver)
    t = tb.from_dlpack(crafted((), shape=(2,), data=0x10000, device=(2, 1)).capsule)
    if fail:
        with pytest.raises(BufferError, match="cuStreamWaitEvent failed with CUDA error 700"):
            t.__dlpack__(stream=0x5000)
    else:
        t.__dlpack__(stream=0x5000)
    names = [c[0] for c in lib.calls]
    assert names == [
        "cuInit",
        "cuDeviceGet",
        "cuDevicePrimaryCtxRetain",
        "cuCtxPushCurrent_v2",
        "cuEventCreate",
        "cuEventRecord",
        "cuStreamWaitEvent",
        *(["cuGetErrorName"] if fail else []),
        "cuEventDestroy_v2",
        "cuCtxPopCurrent_v2",
        "cuDevicePrimaryCtxRelease_v2",
    ]
    assert lib.calls[1][2] == 1
    assert lib.calls[3][1] == 0xC0
    assert lib.calls[5][1:] == (0xE0, 1)
    assert lib.calls[6][1:] == (0x5000, 0xE0, 0)


def test_rocm_stream_validation(crafted):
    """On ROCm, 0 and -1 are accepted; 1 and 2 are refused."""
    t = tb.from_dlpack(crafted((), shape=(2,), data=0x10000, device=(10, 0)).capsule)
    assert tb.from_dlpack(t.__dlpack__(stream=0)).device.type == "rocm"
    for stream in (1, 2):
        with pytest.raises(BufferError, match="ROCm"):
            t.__dlpack__(stream=stream)


# -------------------------------------------------------------------------- ownership and lifetimes
def test_deleter_runs_once_when_the_last_view_dies(crafted):
    """A consumed capsule's deleter runs exactly once, when the last view (not the first) dies."""
    producer = crafted(tuple(float(i) for i in range(6)))
    t = tb.from_dlpack(producer.capsule)
    assert producer.consumed
    view = t[2:]
    del t
    gc.collect()
    assert producer.deleter_calls == 0
    assert view.tolist() == [2.0, 3.0, 4.0, 5.0]
    producer.capsule = None
    del view
    gc.collect()
    assert producer.deleter_calls == 1


@pytest.mark.parametrize("kind", ["unconsumed", "failed"])
def test_deleter_runs_once_for_unconsumed_and_failed_imports(crafted, kind):
    """An unconsumed or rejected capsule is freed once, by its own destructor."""
    producer = crafted(dtype=(2, 32, 1) if kind == "unconsumed" else (2, 31, 1))
    if kind == "failed":
        with pytest.raises(BufferError):
            tb.from_dlpack(producer.capsule)
    producer.capsule = None
    gc.collect()
    assert producer.deleter_calls == 1


def test_deleter_runs_once_from_another_thread(crafted):
    """The last view dying on another thread runs the deleter there, once."""
    producer = crafted()
    box = [tb.from_dlpack(producer.capsule)]
    producer.capsule = None
    thread = threading.Thread(target=box.clear)
    thread.start()
    thread.join()
    gc.collect()
    assert producer.deleter_calls == 1


def test_imported_object_holds_one_reference(crafted):
    """Importing from a producer object adds no lasting reference to it; the data stays alive."""
    producer = crafted((1.0, 2.0))
    before = sys.getrefcount(producer)
    t = tb.from_dlpack(producer)
    assert sys.getrefcount(producer) == before
    assert t.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("max_version", [(0, 0), None, (1, 0), (100, 3)])
def test_capsule_holds_one_reference_on_the_source(max_version):
    """Each live capsule holds exactly +1 on the exported tensor, dropped once it is reaped."""
    t = tb.arange(4)
    gc.collect()
    before = sys.getrefcount(t)
    cap = t.__dlpack__(max_version=max_version)
    assert sys.getrefcount(t) == before + 1
    del cap
    gc.collect()
    assert sys.getrefcount(t) == before


def test_exported_memory_outlives_every_tensorbridge_object():
    """Exported memory stays valid while a consumer holds it, with no tensorbridge object left."""
    t = tb.arange(100)
    alive = weakref.ref(t)
    cap = tb.utils.dlpack.to_dlpack(t)
    consumer = CountingConsumer(cap)
    del t, cap
    gc.collect()
    assert alive() is not None
    assert consumer.read(99) == 99
    consumer.release()
    gc.collect()
    assert alive() is None


class CountingConsumer:
    """A minimal C-style consumer: renames the capsule, reads the data, calls the deleter."""

    def __init__(self, capsule):
        name = capsule_name(capsule)
        self.address = _get_pointer(capsule, name)
        used = b"used_" + name
        self._name = used
        ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
            ("PyCapsule_SetName", ctypes.pythonapi)
        )(capsule, used)
        self.managed = DLManagedTensor.from_address(self.address)

    def read(self, i):
        return ctypes.c_int64.from_address(self.managed.dl_tensor.data + 8 * i).value

    def release(self):
        self.managed.deleter(self.address)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="calls pthread_create from libc")
def test_deleter_runs_on_a_thread_python_never_saw():
    """A consumer may call the deleter from a native thread: ctypes takes the GIL; it runs once."""
    libc = ctypes.CDLL(None)
    t = tb.arange(16)
    alive = weakref.ref(t)
    consumer = CountingConsumer(tb.utils.dlpack.to_dlpack(t))
    del t
    gc.collect()
    assert alive() is not None
    thread = ctypes.c_ulong()
    deleter = ctypes.cast(consumer.managed.deleter, ctypes.c_void_p)  # void (*)(void *)
    assert (
        libc.pthread_create(ctypes.byref(thread), None, deleter, ctypes.c_void_p(consumer.address))
        == 0
    )
    assert libc.pthread_join(thread, None) == 0  # a CDLL call: the GIL is released meanwhile
    assert alive() is None


def test_abandoned_capsule_is_reaped_by_gc():
    """A capsule dropped without being consumed frees its tensor at the next full collection."""
    t = tb.arange(8)
    alive = weakref.ref(t)
    cap = t.__dlpack__(max_version=(1, 0))
    del t, cap
    gc.collect()
    assert alive() is None


# In the compiled build a capsule's C destructor releases an untaken export at once; the
# pure-Python build's capsules have no destructor and the registry watches them.
_watched = pytest.mark.skipif(
    _dlpack_export._CAPSULE_DESTRUCTOR is not None,
    reason="compiled build: capsules release themselves and are not watched",
)
_self_releasing = pytest.mark.skipif(
    _dlpack_export._CAPSULE_DESTRUCTOR is None,
    reason="pure-Python build: capsules have no destructor; the registry watches them",
)


@_self_releasing
@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_abandoned_capsule_releases_its_export_when_it_dies(max_version):
    """Compiled: a capsule nobody consumed frees its export the moment it dies, no collection."""
    gc.disable()
    try:
        t = tb.arange(8)
        alive = weakref.ref(t)
        cap = t.__dlpack__(max_version=max_version)
        address = _get_pointer(cap, b"dltensor_versioned" if max_version else b"dltensor")
        del t
        assert alive() is not None and address in _exports._MANAGED
        assert address not in _exports._PENDING  # held, not watched
        del cap
        assert alive() is None and address not in _exports._MANAGED
    finally:
        gc.enable()


@_self_releasing
def test_consumed_capsule_dying_leaves_the_export_to_its_consumer():
    """Compiled: the destructor of a renamed (consumed) capsule releases nothing; the export goes
    when its consumer calls the deleter."""
    t = tb.arange(8)
    alive = weakref.ref(t)
    cap = t.__dlpack__(max_version=(1, 0))
    address = _get_pointer(cap, b"dltensor_versioned")
    view = tb.from_dlpack(cap)
    del cap, t
    gc.collect()
    assert address in _exports._MANAGED and alive() is not None
    assert view.tolist() == list(range(8))
    del view
    gc.collect()
    assert address not in _exports._MANAGED and alive() is None


def test_capsule_dropped_during_a_refusal_keeps_the_refusal():
    """A C consumer that refuses a capsule and frees it with its error set keeps that error."""
    t = tb.arange(4)
    alive = weakref.ref(t)
    fresh = (t.__dlpack__(max_version=(1, 0)) for _ in range(3))
    # map() frees each capsule right after int() refused it, with int()'s TypeError pending.
    with pytest.raises(TypeError, match="PyCapsule"):
        list(map(int, fresh))
    del t, fresh
    gc.collect()
    assert alive() is None


@_watched
def test_abandoned_capsules_are_reaped_by_exports():
    """Without any garbage collection, exports reap abandoned capsules once a few are pending."""
    gc.collect()
    t = tb.arange(8)
    alive = weakref.ref(t)
    t.__dlpack__()  # abandoned at once
    del t
    gc.disable()
    try:
        for _ in range(2 * _exports._PENDING_MIN):
            tb.arange(2).__dlpack__()
        assert alive() is None
        assert len(_exports._PENDING) < 2 * _exports._PENDING_MIN
    finally:
        gc.enable()


@_watched
def test_capsules_kept_by_the_caller_are_not_rescanned():
    """Capsules a caller keeps stay pending; the reaping bar rises so exports stay O(1)."""
    gc.collect()
    t = tb.arange(4)
    kept = [t.__dlpack__() for _ in range(100)]
    assert _exports._pending_bar >= 2 * 64  # doubled past the capsules still held
    assert all(capsule_name(c) == b"dltensor" for c in kept)
    del kept
    gc.collect()
    assert len(_exports._PENDING) == 0
    assert _exports._pending_bar == _exports._PENDING_MIN


def test_consumed_capsule_is_settled_and_freed_with_its_consumer():
    """Once consumed, the registry stops watching the capsule; the consumer's death frees it."""
    t = tb.arange(8)
    alive = weakref.ref(t)
    cap = t.__dlpack__(max_version=(1, 0))
    address = _get_pointer(cap, b"dltensor_versioned")
    view = tb.from_dlpack(cap)
    del t, cap
    gc.collect()
    assert address not in _exports._PENDING
    assert address in _exports._MANAGED
    del view
    gc.collect()
    assert alive() is None
    assert address not in _exports._MANAGED


def test_tensorbridge_deleter_runs_once_per_capsule(counting_exporter):
    """tensorbridge as consumer of its own capsules calls the deleter once per capsule."""
    exporter = counting_exporter(tb.arange(5))
    views = [tb.from_dlpack(exporter) for _ in range(3)]
    assert exporter.total == 0
    del views
    gc.collect()
    assert exporter.total == 3
    assert all(n == 1 for n in exporter.calls.values())


def test_rejected_export_is_not_a_system_error(crafted):
    """A consumer rejecting a capsule keeps its own error (no destructor clobbers it)."""
    # tensorbridge rejects a 2.0 capsule; dropping tensorbridge capsules meanwhile runs no code
    t = tb.arange(3)
    with pytest.raises(BufferError, match="major version"):
        tb.from_dlpack(crafted(version=(2, 1)).take())
    assert tb.from_dlpack(t.__dlpack__(max_version=(1, 0))).tolist() == [0, 1, 2]


def test_exit_with_live_imports_and_exports(subprocess_run):
    """Exit with live imports, exports and unconsumed capsules is clean (leak, never crash)."""
    code = f"""
        import sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from tensorbridge.testing import CraftedDLPack
        import tensorbridge as tb
        producer = CraftedDLPack()
        imported = tb.from_dlpack(producer.capsule)
        exported = tb.arange(10)
        capsules = [exported.__dlpack__(), exported.__dlpack__(max_version=(1, 0))]
        consumed = tb.from_dlpack(tb.utils.dlpack.to_dlpack(exported))
        cycle = [consumed]
        cycle.append(cycle)
        print("ok")
    """
    result = subprocess_run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert result.stderr == ""


# ------------------------------------------------------------------------- round trips and examples
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("route", ["capsule", "versioned", "object"])
def test_round_trip_every_dtype(dtype, route):
    """Every dtype round-trips through to_dlpack, a versioned capsule and a producer object."""
    x = sample(dtype)
    if route == "capsule":
        y = tb.from_dlpack(tb.utils.dlpack.to_dlpack(x))
    elif route == "versioned":
        y = tb.from_dlpack(x.__dlpack__(max_version=(1, 0)))
    else:
        y = tb.from_dlpack(Producer(x))
    check_view(y, x)


def test_layout_round_trip(layout):
    """Every layout of the matrix round-trips through versioned and legacy capsules."""
    name, t = layout
    for capsule in (t.__dlpack__(max_version=(1, 0)), tb.utils.dlpack.to_dlpack(t), Producer(t)):
        y = tb.from_dlpack(capsule)
        check_view(y, t, shared=name != "negative_step")
        if name == "negative_step":
            assert y.is_contiguous()
            assert y.tolist() == t.tolist()


def test_shared_storage():
    """from_dlpack(to_dlpack(x)) writes through to x."""
    x = tb.arange(4)
    z = tb.from_dlpack(tb.utils.dlpack.to_dlpack(x))
    z[0] = z[0].item() + 20
    assert x.tolist() == [20, 1, 2, 3]


@pytest.mark.parametrize("index", ["row", "column", "slice", "transpose"])
def test_non_contiguous_views(index):
    """Views of a 5x5 tensor round-trip with their strides."""
    x = tb.arange(25).reshape(5, 5)
    v = {"row": x[0], "column": x[:, 0], "slice": x[1, :], "transpose": x.t()}[index]
    for cap in (tb.utils.dlpack.to_dlpack(v), v.__dlpack__(max_version=(1, 0))):
        y = tb.from_dlpack(cap)
        assert y.stride() == v.stride()
        assert y.tolist() == v.tolist()
        assert y.data_ptr() == v.data_ptr()


def test_strides_are_kept():
    """A size-1 view keeps its stride (test_dlpack_normalize_strides)."""
    y = tb.arange(16)[::3][:1]
    assert tb.from_dlpack(tb.utils.dlpack.to_dlpack(y)).stride() == (3,)


@pytest.mark.parametrize("ndim", [0, 1, 2, 5, 17, 32, 64])
def test_higher_dims(ndim):
    """ndim 0..64 round-trip."""
    t = tb.arange(3).reshape((1,) * (ndim - 1) + (3,)) if ndim else tb.tensor(4)
    y = tb.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    assert y.shape == t.shape
    assert y.stride() == t.stride()
    assert y.data_ptr() == t.data_ptr()


def test_creation_functions_use_dlpack():
    """tb.tensor and tb.asarray accept an object that only has __dlpack__/__dlpack_device__."""
    x = tb.arange(6).reshape(2, 3)
    assert tb.tensor(Producer(x)).tolist() == x.tolist()
    assert tb.asarray(Producer(x)).tolist() == x.tolist()


def test_numel_and_nbytes_of_imported_layout(crafted):
    """The imported storage spans exactly the bytes the layout reaches."""
    producer = crafted(tuple(float(i) for i in range(12)), shape=(3, 2), strides=(4, -1))
    producer.managed.dl_tensor.byte_offset = 4
    t = tb.from_dlpack(producer.capsule)
    assert t._storage.nbytes == (2 * 4 + 1 + 1) * 4
    assert t.tolist() == [[1.0, 0.0], [5.0, 4.0], [9.0, 8.0]]
    assert math.prod(t.shape) == 6
