"""Opening and memory-mapping files: the one module that does it (`from_file`, safetensors, ``.npy``).

`map_window` holds every rule: the path (``str``, ``bytes`` or ``os.PathLike``, no NUL byte) or an
open descriptor; opening without blocking, so a FIFO cannot hang the caller; refusing anything but a
regular file; checking the file is long enough, or growing it (sparsely) for a shared map that may;
mapping the whole file or a window of it once, never calling ``mmap`` with length 0 (which would map
the whole file); closing the descriptor it opened (the map keeps its own). `MappedFile.storage` then
hands out `Storage` objects over byte ranges of the map, each starting at its own byte (so a tensor
at any byte offset is a zero-copy view) and each keeping the map alive: the map is unmapped when the
last storage over it (and the `MappedFile`) dies. Three modes, as ``numpy.memmap`` names them:

* ``"r"``  read-only (``PROT_READ``): tensors are read-only;
* ``"c"``  private copy-on-write: writes stay in this process;
* ``"r+"`` shared: writes reach the file.

A failure comes back as a `MapFailure` naming the step that failed; each caller raises it its own
way: `map_file` (the loaders) as the OS error prefixed with the API and the file name, `from_file`
as PyTorch's ``RuntimeError`` messages.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from typing import Any, Final, NamedTuple

from ._device import CPU
from ._storage import READONLY_REQUEST, WRITABLE_REQUEST, BufferStorage, Storage, hold_buffer

__all__ = ["MODES", "MapFailure", "MappedFile", "as_path", "check_mode", "map_file", "map_window"]

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


class MapFailure(NamedTuple):
    """Why a file could not be opened, checked or mapped (returned, not raised: each caller raises
    its own exception, in its own words).

    Attributes:
        step: what failed: ``"open"``, ``"stat"``, ``"kind"`` (not a regular file), ``"short"``
            (shorter than the window, and not to be grown), ``"resize"`` (growing it) or ``"map"``.
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
    """A file (or a window of it) mapped once, or no map at all for no bytes, or any buffer.

    ``mapping`` is the ``mmap`` (or any object exporting a buffer, for files held in memory); its
    buffer is held, writable unless ``readonly``, until the last storage over it dies. Offsets
    given to `read` and `storage` are offsets in the file; byte 0 of the map is byte ``base`` of
    the file.

    Attributes:
        name: the file's name, for messages.
        size: the file's length in bytes.
        readonly: True for ``mode="r"``.
        held: the held buffer export of the map (None when nothing is mapped).
        ptr: address of byte 0 of the map (0 when nothing is mapped).
        base: the file offset of byte 0 of the map.
    """

    __slots__ = ("_mapping", "base", "held", "name", "ptr", "readonly", "size")

    def __init__(
        self, name: str, size: int, readonly: bool, mapping: Any, *, base: int = 0
    ) -> None:
        self.name = name
        self.size = size
        self.readonly = readonly
        self.base = base
        self._mapping = mapping
        if mapping is None:
            self.held: BufferStorage | None = None
            self.ptr = 0
        else:
            held, view = hold_buffer(mapping, READONLY_REQUEST if readonly else WRITABLE_REQUEST)
            self.held = held
            self.ptr = int(view.buf or 0)

    def read(self, start: int, stop: int) -> bytes:
        """A copy of bytes ``[start, stop)`` of the file (clipped to the end of the map)."""
        if self._mapping is None:
            return b""
        with memoryview(self._mapping) as view:
            return bytes(view[start - self.base : stop - self.base])

    def storage(self, start: int, nbytes: int) -> Storage:
        """A storage over bytes ``[start, start + nbytes)`` of the file, keeping the map alive.

        The caller has checked that the range lies inside the map.
        """
        return Storage(self.ptr + start - self.base, nbytes, CPU, self.readonly, self.held)


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
    if mapped.step == "kind" and mapped.errno != errno.EISDIR:
        reason = f"not a regular file; got {mapped.kind}. Pass the path of a regular file."
    else:
        reason = mapped.strerror
    msg = f"{api}(): cannot map file <{name}>: {reason}"
    # OSError(errno, text) is built as the errno's subclass (FileNotFoundError, ...).
    raise OSError(mapped.errno, msg) if mapped.errno else OSError(msg)


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
    try:
        fd = os.open(source, flags | _O_BINARY | _O_NONBLOCK, 0o666)
    except OSError as exc:
        return MapFailure("open", exc.errno, exc.strerror or str(exc))
    try:
        return _map_fd(fd, name, mode, offset, length, grow)
    finally:
        os.close(fd)  # the map keeps a descriptor of its own


def _map_fd(
    fd: int, name: str, mode: str, offset: int, length: int | None, grow: bool
) -> MappedFile | MapFailure:
    try:
        status = os.fstat(fd)
    except OSError as exc:
        return MapFailure("stat", exc.errno, exc.strerror or str(exc))
    if not stat.S_ISREG(status.st_mode):
        kind = next((what for test, what in _KINDS if test(status.st_mode)), "a special file")
        # mmap(2) answers ENODEV for files that cannot be mapped; a directory keeps EISDIR.
        code = errno.EISDIR if kind == "a directory" else errno.ENODEV
        return MapFailure("kind", code, os.strerror(code), status.st_size, kind)
    size = status.st_size
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
    return MappedFile(name, size, readonly, mapping, base=start)
