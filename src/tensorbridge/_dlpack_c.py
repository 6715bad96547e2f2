"""Reading what DLPack producers hand over: C structs in process memory and the C exchange API table.

Shared by DLPack import (`_dlpack`) and export (`_dlpack_export`, which hands tensors to a
framework through its exchange table). Nothing here builds a tensor.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Callable
from typing import Any, Final

from . import _capi
from ._cache import remember
from ._dlpack_abi import DLPACK_MAJOR_VERSION
from ._dtype import BY_DLPACK, DType
from ._layout import MAX_NDIM
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
# Producer structs are read with `struct` formats in native layout ('@'), which mirror the C
# layout of dlpack.h (tests compare them with the ctypes mirrors of _dlpack_abi), straight out of a
# read-only memoryview spanning the address space: one `unpack_from` per struct, no copy and no
# ctypes object per call (`ctypes.string_at` + `unpack` costs twice as much on this hot path).
# Nothing is read without a pointer the producer gave us, exactly as a C consumer would.
# -------------------------------------------------------------------------------------------------

# DLTensor as read: data, device {type, id}, ndim, dtype as one uint32 word, shape, strides,
# byte_offset. DLDataType {code, bits, lanes} is 4 bytes; read whole, it is the key of a dict.
_DLTENSOR_READ: Final = "PiiiIPPQ"
# DLManagedTensorVersioned: version {major, minor}, manager_ctx, deleter, flags, dl_tensor.
VERSIONED: Final = struct.Struct("@IIPPQ" + _DLTENSOR_READ)
# DLManagedTensor: dl_tensor, manager_ctx, deleter.
LEGACY: Final = struct.Struct("@" + _DLTENSOR_READ + "PP")

# The address space as one read-only memoryview, from address 1 (PyMemoryView_FromMemory wants a
# non-NULL start; NULL pointers are checked before any read). On 64-bit platforms it covers every
# user-space address; `read` handles addresses above sys.maxsize on 32-bit ones.
MEMORY_BASE: Final = 1
MEMORY: Final = _capi.PyMemoryView_FromMemory(
    MEMORY_BASE, sys.maxsize - MEMORY_BASE, _capi.PyBUF_READ
)
MEMORY_COVERS_ALL: Final = sys.maxsize >= 2**63 - 1
INT64_ARRAYS: Final = [struct.Struct(f"@{n}q") for n in range(MAX_NDIM + 1)]


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


def _unpack_versioned(address: int) -> tuple[int, ...] | None:
    """`VERSIONED`'s fields at ``address``; None outside `MEMORY`, for `read` to judge."""
    try:
        return VERSIONED.unpack_from(MEMORY, address - MEMORY_BASE)
    except (struct.error, OverflowError):
        return None


def _unpack_dims(
    shape: int, strides: int, ndim: int
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ``ndim`` int64s at ``shape`` and at ``strides``; None outside `MEMORY`."""
    fmt = INT64_ARRAYS[ndim]
    try:
        sizes = fmt.unpack_from(MEMORY, shape - MEMORY_BASE)
        return sizes, fmt.unpack_from(MEMORY, strides - MEMORY_BASE)
    except (struct.error, OverflowError):
        return None


# The reads on every import's path: ``read_versioned(address)`` gives a managed struct's fields,
# ``read_dims(shape, strides, ndim)`` its shape and strides, each None where `read` must judge the
# address instead. Compiled, `_capi` loads them from C (no format to interpret, no method call).
read_versioned: Final[Callable[[int], tuple[int, ...] | None]] = (
    _capi.read_versioned or _unpack_versioned
)
read_dims: Final[Callable[[int, int, int], tuple[tuple[int, ...], tuple[int, ...]] | None]] = (
    _capi.read_dims or _unpack_dims
)


_EXCHANGE_API_NAME: Final = b"dlpack_exchange_api"
# DLPackExchangeAPIHeader: version {major, minor}, prev_api; then the five function pointers
# (managed_tensor_allocator, managed_tensor_from_py_object_no_sync,
# managed_tensor_to_py_object_no_sync, dltensor_from_py_object_no_sync, current_work_stream).
_EXCHANGE_HEADER: Final = struct.Struct("@IIP")
_EXCHANGE_FUNCTIONS: Final = struct.Struct("@5P")
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
        self.from_py = from_py  # managed_tensor_from_py_object_no_sync: `_capi.ManagedFromPy`
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
        if not _capi.PyCapsule_IsValid(advertised, _EXCHANGE_API_NAME):
            return None
        address = _capi.PyCapsule_GetPointer(advertised, _EXCHANGE_API_NAME)
    elif type(advertised) is int:
        address = advertised
    else:
        return None
    for _ in range(_EXCHANGE_CHAIN_MAX):
        if not address:
            return None
        major, _minor, previous = read(_EXCHANGE_HEADER, address)
        if major == DLPACK_MAJOR_VERSION:
            break
        address = previous
    else:
        return None
    _allocator, from_py, to_py, _view, _stream = read(
        _EXCHANGE_FUNCTIONS, address + _EXCHANGE_HEADER.size
    )
    if not from_py or not to_py:  # neither may be NULL (dlpack.h); a broken table is not used
        return None
    return ExchangeAPI(_capi.ManagedFromPy(from_py), _ToPyObject(to_py))


_EXCHANGE_APIS: dict[type, ExchangeAPI | None] = {}


def exchange_api_of(cls: type) -> ExchangeAPI | None:
    """`exchange_api`, looked up once per type (a bounded table)."""
    try:
        return _EXCHANGE_APIS[cls]
    except KeyError:
        return remember(_EXCHANGE_APIS, cls, exchange_api(cls))
