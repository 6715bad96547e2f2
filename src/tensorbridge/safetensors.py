"""safetensors files: the ``safetensors`` package's API, zero-copy, every dtype of the format.

    >>> from tensorbridge.safetensors import load_file, save_file
    >>> save_file({"w": tensorbridge.ones(2, 3, dtype=tensorbridge.bfloat16)}, "model.safetensors")
    >>> load_file("model.safetensors")["w"].dtype
    tensorbridge.bfloat16

A file is mapped once; every tensor is a view of its bytes in the map (no copy, nothing read until
an element is), and the map lives while any tensor does. ``mode`` picks the map: ``"r"`` read-only
(the default: writes raise), ``"c"`` copy-on-write (writes stay in this process), ``"r+"`` shared
(writes reach the file). Every dtype the format defines loads: ``F8_E4M3`` is
``float8_e4m3fn`` and ``F8_E8M0`` is ``float8_e8m0fnu`` (as PyTorch names them), ``F4`` is
``float4_e2m1fn_x2`` with its last dimension halved (two values per byte, as PyTorch loads it),
``C64`` is ``complex64``; ``F6_E2M3`` and ``F6_E3M2``, which tensorbridge has no dtype for, are a
`ValueError` naming them.

What loading promises. A file that is damaged or hostile when it is loaded (any header, any
layout, any size) is a `ValueError` naming the file and the tensor, never a crash. A map promises
no more than mmap does: if the file is truncated while tensors map it (by another process, or by
this one), touching a page past its new end raises SIGBUS, which kills the process and cannot be
caught (the ``safetensors`` package's ``load_file`` copies the file, so it survives). Where another
process may rewrite or truncate the file in place, pass ``copy=True`` to `load_file` or
`safe_open`: the file is read once into private memory (a ``read()``, no map), so nothing done to
it afterwards reaches the tensors. `save_file` never truncates: it writes a new file and renames it
over the old one, which maps of the old file keep.

`load` views a buffer held in memory: bytes-like data only (``bytes``, ``bytearray``, a 1-d uint8
array: a C-contiguous 1-d buffer of single bytes), as the package's ``load`` takes ``bytes``. Its
size is read from the one buffer export the tensors view, held while any tensor lives: the bytes
checked are the bytes used, and a ``bytearray`` cannot be resized meanwhile (``BufferError``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any, Final

from . import _safetensors
from ._device import as_device
from ._mapfile import MappedFile, as_path, check_mode, hold_bytes, map_file, read_file
from ._safetensors import Header, build_tensor, parse_header
from ._tensor import Tensor

__all__ = ["load", "load_file", "safe_open", "save", "save_file"]

_FRAMEWORKS: Final = {
    "tb": "tb",
    "tensorbridge": "tb",
    "pt": "pt",
    "torch": "pt",
    "np": "np",
    "numpy": "np",
    "jax": "jax",
    "flax": "jax",
}


def _check_host(api: str) -> None:
    if sys.byteorder != "little":
        msg = (
            f"{api}(): safetensors data is little-endian and this host is big-endian; got "
            f"sys.byteorder={sys.byteorder!r}. Load the file on a little-endian host."
        )
        raise ValueError(msg)


def _check_device(device: object, api: str) -> None:
    dev = as_device(device, api)
    if dev.type != "cpu":
        msg = (
            f"{api}(): tensorbridge maps safetensors files into host memory, so device must be "
            f"'cpu'; got {device!r}. Load on the CPU and move the tensors with your framework."
        )
        raise ValueError(msg)


def _check_copy(copy: object, mode: str, api: str) -> bool:
    if type(copy) is not bool:
        msg = (
            f"{api}(): copy must be True (read the file into memory) or False (map it); got "
            f"{copy!r}. Pass a bool."
        )
        raise TypeError(msg)
    if copy and mode == "r+":
        msg = (
            f"{api}(): copy=True reads the file into private memory, so writes could not reach "
            f"the file; got mode='r+'. Pass mode='c' for writable tensors, or copy=False."
        )
        raise ValueError(msg)
    return copy


def _open(filename: Any, mode: str, copy: bool, api: str) -> tuple[MappedFile, Header]:
    _check_host(api)
    path = as_path(filename, api)
    mapped = read_file(path, mode == "r", api) if copy else map_file(path, mode, api)
    header, _ = parse_header(mapped.read, mapped.size, mapped.name, api)
    return mapped, header


def load_file(
    filename: str | os.PathLike[str], device: Any = "cpu", *, mode: str = "r", copy: bool = False
) -> dict[str, Tensor]:
    """Every tensor of a safetensors file: zero-copy views of one memory map, or of one copy.

    Mapped (the default), loading costs the same for a file of any size and reads nothing until an
    element is read. A file damaged before it is loaded is a `ValueError`; but if the file is
    truncated while tensors map it, touching the lost bytes raises SIGBUS, as with any mmap, and
    the process dies (a signal, not an exception). ``copy=True`` reads the whole file once into
    private memory instead, as the ``safetensors`` package's ``load_file`` does: nothing done to
    the file afterwards reaches the tensors.

    Args:
        filename: the file (``str`` or ``os.PathLike``).
        device: ``"cpu"`` (the only device: the file is mapped or read into host memory).
        mode: ``"r"`` read-only (writes raise), ``"c"`` copy-on-write (writes stay in this
            process) or ``"r+"`` (writes reach the file; not with ``copy=True``).
        copy: (keyword-only, a tensorbridge extra) False maps the file; True reads it into one
            private, 64-byte aligned allocation (a ``read()``, not a map) that the tensors view;
            with ``mode="r"`` they are read-only, with ``mode="c"`` writable.

    Returns:
        The tensors by name, in the order of their data in the file.

    Raises:
        ValueError: the file is not a valid safetensors file (naming it and the tensor), holds a
            dtype tensorbridge lacks, or ``mode``/``device`` is unsupported, or ``copy=True`` with
            ``mode="r+"``.
        TypeError: ``copy`` is not a bool.
        OSError: the file cannot be opened, mapped or read.

    Example:
        >>> tensors = load_file("model.safetensors", copy=True)  # survives a rewrite in place
    """
    api = "load_file"
    check_mode(mode, api)
    copy = _check_copy(copy, mode, api)
    _check_device(device, api)
    mapped, header = _open(filename, mode, copy, api)
    return {e.name: build_tensor(mapped, e, api) for e in header.entries}


def load(data: Any) -> dict[str, Tensor]:
    """Every tensor of a safetensors file held in memory: views of ``data``'s memory, no copy.

    ``data`` must be bytes-like: ``bytes``, ``bytearray``, an ``mmap``, a 1-d uint8 NumPy array or
    any C-contiguous, 1-d buffer of single bytes (format ``'B'``, ``'b'`` or ``'c'``); the
    ``safetensors`` package's ``load`` takes ``bytes``. Other buffers (``array.array('f')``, a
    memoryview cast to ``'i'``, a 2-d array) are refused rather than reinterpreted: pass
    ``memoryview(x).cast('B')`` to view their bytes, or ``bytes(x)`` for a copy.

    One buffer export is taken and held from the size check until the last tensor dies: the bytes
    the header is checked against are the bytes the tensors view, and meanwhile a ``bytearray``
    cannot be resized (``BufferError``). The tensors are read-only for ``bytes`` and read-only
    buffers, writable for a writable buffer (writes reach it).

    Raises:
        TypeError: ``data`` exposes no buffer, or not a bytes-like one.
        ValueError: the bytes are not a valid safetensors file.
    """
    api = "load"
    _check_host(api)
    mapped = hold_bytes(data, "<bytes>", api)
    header, _ = parse_header(mapped.read, mapped.size, mapped.name, api)
    return {e.name: build_tensor(mapped, e, api) for e in header.entries}


def _as_tensors(tensors: object, api: str) -> dict[str, Tensor]:
    if not isinstance(tensors, Mapping):
        msg = (
            f"{api}(): tensors must be a dict of str to tensor, not {type(tensors).__name__}; "
            f"got {tensors!r:.80}. Pass {{'name': tensor, ...}}."
        )
        raise TypeError(msg)
    out: dict[str, Tensor] = {}
    for name, value in tensors.items():
        if type(name) is not str or name == "__metadata__":
            msg = (
                f"{api}(): tensor names must be str other than '__metadata__'; got {name!r}. "
                f"Rename the tensor."
            )
            raise (TypeError if type(name) is not str else ValueError)(msg)
        if isinstance(value, Tensor):
            out[name] = value
        else:
            from ._convert import asarray

            out[name] = asarray(value)
    return out


def _as_metadata(metadata: object, api: str) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(
        type(k) is str and type(v) is str for k, v in metadata.items()
    ):
        msg = (
            f"{api}(): metadata must be None or a dict of str to str; got {metadata!r:.80}. "
            f"Convert keys and values to str."
        )
        raise TypeError(msg)
    return dict(metadata)


def save(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    """A safetensors file's bytes, exactly as the ``safetensors`` package writes them.

    Args:
        tensors: names to tensors (tensorbridge tensors, or anything `tensorbridge.asarray`
            takes); any layout is written C-contiguous.
        metadata: free-form str-to-str annotations, stored as ``__metadata__``.

    Raises:
        TypeError: a name, tensor or metadata entry has the wrong type.
        ValueError: a dtype the format cannot name (complex32, complex128, float8_e4m3,
            float8_e3m4, float8_e4m3b11fnuz), or a 0-d float4_e2m1fn_x2 tensor.
    """
    api = "save"
    head, views, total = _safetensors.serialize(
        _as_tensors(tensors, api), _as_metadata(metadata, api), api
    )
    out = bytearray(total)
    out[: len(head)] = head
    pos = len(head)
    for view in views:
        out[pos : pos + view.nbytes] = view
        pos += view.nbytes
    return bytes(out)


def save_file(
    tensors: Mapping[str, Any],
    filename: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a safetensors file, exactly as the ``safetensors`` package writes it.

    The file is written under a temporary name in the same directory and then renamed over
    ``filename``, so tensors still mapped from an older file of that name keep their data.

    Raises:
        TypeError, ValueError: as `save`.
        OSError: the file cannot be written.
    """
    api = "save_file"
    path = os.fsdecode(as_path(filename, api))
    head, views, _ = _safetensors.serialize(
        _as_tensors(tensors, api), _as_metadata(metadata, api), api
    )
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            for view in views:
                f.write(view)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


