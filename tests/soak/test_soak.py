"""Leak and lifetime soak: round trips through every protocol, repeated, must leave nothing behind.

Each scenario runs in a child interpreter (a lifetime bug may crash; a crash is then a failed test,
and the process measures only itself). The child runs one iteration, then a traced warm-up of 300,
then ``TB_SOAK_ITERS`` measured iterations (default 1000; ``TB_SOAK_ITERS=1000000`` for a long run),
and reports:

* allocated pymalloc blocks (``sys.getallocatedblocks``), traced memory (``tracemalloc``) and
  resident set size (``/proc/self/statm``), each after a full collection (which also empties
  CPython's free lists);
* tensorbridge's exported capsules, counted at creation, and its releases (the capsule deleter
  called by a consumer, or the reaper releasing an abandoned capsule), counted on whatever thread
  they happen;
* the ctypes-crafted producer's made / deleted / stray deleter calls (`tensorbridge.testing.stats`);
* the reference count of every long-lived exporter (a NumPy array, a PyTorch tensor, a bytearray,
  ...) and pyarrow's allocated bytes;
* open file descriptors and mappings of the scenario's files.

Bounds, for ``n`` measured iterations (each makes at least 16 KiB of fresh tensor data):

* blocks grow by less than ``256 + n / 4``. Leaking one small object (anything up to 512 bytes, such
  as an ``object()`` or a capsule) per iteration adds ``n`` blocks: caught once ``n > 341``; at the
  default 1000 the bound is 506 against 1000.
* traced memory grows by less than ``32 KiB + 256 B * n``. A leak that is not a block (an allocation
  over 512 bytes, such as one iteration's data array) adds at least ``512 B * n``: caught once ``n >
  128``. Memory allocated by the peers' own Python code (their caches: JAX's once grew by 1.9 MiB
  in one go on a loaded machine, with no block growth) is not counted; objects a peer allocates and
  tensorbridge keeps alive still count as blocks, and their data in RSS.
* RSS grows by less than 8 MiB. Keeping one iteration's data alive adds ``16 KiB * n`` (16 MiB at
  the default), also for memory that tracemalloc does not see (PyTorch's, JAX's): caught once ``n >
  512``.
* Every count is exact: exports == releases, crafted made == deleted, no stray deleter call, every
  exporter's reference count back where it started, no descriptor or mapping left open.

Observed at the default (2 cores, Python 3.11): blocks within +180, traced within +12.4 KiB, RSS
within +0.6 MiB; about 20 s for the eight scenarios.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.soak import crafted

pytestmark = [pytest.mark.soak, pytest.mark.subprocess]

ITERS = int(os.environ.get("TB_SOAK_ITERS", "1000"))
WARMUP = 300
ELEMENTS = 4096  # float32/int32 elements of fresh data per iteration: 16 KiB
BLOCKS_FIXED, BLOCKS_PER_ITER = 256, 1 / 4
TRACED_FIXED, TRACED_PER_ITER = 32 << 10, 256
RSS_BOUND = 8 << 20

_FILE_PREFIX = "tb-soak-"
_ROOT = Path(__file__).resolve().parents[2]
_PAGE = os.sysconf("SC_PAGE_SIZE")

Step = Callable[[int], None]


# --------------------------------------------------------------------------------------------------
# Scenarios (run in the child). Each returns the per-iteration step and the long-lived exporters
# whose reference counts must come back.


def _numpy() -> tuple[Step, dict[str, Any]]:
    import numpy as np

    import tensorbridge as tb

    array = np.arange(ELEMENTS, dtype=np.float32)
    tensor = tb.arange(ELEMENTS, dtype=tb.float32)

    def step(i: int) -> None:
        fresh = np.full(ELEMENTS, i, dtype=np.float32)
        t = tb.from_dlpack(fresh)  # NumPy capsule consumed by tensorbridge
        back = np.from_dlpack(t[1:])  # tensorbridge capsule consumed by NumPy
        flipped = np.from_dlpack(t[::-1])  # negative strides: exported as a copy
        seen = np.asarray(t[::2])  # __array_interface__ export
        again = tb.asarray(seen)  # NumPy view of tensorbridge memory, imported back
        u = tb.from_dlpack(array)
        v = np.from_dlpack(tensor)
        w = tb.from_dlpack(np.from_dlpack(tensor[::3]))
        assert back[0] == i
        assert flipped[0] == i
        assert float(again[7]) == i
        assert float(u[5]) == 5
        assert v[6] == 6
        assert float(w[2]) == 6

    return step, {"numpy array": array, "tb tensor": tensor}


def _torch() -> tuple[Step, dict[str, Any]]:
    import torch
    from torch.utils import dlpack as torch_dlpack

    import tensorbridge as tb

    source = torch.arange(ELEMENTS, dtype=torch.float32)
    tensor = tb.arange(ELEMENTS, dtype=tb.float32)

    def step(i: int) -> None:
        t = tb.full((ELEMENTS,), i, dtype=tb.float32)
        x = torch.from_dlpack(t)  # tb -> torch
        t2 = tb.from_dlpack(x)  # torch -> tb
        x2 = torch_dlpack.from_dlpack(tb.to_dlpack(t2[::2]))  # legacy capsules both ways
        t3 = tb.from_dlpack(torch_dlpack.to_dlpack(x2))
        u = tb.from_dlpack(source)
        v = torch.from_dlpack(tensor[1:])
        assert x[5].item() == i
        assert float(t3[9]) == i
        assert float(u[4]) == 4
        assert v[0].item() == 1

    return step, {"torch tensor": source, "tb tensor": tensor}


def _jax() -> tuple[Step, dict[str, Any]]:
    import jax.numpy as jnp

    import tensorbridge as tb

    tensor = tb.arange(ELEMENTS, dtype=tb.float32)

    def step(i: int) -> None:
        t = tb.full((ELEMENTS,), i, dtype=tb.float32)
        j = jnp.from_dlpack(t)  # tb -> JAX
        back = tb.from_dlpack(j)  # JAX -> tb
        shared = jnp.from_dlpack(tensor)
        assert float(back[3]) == i
        assert shared.shape == (ELEMENTS,)

    return step, {"tb tensor": tensor}


def _frombuffer() -> tuple[Step, dict[str, Any]]:
    import array
    import mmap

    import tensorbridge as tb

    buffer = bytearray(4 * ELEMENTS)
    ints = array.array("i", range(ELEMENTS))
    mapping = mmap.mmap(-1, 4 * ELEMENTS)
    frozen = bytes(range(256)) * 16

    def step(i: int) -> None:
        fresh = bytearray(i.to_bytes(4, "little") * ELEMENTS)
        t = tb.frombuffer(fresh, dtype=tb.int32)
        view = t[1::3]
        assert int(view[0]) == i
        try:
            fresh.append(0)
        except BufferError:
            pass
        else:
            raise AssertionError("a bytearray was resized while a tensor viewed it")
        del t, view
        fresh.append(0)  # the export was released with the last view
        u = tb.frombuffer(buffer, dtype=tb.uint8, offset=i % 100, count=10)
        w = tb.frombuffer(ints, dtype=tb.int32)[::2]
        m = tb.frombuffer(mapping, dtype=tb.int64)
        exported = m.as_memoryview()
        r = tb.frombuffer(frozen, dtype=tb.uint8)
        assert r.is_readonly
        assert int(w[3]) == 6
        assert len(u) == 10
        assert exported.nbytes == 4 * ELEMENTS

    return step, {"bytearray": buffer, "array.array": ints, "mmap": mapping, "bytes": frozen}


def _from_file() -> tuple[Step, dict[str, Any]]:
    import tempfile

    import tensorbridge as tb

    handle, path = tempfile.mkstemp(prefix=_FILE_PREFIX)
    os.write(handle, b"\x01\x00\x00\x00" * 2 * ELEMENTS)
    os.close(handle)

    def step(i: int) -> None:
        private = tb.from_file(path, size=ELEMENTS, dtype=tb.int32)
        shared = tb.from_file(path, shared=True, size=ELEMENTS, dtype=tb.int32)
        shared[i % ELEMENTS] = i
        readonly = tb.from_file(path, size=1024, dtype=tb.int32, offset=4 * ELEMENTS, mode="r")
        assert int(private[i % ELEMENTS]) == i
        assert int(readonly[5]) == 1
        assert readonly.is_readonly

    return step, {"path": path}


def _pickle() -> tuple[Step, dict[str, Any]]:
    import pickle

    import tensorbridge as tb

    tensor = tb.arange(ELEMENTS, dtype=tb.float32)

    def step(i: int) -> None:
        t = tb.full((ELEMENTS,), i, dtype=tb.float32)
        for protocol in (2, 4, 5):
            u = pickle.loads(pickle.dumps(t[::2], protocol=protocol))  # a view with gaps: packed
            assert float(u[3]) == i
        buffers: list[Any] = []
        data = pickle.dumps(t.view(64, 64), protocol=5, buffer_callback=buffers.append)
        v = pickle.loads(data, buffers=buffers)  # out of band: no copy
        w = pickle.loads(pickle.dumps(tensor[::-1], protocol=5))
        assert float(v[63, 63]) == i
        assert float(w[9]) == ELEMENTS - 10

    return step, {"tb tensor": tensor}


def _crafted() -> tuple[Step, dict[str, Any]]:
    import ctypes

    import tensorbridge as tb
    from tensorbridge import testing

    tensor = tb.arange(ELEMENTS, dtype=tb.float32)

    def step(i: int) -> None:
        block = (ctypes.c_float * ELEMENTS)(*([float(i)] * 16))
        good = testing.CraftedDLPack(
            (),
            data=ctypes.addressof(block),
            shape=(64, 64),
            strides=(64, 1),
            keep=block,
            versioned=i % 2 == 0,
        )
        t = tb.from_dlpack(good.take())
        assert float(t[::2, 1:][0, 0]) == i
        bad = testing.CraftedDLPack(
            (), data=ctypes.addressof(block), shape=(4,), strides=(1,), dtype=(2, 7, 1), keep=block
        )
        try:
            tb.from_dlpack(bad.take())  # rejected: left unconsumed, so its destructor frees it
        except BufferError:
            pass
        else:
            raise AssertionError("an unsupported dtype was imported")
        abandoned = tb.to_dlpack(t[1:])  # never consumed: reaped
        del abandoned
        own = tb.from_dlpack(tensor.__dlpack__(max_version=(1, 3)))
        assert float(own[2]) == 2

    return step, {"tb tensor": tensor}


def _arrow() -> tuple[Step, dict[str, Any]]:
    import pyarrow as pa

    import tensorbridge as tb

    chunk = pa.array(range(ELEMENTS), type=pa.int64())

    def step(i: int) -> None:
        fresh = pa.array([i] * ELEMENTS, type=pa.int32())
        t = tb.asarray(fresh)
        stream = tb.asarray(pa.chunked_array([fresh, fresh]))
        u = tb.asarray(chunk)
        assert int(t[5]) == i
        assert int(stream[ELEMENTS + 1]) == i
        assert int(u[7]) == 7

    return step, {"pyarrow array": chunk, "pa.total_allocated_bytes": pa.total_allocated_bytes}


SCENARIOS: dict[str, tuple[str | None, Callable[[], tuple[Step, dict[str, Any]]]]] = {
    "numpy": ("numpy", _numpy),
    "torch": ("torch", _torch),
    "jax": ("jax", _jax),
    "frombuffer": (None, _frombuffer),
    "from_file": (None, _from_file),
    "pickle": (None, _pickle),
    "crafted": (None, _crafted),
    "arrow": ("pyarrow", _arrow),
}


# --------------------------------------------------------------------------------------------------
# The child: measure a scenario and print the figures as JSON.


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _mappings() -> int:
    """Memory mappings of the scenario's own files (other mappings come and go with allocators)."""
    with open("/proc/self/maps") as f:
        return sum(_FILE_PREFIX in line for line in f)


