"""``python -m tensorbridge doctor``: what this interpreter can exchange, and the proof of it.

The doctor finds the array libraries installed here (from their distribution metadata, importing
none until it needs it), then proves every exchange cell by running it:

* **exchange matrix** -- every producer (the standard library's buffer exporters, each array
  library, tensorbridge) against every consumer, once *through tensorbridge* (producer ->
  tensorbridge -> consumer) and once *directly* where the two sides share a protocol. A cell is
  ``shared`` when a write through the producer is seen through the consumer (or, when neither side
  may be written, when both report the same address), ``copied`` when the values arrive but the
  memory is not shared, ``refused`` when a side raises (the reason is kept), and ``broken`` when
  tensorbridge breaks a guarantee.
* **dtype coverage** -- for each producer/consumer pair through tensorbridge, every dtype.
* **safety checks** -- read-only propagation, capsule reuse, deleters called exactly once (counted
  on capsules crafted with ctypes), buffer exports held while a view lives, overflow-checked sizes.

The exit status is 1 only when tensorbridge breaks one of its own guarantees; a peer's limitation
is reported, never failed. ``--json`` prints one object with the keys ``doctor`` (format version),
``tensorbridge``, ``python``, ``implementation``, ``platform``, ``machine``, ``libraries``
(`Library`), ``devices``, ``matrix`` and ``dtypes`` (`Cell`), ``checks`` (`Check`), ``broken`` (one
line per broken guarantee), ``ok`` and ``elapsed_s`` (see `Report.to_json`).
"""

from __future__ import annotations

import array
import ctypes
import gc
import importlib
import importlib.metadata
import importlib.util
import mmap
import os
import platform
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TextIO, cast

import tensorbridge as tb

from . import _capi, _dlpack_abi
from ._dtype import ALL_DTYPES, from_format
from ._tensor import _from_bytes

__all__ = ["PEERS", "Options", "Report", "find_libraries", "run"]

WIDTH: Final = 100  # the output fits a 100-column terminal
_N: Final = 8  # elements per test tensor
# The doctor allocates producer memory at this alignment (and, for consumers whose outcome depends
# on it, also at an address that is not), so that a run's matrix does not depend on where the
# allocator happened to put a buffer: JAX on CPU shares only 64-byte-aligned memory.
_ALIGN: Final = 64
_TRIES: Final = 64  # allocations tried for a wanted alignment before giving up
_PACKAGE_DIR: Final = str(Path(__file__).resolve().parent)
_OWN_FILES: Final = frozenset({str(Path(__file__).resolve()), str(Path(_PACKAGE_DIR, "_cli.py"))})

SHARED, COPIED, REFUSED, BROKEN, NONE = "shared", "copied", "refused", "broken", "n/a"


# --------------------------------------------------------------------------------------------------
# Environment: which array libraries are installed, found from metadata without importing them.


@dataclass(frozen=True)
class _Spec:
    key: str
    name: str
    module: str
    dists: tuple[str, ...]


_SPECS: Final = (
    _Spec("numpy", "NumPy", "numpy", ("numpy",)),
    _Spec("torch", "PyTorch", "torch", ("torch",)),
    _Spec("jax", "JAX", "jax", ("jax",)),
    _Spec(
        "cupy",
        "CuPy",
        "cupy",
        ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy-rocm-6-0"),
    ),
    _Spec("tensorflow", "TensorFlow", "tensorflow", ("tensorflow", "tensorflow-cpu", "tf-nightly")),
    _Spec("pyarrow", "pyarrow", "pyarrow", ("pyarrow",)),
    _Spec("array_api_strict", "array-api-strict", "array_api_strict", ("array-api-strict",)),
    _Spec("mlx", "MLX", "mlx", ("mlx",)),
    _Spec("paddle", "Paddle", "paddle", ("paddlepaddle", "paddlepaddle-gpu")),
    _Spec("numba", "Numba", "numba", ("numba",)),
    _Spec("ml_dtypes", "ml_dtypes", "ml_dtypes", ("ml_dtypes",)),
    _Spec("tvm_ffi", "TVM FFI", "tvm_ffi", ("apache-tvm-ffi",)),
    _Spec("pydlpack", "pydlpack", "dlpack", ("pydlpack",)),
    _Spec("ctypes_dlpack", "ctypes-dlpack", "ctypes_dlpack", ("ctypes-dlpack",)),
)


@dataclass
class Library:
    """One array library as the doctor found it.

    Attributes:
        key: short name used by ``--peers`` (``"torch"``).
        name: display name (``"PyTorch"``).
        module: import name.
        distribution: the installed distribution, or None.
        version: its version from the metadata, or None when not installed.
        status: ``"not installed"``, ``"installed"`` (found, not used), ``"used"``, or
            ``"import failed"``.
        devices: devices seen after importing it (only for the libraries used).
        error: why the import failed, or why it is not used.
    """

    key: str
    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    status: str = "not installed"
    devices: list[str] = field(default_factory=list)
    error: str | None = None


