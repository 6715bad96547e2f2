"""Pickling: ``Tensor.__reduce_ex__`` and the functions that rebuild a tensor from a pickle.

Protocol 5 hands the bytes over as a ``pickle.PickleBuffer`` (out of band with
``buffer_callback``: no copy at all), older protocols as ``bytes``.
"""

from __future__ import annotations

import pickle
from typing import Any

from . import _buffer
from ._device import CPU
from ._dtype import BY_NAME
from ._layout import contiguous_strides, extent
from ._storage import Storage, allocate, hold_buffer
from ._tensor import Tensor

__all__ = ["reduce_tensor"]


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
        view = _buffer._host_memoryview(
            storage.ptr + low * itemsize,
            _buffer._BYTE_FORMAT,
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
        held, view = hold_buffer(
            data, _buffer._READONLY_REQUEST if readonly else _buffer._WRITABLE_REQUEST
        )
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
