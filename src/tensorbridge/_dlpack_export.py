"""DLPack export: ``Tensor.__dlpack__`` and the C exchange API, for any tensor handed in.

This module sits below `Tensor`: it reads a tensor's storage, offset, shape, strides and dtype and
never builds one (a copy it needs comes from the tensor's own methods).

Export writes one block holding the managed struct, the shape and the strides (`_native.new_managed`:
from C in the compiled build, packed with `struct` into a ctypes array otherwise), wraps it in
a capsule, and keeps the block and the exported tensor in the export registry (`_exports`) until the
consumer calls our deleter. A capsule no consumer takes (still under its own name when it dies)
is released as its deleter would release it:

* **Compiled build:** the capsule's destructor is C (`_native_c`): it sets any pending exception
  aside, releases the export at once, and puts the exception back, so a consumer that refuses the
  capsule keeps its own error.
* **Pure-Python build:** the capsule has **no destructor**: one written in Python would run while
  a rejecting consumer's exception is pending and turn it into ``SystemError``. The registry is
  *reaped* instead: by exports and garbage collections once a few capsules are pending, by every
  full collection, and at exit. A capsule renamed ``used_*`` belongs to its consumer; one still
  carrying its own name that nothing but the registry refers to was abandoned, and the reaper
  releases it. The price: an abandoned capsule keeps its tensor alive until the next reap rather
  than until it is collected (at most 16 such capsules, or twice the number of capsules a caller
  keeps, outside full collections). A reap costs about 1 µs per abandoned capsule and 0.1 µs per
  capsule still held; amortised, an export pays well under 1 µs for it.

Exports through the C exchange API have no capsule and never wait for a reap.

Deviations from PyTorch 2.13 (each one deliberate):

* Read-only tensors export ``READ_ONLY`` capsules and are never exported as legacy capsules.
* A view with negative strides is exported as a compact copy flagged ``IS_COPIED`` (``copy=None``)
  or refused (``copy=False``): ``torch.from_dlpack`` aborts the process on negative strides
  (pytorch/pytorch#188023). Negative strides that address nothing (on dimensions of size 1, or in
  a tensor without elements) are exported as their absolute values, with no copy.
* Memory that is not host-accessible (CUDA, ROCm, Metal, ...) is re-exported as it is and never
  dereferenced on the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from typing import TYPE_CHECKING, Any, Final

from . import _capi, _cuda, _exports, _native
from ._args import GRAD_MSG_EXPORT, as_copy
from ._device import ADDRESSABLE_TYPES, CPU, Device, DLDeviceType
from ._dlpack_abi import (
    DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPACK_VERSION,
    DLTENSOR,
    DLTENSOR_VERSIONED,
)
from ._dlpack_c import exchange_api_of
from ._errors import caller_module, short_repr
from ._exports import hold_capsule, hold_managed
from ._native import capsule_new

if TYPE_CHECKING:
    from ._storage import Storage
    from ._tensor import Tensor

__all__ = ["dlpack_export", "exchange_export", "has_negative_stride"]

_kDLCPU: Final = int(DLDeviceType.kDLCPU)
_kDLCUDA: Final = int(DLDeviceType.kDLCUDA)
_kDLROCM: Final = int(DLDeviceType.kDLROCM)


def _release_export(
    address: int,
    _finalizing: Any = sys.is_finalizing,
    _forget: Any = _exports.forget_managed,
) -> None:
    """What the ``deleter`` of every managed tensor tensorbridge exports does: forget the export.

    It reaches C through `_native.void_callback`: any thread takes the GIL, and a consumer's pending
    exception is kept where the build allows. What it needs is bound as defaults, so it works while
    module globals are being cleared; once the interpreter is finalising it does nothing (leak,
    never crash).
    """
    if address and not _finalizing():
        _forget(address)


_DELETER_ADDRESS: Final = _native.void_callback(_release_export)

# The compiled build gives every capsule a C destructor that releases the export of one no consumer
# took, at once, as the deleter would (`_exports.forget_unwatched`): the registry then holds the
# export but need not watch the capsule. Without it (None), `_exports` watches each capsule.
_CAPSULE_DESTRUCTOR: Final = _native.dlpack_capsule_destructor(_exports.forget_unwatched)


def dlpack_export(t: Tensor, stream: Any, max_version: Any, dl_device: Any, copy: Any) -> Any:
    """``Tensor.__dlpack__``: a capsule sharing ``t``'s memory.

    A ``"dltensor_versioned"`` capsule (version 1.3) for ``max_version >= (1, 0)``, else a legacy
    ``"dltensor"`` capsule. It may be consumed once. tensorbridge keeps ``t`` and its memory alive
    until the consumer calls the deleter, even after every tensorbridge object is gone; a capsule
    dropped without being consumed is released by the next reap (see the module docstring).

    Args:
        t: the tensor.
        stream: None or an int. Host memory takes None and -1 only. CUDA: None, -1, 1, 2 or a
            ``cudaStream_t``, which is made to wait on the legacy default stream, where tensorbridge
            has the data; 0 is refused (ambiguous: DLPack leaves its meaning undefined). ROCm:
            None, -1 and 0.
        max_version: None or a 2-sequence of ints (tuple or list), the consumer's newest version.
        dl_device: None, the tensor's own ``__dlpack_device__()``, or ``(1, 0)`` for host memory.
        copy: None (copy only when needed), True (always; flagged ``IS_COPIED``), False (never).

    Raises:
        BufferError: requires_grad, a read-only tensor asked for as a legacy capsule, an
            unsupported device or stream, a copy that is needed but refused or impossible.
        TypeError: an argument of the wrong type.
    """
    return _export(t, stream, max_version, dl_device, copy, "__dlpack__")


def _export(  # the __dlpack__ arguments, plus the API name for messages
    t: Tensor, stream: Any, max_version: Any, dl_device: Any, copy: Any, api: str
) -> Any:
    if t._requires_grad:
        msg = f"{api}(): {GRAD_MSG_EXPORT}."
        raise BufferError(msg)
    if copy is not None:
        copy = as_copy(copy, api)
    versioned = max_version is not None and _wants_versioned(max_version, api)
    storage = t._storage
    device = storage.device
    if stream is not None:
        _check_stream(stream, device, api)
    if dl_device is not None:
        device = _export_device(dl_device, device, copy, api)
    copied = copy is True
    if not copied:
        for stride in t._strides:  # a loop, not min(): cheaper for the few strides a tensor has
            if stride < 0:
                if has_negative_stride(t._shape, t._strides):
                    copied = True
                else:
                    t = with_idle_strides_positive(t)  # nothing to copy: they address nothing
                break
    if copied:
        t = _export_copy(t, copy, api)
        storage = t._storage
    elif storage.readonly and not versioned:
        raise _legacy_readonly_refusal(api)
    if stream is not None and stream > 2 and device.dlpack_type == DLDeviceType.kDLCUDA:
        _cuda_wait_on_legacy_stream(device.index or 0, stream, api)
    return _new_capsule(t, storage, device, versioned, copied)


# What to do instead of a legacy export of a read-only tensor, by the library that asked for it
# (the top-level package of the first caller outside tensorbridge): only a library whose own
# Python code calls ``__dlpack__`` is known; NumPy's and CuPy's consumers are compiled, and look
# like the user's own call.
_JAX_FIX: Final = (
    "JAX asks for one: call t.jax(), which hands JAX a copy (its arrays are immutable values)"
)
_LEGACY_CONSUMERS: Final = {
    "jax": _JAX_FIX,
    "jaxlib": _JAX_FIX,
    "torch": (
        "this PyTorch asks for one, and has no read-only tensors: call t.torch(force=True), "
        "which hands PyTorch a copy"
    ),
}


def _legacy_readonly_refusal(api: str) -> BufferError:
    """The refusal of a legacy (unversioned) export of a read-only tensor, with the fix that fits
    whoever asked: `to_dlpack` makes legacy capsules only; a consumer known by its Python frame
    (`_LEGACY_CONSUMERS`) has its own; any other caller of ``__dlpack__`` (a compiled consumer
    such as NumPy before 2.1, or the user) gets every way out. Error path only."""
    if api != "__dlpack__":
        fix = (
            f"{api}() makes legacy capsules only: pass it t.clone() (writable), or hand the "
            f"tensor itself to a consumer that calls __dlpack__(max_version=(1, 0))"
        )
    else:
        fix = _LEGACY_CONSUMERS.get(caller_module().partition(".")[0]) or (
            "the consumer asked for one (no max_version), so it predates DLPack 1.0: for NumPy "
            "call t.numpy() (read-only, zero-copy) or np.from_dlpack(t) with NumPy 2.1 or later; "
            "for JAX t.jax(); else export a writable copy (t.clone(), or __dlpack__(copy=True)), "
            "or call __dlpack__(max_version=(1, 0)) yourself"
        )
    msg = (
        f"{api}(): cannot export a read-only tensor as an unversioned 'dltensor' capsule, since "
        f"signalling readonly is unsupported by DLPack before version 1.0; {fix}."
    )
    return BufferError(msg)


def has_negative_stride(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True when a stride that addresses memory is negative.

    The stride of a dimension of size 1 is never multiplied by a non-zero index, and a tensor
    without elements addresses nothing at all: their strides are irrelevant, and a negative one
    needs no copy before an export to a consumer that refuses negative strides (PyTorch aborts on
    them, pytorch/pytorch#188023). The one rule for every exporter (`_export`, ``Tensor.torch()``).
    """
    if not strides or min(strides) >= 0 or 0 in shape:
        return False
    return any(stride < 0 and size > 1 for size, stride in zip(shape, strides))


