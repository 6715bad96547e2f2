"""Free-threaded CPython (no GIL): the GIL stays off, and every shared table holds under threads.

`import tensorbridge` must not turn the GIL back on: every compiled module declares that it runs
without it, and the pure-Python build has no extension module at all. And without a GIL nothing
serialises tensorbridge's shared state but its own design, so a stress runs many threads at once
over each shared table, on shared and on separate tensors, with a collector thread, and checks
every value read back and every table left behind:

* the export registry (`_exports`): DLPack capsules taken by NumPy and by tensorbridge, capsules
  abandoned untaken, memoryview exports and slices that outlive them, Arrow exports;
* the per-type decisions (`_cache`): a new producer type on almost every call, so the bounded
  tables fill, empty and refill while other threads read them, and the C exchange API table of
  tensorbridge's own type;
* shared-memory segments (`_shared`): segments made, pickled for another process (a name each),
  taken over by the unpickler and unlinked, from every thread at once.

The stress runs in a child interpreter (a lost or doubled release can crash it) and on every
interpreter: on one with a GIL it is a shorter thread test, without one it runs longer
(``TENSORBRIDGE_STRESS_SECONDS`` sets it). The child prints its figures, which the test checks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from typing import Any

import pytest
from tests.conftest import COLLECT_PAUSE, FREE_THREADED

import tensorbridge as tb

pytestmark = pytest.mark.subprocess

WORKERS = 8
SECONDS = float(os.environ.get("TENSORBRIDGE_STRESS_SECONDS", "10" if FREE_THREADED else "2"))
N = 64  # elements of each tensor (int64 values)


def _child(call: str, subprocess_run: Any, timeout: float = 300.0) -> dict[str, Any]:
    proc = subprocess_run(
        f"import json; from tests import test_free_threading as m; print(json.dumps(m.{call}))",
        timeout=timeout,
    )
    assert (proc.returncode, proc.stderr[-4000:]) == (0, "")
    return json.loads(proc.stdout.splitlines()[-1])  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------------
# The GIL stays off


def import_everything() -> dict[str, Any]:
    """Import every module of the package (and NumPy, if installed); whether the GIL is on after."""
    import importlib
    import pkgutil
    import warnings

    warnings.simplefilter("error")  # "The global interpreter lock (GIL) has been enabled ..."
    gil = getattr(sys, "_is_gil_enabled", lambda: True)
    before = gil()
    names = [
        info.name
        for info in pkgutil.walk_packages(tb.__path__, "tensorbridge.")
        if not info.name.endswith(("__main__", "_benchmarks"))
    ]
    for name in names:
        importlib.import_module(name)
    try:
        import numpy

        numpy.zeros(1)
    except ImportError:
        pass
    extensions = sorted(
        name
        for name, module in sys.modules.items()
        if name.startswith("tensorbridge.")
        and str(getattr(module, "__file__", "")).endswith((".so", ".pyd"))
    )
    return {
        "before": before,
        "after": gil(),
        "modules": len(names),
        "extensions": extensions,
        "kind": tb.build_info().kind,
    }


@pytest.mark.skipif(not FREE_THREADED, reason="needs a free-threaded CPython (no GIL)")
def test_importing_tensorbridge_keeps_the_gil_off(subprocess_run: Any) -> None:
    got = _child("import_everything()", subprocess_run)
    assert (got["before"], got["after"]) == (False, False), got
    assert got["modules"] > 40, got
    if got["kind"] == "compiled":  # every compiled module was imported, and none turned it on
        assert len(got["extensions"]) == len(tb.build_info().modules), got


# --------------------------------------------------------------------------------------------------
# The stress


def _values(t: Any) -> list[int]:
    return t.tolist()  # type: ignore[no-any-return]


class _Worker:
    """One thread's loop: random operations until the deadline, every value checked."""

    def __init__(self, seed: int, shared: list[Any], keep: list[Any], deadline: float) -> None:
        import random

        self.rng = random.Random(seed)
        self.shared, self.keep, self.deadline = shared, keep, deadline
        self.own = tb.zeros(N, dtype=tb.int64)  # this thread's tensor: written only here
        self.fill = 0
        self.ops: dict[str, int] = {}
        self.errors: list[str] = []
        self.arrow = 0
        self.families: list[str] = []
        self.segments: list[str] = []  # the shared-memory segments this thread made

    def check(self, what: str, got: list[int], want: list[int]) -> None:
        if got != want:
            self.errors.append(f"{what}: {got[:6]} != {want[:6]}")

    def pick(self) -> tuple[Any, list[int]]:
        """A tensor and the values it must hold: a shared one (read only) or this thread's own."""
        if self.rng.random() < 0.5:
            base = self.rng.choice(self.shared)
            return base, list(range(N))
        self.fill += 1
        self.own.fill_(self.fill)
        return self.own, [self.fill] * N

    def run(self) -> None:
        import time

        ops = [op for op in dir(self) if op.startswith("op_")]
        while time.monotonic() < self.deadline:
            op = self.rng.choice(ops)
            try:
                getattr(self, op)()
            except Exception as exc:  # every failure is an error of the run, with its name
                self.errors.append(f"{op}: {type(exc).__name__}: {exc}")
            self.ops[op] = self.ops.get(op, 0) + 1
            if len(self.keep) > 64:  # drop what other threads kept: their releases run here
                with contextlib.suppress(IndexError):  # another thread popped meanwhile
                    self.keep.pop(self.rng.randrange(len(self.keep)))

    # the export registry ---------------------------------------------------------------------
    def op_numpy_takes_a_capsule(self) -> None:
        import numpy as np

        t, want = self.pick()
        start = self.rng.randrange(N)
        a = np.from_dlpack(t[start:])
        self.check("np.from_dlpack", a.tolist(), want[start:])
        self.keep.append(a)

    def op_tensorbridge_imports_numpy(self) -> None:
        import numpy as np

        a = np.arange(N, dtype=np.int64)[:: self.rng.choice((1, 2, -1))]
        t = tb.from_dlpack(a)
        self.check("tb.from_dlpack(ndarray)", _values(t), a.tolist())
        self.keep.append(t)

    def op_capsule_round_trip(self) -> None:
        t, want = self.pick()
        back = tb.from_dlpack(t.__dlpack__(max_version=(1, 0)))
        self.check("capsule", _values(back), want)

    def op_capsule_abandoned(self) -> None:
        t, _ = self.pick()
        tb.to_dlpack(t[1:])  # never taken: the registry releases it

    def op_memoryview(self) -> None:
        t, want = self.pick()
        view = memoryview(t) if sys.version_info >= (3, 12) else t.as_memoryview()
        self.check("memoryview", view.cast("B").cast("q").tolist(), want)
        if self.rng.random() < 0.3:
            self.keep.append(view[1:])  # a slice outlives the view: an orphan for the reap

    def op_arrow(self) -> None:
        try:
            import pyarrow as pa
        except ImportError:
            return
        t, want = self.pick()
        self.check("pa.array", pa.array(t).to_pylist(), want)
        self.arrow += 1

    # the per-type decisions ------------------------------------------------------------------
    def op_new_producer_type(self) -> None:
        t, want = self.pick()
        copy = t.clone()  # a producer whose values cannot change under the reader

        class Producer:  # a new type each call: the per-type tables fill and empty
            def __dlpack__(self, **kwargs: Any) -> Any:
                return copy.__dlpack__(**kwargs)

            def __dlpack_device__(self) -> Any:
                return copy.__dlpack_device__()

        self.check("new producer type", _values(tb.from_dlpack(Producer())), want)

    def op_new_interface_type(self) -> None:
        t, want = self.pick()
        copy = t.clone()
        Interface = type("Interface", (), {"__array_interface__": copy.__array_interface__})
        held = Interface()
        got = tb.asarray(held)
        self.check("new __array_interface__ type", _values(got), want)
        del copy  # the tensor built over the interface's memory keeps nothing: hold it to read
        self.keep.append((got, held))

    def op_exchange_api(self) -> None:
        t, want = self.pick()
        self.check("tb.from_dlpack(tb tensor)", _values(tb.from_dlpack(t)), want)

    # shared-memory segments -----------------------------------------------------------------
    def op_shared_memory(self) -> None:
        import pickle
        from multiprocessing.reduction import ForkingPickler

        t, want = self.pick()
        s = t.clone().share_memory_()
        self.segments.append(s._storage.owner.name)  # its first name; its links extend it
        sent = bytes(ForkingPickler.dumps(s))  # a name of its own, for the receiver
        got = pickle.loads(sent)  # the receiver takes that name over
        self.check("shared memory", _values(got), want)
        del s
        if self.rng.random() < 0.5:
            self.keep.append(got)


