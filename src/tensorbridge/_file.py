"""`from_file`: a tensor over a memory-mapped file.

`_mapfile.map_window` opens and maps the file (the rules every file loader shares: paths, regular
files only, length checks, growing, the map's lifetime); this module keeps PyTorch's arguments and
words the failures as PyTorch does. The storage holds the map's buffer export, so mapping a file of
any size costs the same: nothing is read until an element is, and the map stays open while any view
lives. Three kinds of mapping:

* private copy-on-write (``shared=False`` or ``None``, PyTorch's default): writes stay here;
* shared (``shared=True``): writes reach the file; a missing file is created, a short one grown;
* read-only (``mode="r"``): a ``PROT_READ`` mapping and a read-only tensor.

A mapping is checked when it is made (the file exists, is regular, is long enough); it cannot be
checked afterwards: if the file is truncated below the mapped range while a view lives, touching
the lost pages raises SIGBUS, as with any mmap, which kills the process and cannot be caught.
``copy=True`` (a tensorbridge extra) is the load that survives that: the range is read once into a
private allocation (`_mapfile.read_window`: a ``read()``, not a map).
"""

from __future__ import annotations

import errno
import os
from typing import Any, Final

from ._args import GRAD_MSG_CREATE, as_bool, as_int
from ._dtype import DType, as_dtype, float32
from ._mapfile import MapFailure, as_path, map_window, read_window
from ._storage import Storage, allocate
from ._tensor import Tensor

__all__ = ["from_file"]

_API: Final = "from_file"
_MODES: Final = (None, "r")


def from_file(
    filename: str | bytes | os.PathLike[Any],
    shared: bool | None = None,
    size: int = 0,
    *,
    dtype: DType | None = None,
    requires_grad: bool = False,
    offset: int = 0,
    mode: str | None = None,
    copy: bool = False,
) -> Tensor:
    """A 1-D tensor of ``size`` elements over a memory-mapped file, as ``torch.from_file``.

    The mapping owns the memory and stays open until the last view dies. Mapping is O(1) in time
    and memory whatever the file size: pages are read (and, for a private mapping, copied) only
    when touched. A file too short or missing is refused when the mapping is made; but if the file
    is truncated below the mapped range afterwards (by another process, or this one), touching the
    lost pages raises SIGBUS, as with any mmap: the process dies, and no exception can be caught.
    ``copy=True`` reads the range into private memory instead, which a truncation cannot reach.

    Args:
        filename: path of the file (``str``, ``bytes`` or ``os.PathLike``).
        shared: True maps the file shared: writes reach the file, a missing file is created and a
            shorter one grown to ``offset + size * itemsize`` bytes. False or None (the default)
            maps it privately, copy-on-write: writes stay in this process.
        size: number of elements; 0 gives an empty tensor without touching the file.
        dtype: element type, float32 by default.
        requires_grad: carried to frameworks with autograd; floating and complex dtypes only.
        offset: bytes of the file to skip, any number (the mapping starts on a page boundary).
        mode: None for the mapping ``shared`` selects, or ``"r"`` for a read-only mapping
            (``PROT_READ``) and a read-only tensor; the file must then exist and be long enough.
        copy: (a tensorbridge extra) True reads ``size`` elements at ``offset`` once into a
            private, 64-byte aligned allocation (a ``read()``, not a map): the tensor is
            writable (read-only with ``mode="r"``), writes stay in this process, and nothing done
            to the file afterwards reaches it. The file must exist and be long enough; not with
            ``shared=True``, whose writes would have to reach the file.

    Returns:
        A tensor of shape ``(size,)``, writable unless ``mode="r"``.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``offset`` is negative, ``mode`` unknown, ``filename`` holds a NUL byte, or
            ``copy=True`` with ``shared=True``.
        RuntimeError: the file cannot be opened, grown, mapped or read, is not a regular file, is
            shorter than needed, or ``size`` is negative (PyTorch's messages); or
            ``requires_grad`` with an integer dtype.

    Example:
        >>> t = from_file("weights.bin", size=1024, dtype=tensorbridge.float16, mode="r")
        >>> t = from_file("weights.bin", size=1024, dtype=tensorbridge.float16, copy=True)
    """
    path = as_path(filename, _API, position=1)
    shared = _as_shared(shared)
    if type(size) is not int:
        size = as_int(size, _API, "size", argument=True)
    if type(offset) is not int:
        offset = as_int(offset, _API, "offset", argument=True)
    requires_grad = as_bool(requires_grad, _API, "requires_grad")
    copy = as_bool(copy, _API, "copy")
    dtype = float32 if dtype is None else as_dtype(dtype, _API)
    readonly = _as_readonly(mode)
    if copy and shared:
        msg = (
            f"{_API}(): copy=True reads the file into private memory, so writes could not reach "
            f"the file; got shared=True. Pass shared=False (writes stay here), or copy=False."
        )
        raise ValueError(msg)
    if requires_grad and dtype.kind not in "fc":
        msg = f"{_API}(): {GRAD_MSG_CREATE}; got dtype {dtype}. Pass a floating dtype."
        raise RuntimeError(msg)
    nbytes = size * dtype.itemsize
    if size < 0:
        msg = (
            f"{_API}(): unable to mmap {nbytes} bytes from file <{os.fsdecode(path)}>: Cannot "
            f"allocate memory (12); size must be a non-negative number of elements, got {size}."
        )
        raise RuntimeError(msg)
    if offset < 0:
        msg = f"{_API}(): offset must be a non-negative number of bytes; got {offset}."
        raise ValueError(msg)
    if nbytes == 0:
        # PyTorch neither opens nor creates the file for an empty tensor.
        storage = allocate(0)
        storage.readonly = readonly
    elif copy:
        storage = _read(path, offset, nbytes, readonly)
    else:
        storage = _map(path, offset, nbytes, "r" if readonly else "r+" if shared else "c")
    return Tensor._new(storage, 0, (size,), (1,), dtype, _API, requires_grad)


