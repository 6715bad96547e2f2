"""Tools for testing code that exchanges memory through tensorbridge, like ``numpy.testing``.

The centre is `CraftedDLPack`: a DLPack producer made of ctypes objects whose every field can be set
to any value (versioned or legacy struct, version, flags, device, dtype triple, ndim, shape, strides,
byte_offset, data, NULL pointers, capsule name), so that a test can hand a consumer exactly the
managed tensor it wants, well-formed or hostile. Its misbehaviour is made visible two ways:

* Counting. Each producer counts the calls of its deleter (`CraftedDLPack.deleter_calls`); the
  class keeps the producers whose deleter has not run yet (`CraftedDLPack.live`) and counts calls
  for addresses it never handed out or already released (`CraftedDLPack.stray`); `stats` sums it up.
  The capsule's destructor behaves like NumPy's: it calls the deleter only while the capsule still
  has its unused name (``dltensor_versioned`` or ``dltensor``).
* Fences. `Fenced` memory sits between two inaccessible pages, so reading or writing one byte
  outside it kills the process with SIGSEGV instead of passing unnoticed. Shape and strides arrays
  can be fenced too. Run tests that may crash in a child process.

The struct layouts here are written from the DLPack header, independently of tensorbridge's own, so
a layout mistake in tensorbridge is not repeated by the producer that tests it.

`CountingExporter` wraps a tensorbridge tensor as a producer whose capsules' deleter calls are
counted, to see how often another consumer calls tensorbridge's deleter. The helpers
`capsule_name`, `capsule_flags`, `consume_capsule`, `buffer_address` and `dtype_from_format`
inspect what a producer or a consumer did; `offers_buffer` (`_storage`'s) is the one buffer probe.

``import tensorbridge`` does not import this module; it imports no array library and no pytest.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import shutil
import struct
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Final

from . import _capi, _native, _storage
from ._dtype import ALL_DTYPES, DType, from_format

__all__ = [
    "DLPACK_VERSION",
    "DTYPES",
    "FLAG_IS_COPIED",
    "FLAG_READ_ONLY",
    "PAGE",
    "CountingExporter",
    "CraftedDLPack",
    "Fenced",
    "buffer_address",
    "capsule_flags",
    "capsule_name",
    "consume_capsule",
    "dtype_from_format",
    "local_ray",
    "offers_buffer",
    "stats",
]

PAGE: Final = mmap.PAGESIZE
DLPACK_VERSION: Final = (1, 3)  # the newest DLPack version tensorbridge implements
FLAG_READ_ONLY: Final = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY
FLAG_IS_COPIED: Final = 1 << 1  # DLPACK_FLAG_BITMASK_IS_COPIED
DTYPES: Final[tuple[DType, ...]] = ALL_DTYPES  # every tensorbridge dtype, in its listing order
# whether a buffer request succeeds (a failure of any kind means no)
offers_buffer: Final = _storage.offers_buffer

_VERSIONED_NAME: Final = b"dltensor_versioned"
_LEGACY_NAME: Final = b"dltensor"

# Private prototypes (never the shared ctypes.pythonapi attributes). The destructor gets a raw
# PyObject* of a capsule being deallocated: it must not become a Python object again, so the raw
# variants take void*.
_vp, _py, _cp = ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p
_api = ctypes.pythonapi
_capsule_new = ctypes.PYFUNCTYPE(_py, _vp, _cp, _vp)(("PyCapsule_New", _api))
_name_of = ctypes.PYFUNCTYPE(_vp, _py)(("PyCapsule_GetName", _api))
_pointer_of = ctypes.PYFUNCTYPE(_vp, _py, _cp)(("PyCapsule_GetPointer", _api))
_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, _py, _cp)(("PyCapsule_SetName", _api))
_set_context = ctypes.PYFUNCTYPE(ctypes.c_int, _py, _vp)(("PyCapsule_SetContext", _api))
_name_of_raw = ctypes.PYFUNCTYPE(_vp, _vp)(("PyCapsule_GetName", _api))
_pointer_of_raw = ctypes.PYFUNCTYPE(_vp, _vp, _vp)(("PyCapsule_GetPointer", _api))
_Deleter = ctypes.CFUNCTYPE(None, _vp)  # void (*deleter)(DLManagedTensor[Versioned] *)
_CapsuleDestructor = ctypes.CFUNCTYPE(None, _vp)


# The DLPack structs once more, written independently of `_dlpack_abi`'s declaration (which the
# pure-Python build derives its formats from) and flattened differently: a test oracle, so that a
# mistake there cannot hide in a test that crafts its capsules here. tests/test_native.py checks
# both against include/dlpack/dlpack.h.
class _DLTensor(ctypes.Structure):
    """``DLTensor``, with the device and dtype structs flattened into their fields."""

    _fields_ = (
        ("data", _vp),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", _vp),
        ("strides", _vp),
        ("byte_offset", ctypes.c_uint64),
    )


class _Versioned(ctypes.Structure):
    """``DLManagedTensorVersioned`` (DLPack 1.0 and later), with ``version`` flattened."""

    _fields_ = (
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", _vp),
        ("deleter", _vp),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    )


class _Legacy(ctypes.Structure):
    """``DLManagedTensor`` (DLPack before 1.0)."""

    _fields_ = (("dl_tensor", _DLTensor), ("manager_ctx", _vp), ("deleter", _vp))


# --------------------------------------------------------------------------------------------------
# Fenced memory.

# A private handle on libc, so setting restype/argtypes here touches nobody else's prototypes.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = _vp
_libc.mmap.argtypes = (
    _vp,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.munmap.argtypes = (_vp, ctypes.c_size_t)
_libc.mprotect.argtypes = (_vp, ctypes.c_size_t, ctypes.c_int)
_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FAILED = ctypes.c_void_p(-1).value


class Fenced:
    """``nbytes`` of zeroed read-write memory between two inaccessible pages (POSIX only).

    Args:
        nbytes: usable bytes, from `start`.
        at_end: put the last usable byte right before the trailing fence (an over-read past the
            end faults); False puts the first right after the leading fence (an under-read faults).

    Attributes:
        start: the address of the first usable byte.
        nbytes: the number of usable bytes.
    """

    def __init__(self, nbytes: int, *, at_end: bool = True) -> None:
        body = -(-max(nbytes, 1) // PAGE) * PAGE
        self._size = body + 2 * PAGE
        base = _libc.mmap(None, self._size, _PROT_RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if base in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mmap failed")
        self._base = base
        _libc.mprotect(base, PAGE, _PROT_NONE)
        _libc.mprotect(base + PAGE + body, PAGE, _PROT_NONE)
        self.nbytes = nbytes
        self.start: int = base + PAGE + (body - nbytes if at_end else 0)

    def write(self, data: bytes, offset: int = 0) -> None:
        """Copy ``data`` in at byte ``offset``.

        Raises:
            ValueError: the bytes would land outside the usable range.
        """
        if offset < 0 or offset + len(data) > self.nbytes:
            msg = (
                f"Fenced.write(): {len(data)} bytes at offset {offset} do not fit in the "
                f"{self.nbytes} usable bytes; got offset={offset!r}. Write inside the range."
            )
            raise ValueError(msg)
        ctypes.memmove(self.start + offset, data, len(data))

    def read(self, offset: int = 0, nbytes: int | None = None) -> bytes:
        """The bytes at ``offset`` (all the rest by default).

        Raises:
            ValueError: the range reaches outside the usable bytes.
        """
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            msg = (
                f"Fenced.read(): {nbytes} bytes at offset {offset} reach outside the "
                f"{self.nbytes} usable bytes; got offset={offset!r}. Read inside the range."
            )
            raise ValueError(msg)
        return ctypes.string_at(self.start + offset, nbytes)

    def __del__(self) -> None:
        if not sys.is_finalizing() and getattr(self, "_base", None):
            _libc.munmap(self._base, self._size)
            self._base = None


def _int64_array(values: Sequence[int], fence: bool) -> tuple[int, object]:
    """The address of ``values`` as int64s (wrapped to 64 bits), and the object keeping them alive."""
    wrapped = [(v + 2**63) % 2**64 - 2**63 for v in values]
    raw = (ctypes.c_int64 * max(len(wrapped), 1))(*wrapped)
    if not fence:
        return ctypes.addressof(raw), raw
    block = Fenced(8 * len(wrapped))
    if wrapped:
        block.write(bytes(raw)[: 8 * len(wrapped)])
    return block.start, block


# --------------------------------------------------------------------------------------------------
# The crafted producer.

_LOCK = threading.RLock()  # RLock: a collection inside a locked section may run a deleter
_NAMES: dict[bytes, bytes] = {}  # a capsule keeps a pointer to its name: one interned copy per name
_KEPT: list[CraftedDLPack] = []  # producers with a NULL deleter: nothing ever says they are done


class CraftedDLPack:
    """One crafted ``DLManagedTensorVersioned`` (or legacy ``DLManagedTensor``) and its capsule.

    ``values`` are packed with struct format ``fmt`` into a buffer of this object, which the data
    pointer addresses unless ``data`` is given. Every other field can be set independently of the
    values, to any value. The object is also a producer: ``__dlpack__`` hands out its capsule.

    Args:
        values: element values for the producer's own buffer.
        fmt: their struct format character (``"f"``: float32, matching the default ``dtype``).
        dtype: the ``(code, bits, lanes)`` triple (``tb.int32.dlpack`` and so on).
        shape: the int64 shape array (default: ``(len(values),)``).
        strides: the int64 strides array, in elements; None leaves the pointer NULL.
        versioned: write a ``DLManagedTensorVersioned`` (else the legacy struct).
        version: the versioned struct's ``(major, minor)``.
        flags: the versioned struct's flags (`FLAG_READ_ONLY`, `FLAG_IS_COPIED`, any bits).
        device: ``(device_type, device_id)``.
        byte_offset: the ``byte_offset`` field; with the producer's own buffer the values start
            that many bytes into it (the data pointer stays at its start).
        data: the data pointer (0 for NULL), instead of the producer's own buffer.
        ndim: the ``ndim`` field (default: ``len(shape)``), independent of the arrays.
        null_shape: leave the shape pointer NULL.
        null_strides: leave the strides pointer NULL even when ``strides`` is given.
        adjacent: put strides right after shape in one block (NumPy's layout).
        fence: place shape and strides against an inaccessible page: reading past them faults.
        deleter: set the counting deleter (else NULL).
        name: capsule name (default ``dltensor_versioned`` / ``dltensor``).
        destructor: give the capsule a NumPy-style destructor (else an unconsumed capsule is
            released only by `release`).
        keep: objects that own ``data``, kept alive until the deleter runs.

    Attributes:
        capsule: the capsule (None after `take`).
        managed: the managed struct; its fields (``dl_tensor.ndim``, ``manager_ctx``, ...) can
            still be changed before a consumer reads them.
        buffer: the producer's own element buffer.
        address: the managed struct's address (what the capsule points to).
        name: the capsule's name as made.
        deleter_calls: how many times the deleter ran for this struct.
    """

    live: ClassVar[dict[int, CraftedDLPack]] = {}  # address -> producer, until its deleter runs
    made: ClassVar[int] = 0
    deleted: ClassVar[int] = 0
    stray: ClassVar[int] = 0  # deleter calls for an address no live producer had
    _records: ClassVar[weakref.WeakValueDictionary[int, CraftedDLPack]] = (
        weakref.WeakValueDictionary()
    )

    def __init__(
        self,
        values: Sequence[Any] = (1.0, 2.0, 3.0, 4.0),
        *,
        fmt: str = "f",
        dtype: tuple[int, int, int] = (2, 32, 1),
        shape: Sequence[int] | None = None,
        strides: Sequence[int] | None = None,
        versioned: bool = True,
        version: tuple[int, int] = DLPACK_VERSION,
        flags: int = 0,
        device: tuple[int, int] = (1, 0),
        byte_offset: int = 0,
        data: int | None = None,
        ndim: int | None = None,
        null_shape: bool = False,
        null_strides: bool = False,
        adjacent: bool = False,
        fence: bool = False,
        deleter: bool = True,
        name: bytes | None = None,
        destructor: bool = True,
        keep: object = None,
    ) -> None:
        raw = struct.pack(f"<{len(values)}{fmt}", *values) if values else b""
        pad = byte_offset if data is None else 0
        self.buffer = (ctypes.c_char * max(len(raw) + pad, 1))()
        ctypes.memmove(ctypes.addressof(self.buffer) + pad, raw, len(raw))
        self.keep = keep
        self.deleter_calls = 0
        self.versioned = versioned
        shape = (len(values),) if shape is None else tuple(shape)
        if adjacent and strides is not None:
            both, self._arrays = _int64_array([*shape, *strides], fence)
            shape_p, strides_p = both, both + 8 * len(shape)
        else:
            shape_p, shape_keep = _int64_array(shape, fence)
            strides_p, strides_keep = (0, None) if strides is None else _int64_array(strides, fence)
            self._arrays = (shape_keep, strides_keep)
        managed: _Versioned | _Legacy = _Versioned() if versioned else _Legacy()
        self.managed = managed
        dl = managed.dl_tensor
        dl.data = ctypes.addressof(self.buffer) if data is None else data % 2**64
        dl.device_type, dl.device_id = device
        dl.ndim = len(shape) if ndim is None else ndim
        dl.code, dl.bits, dl.lanes = dtype
        dl.shape = None if null_shape else shape_p
        dl.strides = None if null_strides or not strides_p else strides_p
        dl.byte_offset = byte_offset % 2**64
        managed.deleter = _DELETER_ADDRESS if deleter else None
        if isinstance(managed, _Versioned):
            managed.major, managed.minor = version
            managed.flags = flags % 2**64
        self.address = ctypes.addressof(managed)
        if name is None:
            name = _VERSIONED_NAME if versioned else _LEGACY_NAME
        self.name = _NAMES.setdefault(name, name)
        with _LOCK:
            CraftedDLPack.made += 1
            if deleter:
                CraftedDLPack.live[self.address] = self
            else:
                _KEPT.append(self)
            CraftedDLPack._records[self.address] = self
        self.capsule: Any = _capsule_new(
            self.address, self.name, _DESTRUCTOR_ADDRESS if destructor else None
        )
        if destructor and _GUARDED_DESTRUCTOR:
            _set_context(self.capsule, id(_destroy))  # what the guarded destructor runs

    @property
    def consumed(self) -> bool:
        """True once a consumer renamed the capsule to ``used_*``."""
        return capsule_name(self.capsule).startswith(b"used_")

    def take(self) -> Any:
        """The capsule, with this object's reference dropped (the caller's is then the only one)."""
        capsule, self.capsule = self.capsule, None
        return capsule

    def release(self) -> None:
        """Call the deleter now if nobody consumed the capsule and it has not run yet.

        For a capsule made with ``destructor=False`` that this object still holds: what a
        destructor would have done. A consumer that still owes its call keeps the producer alive
        (`live`), so a late call counts instead of crashing.
        """
        if self.deleter_calls == 0 and capsule_name(self.capsule) == self.name:
            _release(self.address)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        return self.take()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.managed.dl_tensor.device_type, self.managed.dl_tensor.device_id)


@_Deleter
def _deleter(address: int | None) -> None:
    with _LOCK:
        record = CraftedDLPack._records.get(address or 0)
        if record is not None:
            record.deleter_calls += 1
        if CraftedDLPack.live.pop(address or 0, None) is None:
            CraftedDLPack.stray += 1  # a second call, or an address this module never handed out
        else:
            CraftedDLPack.deleted += 1


def _release(address: int) -> None:
    """Call the managed struct's deleter as it is set now (a test may have replaced it)."""
    record = CraftedDLPack.live.get(address) or CraftedDLPack._records.get(address)
    if record is None:  # the deleter already ran and the struct is gone: the release counts
        _deleter(address)
        return
    if record.managed.deleter:
        _Deleter(record.managed.deleter)(address)


