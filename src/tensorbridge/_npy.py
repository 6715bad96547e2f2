"""``.npy`` files (NumPy's format, versions 1.0, 2.0 and 3.0): `load_npy` and `save_npy`.

A file is the magic ``\\x93NUMPY``, a major and minor version byte, the header length (2 bytes
little-endian in 1.0, 4 bytes in 2.0 and 3.0), the header (a Python dict literal, latin-1 in 1.0
and 2.0, UTF-8 in 3.0, with the keys ``descr``, ``fortran_order`` and ``shape``), then the data.

What loads: every dtype the format can name that tensorbridge has (``b1``, ``i1``-``i8``,
``u1``-``u8``, ``f2``, ``f4``, ``f8``, ``c8``, ``c16``); C order, and Fortran order as strides (no
copy). Refused with a `ValueError`: object, structured, string, datetime and ``V`` (raw void)
dtypes, long double, headers longer than NumPy's limit of 10,000 characters, and shapes past
int64 (a size, or the element count with zeros left out, over ``2**63 - 1``: NumPy's ``np.load``
cannot hold them either; `tensorbridge._layout.check_sizes` is the rule). Big-endian data
(``>``) is loaded as a byte-swapped private copy in native order (with ``mode="r"`` the copy is
read-only); ``mode="r+"`` refuses it, since writes could not reach the file. Bytes after the data
are ignored, as NumPy ignores them.

What loading promises: a file damaged or hostile when it is loaded is a `ValueError` naming it,
never a crash. A map (``mode="r"``, ``"c"``, ``"r+"``) promises no more than mmap does: if the file
is truncated while the tensor maps it, touching a lost page raises SIGBUS, which kills the process
and cannot be caught. ``mode=None`` reads the data into private memory instead (a ``read()``, no
map), so nothing done to the file afterwards reaches the tensor.

What saves: every dtype NumPy can name. bfloat16, complex32, the float8 types and
float4_e2m1fn_x2 have no ``descr`` NumPy's loader understands (ml_dtypes arrays save as raw
``V`` bytes, which load back as void), so `save_npy` refuses them with a `ValueError`; save a
same-size unsigned integer view (``t.view(tensorbridge.uint16)``) or use safetensors instead.
The header is written exactly as ``numpy.save`` writes it.
"""

from __future__ import annotations

import ast
import os
import re
import struct
import sys
from typing import Any, Final

from . import _dtype
from ._dtype import DType
from ._layout import MAX_NDIM, check_sizes, contiguous_strides
from ._mapfile import check_mode, map_file
from ._storage import allocate
from ._tensor import Tensor

__all__ = ["load_npy", "save_npy"]

_MAGIC: Final = b"\x93NUMPY"
_MAX_HEADER: Final = 10_000  # NumPy's default max_header_size
_ALIGN: Final = 64
_GROWTH: Final = 21  # numpy.lib.format.GROWTH_AXIS_MAX_DIGITS
_DESCR: Final = re.compile(r"([<>|=]?)([biufc])(\d+)\Z")
_BIG_ENDIAN: Final = sys.byteorder == "big"


def _bad(api: str, source: str, what: str, got: object) -> ValueError:
    text = repr(got)
    if len(text) > 200:
        text = text[:200] + "..."
    return ValueError(
        f"{api}(): invalid .npy file <{source}>: {what}; got {text}. The file is damaged or not "
        f"an .npy file; write it again with save_npy() or numpy.save()."
    )


def _parse_descr(descr: object, api: str, source: str) -> tuple[DType, bool]:
    """The dtype and whether its data is byte-swapped relative to this host."""
    match = _DESCR.match(descr) if type(descr) is str else None
    dtype = None
    if match is not None:
        order, kind, size = match.groups()
        dtype = _dtype.BY_TYPESTR.get(kind + size)
        if dtype is not None and dtype.itemsize > 1:
            if order == "|":
                dtype = None  # NumPy writes "|" for single bytes only
            elif order in "<>":
                return dtype, (order == ">") != _BIG_ENDIAN
    if dtype is None:
        what = (
            "descr is not a dtype tensorbridge loads (bool, int8-int64, uint8-uint64, float16, "
            "float32, float64, complex64, complex128; object, structured, string, datetime and "
            "void arrays are not tensors)"
        )
        raise _bad(api, source, what, descr)
    return dtype, False


