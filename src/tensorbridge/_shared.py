"""Shared memory: ``Tensor.share_memory_()`` and what ``multiprocessing`` sends for such tensors.

`share_memory` moves a storage into a ``multiprocessing.shared_memory`` segment, in place, so every
view sees the move; from then on ``multiprocessing``'s pickler (queues, ``Pool``,
``ProcessPoolExecutor``) sends a name of the segment instead of the bytes (`process_args`), and the
receiver maps the same memory (`attach_storage`). Below `Tensor`: the reducer and the rebuild
function that pickles name live beside the class, in `_tensor`.

Who unlinks a name, and when. A name is only the way in: a mapping stays valid after its name is
unlinked, and the memory goes with the last mapping. So every name has one owner, which unlinks it
exactly once:

* The process that moves a storage into shared memory owns the segment's first name, and unlinks
  it when the storage dies or the process exits.
* On Linux, where POSIX shared memory is a file in ``/dev/shm``, each pickle ``multiprocessing``
  makes of such a tensor carries a name of its own: a hard link to the segment, made when the
  tensor is pickled (`process_args`) and registered with ``multiprocessing``'s resource tracker.
  The pickle owns that name until a process unpickles it; from then on the receiving storage
  does, and unlinks it with itself. So the sender may drop its tensor, or exit, before the
  receiver attaches (a worker returning a tensor it shared), and the receiver may send the tensor
  on, or back. The names of one segment start with its first name (``psm_1a2b3c4d``,
  ``psm_1a2b3c4d.5e6f...``).
* A name whose owner never unlinks it stays registered with the resource tracker, which unlinks
  it when the last process sharing the tracker has exited (with its "leaked shared_memory
  objects" warning): the names a process held when a signal killed it (``Pool.terminate()``,
  which ``with Pool()`` calls; the OOM killer), and the name of a pickle nobody unpickles (a queue
  item never read). No code runs in a killed process and nothing sees pickled bytes dropped, so
  neither can go sooner.
* This needs one tracker for all the processes that pass a tensor around. spawn and forkserver
  children share their parent's; for fork, `_before_fork` starts it in the parent before its first
  fork (so import tensorbridge before making a fork pool). Unrelated programs connected by
  ``multiprocessing.connection`` have a tracker each: the sender's tracker reports the names the
  receiver unlinked when the sender's program exits, and unlinks those it still holds (their
  tensors stay mapped, but cannot be sent on by name).
* Elsewhere (macOS, Windows) a segment has one name, which the receiver maps without owning it:
  the sender must keep its tensor alive until the receiver has unpickled it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from typing import TYPE_CHECKING, Any, Final

from ._device import CPU
from ._storage import WRITABLE_REQUEST, Storage, hold_buffer

if TYPE_CHECKING:
    from multiprocessing.shared_memory import SharedMemory

    from ._tensor import Tensor

__all__ = ["attach_storage", "process_args", "register_process_reducer", "share_memory"]

# Whether a segment can have more than one name: Linux keeps POSIX shared memory as files in
# /dev/shm (glibc and musl both map shm_open("/name") to /dev/shm/name), which take hard links.
_LINKS: Final = sys.platform.startswith("linux")
_SHM_DIR: Final = "/dev/shm"

# The names this process owns and has not unlinked yet; unlinked at exit at the latest. A forked
# child starts with none: what it inherited belongs to its parent.
_OWNED: Final[dict[str, SharedMemory]] = {}
_exit_hook_pid = 0
_reducer_registered = False


# Names unlinked while this thread was inside the resource tracker, still to be unregistered.
_UNREGISTER: Final[list[str]] = []


def _in_tracker() -> bool:
    """Whether this thread is inside a call to multiprocessing's resource tracker.

    A garbage collection may run inside one (a pickle registering its name) and free a storage
    whose name it owns. The tracker refuses a call from there with a warning ("called
    reentrantly"), on the interpreters that check (3.12.7+, 3.13+): its lock is held by this thread.
    """
    from multiprocessing import resource_tracker

    lock = getattr(getattr(resource_tracker, "_resource_tracker", None), "_lock", None)
    held = getattr(lock, "_recursion_count", None)
    return held is not None and held() > 0


def _flush_unregister() -> None:
    """Tell the resource tracker about the names `_unlink` unlinked from inside it."""
    from multiprocessing import resource_tracker

    while _UNREGISTER:
        try:
            name = _UNREGISTER.pop()
        except IndexError:  # another thread took the last one
            return
        resource_tracker.unregister(name, "shared_memory")


def _unlink(name: str) -> None:
    shm = _OWNED.pop(name, None)
    if shm is None:
        return
    from multiprocessing import shared_memory

    posix: Any = getattr(shared_memory, "_posixshmem", None)  # None on Windows
    if posix is not None and _in_tracker():
        # Inside the tracker (a collection during a call to it): the name goes now; the tracker
        # hears of it from the next call outside, or at exit.
        with contextlib.suppress(OSError):
            posix.shm_unlink("/" + shm.name)  # POSIX names carry the slash `name` leaves out
            _UNREGISTER.append("/" + shm.name)
        return
    _flush_unregister()
    with contextlib.suppress(OSError):  # already unlinked (by hand, or by a resource tracker)
        shm.unlink()  # and unregistered from the resource tracker


def _unlink_owned() -> None:
    # Mappings stay valid until the process ends; only the names go, so none outlives its owner.
    for name in list(_OWNED):
        _unlink(name)
    _flush_unregister()


def _own(shm: SharedMemory) -> None:
    """Make this process the owner of ``shm``'s name: unlinked with its block, or at exit."""
    global _exit_hook_pid  # noqa: PLW0603 (once per process)
    pid = os.getpid()
    if _exit_hook_pid != pid:
        from multiprocessing import util

        # multiprocessing's exit hook, not atexit: a forked or forkserver worker leaves through
        # os._exit, after running these. The priority puts it after every queue's feeder thread
        # is joined (-5): an item still being pickled makes its link from a name owned here.
        util.Finalize(None, _unlink_owned, exitpriority=-10)
        _exit_hook_pid = pid
    _OWNED[shm.name] = shm


# multiprocessing's resource tracker's lock, held by `_before_fork` across a fork (or None).
_lock_held_for_fork: Any = None


def _before_fork() -> None:
    """Make a forked child able to make and take names, as a spawned one can.

    spawn and forkserver start multiprocessing's resource tracker before their first child, so
    every process of the tree shares one. fork does not: a forked child that makes a name then
    starts a tracker of its own, which unlinks the names registered with it (a pickle's, on its
    way to the parent) when that child exits. So the tracker starts here. And a thread of this
    process may be importing ``multiprocessing.shared_memory`` or talking to the tracker while
    another forks (a pool's result thread unpickles tensors while its worker thread forks
    replacements): the child would inherit that module lock or the tracker's lock held, by a
    thread it does not have, and hang on its first segment. So the import is done here, and the
    tracker's lock is held across the fork, as ``logging`` holds its own.
    """
    global _lock_held_for_fork  # noqa: PLW0603 (one fork at a time holds it)
    if "multiprocessing" not in sys.modules:
        return  # no multiprocessing, no pool: a plain fork needs none of it
    _segment_type()
    from multiprocessing import resource_tracker

    with contextlib.suppress(OSError, RuntimeError):  # then the child starts one, as before
        resource_tracker.ensure_running()
    lock = getattr(getattr(resource_tracker, "_resource_tracker", None), "_lock", None)
    if lock is not None:
        lock.acquire()
        _lock_held_for_fork = lock


def _after_fork_in_parent() -> None:
    global _lock_held_for_fork
    lock, _lock_held_for_fork = _lock_held_for_fork, None
    if lock is not None:
        lock.release()


def _after_fork_in_child() -> None:
    _OWNED.clear()  # what the child inherited belongs to its parent
    # The forking thread is the child's only one: it holds the lock, unless the tracker's own
    # at-fork hook ran first and made it a fresh one (Python 3.14.10 and 3.15 do: gh-146313).
    with contextlib.suppress(RuntimeError):
        _after_fork_in_parent()


if sys.platform != "win32":
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


class _SharedBlock:
    """A ``multiprocessing.shared_memory`` segment, mapped and held for one storage.

    ``owns_name``: the block unlinks its name when it dies (see the module docstring); a block
    that borrows the name only unmaps it. ``previous`` is the storage's owner before
    `share_memory` moved it here: exports made before the move that reach the memory through the
    tensor (NumPy arrays via ``__array_interface__``) still point into that memory, so it lives as
    long as the storage.
    """

    __slots__ = ("_held", "_previous", "_shm", "name", "owns_name", "ptr")

    def __init__(self, shm: SharedMemory, owns_name: bool, previous: object = None) -> None:
        self._shm = shm
        self.owns_name = owns_name
        self.name = shm.name
        self._previous = previous
        # The export is taken from the mmap, not from ``shm.buf``: a memoryview is tracked by the
        # garbage collector, which at interpreter exit may clear it while the export still holds
        # it ("BufferError: memoryview has 1 exported buffer"); an mmap waits for the export.
        held, view = hold_buffer(shm._mmap, WRITABLE_REQUEST)  # type: ignore[attr-defined]
        self._held: object = held
        self.ptr: int = view.buf

    @property
    def size(self) -> int:
        """Bytes in the segment (at least what was asked for; may be rounded up to pages)."""
        return self._shm.size

    def __del__(self, _finalizing: Any = sys.is_finalizing, _unlink: Any = _unlink) -> None:
        # What it calls is bound as defaults: it may run while module globals are being cleared.
        if _finalizing():
            return  # leak the mapping; the exit hook has unlinked the names this process owned
        self._held = None  # PyBuffer_Release first: SharedMemory.close() refuses while exported
        shm = getattr(self, "_shm", None)
        if shm is None:
            return
        if self.owns_name:
            _unlink(self.name)  # a name is not a mapping: whoever still maps the memory keeps it
        with contextlib.suppress(BufferError, OSError):  # someone else still holds the mapping
            shm.close()


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
    shm = _segment_type()(create=True, size=max(nbytes, 1))  # registered with the tracker
    _own(shm)
    try:
        return _SharedBlock(shm, owns_name=True, previous=previous)
    except BaseException:
        shm.close()
        _unlink(shm.name)
        raise


def _attach_block(name: str) -> _SharedBlock:
    if _LINKS:
        # The name was made for this receiver (`_name_for_receiver`), which owns it from here:
        # tracked, so that the tracker unlinks it should this process be killed.
        shm = _segment_type()(name=name)
        _own(shm)
        return _SharedBlock(shm, owns_name=True)
    if sys.version_info >= (3, 13):
        shm = _segment_type()(name=name, track=False)
    else:
        # NOTE: before 3.13 attaching also registers the name with the resource tracker. Processes
        # started by multiprocessing share their parent's tracker, where that is a no-op; an
        # unrelated process would unlink the segment when it exits (python/cpython#82300).
        shm = _segment_type()(name=name)
    return _SharedBlock(shm, owns_name=False)


def _name_for_receiver(block: _SharedBlock) -> str:
    """The name a pickle of ``block``'s memory carries: a new hard link on Linux (see above)."""
    if not _LINKS:
        return block.name
    from multiprocessing import resource_tracker

    source = os.path.join(_SHM_DIR, block.name)
    family = block.name.partition(".")[0]
    while True:
        name = f"{family}.{os.urandom(8).hex()}"
        try:
            os.link(source, os.path.join(_SHM_DIR, name))
        except FileExistsError:
            continue
        except OSError as exc:
            msg = (
                f"multiprocessing: cannot send the shared-memory tensor in segment "
                f"{block.name!r}: linking a name for the receiver failed ({exc}). Leave the "
                f"segment's names in {_SHM_DIR} to tensorbridge while its tensors are sent."
            )
            raise OSError(msg) from exc
        break
    # The pickle's name, until a receiver takes it over; the tracker unlinks it if none does.
    resource_tracker.register("/" + name, "shared_memory")
    _flush_unregister()  # what a collection inside that call unlinked
    return name


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
    ``ProcessPoolExecutor``) sends a name of the segment: the receiving process maps the same
    memory, and each side sees the other's writes. On Linux each pickle carries a name of its
    own, which the receiver unlinks with its tensor, so the sender may drop its tensor or exit
    before the receiver has unpickled it; elsewhere the sender must keep the tensor alive until
    then. The module docstring says who unlinks which name, and which names only the resource
    tracker can.

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
    """What a shared-memory tensor is sent to another process as (a name of its segment), or None.

    On Linux the name is made for this pickle (`_name_for_receiver`).

    Raises:
        OSError: no name could be made for the receiver.
    """
    storage = t._storage
    owner = storage.owner
    if not isinstance(owner, _SharedBlock):
        return None
    return (
        _name_for_receiver(owner),
        storage.nbytes,
        t._dtype.name,
        tuple(t._shape),
        t._strides,
        t._offset,
        storage.readonly,
        t._requires_grad,
    )


def attach_storage(name: str, nbytes: int, readonly: bool) -> Storage:
    """A storage over the segment called ``name``, mapped in this process (which owns the name
    from now on where names are made per pickle, on Linux)."""
    block = _attach_block(name)
    return Storage(block.ptr, min(nbytes, block.size), CPU, readonly, block)