def _destroy(
    capsule: int | None,
    _finalizing: Any = sys.is_finalizing,
    _string_at: Any = ctypes.string_at,
    _release: Any = _release,
) -> None:
    """NumPy's capsule destructor: call the deleter only while the capsule has its unused name."""
    if _finalizing():
        return  # like a C producer at exit: leak rather than run code in a dying interpreter
    name = _name_of_raw(capsule)
    if name and _string_at(name) in (_VERSIONED_NAME, _LEGACY_NAME):
        _release(_pointer_of_raw(capsule, name) or 0)


# A consumer may free a capsule it refuses while its exception propagates, as C consumers (and
# compiled tensorbridge) do. Like NumPy's, the destructor must then keep that exception: where
# tensorbridge is compiled, a C destructor does so around `_destroy` (the capsule's context);
# otherwise the ctypes callback runs `_destroy` directly, which cannot (a refusal freed that way
# reaches the caller as a SystemError).
_destructor = _CapsuleDestructor(_destroy)

_DELETER_ADDRESS: Final = ctypes.cast(_deleter, _vp).value
_GUARDED_DESTRUCTOR: Final = _native.guarded_destructor_address()
_DESTRUCTOR_ADDRESS: Final = _GUARDED_DESTRUCTOR or ctypes.cast(_destructor, _vp).value

