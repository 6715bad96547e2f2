"""One test per safety guarantee that SECURITY.md states, named after it.

Each test fails when its guarantee is broken (the soak, thread, exit, hostile and fault suites
test them at scale). The last one is the ownership rule the others rest on: memory has one owner,
views share it, and the owner releases it exactly once, when the last view dies.

A broken guarantee often crashes rather than fails (a deleter called twice frees twice; a write to a
read-only mapping faults), so every test runs in a forked child (`crafted.isolated`): a crash fails
that test alone, with the signal that killed it.
"""

from __future__ import annotations

import array
import ctypes
import gc
import mmap
import sys
import weakref
from typing import Any

import pytest
from tests.conftest import needs_mortal_classes
from tests.soak import crafted

import tensorbridge as tb
from tensorbridge import _capi, testing
from tensorbridge import _dlpack_abi as abi


def _numpy() -> Any:
    """NumPy when it is installed (its views are then checked too), else None."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _floats(*values: float) -> Any:
    return (ctypes.c_float * len(values))(*values)


# --------------------------------------------------------------------------------------------------
# 1. A buffer stays exported while any view of it lives: a bytearray cannot be resized, an mmap
#    cannot be closed.


def _views_of(t: tb.Tensor) -> list[Any]:
    """Views that reach ``t``'s memory by every route: slicing, reshaping, DLPack and memoryview."""
    views = [
        t[1:],
        t.view(2, -1)[::-1],
        tb.from_dlpack(t),
        tb.from_dlpack(t.__dlpack__(max_version=(1, 3))),
        t.as_memoryview(),
    ]
    np = _numpy()
    if np is not None:
        views += [np.from_dlpack(t), np.asarray(t)]
    return views


@pytest.mark.parametrize("kind", ["bytearray", "mmap", "memoryview", "array.array"])
@crafted.isolated
def test_buffer_stays_exported_while_any_view_lives(kind: str) -> None:
    """While any view of a frombuffer tensor lives, its exporter cannot be resized, closed or
    released; once the last one dies it can, and the export was released exactly once (refcount
    back)."""
    exporter: Any = {
        "bytearray": lambda: bytearray(64),
        "mmap": lambda: mmap.mmap(-1, 64),
        "memoryview": lambda: memoryview(bytearray(64)),
        "array.array": lambda: array.array("i", range(16)),
    }[kind]()
    refs = sys.getrefcount(exporter)

    def disturb() -> None:
        if kind in ("bytearray", "array.array"):
            exporter.extend(exporter[:4])
        elif kind == "mmap":
            exporter.close()
        else:
            exporter.release()

    t = tb.frombuffer(exporter, dtype=tb.int32)
    views = _views_of(t)
    del t
    while views:
        with pytest.raises(BufferError):
            disturb()
        views.pop()
        gc.collect()
    gc.collect()
    assert sys.getrefcount(exporter) == refs
    disturb()


# --------------------------------------------------------------------------------------------------
# 2. Sizes are computed without overflow; a request larger than the buffer is a ValueError, never a
#    tensor.


def _unpickle_lie() -> tb.Tensor:
    """A pickle whose metadata claims 2**62 elements over the 16 bytes it carries."""
    rebuild, (data, dtype, _, _, offset, readonly, grad) = tb.arange(2).__reduce_ex__(2)
    return rebuild(data, dtype, (2**62,), (1,), offset, readonly, grad)