def _version(spec: _Spec) -> tuple[str | None, str | None]:
    for dist in spec.dists:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:  # installed without metadata (a source tree on sys.path) or under another name
        found = importlib.util.find_spec(spec.module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return None, None
    dists = importlib.metadata.packages_distributions().get(spec.module, [])
    for dist in dists:
        return dist, importlib.metadata.version(dist)
    return None, "unknown"


def find_libraries() -> list[Library]:
    """Every library the doctor knows, with its installed version; imports nothing."""
    found = []
    for spec in _SPECS:
        dist, version = _version(spec)
        lib = Library(spec.key, spec.name, spec.module, dist, version)
        if version is not None:
            lib.status = "installed"
        found.append(lib)
    return found


# --------------------------------------------------------------------------------------------------
# Sides: one library seen as a producer (makes an array of given bytes) and as a consumer (imports
# an object through its own entry point). Every method works on the library's own objects.


class _Unavailable(Exception):
    """This side cannot make this dtype/device, or the two sides share no protocol."""


def _pattern(dtype: tb.dtype, n: int = _N) -> bytes:
    """Deterministic, valid element bytes: 0/1 for bool, small positive bytes for the rest."""
    if dtype is tb.bool:
        return bytes(i % 2 for i in range(n))
    return bytes((i * 37 + 11) % 120 + 1 for i in range(n * dtype.itemsize))


def _buffer_address(obj: Any) -> int:
    view = _capi.Py_buffer()
    _capi.PyObject_GetBuffer(obj, ctypes.byref(view), _capi.PY_BUF_FULL_RO)
    try:
        return view.buf or 0
    finally:
        _capi.PyBuffer_Release(ctypes.byref(view))


def _flip_buffer(obj: Any) -> bool:
    """Flip bit 0 of byte 0 (element 0's low byte on little-endian hosts); False when read-only."""
    with memoryview(obj) as mv:
        if mv.readonly:
            return False
        with mv.cast("B") as b:
            b[0] ^= 1
    return True


class Side:
    """A library's way to make, read, write, locate and import arrays (defaults: buffer objects)."""

    key = "?"
    label = "?"
    protocol = "buffer"  # what it consumes: "dlpack", "buffer" or "both"
    has_readonly = True  # False where the library has no read-only arrays at all (PyTorch)
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
        raise _Unavailable(msg)

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
        return _flip_buffer(x)

    def address(self, x: Any) -> int:
        return _buffer_address(x)

    def dtype_of(self, x: Any) -> str | None:
        return None

    def readonly(self, x: Any) -> bool | None:
        with memoryview(x) as mv:
            return mv.readonly

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        """The calls this library's users make to import ``obj``, in the order the doctor tries
        them (a later one only after an earlier one refused).

        Raises:
            _Unavailable: none of them applies to ``obj``.
        """
        msg = f"{self.label} takes no {type(obj).__name__}"
        raise _Unavailable(msg)

    def copy_note(self, address: int) -> str | None:
        """Why this consumer copied memory at ``address``, when the library documents a reason."""
        return None


class _Stdlib(Side):
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


def _skip(address: int, aligned: bool) -> int:
    """Bytes from ``address`` to a 64-byte boundary, or (``aligned`` False) 16 bytes past one."""
    return -address % _ALIGN + (0 if aligned else 16)


def _ctypes_array(raw: bytes) -> Any:
    return (ctypes.c_int32 * (len(raw) // 4)).from_buffer_copy(raw)


def _ctypes_placed(raw: bytes, aligned: bool) -> Any:
    # A ctypes array over a larger ctypes block (it keeps the block alive): ctypes' own small
    # allocations come from pools whose blocks never start on a 64-byte boundary.
    block = (ctypes.c_char * (len(raw) + 2 * _ALIGN))()
    x = (ctypes.c_int32 * (len(raw) // 4)).from_buffer(
        block, _skip(ctypes.addressof(block), aligned)
    )
    ctypes.memmove(x, raw, len(raw))
    return x


def _memoryview_placed(raw: bytes, aligned: bool) -> memoryview:
    block = bytearray(len(raw) + 2 * _ALIGN)
    with memoryview(block) as whole:
        start = _skip(_buffer_address(whole), aligned)
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


def _stdlib_producers() -> list[Side]:
    def close(x: Any) -> None:
        x.close()

    def release(x: Any) -> None:
        x.release()

    return [
        _Stdlib("bytes", "uint8", bytes),
        _Stdlib("bytearray", "uint8", bytearray),
        _Stdlib(
            "memoryview",
            "uint8",
            lambda raw: memoryview(bytearray(raw)),
            release,
            placer=_memoryview_placed,
        ),
        _Stdlib("array", "int32", _array),
        _Stdlib("mmap", "uint8", _mmap, close, mmap.PAGESIZE),
        _Stdlib("ctypes", "int32", _ctypes_array, placer=_ctypes_placed),
        _SharedMemorySide(),
    ]


class _SharedMemorySide(_Stdlib):
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


class _MemoryviewSide(Side):
    """The standard library as a consumer: ``memoryview(obj)``."""

    key = label = "memoryview"

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        if not _is_buffer(obj):
            msg = f"memoryview: a bytes-like object is required, not {type(obj).__name__!r}"
            raise _Unavailable(msg)
        return [("memoryview", lambda: memoryview(obj))]

    def dtype_of(self, x: Any) -> str | None:
        return _format_dtype(x)


class _TensorbridgeSide(Side):
    key = label = "tensorbridge"
    protocol = "both"
    fixed_alignment = _ALIGN  # tensorbridge allocates 64-byte-aligned memory

    def dtypes(self) -> tuple[str, ...]:
        return tuple(d.name for d in ALL_DTYPES)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if device != "cpu":
            return super().make(dtype, raw, device)
        dt = getattr(tb, dtype)
        return _from_bytes(bytes(raw), (len(raw) // dt.itemsize,), dt)

    def read(self, x: Any) -> bytes:
        return bytes(x._bytes("doctor"))

    def poke(self, x: Any) -> bool:
        if x.is_readonly:
            return False
        x._storage.host_view("doctor")[x._offset * x.itemsize] ^= 1
        return True

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


class _NumpySide(Side):
    key, label, protocol = "numpy", "numpy", "both"

    def __init__(self) -> None:
        np = importlib.import_module("numpy")
        self.np = np
        self._dtypes: dict[str, Any] = {}
        for d in ALL_DTYPES:
            try:
                self._dtypes[d.name] = np.dtype(d.name)
            except TypeError:
                continue
        try:  # ml_dtypes registers bfloat16 and the float8 family with NumPy
            ml_dtypes = importlib.import_module("ml_dtypes")
        except ImportError:
            return
        for d in ALL_DTYPES:
            if d.name not in self._dtypes and hasattr(ml_dtypes, d.name):
                self._dtypes[d.name] = np.dtype(getattr(ml_dtypes, d.name))

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype not in self._dtypes or device != "cpu":
            return super().make(dtype, raw, device)
        return self.np.frombuffer(raw, dtype=self._dtypes[dtype]).copy()

    def place(self, dtype: str, raw: bytes, aligned: bool) -> Any:
        if dtype not in self._dtypes:
            return None
        np = self.np
        block = np.zeros(len(raw) + 2 * _ALIGN, dtype=np.uint8)
        start = _skip(int(block.ctypes.data), aligned)
        block[start : start + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        return block[start : start + len(raw)].view(self._dtypes[dtype])

    def read(self, x: Any) -> bytes:
        return bytes(x.tobytes())

    def poke(self, x: Any) -> bool:
        if not x.flags.writeable:
            return False
        b = x.reshape(-1).view(self.np.uint8)
        b[0] ^= 1
        return True

    def address(self, x: Any) -> int:
        return int(x.__array_interface__["data"][0])

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype.name)

    def readonly(self, x: Any) -> bool | None:
        return not x.flags.writeable

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        np = self.np
        found: list[tuple[str, Callable[[], Any]]] = []
        if hasattr(obj, "__dlpack__"):
            found.append(("np.from_dlpack", lambda: np.from_dlpack(obj)))
        if _is_buffer(obj):
            found.append(
                (
                    "np.frombuffer",
                    lambda: np.frombuffer(obj, dtype=self._dtypes[_format_dtype(obj)]),
                )
            )
        found.append(("np.asarray", lambda: self._asarray(obj)))
        return found

    def _asarray(self, obj: Any) -> Any:
        y = self.np.asarray(obj)
        if y.dtype == object:  # NumPy wraps what it cannot read in an object array
            msg = f"np.asarray made an object array of {type(obj).__name__}"
            raise _Unavailable(msg)
        return y


class _TorchSide(Side):
    key, label, protocol, has_readonly = "torch", "torch", "both", False

    def __init__(self) -> None:
        torch = importlib.import_module("torch")
        self.torch = torch
        self._dtypes = {
            d.name: getattr(torch, d.name)
            for d in ALL_DTYPES
            if isinstance(getattr(torch, d.name, None), torch.dtype)
        }

    def devices(self) -> tuple[str, ...]:
        found = ["cpu"]
        if self.torch.cuda.is_available():
            found += [f"cuda:{i}" for i in range(self.torch.cuda.device_count())]
        return tuple(found)

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype not in self._dtypes:
            return super().make(dtype, raw, device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex32 is "experimental"
            x = self.torch.frombuffer(bytearray(raw), dtype=self._dtypes[dtype]).clone()
        return x if device == "cpu" else x.to(device)

    def read(self, x: Any) -> bytes:
        return bytes(x.detach().cpu().contiguous().view(self.torch.uint8).reshape(-1).tolist())

    def poke(self, x: Any) -> bool:
        b = x.detach().view(self.torch.uint8).reshape(-1)
        b[0] = int(b[0]) ^ 1
        return True

    def address(self, x: Any) -> int:
        return int(x.data_ptr())

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype).removeprefix("torch.")

    def readonly(self, x: Any) -> bool | None:
        return None

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        torch = self.torch
        if hasattr(obj, "__dlpack__"):
            return [("torch.from_dlpack", lambda: torch.from_dlpack(obj))]
        if not _is_buffer(obj):
            msg = f"torch takes no {type(obj).__name__}"
            raise _Unavailable(msg)
        dtype = self._dtypes[_format_dtype(obj)]
        return [("torch.frombuffer", lambda: torch.frombuffer(obj, dtype=dtype))]


class _JaxSide(Side):
    key, label, protocol = "jax", "jax", "dlpack"
    needs_alignment = 64  # XLA on CPU copies memory that is not 64-byte aligned

    def __init__(self) -> None:
        self.jax = importlib.import_module("jax")
        self.jnp = importlib.import_module("jax.numpy")
        self.np = importlib.import_module("numpy")
        self._numpy = _NumpySide()

    def devices(self) -> tuple[str, ...]:
        names = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "rocm": "rocm"}
        return tuple(
            "cpu" if d.platform == "cpu" else f"{names.get(d.platform, d.platform)}:{d.id}"
            for d in self.jax.devices()
        )

    def dtypes(self) -> tuple[str, ...]:
        return self._numpy.dtypes()

    def _device(self, device: str) -> Any:
        platform_ = "gpu" if device.startswith("cuda") else device.split(":", maxsplit=1)[0]
        try:
            return self.jax.devices(platform_)[0]
        except RuntimeError as exc:
            raise _Unavailable(str(exc)) from None

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        host = self._numpy.make(dtype, raw, "cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = self.jax.device_put(host, self._device(device))
        if x.dtype != host.dtype:
            msg = f"jax made {x.dtype} for {dtype} (64-bit types need jax_enable_x64)"
            raise _Unavailable(msg)
        return x

    def read(self, x: Any) -> bytes:
        return bytes(self.np.asarray(x).tobytes())

    def poke(self, x: Any) -> bool:
        return False  # jax arrays are immutable

    def address(self, x: Any) -> int:
        return int(x.unsafe_buffer_pointer())

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype.name)

    def readonly(self, x: Any) -> bool | None:
        return True

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        if not hasattr(obj, "__dlpack__"):
            msg = "jax imports DLPack producers only"
            raise _Unavailable(msg)
        return [("jnp.from_dlpack", lambda: self.jnp.from_dlpack(obj))]

    def copy_note(self, address: int) -> str | None:
        if address % self.needs_alignment:
            return f"jax copies memory that is not {self.needs_alignment}-byte aligned"
        return None


class _PyArrowSide(Side):
    key, label, protocol = "pyarrow", "pyarrow", "buffer"
    _TYPES: Final = {
        "int8": "int8",
        "int16": "int16",
        "int32": "int32",
        "int64": "int64",
        "uint8": "uint8",
        "uint16": "uint16",
        "uint32": "uint32",
        "uint64": "uint64",
        "float16": "halffloat",
        "float32": "float",
        "float64": "double",
    }

    def __init__(self) -> None:
        self.pa = importlib.import_module("pyarrow")
        self._names = {v: k for k, v in self._TYPES.items()}

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._TYPES)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype not in self._TYPES or device != "cpu":
            return super().make(dtype, raw, device)
        typ = getattr(
            self.pa,
            {"halffloat": "float16", "float": "float32", "double": "float64"}.get(
                self._TYPES[dtype], self._TYPES[dtype]
            ),
        )()
        n = len(raw) // getattr(tb, dtype).itemsize
        return self.pa.Array.from_buffers(typ, n, [None, self.pa.py_buffer(bytes(raw))])

    def _span(self, x: Any) -> tuple[Any, int, int]:
        if isinstance(x, self.pa.Buffer):
            return x, 0, x.size
        width = x.type.bit_width // 8
        return x.buffers()[1], x.offset * width, len(x) * width

    def read(self, x: Any) -> bytes:
        buf, start, size = self._span(x)
        return bytes(buf.to_pybytes()[start : start + size])

    def poke(self, x: Any) -> bool:
        return False  # Arrow arrays are immutable

    def address(self, x: Any) -> int:
        buf, start, _ = self._span(x)
        return int(buf.address) + start

    def dtype_of(self, x: Any) -> str | None:
        return None if isinstance(x, self.pa.Buffer) else self._names.get(str(x.type))

    def readonly(self, x: Any) -> bool | None:
        return not x.is_mutable if isinstance(x, self.pa.Buffer) else True

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        if hasattr(obj, "__dlpack__") and not _is_buffer(obj):
            msg = "pyarrow imports buffers, not DLPack"
            raise _Unavailable(msg)
        return [("pa.py_buffer", lambda: self.pa.py_buffer(obj))]


class _CupySide(Side):
    key, label, protocol = "cupy", "cupy", "dlpack"

    def __init__(self) -> None:
        self.cupy = importlib.import_module("cupy")
        self._numpy = _NumpySide()

    def devices(self) -> tuple[str, ...]:
        try:
            count = self.cupy.cuda.runtime.getDeviceCount()
        except Exception:
            count = 0
        return tuple(f"cuda:{i}" for i in range(count))

    def dtypes(self) -> tuple[str, ...]:
        return self._numpy.dtypes()

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if not device.startswith("cuda"):
            return super().make(dtype, raw, device)
        with self.cupy.cuda.Device(int(device.partition(":")[2] or 0)):
            return self.cupy.asarray(self._numpy.make(dtype, raw, "cpu"))

    def read(self, x: Any) -> bytes:
        return bytes(self.cupy.asnumpy(x).tobytes())

    def poke(self, x: Any) -> bool:
        b = x.reshape(-1).view(self.cupy.uint8)
        b[0] ^= 1
        return True

    def address(self, x: Any) -> int:
        return int(x.data.ptr)

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype.name)

    def readonly(self, x: Any) -> bool | None:
        return None

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        if not hasattr(obj, "__dlpack__"):
            msg = "cupy imports DLPack producers only"
            raise _Unavailable(msg)
        return [("cupy.from_dlpack", lambda: self.cupy.from_dlpack(obj))]


def _handoff(c: Side, t: Any, calls: list[str]) -> Any:
    """What tensorbridge hands a consumer: the tensor, or its memoryview for buffer-only consumers
    on Python < 3.12 (``memoryview(t)`` needs PEP 688's ``__buffer__``)."""
    if c.protocol == "buffer" and sys.version_info < (3, 12):
        calls.append("Tensor.as_memoryview")
        return t.as_memoryview()
    return t


def _format_dtype(obj: Any) -> str:
    """The tensorbridge dtype name of a buffer's format (``uint8`` for formats it does not know)."""
    with memoryview(obj) as mv:
        found = from_format(mv.format)
    return "uint8" if found is None else found.name


def _is_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    return True


# Libraries the doctor can exchange with, in display order; the others are listed only.
_SIDES: Final[dict[str, Callable[[], Side]]] = {
    "numpy": _NumpySide,
    "torch": _TorchSide,
    "jax": _JaxSide,
    "pyarrow": _PyArrowSide,
    "cupy": _CupySide,
}
PEERS: Final = tuple(_SIDES)  # the names ``--peers`` accepts


# --------------------------------------------------------------------------------------------------
# Cells: one exchange, run and proved.


@dataclass
class Cell:
    """One proved exchange.

    Attributes:
        producer, consumer: side keys.
        device: ``"cpu"`` or ``"cuda:0"``...
        route: ``"tensorbridge"`` (producer -> tensorbridge -> consumer) or ``"direct"``.
        dtype: the tensorbridge dtype name exchanged.
        outcome: ``shared``, ``copied``, ``refused``, ``broken`` or ``n/a``.
        proof: ``"write"`` (a write through one side was read through the other) or ``"address"``
            (neither side may be written: both report the same address); None unless shared.
        blame: who refused or broke it (a side key), or None.
        reason: the exception or the mismatch, one line.
        calls: the entry points used (``"tb.from_dlpack -> torch.from_dlpack"``).
        notes: what else was seen (warnings, a writable view of read-only memory, the entry
            points the consumer refused before the one in ``calls`` took the object).
        unaligned: the outcome over producer memory that is not 64-byte aligned, for consumers
            that share only aligned memory (JAX) and producers that can make such memory; None
            where not tested. ``outcome`` is always over 64-byte-aligned memory where the
            producer can make it.
    """

    producer: str
    consumer: str
    device: str
    route: str
    dtype: str
    outcome: str = NONE
    proof: str | None = None
    blame: str | None = None
    reason: str | None = None
    calls: str = ""
    notes: list[str] = field(default_factory=list)
    unaligned: str | None = None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _warning_text(w: warnings.WarningMessage) -> str:
    """A warning's category and first sentence."""
    first = str(w.message).strip().split(". ")[0].splitlines()[0]
    return f"{w.category.__name__}: {first}"


def _raised_in_tensorbridge(exc: BaseException) -> bool:
    """True when the innermost frame of the traceback is tensorbridge code (not the doctor's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    filename = str(Path(frames[-1].filename).resolve())
    return filename.startswith(_PACKAGE_DIR) and filename not in _OWN_FILES


def _exports(x: Any) -> bool:
    """Whether a producer can export itself at all (to tell its refusals from tensorbridge's)."""
    if not hasattr(x, "__dlpack__"):
        return _is_buffer(x)
    try:
        try:
            x.__dlpack__(max_version=(1, 0))
        except TypeError:
            x.__dlpack__()
    except Exception:
        return False
    return True


_DOCUMENTED: Final = (TypeError, ValueError, BufferError, RuntimeError)


def _numpy_can_name(dtype_name: str) -> bool:
    """Whether NumPy (with ml_dtypes, when installed) has a type for elements of ``dtype_name``."""
    try:
        import numpy as np
    except ImportError:
        return False
    try:
        np.dtype(dtype_name)
    except TypeError:
        try:
            import ml_dtypes
        except ImportError:
            return False
        return hasattr(ml_dtypes, dtype_name)
    return True


@dataclass
class _Flow:
    """The objects of one exchange: producer side and object, consumer side and result, and the
    tensorbridge tensor in between (None on a direct route)."""

    p: Side
    x: Any
    c: Side
    t: Any = None
    y: Any = None


class _Exchange:
    """Runs cells between sides: through tensorbridge and directly."""

    def __init__(self, tbside: _TensorbridgeSide) -> None:
        self.tb = tbside

    def run(
        self, p: Side, c: Side, device: str, route: str, dtype: str, *, unaligned: bool = False
    ) -> Cell:
        """One cell over producer memory that is 64-byte aligned wherever the producer allows.

        With ``unaligned`` and a consumer that shares only aligned memory, the exchange runs again
        over memory that is not aligned (where the producer can make such memory), and the cell
        keeps that outcome too: both are facts of the same pair, and each is reproducible.
        """
        cell = self._run(p, c, device, route, dtype, aligned=True)
        assert cell is not None  # an aligned run always gives a cell
        if not (unaligned and c.needs_alignment and device == "cpu") or cell.outcome == NONE:
            return cell
        other = self._run(p, c, device, route, dtype, aligned=False)
        if other is None:  # this producer's memory is always aligned
            return cell
        cell.unaligned = other.outcome
        if other.outcome == BROKEN and cell.outcome != BROKEN:
            cell.outcome, cell.blame = BROKEN, other.blame
            cell.reason = f"over memory that is not {_ALIGN}-byte aligned: {other.reason}"
        elif other.outcome != cell.outcome:
            why = [n for n in other.notes if n not in cell.notes] or [other.reason or ""]
            cell.notes.append(
                f"{'; '.join(filter(None, why))}: {cell.outcome} over {_ALIGN}-byte-aligned "
                f"memory (as the doctor allocates it), {other.outcome} over memory that is not"
            )
        return cell

    def _make(self, p: Side, dtype: str, raw: bytes, device: str, aligned: bool) -> Any:
        """A producer object whose memory is (or, with ``aligned`` False, is not) 64-byte aligned.

        A side that can place its memory does (`Side.place`). For the others the doctor allocates
        until it gets the alignment it wants: small blocks land on any 16-byte boundary, and the
        misses are kept alive meanwhile so that each try gets a new address. Returns None when no
        try gave the wanted alignment.
        """
        if device != "cpu":  # device allocators align to at least 256 bytes
            return p.make(dtype, raw, device) if aligned else None
        if p.fixed_alignment:
            if (p.fixed_alignment % _ALIGN == 0) != aligned:
                return None
            return p.make(dtype, raw, device)
        placed = p.place(dtype, raw, aligned)
        if placed is not None:
            return placed
        missed: list[Any] = []
        try:
            for _ in range(_TRIES):
                x = p.make(dtype, bytes(bytearray(raw)), device)  # a new copy: a new address
                if (p.address(x) % _ALIGN == 0) == aligned:
                    return x
                missed.append(x)
            return None
        finally:
            for x in missed:
                p.release(x)

    def _run(
        self, p: Side, c: Side, device: str, route: str, dtype: str, *, aligned: bool
    ) -> Cell | None:
        cell = Cell(p.key, c.key, device, route, dtype)
        raw = _pattern(getattr(tb, dtype))
        try:
            x = self._make(p, dtype, raw, device, aligned)
            if x is None and aligned:  # the allocator never gave aligned memory: say so
                x = p.make(dtype, raw, device)
                cell.notes.append(f"{p.key} gave no {_ALIGN}-byte-aligned memory in {_TRIES} tries")
        except _Unavailable as exc:
            cell.reason = str(exc)
            return cell
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a producer's failure is its own
            cell.reason, cell.blame = _one_line(exc), p.key
            return cell
        if x is None:
            return None
        flow = _Flow(p, x, c, t=x if p is self.tb else None)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self._exchange(cell, flow)
            cell.notes += sorted({_warning_text(w) for w in caught})
        finally:
            in_path = self._in_path(cell, flow)
            flow.t = flow.y = None  # drop every view before the producer lets go of its memory
            self._release(cell, p, x, in_path)
        return cell

    def _release(self, cell: Cell, p: Side, x: Any, in_path: bool) -> None:
        try:
            p.release(x)
        except BufferError:
            gc.collect()
            try:
                p.release(x)
            except BufferError as exc:
                if in_path:
                    held = f"{p.key}'s export is still held after every view died ({exc})"
                    self._break(cell, held)
                else:  # no tensorbridge object was involved: the consumer keeps the export
                    cell.notes.append(f"{cell.consumer} still holds {p.key}'s buffer export")

    def _break(self, cell: Cell, reason: str) -> None:
        cell.outcome, cell.blame, cell.reason = BROKEN, "tensorbridge", reason

    def _in_path(self, cell: Cell, flow: _Flow) -> bool:
        return cell.route == "tensorbridge" or self.tb in (flow.p, flow.c)

    def _exchange(self, cell: Cell, flow: _Flow) -> None:
        through = cell.route == "tensorbridge"
        calls: list[str] = []
        try:
            if flow.t is None and (through or flow.c is self.tb):
                flow.t, call = self.tb.consume(flow.x)
                calls.append(call)
        except _Unavailable as exc:
            cell.reason = str(exc)
            return
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # every failure is classified and reported
            cell.calls = " -> ".join(calls)
            self._failed(cell, exc, "import", flow)
            return
        if flow.c is self.tb:
            flow.y = flow.t
        else:
            given = _handoff(flow.c, flow.t, calls) if through else flow.x
            if not self._consume(cell, flow, given, calls):
                return
        cell.calls = " -> ".join(calls)
        self._prove(cell, flow)

    def _consume(self, cell: Cell, flow: _Flow, given: Any, calls: list[str]) -> bool:
        """Import ``given`` through the consumer's entry points in turn, as its users would: the
        first that takes it wins, and the refusals before it become notes. False when none took it
        (or one broke a guarantee); the cell then says why."""
        try:
            points = flow.c.entry_points(given)
        except _Unavailable as exc:
            cell.reason = str(exc)
            return False
        refusals: list[Cell] = []
        for name, call in points:
            try:
                flow.y = call()
            except _Unavailable as exc:
                cell.reason = str(exc)
                continue
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                tried = replace(cell, notes=[], calls=" -> ".join([*calls, name]))
                self._failed(tried, exc, "export", flow)
                if tried.outcome == BROKEN:  # no other entry point excuses a broken guarantee
                    cell.outcome, cell.blame, cell.reason = BROKEN, tried.blame, tried.reason
                    cell.calls = tried.calls
                    return False
                refusals.append(tried)
                continue
            calls.append(name)
            cell.reason = None
            cell.notes += [_refusal_note(r) for r in refusals]
            return True
        if refusals:
            first = refusals[0]
            cell.outcome, cell.blame, cell.reason = first.outcome, first.blame, first.reason
            cell.calls = first.calls
            cell.notes += [_refusal_note(r) for r in refusals[1:]]
        return False

    def _failed(self, cell: Cell, exc: BaseException, stage: str, flow: _Flow) -> None:
        """Who refused: the producer (it cannot export this), the consumer, or tensorbridge."""
        cell.reason = _one_line(exc)
        if not self._in_path(cell, flow):
            cell.outcome, cell.blame = REFUSED, (flow.p if stage == "import" else flow.c).key
        elif stage == "import":
            # Only tensorbridge's entry point and the producer's export ran: if the producer can
            # export, the failure is tensorbridge's, whatever its type.
            if _exports(flow.x):
                reason = f"tensorbridge could not import what {flow.p.key} exports: {cell.reason}"
                self._break(cell, reason)
            else:
                cell.outcome, cell.blame = REFUSED, flow.p.key
        elif isinstance(exc, SystemError):  # a capsule destructor clobbered the consumer's error
            self._break(cell, cell.reason)
        elif not _raised_in_tensorbridge(exc):
            cell.outcome, cell.blame = REFUSED, flow.c.key
        elif isinstance(exc, NotImplementedError) or not isinstance(exc, _DOCUMENTED):
            self._break(cell, cell.reason)
        elif isinstance(exc, TypeError) and not _numpy_can_name(flow.t.dtype.name):
            # NumPy has no type for these elements (float4 pairs; bfloat16 or float8 without
            # ml_dtypes): tensorbridge refuses rather than hand out an object array or raw bytes
            # in disguise, as documented.
            cell.outcome, cell.blame = REFUSED, "tensorbridge"
        elif not flow.t.is_readonly:
            self._break(cell, f"tensorbridge refused to export a writable tensor: {cell.reason}")
        else:  # a documented refusal: a read-only tensor asked for as a legacy capsule
            cell.outcome, cell.blame = REFUSED, "tensorbridge"

    def _imported_wrong(self, cell: Cell, flow: _Flow) -> str | None:
        """What tensorbridge's import got wrong (the dtype, or a copy for a view), or None."""
        p, x, t = flow.p, flow.x, flow.t
        if t is None or p is self.tb:
            return None
        if t.dtype.name != cell.dtype:
            return f"tensorbridge read {cell.dtype} from {p.key} as {t.dtype.name}"
        if t.data_ptr() != p.address(x):
            return f"tensorbridge copied {p.key}'s memory on import instead of sharing it"
        return None

    def _prove(self, cell: Cell, flow: _Flow) -> None:
        """Check the values, then share or copy: by a write where one side may be written."""
        p, x, c, y = flow.p, flow.x, flow.c, flow.y
        expected = p.read(x)
        wrong = self._imported_wrong(cell, flow)
        if wrong:
            self._break(cell, wrong)
            return
        got_dtype = c.dtype_of(y)
        if got_dtype is not None and got_dtype != cell.dtype:
            cell.outcome, cell.blame = COPIED, c.key
            cell.reason = f"{c.key} converted {cell.dtype} to {got_dtype}"
            return
        if c.read(y) != expected:
            if self._in_path(cell, flow):
                self._break(cell, "the consumer read different values than the producer holds")
            else:
                cell.outcome, cell.blame, cell.reason = BROKEN, c.key, "values differ"
            return
        if p.poke(x):
            shared, proof = c.read(y)[0] != expected[0], "write"
        else:
            shared, proof = p.address(x) == c.address(y), "address"
        if shared:
            cell.outcome, cell.proof = SHARED, proof
            self._check_readonly(cell, flow)
            return
        cell.outcome = COPIED
        note = c.copy_note(p.address(x))
        if note:
            cell.notes.append(note)

    def _check_readonly(self, cell: Cell, flow: _Flow) -> None:
        """Read-only memory must stay read-only wherever tensorbridge can say so."""
        p, c, t = flow.p, flow.c, flow.t
        if not p.readonly(flow.x):
            return
        if t is not None and not t.is_readonly:
            if isinstance(p, _Stdlib):  # the buffer protocol said read-only: no excuse
                self._break(cell, f"tensorbridge made a writable tensor over read-only {p.key}")
            else:
                cell.notes.append(
                    f"{p.key} exports without READ_ONLY: tensorbridge's view is writable"
                )
        elif not c.has_readonly:
            note = f"{c.key} has no read-only arrays: it can write into read-only {p.key} memory"
            cell.notes.append(note)
        elif c.readonly(flow.y) is False and t is not None:
            call = cell.calls.rpartition(" -> ")[2]
            if _marked_readonly(t, call):  # tensorbridge said read-only; the consumer ignored it
                cell.notes.append(f"{call} ignores the read-only mark: its view is writable")
            else:
                self._break(
                    cell, f"{call} got a writable view of a read-only tensor: READ_ONLY lost"
                )
        elif c.readonly(flow.y) is False:
            cell.notes.append(f"{c.key} can write to read-only {p.key} memory")


def _refusal_note(cell: Cell) -> str:
    """A refused entry point, for the cell of the one that worked after it."""
    call = cell.calls.rpartition(" -> ")[2]
    who = f"{cell.blame}: " if cell.blame and not (cell.reason or "").startswith(cell.blame) else ""
    return f"{call} refused ({who}{cell.reason})"


def _marked_readonly(t: Any, call: str) -> bool:
    """Whether tensorbridge marks read-only tensor ``t`` read-only on the protocol ``call`` uses."""
    try:
        if call.endswith("from_dlpack"):
            capsule = t.__dlpack__(max_version=(1, 0))
            address = _capi.PyCapsule_GetPointer(capsule, _dlpack_abi.DLTENSOR_VERSIONED)
            managed = _dlpack_abi.DLManagedTensorVersioned.from_address(address)
            return bool(managed.flags & _dlpack_abi.DLPACK_FLAG_BITMASK_READ_ONLY)
        if call == "np.asarray":
            return bool(t.__array_interface__["data"][1])
        with t.as_memoryview() as mv:
            return bool(mv.readonly)
    except Exception:  # no such export at all: nothing was marked
        return False


# --------------------------------------------------------------------------------------------------
# Safety checks: each returns a short detail on success and raises _Failed (or anything) on failure.


class _Failed(Exception):
    pass


@dataclass
class Check:
    """One safety check: ``ok`` is True, False (a broken guarantee) or None (skipped)."""

    name: str
    ok: bool | None
    detail: str


def _expect_raise(
    kinds: type[BaseException] | tuple[type[BaseException], ...],
    fn: Callable[[], Any],
    what: str,
    contains: str = "",
) -> str:
    try:
        fn()
    except kinds as exc:
        if contains not in str(exc):
            msg = f"{what} raised {_one_line(exc)!r}, without {contains!r}"
            raise _Failed(msg) from None
        return type(exc).__name__
    msg = f"{what} did not raise"
    raise _Failed(msg)


class _Crafted:
    """A DLPack managed tensor built with ctypes over int32 memory, whose deleter calls are counted.

    The capsule has no destructor: if tensorbridge never consumes it, `close` calls the deleter, so
    the count tells exactly who released it and how often.
    """

    _keep: Final[
        list[_Crafted]
    ] = []  # deleters never called stay alive (a late call must not crash)

    def __init__(
        self,
        values: Sequence[int],
        *,
        shape: Sequence[int] | None = None,
        strides: Sequence[int] | None = None,
        start: int = 0,
        versioned: bool = True,
        readonly: bool = False,
        major: int = _dlpack_abi.DLPACK_MAJOR_VERSION,
        name: bytes | None = None,
    ) -> None:
        self.calls = 0
        self.data = (ctypes.c_int32 * len(values))(*values)
        shape = tuple(shape or (len(values),))
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(shape))(*(strides or (1,) * len(shape)))
        self.deleter = _dlpack_abi.DLPackDeleter(self._delete)
        dl = _dlpack_abi.DLTensor(
            ctypes.addressof(self.data) + 4 * start,
            _dlpack_abi.DLDevice(1, 0),
            len(shape),
            _dlpack_abi.DLDataType(_dlpack_abi.kDLInt, 32, 1),
            ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64)),
            ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64)),
            0,
        )
        if versioned:
            flags = _dlpack_abi.DLPACK_FLAG_BITMASK_READ_ONLY if readonly else 0
            self.managed: Any = _dlpack_abi.DLManagedTensorVersioned(
                _dlpack_abi.DLPackVersion(major, 0), None, self.deleter, flags, dl
            )
            default = _dlpack_abi.DLTENSOR_VERSIONED
        else:
            self.managed = _dlpack_abi.DLManagedTensor(dl, None, self.deleter)
            default = _dlpack_abi.DLTENSOR
        self.name = default if name is None else name
        self.capsule = _capi.PyCapsule_New(ctypes.addressof(self.managed), self.name, None)

    def _delete(self, address: int | None) -> None:
        self.calls += 1

    def count(self) -> int:
        """How many times the deleter has run."""
        return self.calls

    def capsule_name(self) -> bytes:
        return ctypes.string_at(_capi.PyCapsule_GetName(self.capsule))

    def close(self) -> None:
        """Release what nobody consumed; keep the deleter alive if a consumer still owes a call."""
        if self.calls == 0 and self.capsule_name() == self.name:
            self.deleter(ctypes.addressof(self.managed))
        if self.calls == 0:
            self._keep.append(self)