def _run(shared: list[Any], keep: list[Any], seconds: float, workers: int) -> dict[str, Any]:
    """``workers`` threads run `_Worker` until ``seconds`` have passed while another collects;
    their figures, summed (the workers and threads die with this call)."""
    import gc
    import threading
    import time

    deadline = time.monotonic() + seconds
    pool = [_Worker(seed, shared, keep, deadline) for seed in range(workers)]
    done = threading.Event()
    collections = 0

    def collector() -> None:
        nonlocal collections
        while not done.wait(COLLECT_PAUSE):
            gc.collect()
            collections += 1

    threads = [threading.Thread(target=w.run) for w in pool]
    gc_thread = threading.Thread(target=collector)
    start = time.monotonic()
    gc_thread.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    gc_thread.join()
    ops: dict[str, int] = {}
    for w in pool:
        for op, count in w.ops.items():
            ops[op] = ops.get(op, 0) + count
    return {
        "seconds": round(time.monotonic() - start, 2),
        "threads": workers,
        "collections": collections,
        "ops": ops,
        "operations": sum(ops.values()),
        "errors": [e for w in pool for e in w.errors][:10],
        "arrow": sum(w.arrow for w in pool),
        "segments": {name for w in pool for name in w.segments},
    }


def _shm_names() -> set[str]:
    return (
        {n for n in os.listdir("/dev/shm") if n.startswith("psm_")}
        if os.path.isdir("/dev/shm")
        else set()
    )


