"""Array-interface export: ``__array_interface__`` and ``__cuda_array_interface__`` (version 3).

Below `Tensor`: it reads a tensor's storage, layout and dtype and builds the dictionaries; the
consumer shares the memory and keeps a reference to the exporting object.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ._tensor import Tensor

__all__ = ["EMPTY_DATA", "array_interface", "cuda_array_interface", "interface_dict"]

_CAI_EXPORT_STREAM: Final = 1  # the legacy default stream (see cuda_array_interface)

# The data pointer ``__array_interface__`` gives for a tensor without elements: a valid, 64-byte
# aligned address (NumPy before 2.4 refuses NULL there, "setting an array element with a
# sequence"). Nothing is ever read or written through it: the array has no elements.
_EMPTY_BLOCK: Final = ctypes.create_string_buffer(128)
EMPTY_DATA: Final = -(-ctypes.addressof(_EMPTY_BLOCK) // 64) * 64


def interface_dict(t: Tensor, typestr: str, empty_data: int = 0) -> dict[str, Any]:
    """The fields ``__array_interface__`` and ``__cuda_array_interface__`` share (version 3).

    ``data`` is ``(pointer to element [0, ..., 0], read-only flag)``; for a tensor without elements
    the pointer is ``empty_data``: 0 for the CUDA interface (its specification asks for 0), a valid
    host address (`EMPTY_DATA`) for NumPy's. ``strides`` is None for C-contiguous tensors (both
    specs' preferred form) and byte strides otherwise. ``descr`` is left out: it is optional in
    both, and would only restate ``typestr``.
    """
    itemsize = t._dtype.itemsize
    return {
        "version": 3,
        "shape": tuple(t._shape),
        "typestr": typestr,
        "data": (t.data_ptr() if t.numel() else empty_data, t._storage.readonly),
        "strides": None if t.is_contiguous() else tuple(s * itemsize for s in t._strides),
    }


def array_interface(t: Tensor) -> dict[str, Any]:
    """``Tensor.__array_interface__``: NumPy's array interface (version 3) of a host tensor.

    ``numpy.asarray(t)`` then shares the memory without copying: NumPy keeps a reference to ``t`` (the
    array's ``base``), which keeps the memory alive. ``data`` carries the read-only flag, so the array
    of a read-only tensor is read-only.

    Raises:
        AttributeError: the memory is not on the host, or NumPy has no typestr for the dtype
            (bfloat16, float8, ...). AttributeError makes ``hasattr(t, "__array_interface__")``
            False, so NumPy goes on to its other protocols.
    """
    storage = t._storage
    typestr = t._dtype.typestr
    if typestr is None or not storage.device.is_host_accessible:
        reason = (
            f"NumPy has no typestr for {t._dtype}"
            if typestr is None
            else f"the memory is on {storage.device}, not on the host"
        )
        msg = f"__array_interface__: not available, {reason}; use __dlpack__() instead."
        raise AttributeError(msg)
    return interface_dict(t, typestr, EMPTY_DATA)


def cuda_array_interface(t: Tensor) -> dict[str, Any]:
    """``Tensor.__cuda_array_interface__``: the CUDA Array Interface v3 of a CUDA tensor.

    CPU tensors raise `AttributeError` (so ``hasattr`` is False), as PyTorch's do. ``stream`` is 1, the
    legacy default stream: tensorbridge enqueues no work of its own, and CUDA memory it imports is ready
    on that stream (DLPack imports ask producers for ``stream=1``; CUDA Array Interface imports are
    synchronised on the host), so a consumer on another stream must order itself after it. The
    consumer shares the memory; the tensor must outlive the consumer's use of the pointer.
    """
    device = t._storage.device
    if device.type != "cuda":
        msg = (
            f"Can't get __cuda_array_interface__ on non-CUDA tensor type: the tensor is on {device}. "
            f"Use __dlpack__ or __array_interface__ for host memory."
        )
        raise AttributeError(msg)
    if t.requires_grad:
        msg = (
            "Can't get __cuda_array_interface__ on Variable that requires grad. If gradients aren't "
            "required, use var.detach() to get Variable that doesn't require grad."
        )
        raise RuntimeError(msg)
    typestr = t.dtype.typestr
    if typestr is None:
        msg = (
            f"__cuda_array_interface__: {t.dtype} has no array-interface typestr; "
            f"export it through __dlpack__ instead."
        )
        raise AttributeError(msg)
    iface = interface_dict(t, typestr)
    iface["stream"] = _CAI_EXPORT_STREAM
    return iface
