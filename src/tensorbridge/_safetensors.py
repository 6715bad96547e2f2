"""The safetensors format: header parsing and validation, dtype names, serialization.

A safetensors file is an 8-byte little-endian header length ``n``, ``n`` bytes of UTF-8 JSON (an
object: ``"__metadata__"`` maps str to str; every other key names a tensor as
``{"dtype": "F32", "shape": [2, 3], "data_offsets": [start, stop]}`` with offsets relative to the
data that follows the header), then the data. Validation follows the reference implementation
(the ``safetensors`` crate): the header is at most 100,000,000 bytes; sorted by offsets, the
tensors tile the data exactly, from 0 to the end of the file, with no gap, overlap or trailing
byte; each tensor's byte length is its element count times its element size, counted without
overflowing 64 bits. tensorbridge also refuses duplicate keys, which the crate resolves by keeping
the last one. A string that escapes a lone UTF-16 surrogate (``"\\ud800"``, which Python's JSON
decoder takes and which is no Unicode text) is refused, as the crate's JSON parser refuses it.
Every size a header brings in must fit int64, as `tensorbridge._layout.check_sizes` rules (DLPack,
PyTorch and NumPy hold sizes in int64; PyTorch cannot unpack a larger one): each dimension, the
element count (zeros aside) and both data_offsets.

Writing follows the crate byte for byte: tensors sorted by descending dtype rank (the order of the
crate's ``Dtype`` enum, largest alignment first) then by name, compact JSON, the header padded with
spaces to a multiple of 8 bytes. ``__metadata__`` comes first, its entries in the caller's order
(the crate writes them in hash order).
"""

from __future__ import annotations

import json
import re
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from . import _dtype
from ._dtype import DType
from ._layout import MAX_NDIM, MAX_SIZE, check_sizes, contiguous_strides
from ._mapfile import MappedFile
from ._tensor import Tensor

__all__ = ["Entry", "Header", "build_tensor", "dtype_code", "parse_header", "serialize"]

MAX_HEADER_SIZE: Final = 100_000_000
_U64: Final = 1 << 64

# The format's dtypes in the crate's enum order (the order writing sorts by, descending), with the
# element size in bits and the tensorbridge dtype (None: tensorbridge has none).
_FORMAT: Final[tuple[tuple[str, int, DType | None], ...]] = (
    ("BOOL", 8, _dtype.bool),
    ("F4", 4, _dtype.float4_e2m1fn_x2),
    ("F6_E2M3", 6, None),
    ("F6_E3M2", 6, None),
    ("U8", 8, _dtype.uint8),
    ("I8", 8, _dtype.int8),
    ("F8_E5M2", 8, _dtype.float8_e5m2),
    ("F8_E4M3", 8, _dtype.float8_e4m3fn),
    ("F8_E8M0", 8, _dtype.float8_e8m0fnu),
    ("F8_E4M3FNUZ", 8, _dtype.float8_e4m3fnuz),
    ("F8_E5M2FNUZ", 8, _dtype.float8_e5m2fnuz),
    ("I16", 16, _dtype.int16),
    ("U16", 16, _dtype.uint16),
    ("F16", 16, _dtype.float16),
    ("BF16", 16, _dtype.bfloat16),
    ("I32", 32, _dtype.int32),
    ("U32", 32, _dtype.uint32),
    ("F32", 32, _dtype.float32),
    ("C64", 64, _dtype.complex64),
    ("F64", 64, _dtype.float64),
    ("I64", 64, _dtype.int64),
    ("U64", 64, _dtype.uint64),
)
_BITS: Final = {code: bits for code, bits, _ in _FORMAT}
_RANK: Final = {code: rank for rank, (code, _, _) in enumerate(_FORMAT)}
_TO_DTYPE: Final = {code: d for code, _, d in _FORMAT}
_TO_CODE: Final = {d: code for code, _, d in _FORMAT if d is not None}

_HINT: Final = "The file is damaged or not a safetensors file; write it again with save_file()"


class Entry:
    """One tensor of a header: its name, dtype code, shape as the file states it, byte range."""

    __slots__ = ("code", "name", "shape", "start", "stop")

    def __init__(self, name: str, code: str, shape: tuple[int, ...], start: int, stop: int) -> None:
        self.name = name
        self.code = code
        self.shape = shape
        self.start = start  # absolute byte offsets in the file
        self.stop = stop


class Header:
    """A validated header: the tensors in offset order, a name lookup and the metadata."""

    __slots__ = ("by_name", "entries", "metadata")

    def __init__(
        self, entries: list[Entry], by_name: dict[str, Entry], metadata: dict[str, str] | None
    ) -> None:
        self.entries = entries
        self.by_name = by_name
        self.metadata = metadata


# The first argument of the ValueError `_pairs` raises for a duplicate key, and for a string that
# holds a lone surrogate (a module-private exception class would be an exception users could meet
# that tensorbridge does not export).
_DUPLICATE: Final = object()
_SURROGATE: Final = object()
# A lone surrogate: what Python's JSON decoder makes of "\ud800", which serde_json (the crate's
# parser) refuses. A valid escaped pair ("\ud83d\ude00") decodes to one character, not this.
# The escapes are the regex's, in a raw string: no surrogate is in the source (Cython compiles
# string constants as UTF-8, which cannot hold one).
_LONE_SURROGATE: Final = re.compile(r"[\ud800-\udfff]")