def stress(seconds: float = SECONDS, workers: int = WORKERS) -> dict[str, Any]:
    """`_run` over three shared tensors (own memory, a bytearray, a NumPy array); then every
    table tensorbridge keeps, and every reference it took, as they are left."""
    import gc

    import numpy as np

    from tensorbridge import _arrow_export, _exports

    array = np.arange(N, dtype=np.int64)
    buffer = bytearray(array.tobytes())
    refs = {"array": sys.getrefcount(array), "buffer": sys.getrefcount(buffer)}
    shared = [tb.arange(N), tb.frombuffer(buffer, dtype=tb.int64), tb.from_dlpack(array)]
    keep: list[Any] = []
    released_before = _arrow_export.release_counts()
    shm_before = _shm_names()
    figures = _run(shared, keep, seconds, workers)
    segments = figures.pop("segments")
    keep.clear()
    del shared
    gc.collect()
    _exports.reap()
    buffer.append(0)  # resizable again: every view of it released its export
    return {
        **figures,
        "gil": sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True,  # type: ignore[attr-defined]
        "registry": _exports.counts(),
        "refs": {
            "array": sys.getrefcount(array) - refs["array"],
            "buffer": sys.getrefcount(buffer) - refs["buffer"],
        },
        "arrow_released": {
            k: v - released_before[k] for k, v in _arrow_export.release_counts().items()
        },
        # Names of this stress's segments (a first name, or a link made from it) still in
        # /dev/shm: other tests running beside this one make and unlink segments of their own.
        "shm_left": sorted(
            name for name in _shm_names() - shm_before if name.split(".")[0] in segments
        ),
    }


def host_views(rounds: int = 600, workers: int = WORKERS) -> dict[str, Any]:
    """Threads copy and read slices of one shared tensor at once: every copy reads the host view
    of the same storage, slicing and casting it. Without a GIL, CPython 3.13 counts a memoryview's
    exports without atomics: threads sharing one view released it under each other."""
    import random
    import threading

    from tensorbridge import _storage

    base = tb.arange(N)
    values = list(range(N))
    errors: list[str] = []
    failures: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(rounds):
                key = slice(rng.randrange(N), None, rng.choice((1, 2, -1, -3)))
                got = base[key].clone().tolist()
                if got != values[key]:
                    errors.append(f"{key}: {got[:6]} != {values[key][:6]}")
        except Exception as exc:  # what a released view raises, on any thread
            failures.append(repr(exc))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    storage = base._storage
    return {
        "errors": errors[:5],
        "failures": failures[:5],
        "shared": _storage._SHARE_HOST_VIEW,
        "same_view": storage.host_view("test") is storage.host_view("test"),
    }


def test_threads_copying_one_storage_each_read_a_view_that_stays_valid(
    subprocess_run: Any,
) -> None:
    """A storage keeps one host view only where a GIL serialises its users: without one, each
    read gets a view of its own, and no copy ever meets a released view."""
    got = _child("host_views()", subprocess_run)
    assert got["failures"] == [] and got["errors"] == [], got
    assert got["shared"] is got["same_view"] is not FREE_THREADED, got


@pytest.mark.skipif(
    importlib.util.find_spec("numpy") is None, reason="the stress shares NumPy arrays"
)
def test_many_threads_share_every_table_without_losing_or_doubling_anything(
    subprocess_run: Any,
) -> None:
    """8 threads export, import, abandon, slice, share and pickle while a 9th collects; every value
    read back is right, and afterwards every table is empty and every reference given back."""
    got = _child("stress()", subprocess_run, timeout=120 + 4 * SECONDS)
    print(json.dumps(got))  # the figures (pytest -s shows them)
    assert got["errors"] == [], got["errors"]
    assert got["gil"] is not FREE_THREADED  # a free-threaded run really ran without the GIL
    assert got["registry"] == {"views": 0, "managed": 0, "pending": 0}, got
    assert got["refs"] == {"array": 0, "buffer": 0}, got
    assert got["shm_left"] == [], got
    # pyarrow releases each schema and array it imported: one each per pa.array() call.
    assert got["arrow_released"] == {"schemas": got["arrow"], "arrays": got["arrow"]}, got
    assert got["collections"] > 0 and min(got["ops"].values()) > 0, got
