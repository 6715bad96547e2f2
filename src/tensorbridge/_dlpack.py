"""DLPack import (`from_dlpack`) and export (``Tensor.__dlpack__``, `to_dlpack`).

Import follows the array API's consumer pattern: ask the producer for the newest
version tensorbridge understands, accept whichever capsule comes back, validate every field, build
the tensor, and only then rename the capsule to ``used_*``. The managed tensor then belongs to a
`_storage.DLPackStorage`, which calls the producer's ``deleter`` exactly once, when the last view
dies. A producer type that advertises the DLPack C exchange API (a
``__dlpack_c_exchange_api__`` capsule on the type; PyTorch >= 2.10) hands its host tensors over
through that table instead, with no ``__dlpack__`` call and no capsule, and `exchange_export` hands tensors to it the same way (``Tensor.torch()``).

Export writes one ctypes block holding the managed struct, the shape and the strides, wraps it in a
capsule, and keeps the block and the exported tensor in a registry until the consumer calls our
deleter. The capsule has **no destructor**: a destructor written in Python would run while a
rejecting consumer's exception is pending and turn it into ``SystemError``. The
registry is *reaped* instead: by exports and garbage collections once a few capsules are pending,
by every full collection, and at exit. A capsule renamed ``used_*`` belongs to its consumer; one
still carrying its own name that nothing but the registry refers to was abandoned, and the reaper
releases it as its deleter would. The price: an abandoned, never-consumed capsule keeps its tensor
alive until the next reap rather than until it is collected (at most 16 such capsules, or twice the
number of capsules a caller keeps, outside full collections). A reap costs about 1 µs per abandoned
capsule and 0.1 µs per capsule still held; amortised, an export pays well under 1 µs for it.
Exports through the C exchange API have no capsule and never wait for a reap.

Deviations from PyTorch 2.13 (each one deliberate):

* ``READ_ONLY`` capsules import read-only; read-only tensors are never exported as legacy capsules.
* Legacy (flagless) capsules import **writable**, as in PyTorch (NumPy makes them read-only),
  except from a producer that also speaks the Arrow C data interface (pyarrow 15 exports legacy
  capsules only): Arrow memory is immutable, so those capsules import read-only.
* Non-producers (`NotDLPackError`, a `TypeError` and an `AttributeError`), foreign capsules
  (`TypeError`) and consumed capsules (PyTorch's `RuntimeError`) get three distinct errors, where
  PyTorch raises its "invalid capsule" `RuntimeError` for all three.
* A producer is asked again with fewer keywords only when its signature rejected them (a
  ``__dlpack__`` older than the 2023.12 array API, such as NumPy's before 2.1), and only with the
  keywords it takes: never when a ``device`` move or a device ``copy`` would be lost. A
  ``copy=True`` request it cannot take is met by copying the imported host memory. PyTorch
  retries on every `TypeError`, even ones unrelated to the keywords.
* A view with negative strides is exported as a compact copy flagged ``IS_COPIED`` (``copy=None``)
  or refused (``copy=False``): ``torch.from_dlpack`` aborts the process on negative strides
  (pytorch/pytorch#188023). Negative strides that address nothing (on dimensions of size 1, or in
  a tensor without elements) are exported as their absolute values, with no copy. Imports keep
  negative strides as they are.
* A PyTorch negative-bit view is resolved before import (PyTorch exports it without its sign).
* Memory that is not host-accessible (CUDA, ROCm, Metal, ...) is carried and re-exported as it is,
  and never dereferenced on the host.
"""

from __future__ import annotations

import ctypes
import inspect
import operator
import struct
import sys
from typing import Any, Final, TypeVar

from . import _capi, _cuda, _exports
from ._args import as_copy
from ._device import CPU, Device, DLDeviceType
from ._dlpack_abi import (
    DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPACK_MAJOR_VERSION,
    DLPACK_MINOR_VERSION,
    DLTENSOR,
    DLTENSOR_VERSIONED,
    USED_DLTENSOR,
    USED_DLTENSOR_VERSIONED,
    DLPackDeleter,
)
from ._dtype import BY_DLPACK, DType
from ._errors import NotDLPackError, short_repr
from ._layout import MAX_NDIM, contiguous_strides
from ._storage import ADDRESS_LIMIT, DLPackStorage, Refusal, Storage, locate
from ._tensor import Tensor

__all__ = ["dlpack_export", "exchange_export", "from_dlpack", "to_dlpack"]

# The version asked of producers and reported on export.
_MAX_VERSION: Final = (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)
_MAX_VERSION_ONLY: Final = {"max_version": _MAX_VERSION}

_kDLCPU: Final = int(DLDeviceType.kDLCPU)
_kDLCUDA: Final = int(DLDeviceType.kDLCUDA)
_kDLROCM: Final = int(DLDeviceType.kDLROCM)

# Device types whose producers get no ``stream`` keyword: memory the host reads directly.
_HOST_TYPES: Final = frozenset(
    int(d)
    for d in (
        DLDeviceType.kDLCPU,
        DLDeviceType.kDLCUDAHost,
        DLDeviceType.kDLROCMHost,
        DLDeviceType.kDLCUDAManaged,
    )
)
# Devices whose ``data`` is an address in a linear address space, so that ``data + byte_offset``
# is the first element. Elsewhere (OpenCL ``cl_mem``, Metal ``MTLBuffer``, Vulkan, WebGPU, ...)
# ``data`` may be an opaque handle: the offset stays in ``byte_offset`` (pytorch/pytorch#168193).
_ADDRESSABLE: Final = _HOST_TYPES | {_kDLCUDA, _kDLROCM, int(DLDeviceType.kDLOneAPI)}

