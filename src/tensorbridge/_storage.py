"""Storage: one block of memory, one owner, shared by every view, released exactly once.

A `Storage` names a byte range ``[ptr, ptr + nbytes)`` on a device and holds the *owner* object whose
lifetime keeps that range valid. Views (tensors) hold the storage; when the last view dies the storage
dies, the owner dies, and the owner releases the memory:

* `_Allocation`    memory tensorbridge allocated (zeroed, 64-byte aligned); freed by Python's allocator.
* any object       for `from_pointer`: the caller's owner object is simply kept alive.

Two kinds of storage are their own owner, so that an import builds one object where it would build two
(imports are the hot path: a few microseconds in all):

* `BufferStorage`  a ``Py_buffer`` export held open; ``PyBuffer_Release`` exactly once.
* `DLPackStorage`  an imported DLPack managed tensor; its ``deleter`` called exactly once.

Owners release in ``__del__`` rather than through ``weakref.finalize``: ``__del__`` runs exactly once per
object (PEP 442), costs nothing at construction (finalize registers a global entry, ~1 µs, on the
``from_dlpack`` hot path), and is guarded so that nothing runs once the interpreter is finalising — at that
point leaking is the only safe choice (NumPy's DLPack deleters make the same choice: they
do nothing unless ``Py_IsInitialized()``).
"""

from __future__ import annotations

import ctypes
import sys
import sysconfig
from collections.abc import Callable, Sequence
from math import prod
from typing import Any, Final, NamedTuple

from . import _capi
from ._device import CPU, Device
from ._layout import check_int64, check_sizes, extent
from ._native import acquire_buffer

__all__ = ["ALIGNMENT", "Storage", "allocate"]

# 64 bytes: JAX imports host memory without copying only when it is 64-byte aligned; also a
# cache line.
ALIGNMENT: Final = 64

# One past the highest address a pointer can hold on this platform.
ADDRESS_LIMIT: Final = 1 << (8 * ctypes.sizeof(ctypes.c_void_p))
# The largest size an object may have (Py_ssize_t): a module constant, read on every import.
_MAX_SIZE: Final = sys.maxsize
# Whether a storage keeps the one view `Storage.host_view` makes. Not without a GIL: CPython 3.13's
# free-threaded build counts the exports of a memoryview's buffer without atomics, so threads that
# slice or cast one shared view at once can release it under each other ("operation forbidden on
# released memoryview object"); each call there makes a view of its own.
_SHARE_HOST_VIEW: Final = not sysconfig.get_config_var("Py_GIL_DISABLED")


class Storage:
    """A byte range ``[ptr, ptr + nbytes)`` on ``device``, kept valid by ``owner``.

    Attributes:
        ptr: address of byte 0 (an opaque handle value for memory the host cannot read).
        nbytes: length of the range the views may touch.
        device: where the memory lives.
        readonly: True when nothing may be written through any view.
        owner: the object whose lifetime keeps the memory valid (None: the creator vouches for the
            memory, as `from_pointer` without an owner does); a storage that owns its memory
            (`DLPackStorage`) is its own owner.
        is_copied: the producer handed over a private copy (DLPack ``IS_COPIED``).
    """

    __slots__ = ("__weakref__", "_mv", "_owner", "device", "is_copied", "nbytes", "ptr", "readonly")

    def __init__(
        self,
        ptr: int,
        nbytes: int,
        device: Device,
        readonly: bool,
        owner: object,
        is_copied: bool = False,
    ) -> None:
        self._fill(ptr, nbytes, device, readonly, owner, is_copied)

    def _fill(
        self,
        ptr: int,
        nbytes: int,
        device: Device,
        readonly: bool,
        owner: object,
        is_copied: bool,
    ) -> None:
        """Set every field: each constructor of a storage, its subclasses' included, calls this
        once (compiled, a C call that stores into the extension type's fields)."""
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self.readonly = readonly
        self._owner = owner
        self.is_copied = is_copied
        self._mv: memoryview | None = None

    @property
    def owner(self) -> object:
        """The object whose lifetime keeps the memory valid (see the class docstring)."""
        return self._owner

    @owner.setter
    def owner(self, owner: object) -> None:
        self._owner = owner  # `_buffer.share_memory` moves a storage into new memory

    def host_view(self, api: str) -> memoryview:
        """A writable unsigned-byte memoryview of the whole range; only for host-accessible memory.

        The view does not keep the memory alive by itself: callers hold the storage while they use it.
        It is made once and kept, except on a free-threaded interpreter (see `_SHARE_HOST_VIEW`).
        """
        mv = self._mv
        if mv is None:
            if not self.device.is_host_accessible:
                msg = (
                    f"{api}(): the tensor's memory is on {self.device} and cannot be read or written "
                    f"on the host; export it to a library that runs on {self.device.type} instead."
                )
                raise BufferError(msg)
            if self.nbytes == 0:
                mv = memoryview(bytearray(0))
            else:
                mv = memoryview((ctypes.c_char * self.nbytes).from_address(self.ptr)).cast("B")
            if _SHARE_HOST_VIEW:
                self._mv = mv
        return mv

    def __repr__(self) -> str:
        return (
            f"<Storage ptr=0x{self.ptr:x} nbytes={self.nbytes} device={self.device} "
            f"readonly={self.readonly} owner={type(self.owner).__name__}>"
        )


