"""DLPack import: `from_dlpack` and `to_dlpack` (export itself is `_dlpack_export`, below `Tensor`).

Import follows the array API's consumer pattern: ask the producer for the newest
version tensorbridge understands, accept whichever capsule comes back, validate every field, build
the tensor, and only then rename the capsule to ``used_*``. The managed tensor then belongs to a
`_storage.DLPackStorage`, which calls the producer's ``deleter`` exactly once, when the last view
dies. A producer type that advertises the DLPack C exchange API (a
``__dlpack_c_exchange_api__`` capsule on the type; PyTorch >= 2.10) hands its host tensors over
through that table instead, with no ``__dlpack__`` call and no capsule.

Deviations from PyTorch 2.13 (each one deliberate):

* ``READ_ONLY`` capsules import read-only.
* Legacy (flagless) capsules import **writable**, as in PyTorch (NumPy makes them read-only),
  except from a producer whose arrays are immutable values. Such a producer is decided once per
  type: one whose type (or a base) comes from a library in `IMMUTABLE_PRODUCERS` (``jax``,
  ``jaxlib``, ``tensorflow``: JAX arrays and TensorFlow tensors export flagless legacy capsules
  only), or one that also speaks the Arrow C data interface (pyarrow 15 exports legacy capsules
  only). Its legacy capsules import read-only, through ``from_dlpack`` and ``asarray`` alike (a
  versioned capsule says ``READ_ONLY`` for itself); ``copy=True`` always gives private, writable
  memory. A bare capsule says nothing of its producer and follows the rule above.
* ``__dlpack_device__()`` may return IntEnum members, NumPy integers, a list, or None (or no id)
  for the id of host memory (PaddlePaddle's ``(kDLCPU, None)``); anything else is a `TypeError`
  (`_device.dlpack_pair`).
* Non-producers (`NotDLPackError`, a `TypeError` and an `AttributeError`), foreign capsules
  (`TypeError`) and consumed capsules (PyTorch's `RuntimeError`) get three distinct errors, where
  PyTorch raises its "invalid capsule" `RuntimeError` for all three.
* A producer is asked again with fewer keywords only when its `TypeError` says the arguments were
  refused ("unexpected keyword argument", "takes no keyword arguments", pybind11's and nanobind's
  "incompatible function arguments", ...: a ``__dlpack__`` older than the 2023.12 array API, such
  as NumPy's before 2.1 or ONNX Runtime's ``OrtValue``), and only with the keywords it takes (its
  signature, the keyword the error names, or the overloads pybind11 lists): never when a
  ``device`` move, a ``stream`` or a device ``copy`` would be lost. A ``copy=True`` request it
  cannot take is met by copying the imported host memory. Any other `TypeError` propagates
  unchanged. PyTorch retries on every `TypeError`; NumPy retries on every one with no keywords at
  all, when ``device`` and ``copy`` are None.
* ``dl_device`` is asked for only when the producer is not already on that device: a producer
  exports on its own device anyway, and some refuse any ``dl_device`` (TensorFlow), so
  ``device="cpu"`` works with every host producer.
* Imports keep negative strides as they are.
* A PyTorch negative-bit view is resolved before import (PyTorch exports it without its sign).
* Memory that is not host-accessible (CUDA, ROCm, Metal, ...) is carried as it is and never
  dereferenced on the host.
"""

from __future__ import annotations

import ctypes
import inspect
import re
import struct
import sys
from typing import Any, Final

from . import _capi, _native
from ._args import GRAD_MSG_EXPORT, as_copy
from ._cache import TypeTable, remember, remember_type
from ._device import ADDRESSABLE_TYPES, CPU, HOST_TYPES, Device, DLDeviceType, dlpack_pair
from ._dlpack_abi import (
    DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPACK_MAJOR_VERSION,
    DLPACK_VERSION,
    DLTENSOR,
    DLTENSOR_VERSIONED,
    USED_DLTENSOR,
    USED_DLTENSOR_VERSIONED,
)
from ._dlpack_c import (
    DTYPE_BY_WORD,
    INT64_ARRAYS,
    LEGACY,
    VERSIONED,
    exchange_api_of,
    read,
    read_dims,
    read_versioned,
)
from ._dlpack_export import _export
from ._errors import NotDLPackError, as_called, release_frames, short_repr
from ._layout import MAX_NDIM, contiguous_strides
from ._native import capsule_pointer, capsule_set_name
from ._storage import Storage, locate, own_managed, refusal_of, refused
from ._tensor import Tensor, _construct

