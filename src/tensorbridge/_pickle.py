"""Pickling: what ``Tensor.__reduce_ex__`` sends, and the storages a pickle is rebuilt over.

Below `Tensor`: the rebuild functions a pickle names live beside the class, in `_tensor`, and
call `buffer_storage` (protocol 5) or `storage_over` (protocols 0 to 4) from here.

What is sent: the bytes the tensor's elements span, with dtype, shape, strides, storage offset,
``requires_grad`` and the read-only flag. A dense layout (contiguous in any dimension order,
reversed, broadcast) is kept as it is; a view with gaps between its elements (a step, a narrowed
dimension) is packed into a contiguous copy, so that no bytes outside the view travel.

Protocol 5 hands those bytes over as a ``pickle.PickleBuffer`` over the tensor's own memory. With
``pickle.dumps(t, protocol=5, buffer_callback=...)`` they leave the pickle stream (out of band) and
nothing is copied; ``pickle.loads(data, buffers=[...])`` is then given one buffer per tensor, which
the rule below turns back into a tensor. Older protocols carry ``bytes`` in the stream.

The unpickling rule, NumPy's rule for arrays:

* An out-of-band buffer that is **read-only** gives a **read-only tensor over that very memory**,
  without a copy, even when the pickled tensor was writable. Writes raise; ``clone()`` gives a
  private writable copy.
* An out-of-band buffer that is **writable** gives a tensor over it that is writable when the
  pickled tensor was (writes reach the buffer's owner), read-only when it was not.
* In band, nothing changes: protocol 5 stores a ``bytearray`` for a writable tensor, which the new
  tensor adopts (writable), and ``bytes`` for a read-only one, which it shares (read-only).
  Protocols 0 to 4 store ``bytes``; a writable tensor rebuilt from them gets a writable copy.

Why: the stores that move pickle-5 buffers between processes hand them out read-only, because many
readers map one copy of the memory (Ray's shared-memory object store; a received network frame;
an ``mmap`` opened for reading). Copying into writable memory would cost a full pass over the data
on every read (tens of milliseconds for 64 MiB), and handing out a writable tensor over read-only
memory would let one reader corrupt what every other reader sees. A read-only tensor is both free
and safe, and tensorbridge, unlike PyTorch, has read-only tensors. Protocols 0 to 4 keep the copy
because their ``bytes`` always come from the stream, so a writable tensor stays writable.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from ._args import as_int
from ._buffer_export import host_memoryview
from ._device import CPU
from ._dtype import BY_NAME, DType, uint8
from ._errors import short_repr
from ._layout import MAX_NDIM, MAX_SIZE, check_sizes, contiguous_strides, extent
from ._storage import READONLY_REQUEST, WRITABLE_REQUEST, Storage, allocate, hold_buffer

if TYPE_CHECKING:
    from ._tensor import Tensor

__all__ = [
    "PICKLE",
    "Reader",
    "buffer_storage",
    "checked_layout",
    "checked_nbytes",
    "reduce_args",
    "refusal",
    "span_bytes",
    "storage_over",
]


class Reader(NamedTuple):
    """Who reads a tensor's description, as its refusals say it: the function the user called,
    what the description is called, and the fix every refusal ends with."""

    api: str
    subject: str
    fix: str


# Pickles (`_tensor`'s rebuild functions, `_shared`, `_dask`'s headers).
PICKLE: Final = Reader(
    "pickle.loads",
    "a pickled tensor",
    "The pickle was damaged or altered after tensorbridge wrote it; pickle the tensor again.",
)


def reduce_args(t: Tensor, protocol: int) -> tuple[Any, ...]:
    """``Tensor.__reduce_ex__``'s arguments: the tensor's bytes and the metadata to rebuild it.

    Protocol 5 wraps the bytes in a ``pickle.PickleBuffer`` over the tensor's own memory (rebuilt
    by ``_tensor._rebuild_from_buffer``): with ``pickle.dumps(t, protocol=5, buffer_callback=...)``
    they travel out of band without a copy, and ``pickle.loads(data, buffers=...)`` builds the
    tensor over the buffers it is given, never copying (read-only when the buffer is; see the
    module docstring). Older protocols carry ``bytes`` (rebuilt by ``_tensor._rebuild_tensor``).

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
    payload = pickle.PickleBuffer(data) if protocol >= 5 else bytes(data)
    return (
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
    span = span_bytes(t)
    if span is None:
        return bytearray(), 0, t._strides  # no elements, no bytes: any strides fit
    view, offset = span
    if view.nbytes <= t.numel() * t._dtype.itemsize:
        return view, offset, t._strides
    return t._bytes("__reduce_ex__"), 0, contiguous_strides(t._shape)


def span_bytes(t: Tensor) -> tuple[memoryview, int] | None:
    """A 1-d ``uint8`` memoryview of every byte a host tensor's elements span, gaps included,
    over the tensor's own memory (read-only when it is; it keeps the memory alive by itself), and
    the tensor's element offset inside it; None when the tensor has no elements."""
    storage, itemsize = t._storage, t._dtype.itemsize
    span = extent(t._offset, t._shape, t._strides)
    if span is None:
        return None
    low, high = span
    view = host_memoryview(
        storage.ptr + low * itemsize,
        uint8.buffer_format,
        1,
        ((high - low + 1) * itemsize,),
        readonly=storage.readonly,
        owner=storage.owner,
    )
    return view, t._offset - low


def buffer_storage(data: Any, readonly: bool, reader: Reader = PICKLE) -> Storage:
    """Protocol 5: a storage over ``data``'s own memory, never a copy.

    ``data`` is the in-band ``bytearray`` or ``bytes``, or the out-of-band buffer passed to
    ``pickle.loads(buffers=...)``. The storage is read-only when the tensor was pickled read-only
    or when ``data`` refuses a writable export (NumPy's rule); see the module docstring for why.

    Raises:
        BufferError: ``data`` exports no C-contiguous buffer.
    """
    held = None
    if not readonly:
        try:
            held, view = hold_buffer(data, WRITABLE_REQUEST)
        except Exception:  # exporters word "not writable" as BufferError, ValueError (NumPy), ...
            readonly = True
    if held is None:
        try:
            held, view = hold_buffer(data, READONLY_REQUEST)
        except Exception as exc:
            fix = (
                "Pass the buffers that buffer_callback received, or contiguous copies of them."
                if reader is PICKLE
                else reader.fix
            )
            raise BufferError(_not_memory(data, exc, "buffer", fix, reader)) from None
    return Storage(view.buf or 0, view.len, CPU, readonly, held)


def storage_over(data: Any, readonly: bool) -> Storage:
    """A storage sharing ``data``'s memory, or a writable copy when ``data`` cannot be written.

    Raises:
        BufferError: ``data`` exports no C-contiguous buffer (``None``, a ``str``, a strided view).
    """
    try:
        held, view = hold_buffer(data, READONLY_REQUEST if readonly else WRITABLE_REQUEST)
    # Exporters word "not writable" as BufferError, ValueError (NumPy), ...
    except Exception as exc:
        if readonly:
            raise BufferError(_not_memory(data, exc, "data", PICKLE.fix, PICKLE)) from None
        # A read-only buffer for a writable tensor (``bytes`` from protocol <= 4, out-of-band
        # buffers the receiver made read-only): copy, so the tensor is writable as it was.
        try:
            source = memoryview(data).cast("B")
        except Exception as exc:
            raise BufferError(_not_memory(data, exc, "data", PICKLE.fix, PICKLE)) from None
        storage = allocate(source.nbytes)
        if source.nbytes:
            storage.host_view("__reduce_ex__")[:] = source
        return storage
    return Storage(view.buf or 0, view.len, CPU, readonly, held)


def checked_layout(
    dtype_name: object,
    shape: object,
    strides: object,
    offset: object,
    readonly: object,
    requires_grad: object,
    reader: Reader = PICKLE,
) -> tuple[DType, tuple[int, ...], tuple[int, ...], int, bool, bool]:
    """What a pickle says about a tensor, checked before anything is built from it.

    `reduce_args` writes a dtype name, tuples of ints, an int and two bools; a pickle altered after
    that is refused here, before any memory is opened, held or mapped for it, as `Tensor._new` then
    refuses a layout outside its storage. An integer is what ``operator.index`` takes
    (`_args.as_int`: the rule of PyTorch's sizes and of Python's own indices), so ``int`` and its
    subclasses and NumPy integers, normalised to ``int`` so that the tensor holds plain ints; not
    ``bool`` (``True`` is a flag, not a size) and not ``float``, not even ``2.0``, which
    `reduce_args` never writes. Every number fits int64, as in every tensor DLPack, PyTorch and NumPy
    can hold: the sizes and their product by `_layout.check_sizes` (the one rule for sizes that enter
    from outside), each stride's magnitude and the offset up to ``2**63 - 1``; the offset is not
    negative.

    Raises:
        TypeError: a value of the wrong type (a float size, a bool offset, a str flag).
        ValueError: a dtype tensorbridge does not have, a negative size or offset, more than
            ``MAX_NDIM`` dimensions, not one stride per dimension, or a number past int64.
    """
    dtype = BY_NAME.get(dtype_name) if type(dtype_name) is str else None
    who = reader.subject
    if dtype is None:
        msg = f"{who}'s dtype {short_repr(dtype_name)} is not a tensorbridge dtype"
        raise ValueError(refusal(msg, reader))
    sizes = _ints(shape, "shape", reader)
    if len(sizes) > MAX_NDIM:
        msg = f"{who} has {len(sizes)} dimensions; at most {MAX_NDIM} are supported"
        raise ValueError(refusal(msg, reader))
    if any(size < 0 for size in sizes):
        raise ValueError(refusal(f"{who}'s shape {list(sizes)} has a negative size", reader))
    try:
        check_sizes(sizes, reader.api, f"{who}'s shape", ValueError)
    except ValueError as exc:
        msg = f"{exc} {reader.fix}"
        raise ValueError(msg) from None
    steps = _ints(strides, "strides", reader)
    if len(steps) != len(sizes):
        msg = (
            f"{who}'s strides {list(steps)} do not match its shape {list(sizes)}: "
            f"one stride per dimension"
        )
        raise ValueError(refusal(msg, reader))
    for step in steps:
        if abs(step) > MAX_SIZE:
            msg = (
                f"{who}'s strides {list(steps)} hold {step}, past int64: a stride is "
                f"at most 2**63 - 1 elements either way"
            )
            raise ValueError(refusal(msg, reader))
    start = _int(offset, "storage offset must be an int", reader)
    if not 0 <= start <= MAX_SIZE:
        msg = f"{who}'s storage offset must be 0 to 2**63 - 1; got {start}"
        raise ValueError(refusal(msg, reader))
    return (
        dtype,
        sizes,
        steps,
        start,
        _flag(readonly, "read-only flag", reader),
        _flag(requires_grad, "requires_grad", reader),
    )


def checked_nbytes(nbytes: object) -> int:
    """A shared-memory pickle's byte count, checked before any segment is opened for it.

    An integer by `checked_layout`'s rule (`_args.as_int`), from 0 to ``2**63 - 1``.

    Raises:
        TypeError: not an integer (``1.5``, ``"8"``, ``None``, ``True``).
        ValueError: negative, or past int64.
    """
    count = _int(nbytes, "byte count (nbytes) must be an int", PICKLE)
    if not 0 <= count <= MAX_SIZE:
        msg = f"a pickled tensor's byte count (nbytes) must be 0 to 2**63 - 1; got {count}"
        raise ValueError(refusal(msg))
    return count


def refusal(what: str, reader: Reader = PICKLE) -> str:
    """The message for a refused description: the function, what is wrong with it, and the fix."""
    return f"{reader.api}(): {what}. {reader.fix}"


def _not_memory(data: object, exc: BaseException, what: str, fix: str, reader: Reader) -> str:
    """The message for a tensor's bytes that export no C-contiguous memory."""
    return (
        f"{reader.api}(): a tensor's {what} must export C-contiguous memory; got "
        f"{type(data).__name__} ({type(exc).__name__}: {exc}). {fix}"
    )


def _ints(values: object, what: str, reader: Reader) -> tuple[int, ...]:
    """A tuple of ints (a list is taken too), each by `_int`."""
    if not isinstance(values, (tuple, list)):
        msg = (
            f"{reader.subject}'s {what} must be a tuple of ints; got {short_repr(values)} "
            f"({type(values).__name__})"
        )
        raise TypeError(refusal(msg, reader))
    return tuple([_int(v, f"{what} must hold ints", reader, values) for v in values])


def _int(value: object, rule: str, reader: Reader, within: object = None) -> int:
    """One integer (``within`` the tuple that holds it), by `_args.as_int`'s rule; refused in
    ``reader``'s words."""
    try:
        return as_int(value, reader.api, "value")
    except TypeError:
        pass
    got = short_repr(value) if within is None else f"{short_repr(value)} in {short_repr(within)}"
    msg = f"{reader.subject}'s {rule}; got {got} ({type(value).__name__})"
    raise TypeError(refusal(msg, reader))


def _flag(value: object, what: str, reader: Reader) -> bool:
    """A flag: exactly True or False."""
    if type(value) is not bool:
        msg = (
            f"{reader.subject}'s {what} must be True or False; got {short_repr(value)} "
            f"({type(value).__name__})"
        )
        raise TypeError(refusal(msg, reader))
    return value