def _collect_until(predicate: Callable[[], bool]) -> bool:
    if predicate():
        return True
    gc.collect()
    return predicate()


_CHECKS: list[tuple[str, Callable[[dict[str, Side]], str]]] = []


def _check(
    name: str,
) -> Callable[[Callable[[dict[str, Side]], str]], Callable[[dict[str, Side]], str]]:
    def register(fn: Callable[[dict[str, Side]], str]) -> Callable[[dict[str, Side]], str]:
        _CHECKS.append((name, fn))
        return fn

    return register


@_check("read-only buffers give read-only tensors")
def _check_readonly_buffer(sides: dict[str, Side]) -> str:
    data = bytes(range(1, 9))
    t = tb.frombuffer(data, dtype=tb.uint8)
    if not t.is_readonly:
        msg = "frombuffer(bytes) returned a writable tensor"
        raise _Failed(msg)

    def write() -> None:
        t[0] = 99

    kind = _expect_raise(Exception, write, "writing to frombuffer(bytes)")
    if data[0] != 1:
        msg = "a write through a read-only tensor changed a bytes object"
        raise _Failed(msg)
    return f"frombuffer(bytes).is_readonly; a write raises {kind}"


@_check("READ_ONLY is set on versioned export and honoured on import")
def _check_readonly_flag(sides: dict[str, Side]) -> str:
    t = tb.frombuffer(bytes(range(1, 9)), dtype=tb.uint8)
    capsule = t.__dlpack__(max_version=(1, 3))
    name = ctypes.string_at(_capi.PyCapsule_GetName(capsule))
    if name != _dlpack_abi.DLTENSOR_VERSIONED:
        msg = f"__dlpack__(max_version=(1, 3)) returned a {name!r} capsule"
        raise _Failed(msg)
    managed = _dlpack_abi.DLManagedTensorVersioned.from_address(
        _capi.PyCapsule_GetPointer(capsule, _dlpack_abi.DLTENSOR_VERSIONED)
    )
    if not managed.flags & _dlpack_abi.DLPACK_FLAG_BITMASK_READ_ONLY:
        msg = "the versioned capsule of a read-only tensor lacks READ_ONLY"
        raise _Failed(msg)
    if not tb.from_dlpack(capsule).is_readonly:
        msg = "importing a READ_ONLY capsule gave a writable tensor"
        raise _Failed(msg)
    crafted = _Crafted([1, 2, 3], readonly=True)
    try:
        if not tb.from_dlpack(crafted.capsule).is_readonly:
            msg = "importing a crafted READ_ONLY capsule gave a writable tensor"
            raise _Failed(msg)
    finally:
        gc.collect()
        crafted.close()
    return "flag set on export; tb and crafted READ_ONLY capsules import read-only"