__all__ = ["from_dlpack", "to_dlpack"]

_kDLCPU: Final = int(DLDeviceType.kDLCPU)
_kDLCUDA: Final = int(DLDeviceType.kDLCUDA)
_kDLROCM: Final = int(DLDeviceType.kDLROCM)
_MAX_VERSION_ONLY: Final = {"max_version": DLPACK_VERSION}

_TORCH_CONSUMED: Final = (
    "from_dlpack received an invalid capsule. Note that DLTensor capsules can be consumed only "
    "once, so you might have already constructed a tensor from it once."
)
_TORCH_CAPSULE_KWARGS: Final = (
    "device and copy kwargs not supported when ext_tensor is already a DLPack capsule."
)


# -------------------------------------------------------------------------------------------------
# Import
# -------------------------------------------------------------------------------------------------

_CapsuleType: Final = _capi.CapsuleType

# Producer deleters are called through one ctypes function object per address (NumPy and PyTorch
# each use one deleter for all their tensors).
_DELETERS: dict[int, Any] = {}
# The table's ``get``, bound once (also `_producer_of` below): looking a method up costs each call
# as much as calling it.
_deleter_of: Final = _DELETERS.get
# The last deleter made or found, as ``(address, function)``: nearly every import has the deleter
# of the one before (a producer uses one for all its tensors), and comparing an address costs less
# than hashing it. One tuple, replaced whole, so that a reader on another thread sees a pair.
_last_deleter: tuple[int, Any] = (0, None)
# The dtypes by DLDataType word (compiled, a C global that `_tensor` looks up as a dict directly).
_DTYPES: Final = DTYPE_BY_WORD


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
    try:
        if device is None and copy is None:
            return _from_dlpack(ext_tensor)
        return _from_dlpack_with(ext_tensor, _as_target(device), as_copy(copy, "from_dlpack"))
    except BaseException as exc:
        release_frames(exc)  # a refusal holds nothing once it leaves: see `_errors.release_frames`
        called = as_called(exc, "from_dlpack", ext_tensor) if isinstance(exc, Exception) else exc
        if called is not exc:
            raise called from called.__cause__
        del called  # this frame is in the traceback: it must not hold the exception (a cycle)
        raise


def _from_dlpack(ext_tensor: Any) -> Tensor:
    """``from_dlpack`` with neither ``device`` nor ``copy``: the path nearly every call takes."""
    cls = type(ext_tensor)
    if cls is Tensor:
        return _alias(ext_tensor)
    immutable = False
    if cls is not _CapsuleType:
        producer = _producer_of(cls) or _producer_of(id(cls)) or _producer(cls)
        if producer.exchange is not None:
            t = _exchange_import(producer, ext_tensor)
            if t is not None:
                return t
        ext_tensor = _request(ext_tensor, producer, None, None)
        immutable = producer.immutable
    try:
        t, used_name, deleter = _open(ext_tensor, immutable)
    except BaseException:
        # Refused: a producer's capsule dies here, with no exception pending, so that its
        # destructor frees the producer's memory at once. A destructor written in Python (as
        # many producers' are) cannot run while an exception propagates: dropped by the
        # compiled build's unwinding, the capsule would turn the refusal into SystemError and
        # leak. Every function that holds a producer's capsule drops it so.
        ext_tensor = None
        raise
    # `_commit`, inlined on the hot path: rename, then arm the storage.
    capsule_set_name(ext_tensor, used_name)
    if deleter:
        storage: Any = t._storage  # a DLPackStorage
        last = _last_deleter
        storage.deleter = last[1] if last[0] == deleter else _deleter_function(deleter)
    return t