_TORCH_CONSUMED: Final = (
    "from_dlpack received an invalid capsule. Note that DLTensor capsules can be consumed only "
    "once, so you might have already constructed a tensor from it once."
)
_TORCH_CAPSULE_KWARGS: Final = (
    "device and copy kwargs not supported when ext_tensor is already a DLPack capsule."
)
_TORCH_GRAD: Final = "Can't export tensors that require gradient, use tensor.detach()"


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
_VERSIONED: Final = struct.Struct("@IIPPQ" + _DLTENSOR_READ)
# DLManagedTensor: dl_tensor, manager_ctx, deleter.
_LEGACY: Final = struct.Struct("@" + _DLTENSOR_READ + "PP")
# DLTensor as written on export (the dtype spelled out).
_DLTENSOR_WRITE: Final = "PiiiBBHPPQ"

# The address space as one read-only memoryview, from address 1 (PyMemoryView_FromMemory wants a
# non-NULL start; NULL pointers are checked before any read). On 64-bit platforms it covers every
# user-space address; `_read` handles addresses above sys.maxsize on 32-bit ones.
_MEMORY_BASE: Final = 1
_MEMORY: Final = _capi.PyMemoryView_FromMemory(
    _MEMORY_BASE, sys.maxsize - _MEMORY_BASE, _capi.PyBUF_READ
)
_MEMORY_COVERS_ALL: Final = sys.maxsize >= 2**63 - 1
_INT64_ARRAYS: Final = [struct.Struct(f"@{n}q") for n in range(2 * MAX_NDIM + 1)]


def _dtype_word(code: int, bits: int, lanes: int) -> int:
    word: int = struct.unpack("@I", struct.pack("@BBH", code, bits, lanes))[0]
    return word


_DTYPE_BY_WORD: Final[dict[int, DType]] = {_dtype_word(*k): d for k, d in BY_DLPACK.items()}


def _read(fmt: struct.Struct, address: int) -> tuple[Any, ...]:
    """Unpack ``fmt`` from process memory at ``address``, a pointer the producer gave us."""
    try:
        return fmt.unpack_from(_MEMORY, address - _MEMORY_BASE)
    except (struct.error, OverflowError):  # beyond the view, or beyond Py_ssize_t
        pass
    if _MEMORY_COVERS_ALL or address <= 0 or address + fmt.size > ADDRESS_LIMIT:
        msg = (
            f"from_dlpack(): the capsule points outside the address space (0x{address:x}); "
            f"the producer wrote an invalid capsule."
        )
        raise BufferError(msg) from None
    return fmt.unpack(ctypes.string_at(address, fmt.size))


# -------------------------------------------------------------------------------------------------
# Import
# -------------------------------------------------------------------------------------------------

_CapsuleType: Final = _capi.CapsuleType

# Producer deleters are called through one ctypes function object per address (NumPy and PyTorch
# each use one deleter for all their tensors).
_DELETERS: dict[int, Any] = {}

_K = TypeVar("_K")
_V = TypeVar("_V")
# Lookup tables keyed by what producers hand us (deleter addresses, types) are bounded: a producer
# that makes deleters or types on the fly must not grow them without end.
_REMEMBER_MAX: Final = 256


def _remember(table: dict[_K, _V], key: _K, value: _V) -> _V:
    """Store ``value`` in a bounded lookup table (emptied when full) and return it."""
    if len(table) >= _REMEMBER_MAX:
        table.clear()
    table[key] = value
    return value


def from_dlpack(ext_tensor: Any, *, device: Any = None, copy: Any = None) -> Tensor:
    """A tensor sharing the memory of a DLPack producer or capsule, as ``torch.from_dlpack``.

    Args:
        ext_tensor: an object with ``__dlpack__`` (a NumPy array, a PyTorch tensor, a JAX array, a
            tensorbridge tensor, ...), or an unconsumed ``"dltensor"``/``"dltensor_versioned"``
            capsule.
        device: where the result must live (``"cpu"``, a `Device`); None keeps the producer's
            device. Another device is asked of the producer (``dl_device``): tensorbridge itself
            never moves memory between devices.
        copy: True always copies, False never copies (a request that needs a copy raises), None
            copies only when needed.

    Returns:
        A tensor viewing the producer's memory (or a private copy), read-only when the capsule
        carries ``READ_ONLY``. The memory stays valid while any view of the result lives: the
        managed tensor's deleter runs exactly once, when the last view dies (on any thread; never
        during interpreter shutdown, where the memory is leaked instead).

    Raises:
        NotDLPackError: ``ext_tensor`` is neither a producer nor a capsule; a `TypeError` and an
            `AttributeError` (``tensorbridge.NotDLPackError``).
        TypeError: a capsule of another kind; ``device``/``copy`` of a wrong type; a
            ``__dlpack_device__`` that does not return a ``(device_type, device_id)`` pair.
        RuntimeError: the capsule was consumed already.
        BufferError: the data cannot be represented (dtype, device, major version, layout); the
            producer's own `BufferError` passes through unchanged. The capsule stays unconsumed.
        ValueError: ``copy=False`` but the request needs a copy or a move.

    Note:
        A producer type that advertises the DLPack C exchange API (``__dlpack_c_exchange_api__``;
        ``torch.Tensor`` from PyTorch 2.10) hands its host memory over through that
        table instead, with no ``__dlpack__`` call and no capsule. The result, the checks and the
        errors are those of the ``__dlpack__`` path.

    Example:
        >>> import tensorbridge as tb
        >>> t = tb.arange(4)
        >>> t2 = tb.from_dlpack(t)
        >>> t2[0] = 7
        >>> t
        tensor([7, 1, 2, 3])
    """
    if device is None and copy is None:
        cls = type(ext_tensor)
        if cls is Tensor:
            return _alias(ext_tensor)
        immutable = False
        if cls is not _CapsuleType:
            producer = _PRODUCERS.get(cls) or _producer(cls)
            if producer.exchange is not None:
                t = _exchange_import(producer, ext_tensor)
                if t is not None:
                    return t
            ext_tensor = _request(ext_tensor, producer, None, None)
            immutable = producer.immutable
        t, used_name, deleter = _open(ext_tensor, immutable)
        # `_commit`, inlined on the hot path: rename, then arm the storage.
        _capi.PyCapsule_SetName(ext_tensor, used_name)
        if deleter:
            storage: Any = t._storage  # a DLPackStorage
            storage.deleter = _DELETERS.get(deleter) or _deleter_function(
                deleter
            )  # cache hit inline
        return t
    return _from_dlpack_with(ext_tensor, _as_target(device), as_copy(copy, "from_dlpack"))


