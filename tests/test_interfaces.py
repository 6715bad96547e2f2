"""__array_interface__ and __cuda_array_interface__: import through asarray, CAI export, wrap_memory.

Imports are checked against the producer's own metadata (same pointer, shape, element strides, dtype,
device, read-only flag, owner); lifetimes with weakrefs; malformed interfaces with crafted dicts.
CUDA memory is represented by fake pointers: tensorbridge must carry them and never read them.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref
from typing import Any

import pytest

import tensorbridge as tb
from tensorbridge import _cuda, _interface_export, _interfaces
from tensorbridge._convert import _dispatch_path

FAKE_CUDA_PTR = 0x7F00_0000_0000  # never mapped on the host: reading it would crash


class Exporter:
    """An object that exposes only an interface dict and owns the memory behind it."""

    def __init__(
        self, iface: dict[str, Any], memory: object = None, attr: str = "__array_interface__"
    ):
        self.memory = memory
        setattr(self, attr, iface)


def _int32_memory(values: list[int]) -> tuple[ctypes.Array, int]:
    buf = (ctypes.c_int32 * len(values))(*values)
    return buf, ctypes.addressof(buf)


def _iface(ptr: int, shape: tuple[int, ...], typestr: str = "<i4", **extra: Any) -> dict[str, Any]:
    return {"data": (ptr, False), "shape": shape, "typestr": typestr, "version": 3, **extra}


def _check_view(
    t: tb.Tensor,
    ptr: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: tb.dtype,
    device: str,
    readonly: bool,
    owner: object,
) -> None:
    """One place that asserts everything an import must preserve."""
    assert t.data_ptr() == ptr
    assert tuple(t.shape) == shape
    assert t.stride() == strides
    assert t.dtype is dtype
    assert t.device == tb.device(device)
    assert t.is_readonly is readonly
    held = t._storage.owner
    assert held is owner or (isinstance(held, tuple) and owner in held)


# ---------------------------------------------------------------------------------------------- array interface
def test_array_interface_tuple_data_shares_memory():
    """A (pointer, False) interface gives a writable view of exactly that memory, owned by the exporter."""
    buf, ptr = _int32_memory([1, 2, 3, 4, 5, 6])
    obj = Exporter(_iface(ptr, (2, 3)), buf)
    t = tb.asarray(obj)
    _check_view(t, ptr, (2, 3), (3, 1), tb.int32, "cpu", False, obj)
    t[1, 2] = -7
    assert buf[5] == -7


@pytest.mark.parametrize(
    ("shape", "strides", "expected"),
    [((1, 3), (-6, 4), (3, 1)), ((3, 1), (4, 7), (1, 1)), ((0, 3), (6, 4), (3, 1))],
)
def test_array_interface_idle_strides_need_not_be_whole_elements(shape, strides, expected):
    """A size-1 dimension's stride, and every stride of an empty array, addresses nothing: one that
    is not whole elements is read as the row-major stride (NumPy exports such strides to DLPack)."""
    buf, ptr = _int32_memory([1, 2, 3])
    obj = Exporter(_iface(ptr, shape, strides=strides), buf)
    t = tb.asarray(obj)
    _check_view(t, ptr, shape, expected, tb.int32, "cpu", False, obj)
    assert t.tolist() == ([[1, 2, 3]] if shape == (1, 3) else [[1], [2], [3]] if shape[0] else [])


def test_array_interface_readonly_flag_gives_readonly_tensor():
    """data=(ptr, True) makes a tensor whose writes raise and leave the memory unchanged."""
    buf, ptr = _int32_memory([1, 2])
    t = tb.asarray(Exporter({**_iface(ptr, (2,)), "data": (ptr, True)}, buf))
    assert t.is_readonly
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 5
    assert list(buf) == [1, 2]


def test_array_interface_byte_strides_become_element_strides():
    """Byte strides, negative ones included, convert to element strides over the same elements."""
    buf, base = _int32_memory(list(range(12)))
    # rows reversed, every other column: first element is row 2, column 0.
    obj = Exporter(_iface(base + 8 * 4, (3, 2), strides=(-16, 8)), buf)
    t = tb.asarray(obj)
    _check_view(t, base + 32, (3, 2), (-4, 2), tb.int32, "cpu", False, obj)
    assert t.tolist() == [[8, 10], [4, 6], [0, 2]]


def test_array_interface_keeps_exporter_alive():
    """The exporter lives while any view lives, and is collected after the last one dies."""
    buf, ptr = _int32_memory([1, 2, 3])
    obj = Exporter(_iface(ptr, (3,)), buf)
    ref = weakref.ref(obj)
    view = tb.asarray(obj)[1:]
    del obj, buf
    gc.collect()
    assert ref() is not None
    assert view.tolist() == [2, 3]
    del view
    gc.collect()
    assert ref() is None


def test_array_interface_buffer_data_is_held_and_bounds_checked():
    """data given as a buffer object: its export is held open, offset applies, and the layout must fit."""
    data = bytearray(range(16))
    t = tb.asarray(
        Exporter({"data": data, "offset": 4, "shape": (3,), "typestr": "|u1", "version": 3})
    )
    assert t.tolist() == [4, 5, 6]
    with pytest.raises(BufferError):
        data.append(0)  # the export is held while the tensor lives
    del t
    gc.collect()
    data.append(0)
    with pytest.raises(ValueError, match="outside the 12 bytes"):
        tb.asarray(
            Exporter(
                {"data": bytearray(16), "offset": 4, "shape": (4,), "typestr": "<i4", "version": 3}
            )
        )


def test_array_interface_without_data_uses_the_objects_own_buffer():
    """No 'data' key: the memory comes from the exporter's own buffer, read-only if it is."""

    class Raw(bytes):
        pass

    obj = Raw(b"\x01\x00\x02\x00")
    obj.__array_interface__ = {"shape": (2,), "typestr": "<u2", "version": 3}  # type: ignore[attr-defined]
    t = tb.asarray(obj)
    assert t.tolist() == [1, 2]
    assert t.is_readonly


