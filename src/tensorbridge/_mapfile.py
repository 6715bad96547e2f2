"""One memory map of a whole file, shared by every tensor read from it (safetensors and ``.npy``).

`map_file` maps the file once; `MappedFile.storage` hands out `Storage` objects over byte ranges of
the map, each starting at its own byte (so a tensor at any byte offset is a zero-copy view) and each
keeping the map alive: the map is unmapped when the last storage over it (and the `MappedFile`)
dies. Three modes, as ``numpy.memmap`` names them:

* ``"r"``  read-only (``PROT_READ``): tensors are read-only;
* ``"c"``  private copy-on-write: writes stay in this process;
* ``"r+"`` shared: writes reach the file.
"""

from __future__ import annotations

import mmap
import os
import stat
from typing import Any, Final

from ._device import CPU
from ._storage import READONLY_REQUEST, WRITABLE_REQUEST, BufferStorage, Storage, hold_buffer

__all__ = ["MODES", "MappedFile", "check_mode", "map_file"]

MODES: Final = ("r", "c", "r+")
# os.O_BINARY exists (and matters) only on Windows.
_O_BINARY: Final[int] = getattr(os, "O_BINARY", 0)


class MappedFile:
    """A whole file mapped once (or, for an empty file, no map at all), or any buffer in memory.

    ``mapping`` is the ``mmap`` (or any object exporting a buffer, for files held in memory); its
    buffer is held, writable unless ``readonly``, until the last storage over it dies.

    Attributes:
        name: the file's name, for messages.
        size: the file's length in bytes.
        readonly: True for ``mode="r"``.
        held: the held buffer export of the map (None for an empty file).
        ptr: address of byte 0 of the map (0 for an empty file).
    """

    __slots__ = ("_mapping", "held", "name", "ptr", "readonly", "size")

    def __init__(self, name: str, size: int, readonly: bool, mapping: Any) -> None:
        self.name = name
        self.size = size
        self.readonly = readonly
        self._mapping = mapping
        if mapping is None:
            self.held: BufferStorage | None = None
            self.ptr = 0
        else:
            held, view = hold_buffer(mapping, READONLY_REQUEST if readonly else WRITABLE_REQUEST)
            self.held = held
            self.ptr = int(view.buf or 0)

    def read(self, start: int, stop: int) -> bytes:
        """A copy of bytes ``[start, stop)`` of the file (clipped to its end)."""
        if self._mapping is None:
            return b""
        with memoryview(self._mapping) as view:
            return bytes(view[start:stop])

    def storage(self, start: int, nbytes: int) -> Storage:
        """A storage over bytes ``[start, start + nbytes)`` of the map, keeping the map alive.

        The caller has checked that the range lies inside the file.
        """
        return Storage(self.ptr + start, nbytes, CPU, self.readonly, self.held)


def check_mode(mode: object, api: str) -> str:
    """Validate a ``mode=`` argument: ``"r"``, ``"c"`` or ``"r+"``."""
    if mode not in MODES:
        msg = (
            f"{api}(): mode must be 'r' (read-only), 'c' (copy-on-write) or 'r+' (writes reach "
            f"the file); got {mode!r}. Pass one of those."
        )
        raise ValueError(msg)
    return str(mode)


def as_path(filename: object, api: str) -> str | bytes:
    """``os.fspath(filename)``, or a `TypeError` naming the API."""
    try:
        return os.fspath(filename)  # type: ignore[call-overload]
    except TypeError:
        msg = (
            f"{api}(): filename must be str, bytes or os.PathLike, not {type(filename).__name__}; "
            f"got {filename!r}. Pass the path of the file."
        )
        raise TypeError(msg) from None


def map_file(filename: Any, mode: str, api: str, *, fd: int | None = None) -> MappedFile:
    """Map the whole file ``filename`` (or the open descriptor ``fd``) in ``mode``.

    Raises:
        FileNotFoundError, PermissionError, IsADirectoryError, OSError: the file cannot be opened
            or mapped (the OS error, its message prefixed with the API and the file name).
    """
    name = str(filename) if fd is not None else os.fsdecode(filename)
    writable = mode == "r+"
    own_fd = fd is None
    try:
        if own_fd:
            fd = os.open(filename, (os.O_RDWR if writable else os.O_RDONLY) | _O_BINARY)
        assert fd is not None
        status = os.fstat(fd)
        if stat.S_ISDIR(status.st_mode):
            raise IsADirectoryError(21, "Is a directory")
        size = status.st_size
        if size == 0:
            return MappedFile(name, 0, mode == "r", None)
        access = (
            mmap.ACCESS_READ if mode == "r" else mmap.ACCESS_WRITE if writable else mmap.ACCESS_COPY
        )
        mapping = mmap.mmap(fd, size, access=access)
    except OSError as exc:
        msg = f"{api}(): cannot map file <{name}>: {exc.strerror or exc}"
        raise type(exc)(exc.errno, msg) if exc.errno else OSError(msg) from None
    finally:
        if own_fd and fd is not None:
            os.close(fd)  # the map keeps a descriptor of its own
    return MappedFile(name, size, mode == "r", mapping)