def _exporter_state(exporters: dict[str, Any]) -> dict[str, int]:
    """Reference counts of the long-lived exporters (or the value of a callable probe)."""
    return {
        name: obj() if callable(obj) else sys.getrefcount(obj)
        for name, obj in exporters.items()
        if name != "path"
    }


_PEERS = ("jax", "jaxlib", "numpy", "torch", "pyarrow", "ml_dtypes")


def _peer_filters() -> list[tracemalloc.Filter]:
    """Filters that leave out what the peers' own Python files allocate."""
    import importlib.util

    filters = []
    for name in _PEERS:
        spec = importlib.util.find_spec(name)
        for location in (spec and spec.submodule_search_locations) or ():
            filters.append(tracemalloc.Filter(False, os.path.join(location, "*")))
    return filters


def _traced(filters: list[tracemalloc.Filter]) -> int:
    """Bytes traced, less what the peers' own Python files allocated."""
    snapshot = tracemalloc.take_snapshot().filter_traces(filters)
    return sum(stat.size for stat in snapshot.statistics("filename"))


def _state(
    counts: crafted.ExportCounter, exporters: dict[str, Any], filters: list[tracemalloc.Filter]
) -> dict[str, Any]:
    from tensorbridge import _exports, testing

    # Blocks and RSS first: the traced-memory snapshot makes (and frees) objects of its own.
    blocks, rss = sys.getallocatedblocks(), _rss()
    return {
        "traced": _traced(filters),
        "blocks": blocks,
        "rss": rss,
        "fds": _descriptors(),
        "maps": _mappings(),
        "registry": len(_exports._MANAGED) + len(_exports._PENDING),
        "exporters": _exporter_state(exporters),
        "crafted": testing.stats(),
        **counts.counts(),
    }


