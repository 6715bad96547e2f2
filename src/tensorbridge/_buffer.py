"""Buffer-protocol import (`frombuffer`), and the pickling and shared memory built on buffers.

Import, `frombuffer`: any object that exports a C-contiguous buffer (bytes, bytearray, memoryview,
array.array, mmap, ctypes objects, shared memory, ``pickle.PickleBuffer``, NumPy arrays, any C
extension) becomes a 1-D tensor over the same bytes. Unlike PyTorch, which releases it at once, the export is
*held*: the ``Py_buffer`` from ``PyObject_GetBuffer`` is released only when the last view dies, so
the exporter refuses to resize, close or release its memory while a tensor can still read it.
Read-only exporters give read-only tensors, where PyTorch warns and hands out a writable tensor.

Export (``memoryview(t)``, ``as_memoryview()``) is `_buffer_export`, below `Tensor`.

Pickling, `reduce_tensor`: protocol 5 hands the bytes over as a ``pickle.PickleBuffer`` (out of
band with ``buffer_callback``: no copy at all), older protocols as ``bytes``.

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

from . import _capi
from ._args import GRAD_MSG_CREATE, as_bool, as_int
from ._buffer_export import host_memoryview
from ._device import CPU
from ._dtype import BY_NAME, DType, as_dtype, uint8
from ._layout import contiguous_strides, extent
from ._storage import BufferStorage, Refusal, Storage, allocate, hold_buffer
from ._tensor import Tensor

if TYPE_CHECKING:
    from multiprocessing.shared_memory import SharedMemory

__all__ = ["frombuffer", "reduce_tensor", "share_memory"]

# A simple request (no shape, no strides) is C-contiguous by definition: the exporter hands over
# `len` contiguous bytes or fails. PyTorch and NumPy ask exactly this, writable first.
_WRITABLE_REQUEST: Final = _capi.PY_BUF_SIMPLE | _capi.PY_BUF_WRITABLE
_READONLY_REQUEST: Final = _capi.PY_BUF_SIMPLE


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
    t = None
    try:
        length = storage.nbytes
        numel = _element_count(length, count, offset, itemsize)
        # The storage spans the buffer from ``offset``; the one bounds check (`Tensor._new`)
        # refuses a count reaching past its end, in PyTorch's words.
        storage.ptr += offset
        storage.nbytes = length - offset
        t = Tensor._new(
            storage,
            0,
            (numel,),
            (1,),
            dtype,
            "frombuffer",
            requires_grad,
            functools.partial(_too_long, count, offset, length),
        )
        if requires_grad and dtype.kind not in "fc":
            msg = f"frombuffer(): {GRAD_MSG_CREATE}; got dtype {dtype}. Pass a floating dtype."
            raise RuntimeError(msg)
    except BaseException as exc:
        # Release the export now: a traceback keeps its frames, and the frames the export.
        del storage, t
        raise exc.with_traceback(None)  # noqa: B904  (the same exception, without those frames)
    storage.nbytes = numel * itemsize  # exactly the viewed bytes, as PyTorch's storage
    return t


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
    """The number of elements to view: PyTorch's argument checks, in its order and words."""
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
    return count  # checked against the buffer's length by `_storage.locate`


def _too_long(count: int, offset: int, length: int, r: Refusal) -> ValueError:
    """PyTorch's words for a count that reaches past the buffer (any reason `locate` gives)."""
    # Python ints: a huge count cannot wrap into a small request as PyTorch's size_t sum does.
    msg = (
        f"frombuffer(): requested buffer length ({count} * {r.itemsize} bytes) after offset "
        f"({offset} bytes) must not be greater than actual buffer length ({length} bytes)"
    )
    return ValueError(msg)


# -------------------------------------------------------------------------------------------------
# Pickling