# Capsules and managed structs that outlive this module (held by a consumer, or garbage collected
# after the module's globals are cleared at exit) still point at these two callbacks: one reference
# that is never dropped keeps their code alive until the process ends.
_capi.keep_forever(_deleter)
_capi.keep_forever(_destructor)
_capi.keep_forever(_destroy)


def stats() -> dict[str, int]:
    """Totals over every `CraftedDLPack`: ``made``, ``deleted`` (deleter calls), ``stray`` (calls
    for an address already released or never handed out) and ``live`` (deleters not yet run)."""
    with _LOCK:
        return {
            "made": CraftedDLPack.made,
            "deleted": CraftedDLPack.deleted,
            "stray": CraftedDLPack.stray,
            "live": len(CraftedDLPack.live),
        }


# --------------------------------------------------------------------------------------------------
# Inspecting capsules and buffers.


def capsule_name(capsule: Any) -> bytes:
    """A capsule's current name (``used_*`` once a consumer took it)."""
    return ctypes.string_at(_name_of(capsule))


def _managed_of(capsule: Any) -> tuple[int, _Versioned | _Legacy]:
    name = capsule_name(capsule)
    if name not in (_VERSIONED_NAME, _LEGACY_NAME):
        msg = (
            f"testing: the capsule is named {name!r}, not an unconsumed DLPack capsule; got "
            f"{capsule!r}. Pass a capsule no consumer has taken."
        )
        raise ValueError(msg)
    address = _pointer_of(capsule, name) or 0
    mirror = _Versioned if name == _VERSIONED_NAME else _Legacy
    return address, mirror.from_address(address)