def _alias(t: Tensor) -> Tensor:
    """A tensorbridge tensor: a new view of its memory, what a capsule round trip would give."""
    if t._requires_grad:
        msg = f"from_dlpack(): {_TORCH_GRAD}."
        raise BufferError(msg)
    return Tensor._make(t._storage, t._offset, t._shape, t._strides, t._dtype)


def _not_a_producer(obj: Any) -> NotDLPackError:
    msg = (
        f"from_dlpack(): expected an object with a __dlpack__ method or a DLPack capsule; got "
        f"an object of type {type(obj).__name__}. Pass a tensor or array of a DLPack-aware "
        f"library (NumPy, PyTorch, JAX, CuPy, ...) or a capsule made by its to_dlpack()."
    )
    return NotDLPackError(msg)


def _as_target(device: Any) -> Device | None:
    if device is None or isinstance(device, Device):
        return device
    if isinstance(device, str):
        return Device(device)  # ValueError for an unknown name, as the array API expects
    msg = (
        f"from_dlpack(): device must be a string like 'cpu' or a tensorbridge.device; got "
        f"{short_repr(device)} ({type(device).__name__})."
    )
    raise TypeError(msg)


# -------------------------------------------------------------------------------------------------
# Producer types, and the C exchange API
#
# What `from_dlpack` needs to know about a producer depends on its type only, so it is looked up
# once per type: whether instances carry PyTorch's lazy negative bit, and whether the type
# advertises the DLPack C exchange API. Called through PYFUNCTYPE prototypes,
# torch's `managed_tensor_from_py_object_no_sync` hands over an owned DLManagedTensorVersioned* in
# about a fifth of the time of `Tensor.__dlpack__` plus `__dlpack_device__`, and with no capsule.
# -------------------------------------------------------------------------------------------------

_EXCHANGE_API_NAME: Final = b"dlpack_exchange_api"
# DLPackExchangeAPIHeader: version {major, minor}, prev_api; then the five function pointers
# (managed_tensor_allocator, managed_tensor_from_py_object_no_sync,
# managed_tensor_to_py_object_no_sync, dltensor_from_py_object_no_sync, current_work_stream).
_EXCHANGE_HEADER: Final = struct.Struct("@IIP")
_EXCHANGE_FUNCTIONS: Final = struct.Struct("@5P")
_EXCHANGE_CHAIN_MAX: Final = 8  # prev_api links followed at most (a cycle must not hang us)

# int (*)(void* py_object, DLManagedTensorVersioned** out): non-zero (with a Python error set,
# which PYFUNCTYPE raises) when the object cannot be exported.
_FromPyObject: Final = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p)
)
# int (*)(DLManagedTensorVersioned* tensor, void** out_py_object): takes ownership of the tensor
# and writes a new reference. The reference comes back as an address, so that its ownership can be
# taken over exactly once (a ctypes py_object out-parameter would leak it).
_ToPyObject: Final = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
)


class _ExchangeAPI:
    """The functions tensorbridge calls in a producer type's ``DLPackExchangeAPI`` table."""

    __slots__ = ("from_py", "to_py")

    def __init__(self, from_py: Any, to_py: Any) -> None:
        self.from_py = from_py  # managed_tensor_from_py_object_no_sync
        self.to_py = to_py  # managed_tensor_to_py_object_no_sync


class _Producer:
    """What `from_dlpack` knows about one producer type.

    Attributes:
        neg_bit: instances may be PyTorch negative-bit views (``is_neg``/``resolve_neg``, duck
            typed: torch.Tensor and its subclasses), which are resolved before export: PyTorch
            exports them without their sign.
        exchange: the C exchange API the type itself advertises, major version 1; None without.
        immutable: the type also speaks the Arrow C data interface (``__arrow_c_array__``), whose
            memory is immutable: its legacy capsules, which cannot say ``READ_ONLY``, are imported
            read-only. pyarrow 15 exports only such capsules (pyarrow 26 answers ``max_version``
            with READ_ONLY versioned ones); writing through them would change an Arrow array
            that every other view of it takes for constant.
        screen: for ``torch.Tensor``, ``torch.strided``: its exchange function checks less than
            its ``__dlpack__`` (no autograd, conjugate or negative bit, layout), so tensors with any
            of those take the ``__dlpack__`` path, which refuses or resolves them as before.
    """

    __slots__ = ("exchange", "immutable", "neg_bit", "screen")

    def __init__(self, cls: type) -> None:
        self.neg_bit = hasattr(cls, "is_neg") and hasattr(cls, "resolve_neg")
        self.immutable = hasattr(cls, "__arrow_c_array__")
        self.exchange = exchange_api(cls)
        torch = sys.modules.get("torch")
        self.screen = torch.strided if torch is not None and cls is torch.Tensor else None


_PRODUCERS: dict[type, _Producer] = {}


def _producer(cls: type) -> _Producer:
    return _remember(_PRODUCERS, cls, _Producer(cls))


def exchange_api(cls: type) -> _ExchangeAPI | None:
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
        major, _minor, previous = _read(_EXCHANGE_HEADER, address)
        if major == DLPACK_MAJOR_VERSION:
            break
        address = previous
    else:
        return None
    _allocator, from_py, to_py, _view, _stream = _read(
        _EXCHANGE_FUNCTIONS, address + _EXCHANGE_HEADER.size
    )
    if not from_py or not to_py:  # neither may be NULL (dlpack.h); a broken table is not used
        return None
    return _ExchangeAPI(_FromPyObject(from_py), _ToPyObject(to_py))


