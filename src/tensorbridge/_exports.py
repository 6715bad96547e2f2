"""The one registry of memory tensorbridge has handed out: exported memoryviews and DLPack tensors.

Two kinds of export outlive the call that made them and must keep their memory valid until the
consumer is done, without tensorbridge knowing when that is:

* **Memoryview exports** (`_buffer`). ``PyMemoryView_FromBuffer`` builds an *inner* view that
  owns nothing; the view handed out is a re-export of it. The registry holds the inner view with
  the objects that keep its memory valid. An entry can go once nothing exports the inner view any
  more, which ``memoryview.release()`` reports by succeeding. The handed-out view's death is
  noticed at once through a weak reference; if a slice of it still lives, the entry becomes an
  *orphan*, and each reap tries orphans again. Inner views are never left to the garbage
  collector: on CPython < 3.13 a memoryview whose base is another memoryview can crash the
  collector when both sit in unreachable garbage.
* **DLPack exports** (`_dlpack_export`) and **Arrow exports** (`_arrow_export`). The managed
  struct and the exported tensor are held, keyed by the struct's address, until the consumer calls
  the deleter. A capsule a consumer may leave untaken is *watched* (`hold_capsule`) when it has no
  destructor: one written in Python would run while a rejecting consumer's error is pending and
  turn it into ``SystemError``. A watched capsule renamed ``used_*`` belongs to its consumer; one
  still under its own name that nothing but the registry refers to was abandoned, and the reap
  releases it as its deleter would. In the compiled build DLPack capsules carry a C destructor
  that does this at once (keeping any pending error), and are held but not watched
  (`hold_managed`).

Every entry point may run on any thread and from garbage-collector callbacks (weak-reference
callbacks, ``__del__``, the deleter a consumer calls while freeing): adding and forgetting an entry
is one dictionary operation each (atomic under the GIL); a reap works on a snapshot, removes only
entries it has proved finished, and runs under a lock that it never waits for (a reap that finds
another under way, on this or another thread, simply leaves the work to it). The objects a reap
lets go are dropped after the lock is released, since dropping them runs arbitrary finalizers.

Reaps run on every export once enough capsules are pending (the bar doubles with the capsules a
caller keeps, so an export pays O(1) amortised), after every garbage collection that has orphans
or enough pending capsules to settle, after every full collection, and at exit.
"""

from __future__ import annotations

import atexit
import gc
import sys
import threading
import weakref
from typing import Any, Final

from . import _native

__all__ = [
    "counts",
    "forget_managed",
    "forget_unwatched",
    "hold_capsule",
    "hold_managed",
    "hold_view",
    "reap",
]

# token -> (inner view, what keeps its memory valid, weak reference to the handed-out view). The
# token is the weak reference's id: unique among entries, since each entry holds its reference, and
# the callback is handed that reference (no partial per view).
_VIEWS: Final[dict[int, tuple[memoryview, object, object]]] = {}
# tokens of views whose handed-out view died while a slice of it still exported the inner view
_ORPHANS: Final[dict[int, None]] = {}

# address of a managed struct -> (the block holding it, what keeps the memory valid, capsule name)
_MANAGED: Final[dict[int, tuple[object, object, bytes]]] = {}
# address -> capsule, while no consumer has been seen to take the capsule
_PENDING: Final[dict[int, object]] = {}

_LOCK: Final = threading.Lock()
_PENDING_MIN: Final = 16
_pending_bar = _PENDING_MIN


# -------------------------------------------------------------------------------------------------
# Memoryviews


def hold_view(inner: memoryview, keep: object, outer: memoryview) -> None:
    """Hold ``inner`` (and ``keep``) until ``outer`` and every view derived from it are gone.

    Call it once ``outer``, the export of ``inner`` handed to the user, exists: from then on
    ``inner`` cannot be released until the last view derived from ``outer`` dies.
    """
    ref = weakref.ref(outer, _on_outer_death)
    _VIEWS[id(ref)] = (inner, keep, ref)


def _on_outer_death(ref: object) -> None:
    _outer_died(id(ref))


def _outer_died(
    token: int, _views: dict[int, Any] = _VIEWS, _orphans: dict[int, None] = _ORPHANS
) -> None:
    """The handed-out view died: let the inner view go now, unless a slice still exports it."""
    entry = _views.get(token)
    if entry is None:
        return
    try:
        entry[0].release()
    except BufferError:  # a slice or cast of the handed-out view lives on; a later reap frees it
        _orphans[token] = None
        return
    _views.pop(token, None)


# -------------------------------------------------------------------------------------------------
# DLPack