class SafeSlice:
    """A tensor of an open file, not yet built: its shape and dtype as the file states them, and
    indexing that returns a view of only the selected elements (like ``PySafeSlice``)."""

    __slots__ = ("_entry", "_owner")

    def __init__(self, owner: safe_open, entry: _safetensors.Entry) -> None:
        self._owner = owner
        self._entry = entry

    def get_shape(self) -> list[int]:
        """The shape as the file states it (F4 counts 4-bit values)."""
        return list(self._entry.shape)

    def get_dtype(self) -> str:
        """The format's dtype name (``"F32"``, ``"BF16"``, ...)."""
        return self._entry.code

    def __getitem__(self, index: Any) -> Any:
        """The indexed part, as a view of the map (an advanced index copies, as for tensors)."""
        owner = self._owner
        t = build_tensor(owner._mapped_or_raise("get_slice"), self._entry, "get_slice")
        return owner._convert(t[index])

    def __repr__(self) -> str:
        return f"<SafeSlice {self._entry.name!r} {self._entry.code} {list(self._entry.shape)}>"


class safe_open:
    """A safetensors file opened lazily: tensors are built (as views of one map, or of one copy
    with ``copy=True``) when asked for.

    Args:
        filename: the file (``str`` or ``os.PathLike``).
        framework: what `get_tensor` returns: ``"tb"`` (tensorbridge tensors, the default),
            ``"np"``/``"numpy"``, ``"pt"``/``"torch"`` or ``"jax"``/``"flax"``: each a zero-copy
            conversion where the framework can share the memory.
        device: ``"cpu"`` (the only device).
        mode: ``"r"``, ``"c"`` or ``"r+"`` as in `load_file`; None (the default) is ``"c"`` for
            PyTorch, which has no read-only tensors, and ``"r"`` otherwise.
        copy: (keyword-only) False maps the file, as `load_file` does (a truncation of the file
            while tensors map it is a SIGBUS); True reads the whole file into private memory once,
            at open, and the tensors view that copy, which nothing done to the file reaches.

    Example:
        >>> with safe_open("model.safetensors", framework="np") as f:
        ...     emb = f.get_slice("embedding")[:, :8]
    """

    def __init__(
        self,
        filename: str | os.PathLike[str],
        framework: str = "tb",
        device: Any = "cpu",
        *,
        mode: str | None = None,
        copy: bool = False,
    ) -> None:
        api = "safe_open"
        kind = _FRAMEWORKS.get(framework) if isinstance(framework, str) else None
        if kind is None:
            msg = (
                f"{api}(): framework must be one of {', '.join(map(repr, _FRAMEWORKS))}; got "
                f"{framework!r}. Pass 'tb' for tensorbridge tensors."
            )
            raise ValueError(msg)
        if mode is None:
            mode = "c" if kind == "pt" else "r"
        check_mode(mode, api)
        copy = _check_copy(copy, mode, api)
        _check_device(device, api)
        self._framework = kind
        self._mapped: MappedFile | None
        self._mapped, self._header = _open(filename, mode, copy, api)

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self._mapped = None  # the tensors already built keep the map alive

    def _mapped_or_raise(self, api: str) -> MappedFile:
        mapped = self._mapped
        if mapped is None:
            msg = f"{api}(): the file is closed; got a closed safe_open. Open it again."
            raise ValueError(msg)
        return mapped

    def _entry(self, name: str, api: str) -> _safetensors.Entry:
        self._mapped_or_raise(api)
        entry = self._header.by_name.get(name)
        if entry is None:
            mapped = self._mapped_or_raise(api)
            msg = f"{api}(): file <{mapped.name}> has no tensor named {name!r}. See keys()."
            raise KeyError(msg)
        return entry

    def _convert(self, t: Tensor) -> Any:
        kind = self._framework
        if kind == "np":
            return t.numpy()
        if kind == "pt":
            return t.torch()
        if kind == "jax":
            return t.jax()
        return t

    def keys(self) -> list[str]:
        """The tensor names, sorted."""
        return sorted(self._header.by_name)

    def offset_keys(self) -> list[str]:
        """The tensor names in the order of their data in the file."""
        return [e.name for e in self._header.entries]

    def metadata(self) -> dict[str, str] | None:
        """The ``__metadata__`` annotations, or None when the file has none."""
        meta = self._header.metadata
        return None if meta is None else dict(meta)

    def get_tensor(self, name: str) -> Any:
        """The tensor ``name``, a zero-copy view of the map (converted for the framework)."""
        entry = self._entry(name, "get_tensor")
        return self._convert(build_tensor(self._mapped_or_raise("get_tensor"), entry, "get_tensor"))

    def get_tensors(self) -> dict[str, Any]:
        """Every tensor, by name, in offset order."""
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def get_slice(self, name: str) -> SafeSlice:
        """A lazy handle on tensor ``name``: index it to get only the part needed."""
        return SafeSlice(self, self._entry(name, "get_slice"))