_STORE = (ctypes.c_char * 64)()
_OVERSIZED = {
    "frombuffer count 2**62+1": lambda: tb.frombuffer(
        bytearray(8), dtype=tb.float32, count=2**62 + 1
    ),
    "frombuffer count wrapping 2**64": lambda: tb.frombuffer(
        bytearray(8), dtype=tb.float32, count=2**62
    ),
    "frombuffer count wrapping with offset": lambda: tb.frombuffer(
        bytearray(8), dtype=tb.int64, count=2**61 - 1, offset=4
    ),
    "frombuffer offset 2**64": lambda: tb.frombuffer(bytearray(8), dtype=tb.uint8, offset=2**64),
    "frombuffer one element too many": lambda: tb.frombuffer(bytearray(8), dtype=tb.int32, count=3),
    "as_strided past the end": lambda: tb.arange(8).as_strided((2,), (2**62,)),
    "as_strided wrapping": lambda: tb.arange(8).as_strided((2**62, 4), (4, 1)),
    "as_strided offset 2**63": lambda: tb.arange(8).as_strided((1,), (1,), 2**63),
    "from_pointer beyond nbytes": lambda: tb.from_pointer(
        ctypes.addressof(_STORE), (2**62, 4), tb.float64, owner=_STORE, nbytes=64
    ),
    "from_pointer bytes overflowing": lambda: tb.from_pointer(
        ctypes.addressof(_STORE), (2**61, 2**61), tb.float64, owner=_STORE
    ),
    "array interface beyond its buffer": lambda: tb.asarray(
        type(
            "I",
            (),
            {
                "__array_interface__": {
                    "version": 3,
                    "typestr": "<f8",
                    "shape": (2**62,),
                    "data": bytearray(8),
                }
            },
        )()
    ),
    "unpickled shape beyond its bytes": _unpickle_lie,
}


@pytest.mark.parametrize("case", list(_OVERSIZED))
@crafted.isolated
def test_sizes_are_computed_without_overflow(case: str) -> None:
    """A request larger than the memory behind it is a ValueError, however its size wraps in 64
    bits."""
    with pytest.raises(ValueError):
        _OVERSIZED[case]()


# --------------------------------------------------------------------------------------------------
# 3. Read-only memory gives read-only tensors; writes raise; DLPack READ_ONLY is honoured on import
#    and set on export; a read-only tensor is never exported through a legacy capsule: BufferError
#    instead.

_WRITES = {
    "setitem": lambda t: t.__setitem__(0, 1),
    "setitem slice of a view": lambda t: t[1:].__setitem__(slice(None), 1),
    "fill_": lambda t: t.fill_(1),
    "zero_": lambda t: t.zero_(),
    "copy_": lambda t: t.copy_(tb.ones(t.shape, dtype=t.dtype)),
}


_RO = (ctypes.c_uint8 * 4)(1, 2, 3, 4)


def _uint8_import(flags: int) -> tb.Tensor:
    """The four bytes of `_RO` imported from a crafted capsule with the given DLPack flags."""
    return tb.from_dlpack(
        testing.CraftedDLPack(
            (),
            data=ctypes.addressof(_RO),
            shape=(4,),
            strides=(1,),
            dtype=tb.uint8.dlpack,
            flags=flags,
            keep=_RO,
        ).take()
    )


def _read_only_tensor(source: str, tmp_path: Any) -> tb.Tensor:
    """A tensor holding 1, 2, 3, 4 in read-only memory of the given kind."""
    if source == "bytes":
        return tb.frombuffer(b"\x01\x02\x03\x04", dtype=tb.uint8)
    if source == "read-only memoryview":
        return tb.asarray(memoryview(b"\x01\x02\x03\x04"))
    if source == "READ_ONLY capsule":
        return _uint8_import(flags=1)
    if source == "from_file mode r":
        path = tmp_path / "ro.bin"
        path.write_bytes(b"\x01\x02\x03\x04")
        return tb.from_file(str(path), size=4, dtype=tb.uint8, mode="r")
    np = pytest.importorskip("numpy")
    values = np.arange(1, 5, dtype=np.uint8)
    values.flags.writeable = False
    return tb.from_dlpack(values)


@pytest.mark.parametrize(
    "source",
    ["bytes", "READ_ONLY capsule", "read-only memoryview", "read-only numpy", "from_file mode r"],
)
@crafted.isolated
def test_read_only_memory_gives_read_only_tensors(source: str, tmp_path: Any) -> None:
    """A tensor over read-only memory, and every view of it, is read-only: each write raises and
    changes nothing."""
    t = _read_only_tensor(source, tmp_path)
    for view in (
        t,
        t[1:],
        t.view(2, 2).T,
        tb.from_dlpack(t),
        tb.from_dlpack(t.__dlpack__(max_version=(1, 0))),
    ):
        assert view.is_readonly
        for write in _WRITES.values():
            with pytest.raises(ValueError, match="read-only"):
                write(view)
    assert t.tolist() == [1, 2, 3, 4]


def _flags(capsule: Any) -> int:
    managed = abi.DLManagedTensorVersioned.from_address(
        _capi.PyCapsule_GetPointer(capsule, abi.DLTENSOR_VERSIONED)
    )
    return managed.flags  # type: ignore[no-any-return]


