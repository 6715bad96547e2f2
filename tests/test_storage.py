"""Storage: one owner per block of memory, shared by every view, released exactly once."""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref
from typing import ClassVar

import pytest

import tensorbridge as tb
from tensorbridge import _capi, _storage
from tensorbridge._device import CPU
from tensorbridge._storage import ALIGNMENT, DLPackStorage, Storage, allocate, hold_buffer
from tensorbridge._tensor import Tensor


class _CountingOwner:
    """An owner that counts how often it is finalised."""

    released: ClassVar[list[str]] = []

    def __init__(self, name: str) -> None:
        self.name = name

    def __del__(self) -> None:
        _CountingOwner.released.append(self.name)


@pytest.mark.parametrize("nbytes", [0, 1, 7, 63, 64, 65, 1000, 4096 + 3])
def test_allocate_is_zeroed_and_aligned(nbytes):
    """allocate() gives zero-filled, 64-byte aligned, writable host memory of the requested size."""
    storage = allocate(nbytes)
    assert storage.nbytes == nbytes and storage.device == CPU and not storage.readonly
    assert storage.ptr % ALIGNMENT == 0 and ALIGNMENT == 64
    view = storage.host_view("test")
    assert view.format == "B" and not view.readonly and len(view) == nbytes
    assert bytes(view) == bytes(nbytes)
    if nbytes:
        view[-1] = 255
        assert ctypes.c_uint8.from_address(storage.ptr + nbytes - 1).value == 255


def test_new_tensors_are_aligned():
    """Every creation function returns 64-byte aligned memory (what JAX needs to import without copying)."""
    for t in (
        tb.zeros(3),
        tb.ones(5, dtype=tb.int8),
        tb.arange(7),
        tb.tensor([1.5]),
        tb.arange(9)[1:].clone(),
        tb.full((3,), 2),
    ):
        assert t.data_ptr() % 64 == 0


def test_allocate_refuses_device_memory_and_impossible_sizes():
    """Device memory and sizes past the address space are clear errors."""
    with pytest.raises(
        BufferError,
        match=r"allocate\(\): tensorbridge allocates host memory only; cannot allocate"
        r" on cuda:0",
    ):
        allocate(8, tb.device("cuda:0"))
    with pytest.raises(
        MemoryError, match=r"allocate\(\): cannot allocate \d+ bytes of host memory"
    ):
        allocate(sys.maxsize)


def test_host_view_of_device_memory_is_refused():
    """A storage on a device the host cannot read refuses host_view with BufferError naming the API."""
    storage = Storage(0x1000, 64, tb.device("cuda:0"), False, object())
    with pytest.raises(BufferError, match=r"tolist\(\): the tensor's memory is on cuda:0"):
        storage.host_view("tolist")
    t = Tensor._new(storage, 0, (16,), (1,), tb.float32)
    assert t.device == tb.device("cuda:0") and t.shape == (16,) and t.data_ptr() == 0x1000
    with pytest.raises(BufferError, match="cannot be read or written on the host"):
        t.tolist()
    with pytest.raises(BufferError, match="cannot be read or written on the host"):
        t[0] = 1


def test_views_share_one_storage_released_once():
    """Every view holds the same storage; the owner dies exactly once, after the last view."""
    _CountingOwner.released.clear()
    block = (ctypes.c_char * 32)()
    storage = Storage(ctypes.addressof(block), 32, CPU, False, _CountingOwner("a"))
    base = Tensor._new(storage, 0, (8,), (1,), tb.int32)
    views = [
        base[1:],
        base.view(2, 4),
        base.view(2, 4).T,
        base.expand(3, 8),
        base[::-2],
        base.unbind(0)[3],
        base.detach(),
        base.as_strided((2,), (3,), 1),
    ]
    assert all(v._storage is storage for v in views)
    ref = weakref.ref(storage)
    del storage, base
    gc.collect()
    assert _CountingOwner.released == []
    views[0][0] = 7
    assert views[1].tolist()[0][1] == 7
    del views
    gc.collect()
    assert ref() is None
    assert _CountingOwner.released == ["a"]


def test_copies_do_not_keep_the_source_alive():
    """clone(), contiguous() of a strided view and to(dtype) own new memory."""
    _CountingOwner.released.clear()
    block = (ctypes.c_char * 16)()
    base = Tensor._new(
        Storage(ctypes.addressof(block), 16, CPU, False, _CountingOwner("b")),
        0,
        (4,),
        (1,),
        tb.int32,
    )
    copies = [base.clone(), base[::2].contiguous(), base.to(tb.float64), base[[0, 1]]]
    assert all(c._storage is not base._storage for c in copies)
    del base
    gc.collect()
    assert _CountingOwner.released == ["b"]
    assert copies[0].tolist() == [0, 0, 0, 0]


