"""Shared memory: ``Tensor.share_memory_()`` and what ``multiprocessing`` sends for such tensors.

`share_memory` moves a storage into a ``multiprocessing.shared_memory`` segment, in place, so every
view sees the move; from then on ``multiprocessing``'s pickler (queues, ``Pool``,
``ProcessPoolExecutor``) sends the segment's name instead of the bytes (`process_args`), and the
receiver maps the same memory (`attach_storage`). Below `Tensor`: the reducer and the rebuild
function that pickles name live beside the class, in `_tensor`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import sys
from typing import TYPE_CHECKING, Any, Final

from ._device import CPU
from ._storage import WRITABLE_REQUEST, Storage, hold_buffer

if TYPE_CHECKING:
    from multiprocessing.shared_memory import SharedMemory

    from ._tensor import Tensor

__all__ = ["attach_storage", "process_args", "register_process_reducer", "share_memory"]

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
        held, view = hold_buffer(shm.buf, WRITABLE_REQUEST)
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
    return t


def register_process_reducer(cls: type, reducer: Any) -> None:
    """Make ``multiprocessing``'s pickler use ``reducer`` for ``cls`` (once per process)."""
    global _reducer_registered  # noqa: PLW0603 (once per process)
    if not _reducer_registered:
        from multiprocessing.reduction import ForkingPickler

        ForkingPickler.register(cls, reducer)
        _reducer_registered = True


def process_args(t: Tensor) -> tuple[Any, ...] | None:
    """What a shared-memory tensor is sent to another process as (its segment's name), or None."""
    storage = t._storage
    owner = storage.owner
    if not isinstance(owner, _SharedBlock):
        return None
    return (
        owner.name,
        storage.nbytes,
        t._dtype.name,
        tuple(t._shape),
        t._strides,
        t._offset,
        storage.readonly,
        t._requires_grad,
    )


def attach_storage(name: str, nbytes: int, readonly: bool) -> Storage:
    """A storage over the segment called ``name``, mapped in this process."""
    block = _attach_block(name)
    return Storage(block.ptr, min(nbytes, block.size), CPU, readonly, block)