@_check("a read-only tensor is never exported as a legacy capsule")
def _check_readonly_legacy(sides: dict[str, Side]) -> str:
    t = tb.frombuffer(bytes(range(1, 9)), dtype=tb.uint8)
    _expect_raise(BufferError, lambda: tb.utils.dlpack.to_dlpack(t), "to_dlpack(read-only)")
    _expect_raise(BufferError, t.__dlpack__, "read-only __dlpack__()")
    return "to_dlpack() and __dlpack__() without max_version raise BufferError"


@_check("a capsule is consumed once; wrong objects get distinct errors")
def _check_capsule_reuse(sides: dict[str, Side]) -> str:
    capsule = tb.utils.dlpack.to_dlpack(tb.arange(4))
    tb.from_dlpack(capsule)
    _expect_raise(
        RuntimeError,
        lambda: tb.from_dlpack(capsule),
        "a second from_dlpack(capsule)",
        "DLTensor capsules can be consumed only once",
    )
    _expect_raise(TypeError, lambda: tb.from_dlpack([1, 2]), "from_dlpack(list)")
    foreign = _Crafted([1, 2], name=_FOREIGN)
    try:
        _expect_raise(
            TypeError,
            lambda: tb.from_dlpack(foreign.capsule),
            "from_dlpack(foreign capsule)",
            _FOREIGN.decode(),
        )
    finally:
        foreign.close()
    return "reuse: RuntimeError (PyTorch's text); list: TypeError; foreign capsule named"


