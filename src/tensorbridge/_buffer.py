"""The buffer protocol in both directions, and the pickling and shared memory built on it.

Import, `frombuffer`: any object that exports a C-contiguous buffer (bytes, bytearray, memoryview,
array.array, mmap, ctypes objects, shared memory, ``pickle.PickleBuffer``, NumPy arrays, any C
extension) becomes a 1-D tensor over the same bytes. Unlike PyTorch, which releases it at once, the export is
*held*: the ``Py_buffer`` from ``PyObject_GetBuffer`` is released only when the last view dies, so
the exporter refuses to resize, close or release its memory while a tensor can still read it.
Read-only exporters give read-only tensors, where PyTorch warns and hands out a writable tensor.

Export: `buffer_export` backs ``Tensor.__buffer__`` (PEP 688: ``memoryview(t)`` on Python 3.12+)
and ``Tensor.as_memoryview()``. (``Tensor.__array_interface__``, which lets ``numpy.asarray(t)``
share memory on every Python version, is `_interfaces.array_interface`, re-exported here.)

Pickling (``Tensor.__reduce_ex__``) lives in `_pickle`; the names it had here stay importable
from this module, where pickles made by earlier versions look for ``_rebuild_tensor``.

Shared memory, `share_memory`: moves a storage into a ``multiprocessing.shared_memory`` segment;
from then on ``multiprocessing``'s pickler (queues, ``Pool``, ``ProcessPoolExecutor``) sends the
segment's name instead of the bytes, so other processes map the same memory.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import pickle
import sys
from typing import TYPE_CHECKING, Any, Final

from . import _capi, _exports
from ._args import GRAD_MSG_CREATE, as_bool, as_int
from ._device import CPU
from ._dtype import DType, as_dtype, uint8
from ._interfaces import array_interface
from ._layout import contiguous_strides
from ._storage import BufferStorage, Storage, hold_buffer
from ._tensor import Tensor

if TYPE_CHECKING:
    from multiprocessing.shared_memory import SharedMemory

__all__ = ["array_interface", "buffer_export", "frombuffer", "reduce_tensor", "share_memory"]

# A simple request (no shape, no strides) is C-contiguous by definition: the exporter hands over
# `len` contiguous bytes or fails. PyTorch and NumPy ask exactly this, writable first.
_WRITABLE_REQUEST: Final = _capi.PY_BUF_SIMPLE | _capi.PY_BUF_WRITABLE
_READONLY_REQUEST: Final = _capi.PY_BUF_SIMPLE

_make = Tensor._make


# -------------------------------------------------------------------------------------------------
# Import: frombuffer


def frombuffer(
    buffer: Any, *, dtype: DType, count: int = -1, offset: int = 0, requires_grad: bool = False
) -> Tensor:
    """A 1-D tensor over the memory of an object that implements the buffer protocol.

    Skips ``offset`` bytes and reads ``count`` elements of ``dtype`` (all that remain when
    ``count`` is negative; they must then fill the rest of the buffer exactly). The dtype is never
    inferred from the buffer's format. Any alignment works: the tensor starts at ``buf + offset``.

    Memory is shared both ways and owned by ``buffer``. The buffer export is held until the last
    view of the tensor dies, so meanwhile a ``bytearray`` cannot be resized, an ``mmap`` cannot be
    closed and a ``memoryview`` cannot be released (each raises ``BufferError``). A read-only
    buffer (``bytes``, a read-only memoryview or NumPy array, an ``ACCESS_READ`` mmap) gives a
    read-only tensor: writes raise, and DLPack exports carry ``READ_ONLY``.

    Args:
        buffer: the exporter; its memory must be C-contiguous (a strided memoryview or NumPy view
            is refused).
        dtype: element type (keyword-only, required).
        count: number of elements; negative for "all the rest".
        offset: bytes to skip at the start of the buffer.
        requires_grad: carried to frameworks with autograd; floating and complex dtypes only.

    Returns:
        A tensor of shape ``(count,)`` and stride ``(1,)``.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``buffer`` exports no buffer, or count and offset do not fit inside it.
        RuntimeError: the exporter refused both a writable and a read-only C-contiguous buffer,
            or ``requires_grad`` was asked for a dtype that cannot have gradients.

    Example:
        >>> import array
        >>> a = array.array('i', [1, 2, 3])
        >>> t = frombuffer(a, dtype=tensorbridge.int32)
        >>> t[0] = -1
        >>> a
        array('i', [-1, 2, 3])
    """
    # PyTorch's order: argument types, then the buffer, then the lengths.
    if dtype.__class__ is not DType:
        dtype = as_dtype(dtype, "frombuffer")
    if count.__class__ is not int:
        count = as_int(count, "frombuffer", "count", argument=True)
    if offset.__class__ is not int:
        offset = as_int(offset, "frombuffer", "offset", argument=True)
    if requires_grad is not False:
        requires_grad = as_bool(requires_grad, "frombuffer", "requires_grad")
    storage = _acquire(buffer, "frombuffer")
    itemsize = dtype.itemsize
    try:
        numel = _element_count(storage.nbytes, count, offset, itemsize)
        if requires_grad and dtype.kind not in "fc":
            msg = f"frombuffer(): {GRAD_MSG_CREATE}; got dtype {dtype}. Pass a floating dtype."
            raise RuntimeError(msg)
    except BaseException:
        # Release the export now: the traceback keeps this frame, and the frame the export.
        del storage
        raise
    # The storage spans the whole buffer; nothing else has seen it yet, so narrow it in place.
    storage.ptr += offset
    storage.nbytes = numel * itemsize
    return _make(storage, 0, (numel,), (1,), dtype, requires_grad)


def _acquire(obj: Any, api: str) -> BufferStorage:
    """Hold a C-contiguous export of obj, writable if it allows: a storage over the whole buffer."""
    # bytes is never writable: asking would only cost a raised and caught BufferError.
    if obj.__class__ is not bytes:
        try:
            return BufferStorage(obj, _WRITABLE_REQUEST)
        except Exception:  # any exporter error means "try read-only", as in PyTorch and NumPy
            pass
    # The PYFUNCTYPE binding raised the failed request's error into Python, where it was caught:
    # no exception is pending when the second request runs (PyTorch 2.13 retries with one set).
    try:
        storage = BufferStorage(obj, _READONLY_REQUEST)
    except Exception as exc:
        if not _capi.PyObject_CheckBuffer(obj):
            msg = (
                f"{api}(): object does not implement Python buffer protocol. Got an object of "
                f"type {type(obj).__name__!r}; pass bytes, bytearray, memoryview, array.array, "
                f"mmap or another buffer exporter."
            )
            raise ValueError(msg) from None
        msg = (
            f"{api}(): could not retrieve buffer from object of type {type(obj).__name__!r} "
            f"({type(exc).__name__}: {exc}). Only C-contiguous memory can be shared; copy it "
            f"first (bytes(memoryview(obj)), numpy.ascontiguousarray(obj))."
        )
        raise RuntimeError(msg) from exc
    storage.readonly = True  # whatever the exporter says: it refused a writable export
    return storage


def _element_count(length: int, count: int, offset: int, itemsize: int) -> int:
    """The number of elements to view, checked in PyTorch's order and words, without overflow."""
    if length <= 0 or count == 0:
        msg = (
            f"frombuffer(): both buffer length ({length}) and count ({count}) must not be 0. "
            f"Pass a non-empty buffer and a non-zero count."
        )
        raise ValueError(msg)
    if offset < 0 or offset >= length:
        msg = (
            f"frombuffer(): offset ({offset} bytes) must be non-negative and no greater than "
            f"buffer length ({length} bytes) minus 1"
        )
        raise ValueError(msg)
    if count < 0:
        remaining = length - offset
        if remaining % itemsize:
            msg = (
                f"frombuffer(): buffer length ({remaining} bytes) after offset ({offset} bytes) "
                f"must be a multiple of element size ({itemsize}). Pass a count to read fewer."
            )
            raise ValueError(msg)
        return remaining // itemsize
    # Python ints: a huge count cannot wrap into a small request as PyTorch's size_t sum does.
    if offset + count * itemsize > length:
        msg = (
            f"frombuffer(): requested buffer length ({count} * {itemsize} bytes) after offset "
            f"({offset} bytes) must not be greater than actual buffer length ({length} bytes)"
        )
        raise ValueError(msg)
    return count