def reduce_tensor(t: Tensor, protocol: int) -> tuple[Any, tuple[Any, ...]]:
    """``Tensor.__reduce_ex__``: the tensor's bytes and the metadata to rebuild it.

    Protocol 5 wraps the bytes in a ``pickle.PickleBuffer`` over the tensor's own memory: with
    ``pickle.dumps(t, protocol=5, buffer_callback=...)`` they travel out of band without a copy,
    and ``pickle.loads(data, buffers=...)`` builds the tensor over the buffers it is given, again
    without a copy when they are writable (or the tensor was read-only). Older protocols carry
    ``bytes``; in band, protocol 5 stores a ``bytearray`` that the new tensor adopts.

    The round trip keeps dtype, shape, ``requires_grad``, the read-only flag and the strides, except
    for a view with gaps between its elements (a step, a narrowed dimension), which arrives as a
    contiguous copy so that no bytes outside the view travel. Plain pickling always carries the
    bytes, for tensors in shared memory too; only ``multiprocessing`` sends those by name.

    Raises:
        BufferError: the memory is not on the host.
    """
    storage = t._storage
    if not storage.device.is_host_accessible:
        msg = (
            f"__reduce_ex__(): cannot pickle a tensor whose memory is on {storage.device}; "
            f"move it to the CPU with the library that owns the device memory first."
        )
        raise BufferError(msg)
    data, offset, strides = _pickled_bytes(t)
    payload: Any = pickle.PickleBuffer(data) if protocol >= 5 else bytes(data)
    return _rebuild_tensor, (
        payload,
        t._dtype.name,
        tuple(t._shape),
        strides,
        offset,
        storage.readonly,
        t._requires_grad,
    )


def _pickled_bytes(t: Tensor) -> tuple[memoryview | bytearray, int, tuple[int, ...]]:
    """The bytes to pickle, and the element offset and strides of the tensor inside them.

    When the elements span no more memory than they number (contiguous in any dimension order,
    reversed, broadcast), that span is sent and the layout kept; a view with gaps is packed.
    """
    storage, itemsize = t._storage, t._dtype.itemsize
    span = extent(t._offset, t._shape, t._strides)
    if span is None:
        return bytearray(), 0, t._strides  # no elements, no bytes: any strides fit
    low, high = span
    if high - low + 1 <= t.numel():
        view = host_memoryview(
            storage.ptr + low * itemsize,
            uint8.buffer_format,
            1,
            ((high - low + 1) * itemsize,),
            readonly=storage.readonly,
            owner=storage.owner,
        )
        return view, t._offset - low, t._strides
    return t._bytes("__reduce_ex__"), 0, contiguous_strides(t._shape)


def _rebuild_tensor(
    data: Any,
    dtype_name: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    readonly: bool,
    requires_grad: bool,
) -> Tensor:
    """Unpickle: a tensor over ``data`` (bytes, bytearray, PickleBuffer, ...), bounds-checked."""
    return _rebuilt(
        _storage_over(data, readonly), dtype_name, shape, strides, offset, requires_grad
    )


def _rebuilt(
    storage: Storage,
    dtype_name: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    requires_grad: bool,
) -> Tensor:
    # Tensor._new checks the layout against the storage: a crafted pickle cannot reach outside it.
    t = Tensor._new(storage, offset, shape, strides, BY_NAME[dtype_name], "__reduce_ex__")
    if requires_grad:
        t.requires_grad_(True)
    return t


def _storage_over(data: Any, readonly: bool) -> Storage:
    """A storage sharing ``data``'s memory, or a writable copy when ``data`` cannot be written."""
    try:
        held, view = hold_buffer(data, _READONLY_REQUEST if readonly else _WRITABLE_REQUEST)
    except Exception:  # exporters word "not writable" as BufferError, ValueError (NumPy), ...
        if readonly:
            raise
        # A read-only buffer for a writable tensor (``bytes`` from protocol <= 4, out-of-band
        # buffers the receiver made read-only): copy, so the tensor is writable as it was.
        source = memoryview(data).cast("B")
        storage = allocate(source.nbytes)
        if source.nbytes:
            storage.host_view("__reduce_ex__")[:] = source
        return storage
    return Storage(view.buf or 0, view.len, CPU, readonly, held)


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