_FOREIGN: Final = b"foreign_capsule"


def _consume_crafted(crafted: _Crafted, expect: list[int]) -> None:
    t = tb.from_dlpack(crafted.capsule)
    view = t[1:]
    if t.tolist() != expect:
        msg = f"imported {t.tolist()}, expected {expect}"
        raise _Failed(msg)
    used = b"used_" + crafted.name
    if crafted.capsule_name() != used:
        msg = f"the consumed capsule is named {crafted.capsule_name()!r}, not {used!r}"
        raise _Failed(msg)
    del t
    if crafted.calls:
        msg = "the deleter ran while a view was alive"
        raise _Failed(msg)
    del view
    if not _collect_until(lambda: crafted.count() > 0) or crafted.count() != 1:
        msg = f"the deleter ran {crafted.calls} times after the last view died"
        raise _Failed(msg)


@_check("an imported tensor's deleter runs exactly once")
def _check_deleter_once(sides: dict[str, Side]) -> str:
    for versioned in (True, False):
        crafted = _Crafted([5, 6, 7, 8], versioned=versioned)
        try:
            _consume_crafted(crafted, [5, 6, 7, 8])
        finally:
            crafted.close()
    return "versioned and legacy crafted capsules: 0 calls while a view lives, 1 after"


@_check("negative strides and byte offsets import correctly")
def _check_negative_strides(sides: dict[str, Side]) -> str:
    # Elements 5, 3, 1 of [1..6]: the data pointer at the last element, walking backwards.
    crafted = _Crafted([1, 2, 3, 4, 5, 6], shape=(3,), strides=(-2,), start=5)
    try:
        t = tb.from_dlpack(crafted.capsule)
        if t.tolist() != [6, 4, 2] or t.stride() != (-2,):
            msg = f"got {t.tolist()} with strides {t.stride()}, expected [6, 4, 2] with (-2,)"
            raise _Failed(msg)
        del t
        gc.collect()
    finally:
        crafted.close()
    return "a crafted stride -2 capsule reads [6, 4, 2] with stride (-2,)"


