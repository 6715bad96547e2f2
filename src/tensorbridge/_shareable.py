"""Tensors across interpreters: `to_shareable` and `from_shareable`.

CPython 3.14's `concurrent.interpreters` (PEP 734) passes a few types between interpreters of one
process natively: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, tuples of these,
``memoryview`` and queues. A ``memoryview`` crosses without a copy: the receiving interpreter gets
a view of the very memory, and when that view dies CPython releases the buffer in the interpreter
that exported it. Everything else, a `Tensor` included, is pickled on ``Queue.put`` and by
``InterpreterPoolExecutor``, so it arrives as a copy (`_pickle` says what a pickle keeps).

`to_shareable` turns a tensor into a tuple of shareable values only: a ``uint8`` memoryview over
the bytes its elements span (gaps included, so nothing is copied, a strided view too), and its
dtype's name, shape, strides, element offset in that span, read-only flag and ``requires_grad``.
`from_shareable` checks and rebuilds that description as a protocol-5 pickle's is
(`_tensor._rebuild_from_buffer`, in its own words): a write on either side is
seen on the other, and a read-only tensor stays read-only.

Lifetime: the memoryview holds a buffer export of the tensor's memory, so the memory lives while
any view of it lives, in any interpreter (in a subinterpreter, whose close clears the export
registry, `_buffer_export.host_memoryview` holds the owner by references too). If the interpreter
that sent it is closed first, the memory stays valid in the others but is never freed: CPython can
no longer release the export in an interpreter that is gone, so it leaks it rather than freeing
memory still in use.
"""

from __future__ import annotations

from typing import Any, Final

from . import _pickle
from ._convert import convert
from ._errors import release_frames, short_repr
from ._tensor import Tensor, _rebuild_from_buffer

__all__ = ["TAG", "from_shareable", "to_shareable"]

# The first item of every shareable tuple: what it describes, and the layout of the tuple.
TAG: Final = "tensorbridge.Tensor/1"
_FIELDS: Final = ("tag", "data", "dtype", "shape", "strides", "offset", "readonly", "requires_grad")
_READER: Final = _pickle.Reader(
    "from_shareable",
    "a shared tensor",
    "Pass the tuple tensorbridge.to_shareable() returned, unchanged.",
)


def to_shareable(obj: Any) -> tuple[Any, ...]:
    """A tuple of values CPython shares between interpreters natively, describing ``obj``'s memory.

    Put it on a ``concurrent.interpreters`` queue, pass it to ``Interpreter.call`` or to an
    ``InterpreterPoolExecutor`` task (or return it from one), and call `from_shareable` on the
    other side: the tensor there views the same memory, without a copy. A write on one side is
    seen on the other; a read-only tensor arrives read-only. The memory lives until the last view
    of it, in any interpreter, is gone. Passing the tensor itself instead pickles it, which copies.

    The tuple is ``(TAG, data, dtype_name, shape, strides, offset, readonly, requires_grad)``:
    ``data`` is a 1-d ``uint8`` memoryview of every byte the elements span (a strided view's gaps
    included), and ``offset`` the first element's index in it, so a transposed, stepped or
    bfloat16 tensor crosses as it is.

    Args:
        obj: a `Tensor`, or anything `asarray` takes (converted by its rules: zero-copy from a NumPy
            array, a DLPack producer or a buffer, so their memory can cross too).

    Raises:
        BufferError: the memory is not on the host.

    Example:
        >>> import tensorbridge as tb
        >>> t = tb.arange(6, dtype=tb.bfloat16).reshape(2, 3).T
        >>> u = tb.from_shareable(tb.to_shareable(t))
        >>> u.data_ptr() == t.data_ptr(), u.shape, u.stride()
        (True, tensorbridge.Size([3, 2]), (1, 3))
    """
    api = "to_shareable"
    try:
        t = obj if type(obj) is Tensor else convert(obj, None, None, None, False, api)
    except BaseException as exc:
        release_frames(exc)
        raise
    storage = t._storage
    if not storage.device.is_host_accessible:
        msg = (
            f"{api}(): the tensor's memory is on {storage.device}; only host memory can be shared "
            f"between interpreters. Copy it to the host with the library that owns the device "
            f"memory first."
        )
        raise BufferError(msg)
    span = _pickle.span_bytes(t)
    if span is None:  # no elements: no bytes, and any strides fit
        data, offset = memoryview(b"" if storage.readonly else bytearray()), 0
    else:
        data, offset = span
    return (
        TAG,
        data,
        t._dtype.name,
        tuple(t._shape),
        t._strides,
        offset,
        storage.readonly,
        t._requires_grad,
    )


def from_shareable(obj: Any) -> Tensor:
    """The tensor `to_shareable` described, over the same memory: no copy.

    Call it in the interpreter that received the tuple (from a queue, ``Interpreter.call`` or an
    ``InterpreterPoolExecutor`` task). The tensor is writable when the sent one was and read-only
    when it was; its writes are seen by every other view of the memory, in any interpreter. What
    the tuple says is checked before the memory is touched, and a layout reaching outside the bytes
    sent is refused.

    Args:
        obj: the tuple `to_shareable` returned.

    Raises:
        TypeError: ``obj`` is not such a tuple, or holds a value of the wrong type.
        ValueError: an unknown dtype, or a shape, strides or offset that do not fit the bytes.
        BufferError: the data exports no contiguous memory.

    Example:
        >>> import tensorbridge as tb
        >>> t = tb.zeros(3)
        >>> tb.from_shareable(tb.to_shareable(t))[0] = 7
        >>> t
        tensor([7., 0., 0.])
    """
    if (
        type(obj) is not tuple
        or len(obj) != len(_FIELDS)
        or type(obj[0]) is not str
        or obj[0] != TAG
    ):
        msg = (
            f"from_shareable(): expected the tuple tensorbridge.to_shareable() returns "
            f"({', '.join(_FIELDS)}; its first item {TAG!r}); got {short_repr(obj)} "
            f"({type(obj).__name__}). Call tb.to_shareable(t) in the sending interpreter and pass "
            f"its result here unchanged."
        )
        raise TypeError(msg)
    _, data, dtype_name, shape, strides, offset, readonly, requires_grad = obj
    return _rebuild_from_buffer(
        data, dtype_name, shape, strides, offset, readonly, requires_grad, _READER
    )
