"""The sides of an exchange: a library seen as a producer (makes an array of given bytes) and as a
consumer (imports an object through its own entry points), with every method working on the
library's own objects. Here: the base `Side`, the standard library's buffer exporters, ``memoryview``
as a consumer, and tensorbridge itself (the array libraries are in `peers`)."""

from __future__ import annotations

import array
import ctypes
import importlib
import mmap
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

import tensorbridge as tb
from tensorbridge.testing import DTYPES, buffer_address, dtype_from_format, offers_buffer

from .capsules import dlpack_address
from .errors import Unavailable

__all__ = [
    "ALIGN",
    "DLPackSide",
    "Defect",
    "MemoryviewSide",
    "Side",
    "Stdlib",
    "TensorbridgeSide",
    "flip_buffer",
    "format_dtype",
    "handoff",
    "is_buffer",
    "pattern",
    "skip",
    "stdlib_producers",
]

_N: Final = 8  # elements per test tensor
# The doctor allocates producer memory at this alignment (and, for consumers whose outcome depends
# on it, also at an address that is not), so that a run's matrix does not depend on where the
# allocator happened to put a buffer: JAX on CPU shares only 64-byte-aligned memory.
ALIGN: Final = 64


def pattern(dtype: tb.dtype, n: int = _N) -> bytes:
    """Deterministic, valid element bytes: 0/1 for bool, small positive bytes for the rest."""
    if dtype is tb.bool:
        return bytes(i % 2 for i in range(n))
    return bytes((i * 37 + 11) % 120 + 1 for i in range(n * dtype.itemsize))


def flip_buffer(obj: Any) -> bool:
    """Flip bit 0 of byte 0 (element 0's low byte on little-endian hosts); False when read-only."""
    with memoryview(obj) as mv:
        if mv.readonly:
            return False
        with mv.cast("B") as b:
            b[0] ^= 1
    return True


@dataclass
class Defect:
    """A peer's own defect the doctor saw (or, for one that would kill the process, knows of).

    Attributes:
        peer: the peer's key.
        what: what the peer does, in its users' words.
        fix: what to do about it.
        seen: True when measured in this run; False when known but not run (it would crash).
    """

    peer: str
    what: str
    fix: str
    seen: bool = True


class Side:
    """A library's way to make, read, write, locate and import arrays (defaults: buffer objects)."""

    key = "?"
    label = "?"
    # What it consumes: "dlpack", "buffer", "both" (the two), "arrow" (the Arrow C data
    # interface, then the buffer protocol), or "array" (any array-like, through NumPy's
    # ``__array__`` and its dtype protocol: pandas, xarray, dask.array).
    protocol = "buffer"
    has_readonly = True  # False where the library has no read-only arrays at all (PyTorch)
    has_memory = True  # False where each export computes a new array (dask.array)
    # The alignment every allocation of this producer has (0: whatever the allocator gives), and
    # the alignment this consumer needs to share memory instead of copying it (0: none).
    fixed_alignment = 0
    needs_alignment = 0

    def devices(self) -> tuple[str, ...]:
        return ("cpu",)

    def dtypes(self) -> tuple[str, ...]:
        return ()

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        msg = f"{self.label} cannot make {dtype} on {device}"
        raise Unavailable(msg)

    def place(self, dtype: str, raw: bytes, aligned: bool) -> Any:
        """Like `make` on the CPU, with the memory placed 64-byte aligned (or, with ``aligned``
        False, 16 bytes past a 64-byte boundary); None where this side cannot choose."""
        return None

    def release(self, x: Any) -> None:
        """Give back what `make` took (close a map, unlink shared memory)."""

    def read(self, x: Any) -> bytes:
        with memoryview(x) as mv:
            return mv.tobytes()

    def poke(self, x: Any) -> bool:
        return flip_buffer(x)

    def address(self, x: Any) -> int:
        return buffer_address(x)

    def dtype_of(self, x: Any) -> str | None:
        return None

    def readonly(self, x: Any) -> bool | None:
        with memoryview(x) as mv:
            return mv.readonly

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        """The calls this library's users make to import ``obj``, in the order the doctor tries
        them (a later one only after an earlier one refused).

        Raises:
            Unavailable: none of them applies to ``obj``.
        """
        msg = f"{self.label} takes no {type(obj).__name__}"
        raise Unavailable(msg)

    def copy_note(self, address: int) -> str | None:
        """Why this consumer copied memory at ``address``, when the library documents a reason."""
        return None

    def defects(self) -> list[Defect]:
        """The library's own defects, measured here (never one that would crash the process)."""
        return []


