"""multiprocessing: shared-memory tensors travel by name through queues and process pools.

``share_memory_()`` moves a tensor into a ``multiprocessing.shared_memory`` segment and registers a
reducer with ``multiprocessing``'s pickler, which queues, ``Pool`` and ``ProcessPoolExecutor`` use:
they send a name of the segment and the layout, never the bytes, and the receiver maps the same
memory. On Linux each pickle carries a name of its own (a hard link the receiver takes over), so a
worker may return a tensor it shared and drop it, or exit, before the parent attaches. Every start
method is checked (spawn, and fork and forkserver where the platform has them), with real pools, and
so is that no name of a test's segments is left in /dev/shm. Forking from the multi-threaded test
runner warns, so one child interpreter runs each group of checks and prints one JSON line.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest
from tests.conftest import run_script_for_result

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX shared memory names"),
]

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="a name per pickle needs /dev/shm (Linux)"
)

_CHECKS = """
import concurrent.futures
import gc
import json
import multiprocessing
from multiprocessing.reduction import ForkingPickler

import tensorbridge as tb


def write_from_queue(inbox, outbox):
    t = inbox.get()
    t[1:3] = -5
    owner = t._storage.owner
    outbox.put([type(owner).__name__, owner.name.partition(".")[0], t.stride(), t.dtype.name])


def fill_view(t):
    return t.fill_(7.0)


def main():
    results = {}
    for method in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context(method)
        t = tb.arange(1 << 18, dtype=tb.int32).share_memory_()  # 1 MiB
        name = t._storage.owner.name
        pickled = ForkingPickler.dumps(t)
        here = ForkingPickler.loads(pickled)  # what was pickled is unpickled: its name goes
        here[0] = 1
        mapped = [len(pickled), t[0].item(), here._storage.owner.name.partition(".")[0]]
        t[0] = 0
        del here
        # Route 1: a queue to a process, which writes into the tensor it receives.
        inbox, outbox = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=write_from_queue, args=(inbox, outbox))
        p.start()
        inbox.put(t)
        seen = outbox.get(timeout=60)
        p.join(60)
        queue = [seen, t[:4].tolist(), p.exitcode]
        # Route 2: a process pool; the worker fills a view, and the view comes back by name.
        u = tb.zeros(6, dtype=tb.float64).share_memory_()
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as ex:
            back = ex.submit(fill_view, u[2:5]).result(timeout=60)
        owner = back._storage.owner
        back[0] = -1.0
        pool = [
            u.tolist(),
            type(owner).__name__,
            owner.name.partition(".")[0] == u._storage.owner.name,
        ]
        results[method] = {"mapped": mapped, "name": name, "queue": queue, "pool": pool}
        # The queues' and the pool's semaphores go now, outside any call into the resource
        # tracker: one that a collection finalises inside such a call (the next segment being
        # registered) makes CPython warn that the tracker was called reentrantly.
        inbox.close()
        outbox.close()
        del inbox, outbox, p, ex
        gc.collect()
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
"""


def test_queues_and_pools_send_shared_tensors_by_name(tmp_path):
    """Every start method: queue and pool carry a name only; writes on either side are shared."""
    result, got = run_script_for_result(_CHECKS, tmp_path)
    assert result.stderr == ""  # no resource-tracker leak warning, no traceback
    assert "spawn" in got
    for method, checks in got.items():
        sent, written, family = checks["mapped"]
        assert sent < 500, method  # a 1 MiB tensor pickles to a name and the layout
        assert written == 1 and family == checks["name"], method  # one memory, one segment
        seen, head, exitcode = checks["queue"]
        assert seen == ["_SharedBlock", checks["name"], [1], "int32"], method
        assert head == [0, -5, -5, 3], method  # the receiver wrote into the sender's memory
        assert exitcode == 0, method
        values, owner, same_segment = checks["pool"]
        assert values == [0.0, 0.0, -1.0, 7.0, 7.0, 0.0], method
        assert owner == "_SharedBlock" and same_segment, method


# Tensors a worker shares come back, 20 of 20, for every start method and every way a worker
# hands a result back: a ProcessPoolExecutor (two workers that live on; one that exits after each
# task, spawn and forkserver only), a Pool whose workers exit after each task (the worker may be
# gone before the parent attaches), and processes that put a tensor on a queue and exit before
# the parent reads it; and workers that exit holding tensors they shared unlink their names (fork
# and forkserver workers leave through os._exit, past atexit). Each check lists the names of the test's segments still in /dev/shm once
# its tensors are dropped and its workers have exited.
_RETURNS = """
import concurrent.futures
import gc
import json
import multiprocessing
import os
import sys