@crafted.isolated
def test_read_only_flag_is_honoured_on_import_and_set_on_export() -> None:
    """DLPack READ_ONLY makes the import read-only; a read-only tensor's versioned export carries
    the flag (and NumPy imports it read-only); a writable tensor's does not."""
    writable = _uint8_import(flags=0)
    assert not writable.is_readonly
    flagged = _uint8_import(flags=1)
    assert flagged.is_readonly
    assert _flags(flagged.__dlpack__(max_version=(1, 3))) & abi.DLPACK_FLAG_BITMASK_READ_ONLY
    assert not _flags(writable.__dlpack__(max_version=(1, 3))) & abi.DLPACK_FLAG_BITMASK_READ_ONLY
    np = pytest.importorskip("numpy")
    assert not np.from_dlpack(flagged).flags.writeable
    assert not np.asarray(flagged).flags.writeable


@pytest.mark.parametrize(
    "export",
    ["to_dlpack", "__dlpack__()", "__dlpack__(max_version=None)", "__dlpack__(max_version=(0, 8))"],
)
@crafted.isolated
def test_read_only_tensor_is_never_exported_as_legacy_capsule(export: str) -> None:
    """A legacy capsule cannot say read-only, so a read-only tensor is refused with BufferError."""
    t = tb.frombuffer(b"abcd", dtype=tb.uint8)
    call = {
        "to_dlpack": lambda: tb.to_dlpack(t),
        "__dlpack__()": t.__dlpack__,
        "__dlpack__(max_version=None)": lambda: t.__dlpack__(max_version=None),
        "__dlpack__(max_version=(0, 8))": lambda: t.__dlpack__(max_version=(0, 8)),
    }[export]
    with pytest.raises(BufferError, match="read-only"):
        call()


# --------------------------------------------------------------------------------------------------
# 4. A capsule is consumed once; reuse, foreign capsules and wrong objects get distinct, clear
#    errors.


@crafted.isolated
def test_capsule_is_consumed_once_with_distinct_errors() -> None:
    """Reuse is PyTorch's RuntimeError; a foreign capsule is a TypeError naming it; a wrong object
    is a TypeError (and AttributeError) naming its type; the three messages differ."""
    capsule = tb.to_dlpack(tb.arange(3))
    assert tb.from_dlpack(capsule).tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="DLTensor capsules can be consumed only once") as reused:
        tb.from_dlpack(capsule)
    with pytest.raises(TypeError, match="'not_dlpack'") as foreign:
        tb.from_dlpack(_capi.PyCapsule_New(ctypes.addressof(_STORE), b"not_dlpack", None))
    with pytest.raises(TypeError, match="list") as wrong:
        tb.from_dlpack([1, 2, 3])
    assert isinstance(wrong.value, AttributeError)
    assert not isinstance(foreign.value, RuntimeError)
    assert not isinstance(reused.value, TypeError)
    assert len({str(reused.value), str(foreign.value), str(wrong.value)}) == 3


# --------------------------------------------------------------------------------------------------
# 5. A failed import leaves the capsule unconsumed, so the producer still frees its memory exactly
#    once.


class _HandsOver:
    """A producer whose ``__dlpack__`` hands over the capsule it was given."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


_FAILURES = {
    "unsupported dtype": {"dtype": (2, 7, 1)},
    "DLPack major version 2": {"version": (2, 0)},
    "unknown device type": {"device": (99, 0)},
    "ndim 65": {"ndim": 65},
    "negative ndim": {"ndim": -1},
    "NULL shape": {"null_shape": True},
    "NULL data with elements": {"data": None},
    "negative size": {"shape": (-4,)},
}


@pytest.mark.parametrize("route", ["capsule", "producer", "capsule with device"])
@pytest.mark.parametrize("failure", list(_FAILURES))
@crafted.isolated
def test_failed_import_leaves_capsule_unconsumed(failure: str, route: str) -> None:
    """Whatever makes an import fail, the capsule keeps its name and its own destructor then calls
    the producer's deleter exactly once."""
    fields: dict[str, Any] = {
        "data": ctypes.addressof(_FOUR),
        "shape": (4,),
        "strides": (1,),
        "keep": _FOUR,
    }
    fields.update(_FAILURES[failure])
    data = fields.pop("data")
    record = testing.CraftedDLPack((), data=0 if data is None else data, **fields)
    capsule = record.take()
    source, kwargs = (_HandsOver(capsule), {}) if route == "producer" else (capsule, {})
    if route == "capsule with device":
        kwargs = {"device": "cpu", "copy": True}
    with pytest.raises((BufferError, TypeError, ValueError)):
        tb.from_dlpack(source, **kwargs)
    del source
    assert testing.capsule_name(capsule) == abi.DLTENSOR_VERSIONED
    assert record.deleter_calls == 0
    del capsule
    gc.collect()
    assert record.deleter_calls == 1