def test_array_interface_descr_for_simple_type_is_accepted():
    """A descr that restates the typestr is fine; NumPy always writes one."""
    buf, ptr = _int32_memory([9])
    t = tb.asarray(Exporter(_iface(ptr, (1,), descr=[("", "<i4")]), buf))
    assert t.tolist() == [9]


def test_array_interface_zero_size_accepts_null():
    """A zero-size array may have a NULL data pointer."""
    t = tb.asarray(Exporter(_iface(0, (0, 3), "<f8")))
    assert tuple(t.shape) == (0, 3)
    assert t.dtype is tb.float64


def test_array_interface_keeps_numpy_scalar_ref():
    """An interface that names the array its memory belongs to under '__ref' (NumPy before 2.5
    gives a scalar's interface one: a temporary array) has the storage keep that array."""
    np = pytest.importorskip("numpy")
    temporary = np.array(2.5)
    iface = {**temporary.__array_interface__, "__ref": temporary}
    ref = weakref.ref(temporary)
    del temporary
    t = tb.asarray(Exporter(iface))
    del iface
    gc.collect()
    assert t.item() == 2.5
    assert ref() is not None and any(o is ref() for o in t._storage.owner)


def test_array_interface_of_a_numpy_scalar_keeps_its_memory():
    """NumPy 2.5 points a scalar's interface into the scalar itself (read-only, no '__ref'), older
    NumPy into a temporary under '__ref': an alias of either keeps that memory alive."""
    np = pytest.importorskip("numpy")
    scalar = np.float64(2.5)
    t = _interfaces.import_array_interface(scalar, scalar.__array_interface__, "asarray")
    del scalar
    gc.collect()
    assert t.item() == 2.5


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"typestr": ">i4"}, BufferError, "non-native byte order"),
        ({"typestr": "<U4"}, BufferError, "not supported"),
        ({"typestr": "<f16"}, BufferError, "not supported"),
        ({"typestr": "i4"}, BufferError, "not supported"),
        ({"typestr": 4}, TypeError, "typestr"),
        ({"descr": [("a", "<i4"), ("b", "<i4")]}, BufferError, "structured"),
        ({"shape": (-1,)}, ValueError, "non-negative"),
        ({"shape": [2] * 65}, ValueError, "at most 64"),
        ({"shape": "2"}, TypeError, "shape"),
        ({"shape": (2.0,)}, TypeError, "int"),
        ({"shape": (2**62, 2**62)}, ValueError, "more than 2\\*\\*63 - 1 elements"),
        ({"shape": (2,), "strides": (3,)}, BufferError, "multiples of the itemsize"),
        ({"strides": (4, 4)}, ValueError, "2 strides for 1 dimensions"),
        ({"version": 2}, BufferError, "version 2"),
        ({"version": True}, BufferError, "version True"),
        ({"mask": object()}, BufferError, "mask"),
        ({"data": (None, False)}, TypeError, "data pointer"),
        ({"data": (-8, False)}, ValueError, "non-negative"),
        ({"data": (1, 2, 3)}, TypeError, r"must be a \(pointer, read_only\) tuple"),
        ({"data": 42}, TypeError, "does not export one"),
        ({"data": (0, False)}, ValueError, "NULL"),
        ({"data": (2**64 - 4, False), "shape": (4,)}, ValueError, "outside the address space"),
    ],
)
def test_array_interface_bad_metadata_is_refused(change, exc, match):
    """Malformed or unsupported interface metadata raises a clear error before any memory is touched."""
    iface = {**_iface(0x1000, (1,)), **change}
    with pytest.raises(exc, match=match):
        tb.asarray(Exporter(iface))


