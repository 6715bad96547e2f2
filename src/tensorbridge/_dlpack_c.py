"""Reading what DLPack producers hand over: C structs in process memory and the C exchange API table.

Shared by DLPack import (`_dlpack`) and export (`_dlpack_export`, which hands tensors to a
framework through its exchange table). Nothing here builds a tensor.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, Final

from . import _capi, _native
from ._cache import TypeTable, remember_type
from ._capi import MEMORY, MEMORY_BASE, MEMORY_COVERS_ALL
from ._dlpack_abi import (
    DLPACK_MAJOR_VERSION,
    EXCHANGE_API,
    EXCHANGE_HEADER,
    INT64_ARRAYS,
    LEGACY_READ,
    VERSIONED_READ,
)
from ._dtype import BY_DLPACK, DType
from ._native import read_dims, read_versioned
from ._storage import ADDRESS_LIMIT

__all__ = [
    "DTYPE_BY_WORD",
    "INT64_ARRAYS",
    "LEGACY",
    "MEMORY",
    "MEMORY_BASE",
    "VERSIONED",
    "ExchangeAPI",
    "exchange_api",
    "exchange_api_of",
    "read",
    "read_dims",
    "read_versioned",
]

_CapsuleType: Final = _capi.CapsuleType

# -------------------------------------------------------------------------------------------------
# Reading C structs
#
# A producer's structs are read with the native-layout `struct` formats that `_dlpack_abi` derives
# from its ctypes declaration of dlpack.h, straight out of `_capi.MEMORY`, a read-only memoryview
# spanning the address space: one `unpack_from` per struct, no copy and no ctypes object per call
# (`ctypes.string_at` + `unpack` costs twice as much on this hot path). The two reads on every
# import's path, ``read_versioned(address)`` (a managed struct's fields) and ``read_dims(shape,
# strides, ndim)`` (its shape and strides), come from the native layer, each None where `read`
# must judge the address instead. Nothing is read without a pointer the producer gave us, exactly
# as a C consumer would.
# -------------------------------------------------------------------------------------------------

# DLManagedTensorVersioned and DLManagedTensor as read: the DLTensor's dtype {code, bits, lanes}
# read whole, as one uint32 word, the key of `DTYPE_BY_WORD`.
VERSIONED: Final = VERSIONED_READ
LEGACY: Final = LEGACY_READ


def _dtype_word(code: int, bits: int, lanes: int) -> int:
    word: int = struct.unpack("@I", struct.pack("@BBH", code, bits, lanes))[0]
    return word


DTYPE_BY_WORD: Final[dict[int, DType]] = {_dtype_word(*k): d for k, d in BY_DLPACK.items()}


def read(fmt: struct.Struct, address: int) -> tuple[Any, ...]:
    """Unpack ``fmt`` from process memory at ``address``, a pointer the producer gave us."""
    try:
        return fmt.unpack_from(MEMORY, address - MEMORY_BASE)
    except (struct.error, OverflowError):  # beyond the view, or beyond Py_ssize_t
        pass
    if MEMORY_COVERS_ALL or address <= 0 or address + fmt.size > ADDRESS_LIMIT:
        msg = (
            f"from_dlpack(): the capsule points outside the address space (0x{address:x}); "
            f"the producer wrote an invalid capsule."
        )
        raise BufferError(msg) from None
    return fmt.unpack(ctypes.string_at(address, fmt.size))


_EXCHANGE_API_NAME: Final = b"dlpack_exchange_api"
_EXCHANGE_CHAIN_MAX: Final = 8  # prev_api links followed at most (a cycle must not hang us)

# int (*)(DLManagedTensorVersioned* tensor, void** out_py_object): takes ownership of the tensor
# and writes a new reference. The reference comes back as an address, so that its ownership can be
# taken over exactly once (a ctypes py_object out-parameter would leak it).
_ToPyObject: Final = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
)


class ExchangeAPI:
    """The functions tensorbridge calls in a producer type's ``DLPackExchangeAPI`` table."""

    __slots__ = ("from_py", "to_py")

    def __init__(self, from_py: Any, to_py: Any) -> None:
        self.from_py = from_py  # managed_tensor_from_py_object_no_sync: `_native.ManagedFromPy`
        self.to_py = to_py  # managed_tensor_to_py_object_no_sync


def exchange_api(cls: type) -> ExchangeAPI | None:
    """The C exchange API that ``cls`` itself advertises, or None.

    Only the advertising type qualifies, not its subclasses: ``py_object`` must be exactly the
    table's type (a subclass may override ``__dlpack__``). DLPack 1.3 advertises a capsule named
    ``"dlpack_exchange_api"`` in ``__dlpack_c_exchange_api__``; 1.2 an integer address in
    ``__c_dlpack_exchange_api__``; both are accepted. A table of another major version is
    followed down its ``prev_api`` chain to a major-1 one.
    """
    advertised = cls.__dict__.get("__dlpack_c_exchange_api__")
    if advertised is None:
        advertised = cls.__dict__.get("__c_dlpack_exchange_api__")
    if type(advertised) is _CapsuleType:
        if not _native.capsule_is_valid(advertised, _EXCHANGE_API_NAME):
            return None
        address = _native.capsule_pointer(advertised, _EXCHANGE_API_NAME)
    elif type(advertised) is int:
        address = advertised
    else:
        return None
    for _ in range(_EXCHANGE_CHAIN_MAX):
        if not address:
            return None
        major, _minor, previous = read(EXCHANGE_HEADER, address)
        if major == DLPACK_MAJOR_VERSION:
            break
        address = previous
    else:
        return None
    _major, _minor, _previous, _allocator, from_py, to_py, _view, _stream = read(
        EXCHANGE_API, address
    )
    if not from_py or not to_py:  # neither may be NULL (dlpack.h); a broken table is not used
        return None
    return ExchangeAPI(_native.ManagedFromPy(from_py), _ToPyObject(to_py))


_EXCHANGE_APIS: TypeTable[ExchangeAPI | None] = TypeTable()


def exchange_api_of(cls: type) -> ExchangeAPI | None:
    """`exchange_api`, looked up once per type (a bounded table)."""
    try:
        return _EXCHANGE_APIS[id(cls)]
    except KeyError:
        return remember_type(_EXCHANGE_APIS, cls, exchange_api(cls))