def capsule_flags(capsule: Any) -> int:
    """The ``flags`` of an unconsumed versioned capsule (0 for a legacy one, which has none).

    Raises:
        ValueError: the capsule is consumed or not a DLPack capsule.
    """
    _, managed = _managed_of(capsule)
    return int(managed.flags) if isinstance(managed, _Versioned) else 0


def consume_capsule(capsule: Any) -> None:
    """Do what a C consumer does with a capsule: rename it ``used_*``, then call its deleter once.

    Raises:
        ValueError: the capsule is consumed or not a DLPack capsule.
    """
    address, managed = _managed_of(capsule)
    used = b"used_" + capsule_name(capsule)
    _set_name(capsule, _NAMES.setdefault(used, used))  # the capsule keeps a pointer to the name
    if managed.deleter:
        _Deleter(managed.deleter)(address)


def buffer_address(obj: Any) -> int:
    """The address of the memory ``obj`` exports through the buffer protocol (0 when empty).

    Raises:
        TypeError: ``obj`` does not support the buffer protocol.
    """
    view = _capi.Py_buffer()
    _capi.PyObject_GetBuffer(obj, ctypes.byref(view), _capi.PY_BUF_FULL_RO)
    try:
        return view.buf or 0
    finally:
        _capi.PyBuffer_Release(ctypes.byref(view))