def _exchange_import(producer: _Producer, obj: Any) -> Tensor | None:
    """Import ``obj`` through its type's ``managed_tensor_from_py_object_no_sync``.

    Returns None to send the caller down the ``__dlpack__`` path, which then refuses, resolves or
    synchronises in the producer's own words: for what the screen catches, for anything the
    exchange function refuses, and for memory that is not host-accessible (``*_no_sync`` does not
    order the data on any stream; ``__dlpack__`` is asked with one).
    """
    screen = producer.screen
    if screen is not None and (
        obj.requires_grad or obj.is_conj() or obj.is_neg() or obj.layout is not screen
    ):
        return None
    out = ctypes.c_void_p()
    try:
        failed = producer.exchange.from_py(obj, ctypes.byref(out))  # type: ignore[union-attr]
    except Exception:  # the __dlpack__ path raises the producer's refusal again, in its words
        return None
    managed = out.value
    if failed or not managed:
        return None
    # The managed tensor is ours from here on: its deleter runs exactly once, whatever happens.
    try:
        t, deleter = _versioned(managed)
    except BaseException:
        _release_unowned(managed)
        raise
    if not t._storage.device.is_host_accessible:
        _release_unowned(managed)
        return None
    _arm(t._storage, deleter)
    return t


# -------------------------------------------------------------------------------------------------
# Capsules
# -------------------------------------------------------------------------------------------------


def _request(obj: Any, producer: _Producer, target: Device | None, copy: bool | None) -> Any:
    """Call ``obj.__dlpack__`` as a current consumer does; return the capsule.

    Asks for ``max_version=(1, 3)``, plus ``dl_device``/``copy`` when requested. tensorbridge has no
    stream of its own: for CUDA/ROCm data it passes the legacy default stream explicitly (CUDA 1,
    ROCm 0), so the producer makes the data ready there; on re-export, consumer streams are ordered
    after that stream. CPU producers get no ``stream`` (NumPy refuses any). A producer whose
    signature rejects keywords (one older than the 2023.12 array API, such as NumPy before 2.1) is
    asked again with the keywords it takes, when nothing is lost that tensorbridge cannot make up
    for (see `_fewer_keywords`).
    """
    export = getattr(obj, "__dlpack__", None)
    if export is None:
        raise _not_a_producer(obj)
    if producer.neg_bit and obj.is_neg():
        obj = _resolve_neg(obj, copy)
        export = obj.__dlpack__
    device_fn = getattr(obj, "__dlpack_device__", None)
    source = None if device_fn is None else device_fn()
    if source is not None and not (
        type(source) is tuple
        and len(source) == 2
        and type(source[0]) is int
        and type(source[1]) is int
    ):
        source = _device_pair(obj, source)  # an IntEnum pair (PyTorch), a list, or garbage
    if target is None and copy is None and (source is None or source[0] in _HOST_TYPES):
        kwargs: dict[str, Any] = _MAX_VERSION_ONLY
    else:
        kwargs = _request_kwargs(source, target, copy)
    try:
        if kwargs is _MAX_VERSION_ONLY:
            capsule = export(max_version=_MAX_VERSION)  # the common case: nothing else to ask
        else:
            capsule = export(**kwargs)
    except TypeError as exc:
        fewer = _fewer_keywords(obj, export, exc, kwargs, source, target, copy)
        if fewer is None:
            raise
        capsule = export(**fewer)  # a failure here keeps the first TypeError as its context
    if type(capsule) is not _CapsuleType:
        msg = (
            f"from_dlpack(): {type(obj).__name__}.__dlpack__() returned an object of type "
            f"{type(capsule).__name__}, not a DLPack capsule. The producer is broken."
        )
        raise TypeError(msg)
    return capsule


def _device_pair(obj: Any, source: Any) -> tuple[int, int]:
    """What ``__dlpack_device__`` returned, as a ``(device_type, device_id)`` pair of ints."""
    if isinstance(source, (tuple, list)) and len(source) == 2:
        try:
            pair = tuple(operator.index(v) if not isinstance(v, bool) else None for v in source)
        except TypeError:
            pair = (None, None)
        if None not in pair:
            return pair  # type: ignore[return-value]
    msg = (
        f"from_dlpack(): {type(obj).__name__}.__dlpack_device__() must return a (device_type, "
        f"device_id) tuple of ints; got {short_repr(source)}. The producer is broken; pass its "
        f"capsule (__dlpack__()) instead."
    )
    raise TypeError(msg)


def _request_kwargs(
    source: tuple[int, int] | None, target: Device | None, copy: bool | None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"max_version": _MAX_VERSION}
    # A copy to the host is synchronised by the producer and takes no stream (DLPack: a stream is
    # asked for only when the consumer will use the data on the producer's device).
    to_host = target is not None and target.dlpack_type == DLDeviceType.kDLCPU
    if source is not None and not to_host:
        if source[0] == _kDLCUDA:
            kwargs["stream"] = 1
        elif source[0] == _kDLROCM:
            kwargs["stream"] = 0
    if target is not None:
        wanted = target.to_dlpack()
        if copy is False and source is not None and _needs_move(source, target):
            raise _move_refused(source, wanted)
        kwargs["dl_device"] = (int(wanted[0]), wanted[1])
    if copy is not None:
        kwargs["copy"] = copy
    return kwargs


def _resolve_neg(obj: Any, copy: bool | None) -> Any:
    """PyTorch exports a negative-bit view without its sign: resolve it first."""
    if copy is False:
        msg = (
            "from_dlpack(): the PyTorch tensor is a negative-bit view (is_neg()); its values "
            "exist only after resolve_neg(), a copy, which copy=False forbids. Use copy=None or "
            "pass tensor.resolve_neg()."
        )
        raise ValueError(msg)
    return obj.resolve_neg()