def with_idle_strides_positive(t: Tensor) -> Tensor:
    """``t``, or a view of the same memory whose irrelevant negative strides are made positive.

    Irrelevant: those `has_negative_stride` ignores (dimensions of size 1; every dimension of a
    tensor without elements). Their absolute value keeps the memory the view addresses unchanged.
    """
    strides = t._strides
    if not strides or min(strides) >= 0:
        return t
    empty = 0 in t._shape
    strides = tuple(
        -stride if stride < 0 and (empty or size == 1) else stride
        for size, stride in zip(t._shape, strides)
    )
    return t._view(t._offset, t._shape, strides)


def _wants_versioned(max_version: Any, api: str) -> bool:
    if max_version is None:
        return False
    if type(max_version) in (tuple, list) and len(max_version) == 2:
        major, minor = max_version
        if type(major) is int and type(minor) is int:
            return major >= 1
    msg = (
        f"{api}(): max_version must be None or a (major, minor) pair of ints; got "
        f"{short_repr(max_version)}. Pass e.g. max_version=(1, 0)."
    )
    raise TypeError(msg)


def _check_stream(stream: Any, device: Device, api: str) -> None:
    """Validate ``stream`` for the tensor's device, as the DLPack standard defines it, with
    PyTorch's texts."""
    if type(stream) is not int:
        msg = (
            f"{api}(): stream must be ``int`` or ``none``; got {short_repr(stream)} "
            f"({type(stream).__name__})."
        )
        raise TypeError(msg)
    kind = device.dlpack_type
    if device.is_host_accessible:
        ok, why = stream == -1, "stream should be None on cpu."
    elif kind == DLDeviceType.kDLCUDA:
        ok, why = stream == -1 or stream >= 1, f"unsupported stream on CUDA: {stream}."
    elif kind == DLDeviceType.kDLROCM:
        # 0 is ROCm's legacy default; a raw hipStream_t would need the HIP runtime to be ordered.
        ok, why = stream in (-1, 0), f"unsupported stream on ROCm: {stream}; use None, -1 or 0."
    else:
        ok, why = stream == -1, f"stream should be None on {device.type}."
    if not ok:
        msg = f"{api}(): {why} Got stream={short_repr(stream)}; pass stream=None for this tensor."
        raise BufferError(msg)