def _read_header(
    read: Any, size: int, api: str, source: str
) -> tuple[DType, bool, bool, tuple[int, ...], int]:
    """(dtype, swapped, fortran_order, shape, data offset) of a file read by ``read(a, b)``."""
    prefix = read(0, 8)
    if len(prefix) < 8 or prefix[:6] != _MAGIC:
        raise _bad(api, source, "it does not start with the magic string \\x93NUMPY", prefix[:8])
    version = (prefix[6], prefix[7])
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise _bad(api, source, "unknown format version (1.0, 2.0 and 3.0 exist)", version)
    fmt, encoding = (
        ("<H", "latin1")
        if version == (1, 0)
        else ("<I", "latin1" if version == (2, 0) else "utf-8")
    )
    width = struct.calcsize(fmt)
    raw_len = read(8, 8 + width)
    if len(raw_len) < width:
        raise _bad(api, source, "the file ends inside the header length", size)
    (hlen,) = struct.unpack(fmt, raw_len)
    start = 8 + width
    if start + hlen > size:
        raise _bad(
            api, source, f"the header length runs past the end of the {size}-byte file", hlen
        )
    if hlen > 4 * _MAX_HEADER + 64:
        raise _bad(
            api, source, f"the header is over NumPy's limit of {_MAX_HEADER} characters", hlen
        )
    try:
        text = read(start, start + hlen).decode(encoding)
    except UnicodeDecodeError as exc:
        raise _bad(api, source, f"the header is not {encoding} ({exc.reason})", hlen) from None
    if len(text) > _MAX_HEADER:
        raise _bad(
            api, source, f"the header is over NumPy's limit of {_MAX_HEADER} characters", len(text)
        )
    try:
        d = ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        raise _bad(
            api, source, f"the header is not a Python literal ({type(exc).__name__})", text[:80]
        ) from None
    if type(d) is not dict or set(d) != {"descr", "fortran_order", "shape"}:
        what = "the header must be a dict with exactly the keys 'descr', 'fortran_order', 'shape'"
        raise _bad(api, source, what, text[:80])
    shape, fortran = d["shape"], d["fortran_order"]
    if type(shape) is not tuple or not all(type(s) is int and s >= 0 for s in shape):
        raise _bad(api, source, "shape must be a tuple of non-negative ints", shape)
    if len(shape) > MAX_NDIM:
        raise _bad(api, source, f"tensorbridge supports at most {MAX_NDIM} dimensions", len(shape))
    check_sizes(shape, api, f".npy file <{source}>: shape")
    if type(fortran) is not bool:
        raise _bad(api, source, "fortran_order must be True or False", fortran)
    dtype, swapped = _parse_descr(d["descr"], api, source)
    return dtype, swapped, fortran, shape, start + hlen


def _nbytes(shape: tuple[int, ...], dtype: DType) -> int:
    count = 1
    for s in shape:
        count *= s
    return count * dtype.itemsize


def _strides(shape: tuple[int, ...], fortran: bool) -> tuple[int, ...]:
    if not fortran:
        return contiguous_strides(shape)
    return tuple(reversed(contiguous_strides(tuple(reversed(shape)))))


def _swap(data: bytearray | memoryview, dtype: DType) -> None:
    """Reverse the bytes of every scalar in place (each half of a complex separately)."""
    step = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    if step <= 1:
        return
    src = bytes(data)
    for i in range(step):
        data[i::step] = src[step - 1 - i :: step]


