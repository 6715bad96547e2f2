"""Threads: tensors that share storages, converted, sliced, exported and dropped from many threads
at once, and deleters called from threads Python did not create.

Everything runs in a child interpreter (a lost or doubled release can crash it) which prints its
counts as JSON; the tests assert on them: no crash, no lost or doubled release, every count
consistent.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import pickle
import random
import sys
import threading
import weakref
from typing import Any

import pytest
from tests.conftest import COLLECT_PAUSE, FREE_THREADED
from tests.soak import crafted

import tensorbridge as tb
from tensorbridge import testing

pytestmark = pytest.mark.subprocess

N = 256  # elements of each shared storage (int64 values 0..N-1)
WORKERS = 8
# Operations per worker thread: more without a GIL (free-threaded CPython), where threads really run
# at once and nothing but tensorbridge's own design keeps its tables whole.
ROUNDS = 2000 if FREE_THREADED else 400


def _child(call: str, subprocess_run: Any) -> dict[str, Any]:
    """Run ``call`` (an expression in this module) in a child and return what it printed as JSON."""
    proc = subprocess_run(
        f"import json; from tests import test_threads as m; print(json.dumps(m.{call}))"
    )
    assert (proc.returncode, proc.stderr[-4000:]) == (0, "")
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------------
# Many Python threads on shared storages


def _owners() -> dict[str, Any]:
    """The memory the shared tensors view: values 0..N-1 in a NumPy array, a bytearray, a ctypes
    array."""
    import numpy as np

    return {
        "array": np.arange(N, dtype=np.int64),
        "buffer": bytearray(b"".join(i.to_bytes(8, sys.byteorder) for i in range(N))),
        "block": (ctypes.c_int64 * N)(*range(N)),
    }


def _bases(owners: dict[str, Any]) -> list[tb.Tensor]:
    """One tensor per kind of storage owner: own allocation, held buffer, NumPy capsule, crafted
    capsule."""
    block = owners["block"]
    managed = testing.CraftedDLPack(
        (), data=ctypes.addressof(block), shape=(N,), strides=(1,), dtype=(0, 64, 1), keep=block
    )
    return [
        tb.arange(N),
        tb.frombuffer(owners["buffer"], dtype=tb.int64),
        tb.from_dlpack(owners["array"]),
        tb.from_dlpack(managed.take()),
    ]


def _operate(view: tb.Tensor, action: int) -> Any:
    """One conversion of ``view``; returns something holding its memory (or a copy of it)."""
    import numpy as np

    if action == 0:
        return np.from_dlpack(view)  # tensorbridge capsule -> NumPy
    if action == 1:
        return tb.from_dlpack(np.from_dlpack(view))  # and back again
    if action == 2:
        return tb.from_dlpack(view.__dlpack__(max_version=(1, 3)))
    if action == 3:
        tb.to_dlpack(view.contiguous())  # abandoned: reaped later
        return view.clone()
    if action == 4:
        return np.asarray(view)  # __array_interface__
    if action == 5:
        return tb.asarray(np.asarray(view))  # NumPy view of our memory, imported
    return pickle.loads(pickle.dumps(view, protocol=5))


def _worker(seed: int, bases: list[tb.Tensor], shared: list[Any], errors: list[str]) -> None:
    rng = random.Random(seed)
    values = list(range(N))
    for _ in range(ROUNDS):
        base = rng.choice(bases)
        start, stop = sorted(rng.randrange(N + 1) for _ in range(2))
        step = rng.choice((1, 2, 3, -1, -2))
        key = (
            slice(start, stop, step)
            if step > 0
            else slice(stop - 1 if stop else None, start - 1 if start else None, step)
        )
        view = base[key]
        result = _operate(view, rng.randrange(7))
        got = result.tolist()
        if got != values[key]:
            errors.append(f"{key}: {got[:8]} != {values[key][:8]}")
        shared.append(result)
        if len(shared) > 64:  # drop results made by other threads: their releases run here
            with contextlib.suppress(IndexError):  # another thread popped meanwhile
                shared.pop(rng.randrange(len(shared)))


def run_workers() -> dict[str, Any]:
    """8 threads convert, slice, export and drop tensors of 4 shared storages while a 9th
    collects."""
    counter = crafted.ExportCounter()
    owners = _owners()
    refs_before = {name: sys.getrefcount(obj) for name, obj in owners.items()}
    bases = _bases(owners)
    shared: list[Any] = []
    errors: list[str] = []
    done = threading.Event()
    sys.setswitchinterval(1e-5)  # switch threads every few bytecodes, not every 5 ms

    def collector() -> None:
        while not done.wait(COLLECT_PAUSE):
            gc.collect()

    threads = [
        threading.Thread(target=_worker, args=(seed, bases, shared, errors))
        for seed in range(WORKERS)
    ]
    gc_thread = threading.Thread(target=collector)
    gc_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    gc_thread.join()
    shared.clear()
    del bases
    gc.collect()
    owners["buffer"].append(0)  # resizable again: every view released its export
    return {
        "errors": errors[:5],
        **counter.counts(),
        "registry": counter.registry(),
        "refs": {name: sys.getrefcount(obj) - refs_before[name] for name, obj in owners.items()},
        "crafted": testing.stats(),
    }


def test_threads_share_storages(subprocess_run: Any) -> None:
    """8 threads converting, slicing, exporting and dropping shared tensors, with gc forced
    concurrently, see correct values and release every export exactly once."""
    pytest.importorskip("numpy")
    out = _child("run_workers()", subprocess_run)
    assert out["errors"] == []
    assert out["exports"] > 0, out
    assert (out["releases"], out["registry"]) == (out["exports"], 0), out
    assert out["crafted"] == {"made": 1, "deleted": 1, "stray": 0, "live": 0}, out
    assert out["refs"] == {"array": 0, "buffer": 0, "block": 0}, out


# --------------------------------------------------------------------------------------------------
# Deleters called from threads that Python did not create (a producer freeing from C)

_libc = ctypes.CDLL(None)
_libc.pthread_create.argtypes = (
    ctypes.POINTER(ctypes.c_ulong),
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
)
_libc.pthread_join.argtypes = (ctypes.c_ulong, ctypes.c_void_p)
_START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)  # void *(*start_routine)(void *)


def _native_threads(start: int, args: list[int]) -> None:
    """Run the C function at ``start`` on one native thread per argument, all at once, and join
    them.

    The threads are made with ``pthread_create``: Python has no thread state for them until a
    callback takes the GIL. ``pthread_join`` runs through ctypes.CDLL, which releases the GIL
    meanwhile.
    """
    ids = []
    for arg in args:
        tid = ctypes.c_ulong()
        if _libc.pthread_create(ctypes.byref(tid), None, start, arg) != 0:
            raise OSError("pthread_create failed")
        ids.append(tid.value)
    for tid in ids:
        _libc.pthread_join(tid, None)


def _consume(capsule: Any) -> tuple[int, int]:
    """Take a tensorbridge capsule as a C consumer does: read the managed pointer, rename it
    ``used_*``.

    Returns the managed tensor's address and its deleter's address.
    """
    from tensorbridge import _capi
    from tensorbridge import _dlpack_abi as abi

    address = _capi.PyCapsule_GetPointer(capsule, abi.DLTENSOR_VERSIONED)
    _capi.PyCapsule_SetName(capsule, abi.USED_DLTENSOR_VERSIONED)
    managed = abi.DLManagedTensorVersioned.from_address(address)
    return address, ctypes.cast(managed.deleter, ctypes.c_void_p).value


def release_from_native_threads(count: int) -> dict[str, Any]:
    """``count`` exports, consumed here and released by their deleter called on native threads at
    once."""
    counter = crafted.ExportCounter()
    tensors = [tb.arange(i + 1) for i in range(count)]
    alive = [weakref.ref(t) for t in tensors]
    capsules = [t.__dlpack__(max_version=(1, 3)) for t in tensors]
    del tensors  # the registry alone keeps them now
    taken = [_consume(c) for c in capsules]
    del capsules
    gc.collect()
    kept = sum(ref() is not None for ref in alive)
    deleter = {d for _, d in taken}.pop()
    _native_threads(deleter, [address for address, _ in taken])
    gc.collect()
    return {
        "kept_until_deleter": kept,
        "alive_after": sum(ref() is not None for ref in alive),
        **counter.counts(),
        "registry": counter.registry(),
    }


def test_deleter_on_native_threads(subprocess_run: Any) -> None:
    """tensorbridge's capsule deleter, called by a C consumer on threads without a Python thread
    state, releases each export exactly once."""
    out = _child("release_from_native_threads(64)", subprocess_run)
    assert (out["kept_until_deleter"], out["alive_after"]) == (64, 0), out
    assert out == {**out, "exports": 64, "releases": 64, "deleter": 64, "registry": 0}


def release_from_python_thread() -> dict[str, Any]:
    """A consumed export whose deleter is called from a ``threading.Thread``."""
    counter = crafted.ExportCounter()
    t = tb.arange(8)
    alive = weakref.ref(t)
    address, deleter = _consume(t.__dlpack__(max_version=(1, 3)))
    del t
    thread = threading.Thread(
        target=ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter), args=(address,)
    )
    thread.start()
    thread.join()
    return {"alive_after": alive() is not None, **counter.counts(), "registry": counter.registry()}


def test_deleter_on_python_thread(subprocess_run: Any) -> None:
    """tensorbridge's capsule deleter called from another Python thread releases the export once."""
    out = _child("release_from_python_thread()", subprocess_run)
    assert out == {"alive_after": False, "exports": 1, "releases": 1, "deleter": 1, "registry": 0}


