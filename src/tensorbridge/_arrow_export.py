"""Arrow export: ``Tensor.__arrow_c_schema__`` and ``Tensor.__arrow_c_array__`` (Arrow PyCapsule interface).

A 1-d tensor is exported as a primitive Arrow array over its own memory (null count 0, no validity
buffer, the storage offset folded into the data pointer); an n-d tensor as the canonical extension
type ``arrow.fixed_shape_tensor``: a fixed-size list of ``prod(shape[1:])`` values over the same
memory, one list per index of the first dimension, with the trailing shape in the extension
metadata (``{"shape": [...]}``). Two cases get a private copy, because Arrow cannot describe the
memory as it is: ``bool`` (Arrow booleans are bit-packed) and layouts that are not row-major
contiguous (a slice with a step, a transpose, a broadcast, negative strides).

Who owns what. Each capsule points at a struct inside one ctypes block that tensorbridge owns; the
block also holds the buffer and child pointer arrays, and each struct's ``private_data`` is a key
(an address inside the block, never inside the struct, so the struct may be moved) of a registry
entry (`_exports.hold_managed`) holding the block and the tensor's storage (or the copy). The
struct's ``release`` callback drops that entry, after releasing the children, and marks the struct
released, exactly once; a consumer that moves the struct releases its copy, found through the same
key. The capsules have no destructor (a Python destructor would run while a consumer's error is
pending and turn it into ``SystemError``): `_exports.hold_capsule` watches each one, and once it
is unreferenced the reap drops an `_Unconsumed` guard, which releases the struct if no consumer
moved it out (Arrow PyCapsule interface, "Lifetime Semantics").

The release callbacks are ctypes callbacks kept alive for the life of the process
(`_capi.keep_forever`): Arrow may call them at any time, on any thread, even while the
interpreter shuts down. Arrow aborts the process when a release callback returns with the struct
not marked released, and a consumer may call it while its own exception is pending, when every
call of a C function from Python fails. So each callback marks the structs released and drops
their entries using only attribute and item access, never a call; the exception a consumer had
pending is then still replaced by ``SystemError``, which no callback written in Python can avoid.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import sys
import threading
from typing import Any, Final

from . import _capi, _exports, _layout, _memory, _native
from ._arrow_abi import (
    ARROW_ARRAY,
    ARROW_BOOL,
    ARROW_FLAG_NULLABLE,
    ARROW_SCHEMA,
    ArrowArray,
    ArrowSchema,
)
from ._dtype import BY_ARROW_FORMAT, DType
from ._errors import short_repr
from ._storage import Storage, allocate

__all__ = [
    "EXTENSION_NAME",
    "KEY_METADATA",
    "KEY_NAME",
    "export_array",
    "export_schema",
    "read_metadata",
    "release_counts",
]

EXTENSION_NAME: Final = b"arrow.fixed_shape_tensor"
KEY_NAME: Final = b"ARROW:extension:name"
KEY_METADATA: Final = b"ARROW:extension:metadata"
_LIST_SIZE_MAX: Final = 2**31 - 1  # Arrow's fixed-size list size is an int32
_CHILD_NAME: Final = b"item"  # the child field name pyarrow gives list types

# How many schemas and arrays (base structs and children) have been released: for tests and doctor.
# Consumers release on any thread at once, and `+=` on a list item is a read and a write: the lock
# keeps every count, with or without the GIL.
_RELEASED: Final = [0, 0]
_RELEASED_LOCK: Final = threading.Lock()


def release_counts() -> dict[str, int]:
    """How many exported Arrow schemas and arrays (children included) have been released."""
    return {"schemas": _RELEASED[0], "arrays": _RELEASED[1]}


# -------------------------------------------------------------------------------------------------
# Release callbacks


def _release_function(struct_type: type[ctypes.Structure], slot: int) -> Any:
    """The release callback for ``struct_type``: children first, then the struct itself.

    A consumer may call it on any thread, and while its own exception is pending: it reaches C
    through `_native.void_callback`, which keeps that exception where the build allows (a struct
    left unreleased makes Arrow abort the process, so the release itself always runs). What the
    body calls is bound as defaults: it may run while module globals are being cleared.
    """

    def release(
        address: int | None,
        _struct: Any = struct_type,
        _forget: Any = _exports.forget_managed,
        _released: list[int] = _RELEASED,
        _lock: Any = _RELEASED_LOCK,
        _slot: int = slot,
    ) -> None:
        if not address:
            return
        struct = _struct.from_address(address)
        if not struct.release:
            return  # already released: never twice
        released = 1
        for i in range(struct.n_children):
            child = struct.children[i][0]
            if child.release:
                child.release = None
                _forget(child.private_data)
                released += 1
        key = struct.private_data
        struct.release = None
        _forget(key)  # may free the exported memory: last
        with _lock:
            _released[_slot] += released

    return release


_release_schema = _release_function(ArrowSchema, 0)
_release_array = _release_function(ArrowArray, 1)
# The addresses consumers call (held for the life of the process).
_SCHEMA_RELEASE: Final = _native.void_callback(_release_schema)
_ARRAY_RELEASE: Final = _native.void_callback(_release_array)


class _Unconsumed:
    """Dropped by the reap once its capsule is unreferenced: releases the struct unless a
    consumer moved it out (which marks the capsule's copy released)."""

    __slots__ = ("address", "block", "release")

    def __init__(self, address: int, block: object, release: Any) -> None:
        self.address = address
        self.block = block  # the struct lives in it
        self.release = release

    def __del__(self) -> None:
        self.release(self.address)


# -------------------------------------------------------------------------------------------------
# Blocks


class _SchemaBlock(ctypes.Structure):
    """A schema, its one possible child and the child pointer; the key bytes name the entries."""

    _fields_ = (
        ("base", ArrowSchema),
        ("child", ArrowSchema),
        ("children", ctypes.POINTER(ArrowSchema) * 1),
        ("base_key", ctypes.c_char),
        ("child_key", ctypes.c_char),
    )


class _ArrayBlock(ctypes.Structure):
    """An array, its one possible child, their buffer pointers and the child pointer."""

    _fields_ = (
        ("base", ArrowArray),
        ("child", ArrowArray),
        ("base_buffers", ctypes.c_void_p * 2),
        ("child_buffers", ctypes.c_void_p * 2),
        ("children", ctypes.POINTER(ArrowArray) * 1),
    )


def _metadata(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """The Arrow C data interface metadata encoding: int32 count, then int32-length-prefixed
    keys and values, integers in native byte order."""
    out = [len(pairs).to_bytes(4, sys.byteorder)]
    for key, value in pairs:
        for part in (key, value):
            out.append(len(part).to_bytes(4, sys.byteorder))
            out.append(part)
    return b"".join(out)


def _extension_json(shape: tuple[int, ...]) -> bytes:
    return json.dumps({"shape": list(shape[1:])}, separators=(",", ":")).encode()


# -------------------------------------------------------------------------------------------------
# Checks


def _value_format(dtype: DType, api: str) -> bytes:
    """The Arrow format of the element type; dtypes Arrow cannot name are a `TypeError`."""
    if dtype.kind == "b":
        return ARROW_BOOL
    if dtype.arrow is not None:
        return dtype.arrow
    if dtype.kind == "c":
        fix = (
            "export the real and imaginary parts interleaved as floats "
            "(t.view(tensorbridge.float32) for complex64)"
        )
    elif dtype.name.startswith("float4"):
        fix = "export the packed bytes with t.view(tensorbridge.uint8)"
    else:
        fix = (
            f"convert it with t.to(tensorbridge.float32), or export the raw bits with "
            f"t.view(tensorbridge.uint{dtype.itemsize * 8})"
        )
    msg = (
        f"{api}(): Arrow has no type for {dtype}; got a tensor of dtype {dtype}. Arrow names "
        f"bool, int8..int64, uint8..uint64 and float16/32/64: {fix}."
    )
    raise TypeError(msg)


def _check_shape(shape: tuple[int, ...], api: str) -> None:
    if not shape:
        msg = (
            f"{api}(): a 0-d tensor has no Arrow array form (Arrow arrays have a length); got "
            f"shape []. Export t.reshape(1) for a one-element array."
        )
        raise ValueError(msg)
    if len(shape) > 1 and math.prod(shape[1:]) > _LIST_SIZE_MAX:
        msg = (
            f"{api}(): each of the {shape[0]} rows of shape {list(shape)} holds "
            f"{math.prod(shape[1:])} values, more than an Arrow fixed-size list can "
            f"({_LIST_SIZE_MAX}). Reshape the tensor so that the trailing dimensions hold fewer."
        )
        raise ValueError(msg)


# -------------------------------------------------------------------------------------------------
# Schema


def _fill_schema(
    block: _SchemaBlock, shape: tuple[int, ...], value_format: bytes, extension: bool
) -> tuple[object, ...]:
    """Write the schema (and, for n-d, its child) into ``block``; return the strings it points at."""
    base, child = block.base, block.child
    strings: list[object] = []

    def text(value: bytes) -> int:
        buf = ctypes.create_string_buffer(value)
        strings.append(buf)
        return ctypes.addressof(buf)

    empty = text(b"")
    base.name = ctypes.cast(empty, ctypes.c_char_p)
    base.flags = ARROW_FLAG_NULLABLE
    base.release = _SCHEMA_RELEASE
    base.private_data = ctypes.addressof(block) + _SchemaBlock.base_key.offset
    if len(shape) == 1:
        base.format = ctypes.cast(text(value_format), ctypes.c_char_p)
        return tuple(strings)
    base.format = ctypes.cast(text(b"+w:%d" % math.prod(shape[1:])), ctypes.c_char_p)
    if extension:
        metadata = _metadata([(KEY_NAME, EXTENSION_NAME), (KEY_METADATA, _extension_json(shape))])
        buf = ctypes.create_string_buffer(metadata, len(metadata))
        strings.append(buf)
        base.metadata = ctypes.addressof(buf)
    base.n_children = 1
    block.children[0] = ctypes.pointer(child)
    base.children = ctypes.cast(ctypes.addressof(block.children), type(base.children))
    child.format = ctypes.cast(text(value_format), ctypes.c_char_p)
    child.name = ctypes.cast(text(_CHILD_NAME), ctypes.c_char_p)
    child.flags = ARROW_FLAG_NULLABLE
    child.release = _SCHEMA_RELEASE
    child.private_data = ctypes.addressof(block) + _SchemaBlock.child_key.offset
    return tuple(strings)


def _new_schema(shape: tuple[int, ...], value_format: bytes, extension: bool, keep: object) -> Any:
    block = _SchemaBlock()
    strings = _fill_schema(block, shape, value_format, extension)
    entry = (strings, keep)
    address = ctypes.addressof(block)
    _exports.hold_managed(block.base.private_data, block, entry, ARROW_SCHEMA)
    if block.base.n_children:
        _exports.hold_managed(block.child.private_data, block, entry, ARROW_SCHEMA)
    capsule = _native.capsule_new(address, ARROW_SCHEMA, None)
    guard = _Unconsumed(address, block, _release_schema)
    _exports.hold_capsule(address, block, guard, ARROW_SCHEMA, capsule)
    return capsule


def export_schema(shape: tuple[int, ...], dtype: DType, api: str = "__arrow_c_schema__") -> Any:
    """``Tensor.__arrow_c_schema__``: an ``"arrow_schema"`` capsule of the tensor's Arrow type.

    The type `export_array` gives the tensor: the element type for 1-d, the
    ``arrow.fixed_shape_tensor`` extension type for n-d. It describes the type only, so it is
    available for tensors on any device.

    Raises:
        TypeError: Arrow has no type for the dtype (bfloat16, float8, float4, complex).
        ValueError: a 0-d tensor, or trailing dimensions too large for a fixed-size list.
    """
    value_format = _value_format(dtype, api)
    _check_shape(shape, api)
    return _new_schema(shape, value_format, True, None)


# -------------------------------------------------------------------------------------------------
# Requested schemas


def read_metadata(address: int | None) -> dict[bytes, bytes]:
    """The key/value pairs of a foreign schema's metadata (native-endian int32 lengths)."""
    if not address:
        return {}
    count = ctypes.c_int32.from_address(address).value
    pairs: dict[bytes, bytes] = {}
    pos = address + 4
    for _ in range(max(0, min(count, 64))):
        parts = []
        for _ in range(2):
            n = ctypes.c_int32.from_address(pos).value
            if not 0 <= n <= 1 << 20:
                return pairs  # malformed: no extension type can be read from it
            parts.append(ctypes.string_at(pos + 4, n))
            pos += 4 + n
        pairs[parts[0]] = parts[1]
    return pairs


def _describe(schema: ArrowSchema, depth: int = 0) -> tuple[Any, ...]:
    """What identifies a type, names and flags aside: format, extension name and parsed
    metadata, and the children's descriptions (two levels at most: all this module exports)."""
    meta = read_metadata(schema.metadata)
    ext_name = meta.get(KEY_NAME)
    ext_meta: Any = meta.get(KEY_METADATA)
    if ext_name == EXTENSION_NAME and ext_meta is not None:
        with contextlib.suppress(ValueError):  # not JSON: compared as bytes, so never equal
            ext_meta = json.loads(ext_meta)
    children: tuple[Any, ...] = ()
    if depth < 2 and 0 < schema.n_children <= 8 and schema.children:
        children = tuple(
            _describe(schema.children[i][0], depth + 1)
            for i in range(schema.n_children)
            if schema.children[i]
        )
    return (schema.format or b"", ext_name, ext_meta, children)


def _dtype_name(value_format: bytes) -> str:
    """The tensorbridge dtype name of an exported element format."""
    return "bool" if value_format == ARROW_BOOL else BY_ARROW_FORMAT[value_format].name


def _requested(
    requested_schema: object, shape: tuple[int, ...], value_format: bytes, api: str
) -> bool:
    """Whether to export the extension type (True) or its bare storage type (False).

    Honoured: a requested type equal to the one exported anyway (names and nullability aside),
    and, for an n-d tensor, the bare ``fixed_size_list`` storage type without the extension.
    Anything else is a `ValueError` naming the type exported and how to convert: the element
    type is never cast here, because Arrow's casts check for overflow and tensorbridge's do not.
    (The PyCapsule interface lets a producer return its own type instead, for the consumer to
    cast; pyarrow 26's ``pa.array(obj, type=...)`` fails on that path.)
    """
    if requested_schema is None:
        return True
    if not isinstance(requested_schema, _capi.CapsuleType) or not _native.capsule_is_valid(
        requested_schema, ARROW_SCHEMA
    ):
        msg = (
            f"{api}(): requested_schema must be None or a PyCapsule named 'arrow_schema'; got "
            f"{short_repr(requested_schema)}. Pass the capsule of type.__arrow_c_schema__()."
        )
        raise TypeError(msg)
    schema = ArrowSchema.from_address(_native.capsule_pointer(requested_schema, ARROW_SCHEMA))
    if not schema.release:
        msg = f"{api}(): requested_schema holds a released ArrowSchema; pass a fresh capsule."
        raise ValueError(msg)
    fmt, ext_name, ext_meta, children = _describe(schema)
    value = (value_format, None, None, ())
    if len(shape) == 1:
        if (fmt, ext_name, children) == (value_format, None, ()):
            return True
        ours = f"the element type (format {value_format.decode()!r})"
    else:
        row = math.prod(shape[1:])
        if fmt == b"+w:%d" % row and children == (value,):
            if ext_name is None:
                return False
            if ext_name == EXTENSION_NAME and ext_meta == {"shape": list(shape[1:])}:
                return True
        ours = (
            f"arrow.fixed_shape_tensor of shape {list(shape[1:])} or its storage type, a "
            f"fixed-size list of {row} values of format {value_format.decode()!r}"
        )
    msg = (
        f"{api}(): cannot export a tensor of dtype {_dtype_name(value_format)} and shape "
        f"{list(shape)} as "
        f"the requested Arrow type (format {fmt.decode(errors='replace')!r}, extension "
        f"{ext_name!r}); got a request for another type. Request {ours}, or convert after the "
        f"export (pyarrow: pa.array(t).cast(type)) or before it (t.to(dtype))."
    )
    raise ValueError(msg)


# -------------------------------------------------------------------------------------------------
# Arrays


def _pack_bits(data: bytes) -> bytes:
    """One bit per byte of ``data`` (nonzero: 1), least significant bit first, as Arrow stores
    booleans; the last byte is padded with zeros."""
    if not data:
        return b""
    bits = data.translate(_BYTES_TO_BITS)[::-1]
    return int(bits, 2).to_bytes((len(data) + 7) // 8, "little")


_BYTES_TO_BITS: Final = b"0" + b"1" * 255  # a translation table: 0 -> "0", else "1"


def _data(
    storage: Storage,
    offset: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: DType,
    api: str,
) -> tuple[int, object]:
    """The address of the values as Arrow lays them out, and what keeps them valid: the storage
    itself for a contiguous tensor, else a compact (or, for bool, bit-packed) copy."""
    itemsize = dtype.itemsize
    numel = math.prod(shape)
    if dtype.kind == "b":
        mv = storage.host_view(api) if numel else memoryview(b"")
        packed = _pack_bits(bytes(_memory.gather(mv, offset, strides, shape, 1))) if numel else b""
        if not packed:
            return 0, None
        buf = ctypes.create_string_buffer(packed, len(packed))
        return ctypes.addressof(buf), buf
    if _layout.is_contiguous(shape, strides):
        return (storage.ptr + offset * itemsize if numel else 0), storage
    copy = allocate(numel * itemsize)
    _memory.copy_region(
        copy.host_view(api),
        0,
        _layout.contiguous_strides(shape),
        storage.host_view(api),
        offset,
        strides,
        shape,
        itemsize,
    )
    return copy.ptr, copy


def _new_array(shape: tuple[int, ...], data: int, keep: object) -> Any:
    block = _ArrayBlock()
    address = ctypes.addressof(block)
    base, child = block.base, block.child
    base.length = shape[0]
    base.release = _ARRAY_RELEASE
    base.private_data = address + _ArrayBlock.base_buffers.offset
    base.buffers = ctypes.cast(base.private_data, type(base.buffers))
    if len(shape) == 1:
        base.n_buffers = 2
        block.base_buffers[1] = data or None
    else:
        base.n_buffers = 1  # a fixed-size list has a validity buffer only
        base.n_children = 1
        block.children[0] = ctypes.pointer(child)
        base.children = ctypes.cast(ctypes.addressof(block.children), type(base.children))
        child.length = math.prod(shape)
        child.n_buffers = 2
        child.release = _ARRAY_RELEASE
        child.private_data = address + _ArrayBlock.child_buffers.offset
        child.buffers = ctypes.cast(child.private_data, type(child.buffers))
        block.child_buffers[1] = data or None
    _exports.hold_managed(base.private_data, block, keep, ARROW_ARRAY)
    if base.n_children:
        _exports.hold_managed(child.private_data, block, keep, ARROW_ARRAY)
    capsule = _native.capsule_new(address, ARROW_ARRAY, None)
    guard = _Unconsumed(address, block, _release_array)
    _exports.hold_capsule(address, block, guard, ARROW_ARRAY, capsule)
    return capsule


def export_array(
    storage: Storage,
    offset: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: DType,
    requires_grad: bool,
    requested_schema: object = None,
    api: str = "__arrow_c_array__",
) -> tuple[Any, Any]:
    """``Tensor.__arrow_c_array__``: ``("arrow_schema", "arrow_array")`` capsules of the tensor.

    A 1-d tensor becomes a primitive array, an n-d tensor an ``arrow.fixed_shape_tensor`` array
    of ``shape[0]`` tensors of shape ``shape[1:]``, both sharing the tensor's memory (no copy)
    when it is row-major contiguous. Copied instead: ``bool`` (bit-packed, as Arrow stores
    booleans) and other layouts (strided, transposed, broadcast, negative strides), which Arrow
    cannot describe. Arrow treats the memory as immutable: writing through the tensor while an
    Arrow array shares it changes that array's values. The memory stays alive until the
    consumer releases the array (or, for a capsule never consumed, until the capsule is gone).

    Args:
        storage, offset, shape, strides, dtype: the tensor's memory and layout (elements).
        requires_grad: the tensor's flag; such tensors are refused, as for DLPack.
        requested_schema: None, or an ``"arrow_schema"`` capsule (see `_requested`).
        api: the name errors give.

    Raises:
        TypeError: Arrow has no type for the dtype, memory that is not on the host, or a
            ``requested_schema`` that is not a schema capsule.
        ValueError: a 0-d tensor, or a requested type of another nesting or row size.
        RuntimeError: the tensor requires grad.
    """
    value_format = _value_format(dtype, api)
    _check_shape(shape, api)
    if requires_grad:
        msg = f"{api}(): Can't export tensors that require gradient, use tensor.detach()."
        raise RuntimeError(msg)
    if not storage.device.is_host_accessible:
        msg = (
            f"{api}(): the tensor's memory is on {storage.device}, and the Arrow C data interface "
            f"describes host memory only; got a {storage.device.type} tensor. Export it with "
            f"__dlpack__ to a library for {storage.device.type}, or copy it to the host first."
        )
        raise TypeError(msg)
    extension = _requested(requested_schema, shape, value_format, api)
    data, keep = _data(storage, offset, shape, strides, dtype, api)
    schema = _new_schema(shape, value_format, extension, None)
    return schema, _new_array(shape, data, keep)