def load_npy(file: Any, *, mode: str | None = "r") -> Tensor:
    """A tensor from an ``.npy`` file: a view of a memory map by default, or a private copy.

    Mapped (the default), the tensor is a view of the file's pages: loading costs the same for a
    file of any size, but if the file is truncated while the tensor lives, touching the lost bytes
    raises SIGBUS, as with any mmap, and the process dies (a signal, not an exception).
    ``mode=None`` is the copying load, one argument away: the data is read once into a private,
    64-byte aligned allocation (``np.load``'s behaviour), which nothing done to the file reaches.

    Args:
        file: a path (``str``, ``bytes``, ``os.PathLike``) or an open binary file. A file object
            with a ``fileno()`` is mapped from its current position; one without (``io.BytesIO``)
            needs ``mode=None``. After reading, a file object is positioned after the data.
        mode: ``"r"`` read-only map (writes raise), ``"c"`` copy-on-write, ``"r+"`` writes reach
            the file, or None: the data is read into private memory (writable; a later
            truncation of the file cannot reach it).

    Returns:
        The tensor: C order, or Fortran order as strides over the same bytes.

    Raises:
        ValueError: the file is not a valid ``.npy`` file, its dtype is not a tensor dtype, or
            ``mode`` is unknown.
        OSError: the file cannot be opened or mapped.

    Example:
        >>> t = load_npy("weights.npy")           # mapped read-only
        >>> t = load_npy("weights.npy", mode=None)  # read into memory
    """
    api = "load_npy"
    if mode is not None:
        check_mode(mode, api)
    is_path = isinstance(file, (str, bytes, os.PathLike))
    if not is_path and not (hasattr(file, "read") or hasattr(file, "fileno")):
        msg = (
            f"{api}(): file must be a path or an open binary file, not {type(file).__name__}; "
            f"got {file!r:.80}. Pass the path of the .npy file."
        )
        raise TypeError(msg)
    if mode is None:
        return _read_private(file, is_path, api)
    if is_path:
        mapped = map_file(file, mode, api)
        base = 0
    else:
        try:
            fd = file.fileno()
        except (AttributeError, OSError, ValueError):
            msg = (
                f"{api}(): cannot memory-map {type(file).__name__}, which has no file descriptor; "
                f"got mode={mode!r}. Pass mode=None to read it into memory."
            )
            raise ValueError(msg) from None
        # Mapped first: map_file refuses a pipe or other non-regular file before tell() would.
        mapped = map_file(getattr(file, "name", "<file>"), mode, api, fd=fd)
        base = file.tell()

    def read(a: int, b: int) -> bytes:
        return mapped.read(base + a, base + b)

    dtype, swapped, fortran, shape, offset = _read_header(
        read, mapped.size - base, api, mapped.name
    )
    nbytes = _nbytes(shape, dtype)
    if base + offset + nbytes > mapped.size:
        what = f"the data needs {nbytes} bytes after the header but the file has {mapped.size - base - offset}"
        raise _bad(api, mapped.name, what, list(shape))
    if not is_path:
        file.seek(base + offset + nbytes)
    strides = _strides(shape, fortran)
    if swapped:
        if mode == "r+":
            msg = (
                f"{api}(): file <{mapped.name}> holds big-endian data, which tensorbridge loads as a "
                f"byte-swapped copy, so writes could not reach the file; got mode='r+'. Use mode='c' "
                f"or mode=None."
            )
            raise ValueError(msg)
        storage = allocate(nbytes)
        view = storage.host_view(api)
        view[:] = mapped.read(base + offset, base + offset + nbytes)
        _swap(view, dtype)
        storage.readonly = mode == "r"
    else:
        storage = mapped.storage(base + offset, nbytes)
    return Tensor._new(storage, 0, shape, strides, dtype, api)


def _read_private(file: Any, is_path: bool, api: str) -> Tensor:
    """``mode=None``: read the header, then the data into a new allocation."""
    if is_path:
        with open(file, "rb") as f:
            return _read_stream(f, os.fsdecode(file), api)
    return _read_stream(file, str(getattr(file, "name", "<file>")), api)