def _fewer_keywords(
    obj: Any,
    export: Any,
    exc: TypeError,
    kwargs: dict[str, Any],
    source: tuple[int, int] | None,
    target: Device | None,
    copy: bool | None,
) -> dict[str, Any] | None:
    """The keywords to ask again with, after ``exc``; None when ``exc`` is not about them.

    ``__dlpack__`` before the 2023.12 array API takes ``stream`` only (NumPy before 2.1 takes no
    ``max_version``, ``dl_device`` or ``copy``): it is asked again with the keywords its signature
    takes (``stream`` alone for a builtin without one). Dropping ``max_version`` costs nothing (the
    capsule says which kind it is); a ``copy=True`` the producer cannot take is made up for by
    copying host memory after the import, and ``copy=False`` holds anyway, since an old
    ``__dlpack__`` never copies. What cannot be made up for is refused with a `TypeError`: a copy
    of memory that is not known to be on the host, a move to another device, or a ``stream`` the
    producer must order the data on.
    """
    if "keyword" not in str(exc):
        return None
    try:
        params: Any = inspect.signature(export).parameters
    except (TypeError, ValueError):
        params = ("stream",)  # a builtin without a signature: the keyword every version takes
    else:
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return None
    fewer = {name: value for name, value in kwargs.items() if name in params}
    lost = [name for name in kwargs if name not in fewer]
    if not lost:
        return None  # the producer takes every keyword: the error is about something else
    host = source is not None and source[0] in _HOST_TYPES
    moved = (
        "dl_device" in lost
        and target is not None
        and source is not None
        and _needs_move(source, target)
    )
    if ("copy" in lost and copy and not host) or "stream" in lost or moved:
        msg = (
            f"from_dlpack(): {type(obj).__name__}.__dlpack__() does not take the keywords "
            f"{lost} ({exc}), and tensorbridge cannot do without them for memory on device "
            f"{source}. Call from_dlpack() without device= and copy=, or upgrade the producer."
        )
        raise TypeError(msg) from exc
    return fewer


def _consume(capsule: Any, immutable: bool = False) -> Tensor:
    """Import a capsule and take ownership of its managed tensor (see `_open`)."""
    t, used_name, deleter = _open(capsule, immutable)
    _commit(capsule, t._storage, used_name, deleter)
    return t


def _open(capsule: Any, immutable: bool = False) -> tuple[Tensor, bytes, int]:
    """Read and validate a capsule without consuming it.

    Returns the tensor (its storage not yet armed), the ``used_*`` name and the deleter address. On
    any error the capsule is left as it was, so its destructor still frees the producer's memory.
    ``immutable``: the producer's memory is immutable, so a legacy capsule, which cannot say
    ``READ_ONLY``, is imported read-only.
    """
    if type(capsule) is not _CapsuleType:
        raise _not_a_producer(capsule)
    try:
        managed = _capi.PyCapsule_GetPointer(capsule, DLTENSOR_VERSIONED)
    except ValueError:
        managed = _legacy_pointer(capsule)
        fields = _read(_LEGACY, managed)
        # A legacy capsule cannot say read-only: like PyTorch, tensorbridge imports it writable,
        # unless its producer is known to hand out immutable memory.
        return _tensor(managed, fields[:8], immutable, False), USED_DLTENSOR, fields[9]
    t, deleter = _versioned(managed)
    return t, USED_DLTENSOR_VERSIONED, deleter


def _commit(capsule: Any, storage: Any, used_name: bytes, deleter: int) -> None:
    """Take ownership: rename the capsule, then arm the storage.

    Nothing that can fail comes after the rename, so the deleter runs exactly once: by the capsule's
    destructor if this never happens, by the storage otherwise.
    """
    _capi.PyCapsule_SetName(capsule, used_name)
    _arm(storage, deleter)


def _arm(storage: Any, deleter: int) -> None:
    """Make ``storage`` (a `DLPackStorage`) call the deleter at ``deleter`` (none for NULL) when it
    dies."""
    if deleter:
        storage.deleter = _deleter_function(deleter)


def _release_unowned(managed: int) -> None:
    """Call the deleter of a ``DLManagedTensorVersioned`` that no storage took over (an import
    that failed or went another way); one of another major version leaks: where its deleter is
    cannot be known."""
    major, _minor, _ctx, deleter = _read(_VERSIONED, managed)[:4]
    if major == DLPACK_MAJOR_VERSION and deleter:
        _deleter_function(deleter)(managed)


def _deleter_function(address: int) -> Any:
    """The ctypes function that calls the producer's deleter at ``address`` (made once)."""
    fn = _DELETERS.get(address)
    return fn if fn is not None else _remember(_DELETERS, address, DLPackDeleter(address))


def _versioned(managed: int) -> tuple[Tensor, int]:
    """The tensor a ``DLManagedTensorVersioned`` describes, with its flags, and its deleter's
    address; `BufferError` for another major version, before anything else is read."""
    try:
        fields = _VERSIONED.unpack_from(_MEMORY, managed - _MEMORY_BASE)
    except (struct.error, OverflowError):
        fields = _read(_VERSIONED, managed)
    major, minor, _ctx, deleter, flags = fields[:5]
    if major != DLPACK_MAJOR_VERSION:
        # Nothing else may be trusted; the unrenamed capsule's destructor calls the deleter.
        msg = (
            f"from_dlpack(): the capsule holds a DLPack {major}.{minor} tensor; tensorbridge "
            f"reads major version {DLPACK_MAJOR_VERSION} only. Upgrade tensorbridge or ask the "
            f"producer for max_version={_MAX_VERSION}."
        )
        raise BufferError(msg)
    readonly = flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0
    return _tensor(
        managed, fields[5:], readonly, flags & DLPACK_FLAG_BITMASK_IS_COPIED != 0
    ), deleter


