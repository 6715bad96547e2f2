"""Conversions out: ``Tensor.numpy()``, ``Tensor.__array__``, ``Tensor.torch()``, ``Tensor.jax()``.

Below `Tensor`: each hands a tensor's memory to a peer library, zero-copy wherever the peer can
represent it. Peers are imported on first use, never when tensorbridge is imported.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from . import _dlpack_export
from ._dtype import ml_dtypes_type
from ._interface_export import EMPTY_DATA, interface_dict

if TYPE_CHECKING:
    from ._tensor import Tensor

__all__ = ["numpy_array", "to_jax", "to_numpy", "to_torch"]


def _peer(module: str, api: str) -> Any:
    """Import a peer library lazily, with an error that names what to install."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return loaded  # already imported: skip the import machinery on every conversion
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.partition(".")[0]
        msg = f"{api}(): needs {package}, which is not installed; pip install {package}."
        raise ImportError(msg) from exc


class _NumPyExport:
    """What ``numpy.asarray`` receives: the interface, and the tensor that keeps the memory alive."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: Tensor, typestr: str) -> None:
        self.tensor = t
        self.__array_interface__ = interface_dict(t, typestr, EMPTY_DATA)


def to_numpy(t: Tensor, *, force: bool = False, api: str = "numpy") -> Any:
    """``Tensor.numpy()``: a NumPy array sharing the tensor's memory (PyTorch's ``Tensor.numpy``).

    The array keeps the tensor (and so its memory) alive; a read-only tensor gives a read-only array.
    bfloat16, complex32 and the float8 types become ml_dtypes arrays (``ml_dtypes`` must be installed).
    As in PyTorch, a tensor that requires grad is refused unless ``force=True``, which detaches it; the
    memory is still shared, because NumPy represents every host layout tensorbridge has (negative and
    zero strides, read-only). Device memory cannot be converted: tensorbridge never copies it to the host.
    """
    np = _peer("numpy", api)
    if t.requires_grad and not force:
        msg = (
            "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
        )
        raise RuntimeError(msg)
    device = t._storage.device
    if not device.is_host_accessible:
        msg = (
            f"{api}(): can't convert {device} device type tensor to numpy; its memory is not "
            f"host-accessible and tensorbridge does not copy between devices. Export it with "
            f"__dlpack__ to a library for {device.type}."
        )
        raise TypeError(msg)
    dtype = t.dtype
    if dtype.typestr is not None:
        return np.asarray(_NumPyExport(t, dtype.typestr))
    ml_type = ml_dtypes_type(dtype, f"{api}()", "t.view(tensorbridge.uint{bits}).numpy()")
    raw = np.asarray(_NumPyExport(t, dtype.raw_typestr or ""))  # ml_dtypes_type refused None
    return raw.view(ml_type)


def numpy_array(t: Tensor, dtype: Any = None, copy: Any = None) -> Any:
    """``Tensor.__array__``: what ``numpy.asarray(t)`` gets where ``__array_interface__`` cannot serve.

    NumPy asks ``__array_interface__`` first, which has no typestr for bfloat16, complex32 and the
    float8 types and refuses device memory; without ``__array__`` NumPy would then fall back to
    ``__len__``/``__getitem__`` and build an object array of 0-d tensors. Here those dtypes become
    ml_dtypes arrays sharing the memory, as in `to_numpy`; without ml_dtypes, and for device memory
    and float4_e2m1fn_x2, a `TypeError` names what is missing. A tensor that requires grad is
    refused with PyTorch's `RuntimeError`, as ``torch.Tensor.__array__`` does.

    Args:
        t: the tensor.
        dtype: NumPy's requested dtype, if any: a converting copy when it differs.
        copy: NumPy 2's ``copy``: True copies; False refuses a conversion (`ValueError`).
    """
    np = _peer("numpy", "__array__")
    array = to_numpy(t, api="__array__")
    if dtype is not None and array.dtype != np.dtype(dtype):
        if copy is False:
            msg = (
                f"__array__(): converting {t.dtype} to NumPy dtype {np.dtype(dtype)} needs a copy, "
                f"and copy=False forbids it. Pass copy=None, or convert with Tensor.to() first."
            )
            raise ValueError(msg)
        return array.astype(dtype)
    return array.copy() if copy else array


def _for_torch(t: Tensor) -> Tensor:
    """A detached view of ``t`` whose irrelevant negative strides (size-1 dims, empty tensors) are
    positive: they address nothing, and PyTorch aborts on any negative stride."""
    t = _dlpack_export.with_idle_strides_positive(t)
    return t.detach()


def to_torch(t: Tensor, *, force: bool = False, api: str = "torch") -> Any:
    """``Tensor.torch()``: a ``torch.Tensor`` sharing this memory, keeping ``requires_grad``.

    Zero-copy, through PyTorch's C exchange API when it has one (``Tensor.__dlpack_c_exchange_api__``,
    no capsule), else ``torch.from_dlpack``; the torch tensor keeps this memory alive. PyTorch cannot
    represent two things tensorbridge can, and sharing them would be silently wrong, so both are a
    `BufferError` unless ``force=True``, which hands PyTorch a private copy instead:

    * read-only memory: PyTorch has no read-only tensors and would write through;
    * negative strides: PyTorch has none, and ``torch.from_dlpack`` aborts on them (pytorch/pytorch#188023).

    ``api`` is the name errors give: ``torch`` for the method, ``to_torch`` for the function
    (`tensorbridge.to_torch`, which converts any array-like first).
    """
    torch = _peer("torch", api)
    strides = t._strides
    negative = len(strides) > 0 and min(strides) < 0
    reason = (
        "it is read-only and PyTorch has no read-only tensors (writes would reach the read-only memory)"
        if t._storage.readonly
        else "it has negative strides, which PyTorch cannot represent"
        if negative and _dlpack_export.has_negative_stride(t._shape, strides)
        else None
    )
    if reason is not None:
        if not force:
            msg = (
                f"{api}(): cannot share this tensor with PyTorch: {reason}. Pass force=True (or call "
                f"clone() first) to give PyTorch a copy."
            )
            raise BufferError(msg)
        src = _for_torch(t).clone()
    else:
        # Exported as it is unless it requires grad (refused by __dlpack__) or has negative strides.
        src = _for_torch(t) if negative or t._requires_grad else t
    out = _dlpack_export.exchange_export(
        src, torch.Tensor
    )  # no capsule, when torch has the C exchange API
    if out is None:
        out = torch.from_dlpack(src)
    return out.requires_grad_(True) if t._requires_grad else out


def to_jax(t: Tensor) -> Any:
    """``Tensor.jax()``: a ``jax.Array`` with this tensor's values, through DLPack.

    JAX arrays are immutable values, so whether JAX shares the memory is invisible: it shares compact
    host memory when it can (64-byte aligned, which tensorbridge allocations are) and copies otherwise.
    JAX is handed a compact, writable tensor: non-contiguous layouts are made contiguous first (its
    importer refuses broadcast, sliced and negative strides), and read-only memory is copied, because
    JAX asks for an unversioned capsule, which cannot say "read-only", and a donated JAX buffer may be
    written in place. ``requires_grad`` has no JAX equivalent and is dropped; 64-bit dtypes follow JAX's
    ``jax_enable_x64`` setting (without it JAX narrows them to 32 bits).
    """
    jax_dlpack = _peer("jax.dlpack", "jax")
    src = t.detach()
    if src.is_readonly:
        src = src.clone()
    return jax_dlpack.from_dlpack(src.contiguous())