def _lone_surrogate(value: object) -> str | None:
    """The first string in ``value`` (a str, or a list of them at any depth) holding a lone
    surrogate; objects in lists were checked by their own `_pairs` call."""
    if type(value) is str:
        return value if _LONE_SURROGATE.search(value) else None
    if type(value) is list:
        for item in value:
            found = _lone_surrogate(item)
            if found is not None:
                return found
    return None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(_DUPLICATE, key)
        bad = _lone_surrogate(key)
        if bad is None and type(value) is not dict:
            bad = _lone_surrogate(value)
        if bad is not None:
            raise ValueError(_SURROGATE, bad)
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    msg = f"{name} is not JSON"
    raise ValueError(msg)


def _bad(api: str, source: str, what: str, got: object, tensor: str | None = None) -> ValueError:
    where = "" if tensor is None else f" tensor {tensor!r}:"
    text = repr(got)
    if len(text) > 200:
        text = text[:200] + "..."
    return ValueError(
        f"{api}(): invalid safetensors file <{source}>:{where} {what}; got {text}. {_HINT}."
    )


def _is_uint(value: object) -> bool:
    return type(value) is int and 0 <= value < _U64


def parse_header(
    read: Callable[[int, int], bytes], size: int, source: str, api: str
) -> tuple[Header, int]:
    """Read and validate the header of a safetensors file of ``size`` bytes.

    Args:
        read: ``read(start, stop)`` returns bytes ``[start, stop)`` of the file.
        size: the file's length in bytes.
        source: the file's name, for messages.
        api: the public function, for messages.

    Returns:
        The header and the absolute offset of the data (8 + header length).

    Raises:
        ValueError: anything in the header or the layout is invalid (naming file and tensor).
    """
    if size < 8:
        raise _bad(api, source, "the file is shorter than the 8-byte header length", size)
    (n,) = struct.unpack("<Q", read(0, 8))
    if n > MAX_HEADER_SIZE:
        raise _bad(api, source, f"header length is over {MAX_HEADER_SIZE} bytes", n)
    if 8 + n > size:
        raise _bad(api, source, f"header length runs past the end of the {size}-byte file", n)
    raw = read(8, 8 + n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(api, source, f"the header is not UTF-8 ({exc.reason})", raw[:64]) from None
    try:
        obj = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        if exc.args and exc.args[0] is _DUPLICATE:
            raise _bad(api, source, "the header names a key twice", exc.args[1]) from None
        if exc.args and exc.args[0] is _SURROGATE:
            what = (
                "the header is not valid JSON text: a string escapes a lone UTF-16 surrogate "
                "(\\ud800-\\udfff without its pair), which is no Unicode character (the "
                "safetensors package refuses it too)"
            )
            raise _bad(api, source, what, exc.args[1]) from None
        raise _bad(api, source, f"the header is not JSON ({exc})", text[:64]) from None
    if type(obj) is not dict:
        raise _bad(api, source, "the header is not a JSON object", text[:64])
    metadata = obj.pop("__metadata__", None)
    if metadata is not None and (
        type(metadata) is not dict or any(type(v) is not str for v in metadata.values())
    ):
        raise _bad(api, source, "__metadata__ must map str to str", metadata)
    entries = [_entry(name, info, source, api) for name, info in obj.items()]
    entries.sort(key=_offsets)
    base = 8 + n
    end = _check_layout(entries, base, source, api)
    if base + end != size:
        what = (
            f"the tensors' data ends at byte {base + end} but the file has {size} bytes "
            f"(the data must cover the file exactly)"
        )
        raise _bad(api, source, what, size)
    return Header(entries, {e.name: e for e in entries}, metadata), base


def _check_layout(entries: list[Entry], base: int, source: str, api: str) -> int:
    """Check that the sorted entries tile the data; make their offsets absolute; the data end."""
    end = 0
    for e in entries:
        if e.start != end or e.stop < e.start:
            what = (
                "its data_offsets are reversed"
                if e.stop < e.start
                else "its data overlaps the previous tensor's"
                if e.start < end
                else "its data does not start where the previous tensor's ends (a gap)"
            )
            raise _bad(api, source, what, [e.start, e.stop], e.name)
        end = e.stop
        count = 1
        for dim in e.shape:  # below 2**63, with every size: `_entry` checked them
            count *= dim
        bits = count * _BITS[e.code]
        if bits >= _U64:
            raise _bad(api, source, "its byte size overflows 64 bits", list(e.shape), e.name)
        if bits % 8:
            what = f"{e.code} elements of shape {list(e.shape)} do not fill whole bytes"
            raise _bad(api, source, what, list(e.shape), e.name)
        if e.stop - e.start != bits // 8:
            what = (
                f"data_offsets span {e.stop - e.start} bytes but shape {list(e.shape)} of "
                f"{e.code} needs {bits // 8}"
            )
            raise _bad(api, source, what, [e.start, e.stop], e.name)
        e.start += base
        e.stop += base
    return end


def _offsets(e: Entry) -> tuple[int, int]:
    return (e.start, e.stop)


def _entry(name: str, info: Any, source: str, api: str) -> Entry:
    if type(info) is not dict:
        raise _bad(api, source, "its entry is not a JSON object", info, name)
    try:
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    except KeyError as exc:
        raise _bad(api, source, f"its entry has no {exc.args[0]!r}", info, name) from None
    if type(code) is not str or code not in _BITS:
        what = f"unknown dtype (the format defines {', '.join(_BITS)})"
        raise _bad(api, source, what, code, name)
    if type(shape) is not list or not all(_is_uint(s) for s in shape):
        what = "its shape must be a list of non-negative integers below 2**64"
        raise _bad(api, source, what, shape, name)
    if len(shape) > MAX_NDIM:
        raise _bad(
            api, source, f"tensorbridge supports at most {MAX_NDIM} dimensions", len(shape), name
        )
    check_sizes(shape, api, f"safetensors file <{source}>: tensor {name!r}: shape")
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or not all(_is_uint(o) and o <= MAX_SIZE for o in offsets)
    ):
        what = "data_offsets must be two non-negative integers that fit int64 (below 2**63)"
        raise _bad(api, source, what, offsets, name)
    return Entry(name, code, tuple(shape), offsets[0], offsets[1])