def _tensor(managed: int, dltensor: tuple[Any, ...], readonly: bool, copied: bool) -> Tensor:
    """The tensor a DLTensor describes, over a storage spanning exactly the bytes it reaches.

    The extent is checked by `_storage.locate`, with Python ints, so a layout whose byte extent does
    not fit the address space is refused rather than wrapped. NULL strides mean row-major: legal
    before DLPack 1.2 and accepted from any version. Size-0 tensors may have any strides and NULL
    data (the DLPack header allows both). The storage owns the managed tensor, but calls no deleter
    until `_arm` arms it.
    """
    data, dev_type, dev_id, ndim, dtype_word, shape_p, strides_p, byte_offset = dltensor
    dtype = _DTYPE_BY_WORD.get(dtype_word)
    if dtype is None:
        raise _unsupported_dtype(dtype_word)
    device = CPU if dev_type == _kDLCPU else Device.from_dlpack(dev_type, dev_id)
    if 0 < ndim <= MAX_NDIM and strides_p == shape_p + 8 * ndim and shape_p:
        try:  # adjacent arrays (NumPy, tensorbridge): one read, inline on this hot path
            both = _INT64_ARRAYS[2 * ndim].unpack_from(_MEMORY, shape_p - _MEMORY_BASE)
        except (struct.error, OverflowError):
            both = _read(_INT64_ARRAYS[2 * ndim], shape_p)
        shape, strides = both[:ndim], both[ndim:]
    else:
        shape, strides = _shape_and_strides(ndim, shape_p, strides_p)
    for size in shape:  # DLPack's own rules first: sizes, the empty tensor, NULL data
        if size <= 1:
            if size == 0:
                if min(shape) < 0:
                    raise _negative_shape(shape)
                storage = DLPackStorage(data or 0, 0, device, readonly, copied, managed)
                return Tensor._make(storage, 0, shape, strides, dtype)  # nothing addressed
            if size < 0:
                raise _negative_shape(shape)
    if not data:
        msg = (
            f"from_dlpack(): DLTensor.data is NULL for a non-empty tensor of shape "
            f"{list(shape)}; the producer wrote an invalid capsule."
        )
        raise BufferError(msg)
    itemsize = dtype.itemsize
    try:
        if dev_type in _ADDRESSABLE:
            start, nbytes, offset = locate(
                data + byte_offset,
                None,
                0,
                shape,
                strides,
                itemsize,
                "from_dlpack",
                _refused,
                sized=False,
            )
        else:
            # ``data`` may be an opaque handle: the storage starts at it, byte_offset in elements.
            offset, rest = divmod(byte_offset, itemsize)
            if rest:
                raise _handle_offset(byte_offset, itemsize, device)
            start, nbytes, offset = locate(
                data,
                None,
                offset,
                shape,
                strides,
                itemsize,
                "from_dlpack",
                _refused,
                sized=False,
                anchored=True,
            )
    except BufferError as refused:
        refusal = refused.args[0] if refused.args else None
        if not isinstance(refusal, Refusal):
            raise
        if refusal.kind == "outside":  # only anchored layouts are refused for this
            raise _handle_offset(byte_offset, itemsize, device) from None
        msg = (
            f"from_dlpack(): the layout (data=0x{data:x}, byte_offset={byte_offset}, shape="
            f"{list(shape)}, strides={list(strides)}, itemsize={itemsize}) reaches outside the "
            f"address space; the producer wrote an invalid capsule."
        )
        raise BufferError(msg) from None
    storage = DLPackStorage(start, nbytes, device, readonly, copied, managed)
    return Tensor._make(storage, offset, shape, strides, dtype)


def _refused(refusal: Refusal) -> BufferError:
    """A placeholder carrying `_storage.locate`'s refusal; `_tensor` words the error itself (its
    message needs the DLTensor's own fields, and a closure would cost every import)."""
    return BufferError(refusal)