# -------------------------------------------------------------------------------------------------
# Export: memoryview (PEP 688)

# Every format handed to PyMemoryView_FromBuffer is a dtype's ``buffer_format``: a memoryview keeps
# only a pointer to the characters, and the interned dtypes keep those bytes objects alive as long
# as the interpreter. Dtypes without a PEP 3118 format (bfloat16, float8_*, float4_e2m1fn_x2,
# complex32) export their raw bits as unsigned integers of the same size, to consumers that did not
# ask for the format.
_BYTE_FORMAT: Final = uint8.buffer_format

# PyMemoryView_FromBuffer refuses NULL: a view of zero bytes needs some valid address.
_EMPTY: Final = ctypes.c_char()


def _host_memoryview(
    ptr: int, fmt: bytes, itemsize: int, shape: tuple[int, ...], *, readonly: bool, owner: object
) -> memoryview:
    """A C-contiguous memoryview of host memory at ``ptr`` that keeps ``owner`` alive.

    ``PyMemoryView_FromBuffer`` builds a view with any format and shape (``Zf``, ``e``, shapes
    with zeros: ``memoryview.cast`` makes none of them) but owns nothing. So the view it returns
    stays private (``inner``, held with ``owner`` in the export registry, `_exports`), and the
    view handed out is a new buffer export of ``inner``: ``pickle.PickleBuffer`` re-exports it,
    where ``memoryview(inner)`` would share inner's unowned buffer manager instead. Every slice,
    cast or re-export of the result shares a manager that holds an export of ``inner``, so
    ``owner`` lives at least as long as the last of them.
    """
    ndim = len(shape)
    nbytes = itemsize
    for n in shape:
        nbytes *= n
    view = _capi.Py_buffer()
    view.buf = ptr or ctypes.addressof(_EMPTY)
    view.len = nbytes
    view.itemsize = itemsize
    view.readonly = readonly
    view.ndim = ndim
    view.format = fmt
    shape_array = (ctypes.c_ssize_t * ndim)(*shape)
    strides_array = (ctypes.c_ssize_t * ndim)(*(s * itemsize for s in contiguous_strides(shape)))
    view.shape = shape_array
    view.strides = strides_array
    inner = _capi.PyMemoryView_FromBuffer(view)
    outer = memoryview(pickle.PickleBuffer(inner))
    # Registered only now that `outer` exports `inner`: a reap (any garbage collection, on any
    # thread) may release every registered inner view that nothing exports. `inner` copied shape
    # and strides; keeping the arrays as well means no pointer left in its manager can dangle.
    _exports.hold_view(inner, (owner, shape_array, strides_array), outer)
    return outer