def _alias(t: Tensor) -> Tensor:
    """A tensorbridge tensor: a new view of its memory, what a capsule round trip would give."""
    if t._requires_grad:
        msg = f"from_dlpack(): {GRAD_MSG_EXPORT}."
        raise BufferError(msg)
    return t.detach()


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
class _Producer:
    """What `from_dlpack` knows about one producer type.

    Attributes:
        neg_bit: instances may be PyTorch negative-bit views (``is_neg``/``resolve_neg``, duck
            typed: torch.Tensor and its subclasses), which are resolved before export: PyTorch
            exports them without their sign.
        exchange: the C exchange API the type itself advertises, major version 1; None without.
        immutable: the type's instances hand out memory that must not be written (`_immutable`):
            their legacy capsules, which cannot say ``READ_ONLY``, are imported read-only (a
            versioned capsule says it for itself); writing through them would change an array
            that every other view of it takes for constant.
        screen: for ``torch.Tensor``, ``torch.strided``: its exchange function checks less than
            its ``__dlpack__`` (no autograd, conjugate or negative bit, layout), so tensors with any
            of those take the ``__dlpack__`` path, which refuses or resolves them as before.
        methods: the type itself defines ``__dlpack__`` and ``__dlpack_device__``, so instances
            have both: they are called as methods, with no bound method made (looked up on the
            instance all the same). Without, they are looked up with ``getattr``, which also finds
            what an instance or a ``__getattr__`` provides, or finds nothing.
    """

    __slots__ = ("exchange", "immutable", "methods", "neg_bit", "screen")

    def __init__(self, cls: type) -> None:
        self.methods = all(
            inspect.getattr_static(cls, name, None) is not None
            for name in ("__dlpack__", "__dlpack_device__")
        )
        self.neg_bit = hasattr(cls, "is_neg") and hasattr(cls, "resolve_neg")
        self.immutable = _immutable(cls)
        self.exchange = exchange_api_of(cls)
        torch = sys.modules.get("torch")
        self.screen = torch.strided if torch is not None and cls is torch.Tensor else None


# The top-level modules of the libraries whose arrays are immutable values and whose ``__dlpack__``
# does not say so: JAX (``jaxlib._jax.ArrayImpl``, the ``jax.Array`` base) and TensorFlow
# (``tensorflow.python.framework.ops.EagerTensor``) export legacy capsules only, even when asked for
# ``max_version``; JAX's own ``np.asarray`` of an array is read-only.
IMMUTABLE_PRODUCERS: Final = frozenset({"jax", "jaxlib", "tensorflow"})


def _immutable(cls: type) -> bool:
    """True when instances of ``cls`` hand out memory that must not be written (decided once per
    type): the type, or one of its bases, comes from a library in `IMMUTABLE_PRODUCERS`, or the type
    also speaks the Arrow C data interface (``__arrow_c_array__``: Arrow memory is immutable;
    pyarrow 15 exports legacy capsules only, pyarrow 26 versioned ones flagged ``READ_ONLY``)."""
    if hasattr(cls, "__arrow_c_array__"):
        return True
    for base in cls.__mro__:
        module = getattr(base, "__module__", None)
        if isinstance(module, str) and module.partition(".")[0] in IMMUTABLE_PRODUCERS:
            return True
    return False


# Keyed by ``id(cls)`` and holding no type (`_cache.TypeTable`): a producer class made on the fly
# goes when nothing else holds it.
_PRODUCERS: TypeTable[_Producer] = TypeTable()
_producer_of: Final = _PRODUCERS.get


def _producer(cls: type) -> _Producer:
    return remember_type(_PRODUCERS, cls, _Producer(cls))


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
    try:
        managed = producer.exchange.from_py(obj)  # type: ignore[union-attr]
    except Exception:  # the __dlpack__ path raises the producer's refusal again, in its words
        return None
    if not managed:  # failed without an error
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
    methods = producer.methods
    if not methods and getattr(obj, "__dlpack__", None) is None:
        raise _not_a_producer(obj)
    if producer.neg_bit and obj.is_neg():
        obj = _resolve_neg(obj, copy)
    if methods:
        source = obj.__dlpack_device__()  # called as a method: no bound method is made
    else:
        device_fn = getattr(obj, "__dlpack_device__", None)
        source = None if device_fn is None else device_fn()
    if source is not None and not (
        type(source) is tuple
        and len(source) == 2
        and type(source[0]) is int
        and type(source[1]) is int
    ):
        # An IntEnum pair (PyTorch), (kDLCPU, None) (PaddlePaddle), NumPy integers, or garbage.
        source = dlpack_pair(source, "from_dlpack", type(obj).__name__)
    if (  # CPU first: a comparison, where the set lookup hashes
        target is None
        and copy is None
        and (source is None or source[0] == _kDLCPU or source[0] in HOST_TYPES)
    ):
        kwargs: dict[str, Any] = _MAX_VERSION_ONLY
    else:
        if copy and producer.immutable and source is not None and source[0] in HOST_TYPES:
            # Host memory that must not be written: `_from_dlpack_with` copies it, as it copies
            # any import that is neither a copy nor writable, so a copy asked of the producer
            # would be a second one (and TensorFlow refuses copy=True).
            copy = None
        kwargs = _request_kwargs(source, target, copy)
    try:
        if kwargs is _MAX_VERSION_ONLY:
            capsule = obj.__dlpack__(max_version=DLPACK_VERSION)  # the common case
        else:
            capsule = obj.__dlpack__(**kwargs)
    except TypeError as exc:
        capsule = _ask_again(obj, exc, kwargs, kwargs, source, target, copy)
        if capsule is None:
            raise  # not about the keywords: the producer's own error
    if type(capsule) is not _CapsuleType:
        msg = (
            f"from_dlpack(): {type(obj).__name__}.__dlpack__() returned an object of type "
            f"{type(capsule).__name__}, not a DLPack capsule. The producer is broken."
        )
        raise TypeError(msg)
    return capsule


