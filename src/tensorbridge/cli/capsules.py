"""Where a DLPack producer's memory is, read from its capsule with ctypes: the doctor's measure of a
peer's address that does not go through tensorbridge's own import (it would prove nothing)."""

from __future__ import annotations

import ctypes
from typing import Any, Final

__all__ = ["dlpack_address"]

_GET_POINTER: Final = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_VERSIONED: Final = b"dltensor_versioned"
_LEGACY: Final = b"dltensor"
# DLPack's C layout (include/dlpack/dlpack.h): a DLTensor begins with ``void *data``, its
# ``uint64_t byte_offset`` is at byte 40; a DLManagedTensorVersioned holds its DLTensor at byte 32
# (after version, manager_ctx, deleter, flags), a legacy DLManagedTensor at byte 0.
_TENSOR_AT: Final = {_VERSIONED: 32, _LEGACY: 0}
_BYTE_OFFSET_AT: Final = 40


def dlpack_address(obj: Any) -> int:
    """The address of element 0 of what ``obj.__dlpack__()`` exports (versioned where offered).

    The capsule is left unconsumed: its destructor gives the memory back to ``obj``.

    Raises:
        Exception: whatever ``obj.__dlpack__`` raises.
    """
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer older than DLPack 1.0 takes no max_version
        capsule = obj.__dlpack__()
    for name, at in _TENSOR_AT.items():
        try:
            managed = _GET_POINTER(capsule, name)
        except ValueError:  # the other name
            continue
        tensor = int(managed or 0) + at
        data = ctypes.c_void_p.from_address(tensor).value or 0
        return data + ctypes.c_uint64.from_address(tensor + _BYTE_OFFSET_AT).value
    msg = f"{type(obj).__name__}.__dlpack__() returned no DLPack capsule"
    raise TypeError(msg)