@pytest.mark.parametrize("missing", ["shape", "typestr", "version"])
def test_array_interface_missing_key_is_refused(missing):
    """Each required key missing is a ValueError that names it."""
    iface = _iface(0x1000, (1,))
    del iface[missing]
    with pytest.raises(ValueError, match=repr(missing)):
        tb.asarray(Exporter(iface))


def test_array_interface_not_a_dict_is_refused():
    """An interface that is not a dict is a TypeError."""
    with pytest.raises(TypeError, match="must be a dict"):
        tb.asarray(Exporter([1, 2]))  # type: ignore[arg-type]


def test_array_interface_huge_strides_overflow_in_a_subprocess(subprocess_run):
    """Strides that reach past the address space are refused, never dereferenced."""
    proc = subprocess_run("""
        import tensorbridge as tb
        class E:
            __array_interface__ = {"data": (4096, False), "shape": (3,), "typestr": "<i8",
                                   "strides": (2**62,), "version": 3}
        try:
            tb.asarray(E())
        except ValueError as exc:
            print("refused", "address space" in str(exc))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["refused", "True"]


def test_array_interface_layout_round_trip(layout):
    """Every layout in the matrix survives export as an interface dict and import through asarray."""
    _, src = layout
    t = tb.asarray(Exporter(_interface_export.interface_dict(src, src.dtype.typestr), src))
    assert t.data_ptr() == (src.data_ptr() if src.numel() else 0)  # empty: the spec's NULL pointer
    assert t.tolist() == src.tolist()
    assert tuple(t.shape) == tuple(src.shape)
    nontrivial = [
        i for i, n in enumerate(src.shape) if n > 1 and src.numel()
    ]  # these strides mean something
    assert [t.stride(i) for i in nontrivial] == [src.stride(i) for i in nontrivial]


def test_array_interface_numpy_negative_strides():
    """A NumPy array with negative strides imports through its array interface with the same view."""
    np = pytest.importorskip("numpy")
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[::-1, ::-2]
    obj = Exporter(a.__array_interface__, a)
    t = tb.asarray(obj)
    assert _dispatch_path(obj) == "array_interface"
    _check_view(
        t, a.ctypes.data, a.shape, tuple(s // 4 for s in a.strides), tb.float32, "cpu", False, obj
    )
    assert t.tolist() == a.tolist()


def test_array_interface_numpy_readonly():
    """A read-only NumPy array gives a read-only tensor through its array interface."""
    np = pytest.importorskip("numpy")
    a = np.arange(3)
    a.flags.writeable = False
    assert tb.asarray(Exporter(a.__array_interface__, a)).is_readonly


def test_array_interface_exported_to_numpy_shares_memory():
    """interface_dict is what NumPy reads: np.asarray over it sees the tensor's memory."""
    np = pytest.importorskip("numpy")
    t = tb.arange(6, dtype=tb.int64).reshape(2, 3)
    a = np.asarray(Exporter(_interface_export.interface_dict(t, t.dtype.typestr), t))
    assert a.ctypes.data == t.data_ptr()
    a[0, 0] = 42
    assert t[0, 0].item() == 42


# ---------------------------------------------------------------------------------------------- CUDA array interface
class FakeDriver:
    """Stands in for libcuda: reports a device for any pointer and records synchronisations."""

    def __init__(self, device: int = 1):
        self.device = device
        self.synced: list[tuple[int, int]] = []

    def pointer_device(self, ptr: int, api: str) -> int:
        return self.device

    def synchronize(self, stream: int, device: int, api: str) -> None:
        self.synced.append((stream, device))


@pytest.fixture
def no_driver(monkeypatch):
    """Pretend no CUDA driver is installed."""
    monkeypatch.setattr(_cuda, "driver", lambda: None)


@pytest.fixture
def fake_driver(monkeypatch):
    """Pretend a CUDA driver is installed, and return it."""
    driver = FakeDriver()
    monkeypatch.setattr(_cuda, "driver", lambda: driver)
    return driver


def _cai(**extra: Any) -> dict[str, Any]:
    return {
        "data": (FAKE_CUDA_PTR, False),
        "shape": (2, 3),
        "typestr": "<f4",
        "version": 3,
        **extra,
    }


def test_cai_import_carries_pointer_without_reading(no_driver):
    """A CUDA interface imports as a cuda tensor over the same pointer; host access raises instead."""
    obj = Exporter(_cai(strides=(4, 8)), attr="__cuda_array_interface__")
    t = tb.asarray(obj)
    _check_view(t, FAKE_CUDA_PTR, (2, 3), (1, 2), tb.float32, "cuda:0", False, obj)
    with pytest.raises(BufferError, match="cannot be read"):
        t.tolist()


def test_cai_import_device_comes_from_the_driver(fake_driver):
    """With a driver, the device number is the pointer's, and stream=None needs no synchronisation."""
    t = tb.asarray(Exporter(_cai(stream=None), attr="__cuda_array_interface__"))
    assert t.device == tb.device("cuda", 1)
    assert fake_driver.synced == []


@pytest.mark.parametrize("stream", [1, 2, 0xABC000])
def test_cai_stream_is_synchronised(fake_driver, stream):
    """A v3 stream is synchronised (on the pointer's device) before the tensor exists."""
    tb.asarray(Exporter(_cai(stream=stream), attr="__cuda_array_interface__"))
    assert fake_driver.synced == [(stream, 1)]


def test_cai_stream_without_driver_is_refused(no_driver):
    """No driver to synchronise with: a stream is refused rather than raced."""
    with pytest.raises(BufferError, match="no CUDA driver"):
        tb.asarray(Exporter(_cai(stream=7), attr="__cuda_array_interface__"))


@pytest.mark.parametrize(
    ("stream", "exc"), [(0, ValueError), (-3, ValueError), (True, TypeError), ("1", TypeError)]
)
def test_cai_bad_stream_is_refused(fake_driver, stream, exc):
    """Stream 0 is disallowed by the spec; negatives and non-ints are refused too."""
    with pytest.raises(exc, match="stream"):
        tb.asarray(Exporter(_cai(stream=stream), attr="__cuda_array_interface__"))
    assert fake_driver.synced == []


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"mask": (FAKE_CUDA_PTR, False)}, BufferError, "mask"),
        ({"version": 4}, BufferError, "version 4"),
        ({"typestr": ">f4"}, BufferError, "non-native"),
        ({"data": (0, False)}, ValueError, "NULL"),
        ({"data": FAKE_CUDA_PTR}, TypeError, "data"),
        ({"strides": (4, 2)}, BufferError, "multiples"),
    ],
)
def test_cai_bad_metadata_is_refused(no_driver, change, exc, match):
    """The CUDA interface gets the same metadata checks as the array interface."""
    with pytest.raises(exc, match=match):
        tb.asarray(Exporter(_cai(**change), attr="__cuda_array_interface__"))