class Refusal(NamedTuple):
    """Why `locate` refused a layout, and everything it knew, for the caller's message builder.

    ``kind`` is ``"numel"`` (the elements' bytes overflow ``Py_ssize_t``), ``"null"`` (a NULL pointer
    with elements), ``"address"`` (the bytes reached leave the address space) or ``"outside"`` (the
    layout leaves ``[ptr, ptr + nbytes)``, or reaches before ``ptr`` when anchored). ``low`` and
    ``high`` are the lowest and highest element index reached (``offset, offset - 1`` when there is
    no element), ``start`` and ``stop`` the byte range they span.
    """

    kind: str
    api: str
    ptr: int
    nbytes: int | None
    offset: int
    shape: Sequence[int]
    strides: Sequence[int]
    itemsize: int
    numel: int
    low: int
    high: int
    start: int
    stop: int


def locate(
    ptr: int,
    nbytes: int | None,
    offset: int,
    shape: Sequence[int],
    strides: Sequence[int],
    itemsize: int,
    api: str,
    fail: Callable[[Refusal], BaseException],
    *,
    sized: bool = True,
    anchored: bool = False,
    check_empty: bool = True,
) -> tuple[int, int, int]:
    """The one bounds check: where a layout over memory at ``ptr`` lies, or the caller's error.

    Element ``[0, ..., 0]`` lies at ``ptr + offset * itemsize``; ``strides`` are in elements and may
    be negative. Sizes are Python ints, so nothing wraps. Refused, in this order: element bytes
    that overflow ``Py_ssize_t`` (only when ``sized``: DLPack bounds the extent, not the element
    count), a NULL ``ptr`` with elements, a layout whose bytes leave the address space (or touch
    address 0), and, with ``nbytes``, a layout that leaves ``[ptr, ptr + nbytes)``. Nothing is read:
    the memory may live on a device.

    Args:
        ptr: address of the memory (with ``anchored``, an opaque handle the storage must start at).
        nbytes: the size of the valid memory, or None when the caller vouches for the layout.
        offset: element offset of element ``[0, ..., 0]`` from ``ptr``.
        shape: sizes, non-negative.
        strides: strides in elements.
        itemsize: bytes per element.
        api: the function the user called.
        fail: builds the exception to raise from a `Refusal`, in the caller's words.
        sized: also refuse a shape whose element bytes overflow ``Py_ssize_t``.
        anchored: the storage starts at ``ptr`` (a handle no arithmetic applies to); a layout
            reaching before it is refused (``"outside"``) before anything else is checked.
        check_empty: also check where a layout without elements lies; False for a view of an
            existing storage, where an empty layout addresses no byte and may lie anywhere (as in
            PyTorch).

    Returns:
        ``(start, size, element_offset)``: the storage's first byte and size, and the element
        offset of the layout inside it. Without ``nbytes`` the storage is exactly the bytes the
        layout reaches (anchored: from ``ptr`` to the last of them); with it, ``[ptr, ptr + nbytes)``.
    """
    span = extent(offset, shape, strides)
    empty = span is None
    if span is None:
        if not check_empty:
            return ptr, nbytes or 0, offset
        low, high = offset, offset - 1
    else:
        low, high = span
    kind = None
    if anchored:
        if low < 0:  # refused before anything else is checked
            kind, start, stop = "outside", ptr, ptr
        else:
            start, stop = ptr, ptr + (high + 1) * itemsize
    else:
        start, stop = ptr + low * itemsize, ptr + (high + 1) * itemsize
    if kind is not None:
        pass
    elif sized and prod(shape) * itemsize > _MAX_SIZE:
        kind = "numel"
    elif not empty and ptr == 0:
        kind = "null"
    elif (
        start < 0 or (start == 0 and not empty) or stop > ADDRESS_LIMIT or stop - start > _MAX_SIZE
    ):
        kind = "address"
    elif nbytes is not None and (low < 0 or stop - ptr > nbytes):
        kind = "outside"
    if kind is not None:
        refusal = Refusal(
            kind,
            api,
            ptr,
            nbytes,
            offset,
            shape,
            strides,
            itemsize,
            prod(shape),
            low,
            high,
            start,
            stop,
        )
        raise fail(refusal)
    if nbytes is not None:
        return ptr, nbytes, offset
    return start, stop - start, offset - low if not anchored else offset


