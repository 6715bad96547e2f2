"""Dask: the size Dask accounts a tensor at, and the frames ``distributed`` sends it as.

Neither Dask nor ``distributed`` is imported here, nor by ``import tensorbridge``. Dask calls
`register` through the ``dask.sizeof`` entry point (pyproject.toml) when ``dask.sizeof`` loads, which
``import dask`` does first thing, in every process that uses Dask (clients, schedulers, workers).

* **sizeof** -- `register` adds `sizeof_tensor` to Dask's ``sizeof`` there and then: the bytes the
  tensor addresses, counted as Dask counts a NumPy array (``x.nbytes``, a dimension of stride 0
  counted once): a view is charged its own elements, not the storage it keeps alive, as an ndarray
  view is charged its own and not its base's. That is ``t.nbytes`` for every dtype and layout but
  broadcast ones, where it is the bytes that exist (what a frame carries).
* **serialisation** -- ``distributed`` sends an object its ``dask_serialize`` registry knows as a
  msgpack header and a list of frames, each sent as it is; anything else is pickled, and a pickle
  goes out of band only at protocol 5, which the scheduler's connections do not use (they ask for
  protocol 4, so that results and gathers, which pass through the scheduler, would carry the bytes
  inside the pickle). `serialize` gives the metadata as the header and the tensor's memory as the
  one frame, at any protocol; `deserialize` rebuilds over the received frame with the unpickling
  rule of `_pickle` (read-only when the frame is read-only or the tensor was, writable otherwise),
  so both carry every dtype, layout and flag exactly as a protocol-5 pickle does.

  ``distributed`` has no entry point for serialisers, and ``dask.sizeof`` loads before
  ``distributed.protocol.serialize`` defines its registries (``distributed`` imports ``dask``
  first). So `register` registers the serialisers at once when that module is loaded already, and
  otherwise places `_Registrar` first on ``sys.meta_path``: a finder that finds nothing and, on each
  import, registers them as soon as the module exists (``import distributed`` goes on importing
  its other modules after it), then does nothing. It stays there, inert, because a finder removed
  while the import system walks ``sys.meta_path`` would make it skip the next finder.
"""

from __future__ import annotations

import sys
from typing import Any, Final

from ._errors import short_repr
from ._pickle import reduce_args
from ._tensor import Tensor, _rebuild_from_buffer

__all__ = ["deserialize", "register", "serialize", "sizeof_tensor"]

_SERIALIZE_MODULE: Final = "distributed.protocol.serialize"
# The keys `serialize` writes in a header, each of which `deserialize` needs.
_HEADER_KEYS: Final = ("dtype", "shape", "strides", "offset", "readonly", "requires_grad")


def sizeof_tensor(t: Tensor) -> int:
    """The bytes ``t`` addresses, as Dask's ``sizeof`` counts a NumPy array's.

    ``t.nbytes``, except that a dimension of stride 0 (broadcast) is counted once.
    """
    n = t.dtype.itemsize
    for size, stride in zip(t.shape, t.stride()):
        n *= size if stride else min(size, 1)
    return n


def serialize(t: Tensor) -> tuple[dict[str, Any], list[memoryview]]:
    """``dask_serialize`` for tensors: the metadata as a msgpack header, the memory as one frame.

    The frame is the tensor's own memory, never a copy, except for a view with gaps between its
    elements, which is packed first (the bytes a pickle carries; see `_pickle`).

    Raises:
        BufferError: the memory is not on the host.
    """
    payload, dtype_name, shape, strides, offset, readonly, requires_grad = reduce_args(t, 5)
    header = {
        "dtype": dtype_name,
        "shape": list(shape),
        "strides": list(strides),
        "offset": offset,
        "readonly": readonly,
        "requires_grad": requires_grad,
    }
    return header, [payload.raw()]


def deserialize(header: Any, frames: Any) -> Tensor:
    """``dask_deserialize`` for tensors: a tensor over the received frame, never a copy.

    Read-only when the frame is read-only or the tensor was sent read-only; writable otherwise.
    ``header`` is the dict `serialize` wrote, ``frames`` its list of one frame (typed ``Any``: what
    arrives is checked). The header is checked as a pickle's metadata is (`_pickle.checked_layout`: types, a known
    dtype, every size, stride and offset within int64) before the frame is touched.

    Raises:
        TypeError: the header is not a dict, or a value in it of the wrong type.
        ValueError: a header `serialize` did not write (a missing key, other than one frame, a
            value out of range).
    """
    if not isinstance(header, dict):
        msg = (
            f"dask_deserialize(): a tensor's header must be a dict; got {short_repr(header)} "
            f"({type(header).__name__}). Pass the header tensorbridge's dask_serialize wrote."
        )
        raise TypeError(msg)
    missing = [key for key in _HEADER_KEYS if key not in header]
    if missing:
        msg = (
            f"dask_deserialize(): a tensor's header lacks {missing}; got the keys "
            f"{short_repr(sorted(map(str, header)))}. Pass the header tensorbridge's "
            f"dask_serialize wrote."
        )
        raise ValueError(msg)
    if not isinstance(frames, (list, tuple)) or len(frames) != 1:
        msg = (
            f"dask_deserialize(): a tensor travels as exactly one frame; got "
            f"{short_repr(frames)} ({type(frames).__name__}). Pass the frames dask_serialize "
            f"wrote."
        )
        raise ValueError(msg)
    return _rebuild_from_buffer(
        frames[0],
        header["dtype"],
        header["shape"],  # a list from msgpack; checked as a pickle's tuple is
        header["strides"],
        header["offset"],
        header["readonly"],
        header["requires_grad"],
    )


def register(sizeof: Any) -> None:
    """The ``dask.sizeof`` entry point: `sizeof_tensor` now, the serialisers when they can be.

    ``sizeof`` is Dask's ``dask.sizeof.sizeof`` dispatcher, which calls this when it loads.
    """
    sizeof.register(Tensor, sizeof_tensor)
    if not _register_serializers():
        sys.meta_path.insert(0, _Registrar())


def _register_serializers() -> bool:
    """Register `serialize` and `deserialize` with ``distributed``, if its registries exist yet."""
    module = sys.modules.get(_SERIALIZE_MODULE)
    serializers = getattr(module, "dask_serialize", None)
    deserializers = getattr(module, "dask_deserialize", None)
    if serializers is None or deserializers is None:
        return False
    serializers.register(Tensor, serialize)
    deserializers.register(Tensor, deserialize)
    return True


class _Registrar:
    """A ``sys.meta_path`` finder that finds nothing: it registers the serialisers at the first
    import after ``distributed.protocol.serialize`` has loaded, and is inert from then on."""

    def __init__(self) -> None:
        self.done = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if not self.done:
            self.done = _register_serializers()
