"""Files as producers: a safetensors file and an ``.npy`` file, each written by the doctor itself
(by hand, as the formats specify, so that no peer is needed) and loaded by tensorbridge.

A file side's object is a `StoredFile`: the path and where the tensor's bytes start. tensorbridge
imports it by loading the file (``tensorbridge.safetensors.load_file``, ``tb.load_npy``), which
maps it read-only; the proof of zero copy is a write to the file itself, through a separate
writable map of it, that must be seen through the loaded tensor and every view handed on.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import struct
import sys
import tempfile
import weakref
from collections.abc import Callable
from typing import Any, Final

import tensorbridge as tb
import tensorbridge.safetensors as tbst

from .errors import Unavailable
from .sides import ALIGN, Side

__all__ = ["FileSide", "NpyFile", "SafetensorsFile", "StoredFile", "file_producers"]

# The safetensors format's name of each tensorbridge dtype it defines (float4_e2m1fn_x2 is left
# out: the format counts its 4-bit values, so its shape would differ from the tensor's).
_SAFETENSORS_CODES: Final = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "uint32": "U32",
    "int32": "I32",
    "uint64": "U64",
    "int64": "I64",
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float64": "F64",
    "complex64": "C64",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
}


class StoredFile:
    """A file the doctor wrote: ``path``, and the bytes of the tensor at ``[start, start + size)``.

    ``loaded`` is the data pointer of the tensor tensorbridge loaded from it (0 before the load).
    """

    def __init__(self, path: str, start: int, size: int) -> None:
        self.path, self.start, self.size = path, start, size
        self.loaded = 0


class FileSide(Side):
    """A file format as a producer: `make` writes a file, `load` is tensorbridge's import of it."""

    fixed_alignment = ALIGN  # the data starts 64 bytes into the file, and maps are page-aligned
    call = "?"

    def __init__(self) -> None:
        self._dir: str | None = None
        self._count = 0

    def _path(self, suffix: str) -> str:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="tensorbridge-doctor-")
            # Removed when the side dies; a file still mapped (Windows) stays for the OS to clean.
            weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        self._count += 1
        return os.path.join(self._dir, f"{self._count}{suffix}")

    def _write(self, path: str, head: bytes, raw: bytes) -> StoredFile:
        with open(path, "wb") as f:
            f.write(head)
            f.write(raw)
        return StoredFile(path, len(head), len(raw))

    def load(self, x: StoredFile) -> tuple[Any, str]:
        """The tensor tensorbridge loads from ``x``, and the call that loaded it."""
        raise NotImplementedError

    def release(self, x: Any) -> None:
        with contextlib.suppress(OSError):  # still mapped (Windows): the directory's cleanup
            os.remove(x.path)

    def read(self, x: Any) -> bytes:
        with open(x.path, "rb") as f:
            f.seek(x.start)
            return f.read(x.size)

    def poke(self, x: Any) -> bool:
        # Through a writable shared map of the file: it is coherent with tensorbridge's read-only
        # map of the same file on every OS, where a plain write() need not be.
        try:
            with open(x.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                m[x.start] ^= 1
                m.flush()
        except OSError:
            return False
        return True

    def address(self, x: Any) -> int:
        return int(x.loaded)  # only used if the file could not be written to

    def readonly(self, x: Any) -> bool | None:
        return True  # both loaders map read-only by default


class SafetensorsFile(FileSide):
    """One tensor in a safetensors file: an 8-byte little-endian header length, the JSON header
    (padded with spaces, as the format allows, so that the data starts at byte 64), the data."""

    key = label = "safetensors file"
    call = "tb.safetensors.load_file"

    def dtypes(self) -> tuple[str, ...]:
        return tuple(_SAFETENSORS_CODES)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype not in _SAFETENSORS_CODES or device != "cpu":
            return super().make(dtype, raw, device)
        if sys.byteorder != "little":
            msg = "safetensors data is little-endian and this host is big-endian"
            raise Unavailable(msg)
        n = len(raw) // getattr(tb, dtype).itemsize
        entry = {"dtype": _SAFETENSORS_CODES[dtype], "shape": [n], "data_offsets": [0, len(raw)]}
        text = json.dumps({"x": entry}, separators=(",", ":")).encode()
        text += b" " * (-(8 + len(text)) % ALIGN)
        return self._write(self._path(".safetensors"), struct.pack("<Q", len(text)) + text, raw)

    def load(self, x: StoredFile) -> tuple[Any, str]:
        t = tbst.load_file(x.path)["x"]
        x.loaded = t.data_ptr()
        return t, self.call


class NpyFile(FileSide):
    """A 1-d array in an ``.npy`` file (format 1.0), its header padded as ``numpy.save`` pads it,
    so that the data starts at byte 64."""

    key = label = "npy file"
    call = "tb.load_npy"

    def dtypes(self) -> tuple[str, ...]:
        return tuple(d for d in _SAFETENSORS_CODES if getattr(tb, d).typestr is not None)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        descr = getattr(tb, dtype).typestr
        if descr is None or device != "cpu":
            return super().make(dtype, raw, device)
        n = len(raw) // getattr(tb, dtype).itemsize
        head = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({n},), }}"
        head += " " * (-(10 + len(head) + 1) % ALIGN) + "\n"
        magic = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head))
        return self._write(self._path(".npy"), magic + head.encode("latin-1"), raw)

    def load(self, x: StoredFile) -> tuple[Any, str]:
        t = tb.load_npy(x.path)
        x.loaded = t.data_ptr()
        return t, self.call


def file_producers() -> list[FileSide]:
    """The file formats tensorbridge loads, as producers (no peer needed)."""
    makers: list[Callable[[], FileSide]] = [SafetensorsFile, NpyFile]
    return [make() for make in makers]