def test_cai_missing_data_is_refused(no_driver):
    """The CUDA interface has no buffer fallback: 'data' is required."""
    iface = _cai()
    del iface["data"]
    with pytest.raises(ValueError, match="'data'"):
        tb.asarray(Exporter(iface, attr="__cuda_array_interface__"))


def test_cai_older_versions_accepted(no_driver):
    """Versions 0-2 (no stream key) are subsets of 3 and import the same way."""
    t = tb.asarray(Exporter(_cai(version=2), attr="__cuda_array_interface__"))
    assert t.is_cuda


def test_cai_readonly_flag(no_driver):
    """data=(ptr, True) gives a read-only CUDA tensor."""
    t = tb.asarray(Exporter(_cai(data=(FAKE_CUDA_PTR, True)), attr="__cuda_array_interface__"))
    assert t.is_readonly


def test_cai_copy_is_refused_not_read(no_driver):
    """copy=True would read device memory on the host: it raises instead."""
    with pytest.raises(BufferError, match="cannot be read"):
        tb.asarray(Exporter(_cai(), attr="__cuda_array_interface__"), copy=True)


def test_cai_export_round_trip(fake_driver):
    """A CUDA tensor exports version-3 metadata that imports back to the same view."""
    fake_driver.device = 0
    t = tb.from_pointer(FAKE_CUDA_PTR, (4, 6), tb.float16, device="cuda:0")[::2, 1:]
    iface = t.__cuda_array_interface__
    assert iface["version"] == 3
    assert iface["typestr"] == "<f2"
    assert iface["data"] == (t.data_ptr(), False)
    assert iface["strides"] == (24, 2)
    assert iface["stream"] == 1
    back = tb.asarray(Exporter(iface, attr="__cuda_array_interface__"))
    _check_view(
        back, t.data_ptr(), (2, 5), (12, 1), tb.float16, "cuda:0", False, back._storage.owner
    )
    assert fake_driver.synced == [(1, 0)]  # the exported legacy-stream ordering is honoured


