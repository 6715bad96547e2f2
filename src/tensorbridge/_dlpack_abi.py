"""ctypes mirrors of ``dlpack.h`` v1.3 (C names kept so they can be checked line by line), flags, names."""

from __future__ import annotations

import ctypes
from typing import Final

__all__ = [
    "DLPACK_FLAG_BITMASK_IS_COPIED",
    "DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED",
    "DLPACK_FLAG_BITMASK_READ_ONLY",
    "DLPACK_MAJOR_VERSION",
    "DLPACK_MINOR_VERSION",
    "DLPACK_VERSION",
    "DLDataType",
    "DLDevice",
    "DLManagedTensor",
    "DLManagedTensorVersioned",
    "DLPackVersion",
    "DLTensor",
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
