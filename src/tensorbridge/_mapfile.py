"""Opening and memory-mapping files: the one module that does it (`from_file`, safetensors, ``.npy``).

`map_window` holds every rule: the path (``str``, ``bytes`` or ``os.PathLike``, no NUL byte) or an
open descriptor; opening without blocking, so a FIFO cannot hang the caller; refusing anything but a
regular file; checking the file is long enough, or growing it (sparsely) for a shared map that may;
mapping the whole file or a window of it once, never calling ``mmap`` with length 0 (which would map
the whole file); closing the descriptor it opened (the map keeps its own). `read_window` keeps the
same rules but reads the bytes into a new private allocation instead (one ``read()``, no map), for
the loaders' ``copy=True``. `hold_bytes` is the third source, a buffer held in memory
(``safetensors.load``). `MappedFile.storage` then hands out `Storage` objects over byte ranges of
the memory, each starting at its own byte (so a tensor at any byte offset is a zero-copy view) and
each keeping the memory alive: the map is unmapped (the allocation freed, the export released) when
the last storage over it (and the `MappedFile`) dies. Three modes, as ``numpy.memmap`` names them:

* ``"r"``  read-only (``PROT_READ``): tensors are read-only;
* ``"c"``  private copy-on-write: writes stay in this process;
* ``"r+"`` shared: writes reach the file.

A failure comes back as a `MapFailure` naming the step that failed; each caller raises it its own
way: `map_file` and `read_file` (the loaders) as the OS error prefixed with the API and the file name,
`from_file` as PyTorch's ``RuntimeError`` messages.

Two rules hold for every source:

* One export, held from check to use. Every size a caller checks (`MappedFile.size`) and every byte
  it reads (`MappedFile.read`) or views (`MappedFile.storage`) come from the one buffer export (or
  map, or allocation) `MappedFile` holds, taken once and released only when the last storage dies.
  Nothing is measured through one export and used through another: a ``bytearray`` shrunk between
  two exports would leave views past its end. The held export also keeps a ``bytearray`` from being
  resized, a ``memoryview`` from being released and an ``mmap`` from being closed while views live.
* What a map promises. A map is checked when it is made: a file too short or damaged at that moment
  is refused with an exception. A map cannot protect against a file truncated *afterwards* by
  another process (or this one): touching a page past the new end raises SIGBUS, as with any mmap,
  and SIGBUS kills the process; it cannot be caught. `read_window` (``copy=True``) copies the bytes
  into private memory once, so nothing done to the file afterwards reaches the tensors.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import mmap
import os
import re
import stat
from typing import Any, Final, NamedTuple

from . import _capi
from ._device import CPU
from ._native import describe_buffer
from ._storage import (
    READONLY_REQUEST,
    WRITABLE_REQUEST,
    Storage,
    allocate,
    hold_buffer,
)

__all__ = [
    "MODES",
    "MapFailure",
    "MappedFile",
    "as_path",
    "check_mode",
    "hold_bytes",
    "hold_map",
    "map_file",
    "map_window",
    "read_file",
    "read_window",
]

MODES: Final = ("r", "c", "r+")
_ACCESS: Final = {"r": mmap.ACCESS_READ, "c": mmap.ACCESS_COPY, "r+": mmap.ACCESS_WRITE}
# os.O_BINARY exists (and matters) only on Windows; os.O_NONBLOCK only on POSIX, where it makes
# opening a FIFO return at once instead of waiting for a writer (regular files ignore it).
_O_BINARY: Final[int] = getattr(os, "O_BINARY", 0)
_O_NONBLOCK: Final[int] = getattr(os, "O_NONBLOCK", 0)
# Every kind of file but a regular one: what it is called in messages.
_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
# The request `hold_bytes` makes: C-contiguous items with their format and shape, so that the one
# export both describes the bytes (a 1-d buffer of single bytes) and is the memory the views use.
_BYTES_REQUEST: Final = _capi.PY_BUF_C_CONTIGUOUS | _capi.PY_BUF_FORMAT
# Formats of single bytes, with or without a byte-order prefix (ctypes writes "<B", "<c").
_BYTE_FORMAT: Final = re.compile(rb"[@=<>!]?[Bbc]\Z")
# The most bytes one read() asks for (Linux transfers at most 0x7ffff000 per call anyway).
_READ_CHUNK: Final = 1 << 30


class MapFailure(NamedTuple):
    """Why a file could not be opened, checked or mapped (returned, not raised: each caller raises
    its own exception, in its own words).

    Attributes:
        step: what failed: ``"open"``, ``"stat"``, ``"kind"`` (not a regular file), ``"short"``
            (shorter than the window, and not to be grown), ``"resize"`` (growing it), ``"map"``,
            or ``"read"`` (`read_window`).
        errno: the OS error number (None for ``"short"``).
        strerror: the OS's text for it (or what went wrong).
        file_size: the file's length in bytes, where known (-1 otherwise).
        kind: for ``step == "kind"``, what the file is (``"a directory"``, ``"a FIFO"``, ...).
    """

    step: str
    errno: int | None
    strerror: str
    file_size: int = -1
    kind: str = ""


class MappedFile:
    """A file (or a window of it) mapped or read once, or no memory at all for no bytes, or a buffer.

    ``memory`` is a storage over the whole memory: the held buffer export of an ``mmap`` (see
    `hold_map`) or of a buffer (`hold_bytes`), or a private allocation (`read_window`); it is kept,
    through ``held``, until the last storage over it dies. Offsets given to `read` and `storage` are
    offsets in the file; byte 0 of the memory is byte ``base`` of the file. `read` and `storage`
    reach only this memory, never a new export of its exporter (see the module's first rule).

    Attributes:
        name: the file's name, for messages.
        size: the file's length in bytes.
        readonly: True for ``mode="r"``: the storages handed out are read-only.
        held: the owner of the memory (the held export, or the allocation; None when there is no
            memory).
        ptr: address of byte 0 of the memory (0 when there is none).
        length: bytes of memory from ``ptr`` (0 when there is none).
        base: the file offset of byte 0 of the memory.
    """

    __slots__ = ("base", "held", "length", "name", "ptr", "readonly", "size")

    def __init__(
        self, name: str, size: int, readonly: bool, memory: Storage | None, *, base: int = 0
    ) -> None:
        self.name = name
        self.size = size
        self.readonly = readonly
        self.base = base
        if memory is None:
            self.held: object = None
            self.ptr = 0
            self.length = 0
        else:
            self.held = memory.owner
            self.ptr = memory.ptr
            self.length = memory.nbytes

    def read(self, start: int, stop: int) -> bytes:
        """A copy of bytes ``[start, stop)`` of the file (clipped to the memory held)."""
        lo = max(start - self.base, 0)
        hi = min(stop - self.base, self.length)
        if hi <= lo:
            return b""
        return ctypes.string_at(self.ptr + lo, hi - lo)

    def storage(self, start: int, nbytes: int) -> Storage:
        """A storage over bytes ``[start, start + nbytes)`` of the file, keeping the memory alive.

        The caller has checked that the range lies inside the memory.
        """
        return Storage(self.ptr + start - self.base, nbytes, CPU, self.readonly, self.held)


def hold_map(mapping: mmap.mmap, name: str, size: int, readonly: bool, base: int) -> MappedFile:
    """A `MappedFile` over ``mapping``, holding one buffer export of it (writable unless
    ``readonly``) until the last storage dies, so the map cannot be closed under a view."""
    held, _ = hold_buffer(mapping, READONLY_REQUEST if readonly else WRITABLE_REQUEST)
    return MappedFile(name, size, readonly, held, base=base)


def hold_bytes(data: object, name: str, api: str) -> MappedFile:
    """A `MappedFile` over the memory of ``data``, a file held in memory: one export, held.

    ``data`` must be bytes-like: a C-contiguous, 1-d buffer of single bytes (format ``'B'``,
    ``'b'`` or ``'c'``, as ``bytes``, ``bytearray``, an ``mmap``, a 1-d uint8 NumPy array or
    memoryview cast to ``'B'``). The export is requested writable first, then read-only (the
    storages are read-only then); its format, shape and length are read from that same export,
    which is held until the last storage dies: ``size`` is its length, and no other export is
    taken (see the module's first rule).

    Raises:
        TypeError: ``data`` exposes no buffer, or not a bytes-like one (naming what it is).
    """
    held = None
    if type(data) is not bytes:  # bytes is never writable: asking would only cost a BufferError
        # Any exporter error means "try read-only", as in PyTorch and NumPy.
        with contextlib.suppress(Exception):
            held, view = hold_buffer(data, _BYTES_REQUEST | _capi.PY_BUF_WRITABLE)
    if held is None:
        try:
            held, view = hold_buffer(data, _BYTES_REQUEST)
        except Exception as exc:
            if not _capi.PyObject_CheckBuffer(data):
                msg = (
                    f"{api}(): data must be bytes or another object exposing a buffer, not "
                    f"{type(data).__name__}; got {data!r:.80}. Pass the file's bytes."
                )
                raise TypeError(msg) from None
            msg = (
                f"{api}(): data must be bytes-like (a C-contiguous buffer of bytes); got "
                f"{type(data).__name__}, whose exporter refused a C-contiguous buffer "
                f"({type(exc).__name__}: {exc}). Pass bytes(data), a contiguous copy."
            )
            raise TypeError(msg) from None
    _, length, fmt, _, ndim, shape, _, _, _ = describe_buffer(view)
    if ndim != 1 or (fmt is not None and not _BYTE_FORMAT.match(fmt)):
        fmt_text = "B" if fmt is None else fmt.decode("ascii", "replace")
        dims = "" if shape is None else f", shape {list(shape)}"
        del held, view  # the export is released now, not when the exception dies
        msg = (
            f"{api}(): data must be bytes-like, a 1-d buffer of bytes (format 'B', 'b' or 'c'); "
            f"got {type(data).__name__} of format {fmt_text!r}, {ndim}-d{dims}. Pass bytes(data) "
            f"for a copy, or memoryview(data).cast('B') to view the same memory as bytes."
        )
        raise TypeError(msg)
    del view
    return MappedFile(name, length, held.readonly, held)


def check_mode(mode: object, api: str) -> str:
    """Validate a ``mode=`` argument: ``"r"``, ``"c"`` or ``"r+"``."""
    if mode not in MODES:
        msg = (
            f"{api}(): mode must be 'r' (read-only), 'c' (copy-on-write) or 'r+' (writes reach "
            f"the file); got {mode!r}. Pass one of those."
        )
        raise ValueError(msg)
    return str(mode)


def as_path(filename: object, api: str, *, position: int | None = None) -> str | bytes:
    """``os.fspath(filename)``: a `TypeError` for anything else, a `ValueError` for a NUL byte.

    ``position`` words the `TypeError` as PyTorch words a positional argument.
    """
    try:
        path: str | bytes = os.fspath(filename)  # type: ignore[call-overload]
    except TypeError:
        kind = type(filename).__name__
        if position is None:
            msg = (
                f"{api}(): filename must be str, bytes or os.PathLike, not {kind}; "
                f"got {filename!r}. Pass the path of the file."
            )
        else:
            msg = (
                f"{api}(): argument 'filename' (position {position}) must be str, bytes or "
                f"os.PathLike, not {kind}; got {filename!r}."
            )
        raise TypeError(msg) from None
    # The OS would see the name end at the NUL: refuse rather than open (or create) another file.
    if (b"\0" in path) if isinstance(path, bytes) else ("\0" in path):
        msg = (
            f"{api}(): filename must not contain a NUL byte; got {path!r}. Pass the path of the "
            f"file."
        )
        raise ValueError(msg)
    return path


def map_file(filename: Any, mode: str, api: str, *, fd: int | None = None) -> MappedFile:
    """Map the whole file ``filename`` (or the open descriptor ``fd``) in ``mode``.

    Raises:
        TypeError, ValueError: ``filename`` is not a path (see `as_path`).
        FileNotFoundError, PermissionError, IsADirectoryError, OSError: the file cannot be opened,
            is not a regular file, or cannot be mapped (the OS error, its message prefixed with the
            API and the file name).
    """
    if fd is None:
        path = as_path(filename, api)
        source: str | bytes | int = path
        name = os.fsdecode(path)
    else:
        source, name = fd, str(filename)
    mapped = map_window(source, name, mode)
    if isinstance(mapped, MappedFile):
        return mapped
    raise _os_error(mapped, name, "map", api)


def read_file(filename: Any, readonly: bool, api: str) -> MappedFile:
    """Read the whole file ``filename`` into a new private allocation (`read_window`): the copy
    that ``copy=True`` loads, which a later truncation of the file cannot reach.

    ``readonly``: the storages handed out are read-only (the memory itself is private either way).

    Raises:
        TypeError, ValueError: ``filename`` is not a path (see `as_path`).
        FileNotFoundError, PermissionError, IsADirectoryError, OSError: the file cannot be opened,
            is not a regular file, or cannot be read in full (the OS error, its message prefixed
            with the API and the file name).
        MemoryError: there is no memory for the copy.
    """
    path = as_path(filename, api)
    name = os.fsdecode(path)
    mapped = read_window(path, name, readonly)
    if isinstance(mapped, MappedFile):
        return mapped
    raise _os_error(mapped, name, "read", api)


def _os_error(failure: MapFailure, name: str, verb: str, api: str) -> OSError:
    """The loaders' error for a failure: the OS error, prefixed with the API and the file name."""
    if failure.step == "kind" and failure.errno != errno.EISDIR:
        reason = f"not a regular file; got {failure.kind}. Pass the path of a regular file."
    else:
        reason = failure.strerror
    msg = f"{api}(): cannot {verb} file <{name}>: {reason}"
    # OSError(errno, text) is built as the errno's subclass (FileNotFoundError, ...).
    return OSError(failure.errno, msg) if failure.errno else OSError(msg)


def map_window(
    source: str | bytes | int,
    name: str,
    mode: str,
    *,
    offset: int = 0,
    length: int | None = None,
    grow: bool = False,
) -> MappedFile | MapFailure:
    """Map bytes ``[offset, offset + length)`` of a file (all of it when ``length`` is None).

    Args:
        source: the path (already checked by `as_path`), or an open descriptor, which stays open.
        name: the file's name, for messages.
        mode: ``"r"``, ``"c"`` or ``"r+"``.
        offset: first byte of the window, any non-negative number (the map itself starts on an
            allocation-granularity boundary at or below it).
        length: bytes in the window; None maps the whole file from byte 0.
        grow: (``"r+"`` only) create a missing file and extend a short one to the window's end,
            sparsely (no byte is written), instead of refusing it.

    Returns:
        The mapped file (`MappedFile.storage` takes file offsets); or, when the file cannot be
        opened, is not a regular file, is shorter than the window (and not to be grown), cannot be
        grown, or cannot be mapped, a `MapFailure` saying which.
    """
    grow = grow and mode == "r+"
    if isinstance(source, int):
        return _map_fd(source, name, mode, offset, length, grow)
    flags = (os.O_RDWR | (os.O_CREAT if grow else 0)) if mode == "r+" else os.O_RDONLY
    fd = _open(source, flags)
    if isinstance(fd, MapFailure):
        return fd
    try:
        return _map_fd(fd, name, mode, offset, length, grow)
    finally:
        os.close(fd)  # the map keeps a descriptor of its own


def read_window(
    source: str | bytes, name: str, readonly: bool, *, offset: int = 0, length: int | None = None
) -> MappedFile | MapFailure:
    """Read bytes ``[offset, offset + length)`` of a file (all of it when ``length`` is None) into
    a new private, 64-byte aligned allocation: `map_window`'s rules, but a ``read()``, not a map.

    The file is opened, checked and measured as `map_window` does (never created or grown); the
    bytes are then read in full, and the descriptor closed. The allocation is tensorbridge's own, so
    a later truncation or rewrite of the file cannot reach it.

    Args:
        source: the path (already checked by `as_path`).
        name: the file's name, for messages.
        readonly: the storages handed out are read-only.
        offset: first byte to read.
        length: bytes to read; None reads the whole file from byte 0.

    Returns:
        The read file (`MappedFile.storage` takes file offsets); or a `MapFailure` as `map_window`
        gives one (``"short"`` also when the file shrinks while it is read), or ``"read"`` when a
        read fails.
    """
    fd = _open(source, os.O_RDONLY)
    if isinstance(fd, MapFailure):
        return fd
    try:
        size = _regular_size(fd)
        if isinstance(size, MapFailure):
            return size
        stop = size if length is None else offset + length
        if size < stop:
            return MapFailure("short", None, "the file is shorter than the window", size)
        nbytes = max(stop - offset, 0)
        memory = allocate(nbytes)
        if nbytes:
            view = memory.host_view("read_window")
            got = 0
            with io.FileIO(fd, "r", closefd=False) as f:
                f.seek(offset)
                try:
                    while got < nbytes:
                        n = f.readinto(view[got : got + _READ_CHUNK])
                        if not n:  # the file shrank since fstat
                            return MapFailure(
                                "short", None, "the file shrank while it was read", offset + got
                            )
                        got += n
                except OSError as exc:
                    return MapFailure("read", exc.errno, exc.strerror or str(exc), size)
        return MappedFile(name, size, readonly, memory, base=offset)
    finally:
        os.close(fd)


def _open(source: str | bytes, flags: int) -> int | MapFailure:
    """Open without blocking (a FIFO returns at once instead of waiting for a writer)."""
    try:
        return os.open(source, flags | _O_BINARY | _O_NONBLOCK, 0o666)
    except OSError as exc:
        return MapFailure("open", exc.errno, exc.strerror or str(exc))


def _regular_size(fd: int) -> int | MapFailure:
    """The length of the regular file open as ``fd``, or why it is not one."""
    try:
        status = os.fstat(fd)
    except OSError as exc:
        return MapFailure("stat", exc.errno, exc.strerror or str(exc))
    if not stat.S_ISREG(status.st_mode):
        kind = next((what for test, what in _KINDS if test(status.st_mode)), "a special file")
        # mmap(2) answers ENODEV for files that cannot be mapped; a directory keeps EISDIR.
        code = errno.EISDIR if kind == "a directory" else errno.ENODEV
        return MapFailure("kind", code, os.strerror(code), status.st_size, kind)
    return int(status.st_size)


def _map_fd(
    fd: int, name: str, mode: str, offset: int, length: int | None, grow: bool
) -> MappedFile | MapFailure:
    size = _regular_size(fd)
    if isinstance(size, MapFailure):
        return size
    if length is None:
        start, stop = 0, size
    else:
        stop = offset + length
        if size < stop:
            if not grow:
                return MapFailure("short", None, "the file is shorter than the window", size)
            try:
                os.ftruncate(fd, stop)
            except OverflowError:  # past the largest file offset the OS can represent
                return MapFailure("resize", errno.EFBIG, os.strerror(errno.EFBIG))
            except OSError as exc:
                return MapFailure("resize", exc.errno, exc.strerror or str(exc))
            size = stop
        # mmap offsets are multiples of the allocation granularity; the window starts past them.
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
    readonly = mode == "r"
    if stop <= start:
        # mmap with length 0 would map the whole file; an empty window needs no map at all.
        return MappedFile(name, size, readonly, None, base=start)
    try:
        mapping = mmap.mmap(fd, stop - start, access=_ACCESS[mode], offset=start)
    except OSError as exc:
        return MapFailure("map", exc.errno, exc.strerror or str(exc))
    except OverflowError:  # a window larger than the address space can index
        return MapFailure("map", errno.ENOMEM, os.strerror(errno.ENOMEM))
    except ValueError as exc:  # the file shrank between fstat and mmap
        return MapFailure("map", errno.EINVAL, str(exc), size)
    return hold_map(mapping, name, size, readonly, start)
