"""Hostile input: crafted DLPack structs, array-interface dicts, lying buffers, escaping views.

Every input must end in a Python exception (a clean, built-in one) or a correct result; never a
crash, and never a read or write outside the memory the input describes. Memory comes from
`tensorbridge.testing.Fenced`, which sits between inaccessible pages, so an out-of-bounds access kills the
process; memory that must never be read on the host (device pointers) is an inaccessible page
itself.

Inputs that can crash run in child interpreters, a batch of ``BATCH / 2`` to ``BATCH`` inputs per
child: hypothesis draws the batch, the child runs it and reports one line per input, and a crash or
a wrong result fails the test naming the input it happened on. The budget is fixed:
``TB_FUZZ_BATCHES`` batches (default 12) per input kind, about 1000 inputs in all, derandomized
under the ``ci`` hypothesis profile (run ``pytest -s`` to see the figures).
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import json
import math
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tests.soak import crafted

import tensorbridge as tb
from tensorbridge import _capi
from tensorbridge import _dlpack_abi as abi
from tensorbridge._dtype import BY_DLPACK
from tensorbridge.testing import CraftedDLPack, Fenced, capsule_name

_ROOT = Path(__file__).resolve().parents[1]
BATCH = 40
BATCHES = int(os.environ.get("TB_FUZZ_BATCHES", "12"))
CLEAN = ("BufferError", "TypeError", "ValueError", "RuntimeError")
MAX_DATA = (
    1 << 20
)  # bytes of fenced memory a layout may get; larger layouts get a fence page instead
MAX_CHECKED = 4096  # elements whose values are compared one by one

_HUGE = [2**31 - 1, 2**32, 2**62, 2**63 - 1, -(2**63), -(2**31)]
_HOST = {1, 3, 11, 13}  # kDLCPU, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged: host-accessible

# No shrinking: a child that fails names the input it failed on (or was running when it crashed),
# and every shrinking step would cost a child interpreter.
batch_settings = settings(
    max_examples=BATCHES,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------------------------------
# The child side: memory, layouts, checks


def _indices(shape: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Every index of ``shape`` in row-major order (none when a size is 0, however large the
    others)."""
    if any(n <= 0 for n in shape):
        return iter(())
    return itertools.product(*(range(n) for n in shape))


def _span(shape: list[int], strides: list[int]) -> tuple[int, int] | None:
    """(lowest, highest) element offset a layout reaches, or None when it has no element."""
    if any(n <= 0 for n in shape):
        return None
    low = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0)
    return low, high


def _row_major(shape: list[int]) -> list[int]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return strides[::-1]