def _export_device(dl_device: Any, device: Device, copy: bool | None, api: str) -> Device:
    """The device to report for ``dl_device``: the tensor's own, or the CPU for host memory."""
    if not (
        type(dl_device) is tuple
        and len(dl_device) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in dl_device)
    ):
        msg = (
            f"{api}(): dl_device must be a tuple of two ints or None; got {short_repr(dl_device)}."
        )
        raise TypeError(msg)
    kind, index = int(dl_device[0]), int(dl_device[1])
    own_kind, own_index = device.to_dlpack()
    if kind == own_kind and (index == own_index or kind == _kDLCPU):
        return device
    if kind == _kDLCPU and device.is_host_accessible:
        return CPU  # pinned and managed memory are CPU memory too: no copy
    target = Device.from_dlpack(kind, index)  # "Unsupported device_type: N" for unknown types
    if copy is False:
        msg = (
            f"{api}(): cannot move (i.e. copy=False) tensor from {device} to {target} without "
            f"copying."
        )
    elif kind == _kDLCPU:
        msg = (
            f"{api}(): cannot copy {device} memory to the CPU: tensorbridge does not copy "
            f"between devices. Export to the tensor's own device and copy with its library."
        )
    else:
        msg = (
            f"{api}(): Unsupported device_type: {kind}. tensorbridge exports to the tensor's "
            f"own device {(int(own_kind), own_index)} or, from host memory, to the CPU (1, 0); "
            f"it does not copy memory from {device} to {target}."
        )
    raise BufferError(msg)