def test_cai_export_stream_needs_a_driver_to_import(no_driver):
    """Re-importing an exported CUDA tensor asks for legacy-stream ordering, impossible without a driver."""
    t = tb.from_pointer(FAKE_CUDA_PTR, (2,), tb.float32, device="cuda:0")
    with pytest.raises(BufferError, match="stream 0x1"):
        tb.asarray(Exporter(t.__cuda_array_interface__, attr="__cuda_array_interface__"))


def test_cai_export_contiguous_has_no_strides():
    """A C-contiguous CUDA tensor exports strides=None, as the spec prefers."""
    t = tb.from_pointer(FAKE_CUDA_PTR, (2, 2), tb.int32, device="cuda", readonly=True)
    iface = t.__cuda_array_interface__
    assert iface["strides"] is None
    assert iface["data"] == (FAKE_CUDA_PTR, True)


def test_cai_export_empty_tensor_has_null_pointer():
    """A zero-size CUDA tensor exports data pointer 0, as the spec requires."""
    t = tb.from_pointer(FAKE_CUDA_PTR, (0, 3), tb.int32, device="cuda")
    assert t.__cuda_array_interface__["data"] == (0, False)


def test_cai_absent_on_cpu_tensors():
    """hasattr(cpu_tensor, '__cuda_array_interface__') is False, as for PyTorch CPU tensors."""
    assert not hasattr(tb.arange(3), "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="non-CUDA tensor"):
        _ = tb.arange(3).__cuda_array_interface__


def test_cai_export_refuses_requires_grad():
    """A CUDA tensor that requires grad is refused with PyTorch's text."""
    t = tb.from_pointer(FAKE_CUDA_PTR, (2,), tb.float32, device="cuda").requires_grad_()
    with pytest.raises(
        RuntimeError, match="Can't get __cuda_array_interface__ on Variable that requires grad"
    ):
        _ = t.__cuda_array_interface__


def test_cai_export_absent_for_dtypes_without_typestr():
    """bfloat16 has no typestr: the attribute is absent, so consumers fall back to DLPack."""
    t = tb.from_pointer(FAKE_CUDA_PTR, (2,), tb.bfloat16, device="cuda")
    assert not hasattr(t, "__cuda_array_interface__")


def test_cai_fake_pointer_never_read_in_subprocess(subprocess_run):
    """Printing, tolist and copies of an imported CUDA tensor raise; the process never crashes."""
    proc = subprocess_run(f"""
        import tensorbridge as tb
        from tensorbridge import _cuda
        _cuda.driver = lambda: None
        class E:
            __cuda_array_interface__ = {{"data": ({FAKE_CUDA_PTR}, False), "shape": (3,),
                                         "typestr": "<f4", "version": 3}}
        t = tb.asarray(E())
        for op in (t.tolist, t.clone, t.contiguous().clone, lambda: t[0].item(), lambda: t.fill_(1)):
            try:
                op()
            except BufferError:
                print("refused")
        print(repr(t.device), t.data_ptr() == {FAKE_CUDA_PTR})
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:5] == ["refused"] * 5
    assert lines[5] == "device(type='cuda', index=0) True"


# ---------------------------------------------------------------------------------------------- CUDA driver lookup
def test_cuda_driver_absent_or_initialised():
    """The driver loader returns None or a driver whose cuInit succeeded; it never raises."""
    _cuda.driver.cache_clear()
    driver = _cuda.driver()
    assert driver is None or hasattr(driver, "synchronize")


# ---------------------------------------------------------------------------------------------- wrap_memory
def test_wrap_memory_storage_spans_exactly_the_layout():
    """Without an extent, the storage covers exactly the bytes the layout reaches (negative strides too)."""
    t = _interfaces.wrap_memory(
        0x10000,
        0,
        (3, 2),
        (-4, 1),
        tb.int32,
        device=tb.device("cpu"),
        readonly=True,
        owner=None,
        api="x",
    )
    assert t._storage.ptr == 0x10000 - 8 * 4
    assert t._storage.nbytes == 10 * 4
    assert t.data_ptr() == 0x10000


def test_wrap_memory_extent_is_checked():
    """With an extent, a layout reaching outside it is a ValueError."""
    with pytest.raises(ValueError, match="outside the 16 bytes"):
        _interfaces.wrap_memory(
            0x10000,
            1,
            (4,),
            (1,),
            tb.int32,
            device=tb.device("cpu"),
            readonly=False,
            owner=None,
            api="x",
            nbytes=16,
        )


@pytest.mark.skipif(sys.maxsize < 2**63 - 1, reason="64-bit address arithmetic")
def test_wrap_memory_refuses_address_wraparound():
    """An address range that would wrap past 2**64 is refused."""
    with pytest.raises(ValueError, match="address space"):
        _interfaces.wrap_memory(
            2**64 - 8,
            0,
            (4,),
            (1,),
            tb.int32,
            device=tb.device("cpu"),
            readonly=False,
            owner=None,
            api="x",
        )


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 4)])
def test_empty_tensor_array_interface_has_a_valid_pointer(shape):
    """A tensor without elements gives ``__array_interface__`` a non-NULL, 64-byte aligned data
    pointer (NumPy before 2.4 refuses NULL); the CUDA interface keeps 0, as its specification
    asks."""
    t = tb.zeros(shape)
    ptr, readonly = t.__array_interface__["data"]
    assert ptr != 0
    assert ptr % 64 == 0
    assert readonly is False
    assert t.__array_interface__["shape"] == shape
    cuda = tb.from_pointer(0, shape, tb.float32, device="cuda:0")
    assert cuda.__cuda_array_interface__["data"][0] == 0