import tensorbridge as tb

N = 20


def fresh(i):
    return tb.full((1000,), float(i)).share_memory_()


def share_received(t):
    return t.share_memory_()


def same(t):
    return t


def produce(queue, i):
    queue.put(fresh(i))


KEPT = []


def keep(i):
    KEPT.append(fresh(i))  # alive until the worker exits
    return KEPT[-1]._storage.owner.name


def family(t):
    return t._storage.owner.name.partition(".")[0]


def check(got, expected, families):
    families.update(family(t) for t in got)
    return [t.tolist() == e for t, e in zip(got, expected)].count(True)


def leftovers(families):
    gc.collect()
    return sorted(f for f in os.listdir("/dev/shm") if f.partition(".")[0] in families)


def run(ctx, method):
    counts, families = {}, set()
    filled = [[float(i)] * 1000 for i in range(N)]
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as ex:
        got = list(ex.map(fresh, range(N), timeout=120))
        counts["executor, shared by the worker"] = check(got, filled, families)
        sent = [tb.full((5,), i) for i in range(N)]
        got = list(ex.map(share_received, sent, timeout=120))
        counts["executor, received and shared"] = check(got, [[i] * 5 for i in range(N)], families)
        base = tb.arange(N).share_memory_()
        families.add(family(base))
        got = list(ex.map(same, [base[i:] for i in range(N)], timeout=120))
        counts["executor, shared by the parent"] = check(
            got, [list(range(i, N)) for i in range(N)], families
        )
        del got, base
    # max_tasks_per_child refuses fork, and exists from Python 3.11 (the Pool below covers 3.10)
    if method != "fork" and sys.version_info >= (3, 11):
        with concurrent.futures.ProcessPoolExecutor(
            2, mp_context=ctx, max_tasks_per_child=1
        ) as ex:
            got = list(ex.map(fresh, range(N), timeout=120))
        counts["executor, worker exits after each task"] = check(got, filled, families)
        del got
    pool = ctx.Pool(2, maxtasksperchild=1)
    got = pool.map_async(fresh, range(N)).get(timeout=120)
    pool.close()
    pool.join()
    counts["Pool, worker exits after each task"] = check(got, filled, families)
    del got
    pool = ctx.Pool(2)
    kept = pool.map_async(keep, range(N)).get(timeout=120)
    pool.close()
    pool.join()
    families.update(kept)
    counts["names workers held when they exited"] = [
        os.path.exists("/dev/shm/" + name) for name in kept
    ].count(False)
    queue = ctx.Queue()
    producers = [ctx.Process(target=produce, args=(queue, i)) for i in range(N)]
    for p in producers:
        p.start()
    for p in producers:
        p.join(120)
    got = sorted((queue.get(timeout=60) for _ in producers), key=lambda t: t[0].item())
    counts["queue, producer exited"] = check(got, filled, families)
    counts["exit codes"] = [p.exitcode for p in producers].count(0)
    del got
    return {"counts": counts, "families": sorted(families), "left": leftovers(families)}