def buffer_export(t: Tensor, flags: int) -> memoryview:
    """A memoryview of a contiguous host tensor: ``Tensor.__buffer__`` and ``as_memoryview()``.

    The view has the tensor's shape and, when the dtype has a PEP 3118 format, that format
    (``'f'``, ``'e'``, ``'?'``, ``'Zf'`` ...). Dtypes without one (bfloat16, float8_*,
    float4_e2m1fn_x2, complex32) export their raw bits as unsigned integers of the same size
    (``'B'``, ``'H'``, ``'I'``), but only when the consumer did not ask for the format
    (``as_memoryview()``, hashlib, ``file.write``): a consumer that requests ``PyBUF_FORMAT``
    (``memoryview(t)``, NumPy) would misread them, so it gets ``BufferError`` (and NumPy moves on
    to ``__array_interface__``).

    The memoryview shares the memory and keeps it alive by itself, after the tensor is gone too.
    It is read-only when the tensor is.

    Args:
        t: the tensor.
        flags: the consumer's ``PyBUF_*`` request flags (0 from ``as_memoryview()``).

    Raises:
        BufferError: the memory is not on the host, the tensor is not C-contiguous, a writable
            buffer was requested of a read-only tensor, or the format was requested for a dtype
            that has none.
    """
    api = "__buffer__"
    storage = t._storage
    if not storage.device.is_host_accessible:
        msg = (
            f"{api}(): the tensor's memory is on {storage.device} and cannot be exported as a "
            f"host buffer; export it with __dlpack__() to a library for {storage.device.type}."
        )
        raise BufferError(msg)
    if flags & _capi.PY_BUF_WRITABLE and storage.readonly:
        msg = (
            f"{api}(): a writable buffer was requested (flags=0x{flags:x}) but the tensor is "
            f"read-only. Request a read-only buffer, or export a clone()."
        )
        raise BufferError(msg)
    if not t.is_contiguous():
        msg = (
            f"{api}(): the tensor is not C-contiguous (shape {list(t._shape)}, strides "
            f"{list(t._strides)} in elements), so it has no single buffer. Call contiguous() "
            f"first (which copies)."
        )
        raise BufferError(msg)
    dtype = t._dtype
    fmt = dtype.buffer_format
    if dtype.format is None and flags & _capi.PY_BUF_FORMAT:
        msg = (
            f"{api}(): the buffer protocol has no format for {dtype}, and this consumer "
            f"asked for the element format. Use as_memoryview() for the raw bits (format "
            f"{fmt.decode()!r}), or view the tensor as an integer dtype of the same size."
        )
        raise BufferError(msg)
    return _host_memoryview(
        t.data_ptr(),
        fmt,
        dtype.itemsize,
        tuple(t._shape),
        readonly=storage.readonly,
        owner=storage.owner,
    )