class DLPackSide(Side):
    """A library that exchanges through DLPack only. NumPy, where installed, is the measuring
    instrument: ``np.from_dlpack`` reads and writes the library's memory; the address comes from
    the library's own capsule (`dlpack_address`), never from tensorbridge's import."""

    protocol = "dlpack"
    immutable = False  # the library's arrays are never written (the proof is then the address)

    def __init__(self) -> None:
        try:
            self.np: Any = importlib.import_module("numpy")
        except ImportError:
            self.np = None

    def host(self, x: Any) -> Any:
        """A NumPy view of ``x`` (or a copy, for reading only)."""
        if self.np is None:
            msg = f"{self.label}: reading its arrays needs NumPy"
            raise Unavailable(msg)
        return self.np.from_dlpack(x)

    def read(self, x: Any) -> bytes:
        return bytes(self.host(x).tobytes())

    def poke(self, x: Any) -> bool:
        if self.immutable or self.np is None:
            return False
        try:
            view = self.np.from_dlpack(x)
        except Exception:  # a dtype NumPy cannot import: the proof is then the address
            return False
        if not view.flags.writeable or view.size == 0:
            return False
        flat = view.reshape(-1).view(self.np.uint8)
        flat[0] ^= 1
        return True

    def address(self, x: Any) -> int:
        return dlpack_address(x)

    def readonly(self, x: Any) -> bool | None:
        return True if self.immutable else None


class Stdlib(Side):
    """A standard-library buffer exporter: producer only, one dtype."""

    def __init__(
        self,
        key: str,
        dtype: str,
        factory: Callable[[bytes], Any],
        release: Callable[[Any], None] | None = None,
        fixed_alignment: int = 0,
        placer: Callable[[bytes, bool], Any] | None = None,
    ) -> None:
        self.key = self.label = key
        self.dtype = dtype
        self._factory = factory
        self._release = release
        self.fixed_alignment = fixed_alignment
        self._placer = placer

    def dtypes(self) -> tuple[str, ...]:
        return (self.dtype,)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype != self.dtype or device != "cpu":
            return super().make(dtype, raw, device)
        return self._factory(raw)

    def place(self, dtype: str, raw: bytes, aligned: bool) -> Any:
        if self._placer is None or dtype != self.dtype:
            return None
        return self._placer(raw, aligned)

    def release(self, x: Any) -> None:
        if self._release is not None:
            self._release(x)


def _mmap(raw: bytes) -> mmap.mmap:
    m = mmap.mmap(-1, len(raw))
    m.write(raw)
    return m


def skip(address: int, aligned: bool) -> int:
    """Bytes from ``address`` to a 64-byte boundary, or (``aligned`` False) 16 bytes past one."""
    return -address % ALIGN + (0 if aligned else 16)