_FOUR = _floats(1, 2, 3, 4)


# --------------------------------------------------------------------------------------------------
# 6. Negative strides, zero-size, 0-d, size-1 dims with odd strides, byte_offset, NULL strides are
#    all handled.

_VALUES = _floats(*range(12))
_ITEM = 4
_IMPORTS = {  # name -> (crafted fields, expected nested list)
    "negative strides": (
        {"data": 11 * _ITEM, "shape": (3, 4), "strides": (-4, -1)},
        [[11, 10, 9, 8], [7, 6, 5, 4], [3, 2, 1, 0]],
    ),
    "zero-size, NULL data, odd strides": (
        {"data": None, "shape": (3, 0), "strides": (-99, 7)},
        [[], [], []],
    ),
    "0-d, NULL shape and strides": (
        {"data": 5 * _ITEM, "shape": (), "strides": None, "null_shape": True},
        5.0,
    ),
    "size-1 dims with odd strides": (
        {"data": 2 * _ITEM, "shape": (1, 3, 1), "strides": (-1000, 3, 77)},
        [[[2.0], [5.0], [8.0]]],
    ),
    "byte_offset": (
        {"data": 0, "byte_offset": 3 * _ITEM, "shape": (2, 2), "strides": (4, 1)},
        [[3, 4], [7, 8]],
    ),
    "NULL strides (row-major)": (
        {"data": 0, "shape": (2, 6), "strides": None},
        [list(range(6)), list(range(6, 12))],
    ),
    "NULL strides, legacy": (
        {"data": 0, "shape": (3, 4), "strides": None, "versioned": False},
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]],
    ),
    "broadcast (stride 0)": (
        {"data": _ITEM, "shape": (2, 3), "strides": (0, 1)},
        [[1, 2, 3], [1, 2, 3]],
    ),
}


@pytest.mark.parametrize("case", list(_IMPORTS))
@crafted.isolated
def test_unusual_layouts_are_handled(case: str) -> None:
    """Imports with each unusual layout read exactly the elements they describe, and re-export
    intact."""
    fields, expected = _IMPORTS[case]
    fields = dict(fields)
    offset = fields.pop("data")
    data = 0 if offset is None else ctypes.addressof(_VALUES) + offset  # 0: NULL
    record = testing.CraftedDLPack((), data=data, keep=_VALUES, **fields)
    t = tb.from_dlpack(record.take())
    assert t.tolist() == expected
    assert tb.from_dlpack(t.__dlpack__(max_version=(1, 3))).tolist() == expected
    assert tb.from_dlpack(tb.to_dlpack(t)).tolist() == expected


@crafted.isolated
def test_unusual_layouts_export_to_numpy(layout: tuple[str, tb.Tensor]) -> None:
    """Every layout of the matrix reaches NumPy through DLPack and the array interface with its
    values; both share memory, except a DLPack export with negative strides (a copy, since PyTorch
    aborts on them)."""
    np = pytest.importorskip("numpy")
    _, t = layout
    expected = t.tolist()
    via_dlpack, via_interface = np.from_dlpack(t), np.asarray(t)
    for out in (via_dlpack, via_interface):
        assert out.tolist() == expected
        assert out.shape == tuple(t.shape)
    if t.numel() == 0:
        return
    first = (0,) * t.ndim
    for out, shares in ((via_interface, True), (via_dlpack, min(t.stride(), default=0) >= 0)):
        before = t[first].item()
        out[first] = before + 100
        assert (t[first].item() == before + 100) == shares
        t[first] = before


# --------------------------------------------------------------------------------------------------
# 7. Non-CPU memory is carried and re-exported, never dereferenced on the host.