def _request_kwargs(
    source: tuple[int, int] | None, target: Device | None, copy: bool | None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"max_version": DLPACK_VERSION}
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
        # A producer already on the device wanted is not told it: it exports there anyway, and
        # some refuse any dl_device at all (TensorFlow: "does not support DLPack export with a
        # non-None dl_device").
        if not (
            source is not None
            and source[0] == int(wanted[0])
            and (source[0] == _kDLCPU or source[1] == wanted[1])
        ):
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


def _ask_again(
    obj: Any,
    exc: TypeError,
    kwargs: dict[str, Any],
    first: dict[str, Any],
    source: tuple[int, int] | None,
    target: Device | None,
    copy: bool | None,
) -> Any:
    """The capsule of ``obj.__dlpack__`` asked again with the keywords ``exc`` says it takes; None
    when ``exc`` is not about the keywords ``kwargs`` (the caller raises it).

    Each try drops at least one keyword, so there are at most as many as keywords were asked for
    (``first``). A try that fails again is raised while handling the failure before it, which stays
    its context.
    """
    fewer = _fewer_keywords(obj, exc, kwargs, first, source, target, copy)
    if fewer is None:
        return None
    try:
        return obj.__dlpack__(**fewer)
    except TypeError as again:
        capsule = _ask_again(obj, again, fewer, first, source, target, copy)
        if capsule is None:
            raise
        return capsule


# What a `TypeError` says when the call's arguments were refused, as CPython, Cython, pybind11,
# nanobind, Boost.Python and SWIG word it ("got an unexpected keyword argument 'copy'", "'copy' is
# an invalid keyword argument for ...", "takes no keyword arguments", "incompatible function
# arguments", "did not match C++ signature", "Wrong number or type of arguments"). Any other
# `TypeError` is about something else and propagates (PyTorch 2.13 retries on every one).
_ARGUMENTS_REFUSED: Final = re.compile(
    r"keyword argument|incompatible function arguments|did not match C\+\+ signature|"
    r"wrong number or type of arguments",
    re.IGNORECASE,
)
# The keyword such a message names.
_NAMED_KEYWORD: Final = re.compile(
    r"unexpected keyword argument '(\w+)'|'(\w+)' is an invalid keyword argument"
)
# One signature in pybind11's and nanobind's list of overloads: "1. (self: T, stream: object =
# None) -> object" (pybind11), "1. __dlpack__(self, stream: object | None = None) -> object"
# (nanobind).
_OVERLOAD: Final = re.compile(r"^\s*\d+\.\s*[\w.]*\((.*)\)\s*->", re.MULTILINE)
# A listed parameter's name ("stream: object = None", "*", "/" and "*args" list no keyword).
_PARAM_NAME: Final = re.compile(r"(\w+)")