def _ctypes_array(raw: bytes) -> Any:
    return (ctypes.c_int32 * (len(raw) // 4)).from_buffer_copy(raw)


def _ctypes_placed(raw: bytes, aligned: bool) -> Any:
    # A ctypes array over a larger ctypes block (it keeps the block alive): ctypes' own small
    # allocations come from pools whose blocks never start on a 64-byte boundary.
    block = (ctypes.c_char * (len(raw) + 2 * ALIGN))()
    x = (ctypes.c_int32 * (len(raw) // 4)).from_buffer(
        block, skip(ctypes.addressof(block), aligned)
    )
    ctypes.memmove(x, raw, len(raw))
    return x


def _memoryview_placed(raw: bytes, aligned: bool) -> memoryview:
    block = bytearray(len(raw) + 2 * ALIGN)
    with memoryview(block) as whole:
        start = skip(buffer_address(whole), aligned)
    view = memoryview(block)[start : start + len(raw)]
    view[:] = raw
    return view


def _array(raw: bytes) -> array.array[int]:
    a = array.array("i")
    a.frombytes(raw)
    return a


class _SharedMemoryBuffer:
    """``multiprocessing.shared_memory`` exports through ``.buf``; this keeps the block with it."""

    def __init__(self, raw: bytes) -> None:
        from multiprocessing import shared_memory

        self.shm = shared_memory.SharedMemory(create=True, size=len(raw))
        cast("memoryview", self.shm.buf)[: len(raw)] = raw

    def close(self) -> None:
        self.shm.close()  # BufferError while an export is held: the caller collects and retries
        self.shm.unlink()


def stdlib_producers() -> list[Side]:
    def close(x: Any) -> None:
        x.close()

    def release(x: Any) -> None:
        x.release()

    return [
        Stdlib("bytes", "uint8", bytes),
        Stdlib("bytearray", "uint8", bytearray),
        Stdlib(
            "memoryview",
            "uint8",
            lambda raw: memoryview(bytearray(raw)),
            release,
            placer=_memoryview_placed,
        ),
        Stdlib("array", "int32", _array),
        Stdlib("mmap", "uint8", _mmap, close, mmap.PAGESIZE),
        Stdlib("ctypes", "int32", _ctypes_array, placer=_ctypes_placed),
        _SharedMemorySide(),
    ]


class _SharedMemorySide(Stdlib):
    """``multiprocessing.shared_memory``: the producer is the block's ``.buf``."""

    def __init__(self) -> None:
        super().__init__("shared_memory", "uint8", _SharedMemoryBuffer, None, mmap.PAGESIZE)
        self._blocks: dict[int, _SharedMemoryBuffer] = {}

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        block = super().make(dtype, raw, device)
        self._blocks[id(block.shm.buf)] = block
        return block.shm.buf

    def release(self, x: Any) -> None:
        self._blocks[id(x)].close()  # closes the map and unlinks the name; BufferError if held
        del self._blocks[id(x)]


class MemoryviewSide(Side):
    """The standard library as a consumer: ``memoryview(obj)``."""

    key = label = "memoryview"

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        if not is_buffer(obj):
            msg = (
                f"memoryview: {type(obj).__name__!r} gives memoryview no buffer (it has no "
                f"buffer protocol, or refuses a request for its format)"
            )
            raise Unavailable(msg)
        return [("memoryview", lambda: memoryview(obj))]

    def dtype_of(self, x: Any) -> str | None:
        return format_dtype(x)


class TensorbridgeSide(Side):
    key = label = "tensorbridge"
    protocol = "both"
    fixed_alignment = ALIGN  # tensorbridge allocates 64-byte-aligned memory

    def dtypes(self) -> tuple[str, ...]:
        return tuple(d.name for d in DTYPES)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if device != "cpu":
            return super().make(dtype, raw, device)
        # A clone: memory tensorbridge allocated and owns, holding the bytes of ``raw``.
        return tb.frombuffer(bytearray(raw), dtype=getattr(tb, dtype)).clone()

    def read(self, x: Any) -> bytes:
        with x.contiguous().as_memoryview() as mv:
            return mv.tobytes()

    def poke(self, x: Any) -> bool:
        if x.is_readonly:
            return False
        with x.as_memoryview() as mv:
            return flip_buffer(mv)

    def address(self, x: Any) -> int:
        return int(x.data_ptr())

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype.name)

    def readonly(self, x: Any) -> bool | None:
        return bool(x.is_readonly)

    def consume(self, obj: Any) -> tuple[Any, str]:
        if hasattr(obj, "__dlpack__"):
            return tb.from_dlpack(obj), "tb.from_dlpack"
        return tb.asarray(obj), "tb.asarray"


def handoff(c: Side, t: Any, calls: list[str]) -> Any:
    """What tensorbridge hands a consumer: the tensor, or its memoryview for buffer-only consumers
    on Python < 3.12 (``memoryview(t)`` needs PEP 688's ``__buffer__``)."""
    if c.protocol == "buffer" and sys.version_info < (3, 12):
        calls.append("Tensor.as_memoryview")
        return t.as_memoryview()
    return t


def format_dtype(obj: Any) -> str:
    """The tensorbridge dtype name of a buffer's format (``uint8`` for formats it does not know)."""
    with memoryview(obj) as mv:
        found = dtype_from_format(mv.format)
    return "uint8" if found is None else found.name


def is_buffer(obj: Any) -> bool:
    """Whether ``memoryview(obj)`` gets a buffer (with a format `format_dtype` can read): False for
    an object without the buffer protocol and for an exporter that refuses the request (from Python
    3.12 a bfloat16 tensor's ``__buffer__``), as `offers_buffer` decides for every probe."""
    return offers_buffer(obj)