def _item_strides(shape: list[int], byte_strides: list[int], itemsize: int) -> list[int] | None:
    """Byte strides in items, or None when one that addresses memory is not whole items. The
    stride of a size-1 dimension, and every stride of an empty layout, addresses nothing: any
    value (0 here) reaches the same elements."""
    irrelevant = [0 in shape or n == 1 for n in shape]
    if any(s % itemsize and not idle for s, idle in zip(byte_strides, irrelevant, strict=True)):
        return None
    return [0 if idle else s // itemsize for s, idle in zip(byte_strides, irrelevant, strict=True)]


class _Memory:
    """Fenced memory for a layout: ``first`` is where byte 0 of element [0, ..., 0] should go."""

    def __init__(self, low: int, high: int, at_end: bool) -> None:
        size = high - low
        self.block = Fenced(size, at_end=at_end) if 0 < size <= MAX_DATA else None
        if self.block is not None:
            self.block.write(bytes((i * 7 + 3) % 251 for i in range(size)))
            self.first = self.block.start - low
        else:
            self.first = _fence_page()

    def inside(self, start: int, stop: int) -> bool:
        block = self.block
        return block is not None and block.start <= start and stop <= block.start + block.nbytes

    def snapshot(self) -> bytes:
        return self.block.read() if self.block is not None else b""


_FENCES: list[Fenced] = []


def _fence_page() -> int:
    """An address inside an inaccessible page: any host access to it crashes the process."""
    if not _FENCES:
        _FENCES.append(Fenced(8, at_end=False))
    return _FENCES[0].start - 64


def _element_bytes(t: tb.Tensor) -> bytes:
    """The tensor's elements packed row-major, read through tensorbridge."""
    return bytes(t.contiguous().as_memoryview())


def _expected_bytes(
    memory: _Memory, address: int, shape: list[int], strides: list[int], itemsize: int
) -> bytes:
    """What the elements of a layout at ``address`` hold, read from our own copy of the memory."""
    data, base = memory.snapshot(), memory.block.start  # type: ignore[union-attr]
    out = bytearray()
    for index in _indices(shape):
        at = address + sum(i * s for i, s in zip(index, strides, strict=True)) * itemsize - base
        out += data[at : at + itemsize]
    return bytes(out)


def _written_outside(
    t: tb.Tensor, memory: _Memory, address: int, shape: list[int], strides: list[int], itemsize: int
) -> str | None:
    """Zero the tensor, then look for changed bytes that are not element bytes (an out-of-bounds
    write)."""
    before = memory.snapshot()
    base = memory.block.start  # type: ignore[union-attr]
    t.zero_()
    after = memory.snapshot()
    elements = set()
    for index in _indices(shape):
        at = address + sum(i * s for i, s in zip(index, strides, strict=True)) * itemsize - base
        elements.update(range(at, at + itemsize))
    changed = (i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b)
    stray = [i for i in changed if i not in elements]
    return f"bytes {stray[:4]} outside the elements were written" if stray else None


def _check_host_tensor(
    t: tb.Tensor,
    memory: _Memory,
    address: int,
    shape: list[int],
    strides: list[int],
    readonly: bool,
) -> str | None:
    """Values, read-only flag and writes of a host tensor whose layout lies inside ``memory``."""
    itemsize = t.element_size()
    if t.is_readonly != readonly:
        return f"is_readonly {t.is_readonly}, expected {readonly}"
    if math.prod(shape) > MAX_CHECKED:
        return None
    if _element_bytes(t) != _expected_bytes(memory, address, shape, strides, itemsize):
        return "element values differ from the memory"
    if readonly:
        before = memory.snapshot()
        try:
            t.zero_()
        except ValueError:
            pass
        else:
            return "a read-only tensor accepted a write"
        return "a refused write changed memory" if memory.snapshot() != before else None
    return _written_outside(t, memory, address, shape, strides, itemsize)


def _check_device_tensor(t: tb.Tensor, data: int) -> str | None:
    """Device memory: carried and re-exported, never read (its pointer is an inaccessible page)."""
    repr(t)
    try:
        t.tolist()
    except BufferError:
        pass
    else:
        return "device memory was read on the host"
    try:
        again = tb.from_dlpack(t.__dlpack__(max_version=(1, 3)))
    except BufferError:
        # Negative strides are exported as a copy, which device memory cannot get. (Also when they
        # sit on dimensions of size 0 or 1, where they address nothing:
        # test_empty_device_view_reexports.)
        if any(s < 0 for s in t.stride()):
            return None
        raise
    moved = t.numel() > 0 and again.data_ptr() != t.data_ptr()  # size 0: data may become NULL
    if moved or again.shape != t.shape or again.device != t.device:
        return "re-export changed the tensor"
    return None


def _outcome(error: BaseException | None, problem: str | None = None) -> dict[str, Any]:
    if error is None:
        return {"result": "ok", "problem": problem}
    return {
        "result": type(error).__name__,
        "message": str(error)[:160],
        "problem": None if type(error).__name__ in CLEAN else "unclean exception",
    }


# -- DLPack ----------------------------------------------------------------------------------------


def _dlpack_layout(spec: dict[str, Any], itemsize: int) -> tuple[list[int], list[int]] | None:
    """The layout a well-formed reader sees, or None when it must not be read at all."""
    ndim = spec["ndim"]
    if not 0 <= ndim <= 64 or ndim > len(spec["shape"]) or (ndim and spec["null_shape"]):
        return None
    shape = spec["shape"][:ndim]
    strides = spec["strides"][:ndim] if spec["strides"] is not None else _row_major(shape)
    return shape, strides


def run_dlpack(spec: dict[str, Any]) -> dict[str, Any]:
    """Import one crafted managed tensor and check everything that can be checked about the
    outcome."""
    code, bits, lanes = spec["dtype"]
    dtype = BY_DLPACK.get((code, bits, lanes))
    itemsize = dtype.itemsize if dtype is not None else 1
    layout = _dlpack_layout(spec, itemsize)
    span = _span(*layout) if layout is not None else None
    memory = _Memory(span[0] * itemsize, (span[1] + 1) * itemsize, spec["at_end"]) if span else None
    data = {
        "block": None if memory is None else memory.first - spec["byte_offset"],
        "null": 0,
        "fence": _fence_page(),
        "huge": 2**64 - 64,
        "low": 8,
    }[spec["data"]]
    if data is None:
        data = _fence_page()
    name = None if spec["name"] is None else spec["name"].encode("latin-1")
    managed = CraftedDLPack(
        (),
        data=data,
        shape=spec["shape"],
        strides=spec["strides"],
        ndim=spec["ndim"],
        dtype=(code, bits, lanes),
        versioned=spec["versioned"],
        version=tuple(spec["version"]),
        flags=spec["flags"],
        device=tuple(spec["device"]),
        byte_offset=spec["byte_offset"],
        null_shape=spec["null_shape"],
        adjacent=spec["adjacent"],
        fence=True,
        deleter=spec["deleter"],
        name=name,
    )
    capsule = managed.take()
    problem = None
    try:
        t = tb.from_dlpack(capsule)
    except Exception as exc:
        outcome = _outcome(exc)
    else:
        outcome = None
    if outcome is not None:  # outside the except block: the traceback (and its frames) are gone
        if capsule_name(capsule).startswith(b"used_") and name is None:
            outcome["problem"] = "a failed import consumed the capsule"
        del capsule
        if spec["deleter"] and name is None and managed.deleter_calls != 1:
            outcome["problem"] = (
                f"deleter called {managed.deleter_calls} times after a failed import"
            )
        return outcome
    if dtype is None or layout is None or name is not None:
        problem = "a malformed capsule was imported"
    elif spec["versioned"] and spec["version"][0] != 1:
        problem = "a capsule of another major version was imported"
    elif tuple(t.shape) != tuple(layout[0]) or t.dtype is not dtype:
        problem = f"imported shape {tuple(t.shape)} / {t.dtype}, expected {layout[0]} / {dtype}"
    elif spec["device"][0] not in _HOST:
        problem = _check_device_tensor(t, data)
    elif memory is not None and spec["data"] == "block" and span is not None:
        address = data + spec["byte_offset"]
        if memory.inside(address + span[0] * itemsize, address + (span[1] + 1) * itemsize):
            readonly = spec["versioned"] and bool(spec["flags"] & abi.DLPACK_FLAG_BITMASK_READ_ONLY)
            problem = _check_host_tensor(t, memory, address, *layout, readonly)
    del t
    if spec["deleter"] and managed.deleter_calls != 1:
        problem = problem or f"deleter called {managed.deleter_calls} times after the tensor died"
    return _outcome(None, problem)


# -- __array_interface__ / __cuda_array_interface__ ------------------------------------------------

_TYPESTRS = {"<f4": 4, "<i8": 8, "|u1": 1, "|b1": 1, "<c16": 16, "<f2": 2, "<u2": 2, "<i4": 4}


class _Interface:
    """An object exposing one crafted interface dict."""

    def __init__(self, attribute: str, value: Any) -> None:
        self._attribute, self._value = attribute, value

    def __getattr__(self, name: str) -> Any:
        if name == self._attribute:
            return self._value
        raise AttributeError(name)


def _fenced_buffer(memory: _Memory | None, nbytes: int) -> Any:
    """A buffer exporter (a ctypes array) over fenced memory, or over a fresh fenced block."""
    if memory is not None and memory.block is not None:
        block = memory.block
    else:
        block = Fenced(nbytes)
        _KEEP.append(block)
    return (ctypes.c_char * block.nbytes).from_address(block.start), block


_KEEP: list[Any] = []


def run_interface(spec: dict[str, Any]) -> dict[str, Any]:
    """Import one crafted interface dict through asarray and check the outcome."""
    cuda = spec["kind"] == "cuda"
    itemsize = _TYPESTRS.get(spec["typestr"]) if isinstance(spec["typestr"], str) else None
    shape, strides = spec["shape"], spec["strides"]
    valid_shape = isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)
    element_strides = None
    if valid_shape and itemsize:
        if strides is None:
            element_strides = _row_major(shape)
        elif (
            isinstance(strides, list)
            and len(strides) == len(shape)
            and all(type(s) is int for s in strides)
        ):
            element_strides = _item_strides(shape, strides, itemsize)
    span = _span(shape, element_strides) if element_strides is not None else None
    memory = None
    if span is not None and itemsize and not cuda:
        memory = _Memory(span[0] * itemsize, (span[1] + 1) * itemsize, spec["at_end"])
    iface: dict[str, Any] = {
        "version": spec["version"],
        "typestr": spec["typestr"],
        "shape": spec["shape"],
    }
    if spec["descr"] is not None:  # JSON made the (name, typestr) tuples lists
        iface["descr"] = (
            [tuple(d) for d in spec["descr"]] if isinstance(spec["descr"], list) else spec["descr"]
        )
    if strides is not None:
        iface["strides"] = strides if not isinstance(strides, list) else tuple(strides)
    if isinstance(iface["shape"], list):
        iface["shape"] = tuple(iface["shape"])
    if spec["mask"]:
        iface["mask"] = b"\x01"
    if cuda and spec["stream"] != "absent":
        iface["stream"] = spec["stream"]
    kind = spec["data"]
    pointer = {
        "block": None if memory is None else memory.first,
        "fence": _fence_page(),
        "null": 0,
        "huge": 2**64 - 64,
        "negative": -8,
    }.get(kind)
    if kind in ("block", "fence", "null", "huge", "negative"):
        iface["data"] = (_fence_page() if pointer is None else pointer, spec["readonly"])
    elif kind == "buffer":
        buffer, block = _fenced_buffer(memory, spec["buffer_bytes"])
        iface["data"] = buffer
        iface["offset"] = spec["offset"]
        pointer = block.start + spec["offset"] if isinstance(spec["offset"], int) else None
    elif kind == "garbage":
        iface["data"] = 1.5
    target = _Interface("__cuda_array_interface__" if cuda else "__array_interface__", iface)
    try:
        t = tb.asarray(target)
    except Exception as exc:
        return _outcome(exc)
    problem = None
    if itemsize is None or not valid_shape or element_strides is None:
        problem = f"a malformed interface was imported as {tuple(t.shape)} {t.dtype}"
    elif tuple(t.shape) != tuple(shape):
        problem = f"imported shape {tuple(t.shape)}, expected {tuple(shape)}"
    elif cuda:
        problem = _check_device_tensor(t, pointer or 0)
    elif kind == "buffer":
        problem = _check_in_buffer(t, block, memory, element_strides)
    elif kind == "block" and memory is not None and memory.block is not None and span is not None:
        problem = _check_host_tensor(
            t, memory, pointer, list(shape), element_strides, bool(spec["readonly"])
        )
    return _outcome(None, problem)


