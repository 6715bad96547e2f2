"""The export registry: memoryview and DLPack exports stay valid under threads and collections.

The stress tests run in a child interpreter (a lost entry frees memory that is still exported,
which can crash it) with glibc's mmap threshold lowered, so freed tensor memory is returned to the
system or handed to the next allocation at once: a view left pointing at freed memory then reads
another tensor's values, or faults. They check the values every view reads, not only survival.
"""

from __future__ import annotations

import gc
import pickle
import subprocess
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

import tensorbridge as tb
from tensorbridge import _exports

_ROOT = Path(__file__).resolve().parents[1]


# Switch threads and collect (and so reap) as often as possible: every interleaving of export,
# release and reap gets its chance.
_STRESS_PRELUDE = """
import gc, sys, threading
import numpy as np
import tensorbridge as tb

sys.setswitchinterval(1e-6)
gc.set_threshold(50, 5, 5)
ROUNDS, KEEP = 4000, 40
stop = threading.Event()
bad = []


def run(worker, churn):  # two threads of worker(seed) against churn() until the workers end
    stop.clear()
    workers = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    churner = threading.Thread(target=churn)
    churner.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    churner.join()
"""


def _run_child(subprocess_run: Any, code: str) -> subprocess.CompletedProcess[str]:
    env = {"MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONFAULTHANDLER": "1"}
    return subprocess_run(_STRESS_PRELUDE + textwrap.dedent(code), 240.0, env, _ROOT)  # type: ignore[no-any-return]


@pytest.mark.subprocess
def test_memoryview_slices_keep_their_memory_under_threads_and_gc(subprocess_run: Any) -> None:
    """Slices of dropped memoryviews, read through NumPy, keep their values while other threads
    export, drop and collect."""
    pytest.importorskip("numpy")
    proc = _run_child(
        subprocess_run,
        """

        def slicer(seed):
            kept = []
            for i in range(ROUNDS):
                value = seed * 10**6 + i
                t = tb.full((512,), value, dtype=tb.int64)  # 4 KiB: reused at once when freed
                m = t.as_memoryview()
                s = m[8:]
                del t, m
                kept.append((np.frombuffer(s, dtype=np.int64), value))
                if len(kept) > KEEP:
                    a, v = kept.pop(0)
                    if not (a == v).all():
                        bad.append((v, int(a[0])))
            bad.extend((v, int(a[0])) for a, v in kept if not (a == v).all())

        def churn():
            i = 0
            while not stop.is_set():
                m = tb.arange(600).as_memoryview()
                part = m[1:]
                del m, part
                i += 1
                if i % 40 == 0:
                    gc.collect()

        for _ in range(2):
            run(slicer, churn)
        gc.collect()
        from tensorbridge import _exports
        print(len(bad), bad[:3], _exports.counts()["views"])
        """,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split(maxsplit=1)[0] == "0", proc.stdout
    assert proc.stdout.split()[-1] == "0", proc.stdout  # every entry released once views died


@pytest.mark.subprocess
def test_dlpack_exports_keep_their_memory_under_threads_and_gc(subprocess_run: Any) -> None:
    """Capsules consumed by NumPy, consumed by tensorbridge or abandoned, from several threads
    with collections running, keep every imported view's values; the registry drains."""
    pytest.importorskip("numpy")
    proc = _run_child(
        subprocess_run,
        """

        def exporter(seed):
            kept = []
            for i in range(ROUNDS):
                value = seed * 10**6 + i
                t = tb.full((512,), value, dtype=tb.int64)
                kind = i % 3
                if kind == 0:
                    view = np.from_dlpack(t[8:])
                elif kind == 1:
                    view = tb.from_dlpack(t[8:].__dlpack__(max_version=(1, 0)))
                else:
                    t.__dlpack__()  # abandoned
                    view = np.asarray(t[8:])
                del t
                kept.append((view, value))
                if len(kept) > KEEP:
                    a, v = kept.pop(0)
                    if not (np.asarray(a) == v).all():
                        bad.append(v)
            bad.extend(v for a, v in kept if not (np.asarray(a) == v).all())

        def churn():
            i = 0
            while not stop.is_set():
                tb.to_dlpack(tb.arange(600))
                i += 1
                if i % 40 == 0:
                    gc.collect()

        run(exporter, churn)
        gc.collect()
        from tensorbridge import _exports
        counts = _exports.counts()
        print(len(bad), counts["managed"], counts["pending"])
        """,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["0", "0", "0"], proc.stdout


def test_memoryview_exports_never_fail_when_a_collection_runs_inside() -> None:
    """as_memoryview() and pickling with protocol 5 never fail, even with a collection (and so a
    reap) at every allocation."""
    t = tb.arange(16, dtype=tb.float32)
    before = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        for _ in range(300):
            assert t.as_memoryview().tolist()[3] == 3.0
            buffers: list[pickle.PickleBuffer] = []
            data = pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
            assert tb.equal(pickle.loads(data, buffers=buffers), t)
    finally:
        gc.set_threshold(*before)


def test_a_reap_under_way_is_not_waited_for() -> None:
    """A reap that finds another under way returns at once and leaves the work to it."""
    gc.disable()
    try:
        _exports.reap()
        before = set(_exports._PENDING)
        tb.arange(4).__arrow_c_array__()  # both capsules abandoned: watched in every build
        abandoned = set(_exports._PENDING) - before
        assert len(abandoned) == 2
        acquired = _exports._LOCK.acquire()
        try:
            assert acquired
            _exports.reap()  # must not block, must not settle
            assert abandoned <= set(_exports._PENDING)
        finally:
            _exports._LOCK.release()
        _exports.reap()
        assert not abandoned & set(_exports._PENDING)
    finally:
        gc.enable()


def _resizable(buffer: bytearray) -> bool:
    try:
        buffer.append(0)
    except BufferError:
        return False
    buffer.pop()
    return True


def test_a_dropped_view_releases_its_memory_at_once_and_a_slice_at_the_next_collection() -> None:
    """A memoryview lets its memory go when it dies; with a slice alive, once the slice dies and a
    collection runs."""
    gc.collect()
    buffer = bytearray(range(8))
    t = tb.frombuffer(buffer, dtype=tb.uint8)
    view = t.as_memoryview()
    del t
    assert not _resizable(buffer)
    del view
    assert _resizable(buffer)
    t = tb.frombuffer(buffer, dtype=tb.uint8)
    part = t.as_memoryview()[2:]
    del t
    assert part.tolist() == [2, 3, 4, 5, 6, 7]
    assert not _resizable(buffer)
    del part
    gc.collect()
    assert _resizable(buffer)
    assert _exports.counts()["views"] == 0


def test_the_deleter_may_run_on_another_thread_during_a_reap() -> None:
    """Consumers on other threads release exports while this thread reaps: nothing is lost."""
    views = [tb.from_dlpack(tb.arange(8).__dlpack__(max_version=(1, 0))) for _ in range(200)]
    stop = threading.Event()

    def reaper() -> None:
        while not stop.is_set():
            _exports.reap()

    thread = threading.Thread(target=reaper)
    thread.start()
    try:
        while views:
            assert views.pop().tolist() == list(range(8))
    finally:
        stop.set()
        thread.join()
    gc.collect()
    assert _exports.counts()["managed"] == 0
