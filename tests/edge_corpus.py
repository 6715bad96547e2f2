"""The hostile corpus of the edges where users' data arrives: files, pickles, Dask headers, shared
memory names, producer classes made on the fly, sizes past int64.

Each area draws its inputs from a seeded generator (the same inputs on every run), feeds each to
the public door it targets, and sorts the outcome:

* ``refused``: a clean exception (`CLEAN`) naming the function called;
* ``taken``: a result, which must be right: every tensor inside the memory it came from;
* ``wrong``: another exception, a result outside its memory, or a wrong value;
* ``leaks``: what an input left behind: a bytearray still locked after every tensor died, a
  shared-memory name that existed before and is gone, a producer class still alive.

A crash is the child's death. `tests/test_edge_corpus.py` runs each area in a child interpreter
(``python -m tests.edge_corpus AREA COUNT``), which prints one JSON line of counts; nothing here
imports pytest.
"""

from __future__ import annotations

import array
import contextlib
import gc
import json
import os
import pickle
import random
import struct
import sys
import tempfile
import weakref
from collections.abc import Callable
from multiprocessing import resource_tracker
from typing import Any

import tensorbridge as tb
from tensorbridge import _shared, _tensor
from tensorbridge.safetensors import load as st_load
from tensorbridge.safetensors import save as st_save

CLEAN = (TypeError, ValueError, BufferError, RuntimeError, IndexError, OverflowError, MemoryError)
HUGE = [2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70, -1, -(2**63), -(2**63) - 1]
ODD = [1.5, "x", None, True, [], {}, float("nan")]


class Tally:
    """Counts of one area's outcomes, and the first few inputs that went wrong or leaked."""

    def __init__(self, area: str) -> None:
        self.area = area
        self.tried = self.refused = self.taken = 0
        self.wrong: list[str] = []
        self.leaks: list[str] = []

    def run(
        self,
        label: str,
        attempt: Callable[[], Any],
        check: Callable[[Any], str | None],
        api: str | None = None,
    ) -> Any:
        """Run one input; ``check`` returns what is wrong with a result, or None. A refusal must
        name ``api``, the function the user called, when one is given."""
        self.tried += 1
        try:
            result = attempt()
        except CLEAN as exc:
            if api is not None and f"{api}(" not in str(exc) and not isinstance(exc, MemoryError):
                self.wrong.append(f"{label}: a refusal not naming {api}(): {exc!r}"[:300])
            else:
                self.refused += 1
            return None
        except Exception as exc:
            self.wrong.append(f"{label}: {type(exc).__name__}: {exc}"[:300])
            return None
        problem = check(result)
        if problem is None:
            self.taken += 1
        else:
            self.wrong.append(f"{label}: {problem}"[:300])
        return result

    def leak(self, label: str, what: str) -> None:
        self.leaks.append(f"{label}: {what}"[:300])

    def report(self) -> dict[str, Any]:
        return {
            "area": self.area,
            "tried": self.tried,
            "refused": self.refused,
            "taken": self.taken,
            "wrong": self.wrong[:5],
            "wrong_count": len(self.wrong),
            "leaks": self.leaks[:5],
            "leak_count": len(self.leaks),
        }


def _outsized(t: tb.Tensor) -> str | None:
    """What is wrong with a tensor's sizes or strides past int64, or None."""
    if any(s > 2**63 - 1 for s in t.shape) or any(not -(2**63) <= s < 2**63 for s in t.stride()):
        return f"a tensor of shape {tuple(t.shape)}, strides {t.stride()}: past int64"
    return None


def _inside(tensors: dict[str, tb.Tensor] | list[tb.Tensor], low: int, high: int) -> str | None:
    """None when every tensor's sizes fit int64 and its bytes lie in [low, high)."""
    for t in tensors.values() if isinstance(tensors, dict) else tensors:
        if _outsized(t):
            return _outsized(t)
        if t.numel() == 0:
            continue
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()  # the contiguous extent a loaded tensor has
        if start < low or end > high:
            return f"tensor {t.shape} at [{start:#x}, {end:#x}) outside [{low:#x}, {high:#x})"
    return None


def _span(t: tb.Tensor) -> int:
    """The bytes a tensor's elements reach, first to last (0 without elements)."""
    if t.numel() == 0:
        return 0
    low = high = 0
    for size, stride in zip(t.shape, t.stride()):
        reach = (size - 1) * stride
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return (high - low + 1) * t.element_size()