# -------------------------------------------------------------------------------------------------
# Shared memory

# Segments this process created and has not unlinked yet; unlinked at exit at the latest.
_CREATED: Final[dict[str, SharedMemory]] = {}
_reducer_registered = False


def _unlink(name: str) -> None:
    shm = _CREATED.pop(name, None)
    if shm is not None:
        with contextlib.suppress(OSError):  # already unlinked (by hand, or by a resource tracker)
            shm.unlink()


class _SharedBlock:
    """A ``multiprocessing.shared_memory`` segment, mapped and held for one storage.

    The creating process unlinks the segment when the block dies (or at exit); processes that
    attached only unmap it. ``previous`` is the storage's owner before `share_memory` moved it
    here: exports made before the move that reach the memory through the tensor (NumPy arrays via
    ``__array_interface__``) still point into that memory, so it lives as long as the storage.
    """

    __slots__ = ("_held", "_previous", "_shm", "creator", "name", "ptr")

    def __init__(self, shm: SharedMemory, creator: bool, previous: object = None) -> None:
        self._shm = shm
        self.creator = creator
        self.name = shm.name
        self._previous = previous
        held, view = hold_buffer(shm.buf, _WRITABLE_REQUEST)
        self._held: object = held
        self.ptr: int = view.buf

    @property
    def size(self) -> int:
        """Bytes in the segment (at least what was asked for; may be rounded up to pages)."""
        return self._shm.size

    def __del__(self, _finalizing: Any = sys.is_finalizing, _unlink: Any = _unlink) -> None:
        # What it calls is bound as defaults: it may run while module globals are being cleared.
        if _finalizing():
            return  # leak the mapping; the atexit hook has unlinked what this process created
        self._held = None  # PyBuffer_Release first: SharedMemory.close() refuses while exported
        shm = getattr(self, "_shm", None)
        if shm is None:
            return
        try:
            shm.close()
        except (BufferError, OSError):
            return  # someone else still holds the mapping; it goes with them
        if self.creator:
            _unlink(self.name)


@atexit.register
def _unlink_created() -> None:
    # Mappings stay valid until the process ends; only the names go, so no segment outlives us.
    for name in list(_CREATED):
        _unlink(name)


@functools.cache
def _segment_type() -> type[SharedMemory]:
    """``SharedMemory`` without its closing finalizer (imported on first use: multiprocessing)."""
    from multiprocessing import shared_memory

    class _Segment(shared_memory.SharedMemory):
        # `_SharedBlock` closes the segment after releasing its buffer export. At interpreter exit
        # SharedMemory.__del__ would try to close it while the leaked export still pins it, and
        # print a BufferError; the mapping is left to the operating system instead.
        def __del__(self) -> None:
            pass

    return _Segment


def _create_block(nbytes: int, previous: object) -> _SharedBlock:
    # A zero-size segment is refused, so an empty storage gets one byte it never uses.
    shm = _segment_type()(create=True, size=max(nbytes, 1))
    _CREATED[shm.name] = shm
    try:
        return _SharedBlock(shm, creator=True, previous=previous)
    except BaseException:
        shm.close()
        _unlink(shm.name)
        raise