def main():
    results = {}
    for method in multiprocessing.get_all_start_methods():
        results[method] = run(multiprocessing.get_context(method), method)
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
"""


def _left_in_dev_shm(families):
    return sorted(f for f in os.listdir("/dev/shm") if f.partition(".")[0] in families)


@linux_only
def test_tensors_shared_in_workers_come_back_and_leave_no_segment(tmp_path):
    """20 of 20 for every start method and pool, values intact, no name left behind."""
    result, got = run_script_for_result(_RETURNS, tmp_path, timeout=480)
    assert result.stderr == ""  # no traceback, no resource-tracker leak warning
    assert {"fork", "spawn", "forkserver"} <= set(got)
    for method, checks in got.items():
        counts = checks["counts"]
        assert counts == dict.fromkeys(counts, 20), (method, counts)
        # the max_tasks_per_child executor runs on 3.11+ and not under fork
        per_task = method != "fork" and sys.version_info >= (3, 11)
        assert len(counts) == (8 if per_task else 7), method
        assert len(checks["families"]) >= 4 * 20, method  # each worker shared its own
        assert checks["left"] == [], method  # in the parent, its tensors dropped, workers gone
        assert _left_in_dev_shm(set(checks["families"])) == [], method  # after the program


# The names nobody can unlink in time: a pickle never unpickled, and the names a worker held when
# a signal killed it. They stay while the program runs, and multiprocessing's resource tracker,
# which every process of the program shares, unlinks them once the last process has exited.
_ORPHANS = """
import json
import multiprocessing
import os
from multiprocessing.reduction import ForkingPickler

import tensorbridge as tb


def hold(conn):
    t = tb.ones(100).share_memory_()
    conn.send(t._storage.owner.name)
    conn.recv()  # until killed


def main():
    t = tb.ones(100).share_memory_()
    family = t._storage.owner.name
    ForkingPickler.dumps(t)  # the pickle is dropped: its name has no receiver
    del t
    unpickled = sorted(f for f in os.listdir("/dev/shm") if f.startswith(family))
    here, there = multiprocessing.Pipe()
    worker = multiprocessing.get_context("forkserver").Process(target=hold, args=(there,))
    worker.start()
    held = here.recv()
    worker.kill()
    worker.join(60)
    killed = [worker.exitcode, os.path.exists("/dev/shm/" + held)]
    print("RESULT " + json.dumps({"unpickled": unpickled, "family": family, "held": held,
                                  "killed": killed}))


if __name__ == "__main__":
    main()
"""


@linux_only
def test_names_no_process_can_unlink_go_with_the_resource_tracker(tmp_path):
    """A dropped pickle's name and a killed worker's stay while the program runs, not after it."""
    result, got = run_script_for_result(_ORPHANS, tmp_path)
    [link] = got["unpickled"]
    assert link.startswith(got["family"] + ".")  # the parent's own name went with its tensor
    assert got["killed"] == [-signal.SIGKILL, True]  # no code ran in the killed worker
    assert "2 leaked shared_memory objects" in result.stderr  # the tracker says what it unlinks
    assert _left_in_dev_shm({got["family"], got["held"]}) == []


_INSIDE_TRACKER = """
import gc
import json
import os
import warnings
from multiprocessing import resource_tracker

import tensorbridge as tb

warnings.simplefilter("error")  # the tracker's "called reentrantly" warning fails the run
resource_tracker.ensure_running()
t = tb.arange(16).share_memory_()
name = t._storage.owner.name  # this segment's own name: other tests' segments come and go
# A collection that runs inside a call to the tracker (its lock held by this thread) frees the
# last view of the segment: the name goes at once, and the tracker is told after that call.
with resource_tracker._resource_tracker._lock:
    del t
    gc.collect()
    gone = not os.path.exists(os.path.join("/dev/shm", name))