def _export_copy(t: Tensor, copy: bool | None, api: str) -> Tensor:
    """A compact copy, for ``copy=True`` or negative strides (pytorch/pytorch#188023)."""
    if copy is False:
        msg = (
            f"{api}(): the tensor has negative strides {t._strides}, which some consumers "
            f"cannot take (torch.from_dlpack aborts the process), and copy=False forbids the "
            f"compact copy tensorbridge exports instead. Use copy=None, or export "
            f"t.contiguous()."
        )
        raise BufferError(msg)
    if not t._storage.device.is_host_accessible:
        msg = (
            f"{api}(): a copy is needed (copy=True or negative strides {t._strides}), but "
            f"tensorbridge cannot copy memory on {t.device}. Copy it with the library that owns "
            f"the memory."
        )
        raise BufferError(msg)
    return t.clone()


# How the managed struct is written: `_native.new_managed`, bound once.
_write_managed: Final = _native.new_managed


def _new_capsule(t: Tensor, storage: Storage, device: Device, versioned: bool, copied: bool) -> Any:
    """Write the managed struct, shape and strides into one block; wrap it; register both."""
    name = DLTENSOR_VERSIONED if versioned else DLTENSOR
    address, block = _new_managed(t, storage, device, versioned, copied)
    capsule = capsule_new(address, name, _CAPSULE_DESTRUCTOR)
    if _CAPSULE_DESTRUCTOR is None:
        hold_capsule(address, block, t, name, capsule)
    else:
        hold_managed(address, block, t, name)
    return capsule