_DEVICE_PROGRAM = """
import ctypes, pickle
import tensorbridge as tb
from tensorbridge.testing import CraftedDLPack, Fenced
fence = Fenced(8, at_end=False)
page = fence.start - 256  # inside an inaccessible page: reading it kills the process
tensors = {
    "CUDA capsule": tb.from_dlpack(CraftedDLPack((), data=page, shape=(2, 3), strides=(3, 1),
                                                  device=(2, 0)).take()),
    "ROCm capsule": tb.from_dlpack(CraftedDLPack((), data=page, shape=(4,), strides=(-1,),
                                                  device=(10, 1)).take()),
    "OpenCL handle + byte_offset": tb.from_dlpack(CraftedDLPack((), data=page, shape=(4,),
        strides=(1,), device=(4, 0), byte_offset=8).take()),
    "from_pointer cuda": tb.from_pointer(page, (2, 2), tb.float32, device="cuda:0"),
    "cuda array interface": tb.asarray(type("C", (), {"__cuda_array_interface__": {
        "version": 3, "typestr": "<f4", "shape": (3,), "data": (page, False)}})()),
}
reads = {
    "tolist": lambda t: t.tolist(), "item": lambda t: t.flatten()[0].item(),
    "float": lambda t: float(t.flatten()[0]),
    "clone": lambda t: t.clone(), "contiguous": lambda t: t.flatten()[::2].contiguous(),
    "to(float64)": lambda t: t.to(tb.float64), "fill_": lambda t: t.fill_(0),
    "setitem": lambda t: t.flatten().__setitem__(0, 1),
    "copy_": lambda t: t.copy_(tb.zeros(t.shape)), "as_memoryview": lambda t: t.as_memoryview(),
    "array_interface": lambda t: t.__array_interface__, "pickle": lambda t: pickle.dumps(t),
    "share_memory_": lambda t: t.share_memory_(), "to cpu": lambda t: t.to("cpu"),
    "asarray cpu": lambda t: tb.asarray(t, device="cpu"),
    "from_dlpack cpu": lambda t: tb.from_dlpack(t, device="cpu"),
    "equal": lambda t: tb.equal(t, t),
}
for name, t in tensors.items():
    text = repr(t) + str(t) + repr(t[1:]) + repr(t.T)
    assert "..." in text or "device" in text, text
    for read, op in reads.items():
        try:
            op(t)
        except (BufferError, AttributeError, ValueError, RuntimeError, TypeError):
            pass
        else:
            raise AssertionError(f"{name}: {read} succeeded on device memory")
    again = tb.from_dlpack(t.__dlpack__(max_version=(1, 3))) if min(t.stride()) >= 0 else t
    assert (again.data_ptr(), again.shape, again.device) == (t.data_ptr(), t.shape, t.device), name
    legacy = tb.from_dlpack(tb.to_dlpack(t)) if min(t.stride()) >= 0 else t
    assert legacy.data_ptr() == t.data_ptr(), name
print("ok")
"""


@crafted.isolated
def test_non_cpu_memory_is_never_dereferenced(subprocess_run: Any) -> None:
    """Device memory (an inaccessible page here) imported by every route can be viewed, printed and
    re-exported at the same address, and every operation that would read or write it on the host
    raises."""
    proc = subprocess_run(_DEVICE_PROGRAM)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")


# --------------------------------------------------------------------------------------------------
# Architecture: memory has one owner object; views share it; the owner releases the memory exactly
# once, when the last view dies.


def _owners() -> dict[str, Any]:
    """name -> builder of (tensor, probe): probe() is True while the memory has not been
    released."""

    def crafted_import() -> tuple[tb.Tensor, Any]:
        record = testing.CraftedDLPack(
            (), data=ctypes.addressof(_VALUES), shape=(12,), strides=(1,), keep=_VALUES
        )
        return tb.from_dlpack(record.take()), lambda: record.deleter_calls == 0

    def held_buffer() -> tuple[tb.Tensor, Any]:
        exporter = bytearray(48)
        return tb.frombuffer(exporter, dtype=tb.float32), lambda: _resizing_fails(exporter)

    def allocation() -> tuple[tb.Tensor, Any]:
        t = tb.arange(12.0)
        block = weakref.ref(t._storage.owner._block)  # the memory itself (a ctypes array)
        return t, lambda: block() is not None

    def pointer_owner() -> tuple[tb.Tensor, Any]:
        owner = _floats(*range(12))
        ref = weakref.ref(owner)
        return tb.from_pointer(
            ctypes.addressof(owner), (12,), tb.float32, owner=owner
        ), lambda: ref() is not None

    return {
        "crafted DLPack import": crafted_import,
        "held buffer": held_buffer,
        "own allocation": allocation,
        "from_pointer owner": pointer_owner,
    }