def _check_in_buffer(
    t: tb.Tensor, block: Fenced, memory: _Memory | None, strides: list[int]
) -> str | None:
    """A buffer-backed import is bounds-checked: its elements lie inside the buffer, and read
    correctly."""
    itemsize = t.element_size()
    span = _span(list(t.shape), list(t.stride()))
    if span is None:
        return None
    start, stop = t.data_ptr() + span[0] * itemsize, t.data_ptr() + (span[1] + 1) * itemsize
    if not (block.start <= start and stop <= block.start + block.nbytes):
        return f"elements [{start:#x}, {stop:#x}) escape [{block.start:#x}, +{block.nbytes})"
    if memory is None or memory.block is not block or math.prod(t.shape) > MAX_CHECKED:
        return None
    expected = _expected_bytes(memory, t.data_ptr(), list(t.shape), list(t.stride()), itemsize)
    return None if _element_bytes(t) == expected else "element values differ from the buffer"


# -- buffers that lie: a C-level exporter (PyMemoryView_FromBuffer over a crafted Py_buffer) -------


def run_buffer(spec: dict[str, Any]) -> dict[str, Any]:
    """frombuffer and asarray of a memoryview built from a crafted ``Py_buffer``."""
    itemsize, shape, strides = spec["itemsize"], spec["shape"], spec["strides"]
    element_strides = (
        _row_major(shape) if strides is None else _item_strides(shape, strides, itemsize)
    )
    byte_strides = [s * itemsize for s in _row_major(shape)] if strides is None else strides
    span = _span(shape, byte_strides)
    length = math.prod(shape) * max(itemsize, 0) + spec["len_error"]
    low, high = (span[0], span[1] + max(itemsize, 1)) if span is not None else (0, 0)
    memory = _Memory(min(low, 0), max(high, length, 1), spec["at_end"])
    if memory.block is None:
        return {"result": "skipped", "problem": None}
    view = _capi.Py_buffer()
    view.buf = memory.first
    view.len = length
    view.itemsize = itemsize
    view.readonly = spec["readonly"]
    view.ndim = len(shape)
    fmt = None if spec["format"] is None else spec["format"].encode("latin-1")
    view.format = fmt
    shape_array = (ctypes.c_ssize_t * max(len(shape), 1))(*shape)
    strides_array = (ctypes.c_ssize_t * max(len(shape), 1))(*(strides or ()))
    view.shape = shape_array if shape else None
    view.strides = strides_array if strides is not None else None
    try:
        exporter = _capi.PyMemoryView_FromBuffer(view)
    except Exception as exc:
        return {"result": "refused by CPython", "message": str(exc)[:80], "problem": None}
    lies = spec["len_error"] != 0
    try:
        if spec["api"] == "frombuffer":
            t = tb.frombuffer(exporter, dtype=tb.uint8, count=spec["count"], offset=spec["offset"])
        else:
            t = tb.asarray(exporter)
    except Exception as exc:
        return _outcome(exc)
    if spec["api"] == "frombuffer":
        reach = (memory.first, memory.first + length)
    else:
        if element_strides is None:
            return _outcome(None, "strides that are not whole elements were imported")
        reach = (memory.first + low, memory.first + high) if span is not None else (0, 0)
        if lies:
            return _outcome(
                None, f"a buffer whose len {length} contradicts its shape {shape} was imported"
            )
    tspan = _span(list(t.shape), list(t.stride()))
    if tspan is not None:
        start = t.data_ptr() + tspan[0] * t.element_size()
        stop = t.data_ptr() + (tspan[1] + 1) * t.element_size()
        if not (reach[0] <= start and stop <= reach[1]):
            return _outcome(None, f"elements [{start:#x}, {stop:#x}) escape the buffer {reach}")
        if math.prod(t.shape) <= MAX_CHECKED:
            _element_bytes(t)  # reading must stay inside the fences
    if t.is_readonly != bool(spec["readonly"]):
        return _outcome(
            None, f"is_readonly {t.is_readonly} for a buffer with readonly={spec['readonly']}"
        )
    return _outcome(None, None)


