"""DLPack's C layout, declared once in ctypes, and the `struct` formats the pure-Python build derives from it.

The structs are those of the repository's ``include/dlpack/dlpack.h`` (DLPack 1.3; every 1.x release
keeps their layout), with the C names, so that each can be checked line by line. The compiled build
declares them from that header instead (`_native_c`), so its C compiler lays them out;
tests/test_native.py checks every size and offset here against the header, and against the upstream
header where PyTorch ships one. `struct_format` turns a declaration into a native-layout `struct`
format with the same offsets and size: `_native_py` packs and unpacks managed structs with those
formats, `_dlpack_c` reads the exchange API table with them. Also here: the version, the flags, the
capsule names and the data type codes.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Final

from ._layout import MAX_NDIM

__all__ = [
    "DLPACK_FLAG_BITMASK_IS_COPIED",
    "DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED",
    "DLPACK_FLAG_BITMASK_READ_ONLY",
    "DLPACK_MAJOR_VERSION",
    "DLPACK_MINOR_VERSION",
    "DLPACK_VERSION",
    "EXCHANGE_API",
    "EXCHANGE_HEADER",
    "INT64_ARRAYS",
    "LEGACY_READ",
    "LEGACY_WRITE",
    "VERSIONED_READ",
    "VERSIONED_WRITE",
    "DLDataType",
    "DLDevice",
    "DLManagedTensor",
    "DLManagedTensorVersioned",
    "DLPackExchangeAPI",
    "DLPackExchangeAPIHeader",
    "DLPackVersion",
    "DLTensor",
    "struct_format",
]

# The version tensorbridge implements and reports on export (dlpack.h v1.3).
DLPACK_MAJOR_VERSION: Final = 1
DLPACK_MINOR_VERSION: Final = 3
DLPACK_VERSION: Final = (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)

DLPACK_FLAG_BITMASK_READ_ONLY: Final = 1 << 0
DLPACK_FLAG_BITMASK_IS_COPIED: Final = 1 << 1
DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: Final = 1 << 2

# Capsule names. They must outlive every capsule that points at them: module-level bytes constants.
DLTENSOR: Final = b"dltensor"
USED_DLTENSOR: Final = b"used_dltensor"
DLTENSOR_VERSIONED: Final = b"dltensor_versioned"
USED_DLTENSOR_VERSIONED: Final = b"used_dltensor_versioned"

# DLDataTypeCode (dlpack.h).
kDLInt: Final = 0
kDLUInt: Final = 1
kDLFloat: Final = 2
kDLOpaqueHandle: Final = 3
kDLBfloat: Final = 4
kDLComplex: Final = 5
kDLBool: Final = 6
kDLFloat8_e3m4: Final = 7
kDLFloat8_e4m3: Final = 8
kDLFloat8_e4m3b11fnuz: Final = 9
kDLFloat8_e4m3fn: Final = 10
kDLFloat8_e4m3fnuz: Final = 11
kDLFloat8_e5m2: Final = 12
kDLFloat8_e5m2fnuz: Final = 13
kDLFloat8_e8m0fnu: Final = 14
kDLFloat6_e2m3fn: Final = 15
kDLFloat6_e3m2fn: Final = 16
kDLFloat4_e2m1fn: Final = 17


class DLPackVersion(ctypes.Structure):
    _fields_ = (("major", ctypes.c_uint32), ("minor", ctypes.c_uint32))


class DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


class DLManagedTensor(ctypes.Structure):
    pass


# void (*deleter)(DLManagedTensor *self); typed as void* so one callback type serves both structs.
DLPackDeleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

DLManagedTensor._fields_ = (
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLPackDeleter),
)


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = (
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DLPackDeleter),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    )


class DLPackExchangeAPIHeader(ctypes.Structure):
    pass


DLPackExchangeAPIHeader._fields_ = (
    ("version", DLPackVersion),
    ("prev_api", ctypes.POINTER(DLPackExchangeAPIHeader)),
)


class DLPackExchangeAPI(ctypes.Structure):
    """The table a framework type advertises (1.2+). The five functions are untyped addresses
    here: tensorbridge makes a callable of the two it calls where it calls them (`_dlpack_c`)."""

    _fields_ = (
        ("header", DLPackExchangeAPIHeader),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    )


# The `struct` code of each scalar field type these declarations use; every pointer is "P".
_CODES: Final[dict[type, str]] = {
    ctypes.c_uint8: "B",
    ctypes.c_uint16: "H",
    ctypes.c_int32: "i",
    ctypes.c_uint32: "I",
    ctypes.c_int64: "q",
    ctypes.c_uint64: "Q",
    ctypes.c_void_p: "P",
}


def _code(field_type: type, words: tuple[type, ...]) -> str:
    if field_type in words:  # a small struct read whole, as one unsigned integer of its size
        return {1: "B", 2: "H", 4: "I", 8: "Q"}[ctypes.sizeof(field_type)]
    if issubclass(field_type, ctypes.Structure):
        return _fields_format(field_type, words)
    if issubclass(field_type, (ctypes._Pointer, ctypes._CFuncPtr)):  # type: ignore[attr-defined]
        return "P"
    try:
        return _CODES[field_type]
    except KeyError:
        msg = f"struct_format(): no format for a field of type {field_type.__name__}"
        raise TypeError(msg) from None


def _fields_format(cls: type[ctypes.Structure], words: tuple[type, ...]) -> str:
    # Each field at its ctypes offset: explicit pad bytes where ctypes leaves a gap, so the native
    # alignment that `struct` adds ("@") never has to agree with ctypes by luck.
    out, at = [], 0
    for name, field_type, *_ in cls._fields_:
        offset = getattr(cls, name).offset
        if offset > at:
            out.append(f"{offset - at}x")
        out.append(_code(field_type, words))
        at = offset + ctypes.sizeof(field_type)
    if ctypes.sizeof(cls) > at:
        out.append(f"{ctypes.sizeof(cls) - at}x")
    return "".join(out)


def struct_format(cls: type[ctypes.Structure], *, words: tuple[type, ...] = ()) -> str:
    """The native-layout `struct` format of the ctypes struct ``cls``, nested structs flattened,
    with its offsets and size: ``struct.calcsize(struct_format(cls)) == ctypes.sizeof(cls)``.
    Each struct type in ``words`` is read whole, as one unsigned integer of its size (the 4 bytes
    of a `DLDataType` as the key of a dict)."""
    fmt = "@" + _fields_format(cls, words)
    if struct.calcsize(fmt) != ctypes.sizeof(cls):  # cannot happen: each field is at its offset
        msg = f"struct_format(): {fmt!r} is not the layout of {cls.__name__}"
        raise TypeError(msg)
    return fmt


# The pure-Python build's formats, each derived from the declarations above. Read, a DLDataType is
# one native uint32 (the key of `_dlpack_c.DTYPE_BY_WORD`); written, its three fields.
VERSIONED_READ: Final = struct.Struct(struct_format(DLManagedTensorVersioned, words=(DLDataType,)))
LEGACY_READ: Final = struct.Struct(struct_format(DLManagedTensor, words=(DLDataType,)))
VERSIONED_WRITE: Final = struct.Struct(struct_format(DLManagedTensorVersioned))
LEGACY_WRITE: Final = struct.Struct(struct_format(DLManagedTensor))
# A shape or strides array, ``int64_t[ndim]``, for every ndim a tensor may have.
INT64_ARRAYS: Final = [struct.Struct(f"@{n}q") for n in range(MAX_NDIM + 1)]
# The exchange API table: its header (version, prev_api), then the whole table.
EXCHANGE_HEADER: Final = struct.Struct(struct_format(DLPackExchangeAPIHeader))
EXCHANGE_API: Final = struct.Struct(struct_format(DLPackExchangeAPI))