def refused(refusal: Refusal) -> BufferError:
    """`locate`'s ``fail`` for a caller that words the error itself, once it has caught it: a
    `BufferError` carrying the `Refusal` (read back with `refusal_of`). A closure binding the
    caller's words would cost every call, refused or not."""
    return BufferError(refusal)


def refusal_of(exc: BaseException) -> Refusal | None:
    """The `Refusal` an error made by `refused` carries; None for any other error."""
    args = exc.args
    refusal = args[0] if len(args) == 1 else None
    return refusal if isinstance(refusal, Refusal) else None


def check_view(
    storage: Storage,
    offset: int,
    shape: Sequence[int],
    strides: Sequence[int],
    itemsize: int,
    api: str,
    fail: Callable[[Refusal], BaseException] | None = None,
) -> None:
    """Raise unless every element of a view lies inside ``storage`` (with Python ints).

    The storage is memory its owner vouches for (memory handed in passed `locate` when its
    storage was made), so only the storage's range is checked here. A
    layout without elements addresses no byte and may lie anywhere, as in PyTorch. ``fail`` words
    the error from the `Refusal` (default: PyTorch's out-of-bounds text, extended).
    """
    if offset < 0:
        msg = f"{api}(): invalid storage offset {offset}; the storage offset must be non-negative."
        raise ValueError(msg)
    check_int64(offset, api, "storage offset", ValueError)
    check_sizes(shape, api, strides=strides)
    span = extent(offset, shape, strides)
    if span is None:
        return
    low, high = span
    stop = (high + 1) * itemsize
    if low < 0 or stop > storage.nbytes:
        ptr = storage.ptr
        refusal = Refusal(
            "outside",
            api,
            ptr,
            storage.nbytes,
            offset,
            shape,
            strides,
            itemsize,
            prod(shape),
            low,
            high,
            ptr + low * itemsize,
            ptr + stop,
        )
        raise (fail or _out_of_bounds)(refusal)


def _out_of_bounds(r: Refusal) -> ValueError:
    """The error for a view that leaves its storage, whatever `_storage.locate` found."""
    # PyTorch's setStorage text, extended: it checks only the high end (it has no negative strides).
    need = (r.high + 1) * r.itemsize
    msg = (
        f"{r.api}(): sizes {list(r.shape)}, strides {list(r.strides)}, storage offset {r.offset}, "
        f"and itemsize {r.itemsize} requiring a storage size of {need} are out of bounds for "
        f"storage of size {r.nbytes}: the layout reaches elements [{r.low}, {r.high}], outside "
        f"the storage. Choose a layout that stays inside the tensor's memory."
    )
    return ValueError(msg)


def wrap(
    ptr: int,
    nbytes: int | None,
    device: Device,
    readonly: bool,
    owner: object,
    offset: int,
    shape: Sequence[int],
    strides: Sequence[int],
    itemsize: int,
    api: str,
    fail: Callable[[Refusal], BaseException],
) -> tuple[Storage, int]:
    """A validated storage over memory ``owner`` keeps valid, and the layout's element offset in it.

    Every import path goes through `locate` (see there for the checks and arguments); this builds
    the plain `Storage` for the range it returns.
    """
    start, size, element_offset = locate(ptr, nbytes, offset, shape, strides, itemsize, api, fail)
    return Storage(start, size, device, readonly, owner), element_offset


class _Allocation:
    """Zero-initialised host memory, aligned to `ALIGNMENT` bytes, owned by tensorbridge."""

    __slots__ = ("_block", "ptr")

    def __init__(self, nbytes: int) -> None:
        # ctypes arrays are zero-filled; over-allocate to align the start.
        try:
            self._block = (ctypes.c_char * (nbytes + ALIGNMENT - 1))()
        except (MemoryError, OverflowError):
            msg = f"allocate(): cannot allocate {nbytes} bytes of host memory; the system is out of memory."
            raise MemoryError(msg) from None
        base = ctypes.addressof(self._block)
        self.ptr = base + (-base % ALIGNMENT)


def allocate(nbytes: int, device: Device = CPU) -> Storage:
    """A new zeroed, 64-byte aligned host storage of ``nbytes`` bytes."""
    if not device.is_host_accessible:
        msg = (
            f"allocate(): tensorbridge allocates host memory only; cannot allocate on {device}. "
            f"Create the tensor with a library for {device.type} and import it with from_dlpack()."
        )
        raise BufferError(msg)
    block = _Allocation(nbytes)
    return Storage(block.ptr, nbytes, CPU, False, block)