def _within_12(t: tb.Tensor) -> str | None:
    """A rebuilt tensor sent with 12 bytes: sizes inside int64, elements inside those bytes."""
    if _outsized(t):
        return _outsized(t)
    return None if _span(t) <= 12 else f"a tensor reaching {_span(t)} of 12 bytes"


def _address(buf: bytearray | bytes) -> int:
    return tb.frombuffer(buf, dtype=tb.uint8).data_ptr() if len(buf) else 0


# ------------------------------------------------------------------------------- safetensors
def _safetensors_file(rng: random.Random) -> tuple[dict[str, Any], bytes]:
    """A valid header (as a dict) and the data bytes after it."""
    header: dict[str, Any] = {}
    data = b""
    for i in range(rng.randint(1, 3)):
        shape = [rng.randint(0, 4) for _ in range(rng.randint(0, 3))]
        n = 4
        for s in shape:
            n *= s
        header[f"t{i}"] = {
            "dtype": "F32",
            "shape": shape,
            "data_offsets": [len(data), len(data) + n],
        }
        data += bytes(rng.randrange(256) for _ in range(n))
    return header, data


def _mutate_header(rng: random.Random, header: dict[str, Any], data: bytes) -> str:
    """Change one thing in ``header`` (in place); returns what was changed."""
    name = rng.choice(sorted(header))
    entry = header[name]
    kind = rng.randrange(9)
    if kind == 0 and entry["shape"]:
        entry["shape"][rng.randrange(len(entry["shape"]))] = rng.choice(HUGE + ODD)
    elif kind == 1:
        big = rng.choice(HUGE[:5])  # from 2**63 - 1 (the largest size) to past uint64
        entry["shape"] = [0, big] if rng.random() < 0.5 else [big, 0]
        entry["data_offsets"] = [0, 0]  # consistent: the one tensor, no bytes for no elements
        for other in set(header) - {name}:
            del header[other]
    elif kind == 2:
        entry["data_offsets"][rng.randrange(2)] = rng.choice([*HUGE, len(data) + 1, *ODD])
    elif kind == 3:
        entry["data_offsets"] = list(reversed(entry["data_offsets"]))
    elif kind == 4:
        entry["dtype"] = rng.choice(["F33", "", None, 3, "f32", "BOOL ", "F8_E4M3", "I64", "C64"])
    elif kind == 5:
        header["\ud800" + name] = header.pop(name)  # a lone surrogate in a key
    elif kind == 6:
        header["__metadata__"] = rng.choice([{"a": 1}, [], "x", {"\udc00": "v"}, {"k": None}])
    elif kind == 7:
        entry["shape"] = [1] * rng.choice([65, 100])
    else:
        entry.pop(rng.choice(["dtype", "shape", "data_offsets"]))
    return f"{name}: mutation {kind}"


def _safetensors_bytes(header: dict[str, Any], data: bytes, rng: random.Random) -> bytes:
    text = json.dumps(header, ensure_ascii=True).encode()
    length = len(text)
    cut = rng.random()
    if cut < 0.1:
        length = rng.choice([0, length + 1, length + 1000, 2**63, 2**64 - 1])
    raw = struct.pack("<Q", length) + text + data
    if 0.1 <= cut < 0.2:
        raw = raw[: rng.randrange(len(raw) + 1)]
    return raw


def area_safetensors(count: int, rng: random.Random) -> Tally:
    """Hostile safetensors headers through `tensorbridge.safetensors.load` (bytes and bytearray)."""
    tally = Tally("safetensors headers")
    for i in range(count):
        header, data = _safetensors_file(rng)
        what = _mutate_header(rng, header, data) if rng.random() < 0.9 else "valid"
        if what.endswith("mutation 1"):
            data = b""  # the one tensor left holds no bytes
        raw = _safetensors_bytes(header, data, rng)
        for kind in (bytes, bytearray):
            buf = kind(raw)
            low = _address(buf)
            high = low + len(buf)
            tally.run(
                f"#{i} {kind.__name__} {what}",
                lambda buf=buf: st_load(buf),
                lambda out, low=low, high=high: _inside(out, low, high),
                "load",
            )
            gc.collect()
            if kind is bytearray:
                try:
                    buf.append(0)
                except BufferError:
                    tally.leak(f"#{i} {what}", "the bytearray is still locked")
    return tally


