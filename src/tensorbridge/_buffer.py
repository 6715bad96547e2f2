"""Buffer-protocol import: `frombuffer`.

Any object that exports a C-contiguous buffer (bytes, bytearray, memoryview, array.array, mmap,
ctypes objects, shared memory, ``pickle.PickleBuffer``, NumPy arrays, any C extension) becomes a
1-D tensor over the same bytes. Unlike PyTorch, which releases it at once, the export is *held*:
the ``Py_buffer`` from ``PyObject_GetBuffer`` is released only when the last view dies, so the
exporter refuses to resize, close or release its memory while a tensor can still read it.
Read-only exporters give read-only tensors, where PyTorch warns and hands out a writable tensor.

Export (``memoryview(t)``, ``as_memoryview()``) is `_buffer_export`; pickling `_pickle`; shared
memory `_shared`: all three below `Tensor`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _capi
from ._args import GRAD_MSG_CREATE, as_bool, as_int
from ._dtype import DType, as_dtype
from ._storage import (
    READONLY_REQUEST,
    WRITABLE_REQUEST,
    BufferStorage,
)
from ._tensor import Tensor

if TYPE_CHECKING:
    pass

__all__ = ["frombuffer"]


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
        # refuses a count reaching past its end, reworded as PyTorch words it.
        storage.ptr += offset
        storage.nbytes = length - offset
        try:
            t = Tensor._new(storage, 0, (numel,), (1,), dtype, "frombuffer", requires_grad)
        except ValueError:  # the only refusal possible here: the count reaches past the end
            t = None  # raised below, outside this handler: no context keeps the export alive
        if t is None:
            raise _too_long(count, offset, length, itemsize)
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
            return BufferStorage(obj, WRITABLE_REQUEST)
        except Exception:  # any exporter error means "try read-only", as in PyTorch and NumPy
            pass
    # The PYFUNCTYPE binding raised the failed request's error into Python, where it was caught:
    # no exception is pending when the second request runs (PyTorch 2.13 retries with one set).
    try:
        storage = BufferStorage(obj, READONLY_REQUEST)
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


def _too_long(count: int, offset: int, length: int, itemsize: int) -> ValueError:
    """PyTorch's words for a count that reaches past the end of the buffer."""
    # Python ints: a huge count cannot wrap into a small request as PyTorch's size_t sum does.
    msg = (
        f"frombuffer(): requested buffer length ({count} * {itemsize} bytes) after offset "
        f"({offset} bytes) must not be greater than actual buffer length ({length} bytes)"
    )
    return ValueError(msg)


# Pickles written by earlier versions name this module's ``_rebuild_tensor``.
from ._tensor import _rebuild_tensor  # noqa: E402, F401