def test_tensor_new_checks_bounds():
    """Tensor._new refuses layouts outside the storage, with negative strides and offsets considered."""
    storage = allocate(16)
    assert Tensor._new(storage, 3, (4,), (-1,), tb.int32).tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"f\(\): sizes \[4\], strides \[-1\], storage offset 2"):
        Tensor._new(storage, 2, (4,), (-1,), tb.int32, "f")
    with pytest.raises(
        ValueError, match="requiring a storage size of 20 are out of bounds for storage of size 16"
    ):
        Tensor._new(storage, 1, (4,), (1,), tb.int32)
    with pytest.raises(ValueError, match="invalid storage offset -1"):
        Tensor._new(storage, -1, (0,), (1,), tb.int32)
    assert (
        Tensor._new(storage, 4, (0, 5), (9, 9), tb.int32).numel() == 0
    )  # empty: only the offset matters


def test_hold_buffer_keeps_the_export_until_the_owner_dies():
    """A held bytearray cannot be resized while any view lives; the export is released exactly once."""
    data = bytearray(b"\x01\x02\x03\x04")
    refs = sys.getrefcount(data)
    owner, view = hold_buffer(data, _capi.PY_BUF_WRITABLE)
    storage = Storage(view.buf, view.len, CPU, bool(view.readonly), owner)
    t = Tensor._new(storage, 0, (4,), (1,), tb.uint8)
    del owner, storage, view  # the view is part of the hold: it releases the export when it dies
    with pytest.raises(BufferError, match="Existing exports of data: object cannot be re-sized"):
        data.append(5)
    t[0] = 9
    assert data[0] == 9
    del t
    gc.collect()
    data.append(5)  # released: resizing works again
    assert sys.getrefcount(data) == refs  # each reference taken was dropped exactly once
    assert bytes(data) == b"\x09\x02\x03\x04\x05"


def test_hold_buffer_passes_the_exporter_errors_through():
    """A failing PyObject_GetBuffer raises the exporter's own exception."""
    with pytest.raises(BufferError, match="Object is not writable"):
        hold_buffer(b"abc", _capi.PY_BUF_WRITABLE)
    with pytest.raises(TypeError, match="a bytes-like object is required"):
        hold_buffer([1, 2, 3], _capi.PY_BUF_SIMPLE)


def test_dlpack_storage_calls_the_deleter_exactly_once():
    """A DLPack storage calls deleter(managed) once, after its last view; unarmed, it calls nothing."""
    calls: list[int] = []

    @_dlpack_deleter
    def deleter(addr: int) -> None:
        calls.append(addr)

    storage = DLPackStorage(0, 0, CPU, False, False, 0xABC0)
    storage.deleter = deleter
    views = [Tensor._new(storage, 0, (0,), (1,), tb.float32) for _ in range(3)]
    del storage
    gc.collect()
    assert calls == []
    del views
    gc.collect()
    assert calls == [0xABC0]
    unarmed = DLPackStorage(0, 0, CPU, False, False, 0x10)
    del unarmed
    gc.collect()
    assert calls == [0xABC0]


def test_dlpack_storage_is_its_own_owner_without_a_cycle():
    """owner is the storage itself, computed, so the storage dies (and releases) without gc."""
    calls: list[int] = []
    deleter = _dlpack_deleter(calls.append)
    storage = DLPackStorage(0x1000, 8, CPU, True, True, 0x20)
    storage.deleter = deleter
    assert storage.owner is storage and storage.readonly and storage.is_copied
    assert repr(storage).endswith("owner=DLPackStorage>")
    gc.disable()
    try:
        del storage
        assert calls == [0x20]
    finally:
        gc.enable()


def _dlpack_deleter(fn):
    from tensorbridge._dlpack_abi import DLPackDeleter

    return DLPackDeleter(fn)


def test_owners_leak_instead_of_running_at_interpreter_exit(subprocess_run):
    """Owners alive at exit do not call the deleter or release the buffer during finalisation."""
    code = """
        import ctypes
        import tensorbridge as tb
        from tensorbridge import _capi, _storage
        from tensorbridge._dlpack_abi import DLPackDeleter

        @DLPackDeleter
        def deleter(addr):
            print("deleter ran", flush=True)

        dlpack = _storage.DLPackStorage(0x1234, 0, tb.device("cpu"), False, False, 0x1234)
        dlpack.deleter = deleter
        KEEP = [dlpack, _storage.hold_buffer(bytearray(8), _capi.PY_BUF_WRITABLE),
                tb.arange(1000).reshape(10, 100)[::2]]
        print("ok", flush=True)
    """
    result = subprocess_run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_storage_repr_names_the_owner():
    """repr(storage) shows the range, device, flags and the owner's type."""
    storage = allocate(8)
    text = repr(storage)
    assert text.startswith(
        f"<Storage ptr=0x{storage.ptr:x} nbytes=8 device=cpu readonly=False owner="
    )
    assert text.endswith("_Allocation>")
    assert _storage.__all__ == ["ALIGNMENT", "Storage", "allocate"]