_HOLDERS: list[Any] = []
_NATIVE_IDS: list[int] = []


@_START
def _drop_one(arg: int | None) -> None:
    """A native thread's body: take the GIL (ctypes does) and drop one held object there."""
    _NATIVE_IDS.append(threading.get_native_id())
    _HOLDERS.pop()


def drop_on_native_threads(count: int) -> dict[str, Any]:
    """The last reference to tensors (imported from a crafted producer and from NumPy, and NumPy
    arrays of tensorbridge memory) is dropped on native threads: the producers' deleters run there.
    """
    import numpy as np

    counter = crafted.ExportCounter()
    block = (ctypes.c_float * 16)(*range(16))
    records = []
    for i in range(count):
        record = testing.CraftedDLPack(
            (),
            data=ctypes.addressof(block),
            shape=(16,),
            strides=(1,),
            keep=block,
            versioned=i % 2 == 0,
        )
        records.append(record)
        kind = i % 3
        if kind == 0:
            _HOLDERS.append(tb.from_dlpack(record.take())[1:])
        elif kind == 1:
            record.take()  # unconsumed: freed by its destructor now, on this thread
            _HOLDERS.append(tb.from_dlpack(np.arange(16.0))[::2])
        else:
            record.take()
            _HOLDERS.append(np.from_dlpack(tb.arange(16)[3:]))
    _native_threads(ctypes.cast(_drop_one, ctypes.c_void_p).value, [0] * count)
    gc.collect()
    return {
        "calls": [r.deleter_calls for r in records],
        "native": len(set(_NATIVE_IDS) - {threading.get_native_id()}),
        **counter.counts(),
        "registry": counter.registry(),
        "crafted": testing.stats(),
    }


def test_release_on_native_threads(subprocess_run: Any) -> None:
    """Tensors whose last reference dies on a native thread call their producer's deleter exactly
    once."""
    pytest.importorskip("numpy")
    out = _child("drop_on_native_threads(48)", subprocess_run)
    assert out["calls"] == [1] * 48, out
    assert out["native"] >= 1, out
    assert out["crafted"] == {"made": 48, "deleted": 48, "stray": 0, "live": 0}, out
    assert (out["releases"], out["exports"], out["registry"]) == (16, 16, 0), out
