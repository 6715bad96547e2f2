"""Buffer-protocol export: ``Tensor.__buffer__`` (PEP 688: ``memoryview(t)``) and ``as_memoryview()``.

Below `Tensor`: it reads a tensor's storage, layout and dtype. The memoryview handed out keeps the
memory alive by itself, through the export registry (`_exports`), after the tensor is gone too; in a
subinterpreter, by references as well (`host_memoryview`).
"""

from __future__ import annotations

import ctypes
import pickle
import sys
from typing import TYPE_CHECKING, Final

from . import _capi, _exports
from ._build import in_subinterpreter
from ._layout import contiguous_strides

if TYPE_CHECKING:
    from ._tensor import Tensor

__all__ = ["buffer_export", "host_memoryview"]

# Every format handed to PyMemoryView_FromBuffer is a dtype's ``buffer_format``: a memoryview keeps
# only a pointer to the characters, and the interned dtypes keep those bytes objects alive as long
# as the interpreter. Dtypes without a PEP 3118 format (bfloat16, float8_*, float4_e2m1fn_x2,
# complex32) export their raw bits as unsigned integers of the same size, to consumers that did not
# ask for the format.

# PyMemoryView_FromBuffer refuses NULL: a view of zero bytes needs some valid address.
_EMPTY: Final = ctypes.c_char()

# Closing a subinterpreter clears its modules' globals, the export registry among them, while a view
# it handed to another interpreter may live on; there, views also reach their memory's owner by
# references alone (`_Held`). A class's __buffer__ makes a buffer from Python 3.12 on.
_HOLD_BY_REFERENCE: Final = sys.version_info >= (3, 12) and in_subinterpreter()


class _Held:
    """The exporter of a view handed out in a subinterpreter: it holds the registered view and what
    keeps its memory valid, and CPython keeps the exporter of a ``__buffer__`` view alive with the
    view, so the memory outlives the registry."""

    __slots__ = ("_keep", "_view")

    def __init__(self, view: memoryview, keep: object) -> None:
        self._view = view
        self._keep = keep

    def __buffer__(self, flags: int) -> memoryview:
        return memoryview(self._view)


def host_memoryview(
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
    keep = (owner, shape_array, strides_array)
    _exports.hold_view(inner, keep, outer)
    return memoryview(_Held(outer, keep)) if _HOLD_BY_REFERENCE else outer


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
    return host_memoryview(
        t.data_ptr(),
        fmt,
        dtype.itemsize,
        tuple(t._shape),
        readonly=storage.readonly,
        owner=storage.owner,
    )
