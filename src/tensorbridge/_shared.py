"""Shared memory: ``Tensor.share_memory_()`` and what ``multiprocessing`` sends for such tensors.

`share_memory` moves a storage into a ``multiprocessing.shared_memory`` segment, in place, so every
view sees the move; from then on ``multiprocessing``'s pickler (queues, ``Pool``,
``ProcessPoolExecutor``) sends a name of the segment instead of the bytes (`process_args`), and the
receiver maps the same memory (`attach_storage`). Below `Tensor`: the reducer and the rebuild
function that pickles name live beside the class, in `_tensor`.

Who unlinks a name, and when. A name is only the way in: a mapping stays valid after its name is
unlinked, and the memory goes with the last mapping. So every name has one owner, which unlinks it
exactly once. **The rule: a name is unlinked only by the process that made it, or by a process that
received it as a pickle's own link and proved it one (or, for either, by the resource tracker it
registered the name with, once it cannot: below); a name is proved before it is taken over, and a
refused pickle leaves every name as it found it.**

* The process that moves a storage into shared memory makes the segment's first name
  (``psm_1a2b3c4d``: ``psm_`` and 8 hex digits, chosen here), owns it, and unlinks it when the
  storage dies or the process exits. No other process ever unlinks a first name.
* On Linux, where POSIX shared memory is a file in ``/dev/shm``, each pickle ``multiprocessing``
  makes of such a tensor carries a name of its own: a hard link to the segment, the first name,
  ``.`` and 16 random hex digits (``psm_1a2b3c4d.5e6f...``), made when the tensor is pickled
  (`process_args`) and registered with ``multiprocessing``'s resource tracker. The pickle owns that
  name until a process unpickles it; from then on the receiving storage does, and unlinks it with
  itself. So the sender may drop its tensor, or exit, before the receiver attaches (a worker
  returning a tensor it shared), and the receiver may send the tensor on, or back.
* What the receiver checks, in this order (`_tensor._rebuild_shared`), so that no pickle makes it
  unlink a name it was not sent: every argument, before anything is opened (`checked_name`: a
  ``str`` of exactly that link syntax, so no NUL byte, no ``/``, at most 29 characters; the byte
  count and layout, `_pickle`); then the file, through the one descriptor it maps
  (`_open_link`): a regular file directly in ``/dev/shm``, not a symbolic link, on its file
  system, of this user, holding the bytes the pickle says, and, while the first name still
  exists, the same file as it (a link count of 1 is a link too: the owner may have exited); then
  the layout against the mapped segment; only then does it take the name over (`take_name`). A
  refused pickle raises, unmaps what it mapped, and unlinks and registers nothing. A first name
  alone is refused on Linux (a pickle written before per-pickle links, or altered): taking it over
  would unlink it under its owner, which could then no longer send its tensor.
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
* Elsewhere (macOS, Windows) a segment has one name, its first, which a pickle carries (the same
  syntax checked) and the receiver maps without owning it: the sender must keep its tensor alive
  until the receiver has unpickled it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import re
import stat
import sys
from typing import TYPE_CHECKING, Any, Final, NoReturn

from ._device import CPU
from ._errors import short_repr
from ._pickle import refusal
from ._storage import WRITABLE_REQUEST, Storage, hold_buffer

if TYPE_CHECKING:
    from multiprocessing.shared_memory import SharedMemory

    from ._tensor import Tensor

__all__ = [
    "attach_storage",
    "checked_name",
    "process_args",
    "register_process_reducer",
    "share_memory",
    "take_name",
]

# Whether a segment can have more than one name: Linux keeps POSIX shared memory as files in
# /dev/shm (glibc and musl both map shm_open("/name") to /dev/shm/name), which take hard links.
_LINKS: Final = sys.platform.startswith("linux")
_SHM_DIR: Final = "/dev/shm"

# The names tensorbridge gives a segment, and the only ones a pickle may carry (module docstring):
# a first name, chosen here (not by multiprocessing, whose scheme is its own to change) as
# multiprocessing chooses one, and short enough for macOS (31 bytes); on Linux each pickle's link,
# the first name, "." and a random token. Nothing else is ever opened by a name a pickle carries.
_FIRST_PREFIX: Final = "psm_"
_FIRST_NAME: Final = re.compile(r"psm_[0-9a-f]{8}")
_LINK_NAME: Final = re.compile(r"psm_[0-9a-f]{8}\.[0-9a-f]{16}")
_NAMES: Final = (
    "a link made for one pickle: 'psm_', 8 hex digits, '.', 16 hex digits"
    if _LINKS
    else "a segment's name: 'psm_' and 8 hex digits"
)

# The names this process owns and has not unlinked yet; unlinked at exit at the latest. A forked
# child starts with none: what it inherited belongs to its parent.
_OWNED: Final[dict[str, SharedMemory | _MappedLink]] = {}
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


def _own(shm: SharedMemory | _MappedLink) -> None:
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
    """A shared-memory segment, mapped and held for one storage: a ``multiprocessing.shared_memory``
    segment, or a pickle's link mapped by `_open_link`.

    ``owns_name``: the block unlinks its name when it dies (see the module docstring); a block
    that borrows the name only unmaps it, and so does one whose tensor was refused before
    `take_name` made it the owner. ``previous`` is the storage's owner before
    `share_memory` moved it here: exports made before the move that reach the memory through the
    tensor (NumPy arrays via ``__array_interface__``) still point into that memory, so it lives as
    long as the storage.
    """

    __slots__ = ("_held", "_previous", "_shm", "name", "owns_name", "ptr")

    def __init__(
        self, shm: SharedMemory | _MappedLink, owns_name: bool, previous: object = None
    ) -> None:
        self._shm = shm
        self.owns_name = owns_name
        self.name = shm.name
        self._previous = previous
        # The export is taken from the mmap, not from ``shm.buf``: a memoryview is tracked by the
        # garbage collector, which at interpreter exit may clear it while the export still holds
        # it ("BufferError: memoryview has 1 exported buffer"); an mmap waits for the export.
        held, view = hold_buffer(shm._mmap, WRITABLE_REQUEST)  # type: ignore[union-attr]
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


class _MappedLink:
    """A pickle's link that `_open_link` proved and mapped: what `_SharedBlock`, `_unlink` and
    `_OWNED` use of a ``SharedMemory`` (``name``, ``size``, the map, ``close``, ``unlink``)."""

    __slots__ = ("_mmap", "name", "size")

    def __init__(self, name: str, mapping: mmap.mmap) -> None:
        self.name = name
        self._mmap = mapping
        self.size = len(mapping)

    def close(self) -> None:
        self._mmap.close()  # BufferError while a view of it is still exported

    def unlink(self) -> None:
        """Unlink the name and tell the resource tracker, as ``SharedMemory.unlink`` does."""
        from multiprocessing import resource_tracker

        os.unlink(os.path.join(_SHM_DIR, self.name))
        resource_tracker.unregister("/" + self.name, "shared_memory")


def _create_block(nbytes: int, previous: object) -> _SharedBlock:
    # A zero-size segment is refused, so an empty storage gets one byte it never uses.
    segment = _segment_type()
    while True:
        name = _FIRST_PREFIX + os.urandom(4).hex()
        try:  # registered with the tracker
            shm = segment(name=name, create=True, size=max(nbytes, 1))
        except FileExistsError:
            continue
        break
    _own(shm)
    try:
        return _SharedBlock(shm, owns_name=True, previous=previous)
    except BaseException:
        shm.close()
        _unlink(shm.name)
        raise


def checked_name(name: object) -> str:
    """The name a shared-memory pickle carries, held to tensorbridge's syntax before anything is
    opened by it: on Linux a link made for one pickle (the segment's first name, ``.``, 16 hex
    digits), elsewhere a segment's first name (``psm_`` and 8 hex digits).

    So no NUL byte (which would cut the name short where the system reads it), no ``/``, no
    character tensorbridge does not write, and at most 29 characters. On Linux a first name alone
    is refused: it is its owner's, who unlinks it, and a receiver that took it over would unlink
    it under the owner (who could then not send the tensor again); tensorbridge has sent each
    receiver a link of its own since such links exist, so only a pickle written before them, or
    altered, carries one. Nothing is opened, attached or unlinked for a refused name.

    Raises:
        TypeError: not a ``str``.
        ValueError: any other name.
    """
    if type(name) is not str:
        msg = (
            f"a shared-memory tensor's segment name must be a str; got {short_repr(name)} "
            f"({type(name).__name__})"
        )
        raise TypeError(refusal(msg))
    if (_LINK_NAME if _LINKS else _FIRST_NAME).fullmatch(name):
        return name
    if _LINKS and _FIRST_NAME.fullmatch(name):
        why = (
            "is a segment's first name, which only the process that made it unlinks; a receiver "
            "gets a link of its own (this name, '.', 16 hex digits), so this pickle was written "
            "by a tensorbridge older than those links, or altered"
        )
    else:
        why = f"is not one tensorbridge sends ({_NAMES})"
    msg = f"the shared-memory name {short_repr(name)} {why}; nothing was opened or unlinked"
    raise ValueError(refusal(msg))


def _open_link(name: str, nbytes: int) -> _MappedLink:
    """Map the pickle's link ``name`` (syntax checked) once it is proved a link of a segment.

    What proves it, from the file itself: a regular file directly in /dev/shm (no symbolic link is
    followed, and nothing else is even opened: a FIFO or a device could block or act on open), on
    /dev/shm's file system, belonging to this process's user, holding at least ``nbytes``; and,
    while the segment's first name (the name up to its dot) still exists, that name is the very
    same file (device and inode), so the link count shows both names. The first name may be gone:
    its owner unlinks it when it drops its tensor or exits, which it may do before the receiver
    attaches, so a link count of 1 is a link too. The file mapped is the file checked: opened
    once, checked through its descriptor. Nothing is unlinked or registered here.

    Raises:
        FileNotFoundError: no such name (the resource tracker unlinked it, or by hand).
        ValueError: the file is not such a link; it is left as it was.
    """
    path = os.path.join(_SHM_DIR, name)
    found = os.lstat(path)
    if not stat.S_ISREG(found.st_mode):
        _not_a_link(name, f"it is not a regular file ({stat.filemode(found.st_mode)})")
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    fd = os.open(path, flags)
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):
            _not_a_link(name, "it was replaced while it was opened")
        if opened.st_dev != os.stat(_SHM_DIR).st_dev:
            _not_a_link(name, f"it is not on the file system of {_SHM_DIR}")
        if opened.st_uid != os.geteuid():
            _not_a_link(name, f"it belongs to user {opened.st_uid}, not to {os.geteuid()}")
        first = name.partition(".")[0]
        try:
            segment = os.stat(os.path.join(_SHM_DIR, first), follow_symlinks=False)
        except FileNotFoundError:
            pass  # its owner has unlinked it: the link is what is left of the segment
        else:
            if (segment.st_dev, segment.st_ino) != (opened.st_dev, opened.st_ino):
                _not_a_link(name, f"the segment {first!r} it is named after is another file")
        if opened.st_size < max(nbytes, 1):
            _not_a_link(name, f"it holds {opened.st_size} bytes; the pickle says {nbytes}")
        mapping = mmap.mmap(fd, max(nbytes, 1))
    finally:
        os.close(fd)
    return _MappedLink(name, mapping)


def _not_a_link(name: str, why: str) -> NoReturn:
    msg = (
        f"the shared-memory name {name!r} is not a link of a tensorbridge segment: {why}; it was "
        f"left as it was"
    )
    raise ValueError(refusal(msg))


def _attach_block(name: str, nbytes: int) -> _SharedBlock:
    if _LINKS:
        # The name was made for this receiver (`_name_for_receiver`); it is proved before it is
        # mapped, and owned only once the tensor over it is built (`take_name`).
        return _SharedBlock(_open_link(name, nbytes), owns_name=False)
    if sys.version_info >= (3, 13):
        shm = _segment_type()(name=name, track=False)
    else:
        # NOTE: before 3.13 attaching also registers the name with the resource tracker. Processes
        # started by multiprocessing share their parent's tracker, where that is a no-op; an
        # unrelated process would unlink the segment when it exits (python/cpython#82300).
        shm = _segment_type()(name=name)
    block = _SharedBlock(shm, owns_name=False)
    if block.size < nbytes:
        msg = (
            f"the shared-memory segment {name!r} holds {block.size} bytes; the pickle says {nbytes}"
        )
        raise ValueError(refusal(msg))
    return block


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
    """A storage of ``nbytes`` over the segment a pickle names (checked by `checked_name` and
    `_pickle.checked_nbytes`), mapped in this process, which owns no name yet: `take_name` makes
    it the owner of a pickle's link once the tensor over the storage is built.

    Raises:
        FileNotFoundError: no such name.
        ValueError: the name is not a link of a segment, or the segment is shorter than
            ``nbytes``; every name is left as it was.
    """
    block = _attach_block(name, nbytes)
    return Storage(block.ptr, nbytes, CPU, readonly, block)


def take_name(storage: Storage) -> None:
    """Make this process the owner of the pickle's link ``storage`` was attached by (on Linux;
    elsewhere the one name stays its maker's): unlinked with the storage, or at exit, and
    registered with the resource tracker for a process killed first.

    Called once the tensor over ``storage`` is built, so a refused pickle owns nothing. A name
    this process owns already (the same pickle loaded twice) stays with its first owner.
    """
    block = storage.owner
    if not _LINKS or not isinstance(block, _SharedBlock) or block.owns_name:
        return
    if block.name in _OWNED:
        return
    from multiprocessing import resource_tracker

    resource_tracker.register("/" + block.name, "shared_memory")
    _flush_unregister()  # what a collection inside that call unlinked
    _own(block._shm)
    block.owns_name = True