def _shape_and_strides(
    ndim: int, shape_p: int, strides_p: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides (in elements) behind the DLTensor's pointers."""
    if ndim == 0:
        return (), ()  # shape and strides may be NULL (DLPack 1.3): never read them
    if not 0 < ndim <= MAX_NDIM or not shape_p:
        msg = (
            f"from_dlpack(): malformed DLTensor: ndim={ndim} (at most {MAX_NDIM}), shape "
            f"{'set' if shape_p else 'NULL'}; the producer wrote an invalid capsule."
        )
        raise BufferError(msg)
    shape = _read(_INT64_ARRAYS[ndim], shape_p)
    if strides_p:
        return shape, _read(_INT64_ARRAYS[ndim], strides_p)
    return shape, contiguous_strides(shape)


def _negative_shape(shape: tuple[int, ...]) -> BufferError:
    msg = (
        f"from_dlpack(): DLTensor.shape has a negative size: {list(shape)}; the producer wrote "
        f"an invalid capsule."
    )
    return BufferError(msg)


def _handle_offset(byte_offset: int, itemsize: int, device: Device) -> BufferError:
    """A byte_offset that an opaque device handle cannot carry."""
    msg = (
        f"from_dlpack(): byte_offset {byte_offset} on {device} is not a whole number of "
        f"{itemsize}-byte elements or reaches before the buffer; tensorbridge cannot "
        f"express it."
    )
    return BufferError(msg)


def _legacy_pointer(capsule: Any) -> int:
    """The managed pointer of a ``"dltensor"`` capsule, or the error that its name calls for."""
    try:
        managed: int = _capi.PyCapsule_GetPointer(capsule, DLTENSOR)
    except ValueError:
        pass
    else:
        return managed
    name_address = _capi.PyCapsule_GetName(capsule)
    name = ctypes.string_at(name_address) if name_address else None
    if name in (USED_DLTENSOR, USED_DLTENSOR_VERSIONED):
        raise RuntimeError(_TORCH_CONSUMED)
    shown = name.decode("ascii", "replace") if name is not None else None
    msg = (
        f"from_dlpack(): expected a capsule named 'dltensor' or 'dltensor_versioned'; got a "
        f"capsule named {short_repr(shown)}. Only DLPack capsules can be imported."
    )
    raise TypeError(msg)


def _unsupported_dtype(word: int) -> BufferError:
    code, bits, lanes = struct.unpack("@BBH", struct.pack("@I", word))
    if lanes != 1:
        why = "vector types (lanes != 1) are not supported, except float4_e2m1fn_x2 = (17, 4, 2)"
    else:
        why = "no tensorbridge dtype has this DLDataType"
    msg = (
        f"from_dlpack(): unsupported DLPack dtype (code={code}, bits={bits}, lanes={lanes}): "
        f"{why}. Convert the data to a supported dtype before exporting it."
    )
    return BufferError(msg)


def _from_dlpack_with(ext_tensor: Any, target: Device | None, copy: bool | None) -> Tensor:
    """``from_dlpack`` with a ``device`` and/or ``copy`` request (the array API semantics)."""
    if type(ext_tensor) is _CapsuleType:
        return _from_capsule_with(ext_tensor, target, copy)
    producer = _PRODUCERS.get(type(ext_tensor)) or _producer(type(ext_tensor))
    t = _consume(_request(ext_tensor, producer, target, copy), producer.immutable)
    if target is not None:
        t = _relabel(t, target)
    if copy and not t._storage.is_copied and t._storage.device.is_host_accessible:
        # The producer ignored copy=True or could not say it copied (legacy capsule; PyTorch 2.13
        # never sets IS_COPIED, and JAX aliases 64-byte aligned memory even for copy=True).
        # Device memory is trusted: it cannot be checked here.
        t = t.clone()
    return t


def _from_capsule_with(capsule: Any, target: Device | None, copy: bool | None) -> Tensor:
    """A capsule with ``device``/``copy``: copied or viewed locally when possible, else a
    `ValueError` with PyTorch's text (PyTorch asserts), leaving the capsule unconsumed."""
    t, used_name, deleter = _open(capsule)
    storage = t._storage
    if (copy and not storage.device.is_host_accessible) or (
        target is not None and _needs_move(storage.device.to_dlpack(), target)
    ):
        where = target if target is not None else storage.device
        msg = (
            f"from_dlpack(): {_TORCH_CAPSULE_KWARGS} The capsule holds memory on "
            f"{storage.device}, which tensorbridge cannot copy or move to {where}. Import it "
            f"without device and copy, or ask its producer for the device."
        )
        raise ValueError(msg)
    _commit(capsule, storage, used_name, deleter)
    if target is not None:
        t = _relabel(t, target)
    return t.clone() if copy else t


def _needs_move(source: tuple[int, int], target: Device) -> bool:
    """True when memory on DLPack device ``source`` cannot simply be seen as on ``target``."""
    kind = int(target.dlpack_type)
    if source[0] == kind and (kind == _kDLCPU or target.index in (None, source[1])):
        return False
    # Host-accessible memory (pinned, managed) is CPU memory too.
    return not (kind == _kDLCPU and Device.from_dlpack(*source).is_host_accessible)


def _move_refused(source: tuple[int, int], wanted: tuple[int, int]) -> ValueError:
    known = source[0] in DLDeviceType._value2member_map_
    src = (DLDeviceType(source[0]) if known else source[0], source[1])
    msg = (
        f"from_dlpack(): cannot move DLPack tensor from device {src} to "
        f"{(int(wanted[0]), wanted[1])} without copying. Set copy=None or copy=True."
    )
    return ValueError(msg)


def _relabel(t: Tensor, target: Device) -> Tensor:
    """``t`` seen on ``target``: the same memory, when it is there already or host-accessible."""
    storage = t._storage
    if _needs_move(storage.device.to_dlpack(), target):
        msg = (
            f"from_dlpack(): the producer returned memory on {storage.device}, not on the "
            f"requested {target}, and tensorbridge does not move memory between devices. Move "
            f"it with the producer's library first."
        )
        raise BufferError(msg)
    if storage.device.type == target.type:
        return t
    host = Storage(
        storage.ptr, storage.nbytes, target, storage.readonly, storage, storage.is_copied
    )
    return Tensor._make(host, t._offset, t._shape, t._strides, t._dtype)


# -------------------------------------------------------------------------------------------------
# Export
# -------------------------------------------------------------------------------------------------


@DLPackDeleter
def _deleter(
    address: int | None,
    _finalizing: Any = sys.is_finalizing,
    _forget: Any = _exports.forget_managed,
) -> None:
    """``deleter`` of every managed tensor tensorbridge exports; may run on any thread.

    ctypes takes the GIL before running it. What it needs is bound as defaults, so it works while
    module globals are being cleared; once the interpreter is finalising it does nothing (leak,
    never crash).
    """
    if address is None or _finalizing():
        return
    _forget(address)


_DELETER_ADDRESS: Final = ctypes.cast(_deleter, ctypes.c_void_p).value
# Consumers keep the address and may call it after this module's globals are cleared at exit.
_capi.keep_forever(_deleter)


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


def to_dlpack(tensor: Any) -> Any:
    """A legacy ``"dltensor"`` capsule sharing the memory, as ``torch.utils.dlpack.to_dlpack``.

    Runs the checks of ``Tensor.__dlpack__``, which PyTorch's ``to_dlpack`` skips: a tensor that
    requires gradients, and a read-only tensor (a legacy capsule cannot say ``READ_ONLY``), are
    refused. A view with negative strides is exported as a compact copy. The memory stays alive
    until the capsule's consumer releases it; a capsule never consumed is released at the next reap.

    Example:
        >>> import tensorbridge as tb
        >>> capsule = tb.utils.dlpack.to_dlpack(tb.arange(3))
        >>> tb.from_dlpack(capsule)
        tensor([0, 1, 2])
    """
    if not isinstance(tensor, Tensor):
        msg = (
            f"to_dlpack(): expected a tensorbridge.Tensor; got {type(tensor).__name__}. Convert "
            f"it with tensorbridge.asarray() first."
        )
        raise TypeError(msg)
    return _export(tensor, None, None, None, None, "to_dlpack")


def _export(  # the __dlpack__ arguments, plus the API name for messages
    t: Tensor, stream: Any, max_version: Any, dl_device: Any, copy: Any, api: str
) -> Any:
    if t._requires_grad:
        msg = f"{api}(): {_TORCH_GRAD}."
        raise BufferError(msg)
    if copy is not None:
        copy = as_copy(copy, api)
    versioned = max_version is not None and _wants_versioned(max_version, api)
    device = t._storage.device
    if stream is not None:
        _check_stream(stream, device, api)
    if dl_device is not None:
        device = _export_device(dl_device, device, copy, api)
    strides = t._strides
    copied = copy is True
    if not copied and strides and min(strides) < 0:
        if has_negative_stride(t._shape, strides):
            copied = True
        else:
            t = with_idle_strides_positive(t)  # nothing to copy: the strides address nothing
    if copied:
        t = _export_copy(t, copy, api)
    elif t._storage.readonly and not versioned:
        msg = (
            f"{api}(): cannot export a read-only tensor as an unversioned 'dltensor' capsule, "
            f"since signalling readonly is unsupported by DLPack before version 1.0. Call "
            f"__dlpack__(max_version=(1, 0)), or export a clone()."
        )
        raise BufferError(msg)
    if stream is not None and stream > 2 and device.dlpack_type == DLDeviceType.kDLCUDA:
        _cuda_wait_on_legacy_stream(device.index or 0, stream, api)
    return _new_capsule(t, device, versioned, copied)


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
    return Tensor._make(t._storage, t._offset, t._shape, strides, t._dtype)


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


# The block written for one export, per (versioned, ndim): its struct format (managed struct, then
# shape[ndim] and strides[ndim]), the ctypes array type that holds it, and where shape starts.
_BLOCKS: dict[tuple[bool, int], tuple[struct.Struct, Any, int]] = {}


def _block_layout(versioned: bool, ndim: int) -> tuple[struct.Struct, Any, int]:
    layout = _BLOCKS.get((versioned, ndim))
    if layout is None:
        header = "IIPPQ" + _DLTENSOR_WRITE if versioned else _DLTENSOR_WRITE + "PP"
        shape_at = struct.calcsize("@" + header + "0q")
        fmt = struct.Struct(f"@{header}0q{ndim}q{ndim}q")
        layout = _BLOCKS[versioned, ndim] = (fmt, ctypes.c_char * fmt.size, shape_at)
    return layout


def _new_capsule(t: Tensor, device: Device, versioned: bool, copied: bool) -> Any:
    """Write the managed struct, shape and strides into one block; wrap it; register both."""
    name = DLTENSOR_VERSIONED if versioned else DLTENSOR
    address, block = _new_managed(t, device, versioned, copied, name)
    capsule = _capi.PyCapsule_New(address, name, None)
    _exports.hold_capsule(address, block, t, name, capsule)
    return capsule


def _new_managed(
    t: Tensor, device: Device, versioned: bool, copied: bool, name: bytes
) -> tuple[int, Any]:
    """Write a ``DLManagedTensor(Versioned)`` for ``t``, with its shape and strides, into one
    block; return its address and the block, which the caller registers with ``t`` until
    `_deleter` runs."""
    storage = t._storage
    shape, strides = t._shape, t._strides
    ndim = len(shape)
    itemsize = t._dtype.itemsize
    code, bits, lanes = t._dtype.dlpack
    dev_type, dev_id = device.to_dlpack()
    if 0 in shape:
        data, byte_offset = 0, 0  # dlpack.h: NULL data for size-0 tensors
        # The strides of a size-0 tensor address nothing; those past int64 (row-major strides of
        # a huge empty shape) are written as 0 rather than refused.
        strides = tuple(st if -(2**63) <= st < 2**63 else 0 for st in strides)
    elif dev_type in _ADDRESSABLE:
        data, byte_offset = storage.ptr + t._offset * itemsize, 0  # as NumPy and PyTorch do
    else:
        data, byte_offset = storage.ptr, t._offset * itemsize  # a handle: no pointer arithmetic
    fmt, block_type, shape_at = _BLOCKS.get((versioned, ndim)) or _block_layout(versioned, ndim)
    block = block_type()
    address: int = ctypes.addressof(block)
    shape_p = address + shape_at
    # manager_ctx is opaque to consumers: the block's own address, the key of its registry entry.
    dltensor = (
        data,
        dev_type,
        dev_id,
        ndim,
        code,
        bits,
        lanes,
        shape_p,
        shape_p + 8 * ndim,
        byte_offset,
    )
    try:
        if versioned:
            flags = (
                DLPACK_FLAG_BITMASK_IS_COPIED
                if copied
                else DLPACK_FLAG_BITMASK_READ_ONLY
                if storage.readonly
                else 0
            )
            fmt.pack_into(
                block,
                0,
                *_MAX_VERSION,
                address,
                _DELETER_ADDRESS,
                flags,
                *dltensor,
                *shape,
                *strides,
            )
        else:
            fmt.pack_into(block, 0, *dltensor, address, _DELETER_ADDRESS, *shape, *strides)
    except struct.error:
        # Only a tensor imported from a lying producer gets here: e.g. a device handle plus
        # byte_offset beyond 64 bits. DLPack's fixed-width fields cannot carry it.
        msg = (
            f"__dlpack__(): the tensor's layout (data=0x{data:x}, byte_offset={byte_offset}, "
            f"shape={list(shape)}, strides={list(strides)}) does not fit DLPack's 64-bit "
            f"fields; it cannot be exported. Export a clone() of host memory instead."
        )
        raise BufferError(msg) from None
    return address, block


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
    exchange = (_PRODUCERS.get(cls) or _producer(cls)).exchange
    if exchange is None or not t._storage.device.is_host_accessible:
        return None
    address, block = _new_managed(t, t._storage.device, True, False, DLTENSOR_VERSIONED)
    _exports.hold_managed(address, block, t, DLTENSOR_VERSIONED)
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