def _resizing_fails(exporter: bytearray) -> bool:
    try:
        exporter.append(0)
    except BufferError:
        return True
    exporter.pop()
    return False


@pytest.mark.parametrize("order", ["first to last", "last to first"])
@pytest.mark.parametrize("owner", list(_owners()))
@crafted.isolated
def test_memory_is_released_exactly_once_when_the_last_view_dies(owner: str, order: str) -> None:
    """Views made by slicing, DLPack (to tensorbridge and NumPy) and memoryviews keep the memory
    alive; it is released only after the last of them dies, and only once."""
    t, alive = _owners()[owner]()
    views = [
        t[2:],
        t.view(3, 4).T,
        tb.from_dlpack(t.__dlpack__(max_version=(1, 3))),
        t.as_memoryview(),
    ]
    np = _numpy()
    if np is not None:
        views[3:3] = [np.from_dlpack(t[::2]), np.asarray(t), tb.asarray(np.from_dlpack(t))]
    del t
    if order == "last to first":
        views.reverse()
    while views:
        gc.collect()
        assert alive(), f"released with {len(views)} views alive"
        views.pop(0)
    gc.collect()
    assert not alive()
    assert testing.stats()["stray"] == 0


# --------------------------------------------------------------------------------------------------
# 11. A size check and the memory it checks come from one buffer export, held from check to use.


@crafted.isolated
def test_a_size_check_and_its_memory_come_from_one_export() -> None:
    """safetensors.load() checks the header against the buffer export its tensors view: while they
    live the bytearray cannot shrink under them, and once they die it can."""
    from tensorbridge import safetensors

    data = bytearray(safetensors.save({"x": tb.arange(64, dtype=tb.uint8)}))
    loaded = safetensors.load(data)
    x = loaded["x"]
    with pytest.raises(BufferError):
        del data[16:]
    assert x.tolist() == list(range(64))
    del loaded, x
    gc.collect()
    del data[16:]
    assert len(data) == 16


# --------------------------------------------------------------------------------------------------
# 12. A shared-memory name is unlinked only by the process that made it, or by one that received it
#     as a per-pickle link it proved one; a refused pickle leaves every name as it found it.


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a name per pickle needs /dev/shm")
@crafted.isolated
def test_a_shared_memory_name_is_unlinked_only_by_its_maker_or_a_proved_receiver() -> None:
    """A pickle naming a segment's first name is refused, and the name stays; the genuine pickle's
    link is taken over and unlinked with its tensor, the first name staying with its owner."""
    import os
    import pickle

    from tensorbridge import _shared, _tensor

    t = tb.arange(8, dtype=tb.int32).share_memory_()
    first = t._storage.owner.name
    link, *layout = _shared.process_args(t)
    names = lambda: sorted(n for n in os.listdir("/dev/shm") if n.partition(".")[0] == first)  # noqa: E731

    class Sent:
        def __init__(self, name: str) -> None:
            self.name = name

        def __reduce__(self) -> Any:
            return _tensor._rebuild_shared, (self.name, *layout)

    assert names() == sorted([first, link])
    with pytest.raises(ValueError, match=r"pickle\.loads\(\)"):
        pickle.loads(pickle.dumps(Sent(first)))
    gc.collect()
    assert names() == sorted([first, link])
    received = pickle.loads(pickle.dumps(Sent(link)))
    received[0] = 7
    assert t[0].item() == 7
    del received
    gc.collect()
    assert names() == [first]


# --------------------------------------------------------------------------------------------------
# 13. Per-type tables keep nothing alive.