def child(scenario: str, iters: int) -> None:
    """Run ``scenario`` for ``iters`` measured iterations and print the figures."""
    step, exporters = SCENARIOS[scenario][1]()
    step(0)  # imports and first-use caches
    counts = crafted.ExportCounter()
    # Trace the warm-up too: objects on CPython's free lists that were allocated before tracing
    # started are swapped for traced ones as they are reused, a one-off growth that must end before
    # measuring.
    tracemalloc.start()
    for i in range(WARMUP):
        step(i)
    gc.collect()
    filters = _peer_filters()
    before = _state(counts, exporters, filters)
    start = time.perf_counter()
    for i in range(iters):
        step(i)
    seconds = time.perf_counter() - start
    gc.collect()  # also reaps abandoned capsules (a gc callback)
    after = _state(counts, exporters, filters)
    tracemalloc.stop()
    if "path" in exporters:
        os.unlink(exporters["path"])
    json.dump({"iters": iters, "seconds": seconds, "before": before, "after": after}, sys.stdout)


# --------------------------------------------------------------------------------------------------
# The tests (parent side).


def _soak(scenario: str) -> dict[str, Any]:
    module = SCENARIOS[scenario][0]
    if module is not None:
        pytest.importorskip(module)
    code = f"from tests.soak.test_soak import child; child({scenario!r}, {ITERS})"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=_ROOT,
        timeout=600 + ITERS * 0.05,
        check=False,
    )
    assert (proc.returncode, proc.stderr[-4000:]) == (0, "")
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_soak(scenario: str) -> None:
    """Repeated round trips leak no memory, release every export exactly once and restore
    refcounts."""
    figures = _soak(scenario)
    before, after, n = figures["before"], figures["after"], figures["iters"]
    delta = {
        key: after[key] - before[key]
        for key in ("traced", "blocks", "rss", "exports", "releases", "deleter")
    }
    print(f"{scenario}: {n} iterations in {figures['seconds']:.2f} s; {delta}")
    assert delta["blocks"] < BLOCKS_FIXED + BLOCKS_PER_ITER * n, figures
    assert delta["traced"] < TRACED_FIXED + TRACED_PER_ITER * n, figures
    assert delta["rss"] < RSS_BOUND, figures
    assert delta["releases"] == delta["exports"], figures
    assert before["registry"] == after["registry"] == 0, figures
    assert after["exporters"] == before["exporters"], figures
    assert (after["fds"], after["maps"]) == (before["fds"], before["maps"]), figures
    made = after["crafted"]["made"] - before["crafted"]["made"]
    deleted = after["crafted"]["deleted"] - before["crafted"]["deleted"]
    assert made == deleted, figures
    assert (after["crafted"]["stray"], after["crafted"]["live"]) == (0, 0), figures