class _SelfOwned(Storage):
    """A storage that owns its memory and releases it itself, exactly once, when it dies.

    ``owner`` is the storage itself (computed: a stored self-reference would be a cycle, which only
    the garbage collector could break), or whatever `_buffer.share_memory` moved it into.
    """

    __slots__ = ()

    @property
    def owner(self) -> object:
        """This storage; or where its memory was moved to."""
        moved = self._owner
        return self if moved is None else moved

    @owner.setter
    def owner(self, owner: object) -> None:
        self._owner = owner


class BufferStorage(_SelfOwned):
    """A buffer export held open (``PyObject_GetBuffer`` ... ``PyBuffer_Release`` exactly once).

    It spans the exporter's whole buffer; `_buffer.frombuffer` narrows it to the bytes it views
    before anything else sees it. Other importers use it as the owner of their own storage (see
    `hold_buffer`). The export is released when ``view`` (the held ``Py_buffer``, held only here)
    dies with the storage.
    """

    __slots__ = ("view",)

    def __init__(self, obj: object, flags: int) -> None:
        # The view holds the one strong reference to the exporter until it is released.
        self.view, buf, length, readonly = acquire_buffer(obj, flags)
        self._fill(buf, length, CPU, readonly, None, False)

    @property
    def obj(self) -> object:
        """The exporting object, or None once the buffer is released."""
        address = self.view.obj
        return ctypes.cast(address, ctypes.py_object).value if address else None


# The buffer requests tensorbridge makes, as PyTorch and NumPy do, writable first: a simple request
# (no shape, no strides) is C-contiguous by definition, ``len`` contiguous bytes or a failure.
WRITABLE_REQUEST: Final = _capi.PY_BUF_SIMPLE | _capi.PY_BUF_WRITABLE
READONLY_REQUEST: Final = _capi.PY_BUF_SIMPLE


def hold_buffer(obj: object, flags: int) -> tuple[BufferStorage, Any]:
    """Acquire ``obj``'s buffer with ``flags``: the owner, and its view (the held ``Py_buffer``) to
    read the fields from. The export is released exactly once, when both are gone."""
    held = BufferStorage(obj, flags)
    return held, held.view


def offers_buffer(obj: object, flags: int = _capi.PY_BUF_FULL_RO) -> bool:
    """Whether a consumer asking ``obj`` for a buffer with ``flags`` gets one (the default is what
    ``memoryview(obj)`` asks): the one answer every buffer probe gives.

    A failed request means no, whatever it raised: ``TypeError`` (no buffer protocol),
    ``BufferError`` (the exporter refused this request: from Python 3.12 a class's ``__buffer__``
    may, as a bfloat16 `Tensor` refuses to name its format) or any other error of the exporter's,
    as NumPy treats a failed request while it looks for an array. The buffer is released before
    this returns.
    """
    try:
        acquire_buffer(obj, flags)  # the held view it returns releases itself as it dies here
    except Exception:
        return False
    return True


# Compiled, a C global (see _storage.pxd): `DLPackStorage.__del__` calls it with no lookup, and it
# outlives the module's dictionary at exit.
_finalizing: Final[Callable[[], bool] | None] = sys.is_finalizing


class DLPackStorage(_SelfOwned):
    """The storage of an imported DLPack managed tensor, which it owns: its ``deleter`` runs exactly
    once, when the storage dies.

    ``deleter`` starts as None and is armed only once the import has succeeded (until then the
    producer's capsule still owns the tensor); a NULL deleter stays None.
    """

    __slots__ = ("deleter", "managed")

    def __init__(
        self, ptr: int, nbytes: int, device: Device, readonly: bool, is_copied: bool, managed: int
    ) -> None:
        self._own(ptr, nbytes, device, readonly, is_copied, managed)

    def _own(
        self, ptr: int, nbytes: int, device: Device, readonly: bool, is_copied: bool, managed: int
    ) -> None:
        """Set every field, the deleter unarmed (compiled, a C method; see `own_managed`)."""
        self._fill(ptr, nbytes, device, readonly, None, is_copied)
        self.managed = managed  # the DLManagedTensor(Versioned)* handed to the deleter
        self.deleter: Any = None  # a ctypes function pointer, once armed

    def __del__(self) -> None:
        deleter, self.deleter = self.deleter, None
        # At exit the module's globals may already be None: then the deleter is skipped as well.
        if deleter is None or _finalizing is None or _finalizing():
            return
        deleter(self.managed)


def own_managed(
    ptr: int, nbytes: int, device: Device, readonly: bool, is_copied: bool, managed: int
) -> DLPackStorage:
    """``DLPackStorage(ptr, nbytes, device, readonly, is_copied, managed)``, made without a call
    of the type: compiled, the storage is allocated and filled in C (every import makes one)."""
    storage = DLPackStorage.__new__(DLPackStorage)
    storage._own(ptr, nbytes, device, readonly, is_copied, managed)
    return storage