@_check("a failed import leaves the capsule unconsumed")
def _check_failed_import(sides: dict[str, Side]) -> str:
    crafted = _Crafted([1, 2], major=_dlpack_abi.DLPACK_MAJOR_VERSION + 1)
    try:
        kind = _expect_raise(
            BufferError, lambda: tb.from_dlpack(crafted.capsule), "from_dlpack(major version + 1)"
        )
        gc.collect()
        if crafted.calls or crafted.capsule_name() != crafted.name:
            msg = (
                f"after the refusal the deleter ran {crafted.calls} times and the capsule is "
                f"named {crafted.capsule_name()!r}"
            )
            raise _Failed(msg)
    finally:
        crafted.close()
    return f"a too-new major version raises {kind}; name kept, deleter left to the producer"


def _consume_like_c(capsule: Any) -> None:
    """What a C consumer does: rename the capsule, then call the deleter once when done."""
    name = _dlpack_abi.DLTENSOR_VERSIONED
    address = _capi.PyCapsule_GetPointer(capsule, name)
    _capi.PyCapsule_SetName(capsule, _dlpack_abi.USED_DLTENSOR_VERSIONED)
    _dlpack_abi.DLManagedTensorVersioned.from_address(address).deleter(address)


@_check("an exported tensor is released once, consumed or abandoned")
def _check_export_release(sides: dict[str, Side]) -> str:
    t = tb.arange(4)
    alive = weakref.ref(t)
    capsule = t.__dlpack__(max_version=(1, 3))
    del t
    if alive() is None:
        msg = "the tensor died while its capsule was unconsumed"
        raise _Failed(msg)
    _consume_like_c(capsule)
    del capsule
    if not _collect_until(lambda: alive() is None):
        msg = "the tensor outlived its consumed capsule (the deleter did not release it)"
        raise _Failed(msg)
    t = tb.arange(4)
    alive = weakref.ref(t)
    t.__dlpack__(max_version=(1, 3))  # abandoned at once
    del t
    if not _collect_until(lambda: alive() is None):
        msg = "an abandoned capsule kept its tensor alive after a collection"
        raise _Failed(msg)
    return "consumed (by a ctypes C-style consumer) and abandoned capsules release the tensor"


@_check("frombuffer holds the export while any view lives")
def _check_holds_export(sides: dict[str, Side]) -> str:
    ba = bytearray(16)
    t = tb.frombuffer(ba, dtype=tb.uint8)
    view = t[4:]
    del t
    _expect_raise(BufferError, lambda: ba.extend(b"x"), "resizing a bytearray under a view")
    del view
    if not _collect_until(lambda: _resizable(ba)):
        msg = "the bytearray stayed locked after the last view died"
        raise _Failed(msg)
    m = mmap.mmap(-1, 4096)
    t = tb.frombuffer(m, dtype=tb.uint8)
    _expect_raise(BufferError, m.close, "closing an mmap under a view")
    del t
    gc.collect()
    m.close()
    return "bytearray resize and mmap.close raise BufferError; both work once the views die"


def _resizable(ba: bytearray) -> bool:
    try:
        ba.append(0)
    except BufferError:
        return False
    ba.pop()
    return True


@_check("sizes are computed without overflow")
def _check_overflow(sides: dict[str, Side]) -> str:
    kind = _expect_raise(
        ValueError,
        lambda: tb.frombuffer(bytearray(8), dtype=tb.float32, count=2**62 + 1),
        "count=2**62+1",
    )
    return f"frombuffer(bytearray(8), float32, count=2**62+1) raises {kind}"


class _Owner:
    """Stands for a library's memory owner: holds a ctypes block, and can be watched by weakref."""

    def __init__(self, values: Sequence[int]) -> None:
        self.block = (ctypes.c_int32 * len(values))(*values)


@_check("from_pointer keeps its owner alive and checks nbytes")
def _check_from_pointer(sides: dict[str, Side]) -> str:
    owner = _Owner([1, 2, 3, 4])
    address, nbytes = ctypes.addressof(owner.block), ctypes.sizeof(owner.block)
    alive = weakref.ref(owner)
    t = tb.from_pointer(address, (4,), tb.int32, owner=owner, nbytes=nbytes)
    view = t[1:]
    del owner, t
    if alive() is None or view.tolist() != [2, 3, 4]:
        msg = "the owner died (or the values changed) while a view was alive"
        raise _Failed(msg)
    del view
    if not _collect_until(lambda: alive() is None):
        msg = "the owner outlived every view"
        raise _Failed(msg)
    block = (ctypes.c_int32 * 4)()
    kind = _expect_raise(
        ValueError,
        lambda: tb.from_pointer(ctypes.addressof(block), (5,), tb.int32, owner=block, nbytes=16),
        "from_pointer(5 int32 in 16 bytes)",
    )
    return f"the owner lives exactly as long as the views; a layout beyond nbytes raises {kind}"


def _dlpack_refusal(x: Any) -> str | None:
    """Why producer ``x`` refuses every DLPack export (versioned, then legacy), or None."""
    try:
        try:
            x.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer older than DLPack 1.0 takes no max_version
            x.__dlpack__()
    except Exception as exc:
        return _one_line(exc)
    return None


@_check("NumPy read-only arrays import read-only")
def _check_numpy_readonly(sides: dict[str, Side]) -> str:
    if "numpy" not in sides:
        msg = "NumPy not used"
        raise _Skipped(msg)
    np = sides["numpy"].np  # type: ignore[attr-defined]
    a = np.arange(4, dtype=np.int32)
    a.flags.writeable = False
    done = []
    if not tb.frombuffer(a, dtype=tb.int32).is_readonly:
        msg = "tb.frombuffer(read-only ndarray) is writable"
        raise _Failed(msg)
    done.append("tb.frombuffer(ro ndarray) is read-only")
    # NumPy before 2.1 has no versioned DLPack, so it refuses to export a read-only array at all:
    # its limitation, reported; tensorbridge is judged only on what NumPy does export.
    refusal = _dlpack_refusal(a)
    if refusal is None:
        if not tb.from_dlpack(a).is_readonly:
            msg = "tb.from_dlpack(read-only ndarray) is writable"
            raise _Failed(msg)
        done.append("so is tb.from_dlpack(it)")
    else:
        done.append(f"NumPy {np.__version__} refuses to export it by DLPack ({refusal})")
    t = tb.frombuffer(bytes(range(1, 9)), dtype=tb.int32)
    try:
        y = np.from_dlpack(t)
    except BufferError as exc:
        # NumPy before 2.1 asks for a legacy capsule, which cannot say read-only: tensorbridge
        # refuses it (documented), a refusal that must come from tensorbridge itself.
        if not _raised_in_tensorbridge(exc):
            raise
        done.append("np.from_dlpack(ro tensor) asks for a legacy capsule: refused as documented")
    else:
        if y.flags.writeable:
            msg = "np.from_dlpack(read-only tensor) is writable"
            raise _Failed(msg)
        done.append("np.from_dlpack(ro tensor) is read-only")
    if np.asarray(t).flags.writeable:
        msg = "np.asarray(read-only tensor) is writable"
        raise _Failed(msg)
    done.append("np.asarray(ro tensor) is read-only")
    return "; ".join(done)


class _Skipped(Exception):
    pass


# Run in a child interpreter: if tensorbridge handed negative strides to PyTorch as they are, torch
# would abort the process (pytorch/pytorch#188023: torch.from_dlpack aborts on negative strides).
_TORCH_NEGATIVE_STRIDES: Final = """
import tensorbridge as tb, torch
t = tb.arange(6, dtype=tb.int32)[::-1]
try:
    y = torch.from_dlpack(t)
except Exception as exc:
    print("refused", type(exc).__name__)
else:
    print("ok" if y.tolist() == [5, 4, 3, 2, 1, 0] else "wrong values " + repr(y.tolist()))
"""


