"""Buffer-protocol import: `frombuffer`, and `asarray`'s buffer path.

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

import math
from typing import Any, Final

from . import _capi, _layout
from ._args import GRAD_MSG_CREATE, as_bool, as_int
from ._capi import PY_BUF_FULL_RO
from ._device import CPU
from ._dtype import DType, as_dtype, from_format, uint8
from ._errors import refusal_fix, release_frames, short_repr
from ._interfaces import memory_refused
from ._native import describe_buffer
from ._storage import (
    READONLY_REQUEST,
    WRITABLE_REQUEST,
    BufferStorage,
    Storage,
    locate,
    refusal_of,
    refused,
)
from ._tensor import Tensor, _construct

__all__ = ["buffer_refused", "frombuffer", "import_buffer", "import_ndarray"]


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
    if type(dtype) is not DType:
        dtype = as_dtype(dtype, "frombuffer")
    if type(count) is not int:
        count = as_int(count, "frombuffer", "count", argument=True)
    if type(offset) is not int:
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
    except BaseException as exc:
        del storage  # the export is released now, not when the exception dies
        release_frames(exc)
        raise
    # The storage is exactly the viewed bytes, as PyTorch's: `_element_count` bounded them.
    storage.ptr += offset
    storage.nbytes = numel * itemsize
    # checked=True by position: a C call when compiled
    return _construct(Tensor, storage, 0, (numel,), (1,), dtype, "frombuffer", requires_grad, True)


def _acquire(obj: Any, api: str) -> BufferStorage:
    """Hold a C-contiguous export of obj, writable if it allows: a storage over the whole buffer."""
    # bytes is never writable: asking would only cost a raised and caught BufferError.
    if type(obj) is not bytes:
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
        raise buffer_refused(obj, exc, api, True) from exc
    storage.readonly = True  # whatever the exporter says: it refused a writable export
    return storage


def buffer_refused(obj: Any, exc: BaseException, api: str, contiguous: bool) -> RuntimeError:
    """PyTorch's `RuntimeError` for an exporter that gave no buffer ("could not retrieve buffer
    from object"), with the exporter's reason, the object and the fix: `refusal_fix`'s where it
    knows the reason (a released memoryview); a contiguous copy where ``contiguous`` memory was
    asked and the exporter does serve a strided buffer; else an exporter whose memory is still
    there. Error paths only (`frombuffer`, `asarray`'s buffer path)."""
    fix = refusal_fix(obj, exc)
    if fix is None and contiguous and _strided_only(obj):
        fix = (
            "Only C-contiguous memory can be shared; copy it first (bytes(memoryview(obj)), "
            "numpy.ascontiguousarray(obj))."
        )
    if fix is None:
        fix = "Pass an exporter whose memory is still there (not closed or released)."
    msg = (
        f"{api}(): could not retrieve buffer from object of type {type(obj).__name__!r} "
        f"({type(exc).__name__}: {exc}); got {short_repr(obj)}. {fix}"
    )
    return RuntimeError(msg)


def _strided_only(obj: Any) -> bool:
    """Whether ``obj``, which refused a C-contiguous buffer, serves a strided one."""
    try:
        BufferStorage(obj, PY_BUF_FULL_RO)  # released at once: nothing keeps it
    except Exception:
        return False
    return True


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
    if count * itemsize > length - offset:
        # Python ints: a huge count cannot wrap into a small request as PyTorch's size_t sum does.
        msg = (
            f"frombuffer(): requested buffer length ({count} * {itemsize} bytes) after offset "
            f"({offset} bytes) must not be greater than actual buffer length ({length} bytes)"
        )
        raise ValueError(msg)
    return count


# -------------------------------------------------------------------------------------------------
# Import: asarray's buffer path


_BYTE_STRINGS: Final[frozenset[type]] = frozenset({bytes, bytearray})


def import_buffer(obj: Any, api: str) -> Tensor:
    """A tensor sharing a buffer exporter's memory, with its format, shape and strides (`asarray`).

    ``bytes`` and ``bytearray`` are one dimension of unsigned bytes by definition: they take
    `frombuffer`'s acquisition (a writable request first). Other exporters are asked once for
    their full read-only description, whose ``readonly`` field then says whether the tensor may
    write.
    """
    if type(obj) in _BYTE_STRINGS:
        storage = _acquire(obj, api)
        return _construct(Tensor, storage, 0, (storage.nbytes,), (1,), uint8, api, False, True)
    t = _described(obj, api)
    assert t is not None  # None only for numpy=True
    return t


def _buffer_dtype(fmt: str, api: str) -> DType:
    """The dtype a buffer format names; non-native byte order and unknown formats are a `BufferError`."""
    dtype = from_format(fmt)
    if dtype is not None:
        return dtype
    order, rest = fmt[:1], fmt[1:]
    if order in "<>!":
        single = from_format(rest)
        if single is not None and single.itemsize == 1:  # byte order means nothing for one byte
            return single
        if single is not None or from_format("=" + rest) is not None:
            msg = (
                f"{api}(): the buffer's format {fmt!r} has non-native byte order; tensors are "
                f"native-endian. Byte-swap the data first, or reinterpret the raw bytes with "
                f"tensorbridge.frombuffer(obj, dtype=...)."
            )
            raise BufferError(msg)
    msg = (
        f"{api}(): the buffer's format {fmt!r} names no tensor dtype; supported are the single "
        f"native struct codes ?, b, B, h, H, i, I, l, L, q, Q, n, N, e, f, d, Zf, Zd. Reinterpret the "
        f"raw bytes with tensorbridge.frombuffer(obj, dtype=...)."
    )
    raise BufferError(msg)


# The dtype of each buffer format met so far, with its itemsize (the bytes of ``Py_buffer.format``,
# None meaning 'B'). Only formats that name a dtype are kept, so the table stays as small as the set
# of valid formats.
_FORMAT_DTYPES: Final[dict[bytes | None, tuple[DType, int]]] = {}
_known_format: Final = _FORMAT_DTYPES.get  # bound once: a method lookup costs as much as the call


def _format_dtype(fmt: bytes | None, api: str) -> tuple[DType, int]:
    dtype = _buffer_dtype(fmt.decode("ascii", "replace") if fmt else "B", api)
    known = _FORMAT_DTYPES[fmt] = (dtype, dtype.itemsize)
    return known


_UNIT_STRIDE: Final[tuple[int, ...]] = (1,)


def _described(obj: Any, api: str, numpy: bool = False) -> Tensor | None:
    """A tensor over a buffer as its exporter describes it (format, shape, strides, readonly).

    The export stays held (``PyBuffer_Release`` when the last view dies), so the exporter cannot be
    resized or closed meanwhile. A layout that covers the whole buffer (any contiguous one) has the
    held export itself as its storage; a strided one, a storage over the bytes it reaches.

    ``numpy``: the exporter is a NumPy array, which rewrites the strides of a dimension of size 0 or
    1 in its buffer (any value is valid there, and NumPy's own may be 0 or a step of a parent
    view): None then, so that the caller reads NumPy's own strides through DLPack.
    """
    held = BufferStorage(obj, PY_BUF_FULL_RO)
    buf, length, fmt, view_itemsize, ndim, shape, byte_strides, indirect, contiguous = (
        describe_buffer(held.view)
    )
    if indirect:
        msg = (
            f"{api}(): the buffer of {type(obj).__name__} uses suboffsets (PIL-style indirect "
            f"arrays), which tensors cannot describe. Copy it into a contiguous buffer first."
        )
        raise BufferError(msg)
    known = _known_format(fmt)
    dtype, itemsize = _format_dtype(fmt, api) if known is None else known
    if view_itemsize != itemsize:
        msg = (
            f"{api}(): the buffer's itemsize {view_itemsize} does not match its format "
            f"{fmt!r} ({itemsize} bytes); the exporter is malformed."
        )
        raise BufferError(msg)
    if ndim != 1 or shape is None:
        shape = _odd_shape(obj, ndim, shape, length // itemsize, api)
    numel = 1
    for size in shape:
        if size <= 1:
            if numpy:
                return None
            if size < 0:
                numel = -1  # no valid shape has a negative size
                break
        numel *= size
    if numel * itemsize != length:
        # ``len`` is the size of the data copied contiguously, whatever the strides; a shape that
        # claims more elements would read past the exporter's memory, one that claims fewer
        # would hide some: either way the exporter is inconsistent, and neither field is trusted.
        msg = (
            f"{api}(): the buffer of {type(obj).__name__} is malformed: its shape {list(shape)} "
            f"of {itemsize}-byte items needs {math.prod(shape) * itemsize} bytes, but its len "
            f"is {length}. Fix the exporter, or read the bytes with "
            f"tensorbridge.frombuffer(obj, dtype=...)."
        )
        raise BufferError(msg)
    if contiguous and ndim == 1:
        strides = _UNIT_STRIDE  # the one row-major stride (a single item's may be any)
    elif byte_strides is None:
        strides = _layout.contiguous_strides(shape)
    else:
        strides = _element_strides(shape, byte_strides, itemsize, api)
    storage: Storage
    if contiguous and (buf or not numel):
        storage, offset = held, 0  # the items fill the buffer's own [buf, buf + len)
    else:
        # The exporter vouches for its strides; ``len`` is the logical size, not the extent of a
        # strided view, so it bounds the element count (checked above) but not the strides.
        try:
            start, nbytes, offset = locate(buf, None, 0, shape, strides, itemsize, api, refused)
        except BufferError as exc:
            refusal = refusal_of(exc)
            if refusal is None:
                raise
            del held  # release the export now, not when the traceback's frames die
            raise memory_refused(refusal, dtype) from None
        storage = held
        if start != buf or nbytes != length:
            storage = Storage(start, nbytes, CPU, held.readonly, held)
    return _construct(Tensor, storage, offset, shape, strides, dtype, api, False, True)


def _odd_shape(
    obj: Any, ndim: int, shape: tuple[int, ...] | None, count: int, api: str
) -> tuple[int, ...]:
    """The shape of a buffer that is not a described single dimension: ``()`` for 0-d, ``count``
    items for a 1-D buffer with no shape (the protocol's rule), else the exporter's own."""
    if not ndim:
        return ()
    if shape is not None:
        return shape
    if ndim == 1:
        return (count,)
    msg = f"{api}(): the buffer of {type(obj).__name__} has {ndim} dimensions but no shape."
    raise BufferError(msg)


def _element_strides(
    shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int, api: str
) -> tuple[int, ...]:
    """A buffer's strides in items; `BufferError` unless each that addresses memory is a whole
    number of them (`_layout.element_strides`)."""
    if itemsize == 1:
        return byte_strides
    strides = _layout.element_strides(shape, byte_strides, itemsize)
    if strides is None:
        msg = (
            f"{api}(): the buffer's strides {byte_strides} (bytes) are not multiples of its "
            f"itemsize ({itemsize}); tensor strides count whole elements."
        )
        raise BufferError(msg)
    return strides


def import_ndarray(obj: Any, api: str) -> Tensor | None:
    """A NumPy array read through its buffer (format, shape, strides, read-only), as PyTorch reads
    one through NumPy's own C API; None when the buffer cannot describe it exactly (a dtype no
    buffer format names, such as datetimes or structured records; non-native byte order; strides
    that are not whole elements; a dimension of size 0 or 1, whose stride the buffer rewrites). The
    caller then asks DLPack, whose answer or refusal is `asarray`'s.
    """
    try:
        return _described(obj, api, True)
    except Exception:  # the buffer cannot say it; DLPack decides
        return None


# Pickles written by earlier versions name this module's ``_rebuild_tensor``.
from ._tensor import _rebuild_tensor  # noqa: E402, F401