def _idle_strides_in_int64(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """``strides``, with each stride that addresses nothing and does not fit DLPack's int64
    fields made 0 rather than refused: every stride of a tensor without elements (row-major
    strides of a huge empty shape), and the stride of a dimension of size 1, which is never
    multiplied by a non-zero index (``as_strided`` takes any value there, and so does a producer's
    capsule: INT64_MIN, which `with_idle_strides_positive` cannot negate)."""
    empty = 0 in shape
    return tuple(
        stride if -(2**63) <= stride < 2**63 or not (empty or size == 1) else 0
        for size, stride in zip(shape, strides)
    )


def _new_managed(
    t: Tensor, storage: Storage, device: Device, versioned: bool, copied: bool
) -> tuple[int, Any]:
    """Write a ``DLManagedTensor(Versioned)`` for ``t`` (whose storage the caller has read), with
    its shape and strides, into one block; return its address and the block, which the caller
    registers with ``t`` until its deleter (`_release_export`) runs."""
    shape, strides = t._shape, t._strides
    dtype = t._dtype
    pair = device._dlpack  # device.to_dlpack(), without the method call
    if 0 in shape:
        data, byte_offset = 0, 0  # dlpack.h: NULL data for size-0 tensors
    else:
        data, byte_offset = storage.ptr, t._offset
        if byte_offset:
            byte_offset *= dtype.itemsize
            if pair[0] in ADDRESSABLE_TYPES:
                data, byte_offset = data + byte_offset, 0  # as NumPy and PyTorch do
            # else: ``data`` may be a handle, to which nothing may be added
    flags = 0  # a legacy struct has no flags
    if versioned:
        if copied:
            flags = DLPACK_FLAG_BITMASK_IS_COPIED
        elif storage.readonly:
            flags = DLPACK_FLAG_BITMASK_READ_ONLY
    try:
        return _write_managed(
            versioned,
            DLPACK_VERSION,
            _DELETER_ADDRESS,
            flags,
            data,
            pair,
            dtype.dlpack,
            byte_offset,
            shape,
            strides,
        )
    except OverflowError:
        idle = _idle_strides_in_int64(shape, strides)
    if idle != strides:  # strides that address nothing were past int64: they are not refused
        with contextlib.suppress(OverflowError):
            return _write_managed(
                versioned, DLPACK_VERSION, _DELETER_ADDRESS, flags, data, pair, dtype.dlpack,
                byte_offset, shape, idle,
            )  # fmt: skip
    # Only a tensor imported from a lying producer gets here: e.g. a device handle plus
    # byte_offset beyond 64 bits. DLPack's fixed-width fields cannot carry it.
    msg = (
        f"__dlpack__(): the tensor's layout (data=0x{data:x}, byte_offset={byte_offset}, "
        f"shape={list(shape)}, strides={list(strides)}) does not fit DLPack's 64-bit "
        f"fields; it cannot be exported. Export a clone() of host memory instead."
    )
    raise BufferError(msg) from None


def exchange_export(t: Tensor, cls: type) -> Any:
    """``t`` as an instance of ``cls``, through the C exchange API that ``cls`` advertises.

    ``managed_tensor_to_py_object_no_sync`` wraps a managed tensor with no capsule and no
    ``__dlpack__`` call. The caller has done the checks ``__dlpack__`` would do (requires_grad,
    read-only, negative strides, ...). For host memory only: ``*_no_sync`` orders nothing on a
    stream. The new object owns the export and calls our deleter when it dies, as a capsule's
    consumer would. Returns None, having released the export, when ``cls`` has no exchange API
    or its function refuses the tensor: the caller then goes through ``from_dlpack``, whose
    refusal is the framework's own.
    """
    exchange = exchange_api_of(cls)
    storage = t._storage
    if exchange is None or not storage.device.is_host_accessible:
        return None
    address, block = _new_managed(t, storage, storage.device, True, False)
    hold_managed(address, block, t, DLTENSOR_VERSIONED)
    out = ctypes.c_void_p()
    try:
        failed = exchange.to_py(address, ctypes.byref(out))
    except Exception:  # from_dlpack raises the refusal again, in the framework's words
        failed = True
    if failed or not out.value:
        # Forgetting an export twice is harmless, should the framework have done it too.
        _exports.forget_managed(address)
        return None
    return _capi.steal(out.value)


# -------------------------------------------------------------------------------------------------
# CUDA stream ordering for re-exported device memory
# -------------------------------------------------------------------------------------------------


def _cuda_wait_on_legacy_stream(device_id: int, stream: int, api: str) -> None:
    """Make the consumer's ``stream`` wait for the data.

    tensorbridge imports CUDA memory with ``stream=1``, so its producer made the data ready on the
    legacy default stream. Stream 1 (that stream) and 2 (per-thread default, which synchronises
    with it) need nothing; a raw stream may be non-blocking and gets an event wait.
    """
    driver = _cuda.driver()
    if driver is None:
        msg = (
            f"{api}(): stream={stream} needs the CUDA driver (libcuda) to order the consumer's "
            f"stream after the data, and none could be loaded. Pass stream=None, 1 or -1."
        )
        raise BufferError(msg)
    driver.wait_on_legacy_stream(stream, device_id, api)