@crafted.isolated
@needs_mortal_classes
def test_per_type_tables_keep_no_type_alive() -> None:
    """A producer class made on the fly and passed to from_dlpack and asarray dies with its last
    instance: no table of tensorbridge's keeps it (or what its methods reach) alive."""
    source = tb.arange(4, dtype=tb.float32)

    def once() -> weakref.ref[type]:
        class Producer:
            def __dlpack__(self, **kwargs: Any) -> Any:
                return source.__dlpack__(**kwargs)

            def __dlpack_device__(self) -> Any:
                return source.__dlpack_device__()

        assert tb.from_dlpack(Producer()).tolist() == [0.0, 1.0, 2.0, 3.0]
        assert tb.asarray(Producer()).tolist() == [0.0, 1.0, 2.0, 3.0]
        return weakref.ref(Producer)

    dead = [once() for _ in range(3)]
    gc.collect()
    assert [ref() for ref in dead] == [None, None, None]


# --------------------------------------------------------------------------------------------------
# 14. One dimension limit, int64, wherever a size enters.


@crafted.isolated
def test_one_int64_limit_wherever_a_size_enters() -> None:
    """Sizes past int64, and sizes (zeros aside) that multiply past it, are refused by constructors,
    views, headers and pickles alike; the largest int64 size is accepted where memory allows."""
    from tensorbridge import safetensors

    with pytest.raises(TypeError, match="Overflow when unpacking long long"):
        tb.zeros(0, 2**64)
    with pytest.raises(RuntimeError):
        tb.empty(2**62, 4)
    with pytest.raises(TypeError, match="Overflow when unpacking long long"):
        tb.zeros(4).view(2**64)
    header = b'{"x":{"dtype":"U8","shape":[0,18446744073709551615],"data_offsets":[0,0]}}'
    with pytest.raises(ValueError, match="int64"):
        safetensors.load(len(header).to_bytes(8, "little") + header)
    assert tb.empty(0, 2**63 - 1).shape == (0, 2**63 - 1)


# --------------------------------------------------------------------------------------------------
# 15. A mapped file promises what mmap promises; a copying load is one argument away.


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="truncation semantics of Linux")
def test_a_copying_load_survives_truncation(tmp_path: Any, subprocess_run: Any) -> None:
    """copy=True (load_file, safe_open, from_file) and load_npy(mode=None) read the file once, so
    their tensors keep their values after the file is truncated to nothing."""
    from tensorbridge import safetensors

    st, raw, npy = tmp_path / "w.safetensors", tmp_path / "w.bin", tmp_path / "w.npy"
    t = tb.arange(256, dtype=tb.int32)
    safetensors.save_file({"x": t}, st)
    raw.write_bytes(bytes(t.as_memoryview()))
    tb.save_npy(npy, t)
    program = f"""
import os, tensorbridge as tb
from tensorbridge import safetensors
got = [safetensors.load_file({str(st)!r}, copy=True)["x"],
       tb.from_file({str(raw)!r}, size=256, dtype=tb.int32, copy=True)]
with safetensors.safe_open({str(st)!r}, "tb", copy=True) as f:
    got.append(f.get_tensor("x"))
got.append(tb.load_npy({str(npy)!r}, mode=None))
for p in ({str(st)!r}, {str(raw)!r}, {str(npy)!r}):
    os.truncate(p, 0)
assert [g.tolist() for g in got] == [list(range(256))] * 4
print("ok")
"""
    proc = subprocess_run(program)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")


# --------------------------------------------------------------------------------------------------
# 16. Memory shared with another interpreter outlives every view of it there.


def test_memory_from_a_closed_interpreter_stays_valid(subprocess_run: Any) -> None:
    """A view made in a subinterpreter that is closed first still reads its values (the memory is
    leaked, never freed under the view)."""
    pytest.importorskip("concurrent.interpreters")
    program = """
import gc
from concurrent import interpreters
import tensorbridge as tb
interp = interpreters.create()
q = interpreters.create_queue()
interp.prepare_main(q=q)
interp.exec("import tensorbridge as tb; t = tb.full((4096,), 3.0); q.put(t.as_memoryview()); q.put(tb.to_shareable(t))")
views = [tb.asarray(q.get()), tb.from_shareable(q.get())]
interp.close()
gc.collect()
churn = [tb.full((4096,), -1.0) for _ in range(8)]
assert [v.tolist() == [3.0] * 4096 for v in views] == [True, True]
print("ok")
"""
    proc = subprocess_run(program)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")