def _fewer_keywords(
    obj: Any,
    exc: TypeError,
    kwargs: dict[str, Any],
    first: dict[str, Any],
    source: tuple[int, int] | None,
    target: Device | None,
    copy: bool | None,
) -> dict[str, Any] | None:
    """The keywords to ask again with, after ``exc``; None when ``exc`` is not about them.

    ``__dlpack__`` before the 2023.12 array API takes ``stream`` only (NumPy before 2.1 takes no
    ``max_version``, ``dl_device`` or ``copy``; ONNX Runtime's pybind11 ``OrtValue`` takes
    ``stream`` only). What it takes is read, in order, from its signature, from the keyword the
    error names, from "takes no keyword arguments", and from the overloads pybind11 and nanobind
    list; a builtin that says none of these is taken to accept ``stream``, the keyword every
    version takes. Dropping ``max_version`` costs nothing (the capsule says which kind it is); a
    ``copy=True`` the producer cannot take is made up for by copying host memory after the import,
    and ``copy=False`` holds anyway, since an old ``__dlpack__`` never copies. What cannot be made
    up for is refused with a `TypeError`: a copy of memory that is not known to be on the host, a
    move to another device, or a ``stream`` the producer must order the data on.
    """
    text = str(exc)
    if _ARGUMENTS_REFUSED.search(text) is None:
        return None
    takes = _keywords_taken(obj.__dlpack__, text)
    if takes is None:
        return None
    fewer = {name: value for name, value in kwargs.items() if name in takes}
    if len(fewer) == len(kwargs):
        return None  # the producer takes every keyword: the error is about something else
    lost = [name for name in first if name not in fewer]
    host = source is not None and source[0] in HOST_TYPES
    moved = (
        "dl_device" in lost
        and target is not None
        and source is not None
        and _needs_move(source, target)
    )
    if ("copy" in lost and copy and not host) or "stream" in lost or moved:
        said = text.splitlines()[0] if text else type(exc).__name__
        msg = (
            f"from_dlpack(): {type(obj).__name__}.__dlpack__() does not take the keywords "
            f"{lost} ({said}), and tensorbridge cannot do without them for memory on device "
            f"{source}. Call from_dlpack() without device= and copy=, or upgrade the producer."
        )
        raise TypeError(msg) from exc
    return fewer


def _keywords_taken(export: Any, text: str) -> Any:
    """The keyword names ``export`` (a bound ``__dlpack__``) takes, as a container; None when
    neither its signature nor ``text``, its refusal, tells."""
    try:
        params = inspect.signature(export).parameters
    except (TypeError, ValueError):  # a builtin (pybind11, nanobind, C) without a signature
        signed = False
    else:
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return params
        signed = True  # takes **kwargs: only the refusal's text can tell
    named = _NAMED_KEYWORD.search(text)
    if named is not None:
        return _AllBut(named.group(1) or named.group(2))
    if "takes no keyword arguments" in text:
        return ()
    overloads = _OVERLOAD.findall(text)
    if overloads:
        names: set[str] = set()
        for listed in overloads:
            for param in _split_params(listed):
                if param.startswith("**"):
                    return None  # an overload takes any keyword: the error is about another thing
                found = _PARAM_NAME.match(param)
                if found is not None:
                    names.add(found.group(1))
        return names
    return None if signed else ("stream",)


