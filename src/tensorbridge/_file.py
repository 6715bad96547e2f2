"""`from_file`: a tensor over a memory-mapped file.

The file is mapped with ``mmap`` and the storage holds the mapping's buffer export (as `frombuffer`
does), so mapping a file of any size costs the same: nothing is read until an element is, and the
mapping stays open while any view lives. Three kinds of mapping:

* private copy-on-write (``shared=False`` or ``None``, PyTorch's default): writes stay here;
* shared (``shared=True``): writes reach the file; a missing file is created, a short one grown;
* read-only (``mode="r"``): a ``PROT_READ`` mapping and a read-only tensor.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from typing import Any, Final

from ._args import GRAD_MSG_CREATE, as_bool, as_int
from ._device import CPU
from ._dtype import DType, as_dtype, float32
from ._storage import READONLY_REQUEST, WRITABLE_REQUEST, Storage, allocate, hold_buffer
from ._tensor import Tensor

__all__ = ["from_file"]

_API: Final = "from_file"
_MODES: Final = (None, "r")
# os.O_BINARY exists (and matters) only on Windows.
_O_BINARY: Final[int] = getattr(os, "O_BINARY", 0)


def from_file(
    filename: str | bytes | os.PathLike[Any],
    shared: bool | None = None,
    size: int = 0,
    *,
    dtype: DType | None = None,
    requires_grad: bool = False,
    offset: int = 0,
    mode: str | None = None,
) -> Tensor:
    """A 1-D tensor of ``size`` elements over a memory-mapped file, as ``torch.from_file``.

    The mapping owns the memory and stays open until the last view dies. Mapping is O(1) in time
    and memory whatever the file size: pages are read (and, for a private mapping, copied) only
    when touched. If another process truncates the file below the mapped range, touching the lost
    pages raises SIGBUS, as with any mmap.

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

    Returns:
        A tensor of shape ``(size,)``, writable unless ``mode="r"``.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``offset`` is negative or ``mode`` unknown.
        RuntimeError: the file cannot be opened or mapped, is shorter than needed, or ``size`` is
            negative (PyTorch's messages); or ``requires_grad`` with an integer dtype.

    Example:
        >>> t = from_file("weights.bin", size=1024, dtype=tensorbridge.float16, mode="r")
    """
    path = _as_path(filename)
    shared = _as_shared(shared)
    if size.__class__ is not int:
        size = as_int(size, _API, "size", argument=True)
    if offset.__class__ is not int:
        offset = as_int(offset, _API, "offset", argument=True)
    requires_grad = as_bool(requires_grad, _API, "requires_grad")
    dtype = float32 if dtype is None else as_dtype(dtype, _API)
    readonly = _as_readonly(mode)
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
    else:
        storage = _map(
            path,
            offset,
            nbytes,
            writable_file=shared and not readonly,
            copy_on_write=not shared,
            readonly=readonly,
        )
    return Tensor._new(storage, 0, (size,), (1,), dtype, _API, requires_grad)


def _as_path(filename: object) -> str | bytes:
    try:
        return os.fspath(filename)  # type: ignore[call-overload]
    except TypeError:
        msg = (
            f"{_API}(): argument 'filename' (position 1) must be str, bytes or os.PathLike, "
            f"not {type(filename).__name__}; got {filename!r}."
        )
        raise TypeError(msg) from None


def _as_shared(shared: object) -> bool:
    if shared is None or shared.__class__ is bool:
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


def _map(
    path: str | bytes,
    offset: int,
    nbytes: int,
    *,
    writable_file: bool,
    copy_on_write: bool,
    readonly: bool,
) -> Storage:
    """Map ``[offset, offset + nbytes)`` of the file and hold the mapping for a new storage."""
    name = os.fsdecode(path)
    flags = os.O_RDWR | os.O_CREAT if writable_file else os.O_RDONLY
    try:
        fd = os.open(path, flags | _O_BINARY, 0o666)
    except OSError as exc:
        how = "read-write" if writable_file else "read-only"
        msg = f"{_API}(): unable to open file <{name}> in {how} mode: {exc.strerror} ({exc.errno})"
        raise RuntimeError(msg) from None
    try:
        required = offset + nbytes
        status = os.fstat(fd)
        if stat.S_ISDIR(status.st_mode):
            msg = (
                f"{_API}(): unable to mmap {nbytes} bytes from file <{name}>: "
                f"{os.strerror(errno.EISDIR)} ({errno.EISDIR})"
            )
            raise RuntimeError(msg)
        if status.st_size < required:
            if not writable_file:
                grow = "" if readonly else ", or pass shared=True to grow the file"
                msg = (
                    f"{_API}(): file <{name}> size <{status.st_size}> is smaller than the "
                    f"required mapping size <{required}> (offset {offset} bytes + {nbytes} "
                    f"bytes of elements); map fewer elements{grow}."
                )
                raise RuntimeError(msg)
            os.ftruncate(fd, required)  # grows the file sparsely: no byte is written
        # mmap offsets are multiples of the allocation granularity; the storage starts past them.
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        access = (
            mmap.ACCESS_READ
            if readonly
            else mmap.ACCESS_COPY
            if copy_on_write
            else mmap.ACCESS_WRITE
        )
        try:
            mapping = mmap.mmap(fd, required - start, access=access, offset=start)
        except OSError as exc:
            msg = (
                f"{_API}(): unable to mmap {nbytes} bytes from file <{name}>: {exc.strerror} "
                f"({exc.errno})"
            )
            raise RuntimeError(msg) from None
    finally:
        os.close(fd)  # the mapping keeps a descriptor of its own
    held, view = hold_buffer(mapping, READONLY_REQUEST if readonly else WRITABLE_REQUEST)
    return Storage(view.buf + (offset - start), nbytes, CPU, readonly, held)