def dtype_from_format(fmt: str) -> DType | None:
    """The tensorbridge dtype of a buffer-protocol format string (``"<i"``, ``"Zf"``), or None
    for a format it has no dtype for (a non-native byte order included)."""
    return from_format(fmt)


# --------------------------------------------------------------------------------------------------
# Counting another consumer's deleter calls.

_FORWARD: dict[int, tuple[int, CountingExporter]] = {}


class CountingExporter:
    """Wraps a tensorbridge tensor as a producer whose capsules' deleter calls are counted.

    ``__dlpack__`` asks the tensor for a capsule, then points the managed struct's ``deleter`` at a
    counting trampoline that forwards to tensorbridge's own deleter, so a test sees how often a
    consumer (NumPy, PyTorch, JAX, ...) calls it.

    Attributes:
        calls: managed address -> deleter calls, for every capsule handed out.
        kwargs: the keyword arguments of each ``__dlpack__`` call.
    """

    stray_calls: ClassVar[int] = 0  # deleter calls for an address already released

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor
        self.calls: dict[int, int] = {}
        self.kwargs: list[dict[str, Any]] = []

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.kwargs.append(kwargs)
        capsule = self.tensor.__dlpack__(**kwargs)
        address, managed = _managed_of(capsule)
        _FORWARD[address] = (managed.deleter or 0, self)
        self.calls[address] = 0
        managed.deleter = _COUNTING_DELETER_ADDRESS
        return capsule

    def __dlpack_device__(self) -> Any:
        return self.tensor.__dlpack_device__()

    @property
    def total(self) -> int:
        """Deleter calls over every capsule handed out."""
        return sum(self.calls.values())


@_Deleter
def _counting_deleter(address: int | None) -> None:
    entry = _FORWARD.pop(address or 0, None)
    if entry is None:
        CountingExporter.stray_calls += 1
        return
    original, exporter = entry
    exporter.calls[address or 0] += 1
    _Deleter(original)(address)


_COUNTING_DELETER_ADDRESS: Final = ctypes.cast(_counting_deleter, _vp).value


# --------------------------------------------------------------------------------------------------
# A local Ray, for the doctor's scale-out check, the Ray tests and the scale-out benchmark.


@contextlib.contextmanager
def local_ray() -> Iterator[Any]:
    """A local Ray for this process, started for the ``with`` block and shut down after it: one
    CPU, no dashboard, quiet, no usage statistics, in a temporary directory of its own (removed
    afterwards). Yields the ``ray`` module.

    Raises:
        ImportError: Ray is not installed.
        Exception: whatever ``ray.init`` raises when Ray cannot start here.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    temp_dir = tempfile.mkdtemp(prefix="tbray")
    try:
        ray.init(
            num_cpus=1,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            _temp_dir=temp_dir,
        )
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