class _AllBut:
    """Every keyword but the one a refusal named, as a container."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __contains__(self, name: object) -> bool:
        return name != self.name


def _split_params(listed: str) -> list[str]:
    """The parameters of one listed signature, split at the commas outside brackets."""
    params: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(listed):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            params.append(listed[start:i].strip())
            start = i + 1
    params.append(listed[start:].strip())
    return params


def _consume(capsule: Any, immutable: bool = False) -> Tensor:
    """Import a capsule and take ownership of its managed tensor (see `_open`)."""
    t, used_name, deleter = _open(capsule, immutable)
    _commit(capsule, t._storage, used_name, deleter)
    return t


def _open(capsule: Any, immutable: bool = False) -> tuple[Tensor, bytes, int]:
    """Read and validate a capsule without consuming it.

    Returns the tensor (its storage not yet armed), the ``used_*`` name and the deleter address. On
    any error the capsule is left as it was, so its destructor still frees the producer's memory.
    ``immutable``: the producer's memory is immutable (`_immutable`), so a legacy capsule, which
    cannot say ``READ_ONLY``, is imported read-only; a versioned capsule says it for itself.
    """
    if type(capsule) is not _CapsuleType:
        raise _not_a_producer(capsule)
    try:
        managed = capsule_pointer(capsule, DLTENSOR_VERSIONED)
    except ValueError:
        managed = _legacy_pointer(capsule)
        data, dev_type, dev_id, ndim, dtype_word, shape_p, strides_p, byte_offset, _ctx, deleter = (
            read(LEGACY, managed)
        )
        # A legacy capsule cannot say read-only: like PyTorch, tensorbridge imports it writable,
        # unless its producer is known to hand out immutable memory (`_immutable`).
        t = _tensor(
            managed, data, dev_type, dev_id, ndim, dtype_word, shape_p, strides_p, byte_offset,
            immutable, False, None,
        )  # fmt: skip
        return t, USED_DLTENSOR, deleter
    t, deleter = _versioned(managed)
    return t, USED_DLTENSOR_VERSIONED, deleter


def _commit(capsule: Any, storage: Any, used_name: bytes, deleter: int) -> None:
    """Take ownership: rename the capsule, then arm the storage.

    Nothing that can fail comes after the rename, so the deleter runs exactly once: by the capsule's
    destructor if this never happens, by the storage otherwise.
    """
    capsule_set_name(capsule, used_name)
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
    major, _minor, _ctx, deleter = read(VERSIONED, managed)[:4]
    if major == DLPACK_MAJOR_VERSION and deleter:
        _deleter_function(deleter)(managed)


def _deleter_function(address: int) -> Any:
    """The function that calls the producer's deleter at ``address`` (made once)."""
    global _last_deleter  # noqa: PLW0603 (a one-entry cache is module state by nature)
    last = _last_deleter
    if last[0] == address:
        return last[1]
    fn = _deleter_of(address)
    if fn is None:
        fn = remember(_DELETERS, address, _native.VoidFunction(address))
    _last_deleter = (address, fn)  # written only on a change: a write costs every global lookup
    return fn


def _versioned(managed: int) -> tuple[Tensor, int]:
    """The tensor a ``DLManagedTensorVersioned`` describes, with its flags, and its deleter's
    address; `BufferError` for another major version, before anything else is read."""
    fields = read_versioned(managed, MAX_NDIM)
    if fields is None:  # outside the readable range: `read` refuses the address, or reads it
        fields = (*read(VERSIONED, managed), None)
    (
        major, minor, _ctx, deleter, flags,
        data, dev_type, dev_id, ndim, dtype_word, shape_p, strides_p, byte_offset, dims,
    ) = fields  # fmt: skip
    if major != DLPACK_MAJOR_VERSION:
        # Nothing else may be trusted; the unrenamed capsule's destructor calls the deleter.
        msg = (
            f"from_dlpack(): the capsule holds a DLPack {major}.{minor} tensor; tensorbridge "
            f"reads major version {DLPACK_MAJOR_VERSION} only. Upgrade tensorbridge or ask the "
            f"producer for max_version={DLPACK_VERSION}."
        )
        raise BufferError(msg)
    readonly = flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0
    copied = flags & DLPACK_FLAG_BITMASK_IS_COPIED != 0
    t = _tensor(
        managed, data, dev_type, dev_id, ndim, dtype_word, shape_p, strides_p, byte_offset,
        readonly, copied, dims,
    )  # fmt: skip
    return t, deleter