def _attach_block(name: str) -> _SharedBlock:
    if sys.version_info >= (3, 13):
        shm = _segment_type()(name=name, track=False)
    else:
        # NOTE: before 3.13 attaching also registers the name with the resource tracker. Processes
        # started by multiprocessing share their parent's tracker, where that is a no-op; an
        # unrelated process would unlink the segment when it exits (python/cpython#82300).
        shm = _segment_type()(name=name)
    return _SharedBlock(shm, creator=False)


def share_memory(t: Tensor) -> Tensor:
    """``Tensor.share_memory_()``: move the tensor's storage into shared memory; returns ``t``.

    Every view of the storage moves with it (they share one storage object). The bytes are copied
    into a new ``multiprocessing.shared_memory`` segment, so the tensor stops sharing memory with
    whatever provided it (a bytearray, a NumPy array). Exports made before the move keep the old
    memory, unchanged from then on: memoryviews, DLPack capsules and pickle buffers hold its
    owner, and the storage holds it too, for NumPy arrays made through ``__array_interface__``,
    until the storage dies. So call it right after creating the tensor. A tensor already in
    shared memory is returned as it is.

    Pickling such a tensor through ``multiprocessing`` (``Queue``, ``Pool``,
    ``ProcessPoolExecutor``) sends the segment's name: the receiving process maps the same memory,
    and each side sees the other's writes. The creating process unlinks the segment when its
    storage dies, so keep the tensor alive until the receiver has unpickled it.

    Raises:
        BufferError: the memory is not plain CPU memory.
    """
    storage = t._storage
    if isinstance(storage.owner, _SharedBlock):
        return t
    if storage.device != CPU:
        msg = (
            f"share_memory_(): only CPU tensors can be moved into shared memory; this one is "
            f"on {storage.device}. Share device memory with the library that owns it."
        )
        raise BufferError(msg)
    # A storage that owns its memory (an imported DLPack tensor) keeps it itself, until it dies.
    previous = None if storage.owner is storage else storage.owner
    block = _create_block(storage.nbytes, previous=previous)
    if storage.nbytes:
        ctypes.memmove(block.ptr, storage.ptr, storage.nbytes)
    # Storage attributes are plain slots: every view sees the move at once. The cached host view
    # points into the old memory, so it goes too.
    storage.ptr, storage.owner, storage._mv = block.ptr, block, None
    _register_process_reducer()
    return t


def _register_process_reducer() -> None:
    """Make ``multiprocessing``'s pickler send shared-memory tensors by name, as PyTorch does."""
    global _reducer_registered  # noqa: PLW0603 (once per process)
    if not _reducer_registered:
        from multiprocessing.reduction import ForkingPickler

        ForkingPickler.register(Tensor, _reduce_for_process)
        _reducer_registered = True


def _reduce_for_process(t: Tensor) -> tuple[Any, tuple[Any, ...]]:
    storage = t._storage
    owner = storage.owner
    if not isinstance(owner, _SharedBlock):
        return reduce_tensor(t, pickle.DEFAULT_PROTOCOL)
    return _rebuild_shared, (
        owner.name,
        storage.nbytes,
        t._dtype.name,
        tuple(t._shape),
        t._strides,
        t._offset,
        storage.readonly,
        t._requires_grad,
    )


def _rebuild_shared(
    name: str,
    nbytes: int,
    dtype_name: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    readonly: bool,
    requires_grad: bool,
) -> Tensor:
    """Unpickle a shared-memory tensor: map the segment by name (every process sees each write)."""
    block = _attach_block(name)
    storage = Storage(block.ptr, min(nbytes, block.size), CPU, readonly, block)
    t = _rebuilt(storage, dtype_name, shape, strides, offset, requires_grad)
    _register_process_reducer()  # so that this process sends it on by name too
    return t


# Bound last: `_pickle` builds on this module's memoryview export. `_rebuild_tensor` stays reachable
# under this module's name, which pickles written before the move record.
from ._pickle import _rebuild_tensor, _rebuilt, reduce_tensor  # noqa: E402, F401