class _ChildCheck:
    """A crash-prone check started early in a child interpreter and collected at the end."""

    name = "negative strides never reach PyTorch as they are (it aborts on them)"

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(_PACKAGE_DIR).parent), env.get("PYTHONPATH")])
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_TORCH_NEGATIVE_STRIDES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def stop(self) -> None:
        """End the child if its result was not needed (or the run failed)."""
        if self.proc.returncode is None:  # result() was not collected
            self.proc.kill()
            self.proc.communicate()

    def result(self, timeout: float = 60.0) -> Check:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return Check(self.name, False, "the child interpreter hung")
        out = out.strip()
        if self.proc.returncode < 0:
            return Check(
                self.name,
                False,
                f"torch.from_dlpack(t[::-1]) killed the process (signal {-self.proc.returncode})",
            )
        if self.proc.returncode or out.startswith("wrong"):
            detail = out or (err.strip().splitlines() or ["no output"])[-1]
            return Check(self.name, False, f"torch.from_dlpack(t[::-1]): {detail}")
        return Check(self.name, True, f"torch.from_dlpack(t[::-1]) in a child: {out}")


def _run_check(name: str, fn: Callable[[dict[str, Side]], str], sides: dict[str, Side]) -> Check:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Check(name, True, fn(sides))
    except _Skipped as exc:
        return Check(name, None, str(exc))
    except _Failed as exc:
        return Check(name, False, str(exc))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a peer's sys.exit() included: the run goes on
        where = "tensorbridge raised" if _raised_in_tensorbridge(exc) else "raised"
        return Check(name, False, f"{where} {_one_line(exc)}")
    finally:
        gc.collect()


# --------------------------------------------------------------------------------------------------
# The run.


@dataclass
class Options:
    """What to run: ``peers`` None means every library found; an empty tuple means none."""

    peers: tuple[str, ...] | None = None
    progress: bool = False
    child_checks: bool = True


@dataclass
class Report:
    """Everything the doctor found; `to_json` is the ``--json`` output."""

    libraries: list[Library]
    devices: list[str]
    matrix: list[Cell]
    dtypes: list[Cell]
    checks: list[Check]
    elapsed_s: float = 0.0

    @property
    def broken(self) -> list[str]:
        found = [
            f"{c.route}: {c.producer} -> {c.consumer} ({c.device}, {c.dtype}): {c.reason}"
            for c in (*self.matrix, *self.dtypes)
            if c.outcome == BROKEN and c.blame == "tensorbridge"
        ]
        return found + [f"check: {c.name}: {c.detail}" for c in self.checks if c.ok is False]

    @property
    def ok(self) -> bool:
        return not self.broken

    def to_json(self) -> dict[str, Any]:
        """The report as plain data (``doctor`` is the format version)."""
        return {
            "doctor": 1,
            "tensorbridge": tb.__version__,
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "libraries": [asdict(lib) for lib in self.libraries],
            "devices": self.devices,
            "matrix": [asdict(c) for c in self.matrix],
            "dtypes": [asdict(c) for c in self.dtypes],
            "checks": [asdict(c) for c in self.checks],
            "broken": self.broken,
            "ok": self.ok,
            "elapsed_s": round(self.elapsed_s, 3),
        }


class _Progress:
    """One status line on stderr, shown only once the run has taken more than a second.

    A background thread shows the step in progress even while that step blocks (a peer that takes
    30 s to import is named within a second), and updates the elapsed time on a terminal. A stream
    that fails (its reader went away) ends the progress display, not the run.
    """

    _TICK: Final = 0.25  # seconds between the thread's looks at the current step

    def __init__(self, enabled: bool, stream: TextIO, *, ticking: bool = True) -> None:
        self.enabled, self.stream = enabled, stream
        try:
            self.tty = enabled and stream.isatty()
        except (OSError, ValueError, AttributeError):
            self.tty = False
        self.start = self.last = time.perf_counter()
        self.shown = False
        self.text = ""  # the step in progress
        self.written = ""  # the step last written
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if enabled and ticking:
            self._thread = threading.Thread(
                target=self._tick, name="tensorbridge-doctor-progress", daemon=True
            )
            self._thread.start()

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.text = text
            self._show(time.perf_counter())

    def _tick(self) -> None:
        while not self._stop.wait(self._TICK):
            with self._lock:
                self._show(time.perf_counter())

    def _show(self, now: float) -> None:
        """Write the current step if the rate allows (a pipe gets each step at most once)."""
        if not self.enabled or not self.text or now - self.start < 1.0:
            return
        if now - self.last < (0.1 if self.tty else 1.0):
            return
        if not self.tty and self.text == self.written:
            return
        self.last, self.written = now, self.text
        line = f"doctor: {now - self.start:4.1f}s {self.text}"[: WIDTH - 1]
        self._write(f"\r{line:<{WIDTH - 1}}" if self.tty else line + "\n")
        self.shown = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # closed or broken: stop showing progress, go on
            self.enabled = False

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.shown and self.tty and self.enabled:
                self._write("\r" + " " * (WIDTH - 1) + "\r")
            self.enabled = False


def _load_sides(
    libraries: list[Library], wanted: tuple[str, ...] | None, progress: Callable[[str], None]
) -> list[Side]:
    sides: list[Side] = []
    for lib in libraries:
        if lib.version is None:
            continue
        if lib.key not in _SIDES:
            lib.status = "listed"
            continue
        if wanted is not None and lib.key not in wanted:
            lib.status = "not selected"
            continue
        progress(f"importing {lib.name} ({lib.module})")
        try:
            side = _SIDES[lib.key]()
            lib.devices = list(side.devices())
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: a peer's import must not end the doctor
            lib.status, lib.error = "import failed", _one_line(exc)
            continue
        lib.status = "used"
        sides.append(side)
    for lib in libraries:
        if lib.key == "ml_dtypes" and lib.version and any(s.key in ("numpy", "jax") for s in sides):
            lib.status, lib.error = "used", None  # through NumPy's extended dtypes
    return sides


def _matrix(
    ex: _Exchange,
    producers: list[Side],
    consumers: list[Side],
    devices: list[str],
    progress: Callable[[str], None],
) -> list[Cell]:
    cells = []
    for device in devices:
        for p in producers:
            if device not in p.devices() and p is not ex.tb:
                continue
            dtype = p.dtypes()[0] if isinstance(p, _Stdlib) else "int32"
            for c in consumers:
                if device not in c.devices() and c is not ex.tb:
                    continue
                progress(f"exchange {device}: {p.key} -> {c.key}")
                cells.append(ex.run(p, c, device, "tensorbridge", dtype, unaligned=True))
                if ex.tb not in (p, c):
                    cells.append(ex.run(p, c, device, "direct", dtype, unaligned=True))
    return cells


def _dtype_cells(
    ex: _Exchange, producers: list[Side], consumers: list[Side], progress: Callable[[str], None]
) -> list[Cell]:
    cells = []
    for p in producers:
        for c in consumers:
            if p is c is ex.tb:
                continue
            progress(f"dtypes: {p.key} -> {c.key}")
            cells += [ex.run(p, c, "cpu", "tensorbridge", d.name) for d in ALL_DTYPES]
    return cells


def _start_child(options: Options, libraries: list[Library]) -> _ChildCheck | None:
    torch_found = any(lib.key == "torch" and lib.version for lib in libraries)
    if not (options.child_checks and torch_found):
        return None
    if options.peers is not None and "torch" not in options.peers:
        return None
    return _ChildCheck()  # runs on another core while this process works


def run(options: Options, stderr: TextIO | None = None) -> Report:
    """Find the libraries, run every cell and check, and return the report."""
    start = time.perf_counter()
    progress = _Progress(options.progress, stderr or sys.stderr)
    libraries = find_libraries()
    child = _start_child(options, libraries)
    try:
        sides = _load_sides(libraries, options.peers, progress)
        tbside = _TensorbridgeSide()
        ex = _Exchange(tbside)
        devices = ["cpu", *sorted({d for s in sides for d in s.devices() if d.startswith("cuda")})]
        producers = [*_stdlib_producers(), *sides, tbside]
        matrix = _matrix(ex, producers, [tbside, _MemoryviewSide(), *sides], devices, progress)
        typed = [s for s in sides if s.dtypes() and "cpu" in s.devices()]
        dtype_consumers = [tbside, *(s for s in typed if s.protocol != "buffer")]
        dtypes = _dtype_cells(ex, [*typed, tbside], dtype_consumers, progress)
        by_key = {s.key: s for s in sides}
        checks = []
        for name, fn in _CHECKS:
            progress(f"check: {name}")
            checks.append(_run_check(name, fn, by_key))
        if child is not None and "torch" in by_key:
            progress("waiting for the child-interpreter check")
            checks.append(child.result())
    finally:
        if child is not None:
            child.stop()
        progress.close()
    report = Report(libraries, devices, matrix, dtypes, checks)
    report.elapsed_s = time.perf_counter() - start
    return report