def build_tensor(mapped: MappedFile, e: Entry, api: str) -> Tensor:
    """The zero-copy view of one validated entry, on a storage of exactly its bytes."""
    dtype = _TO_DTYPE[e.code]
    shape = e.shape
    if dtype is None:
        msg = (
            f"{api}(): file <{mapped.name}>: tensor {e.name!r} has dtype {e.code}, which "
            f"tensorbridge has no dtype for; got {e.code!r}. Read its raw bytes with a library "
            f"that supports {e.code}."
        )
        raise ValueError(msg)
    if dtype is _dtype.float4_e2m1fn_x2:
        # The format counts 4-bit values; float4_e2m1fn_x2 packs two per element along the last
        # dimension (as PyTorch loads them).
        if not shape or shape[-1] % 2:
            msg = (
                f"{api}(): file <{mapped.name}>: tensor {e.name!r} of F4 values has shape "
                f"{list(shape)}, whose last dimension is not even, so it cannot be loaded as "
                f"float4_e2m1fn_x2 (two values per byte); got {list(shape)}. Read it as uint8 "
                f"bytes instead."
            )
            raise ValueError(msg)
        shape = (*shape[:-1], shape[-1] // 2)
    storage = mapped.storage(e.start, e.stop - e.start)
    return Tensor._new(storage, 0, shape, contiguous_strides(shape), dtype, api)


def dtype_code(dtype: DType) -> str | None:
    """The format's name for a tensorbridge dtype, or None where the format has none."""
    return _TO_CODE.get(dtype)


def _data_view(t: Tensor) -> memoryview | None:
    """The tensor's bytes in C order, little-endian (None when it has none)."""
    if t.numel() == 0:
        return None
    mv = t.contiguous().as_memoryview().cast("B")
    if sys.byteorder != "little" and t.itemsize > 1:  # the format is little-endian
        step = t.itemsize // 2 if t.dtype.kind == "c" else t.itemsize
        swapped = bytearray(mv)
        for i in range(step):
            swapped[i::step] = mv[step - 1 - i :: step]
        mv = memoryview(swapped)
    return mv


def serialize(
    tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None, api: str
) -> tuple[bytes, list[memoryview], int]:
    """The header (with its length prefix), the data views in file order and the total size."""
    items = []
    for name, t in tensors.items():
        code = dtype_code(t.dtype)
        if code is None:
            msg = (
                f"{api}(): the safetensors format has no dtype for {t.dtype} (tensor {name!r}); "
                f"got {t.dtype}. Convert it first, e.g. t.to(tensorbridge.complex64)."
            )
            raise ValueError(msg)
        shape = tuple(t.shape)
        if code == "F4":
            if not shape:
                msg = (
                    f"{api}(): a 0-d float4_e2m1fn_x2 tensor (tensor {name!r}) holds two 4-bit "
                    f"values, which the format's F4 shape cannot state; got shape []. Reshape it "
                    f"to shape [1]."
                )
                raise ValueError(msg)
            shape = (*shape[:-1], shape[-1] * 2)
        items.append((name, code, shape, t))
    items.sort(key=lambda item: (-_RANK[item[1]], item[0]))
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    views: list[memoryview] = []
    offset = 0
    for name, code, shape, t in items:
        nbytes = t.numel() * t.itemsize
        header[name] = {
            "dtype": code,
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
        view = _data_view(t)
        if view is not None:
            views.append(view)
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_SIZE:
        msg = (
            f"{api}(): the header would be {len(text)} bytes, over the format's limit of "
            f"{MAX_HEADER_SIZE}; got {len(items)} tensors. Split them over several files."
        )
        raise ValueError(msg)
    head = struct.pack("<Q", len(text)) + text
    return head, views, len(head) + offset