_RUNNERS = {"dlpack": run_dlpack, "interface": run_interface, "buffer": run_buffer}


def child() -> None:
    """Read ``[kind, specs]`` from stdin, run each spec, print one JSON result per spec."""
    kind, specs = json.load(sys.stdin)
    runner = _RUNNERS[kind]
    for spec in specs:
        print(json.dumps(runner(spec)), flush=True)


# --------------------------------------------------------------------------------------------------
# The parent side


_FIGURES: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module", autouse=True)
def _fuzz_figures() -> Any:
    """Print how many inputs of each kind ran, and how they ended (visible with ``pytest -s``)."""
    start = time.perf_counter()
    yield
    for kind, counts in _FIGURES.items():
        print(f"\nfuzz {kind}: {sum(counts.values())} inputs: {dict(counts.most_common())}")
    if _FIGURES:
        print(f"fuzz time: {time.perf_counter() - start:.1f} s")


def _run_batch(kind: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            "from tests import test_hostile as m; m.child()",
        ],
        input=json.dumps([kind, specs]),
        capture_output=True,
        text=True,
        cwd=_ROOT,
        timeout=300,
        check=False,
    )
    done = proc.stdout.splitlines()
    if proc.returncode != 0 or proc.stderr:
        crashed = specs[len(done)] if len(done) < len(specs) else None
        pytest.fail(f"child died (status {proc.returncode}) on {crashed}:\n{proc.stderr[-3000:]}")
    results = [json.loads(line) for line in done]
    assert len(results) == len(specs)
    for spec, result in zip(specs, results, strict=True):
        assert result["problem"] is None, (result, spec)
        _FIGURES[kind][result["result"]] += 1
    return results