def _read_stream(f: Any, source: str, api: str) -> Tensor:
    head = f.read(12)
    if not isinstance(head, bytes):
        msg = f"{api}(): the file must be opened in binary mode; got {type(head).__name__} from read(). Open it with 'rb'."
        raise TypeError(msg)
    width = 2 if head[6:8] == b"\x01\x00" else 4
    hlen = struct.unpack("<H" if width == 2 else "<I", head[8 : 8 + width].ljust(width, b"\0"))[0]
    limit = 4 * _MAX_HEADER + 64
    rest = head[8 + width :]
    need = hlen - len(rest)
    extra = f.read(min(need, limit + 1)) if need > 0 else b""
    blob = head + extra
    dtype, swapped, fortran, shape, offset = _read_header(
        lambda a, b: blob[a:b], len(blob) if need <= limit else 1 << 62, api, source
    )
    nbytes = _nbytes(shape, dtype)
    leftover = blob[offset:]
    remaining = _remaining(f)
    if remaining is not None and len(leftover) + remaining < nbytes:
        what = f"the data needs {nbytes} bytes after the header but the file has {len(leftover) + remaining}"
        raise _bad(api, source, what, list(shape))
    if remaining is None:  # unknown length: read in bounded chunks before allocating
        chunks = [leftover]
        got = len(leftover)
        while got < nbytes:
            chunk = f.read(min(nbytes - got, 1 << 26))
            if not chunk:
                raise _bad(
                    api,
                    source,
                    f"the file ends after {got} of the {nbytes} data bytes",
                    list(shape),
                )
            chunks.append(chunk)
            got += len(chunk)
        leftover = b"".join(chunks)
    storage = allocate(nbytes)
    view = storage.host_view(api)
    got = min(len(leftover), nbytes)
    view[:got] = leftover[:got]
    while got < nbytes:
        n = f.readinto(view[got:]) if hasattr(f, "readinto") else None
        if n is None:
            chunk = f.read(nbytes - got)
            n = len(chunk)
            view[got : got + n] = chunk
        if not n:
            what = f"the file ends after {got} of the {nbytes} data bytes"
            raise _bad(api, source, what, list(shape))
        got += n
    if swapped:
        _swap(view, dtype)
    return Tensor._new(storage, 0, shape, _strides(shape, fortran), dtype, api)


def _remaining(f: Any) -> int | None:
    """Bytes left after the position of a seekable file, or None when it cannot tell."""
    try:
        if not f.seekable():
            return None
        here = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(here)
    except (AttributeError, OSError, ValueError):
        return None
    return int(end - here)


def _header(t: Tensor, api: str) -> bytes:
    dtype = t.dtype
    if dtype.typestr is None:
        msg = (
            f"{api}(): the .npy format cannot name {dtype} (NumPy's loader has no such dtype); "
            f"got dtype {dtype}. Save t.view(tensorbridge.uint{dtype.bits}) and view it back "
            f"after loading, or use tensorbridge.safetensors."
        )
        raise ValueError(msg)
    shape = tuple(t.shape)
    header = f"{{'descr': {dtype.typestr!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    if shape:
        header += " " * (_GROWTH - len(repr(shape[0])))
    for fmt, version in (("<H", b"\x01\x00"), ("<I", b"\x02\x00")):
        raw = header.encode("latin1")
        hlen = len(raw) + 1
        pad = _ALIGN - ((8 + struct.calcsize(fmt) + hlen) % _ALIGN)
        try:
            size = struct.pack(fmt, hlen + pad)
        except struct.error:
            continue
        return _MAGIC + version + size + raw + b" " * pad + b"\n"
    msg = f"{api}(): the header is too long; got {len(header)} characters."  # 2**32 characters
    raise ValueError(msg)


def save_npy(file: Any, tensor: Any) -> None:
    """Write ``tensor`` to an ``.npy`` file, C-contiguous, exactly as ``numpy.save`` would.

    Args:
        file: a path (``str``, ``bytes``, ``os.PathLike``; no ``.npy`` is appended) or a binary
            file open for writing.
        tensor: a host tensor of any layout, of a dtype NumPy can name.

    Raises:
        TypeError: ``tensor`` is not a tensor.
        ValueError: its dtype has no ``.npy`` name (bfloat16, complex32, float8, float4).
    """
    api = "save_npy"
    if not isinstance(tensor, Tensor):
        msg = (
            f"{api}(): tensor must be a tensorbridge.Tensor, not {type(tensor).__name__}; got "
            f"{tensor!r:.80}. Convert it with tensorbridge.asarray()."
        )
        raise TypeError(msg)
    head = _header(tensor, api)
    data = None
    if tensor.numel():
        data = tensor.contiguous().as_memoryview().cast("B")  # native order, as descr says
    if isinstance(file, (str, bytes, os.PathLike)):
        with open(file, "wb") as f:
            f.write(head)
            if data is not None:
                f.write(data)
        return
    file.write(head)
    if data is not None:
        file.write(data)