def area_safetensors_buffers(count: int, rng: random.Random) -> Tally:
    """`load` of buffers that are not bytes: typed arrays, casts, 2-d and strided arrays."""
    tally = Tally("safetensors buffers")
    good = st_save({"a": tb.arange(6, dtype=tb.float32)})
    makers: list[Callable[[bytes], Any]] = [
        lambda b: array.array("f", b[: len(b) // 4 * 4]),
        lambda b: memoryview(b[: len(b) // 4 * 4]).cast("i"),
        lambda b: memoryview(bytearray(b or b"x")).cast("B", (len(b or b"x"), 1)),
        lambda b: memoryview(b)[::2],
        lambda b: memoryview(b),
        lambda b: bytearray(b),
        lambda b: array.array("B", b),
    ]
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        makers += [
            lambda b: numpy.frombuffer(b, dtype=numpy.uint8).reshape(-1, 1),
            lambda b: numpy.frombuffer(b, dtype=numpy.uint8)[::-1],
            lambda b: numpy.frombuffer(b, dtype=numpy.uint8),
        ]
    for i in range(count):
        make = makers[i % len(makers)]
        raw = good if rng.random() < 0.7 else good[: rng.randrange(len(good))]
        obj = make(raw)

        def check(out: dict[str, tb.Tensor], raw: bytes = raw) -> str | None:
            expected = st_load(raw)  # a byte buffer that loads: the same tensors, value for value
            if {k: v.tolist() for k, v in out.items()} != {
                k: v.tolist() for k, v in expected.items()
            }:
                return "values differ from the same bytes loaded as bytes"
            return None

        tally.run(f"#{i} {type(obj).__name__}", lambda obj=obj: st_load(obj), check, "load")
    return tally


# ------------------------------------------------------------------------------------- .npy
def _npy_bytes(rng: random.Random) -> tuple[bytes, str]:
    shape = tuple(rng.randint(0, 3) for _ in range(rng.randint(0, 3)))
    descr, fortran = "<f4", False
    what = "valid"
    kind = rng.randrange(7)
    if kind == 0 and shape:
        shape = (*shape[:-1], rng.choice(HUGE))
        what = "huge size"
    elif kind == 1:
        shape = (0, rng.choice(HUGE))
        what = "huge size beside 0"
    elif kind == 2:
        descr = rng.choice(["|O", "<U3", "V8", "<M8[s]", ">f4", "<f16", "x", "[('a', '<i4')]"])
        what = f"descr {descr}"
    elif kind == 3:
        fortran = rng.choice([1, "yes", None])  # type: ignore[assignment]
        what = "fortran_order"
    elif kind == 4:
        shape = tuple(rng.choice(ODD) for _ in range(2))  # type: ignore[assignment]
        what = "odd sizes"
    n = 4
    for s in shape:
        n *= s if isinstance(s, int) and 0 <= s < 64 else 0
    header = f"{{'descr': {descr!r}, 'fortran_order': {fortran!r}, 'shape': {shape!r}, }}"
    if descr.startswith("["):
        header = header.replace(repr(descr), descr)
    body = header.encode("latin-1") + b" " * (63 - (len(header) + 10) % 64) + b"\n"
    raw = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body + bytes(n)
    if kind == 5:
        raw = raw[: rng.randrange(len(raw) + 1)]
        what = "truncated"
    elif kind == 6:
        raw = raw[:8] + struct.pack("<H", rng.choice([0, 1, 65535])) + raw[10:]
        what = "header length"
    return raw, what


def area_npy(count: int, rng: random.Random) -> Tally:
    """Hostile `.npy` files through `load_npy`, mapped and read into private memory."""
    tally = Tally(".npy headers")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.npy")
        for i in range(count):
            raw, what = _npy_bytes(rng)
            with open(path, "wb") as f:
                f.write(raw)
            for mode in ("r", None):

                def check(t: tb.Tensor, size: int = len(raw)) -> str | None:
                    if _outsized(t):
                        return _outsized(t)
                    if t.numel() * t.element_size() > size:
                        return f"a tensor of {t.numel()} elements from {size} bytes"
                    t.tolist()  # every element readable
                    return None

                tally.run(
                    f"#{i} mode={mode} {what}",
                    lambda mode=mode: tb.load_npy(path, mode=mode),
                    check,
                    "load_npy",
                )
                gc.collect()
    return tally


# ---------------------------------------------------------------------------------- pickles
class _Crafted:
    """Pickles as a call of ``fn(*args)``: what a crafted pickle of a tensor can say."""

    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


def _layout_args(rng: random.Random) -> list[Any]:
    """A valid layout of 12 float32 bytes' worth, then one field made hostile."""
    args: list[Any] = ["float32", (3,), (1,), 0, False, False]
    if rng.random() < 0.25:
        return args
    field = rng.randrange(6)
    pool = {
        0: ["float33", "", None, 3, "bfloat16", "complex32"],
        1: [(rng.choice(HUGE),), (0, rng.choice(HUGE)), (-1,), (1.5,), "3", (3, 4), ((3,),)],
        2: [(rng.choice(HUGE),), (1, 1), (), ("1",), (0,), (-1,)],
        3: [*HUGE, 1.5, "0", None, 3],
        4: [2, "yes", None, 0.0],
        5: [2, "no", None],
    }
    args[field] = rng.choice(pool[field])
    if field == 1 and isinstance(args[1], tuple):
        args[2] = (1,) * len(args[1])  # one stride per size: only the sizes are hostile
    return args


def area_pickles(count: int, rng: random.Random) -> Tally:
    """Crafted pickles naming tensorbridge's rebuild functions with hostile arguments."""
    tally = Tally("pickles")
    for i in range(count):
        args = _layout_args(rng)
        data = bytearray(12)
        fn = rng.choice([_tensor._rebuild_tensor, _tensor._rebuild_from_buffer])
        pickled = pickle.dumps(_Crafted(fn, (data, *args)), protocol=5)
        tally.run(
            f"#{i} {fn.__name__}{tuple(args)!r}",
            lambda pickled=pickled: pickle.loads(pickled),
            _within_12,
            "pickle.loads",
        )
    return tally


def area_dask(count: int, rng: random.Random) -> Tally:
    """Hostile Dask headers through `tensorbridge._dask.deserialize` (what ``distributed`` calls)."""
    from tensorbridge import _dask

    tally = Tally("Dask headers")
    for i in range(count):
        dtype, shape, strides, offset, readonly, requires_grad = _layout_args(rng)
        header = {
            "dtype": dtype,
            "shape": list(shape) if isinstance(shape, tuple) else shape,
            "strides": list(strides) if isinstance(strides, tuple) else strides,
            "offset": offset,
            "readonly": readonly,
            "requires_grad": requires_grad,
        }
        frame = bytearray(12)
        tally.run(
            f"#{i} {header!r}",
            lambda h=header, f=frame: _dask.deserialize(h, [f]),
            _within_12,
        )
    return tally


# --------------------------------------------------------------------------- shared memory
def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def area_shared_names(count: int, rng: random.Random) -> Tally:
    """Pickles naming shared-memory segments that are not theirs to take over."""
    tally = Tally("shared-memory names")
    owner = tb.arange(4, dtype=tb.float32).share_memory_()
    first = _shared.process_args(owner)
    if first is None:  # no shared-memory names here (not Linux)
        return tally
    stranger = f"tb_corpus_{os.getpid()}"
    with open(f"/dev/shm/{stranger}", "wb") as f:
        f.write(bytes(64))
    try:
        link = first[0]
        base = link.split(".")[0]
        names = [
            base,
            base + "\x00x",
            link + "\x00x",
            stranger,
            f"/{stranger}",
            "../" + stranger,
            base + ".",
            base + "." + "0" * 32,
            "",
            "x" * 300,
            "/dev/shm/" + base,
        ]
        for i in range(count):
            name = rng.choice(names)
            nbytes = rng.choice([16, 16, -1, 1.5, "x", None, 2**64, 0])
            if rng.random() < 0.2:  # a real per-pickle link, as multiprocessing sends one
                fresh = _shared.process_args(owner)
                assert fresh is not None
                name, nbytes = fresh[0], rng.choice([fresh[1], fresh[1], -1, "x"])
            args = (name, nbytes, "float32", (4,), (1,), 0, False, False)
            before = _shm_names()
            pickled = pickle.dumps(_Crafted(_tensor._rebuild_shared, args))
            tally.run(
                f"#{i} {name!r} nbytes={nbytes!r}",
                lambda p=pickled: pickle.loads(p),
                lambda t: None if t.tolist() == [0.0, 1.0, 2.0, 3.0] else f"values {t.tolist()}",
                "pickle.loads",
            )
            gc.collect()
            gone = {n for n in before - _shm_names() if n in (base, stranger)}  # not ours to unlink
            if gone:
                tally.leak(f"#{i} {name!r}", f"unlinked {sorted(gone)}")
            if name in _shm_names() and name.startswith(base + "."):
                # a refused genuine link stays, as the rule says; the corpus, which made it,
                # unlinks it (and tells the tracker) so that nothing is left for exit
                os.unlink(f"/dev/shm/{name}")
                resource_tracker.unregister("/" + name, "shared_memory")
        try:
            again = _shared.process_args(owner)  # the owner can still send its tensor
        except OSError as exc:
            tally.leak("owner", f"can no longer send its tensor: {exc}")
        else:
            if again is not None:
                pickle.loads(pickle.dumps(_Crafted(_tensor._rebuild_shared, again)))
    finally:
        with contextlib.suppress(FileNotFoundError):  # a defect unlinks it: counted as a leak
            os.unlink(f"/dev/shm/{stranger}")
        for name in _shm_names():  # the links the corpus made and nobody took over (`first`)
            if name.startswith(base + ".") and name not in _shared._OWNED:
                os.unlink(f"/dev/shm/{name}")
                resource_tracker.unregister("/" + name, "shared_memory")
    return tally


# ----------------------------------------------------------------------- producer classes
def area_producer_classes(count: int, rng: random.Random) -> Tally:
    """Producer classes made on the fly: none may stay alive through tensorbridge's tables."""
    tally = Tally("producer classes")
    doors: list[Callable[[Any], tb.Tensor]] = [
        tb.from_dlpack,
        tb.asarray,
        tb.utils.dlpack.from_dlpack,
    ]
    for i in range(count):
        buf = bytearray(rng.randint(1, 16))
        t = tb.frombuffer(buf, dtype=tb.uint8)
        spec: dict[str, Any] = {
            "__dlpack__": lambda self, t=t, **kw: t.__dlpack__(**kw),
            "__dlpack_device__": lambda self, t=t: t.__dlpack_device__(),
        }
        if rng.random() < 0.5:
            spec["__array_interface__"] = property(lambda self, t=t: t.__array_interface__)
        cls = type(f"Made{i}", (), spec)
        door = rng.choice(doors)
        low = _address(buf)
        high = low + len(buf)
        tally.run(
            f"#{i} {door.__name__}",
            lambda d=door, c=cls: d(c()),
            lambda out, low=low, high=high: _inside([out], low, high),
        )
        alive = weakref.ref(cls)
        del cls, t, spec
        gc.collect()
        if alive() is not None:
            tally.leak(f"#{i}", "the class is still alive")
        try:
            buf.append(0)
        except BufferError:
            tally.leak(f"#{i}", "the bytearray is still locked")
    return tally


# --------------------------------------------------------------------------- sizes
def area_sizes(count: int, rng: random.Random) -> Tally:
    """Sizes, strides and offsets past int64 through constructors, views and array interfaces."""
    tally = Tally("sizes past int64")
    base = tb.zeros(4)

    def shape() -> tuple[int, ...]:
        return tuple(rng.choice([0, 1, 2, *HUGE[:6], 2**62]) for _ in range(rng.randint(1, 3)))

    calls: list[Callable[[], Any]] = [
        lambda: tb.zeros(shape()),
        lambda: tb.empty(*shape()),
        lambda: tb.full(shape(), 1.0),
        lambda: base.as_strided(shape(), (0,) * 1, 0),
        lambda: base[:1].as_strided((1,), (rng.choice(HUGE),)),
        lambda: base.as_strided((0,), (1,), rng.choice(HUGE)),
        lambda: base[:1].expand(rng.choice(HUGE)),
        lambda: base[:1].view(1, 1).expand(*shape()[:2]),
        lambda: base.view(rng.choice(HUGE)),
        lambda: base.reshape(-1, rng.choice(HUGE)),
        lambda: tb.asarray(_Interface(shape())),
    ]
    for i in range(count):
        call = calls[i % len(calls)]

        def check(t: tb.Tensor) -> str | None:
            if any(s > 2**63 - 1 for s in t.shape) or any(abs(s) > 2**63 for s in t.stride()):
                return f"a tensor of shape {tuple(t.shape)} strides {t.stride()}"
            if _span(t) > 16 and t.data_ptr() == base.data_ptr():
                return f"a view of 16 bytes reaching {_span(t)}"
            return None

        tally.run(f"#{i} call {i % len(calls)}", call, check)
    return tally


class _Interface:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.__array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (0, False),
            "version": 3,
        }


AREAS: dict[str, Callable[[int, random.Random], Tally]] = {
    "safetensors": area_safetensors,
    "safetensors_buffers": area_safetensors_buffers,
    "npy": area_npy,
    "pickles": area_pickles,
    "dask": area_dask,
    "shared_names": area_shared_names,
    "producer_classes": area_producer_classes,
    "sizes": area_sizes,
}


def main(argv: list[str]) -> None:
    area, count = argv[0], int(argv[1])
    seed = int(argv[2]) if len(argv) > 2 else 37
    tally = AREAS[area](count, random.Random(f"{area}-{seed}"))
    print(json.dumps(tally.report()))


if __name__ == "__main__":
    main(sys.argv[1:])
