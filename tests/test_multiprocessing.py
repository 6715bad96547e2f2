"""multiprocessing: shared-memory tensors travel by name through queues and process pools.

``share_memory_()`` moves a tensor into a ``multiprocessing.shared_memory`` segment and registers a
reducer with ``multiprocessing``'s pickler, which queues, ``Pool`` and ``ProcessPoolExecutor`` use:
they send the segment's name and the layout, never the bytes, and the receiver maps the same memory.
Every start method is checked (spawn, and fork and forkserver where the platform has them), for both
routes: a ``multiprocessing.Queue`` to a ``Process``, and a ``ProcessPoolExecutor`` that returns the
tensor. Forking from the multi-threaded test runner warns, so one child interpreter runs every check
and prints one JSON line.
"""

from __future__ import annotations

import sys

import pytest
from tests.conftest import run_script_for_result

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX shared memory names"),
]

_CHECKS = """
import concurrent.futures
import json
import multiprocessing
import operator
from multiprocessing.reduction import ForkingPickler

import tensorbridge as tb


def write_from_queue(inbox, outbox):
    t = inbox.get()
    t[1:3] = -5
    owner = t._storage.owner
    outbox.put([type(owner).__name__, getattr(owner, "name", None), t.stride(), t.dtype.name])


def main():
    results = {}
    for method in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context(method)
        t = tb.arange(1 << 18, dtype=tb.int32).share_memory_()  # 1 MiB
        name = t._storage.owner.name
        sent = len(ForkingPickler.dumps(t))
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
            back = ex.submit(operator.methodcaller("fill_", 7.0), u[2:5]).result()
        owner = back._storage.owner
        back[0] = -1.0
        pool = [
            u.tolist(),
            type(owner).__name__,
            owner.name == u._storage.owner.name,
        ]
        results[method] = {"sent": sent, "name": name, "queue": queue, "pool": pool}
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
"""


def test_queues_and_pools_send_shared_tensors_by_name(tmp_path):
    """Every start method: queue and pool carry the name only; writes on either side are shared."""
    result, got = run_script_for_result(_CHECKS, tmp_path)
    assert result.stderr == ""  # no resource-tracker leak warning, no traceback
    assert "spawn" in got
    for method, checks in got.items():
        assert checks["sent"] < 500, method  # a 1 MiB tensor pickles to its name and layout
        seen, head, exitcode = checks["queue"]
        assert seen == ["_SharedBlock", checks["name"], [1], "int32"], method
        assert head == [0, -5, -5, 3], method  # the receiver wrote into the sender's memory
        assert exitcode == 0, method
        values, owner, same_segment = checks["pool"]
        assert values == [0.0, 0.0, -1.0, 7.0, 7.0, 0.0], method
        assert owner == "_SharedBlock" and same_segment, method