def _tensor(  # the DLTensor's fields, as read, then what the managed tensor says of its memory
    managed: int,
    data: int,
    dev_type: int,
    dev_id: int,
    ndim: int,
    dtype_word: int,
    shape_p: int,
    strides_p: int,
    byte_offset: int,
    readonly: bool,
    copied: bool,
    dims: tuple[tuple[int, ...], tuple[int, ...]] | None,
) -> Tensor:
    """The tensor a DLTensor describes, over a storage spanning exactly the bytes it reaches.

    The extent is checked by `_storage.locate`, with Python ints, so a layout whose byte extent does
    not fit the address space is refused rather than wrapped. NULL strides mean row-major: legal
    before DLPack 1.2 and accepted from any version. Size-0 tensors may have any strides and NULL
    data (the DLPack header allows both). The storage owns the managed tensor, but calls no deleter
    until `_arm` arms it. ``dims``: the shape and strides, when the caller read them already.
    """
    dtype = _DTYPES.get(dtype_word)
    if dtype is None:
        raise _unsupported_dtype(dtype_word)
    device = CPU if dev_type == _kDLCPU else Device.from_dlpack(dev_type, dev_id)
    if dims is not None:  # read with the managed struct (`read_versioned`)
        shape, strides = dims
    elif 0 < ndim <= MAX_NDIM and shape_p and strides_p:
        dims = read_dims(shape_p, strides_p, ndim)
        if dims is None:  # outside the readable range: `read` refuses the address, or reads it
            dims = read(INT64_ARRAYS[ndim], shape_p), read(INT64_ARRAYS[ndim], strides_p)
        shape, strides = dims
    else:
        shape, strides = _shape_and_strides(ndim, shape_p)
    for size in shape:  # DLPack's own rules first: sizes, the empty tensor, NULL data
        if size <= 1:
            if size == 0:
                if min(shape) < 0:
                    raise _negative_shape(shape)
                storage = own_managed(data or 0, 0, device, readonly, copied, managed)
                return _construct(Tensor, storage, 0, shape, strides, dtype, "from_dlpack")
            if size < 0:
                raise _negative_shape(shape)
    if not data:
        msg = (
            f"from_dlpack(): DLTensor.data is NULL for a non-empty tensor of shape "
            f"{list(shape)}; the producer wrote an invalid capsule."
        )
        raise BufferError(msg)
    itemsize = dtype.itemsize
    addressable = dev_type == _kDLCPU or dev_type in ADDRESSABLE_TYPES  # CPU: no set lookup
    if addressable:
        base, offset = data + byte_offset, 0
    else:
        # ``data`` may be an opaque handle: the storage starts at it, byte_offset in elements.
        offset, rest = divmod(byte_offset, itemsize)
        if rest:
            raise _handle_offset(byte_offset, itemsize, device)
        base = data
    try:
        start, nbytes, offset = locate(
            base,
            None,
            offset,
            shape,
            strides,
            itemsize,
            "from_dlpack",
            refused,
            sized=False,
            anchored=not addressable,
        )
    except BufferError as exc:
        refusal = refusal_of(exc)
        if refusal is None:
            raise
        if refusal.kind == "outside":  # only anchored layouts are refused for this
            raise _handle_offset(byte_offset, itemsize, device) from None
        msg = (
            f"from_dlpack(): the layout (data=0x{data:x}, byte_offset={byte_offset}, shape="
            f"{list(shape)}, strides={list(strides)}, itemsize={itemsize}) reaches outside the "
            f"address space; the producer wrote an invalid capsule."
        )
        raise BufferError(msg) from None
    storage = own_managed(start, nbytes, device, readonly, copied, managed)
    # requires_grad=False, checked=True, given by position: a C call when compiled
    return _construct(Tensor, storage, offset, shape, strides, dtype, "from_dlpack", False, True)


def _shape_and_strides(ndim: int, shape_p: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides (in elements) of a DLTensor that does not carry both arrays (`_tensor`
    reads those itself): none for ndim 0, row-major strides for NULL ones; malformed otherwise."""
    if ndim == 0:
        return (), ()  # shape and strides may be NULL (DLPack 1.3): never read them
    if not 0 < ndim <= MAX_NDIM or not shape_p:
        msg = (
            f"from_dlpack(): malformed DLTensor: ndim={ndim} (at most {MAX_NDIM}), shape "
            f"{'set' if shape_p else 'NULL'}; the producer wrote an invalid capsule."
        )
        raise BufferError(msg)
    shape = read(INT64_ARRAYS[ndim], shape_p)
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
        managed: int = capsule_pointer(capsule, DLTENSOR)
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
    cls = type(ext_tensor)
    producer = _producer_of(cls) or _producer_of(id(cls)) or _producer(cls)
    capsule = _request(ext_tensor, producer, target, copy)
    try:
        t = _consume(capsule, producer.immutable)
    except BaseException:
        capsule = None  # refused: the producer's capsule dies now (see `_from_dlpack`)
        raise
    if target is not None:
        t = _relabel(t, target)
    storage = t._storage
    if copy and (not storage.is_copied or storage.readonly) and storage.device.is_host_accessible:
        # The producer ignored copy=True or could not say it copied (legacy capsule; PyTorch 2.13
        # never sets IS_COPIED, and JAX aliases 64-byte aligned memory even for copy=True), or its
        # copy is read-only (an immutable producer's): copy=True gives private, writable memory.
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
    return Tensor._new(host, t._offset, t._shape, t._strides, t._dtype, "from_dlpack")


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