# --------------------------------------------------------------------------------------------------
# The text report.


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  ", width: int = WIDTH
) -> list[str]:
    """Left-aligned columns; when too wide, split into blocks of columns that repeat column 0."""
    rows = [list(r) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    blocks: list[list[int]] = [[]]
    used = len(indent) + widths[0]
    for i in range(1, len(headers)):
        if used + 2 + widths[i] > width and blocks[-1]:
            blocks.append([])
            used = len(indent) + widths[0]
        blocks[-1].append(i)
        used += 2 + widths[i]
    lines = []
    for n, block in enumerate(blocks):
        if n:
            lines.append("")
        for row in (headers, *rows):
            cols = [0, *block]
            lines.append((indent + "  ".join(f"{row[i]:<{widths[i]}}" for i in cols)).rstrip())
    return lines


class _Footnotes:
    def __init__(self) -> None:
        self.texts: dict[str, int] = {}

    def ref(self, text: str) -> int:
        return self.texts.setdefault(text, len(self.texts) + 1)

    def lines(self) -> list[str]:
        out = []
        for text, n in self.texts.items():
            first = f"  [{n}] "
            out += textwrap.wrap(
                text, WIDTH, initial_indent=first, subsequent_indent=" " * len(first)
            )
        return out


def _outcome_text(outcome: str, proof: str | None, blame: str | None) -> str:
    if outcome == NONE:
        return "-"
    if outcome == SHARED:
        return "shared" if proof in ("write", None) else "shared*"
    if outcome == COPIED:
        return "copied"
    if outcome == REFUSED:
        return "no"
    return "BROKEN" if blame == "tensorbridge" else "wrong"


def _cell_text(cell: Cell | None, notes: _Footnotes) -> str:
    if cell is None:
        return ""
    if cell.outcome == NONE:
        return "-"
    text = _outcome_text(cell.outcome, cell.proof, cell.blame)
    if cell.unaligned is not None and cell.unaligned != cell.outcome:
        text += "/" + _outcome_text(cell.unaligned, cell.proof, None)
    detail = cell.reason if cell.outcome != SHARED else None
    detail = "; ".join(filter(None, [detail, *cell.notes]))
    if detail:
        who = (
            f"{cell.blame}: "
            if cell.blame and cell.reason and not cell.reason.startswith(cell.blame)
            else ""
        )
        text += f" [{notes.ref(who + detail)}]"
    return text


_LEGEND: Final = (
    "shared: a write through the producer was read through the consumer; shared*: neither side "
    "may be written, both see the same address; copied: the values arrived, the memory is not "
    "shared; no: refused; -: no common protocol; BROKEN: tensorbridge broke a guarantee. The "
    "doctor allocates 64-byte-aligned memory; a/b: a over such memory, b over memory that is not "
    "(for consumers that share only aligned memory). [n]: the reasons below."
)


def _matrix_lines(title: str, cells: list[Cell], route: str, device: str) -> list[str]:
    chosen = [c for c in cells if c.route == route and c.device == device]
    producers = list(dict.fromkeys(c.producer for c in chosen))
    consumers = list(dict.fromkeys(c.consumer for c in chosen))
    if route == "direct":
        consumers = [c for c in consumers if c != "tensorbridge"]
    grid = {(c.producer, c.consumer): c for c in chosen}
    notes = _Footnotes()
    rows = [[p] + [_cell_text(grid.get((p, c)), notes) for c in consumers] for p in producers]
    if not rows:
        return []
    return [title, *table(["producer \\ consumer", *consumers], rows), *notes.lines(), ""]


_SHORT: Final = {
    "bool": "bool",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "complex32": "c32",
    "complex64": "c64",
    "complex128": "c128",
    "float4_e2m1fn_x2": "f4x2",
}


def _short(dtype: str) -> str:
    return _SHORT.get(dtype, dtype.removeprefix("float8_").replace("e8m0fnu", "e8m0"))


def _dtype_mark(cell: Cell) -> str:
    if cell.outcome == BROKEN:
        return "!" if cell.blame == "tensorbridge" else "?"
    if cell.outcome == SHARED:
        return "="
    if cell.outcome == COPIED:
        return "c"
    if cell.outcome == REFUSED:
        return "r" if cell.blame == "tensorbridge" else "x"
    return "."


def _pair(cell: Cell) -> str:
    hops = [cell.producer, "tensorbridge", cell.consumer]
    return ">".join(dict.fromkeys("tb" if h == "tensorbridge" else h for h in hops))


def _dtype_lines(cells: list[Cell]) -> list[str]:
    if not cells:
        return []
    pairs = list(dict.fromkeys(_pair(c) for c in cells))
    grid = {(_pair(c), c.dtype): c for c in cells}
    standard = [d.name for d in ALL_DTYPES if d.name in _SHORT and d.name != "float4_e2m1fn_x2"]
    low = [d.name for d in ALL_DTYPES if d.name not in standard]
    legend = (
        "dtype coverage through tensorbridge, cpu: = shared; c copied or converted by the "
        "consumer; x refused by a peer; r refused by tensorbridge as documented (a read-only "
        "tensor asked for as a legacy capsule); . the producer has no such dtype; ! BROKEN"
    )
    lines = textwrap.wrap(legend, WIDTH)
    for names in (standard, low):
        rows = [
            [pair] + [_dtype_mark(grid[pair, d]) if (pair, d) in grid else "" for d in names]
            for pair in pairs
        ]
        lines += table(["pair", *(_short(d) for d in names)], rows)
        lines.append("")
    return lines


def _library_lines(libraries: list[Library]) -> list[str]:
    rows = []
    notes = _Footnotes()
    for lib in libraries:
        if lib.version is None:
            continue
        status = lib.status + (f" [{notes.ref(lib.error)}]" if lib.error else "")
        rows.append([lib.name, lib.version, ", ".join(lib.devices) or "-", status])
    missing = [lib.name for lib in libraries if lib.version is None]
    lines = ["Array libraries (versions from the installed metadata; devices of the ones used)"]
    lines += table(["library", "version", "devices", "status"], rows) if rows else ["  none"]
    lines += notes.lines()
    if any(lib.status == "listed" for lib in libraries):
        lines += textwrap.wrap(
            "listed: installed; the doctor exchanges with " + ", ".join(_SIDES) + " only",
            WIDTH,
            initial_indent="  ",
            subsequent_indent="  ",
        )
    if missing:
        lines += textwrap.wrap(
            "not installed: " + ", ".join(missing),
            WIDTH,
            initial_indent="  ",
            subsequent_indent="  ",
        )
    hint = _no_library_hint(libraries)
    if hint:
        lines += ["", *textwrap.wrap(hint, WIDTH)]
    return [*lines, ""]


def _no_library_hint(libraries: list[Library]) -> str | None:
    """How to see the full matrix when the run used no array library; None when it used one."""
    if any(lib.status == "used" for lib in libraries):
        return None
    exchangeable = [lib for lib in libraries if lib.key in _SIDES]
    unselected = [lib.name for lib in exchangeable if lib.status == "not selected"]
    failed = [lib.name for lib in exchangeable if lib.status == "import failed"]
    names = ", ".join(lib.name for lib in exchangeable)
    text = (
        "No array library was used, so the matrix shows the standard library and tensorbridge only."
    )
    if unselected:
        text += (
            f" To see the full matrix, run without --peers and with TB_DOCTOR_PEERS unset "
            f"(installed here: {', '.join(unselected)})."
        )
    elif failed:
        text += f" {', '.join(failed)} failed to import (the reason is above); fix that first."
    else:
        text += (
            f" To see the full matrix, install one or more of {names} "
            f"(python -m pip install numpy) and run the doctor again."
        )
    return text


def _check_lines(checks: list[Check]) -> list[str]:
    lines = ["Safety checks"]
    for check in checks:
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[check.ok]
        lines += textwrap.wrap(
            f"{mark}  {check.name}: {check.detail}",
            WIDTH,
            initial_indent="  ",
            subsequent_indent="        ",
        )
    return [*lines, ""]


def render(report: Report) -> str:
    """The human-readable report; every line fits in `WIDTH` columns."""
    head = [
        f"tensorbridge {tb.__version__} doctor",
        f"Python {platform.python_version()} ({platform.python_implementation()}) on "
        f"{platform.platform()}",
    ]
    lines = [*head, "", *_library_lines(report.libraries)]
    for device in report.devices:
        lines += _matrix_lines(
            f"Exchange through tensorbridge, {device}: producer -> tb -> consumer",
            report.matrix,
            "tensorbridge",
            device,
        )
        lines += _matrix_lines(
            f"Direct exchange, {device}: producer -> consumer (for comparison)",
            report.matrix,
            "direct",
            device,
        )
    lines += [*textwrap.wrap(_LEGEND, WIDTH), ""]
    lines += _dtype_lines(report.dtypes)
    lines += _check_lines(report.checks)
    if report.ok:
        lines.append(f"OK: tensorbridge kept every guarantee checked ({report.elapsed_s:.1f} s).")
    else:
        lines.append(
            f"BROKEN: tensorbridge broke {len(report.broken)} guarantee(s) "
            f"({report.elapsed_s:.1f} s):"
        )
        for item in report.broken:
            lines += textwrap.wrap(item, WIDTH, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(line[:WIDTH].rstrip() for line in lines) + "\n"