def _as_shared(shared: object) -> bool:
    if shared is None or type(shared) is bool:
        return shared is True
    msg = (
        f"{_API}(): argument 'shared' (position 2) must be bool, not {type(shared).__name__}; "
        f"got {shared!r}."
    )
    raise TypeError(msg)


def _as_readonly(mode: object) -> bool:
    if mode not in _MODES:
        msg = (
            f"{_API}(): mode must be None (the mapping `shared` selects) or 'r' (read-only); "
            f"got {mode!r}."
        )
        raise ValueError(msg)
    return mode == "r"


def _map(path: str | bytes, offset: int, nbytes: int, mode: str) -> Storage:
    """Map ``[offset, offset + nbytes)`` of the file through `map_window`, in PyTorch's words."""
    name = os.fsdecode(path)
    mapped = map_window(path, name, mode, offset=offset, length=nbytes, grow=mode == "r+")
    if isinstance(mapped, MapFailure):
        raise RuntimeError(_message(mapped, name, offset, nbytes, mode))
    return mapped.storage(offset, nbytes)


def _read(path: str | bytes, offset: int, nbytes: int, readonly: bool) -> Storage:
    """``copy=True``: read ``[offset, offset + nbytes)`` through `read_window`, in PyTorch's words."""
    name = os.fsdecode(path)
    read = read_window(path, name, readonly, offset=offset, length=nbytes)
    if isinstance(read, MapFailure):
        raise RuntimeError(_message(read, name, offset, nbytes, "r", verb="read"))
    return read.storage(offset, nbytes)


def _message(
    exc: MapFailure, name: str, offset: int, nbytes: int, mode: str, verb: str = "mmap"
) -> str:
    """PyTorch's message for the step that failed (its text, where it has one, verbatim)."""
    reason = f"{exc.strerror} ({exc.errno})"
    required = offset + nbytes
    if exc.step == "open":
        how = "read-write" if mode == "r+" else "read-only"
        return f"{_API}(): unable to open file <{name}> in {how} mode: {reason}"
    if exc.step == "stat":
        return f"{_API}(): unable to stat the file <{name}>: {reason}"
    if exc.step == "kind" and exc.errno != errno.EISDIR:
        return (
            f"{_API}(): unable to {verb} {nbytes} bytes from file <{name}>: not a regular file; "
            f"got {exc.kind}. Pass the path of a regular file."
        )
    if exc.step == "short":
        grow = "" if mode == "r" else ", or pass shared=True to grow the file"
        what, action = ("mapping", "map") if verb == "mmap" else ("read", "read")
        return (
            f"{_API}(): file <{name}> size <{exc.file_size}> is smaller than the required "
            f"{what} size <{required}> (offset {offset} bytes + {nbytes} bytes of elements); "
            f"{action} fewer elements{grow}."
        )
    if exc.step == "resize":
        return (
            f"{_API}(): unable to resize file <{name}> to the right size: {reason}; got a "
            f"required size of {required} bytes (offset {offset} bytes + {nbytes} bytes of "
            f"elements). Map fewer elements, or pass shared=False for a private mapping."
        )
    return f"{_API}(): unable to {verb} {nbytes} bytes from file <{name}>: {reason}"