def hold_managed(address: int, block: object, keep: object, name: bytes) -> None:
    """Hold the managed struct at ``address`` (in ``block``) and ``keep`` until it is released."""
    _MANAGED[address] = (block, keep, name)


def hold_capsule(address: int, block: object, keep: object, name: bytes, capsule: object) -> None:
    """`hold_managed`, and watch ``capsule`` (which wraps the struct) until it is settled.

    Each export calls it once: it also reaps once enough capsules are pending (the bar doubles
    with the capsules a caller keeps, so an export pays O(1) amortised). The caller still holds
    ``capsule``, so this reap cannot mistake it for an abandoned one.
    """
    _MANAGED[address] = (block, keep, name)
    _PENDING[address] = capsule
    if len(_PENDING) >= _pending_bar:
        reap()


def forget_managed(
    address: int, _managed: dict[int, Any] = _MANAGED, _pending: dict[int, Any] = _PENDING
) -> object:
    """What the deleter does: forget the capsule and the struct; return what kept the memory.

    Lock-free, with its dictionaries bound as defaults: it runs from a consumer freeing the
    tensor, on any thread, possibly inside a reap, and while module globals are being cleared.
    """
    _pending.pop(address, None)
    return _managed.pop(address, None)


# What the compiled build's DLPack capsule destructor calls, as ``forget_unwatched(address, None)``,
# to release the export of a capsule no consumer took: such a capsule is held (`hold_managed`) but
# never watched, so `forget_managed` would find nothing pending; the table's own ``pop`` is a C call.
forget_unwatched: Final = _MANAGED.pop


def _references(pending: dict[int, object]) -> list[tuple[int, object, int]]:
    """``(address, capsule, references)`` for each pending capsule."""
    return [(address, capsule, sys.getrefcount(capsule)) for address, capsule in pending.items()]


# What `_references` counts, on a snapshot, for a capsule that nothing but the registry refers to:
# measured with the very same code and the same two dictionaries, so it holds whatever the
# interpreter's reference-borrowing rules.
_PROBE: Final = {0: object()}
_UNREFERENCED: Final = _references(_PROBE.copy())[0][2]


# -------------------------------------------------------------------------------------------------
# Reaping


def reap() -> None:
    """Settle every entry that has finished; a no-op if another reap is under way."""
    if not _LOCK.acquire(blocking=False):
        return
    try:
        dropped = _settle()
    finally:
        _LOCK.release()
    # Dropping the memory's keepers may run arbitrary finalizers (even one that exports or
    # reaps): only now that the lock is free.
    del dropped


def _settle() -> list[object]:
    """Remove finished entries from the registry (under the lock); return what they held."""
    global _pending_bar  # noqa: PLW0603 (the reaping bar is module state by nature)
    dropped: list[object] = []
    # dict.copy() takes no Python code: a consistent snapshot even if a collector callback or
    # another thread changes the registry meanwhile.
    for token in _ORPHANS.copy():
        entry = _VIEWS.get(token)
        if entry is not None:
            try:
                entry[0].release()
            except BufferError:
                continue  # still exported
            dropped.append(_VIEWS.pop(token, None))
        _ORPHANS.pop(token, None)
    for address, capsule, refs in _references(_PENDING.copy()):
        if refs > _UNREFERENCED or _PENDING.get(address) is not capsule:
            continue  # someone holds the capsule, or it was settled meanwhile
        export = _MANAGED.get(address)
        if export is not None and _native.capsule_is_valid(capsule, export[2]):
            # Still under its own name and unreachable: never consumed. Release it as its
            # deleter would.
            dropped.append(forget_managed(address))
        # Either way the capsule is settled: a renamed one belongs to its consumer, which calls
        # the deleter when it is done.
        dropped.append(_PENDING.pop(address, None))
    _pending_bar = max(_PENDING_MIN, 2 * len(_PENDING))
    return dropped


def counts() -> dict[str, int]:
    """Entries in the registry, by kind: for tests, soak runs and ``doctor``."""
    return {"views": len(_VIEWS), "managed": len(_MANAGED), "pending": len(_PENDING)}


def _reap_after_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and (
        _ORPHANS or (_PENDING and (info["generation"] == 2 or len(_PENDING) >= _pending_bar))
    ):
        reap()


def _reap_at_exit() -> None:
    """A last reap while the interpreter is whole; then stop reaping, before modules are cleared."""
    reap()
    if _reap_after_gc in gc.callbacks:
        gc.callbacks.remove(_reap_after_gc)


gc.callbacks.append(_reap_after_gc)
atexit.register(_reap_at_exit)
