"""ctypes mirrors of the Arrow C data and C stream interfaces (C names kept), capsule names.

Shared by Arrow import (`_interfaces`) and export (`_arrow_export`). The layouts are those of the
Arrow C data interface specification ("Structure definitions"); the capsule names those of the
Arrow PyCapsule interface.
"""

from __future__ import annotations

import ctypes
from typing import Final

__all__ = [
    "ARROW_ARRAY",
    "ARROW_ARRAY_STREAM",
    "ARROW_BOOL",
    "ARROW_FLAG_NULLABLE",
    "ARROW_SCHEMA",
    "ArrowArray",
    "ArrowArrayStream",
    "ArrowGet",
    "ArrowLastError",
    "ArrowRelease",
    "ArrowSchema",
]


class ArrowSchema(ctypes.Structure):
    """``struct ArrowSchema`` (Arrow C data interface)."""


ArrowSchema._fields_ = (
    ("format", ctypes.c_char_p),
    ("name", ctypes.c_char_p),
    ("metadata", ctypes.c_void_p),
    ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowSchema))),
    ("dictionary", ctypes.POINTER(ArrowSchema)),
    # void (*release)(struct ArrowSchema*): kept as an address, called through ArrowRelease
    ("release", ctypes.c_void_p),
    ("private_data", ctypes.c_void_p),
)


class ArrowArray(ctypes.Structure):
    """``struct ArrowArray`` (Arrow C data interface)."""


ArrowArray._fields_ = (
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))),
    ("dictionary", ctypes.POINTER(ArrowArray)),
    ("release", ctypes.c_void_p),  # void (*release)(struct ArrowArray*)
    ("private_data", ctypes.c_void_p),
)


class ArrowArrayStream(ctypes.Structure):
    """``struct ArrowArrayStream`` (Arrow C stream interface); callbacks kept as raw addresses."""

    _fields_ = (
        # int (*)(struct ArrowArrayStream*, struct ArrowSchema* out)
        ("get_schema", ctypes.c_void_p),
        ("get_next", ctypes.c_void_p),  # int (*)(struct ArrowArrayStream*, struct ArrowArray* out)
        ("get_last_error", ctypes.c_void_p),  # const char* (*)(struct ArrowArrayStream*)
        ("release", ctypes.c_void_p),  # void (*)(struct ArrowArrayStream*)
        ("private_data", ctypes.c_void_p),
    )


# Each struct's release takes a pointer to that struct; one void* prototype serves all three.
ArrowRelease: Final = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
ArrowGet: Final = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
ArrowLastError: Final = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)

# Capsule names (Arrow PyCapsule interface). They must outlive every capsule that points at them:
# module-level bytes constants.
ARROW_SCHEMA: Final = b"arrow_schema"
ARROW_ARRAY: Final = b"arrow_array"
ARROW_ARRAY_STREAM: Final = b"arrow_array_stream"

ARROW_BOOL: Final = b"b"  # bit-packed, least significant bit first: one bit per value
ARROW_FLAG_NULLABLE: Final = 2