u = tb.arange(4).share_memory_()  # a later call outside the tracker tells it
del u
gc.collect()
print("RESULT " + json.dumps({"name": name, "gone_inside": gone}))
"""


@linux_only
def test_a_segment_freed_inside_the_resource_tracker_is_unlinked_without_a_warning(tmp_path):
    """A storage whose last view dies in a collection inside the tracker (a pickle registering its
    name) still unlinks its name then, and the tracker hears of it once, with no warning."""
    result, got = run_script_for_result(_INSIDE_TRACKER, tmp_path)
    assert got["gone_inside"], got
    # No "called reentrantly" warning in this process, no "leaked" report from the tracker.
    assert result.stderr == ""
    assert _left_in_dev_shm({got["name"]}) == []


# A worker sent pickles that name the owner's first name (as pickles carried before per-pickle
# links), or that name with a NUL byte after it (which the system would read as the first name),
# refuses them before opening anything; so the owner, which needs its first name to make each
# pickle's link, can send its tensor to the same worker after each. Had the worker taken a first
# name over, it would have unlinked it with its tensor, and the owner's next send would fail.
_FORGED = """
import gc
import json
import multiprocessing
import os
import pickle

import tensorbridge as tb
from tensorbridge import _shared, _tensor


class Forged:
    def __init__(self, args):
        self.args = args

    def __reduce__(self):
        return _tensor._rebuild_shared, self.args


def receive(inbox, outbox, n):
    for _ in range(n):
        try:
            t = inbox.get(timeout=20)
        except Exception as exc:
            outbox.put(f"{type(exc).__name__}: {exc}")
        else:
            t[0] = t[0].item() + 1
            got = "received " + t._storage.owner.name.partition(".")[0]
            del t
            gc.collect()  # the name this worker took over goes now, before it answers
            outbox.put(got)


def names(first):
    return sorted(n for n in os.listdir("/dev/shm") if n.partition(".")[0] == first)


def main():
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    t = tb.zeros(4, dtype=tb.int64).share_memory_()
    first = t._storage.owner.name
    genuine = _shared.process_args(t)  # a genuine pickle's link; the forged ones copy its layout
    forged = [first, first + "\\x00x"]
    inbox, outbox = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=receive, args=(inbox, outbox, 2 * len(forged)))
    worker.start()
    seen = []
    for name in forged:
        before = names(first)
        inbox.put(Forged((name, *genuine[1:])))
        refused = outbox.get(timeout=20)
        after = names(first)
        inbox.put(t)  # the owner sends its tensor: a new link, made from its first name
        seen.append([refused, before == after == sorted([first, genuine[0]]), outbox.get(timeout=20)])
    worker.join(20)
    pickle.loads(pickle.dumps(Forged(genuine)))  # the genuine link is taken over here, and goes
    gc.collect()
    inbox.close()
    outbox.close()
    print("RESULT " + json.dumps({"first": first, "seen": seen, "values": t.tolist(),
                                  "exitcode": worker.exitcode, "left": names(first)}))


if __name__ == "__main__":
    main()
"""


@linux_only
def test_a_worker_refuses_a_first_name_and_the_owner_sends_on(tmp_path):
    """A worker refuses pickles naming the owner's first name (or it and a NUL byte) and touches
    no name; the owner then sends its tensor to that worker, which writes into it."""
    result, got = run_script_for_result(_FORGED, tmp_path, timeout=120)
    first = got["first"]
    assert len(got["seen"]) == 2
    for (refused, untouched, received), name in zip(got["seen"], [first, first + "\x00x"]):
        assert refused.startswith(f"ValueError: pickle.loads(): the shared-memory name {name!r} ")
        assert refused.endswith("pickle the tensor again.")
        assert untouched  # the names in /dev/shm before the refusal and after it
        assert received == f"received {first}"
    assert got["values"] == [2, 0, 0, 0]  # both sends reached the worker, which wrote into them
    assert got["exitcode"] == 0
    assert got["left"] == [first]  # its links went with the worker's tensors and the parent's
    assert result.stderr == ""  # no traceback from a send, no leaked name for the tracker