def _mostly(plausible: st.SearchStrategy[Any], odd: st.SearchStrategy[Any], odds: int = 4) -> Any:
    """``plausible`` ``odds`` times in ``odds + 1``, else ``odd`` (``one_of`` would pick each half
    the time, and most inputs would fail the first check they meet)."""
    return st.sampled_from([True] * odds + [False]).flatmap(lambda ok: plausible if ok else odd)


_dims = _mostly(st.integers(0, 4), st.sampled_from([-1, *_HUGE]))
_strides_values = _mostly(st.integers(-6, 6), st.sampled_from(_HUGE))
_known_dtypes = sorted(BY_DLPACK)
_words = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 65535))
_devices = [(1, 0)] * 4 + [(2, 0), (3, 0), (4, 1), (10, 0), (13, 0), (14, 0), (9, 0)]
_int32 = st.integers(-(2**31), 2**31 - 1)


@st.composite
def dlpack_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Every field of a managed tensor: mostly plausible, sometimes absurd."""
    shape = draw(st.lists(_dims, max_size=4))
    rank = len(shape)
    return {
        "shape": shape,
        "strides": draw(st.none() | st.lists(_strides_values, min_size=rank, max_size=rank)),
        "ndim": draw(
            _mostly(st.just(rank), st.integers(0, rank) | st.sampled_from([-1, 65, 2**31 - 1]))
        ),
        "versioned": draw(st.booleans()),
        "dtype": draw(_mostly(st.sampled_from(_known_dtypes), _words)),
        "version": draw(
            _mostly(
                st.sampled_from([(1, 3), (1, 0), (1, 2), (1, 99)]),
                st.sampled_from([(0, 9), (2, 0)])
                | st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
            )
        ),
        "flags": draw(_mostly(st.sampled_from([0, 1, 2, 3, 4, 5]), st.integers(0, 2**64 - 1))),
        "device": draw(_mostly(st.sampled_from(_devices), st.tuples(_int32, _int32), odds=8)),
        "byte_offset": draw(
            _mostly(st.just(0) | st.integers(0, 40), st.sampled_from([2**32, 2**63, 2**64 - 1]))
        ),
        "data": draw(st.sampled_from(["block"] * 8 + ["null", "fence", "huge", "low"])),
        "null_shape": draw(_mostly(st.just(False), st.just(True), odds=8)),
        "adjacent": draw(st.booleans()),
        "at_end": draw(st.booleans()),
        "deleter": draw(_mostly(st.just(True), st.just(False))),
        "name": draw(
            _mostly(
                st.none(),
                st.sampled_from(["used_dltensor", "used_dltensor_versioned", "", "foo"]),
                odds=16,
            )
        ),
    }


@given(st.lists(dlpack_specs(), min_size=BATCH // 2, max_size=BATCH))
@batch_settings
def test_crafted_dlpack_structs(specs: list[dict[str, Any]]) -> None:
    """Crafted managed tensors are imported correctly or refused cleanly, each deleter called
    exactly once."""
    _run_batch("dlpack", specs)


_typestrs = _mostly(
    st.sampled_from(sorted(_TYPESTRS)),
    st.sampled_from(
        [
            ">i4" if sys.byteorder == "little" else "<i4",
            "<f3",
            "|V8",
            "x",
            "",
            "<M8",
            "<U4",
            5,
            None,
        ]
    ),
)


@st.composite
def interface_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A crafted ``__array_interface__`` or ``__cuda_array_interface__`` dict."""
    shape = draw(_mostly(st.lists(_dims, max_size=3), st.sampled_from(["3", None, [2.0]]), odds=8))
    rank = len(shape) if isinstance(shape, list) else 1
    byte_strides = st.lists(
        _mostly(st.integers(-24, 24), st.sampled_from(_HUGE)), min_size=rank, max_size=rank
    )
    return {
        "kind": draw(st.sampled_from(["array", "array", "cuda"])),
        "version": draw(
            _mostly(st.just(3), st.sampled_from([2, 1, 0, 4, None, "3", True, 3.0]), 8)
        ),
        "typestr": draw(_typestrs),
        "descr": draw(
            _mostly(
                st.none(), st.sampled_from([[["", "<f4"]], [["a", "<i4"], ["b", "<i4"]], "bad"])
            )
        ),
        "shape": shape,
        "strides": draw(
            _mostly(
                st.none() | byte_strides, st.lists(st.integers(-8, 8), max_size=4) | st.just("bad")
            )
        ),
        "data": draw(
            _mostly(
                st.sampled_from(["block", "buffer"]),
                st.sampled_from(["fence", "null", "huge", "negative", "garbage", "absent"]),
            )
        ),
        "readonly": draw(st.booleans()),
        "buffer_bytes": draw(st.integers(0, 256)),
        "offset": draw(_mostly(st.integers(0, 64), st.sampled_from([-1, 2**63, "x"]))),
        "mask": draw(_mostly(st.just(False), st.just(True), odds=8)),
        "stream": draw(
            _mostly(st.sampled_from(["absent", None, 1, 2]), st.sampled_from([0, -1, 2**64, "x"]))
        ),
        "at_end": draw(st.booleans()),
    }


@given(st.lists(interface_specs(), min_size=BATCH // 2, max_size=BATCH))
@batch_settings
def test_crafted_array_interfaces(specs: list[dict[str, Any]]) -> None:
    """Crafted interface dicts are imported correctly, bounds-checked against their buffer, or
    refused."""
    _run_batch("interface", specs)


_formats = st.sampled_from(
    [
        "i",
        "<i",
        ">i",
        "=i",
        "@i",
        "Zd",
        "Zf",
        "x",
        "",
        "2i",
        "T{i:a:}",
        "P",
        "?",
        "e",
        "q",
        "B",
        "b",
        "c",
        "s",
        "3s",
        "w",
        "d",
        "f",
        None,
    ]
)


def _natural_itemsize(fmt: str | None) -> int:
    """The itemsize a format string implies (1 where it implies none that struct knows)."""
    complex_sizes = {"Zf": 8, "Zd": 16}
    if fmt in complex_sizes:
        return complex_sizes[fmt]
    try:
        return struct.calcsize(fmt or "B") or 1
    except struct.error:
        return 1


@st.composite
def buffer_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A crafted ``Py_buffer``: odd format, itemsize, ndim, shape and strides; ``len`` true or
    not."""
    fmt = draw(_formats)
    itemsize = draw(
        _mostly(st.just(_natural_itemsize(fmt)), st.sampled_from([1, 2, 3, 4, 5, 8, 16]))
    )
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    strides = draw(
        st.none()
        | st.lists(
            _mostly(st.integers(-3, 3).map(lambda k: k * itemsize), st.integers(-9, 9)),
            min_size=len(shape),
            max_size=len(shape),
        )
    )
    return {
        "format": fmt,
        "itemsize": itemsize,
        "shape": shape,
        "strides": strides,
        "readonly": draw(st.integers(0, 1)),
        "len_error": draw(_mostly(st.just(0), st.integers(-8, 8))),
        "api": draw(st.sampled_from(["frombuffer", "asarray", "asarray"])),
        "count": draw(_mostly(st.just(-1), st.integers(-2, 40), odds=2)),
        "offset": draw(_mostly(st.just(0), st.integers(-2, 40), odds=2)),
        "at_end": draw(st.booleans()),
    }


@given(st.lists(buffer_specs(), min_size=BATCH // 2, max_size=BATCH))
@batch_settings
def test_buffers_that_lie(specs: list[dict[str, Any]]) -> None:
    """Buffers with odd formats, itemsizes, shapes and strides give a correct tensor or a clean
    error."""
    _run_batch("buffer", specs)


def test_buffer_whose_shape_exceeds_its_len() -> None:
    """A buffer claiming a shape larger than its ``len`` is refused, not read past its end."""
    spec = {
        "format": "i",
        "itemsize": 4,
        "shape": [32],
        "strides": None,
        "readonly": 0,
        "len_error": -64,
        "api": "asarray",
        "count": -1,
        "offset": 0,
        "at_end": True,
    }
    _run_batch("buffer", [spec])


@pytest.mark.parametrize(
    ("shape", "strides"),
    [([1], [-6]), ([1, 3], [-6, 4]), ([3, 1], [4, 7]), ([0, 3], [6, 4]), ([2], [6])],
)
def test_buffer_strides_that_address_nothing_need_not_be_whole(
    shape: list[int], strides: list[int]
) -> None:
    """The stride of a size-1 dimension, and every stride of an empty buffer, addresses nothing:
    such a buffer is imported whatever that stride is; a stride that addresses memory must be whole
    elements."""
    spec = {
        "format": "=i",
        "itemsize": 4,
        "shape": shape,
        "strides": strides,
        "readonly": 0,
        "len_error": 0,
        "api": "asarray",
        "count": -1,
        "offset": 0,
        "at_end": True,
    }
    [result] = _run_batch("buffer", [spec])
    assert result["result"] == ("BufferError" if shape == [2] else "ok"), result


@pytest.mark.parametrize(
    ("shape", "strides"), [((0, 3), (-1, 1)), ((1, 4), (-4, 1)), ((3, 1), (1, -7))]
)
@crafted.isolated
def test_empty_device_view_reexports(shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """Device memory whose negative strides sit on dimensions of size 0 or 1 is re-exported as it
    is: such strides address nothing, so no copy (impossible on a device) is needed."""
    t = tb.from_pointer(_fence_page(), shape, tb.float32, strides=strides, device="cuda:0")
    again = tb.from_dlpack(t.__dlpack__(max_version=(1, 3)))
    assert again.shape == t.shape
    assert again.device == t.device
    assert t.numel() == 0 or again.data_ptr() == t.data_ptr()


# --------------------------------------------------------------------------------------------------
# In-process: buffers CPython itself exports with odd metadata (ctypes), and PEP 688 objects


class _Packed(ctypes.Structure):
    _pack_ = 1
    # Python 3.14 deprecates _pack_ without the MSVC layout it implies; before 3.14 ctypes ignores
    # _layout_ (an ordinary class attribute), and _pack_ alone gives this layout.
    _layout_ = "ms"
    _fields_ = (("a", ctypes.c_int8), ("b", ctypes.c_int32))


class _Padded(ctypes.Structure):
    _fields_ = (("a", ctypes.c_int8), ("b", ctypes.c_int64))


def _released() -> memoryview:
    view = memoryview(b"abcd")
    view.release()
    return view


_ODD_EXPORTERS = {  # name -> a callable making the exporter
    "packed struct (itemsize 5, format B)": _Packed,
    "array of packed structs": _Packed * 3,
    "array of c_long": lambda: (ctypes.c_long * 3)(1, 2, 3),
    "2-d ctypes array": (ctypes.c_int16 * 3) * 2,
    "array of pointers": ctypes.c_void_p * 2,
    "c_char array": ctypes.c_char * 5,
    "c_wchar array": ctypes.c_wchar * 3,
    "array of structs with padding": _Padded * 2,
    "memoryview cast to bytes 'c'": lambda: memoryview(bytearray(8)).cast("c"),
    "strided memoryview": lambda: memoryview(bytearray(16))[::3],
    "reversed memoryview": lambda: memoryview(bytearray(16)).cast("i")[::-1],
    "0-d memoryview": lambda: memoryview(bytearray(8)).cast("d", ()),
    "released memoryview": _released,
}


@pytest.mark.parametrize("name", list(_ODD_EXPORTERS))
@pytest.mark.parametrize("api", ["asarray", "frombuffer"])
@crafted.isolated
def test_odd_buffer_exporters(name: str, api: str) -> None:
    """Buffers with surprising metadata from CPython's own exporters import exactly or fail
    cleanly."""
    obj = _ODD_EXPORTERS[name]()
    try:
        t = tb.asarray(obj) if api == "asarray" else tb.frombuffer(obj, dtype=tb.uint8)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return  # tensorbridge's error, or the exporter's own (a released memoryview's)
    view = memoryview(obj)
    if api == "frombuffer":
        assert t.shape == (view.nbytes,)
        assert bytes(t.as_memoryview()) == view.tobytes()
    else:
        assert t.shape == view.shape
        assert t.element_size() == view.itemsize
        assert bytes(t.contiguous().as_memoryview()) == view.tobytes()


@pytest.mark.skipif(
    sys.version_info < (3, 12), reason="__buffer__ (PEP 688) is honoured from Python 3.12"
)
@pytest.mark.parametrize(
    "answer", ["not a memoryview", "released", "odd format", "strided", "raises"]
)
@crafted.isolated
def test_pep688_buffer_that_lies(answer: str) -> None:
    """An object whose ``__buffer__`` answers oddly gives a correct tensor or a clean error."""

    class Odd:
        def __buffer__(self, flags: int) -> Any:
            if answer == "not a memoryview":
                return b"abcd"
            if answer == "released":
                return _released()
            if answer == "odd format":
                return memoryview(bytearray(12)).cast("B").cast("i")
            if answer == "strided":
                return memoryview(bytearray(16))[::2]
            raise ValueError("no buffer today")

    try:
        t = tb.frombuffer(Odd(), dtype=tb.uint8)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return
    assert t.numel() > 0
    assert t.tolist() == [0] * t.numel()


# --------------------------------------------------------------------------------------------------
# In-process: index expressions and as_strided arguments that try to escape the storage

_STORAGE = 60  # int32 elements, values 0..59


def _base() -> tb.Tensor:
    """A 60-element storage holding 0..59, seen through a view of its first 48 elements."""
    return tb.arange(_STORAGE, dtype=tb.int32)[:48]


def _elements(t: tb.Tensor) -> list[int]:
    """The storage offsets of every element of a view."""
    return [
        t.storage_offset() + sum(i * s for i, s in zip(index, t.stride(), strict=True))
        for index in _indices(t.shape)
    ]


def _assert_inside(t: tb.Tensor, source: tb.Tensor, limit: int) -> None:
    """A view's elements lie in storage elements [0, limit) and read as their offsets (the storage
    holds 0..59); a copy (advanced indexing) holds only values from there."""
    if t.numel() > 4096:
        return
    values = t.flatten().tolist()
    if t._storage is source._storage:
        offsets = _elements(t)
        assert all(0 <= o < limit for o in offsets), (t.shape, t.stride(), t.storage_offset())
        assert values == offsets
    else:
        assert all(0 <= v < limit for v in values), values


_index_items = st.one_of(
    st.integers(-70, 70),
    st.sampled_from([2**63, -(2**63), None, Ellipsis, True, False]),
    st.builds(
        slice,
        st.none() | st.integers(-70, 70) | st.sampled_from([2**63, -(2**64)]),
        st.none() | st.integers(-70, 70) | st.sampled_from([2**63, -(2**64)]),
        st.none() | st.integers(-5, 5).filter(bool) | st.sampled_from([2**63, -(2**63)]),
    ),
    st.lists(st.integers(-60, 60), max_size=4),
)


@given(
    shape=st.sampled_from([(48,), (6, 8), (2, 3, 8), (4, 12)]),
    key=st.one_of(_index_items, st.lists(_index_items, max_size=4).map(tuple)),
)
def test_index_expressions_stay_in_storage(shape: tuple[int, ...], key: Any) -> None:
    """Any index expression gives a view inside the storage with the right values, or an
    IndexError-like exception; assignment through it never writes outside it."""
    t = _base().view(shape)
    try:
        view = t[key]
    except (IndexError, TypeError, ValueError):
        return
    _assert_inside(view, t, 48)  # indexing never reaches past the view it starts from
    try:
        t[key] = -1
    except (IndexError, TypeError, ValueError, RuntimeError):
        return
    storage = t.as_strided((_STORAGE,), (1,), 0).tolist()
    assert storage[48:] == list(range(48, _STORAGE))  # past the base view: untouched


_sizes = st.lists(st.one_of(st.integers(-2, 8), st.sampled_from(_HUGE)), max_size=4)


@given(
    size=_sizes,
    stride=_sizes,
    offset=st.one_of(st.none(), st.integers(-3, 70), st.sampled_from(_HUGE)),
    through=st.sampled_from(["base", "view", "negative"]),
)
def test_as_strided_stays_in_storage(
    size: list[int], stride: list[int], offset: int | None, through: str
) -> None:
    """as_strided with any sizes, strides and offset yields a view inside the storage or raises."""
    t = {
        "base": _base(),
        "view": _base()[40:],
        "negative": _base().flip(0) if hasattr(tb.Tensor, "flip") else _base()[::-1],
    }[through]
    try:
        view = t.as_strided(size, stride, offset)
    except (ValueError, TypeError, RuntimeError):
        return
    _assert_inside(view, t, _STORAGE)  # as_strided addresses the whole storage, never beyond


@crafted.isolated
def test_as_strided_reaching_the_last_element() -> None:
    """The layout that ends exactly at the last byte of the storage is accepted; one more is
    refused."""
    t = _base()
    assert t.as_strided((2,), (58,), 1).tolist() == [1, 59]
    with pytest.raises(ValueError, match="out of bounds"):
        t.as_strided((2,), (59,), 1)
    with pytest.raises(ValueError, match="out of bounds"):
        t.as_strided((2,), (-1,), 0)
