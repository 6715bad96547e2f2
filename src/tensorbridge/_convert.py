"""`asarray`: one dispatcher from anything that holds memory to a `Tensor`; `from_pointer` for raw memory.

`asarray` picks exactly one protocol per object, the first that applies in this order:

==========================  ==========================================================================
path                        taken for
==========================  ==========================================================================
``"tensor"``                a tensorbridge `Tensor` (aliased)
``"dlpack_capsule"``        a ``"dltensor"`` / ``"dltensor_versioned"`` PyCapsule (`from_dlpack`)
``"arrow"``                 ``__arrow_c_array__`` (pyarrow arrays, nanoarrow, ...)
``"arrow_stream"``          ``__arrow_c_stream__`` (pyarrow ChunkedArray, polars Series, ...)
``"ndarray"``               a ``numpy.ndarray`` (exactly that type): its buffer, else ``"dlpack"``
``"dlpack"``                ``__dlpack__`` (NumPy, PyTorch, JAX, CuPy, ...; `from_dlpack`)
``"cuda_array_interface"``  ``__cuda_array_interface__`` (Numba, CuPy, ...)
``"array_interface"``       ``__array_interface__``
``"buffer"``                the buffer protocol, dtype taken from the buffer's format (PyTorch ignores it)
``"array"``                 ``__array__`` (Dask, xarray, pandas, TensorFlow variables, ...): the
                            NumPy array it returns (`_import_array`)
``"sequence"``/``"scalar"`` anything else: nested sequences and scalars, copied by `tensor`
==========================  ==========================================================================

A protocol whose importer refuses the object with a `BufferError` (NumPy before 2.1 refuses
read-only and broadcast arrays through ``__dlpack__``; an Arrow stream of structs, as a pandas
DataFrame or an xarray DataArray gives, has no tensor form) is followed by the next protocol in the
table that the object offers; when that fails too, the first refusal is raised, unless the later
protocol refused ``copy=False`` (`ValueError`), which answers what the caller asked.

``__array__`` is called as NumPy 2 calls it: ``__array__()``, ``__array__(dtype)`` when a dtype NumPy
names is asked, with ``copy=`` as a keyword when ``copy`` is not None; an implementation that does
not take ``copy`` (its `TypeError` says "unexpected keyword argument 'copy'") is called again
without it, silently. The array returned is imported as `asarray` imports any ndarray (zero-copy:
the tensor holds that array, which holds its ``base``), so the tensor shares whatever memory the
array does. Whether that memory is the object's own cannot always be told; what can be proved is
the opposite, that the array is **private**: it owns its memory (``base`` is None, or a chain of
ndarrays ending in one that owns its data) and nothing but that chain refers to any array in it,
so nothing else, the object included, can reach the memory. The rule:

* ``copy=None``: the array is imported as it is.
* ``copy=True``: ``__array__(copy=True)`` makes the copy; the result is copied again only when it
  is not provably private (a producer that ignored ``copy``).
* ``copy=False``: the object must take ``copy=False`` (NumPy 2's promise: it raises when it cannot
  avoid a copy) and its array must not be provably private (Dask computes a new array whatever
  ``copy`` says; a TensorFlow variable's ``__array__`` takes no ``copy`` and reads a snapshot);
  else NumPy's `ValueError`, "Unable to avoid copy while creating an array as requested".

A NumPy array is read through its buffer (format, shape, strides, read-only: everything its
``__dlpack__`` would say of host memory), as PyTorch reads one through NumPy's C API: one C call
instead of a capsule round trip. When the buffer cannot describe it exactly (datetimes, records,
non-native byte order, strides that are not whole elements, a dimension of size 0 or 1, whose stride
NumPy's buffer rewrites), or ``device`` or ``copy=True`` is asked, it takes the ``"dlpack"`` path, so
every refusal is the one DLPack gives.

Arrow comes before DLPack because the Arrow C data interface describes Arrow memory exactly (immutable,
with validity bitmaps and bit-packed booleans) while DLPack from an Arrow producer is a derived view
that cannot carry booleans. DLPack comes before the array interfaces because it is the standard and
negotiates device, stream, copy and read-only itself.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Sequence
from typing import Any, Final

from . import _capi, _creation, _dlpack, _interfaces, _layout, _peers, _tensor
from ._args import as_copy, as_int
from ._buffer import buffer_refused, import_buffer, import_ndarray
from ._cache import TypeTable, remember_type
from ._device import Device, as_device
from ._dtype import BY_ML_DTYPES, DType, as_dtype
from ._errors import ValuesRefused, as_called, numpy_fix, release_frames, short_repr
from ._tensor import Tensor

__all__ = [
    "as_tensor",
    "asarray",
    "from_numpy",
    "from_pointer",
    "is_protocol_object",
    "tensor",
    "to_torch",
]

# The paths `asarray` can take. A path is always one of these very objects (`_dispatch` returns
# them, and the per-type table holds them), so the hot paths test it with ``is``.
_TENSOR: Final = "tensor"
_CAPSULE: Final = "dlpack_capsule"
_ARROW: Final = "arrow"
_ARROW_STREAM: Final = "arrow_stream"
_NDARRAY: Final = "ndarray"
_DLPACK: Final = "dlpack"
_CUDA_ARRAY_INTERFACE: Final = "cuda_array_interface"
_ARRAY_INTERFACE: Final = "array_interface"
_BUFFER: Final = "buffer"
_ARRAY: Final = "array"
_SEQUENCE: Final = "sequence"
_SCALAR: Final = "scalar"

# Protocols found by attribute, in order of preference (see the module docstring).
_BY_ATTRIBUTE: Final = (
    (_ARROW, "__arrow_c_array__"),
    (_ARROW_STREAM, "__arrow_c_stream__"),
    (_DLPACK, "__dlpack__"),
    (_CUDA_ARRAY_INTERFACE, "__cuda_array_interface__"),
    (_ARRAY_INTERFACE, "__array_interface__"),
)
# Paths whose ``found`` value `_import` reads (an Arrow method, an interface dictionary); the
# DLPack path calls `from_dlpack` on the object itself.
_VALUE_PATHS: Final = frozenset({_ARROW, _ARROW_STREAM, _CUDA_ARRAY_INTERFACE, _ARRAY_INTERFACE})
# Protocols an instance attribute cannot take from its type: methods, looked up on the type.
_METHOD_PATHS: Final = frozenset({_ARROW, _ARROW_STREAM, _NDARRAY, _DLPACK, _ARRAY})
# The protocols a refusal falls through to, in order, after each path (`_after`): those found by
# attribute after it, then the buffer protocol and ``__array__``.
_AFTER: Final = {
    **{path: _BY_ATTRIBUTE[i + 1 :] for i, (path, _name) in enumerate(_BY_ATTRIBUTE)},
    _BUFFER: (),
    _ARRAY: (),
}

# The path of each type whose instances all take the same one, and the attribute `_import` then
# reads: `asarray` probes a type once, as `from_dlpack` does. Seeded with the built-in types
# (`_probe` gives the same answers when the bounded table was emptied).
# Keyed by ``id(cls)`` and holding no type (`_cache.TypeTable`).
_PATHS_BY_TYPE: Final[TypeTable[tuple[str, str | None]]] = TypeTable(
    {
        **dict.fromkeys((list, tuple), (_SEQUENCE, None)),
        **dict.fromkeys((bool, int, float, complex), (_SCALAR, None)),
        **dict.fromkeys((bytes, bytearray, memoryview), (_BUFFER, None)),
        Tensor: (_TENSOR, None),
        _capi.CapsuleType: (_CAPSULE, None),
    }
)
# The table's ``get``, bound once: looking a method up costs each call as much as calling it.
_known_path: Final = _PATHS_BY_TYPE.get


def _dispatch(obj: Any) -> tuple[str, Any]:
    """The path `asarray` takes for ``obj``, and what it found on the way (the attribute's value).

    One table lookup for a type seen before (an interface property is then read once, its value
    handed on); `_probe` for the others.
    """
    cls = type(obj)
    known = _known_path(cls) or _known_path(id(cls))  # a static type, else a class (`TypeTable`)
    if known is not None:
        path, attribute = known
        if attribute is None:
            return known
        value = getattr(obj, attribute, None)
        if value is not None:
            return path, value
    return _probe(obj)


def _probe(obj: Any) -> tuple[str, Any]:
    """`_dispatch` by looking at ``obj`` itself: one ``getattr`` with a default per protocol, in
    order; the answer is remembered for the type when the type alone decides it (`_type_decides`)."""
    cls = type(obj)
    path: str | None = None
    attribute: str | None = None
    value: Any = None
    if isinstance(obj, Tensor):
        path = _TENSOR
    else:
        for path, attribute in _BY_ATTRIBUTE:  # noqa: B007  (the loop's last pair is used below)
            value = getattr(obj, attribute, None)
            if value is not None:
                break
        else:
            attribute = None
            if _capi.PyObject_CheckBuffer(obj):
                path = _BUFFER
            elif getattr(obj, "__array__", None) is not None:
                path = _ARRAY  # only here: a type that takes an earlier door never looks
            else:
                path = _SCALAR if isinstance(obj, numbers.Number) else _SEQUENCE
        if path is _DLPACK and _is_ndarray(cls):
            path = _NDARRAY
    if _type_decides(cls, path, attribute):
        remember_type(_PATHS_BY_TYPE, cls, (path, attribute if path in _VALUE_PATHS else None))
    return path, value


def _is_ndarray(cls: type) -> bool:
    """Whether ``cls`` is ``numpy.ndarray`` itself (a subclass may export differently); NumPy is
    imported already when one of its arrays exists."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and cls is getattr(numpy, "ndarray", None)


def _is_numpy_scalar(obj: Any) -> bool:
    """Whether ``obj`` is a NumPy scalar (any ``numpy.generic``: numbers, bools, datetimes,
    strings, structured ``void``s); NumPy is imported already when one exists."""
    numpy = sys.modules.get("numpy")
    generic = None if numpy is None else getattr(numpy, "generic", None)
    return generic is not None and isinstance(obj, generic)


def _numpy_scalar_refusal(obj: Any, api: str) -> str:
    """PyTorch's refusal of ``copy=False`` for a NumPy scalar, which holds no memory to share (its
    ``__array_interface__`` points into a new array at each read), naming the call and the fix."""
    cls = type(obj)
    return (
        f"{api}(): can't alias NumPy scalars. Either remove copy=False or transform it in a "
        f"ndarray. Got {short_repr(obj)} ({cls.__module__}.{cls.__qualname__}), whose value lives "
        f"in no memory a tensor could share; pass copy=None or copy=True for a tensor holding it."
    )


def _type_decides(cls: type, path: str, attribute: str | None) -> bool:
    """Whether every instance of ``cls`` takes ``path``, which one instance took.

    True when attribute lookup is the standard one (no ``__getattribute__`` or ``__getattr__`` of
    the type's own, in Python or in C: `_capi.has_generic_getattr`), the protocols are found on the type itself (the chosen one there, none of
    those before it), and an instance cannot add one: it has no ``__dict__``, or the protocol is a
    method (``__arrow_c_array__``, ``__arrow_c_stream__``, ``__dlpack__``, ``__array__``), which
    tensorbridge, like Python's special methods, takes from the type. A type changed after its
    first conversion keeps its first answer.
    """
    if not _capi.has_generic_getattr(cls) or hasattr(cls, "__getattr__"):
        return False
    if cls.__dictoffset__ and path not in _METHOD_PATHS and path != _TENSOR:
        return False
    if (path is _ARRAY or path is _SEQUENCE or path is _SCALAR) and (path is _ARRAY) != (
        getattr(cls, "__array__", None) is not None
    ):
        return False  # an instance's own __array__, or one the type has and this one turned down
    for _path, name in _BY_ATTRIBUTE:
        on_type = getattr(cls, name, None) is not None
        if name == attribute:
            return on_type
        if on_type:
            return False  # an earlier protocol the instance turned down (a property gave None)
    return True


def _after(path: str, obj: Any) -> tuple[str, Any] | None:
    """The protocol `asarray` would take for ``obj`` if it offered none up to ``path``, if any."""
    for after, attribute in _AFTER[path]:
        value = getattr(obj, attribute, None)
        if value is not None:
            return after, value
    if path is not _BUFFER and path is not _ARRAY and _capi.PyObject_CheckBuffer(obj):
        return _BUFFER, None
    if path is not _ARRAY and not _is_an_ndarray(obj):  # an ndarray's __array__ is itself again
        method = getattr(obj, "__array__", None)
        if method is not None:
            return _ARRAY, method
    return None


def _is_an_ndarray(obj: Any) -> bool:
    """Whether ``obj`` is a NumPy array (of a subclass too), without importing NumPy."""
    numpy = sys.modules.get("numpy")
    ndarray = getattr(numpy, "ndarray", None)
    return ndarray is not None and isinstance(obj, ndarray)


def _fall_through(
    refusal: Exception,
    path: str,
    obj: Any,
    device: Device | None,
    copy: bool | None,
    dtype: DType | None,
    api: str,
) -> tuple[Tensor, bool] | None:
    """The next protocol ``obj`` offers after ``path``, whose importer refused it with
    ``refusal``; None when there is none or it fails too (the caller raises ``refusal``), except a
    later ``copy=False`` refusal (`ValueError`), raised as the answer to what was asked."""
    after = _after(path, obj)
    if after is None or isinstance(refusal, ValuesRefused):
        return None
    try:
        return _import(after[0], obj, after[1], device, copy, dtype, api)
    except ValueError:
        if copy is False:
            raise
    except Exception:  # the first refusal, raised by the caller, says more
        pass
    return None


def _dispatch_path(obj: Any) -> str:
    """The name of the protocol `asarray` uses for ``obj`` (``"dlpack"``, ``"buffer"``, ...)."""
    return _dispatch(obj)[0]


def is_protocol_object(obj: Any) -> bool:
    """True when `asarray` would read ``obj``'s memory through a protocol rather than copy its elements."""
    return _dispatch(obj)[0] not in (_SEQUENCE, _SCALAR)


# ---------------------------------------------------------------------------------------------- paths
def _import(
    path: str,
    obj: Any,
    found: Any,
    device: Device | None,
    copy: bool | None,
    dtype: DType | None,
    api: str,
) -> tuple[Tensor, bool]:
    """Run one protocol path: the tensor, and whether it is already a private copy.

    A producer that refuses DLPack (a `BufferError`: NumPy before 2.1 refuses read-only arrays,
    which its array interface and buffer serve) is read through the next protocol it offers; when
    that fails too, the producer's refusal is raised.
    """
    if path is _NDARRAY:
        if device is None and copy is not True:
            t = import_ndarray(obj, api)
            if t is not None:
                return t, False
        path = _DLPACK
    if path is _DLPACK:
        # The producer makes the copy for copy=True, unless a dtype change will copy anyway.
        producer_copies = copy is True and dtype is None
        try:
            t = _dlpack.from_dlpack(obj, device=device, copy=True if producer_copies else copy)
        except BufferError as refusal:
            later = _ml_dtypes_import(obj, device, copy, dtype, api) or _fall_through(
                refusal, _DLPACK, obj, device, copy, dtype, api
            )
            if later is not None:
                return later
            called = as_called(refusal, api, obj)
            raise called from called.__cause__
        except Exception as exc:
            called = as_called(exc, api, obj)
            raise called from called.__cause__
        return t, producer_copies
    if path is _CAPSULE:
        try:
            return _dlpack.from_dlpack(obj), False
        except Exception as exc:
            called = as_called(exc, api, obj)
            raise called from called.__cause__
    try:
        if path is _ARROW:
            return _interfaces.import_arrow_array(found, copy, api)
        if path is _ARROW_STREAM:
            return _interfaces.import_arrow_stream(found, copy, api)
        if path is _CUDA_ARRAY_INTERFACE:
            return _interfaces.import_cuda_array_interface(obj, found, api), False
        if path is _ARRAY_INTERFACE:
            return _interfaces.import_array_interface(obj, found, api, copy is False), False
        if path is _ARRAY:
            return _import_array(obj, copy, dtype, api)
        return import_buffer(obj, api), False
    except BufferError as refusal:
        later = _fall_through(refusal, path, obj, device, copy, dtype, api)
        if later is not None:
            return later
        raise
    except Exception as failure:
        own = str(failure).startswith(f"{api}():")
        if path is _BUFFER and not own:
            # The exporter refused the buffer request (a released memoryview, a closed mmap):
            # PyTorch's words for it, as `frombuffer` says them.
            raise buffer_refused(obj, failure, api, False) from failure
        if (path is not _ARROW and path is not _ARROW_STREAM) or own:
            raise  # not an Arrow door, or tensorbridge's own answer (to copy=False, say)
        # The producer's own Arrow export can fail where its other doors serve (pyarrow cannot
        # export complex or bfloat16 NumPy data, which xarray and pandas hand it; xarray refuses
        # to export a Dask-backed array): the next one.
        later = _fall_through(failure, path, obj, device, copy, dtype, api)
        if later is not None:
            return later
        raise


def _ml_dtypes_import(
    obj: Any, device: Device | None, copy: bool | None, dtype: DType | None, api: str
) -> tuple[Tensor, bool] | None:
    """A NumPy array of an ml_dtypes type tensorbridge has (bfloat16, the float8 types, ...),
    which NumPy's DLPack export refuses unless ml_dtypes registers its types there: its raw bits
    (an unsigned view of the same memory, so the tensor holds the array) read as that dtype.
    None for any other object. Called when DLPack refused ``obj``."""
    ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
    if ndarray is None or not isinstance(obj, ndarray):
        return None
    ml_type = getattr(obj.dtype, "type", None)
    if getattr(ml_type, "__module__", None) != "ml_dtypes":
        return None
    held = BY_ML_DTYPES.get(obj.dtype.name)
    if held is None:
        return None
    raw = obj.view(f"u{obj.dtype.itemsize}")
    t, copied = _import(_NDARRAY, raw, None, device, copy, None, api)
    return t.view(held), copied


_COPY_KEYWORD: Final = "unexpected keyword argument 'copy'"


def _call_array(obj: Any, copy: bool | None, dtype: DType | None) -> tuple[Any, bool]:
    """``obj.__array__`` called as NumPy 2 calls it, and whether it took ``copy``: ``dtype`` (as a
    NumPy dtype, when NumPy names it) positionally, ``copy`` as a keyword when not None; called
    again without ``copy`` when the implementation does not take it (NumPy warns then; tensorbridge
    does not)."""
    method = obj.__array__
    args: tuple[Any, ...] = ()
    numpy = sys.modules.get("numpy")
    if dtype is not None and dtype.typestr is not None and numpy is not None:
        args = (numpy.dtype(dtype.typestr),)
    if copy is None:
        return method(*args), False
    try:
        return method(*args, copy=copy), True
    except TypeError as exc:
        if _COPY_KEYWORD not in str(exc):
            raise
    return method(*args), False


def _chain_counts(array: Any) -> list[int]:
    """The reference counts of ``array`` and of each object in its ``base`` chain, as seen here."""
    counts = [sys.getrefcount(array)]
    base = array.base
    while base is not None:
        counts.append(sys.getrefcount(base))
        base = getattr(base, "base", None)
    return counts


class _Link:
    """A stand-in for an ndarray and its ``base`` in `_UNSHARED`'s measurement."""

    __slots__ = ("base",)

    def __init__(self, base: Any) -> None:
        self.base = base


def _unshared_counts() -> tuple[int, int]:
    """What `_chain_counts` sees of an array held by one local only and of a base held by its
    array only, measured the way `_import_array` measures (the interpreter's own references to an
    argument differ between versions and builds)."""
    array = _Link(_Link(None))
    counts = _chain_counts(array)
    return counts[0], counts[1]


_UNSHARED: Final = _unshared_counts()


def _is_private(array: Any, counts: list[int]) -> bool:
    """Whether nothing but ``array`` can reach its memory, given its `_chain_counts`: the
    ``base`` chain is ndarrays ending in one that owns its data (NumPy's ``OWNDATA``), and nothing
    refers to the array or any base but the chain itself (and the caller's one local)."""
    ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
    if ndarray is None or counts[0] > _UNSHARED[0]:
        return False
    if any(count > _UNSHARED[1] for count in counts[1:]):
        return False
    root = array
    while root.base is not None:
        root = root.base
        if not isinstance(root, ndarray):
            return False
    return bool(root.flags.owndata)


def _copy_refusal(obj: Any, reason: str, api: str) -> ValueError:
    """NumPy 2's refusal of ``copy=False`` where a copy is needed, naming the call and the fix."""
    cls = type(obj)
    msg = (
        f"{api}(): Unable to avoid copy while creating an array as requested: "
        f"{short_repr(obj)} ({cls.__module__}.{cls.__qualname__}) {reason}. Pass copy=None "
        f"(a copy when needed) or copy=True."
    )
    return ValueError(msg)


def _import_array(
    obj: Any, copy: bool | None, dtype: DType | None, api: str
) -> tuple[Tensor, bool]:
    """The ``"array"`` path: the tensor over the NumPy array ``obj.__array__`` returns, and whether
    it is a private copy (the module docstring has the rule)."""
    try:
        array, took_copy = _call_array(obj, copy, dtype)
    except ValueError as exc:
        if copy is not False:
            raise
        reason = (str(exc).splitlines() or [""])[0]
        raise _copy_refusal(obj, f"refused copy=False in __array__ ({reason})", api) from exc
    numpy = sys.modules.get("numpy")
    ndarray = getattr(numpy, "ndarray", None)
    if ndarray is None or not isinstance(array, ndarray):
        msg = (
            f"{api}(): {type(obj).__name__}.__array__() must return a numpy.ndarray; got "
            f"{short_repr(array)} ({type(array).__qualname__}). Fix the __array__ method, or pass "
            f"an array."
        )
        raise TypeError(msg)
    counts = _chain_counts(array)
    private = _is_private(array, counts)
    if copy is False:
        if not took_copy:
            raise _copy_refusal(
                obj, "has an __array__ that does not take copy=, so it cannot promise one", api
            )
        if private:
            raise _copy_refusal(
                obj, "returned a new array from __array__(copy=False), which owns its memory", api
            )
    path, found = _dispatch(array)
    t, _copied = _import(path, array, found, None, None, None, api)
    return t, private


def _same_device(have: Device, want: Device) -> bool:
    """``cuda`` without an index matches any CUDA device, as a request for "the current one"."""
    return have.type == want.type and (want.index is None or want.index == (have.index or 0))


def _finish(
    t: Tensor,
    copied: bool,
    source: Any,
    *,
    dtype: DType | None,
    device: Device | None,
    copy: bool | None,
    requires_grad: bool,
    api: str,
) -> Tensor:
    """Apply ``device``, ``dtype``, ``copy`` and ``requires_grad`` to an imported tensor."""
    if device is not None and not _same_device(t.device, device):
        if copy is False:
            msg = (
                f"{api}(): can't alias tensor from device '{t.device}' to '{device}'. "
                f"Pass copy=None or copy=True to allow a copy."
            )
            raise ValueError(msg)
        try:
            t, copied = t.to(device), True
        except Exception as exc:  # to()'s refusal (tensorbridge does not copy between devices)
            called = as_called(exc, api, source)
            raise called from called.__cause__
    if dtype is not None and dtype is not t.dtype:
        if copy is False:
            have, want = (d.torch_name or d.name for d in (t.dtype, dtype))
            msg = (
                f"{api}(): can't alias tensor with dtype '{have}' into dtype '{want}'. "
                f"Pass copy=None or copy=True to allow a converting copy."
            )
            raise ValueError(msg)
        t, copied = t.to(dtype), True
    if copy and not copied:
        t = t.clone()
    if requires_grad and not t.requires_grad:
        # Never flip the flag on the caller's own tensor (PyTorch does): mark a new view instead.
        t = (t.detach() if t is source else t).requires_grad_(True)
    return t


def asarray(
    obj: Any,
    *,
    dtype: Any = None,
    device: Any = None,
    copy: bool | None = None,
    requires_grad: bool = False,
) -> Tensor:
    """Convert ``obj`` to a tensor, sharing its memory whenever possible (PyTorch's ``asarray``).

    ``obj`` may be a tensorbridge `Tensor`, a DLPack capsule or producer, an Arrow array or stream, an
    object with ``__cuda_array_interface__`` or ``__array_interface__``, a buffer (its format gives the
    dtype: ``array('i')`` is int32, ``bytes`` uint8), or nested sequences and scalars. When an object
    speaks several protocols the first applicable one in this order is used: Tensor, DLPack capsule,
    ``__arrow_c_array__``, ``__arrow_c_stream__``, ``__dlpack__``, ``__cuda_array_interface__``,
    ``__array_interface__``, buffer protocol, ``__array__``, sequence/scalar. A protocol whose
    importer refuses the object (`BufferError`: a producer refusing ``__dlpack__``, an Arrow type
    with no tensor form) is followed by the next of these it offers. ``__array__`` (Dask, xarray,
    pandas, TensorFlow variables) is called as NumPy 2 calls it and the array it returns is shared;
    ``copy=False`` is refused where that array is provably a new one (the module docstring has the
    rule). A ``numpy.ndarray`` is read through
    its buffer when that describes it (as PyTorch reads it through NumPy's C API), else through
    ``__dlpack__``.

    Args:
        obj: what to convert.
        dtype: the result's dtype; another dtype than the source's means a converting copy.
        device: the result's device; another device than the source's means a copy (host memory only).
        copy: None shares when possible and copies when needed; True always copies; False never copies
            and raises `ValueError` naming why a copy would be needed (PyTorch's texts: "can't alias
            tensor with dtype ...", "can't alias arbitrary sequence into a tensor."). A NumPy scalar
            has no memory to share: PyTorch's `RuntimeError` ("can't alias NumPy scalars"). Nor has
            an ``__array_interface__`` over a temporary (NumPy's ``'__ref'`` entry, or other memory
            each time it is read: with False the interface is read twice): `ValueError`. An
            interface whose memory nothing keeps alive cannot be told from one whose memory lives.
        requires_grad: mark the result as requiring gradients (floating and complex dtypes only). A
            tensor passed in is never modified: a new view carries the flag.

    Returns:
        A tensor. A shared result keeps the producer's memory alive (its owner: the object, a held
        buffer export, a DLPack deleter or an Arrow release callback) for as long as any view lives;
        read-only sources give read-only tensors.

    Example:
        >>> import array
        >>> asarray(array.array('i', [1, 2, 3]))
        tensor([1, 2, 3], dtype=tensorbridge.int32)
    """
    try:
        return convert(obj, dtype, device, copy, requires_grad, "asarray")
    except BaseException as exc:
        release_frames(exc)  # a refusal holds nothing once it leaves: see `_errors.release_frames`
        raise


def convert(obj: Any, dtype: Any, device: Any, copy: Any, requires_grad: bool, api: str) -> Tensor:
    """`asarray`, with errors naming ``api``, the function the user called (``tensor`` too)."""
    if dtype is not None:
        dtype = as_dtype(dtype, api)
    want = None if device is None else as_device(device, api)
    if copy is not None:
        copy = as_copy(copy, api)
        if copy is False and _is_numpy_scalar(obj):
            raise RuntimeError(_numpy_scalar_refusal(obj, api))
    path, found = _dispatch(obj)
    if path is _TENSOR:
        t, copied = obj, False
    elif path is _SEQUENCE or path is _SCALAR:
        if copy is False:
            raise _alias_refusal(obj, path, api)
        return _creation.from_data(obj, dtype, want, requires_grad, api)
    else:
        if copy is None and path is _ARRAY_INTERFACE and _is_numpy_scalar(obj):
            # A NumPy scalar is a value, not memory to share: PyTorch copies it. NumPy 2.5's
            # interface points into the (immutable) scalar itself, read-only, where older ones
            # made a writable temporary ('__ref') at each read.
            copy = True
        t, copied = _import(path, obj, found, want, copy, dtype, api)
    if dtype is None and want is None and not copy and requires_grad is False:
        return t  # nothing to apply (the common case)
    return _finish(
        t, copied, obj, dtype=dtype, device=want, copy=copy, requires_grad=requires_grad, api=api
    )


def _alias_refusal(obj: Any, path: str, api: str) -> ValueError:
    """PyTorch's refusal of ``copy=False`` for data held by value (a Python scalar, nested
    sequences), which has no memory a tensor could share, naming the value and the fix."""
    cls = type(obj)
    what = (
        "a Python scalar, a value with no memory"
        if path is _SCALAR
        else "a sequence of Python objects, not memory"
    )
    msg = (
        f"{api}(): can't alias arbitrary sequence into a tensor. Got {short_repr(obj)} "
        f"({cls.__module__}.{cls.__qualname__}), {what} a tensor could share. Pass copy=None "
        f"(or copy=True) for a tensor holding a copy of its values."
    )
    return ValueError(msg)


# ---------------------------------------------------------------------------------------------- pointers
def _strides_arg(strides: Any, shape: tuple[int, ...], api: str) -> tuple[int, ...]:
    if strides is None:
        return _layout.contiguous_strides(shape)
    if isinstance(strides, (str, bytes)) or not hasattr(strides, "__iter__"):
        msg = (
            f"{api}(): strides must be a sequence of ints (in elements); got {short_repr(strides)}."
        )
        raise TypeError(msg)
    out = tuple(as_int(s, api, "each stride") for s in strides)
    if len(out) != len(shape):
        msg = (
            f"{api}(): got {len(out)} strides for {len(shape)} dimensions; strides {list(out)}, "
            f"shape {list(shape)}. Pass one stride (in elements) per dimension."
        )
        raise ValueError(msg)
    return out


def from_pointer(
    ptr: int,
    shape: Any,
    dtype: Any,
    *,
    strides: Any = None,
    device: Any = "cpu",
    owner: Any = None,
    readonly: bool = False,
    nbytes: int | None = None,
) -> Tensor:
    """A tensor over memory at a raw address, for libraries that own memory (ctypes, cffi, C extensions).

    Ownership contract: the memory belongs to the caller. tensorbridge never frees it; it keeps
    ``owner`` alive for as long as any view of the result lives, and that is all it does. **The pointer
    must remain valid for the entire lifetime of the owner** (or, with ``owner=None``, for the rest of
    the process). Typical owners: the ctypes array or cffi object holding the memory, or an object whose
    ``__del__`` frees it.

    Args:
        ptr: address of element ``[0, ..., 0]`` (an int).
        shape: sizes of the dimensions.
        dtype: element type.
        strides: strides **in elements** (PyTorch's convention), possibly negative; default C-contiguous.
        device: where the memory lives (``"cpu"``, ``"cuda:0"``, ...); device memory is never read.
        owner: the object that keeps the memory valid.
        readonly: make every view read-only.
        nbytes: the size of the valid memory ``[ptr, ptr + nbytes)``, when known: the layout (and any
            later ``as_strided`` view) is then checked against it. Without it the layout is trusted.

    Raises:
        TypeError: a non-integer pointer, shape, stride or ``nbytes``.
        ValueError: a NULL pointer with elements, a layout outside ``nbytes``, or sizes and addresses
            that overflow.

    Example:
        >>> import ctypes
        >>> buf = (ctypes.c_int32 * 4)(1, 2, 3, 4)
        >>> from_pointer(ctypes.addressof(buf), (2, 2), "int32", owner=buf, nbytes=ctypes.sizeof(buf))
        tensor([[1, 2],
                [3, 4]], dtype=tensorbridge.int32)
    """
    api = "from_pointer"
    address = as_int(ptr, api, "ptr")
    if address < 0:
        msg = f"{api}(): ptr must be a non-negative address; got {address}."
        raise ValueError(msg)
    dims = _layout.as_shape((shape,), api)
    dt = as_dtype(dtype, api)
    element_strides = _strides_arg(strides, dims, api)
    dev = as_device(device, api)
    extent = None if nbytes is None else as_int(nbytes, api, "nbytes")
    if extent is not None and extent < 0:
        msg = f"{api}(): nbytes must be non-negative; got {extent}."
        raise ValueError(msg)
    return _interfaces.wrap_memory(
        address,
        0,
        dims,
        element_strides,
        dt,
        device=dev,
        readonly=bool(readonly),
        owner=owner,
        api=api,
        nbytes=extent,
    )


# ---------------------------------------------------------------------------------------------- tensor
def tensor(
    data: Any, *, dtype: DType | None = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested sequences, scalars, or any object with memory).

    dtype inference follows PyTorch: bools -> bool, ints -> int64, floats -> float32, complex -> complex64,
    tensors and NumPy scalars keep their dtype, and the leaves promote as ``torch.promote_types`` does.
    Objects with ``__dlpack__``, a buffer or an array interface are copied through `asarray`.

    Args:
        data: what to copy: nested sequences, scalars, or any object `asarray` takes.
        dtype: the result's dtype; None infers it as above.
        device: the result's device (host memory only).
        requires_grad: mark the result as requiring gradients (floating and complex dtypes only).

    Returns:
        A new tensor in memory of its own, which nothing else refers to.

    Example:
        >>> tensor([[1, 2], [3, 4]])
        tensor([[1, 2],
                [3, 4]])
    """
    try:
        return _copy_of(data, dtype, device, requires_grad, "tensor")
    except BaseException as exc:
        release_frames(exc)
        raise


def _copy_of(data: Any, dtype: Any, device: Any, requires_grad: bool, api: str) -> Tensor:
    """`tensor`, with errors naming ``api``: objects with memory through `convert`, the rest by value."""
    if (
        not isinstance(data, (Tensor, Sequence, numbers.Number))
        and not _creation.is_numpy_scalar(data)
        and is_protocol_object(data)
    ):
        return convert(data, dtype, device, True, requires_grad, api)
    return _creation.from_data(data, dtype, device, requires_grad, api)


def as_tensor(data: Any, dtype: DType | None = None, device: Any = None) -> Tensor:
    """`asarray` without ``copy``: shares memory when possible (PyTorch's ``as_tensor``).

    Args:
        data: anything `asarray` takes.
        dtype: the result's dtype; another dtype than the source's means a converting copy.
        device: the result's device; another device than the source's means a copy (host memory
            only).

    Returns:
        A tensor, sharing ``data``'s memory (kept alive by the tensor) wherever `asarray` would.
    """
    try:
        return convert(data, dtype, device, None, False, "as_tensor")
    except BaseException as exc:
        release_frames(exc)
        raise


def from_numpy(ndarray: Any) -> Tensor:
    """A tensor sharing a NumPy array's memory, zero-copy (PyTorch's ``torch.from_numpy``).

    Writes through either one are seen by the other. The tensor holds the array (a held buffer
    export of it, or its DLPack capsule), so the memory stays valid while any view of the tensor
    lives, whatever happens to the caller's references; the array cannot be resized meanwhile.
    Unlike PyTorch, which warns and hands out a writable tensor, a read-only array (NumPy's
    ``writeable`` flag off) gives a read-only tensor: writes raise.

    Takes more than ``torch.from_numpy``, wherever tensorbridge holds the data: the ml_dtypes
    types tensorbridge has (bfloat16, the float8 types; their bits are read through an unsigned
    view of the same memory), every unsigned integer width (uint16, uint32, uint64), and negative
    strides (PyTorch raises ``ValueError`` for them). Array subclasses are read through
    ``__dlpack__``.

    Args:
        ndarray: a ``numpy.ndarray`` (or a subclass); no other array-like (see `asarray`).

    Returns:
        A tensor with the array's shape, strides, dtype and read-only flag, over its memory.

    Raises:
        TypeError: ``ndarray`` is not a NumPy array (PyTorch's "expected np.ndarray (got ...)"),
            or its dtype holds no numbers (strings, objects, datetimes, records: PyTorch's "can't
            convert np.ndarray of type ..."), with the conversion that fixes it.
        ValueError: its byte order is not native (PyTorch's "given numpy array has byte order
            different from the native byte order"), with the conversion that fixes it.

    Example:
        >>> import numpy as np
        >>> a = np.arange(3)
        >>> t = from_numpy(a)
        >>> t[0] = 7
        >>> a
        array([7, 1, 2])
    """
    api = "from_numpy"
    cls = type(ndarray)
    if not _is_ndarray(cls):
        numpy_type = getattr(sys.modules.get("numpy"), "ndarray", None)
        if numpy_type is None or not isinstance(ndarray, numpy_type):
            msg = (
                f"{api}(): expected np.ndarray (got {cls.__name__}); got {short_repr(ndarray)}. "
                f"Pass a NumPy array, or use tensorbridge.asarray() for any other array-like."
            )
            raise TypeError(msg)
    try:
        path = _NDARRAY if _is_ndarray(cls) else _DLPACK
        return _import(path, ndarray, None, None, None, None, api)[0]
    except BaseException as exc:
        release_frames(exc)
        refusal = _numpy_refusal(ndarray, api)
        if refusal is None:
            raise
        raise refusal from exc


def _numpy_refusal(array: Any, api: str) -> Exception | None:
    """PyTorch's refusal of a NumPy array whose dtype it cannot hold, where tensorbridge cannot
    either: `TypeError` ("can't convert np.ndarray of type ...") or, for a byte order that is not
    native, `ValueError`; each naming the dtype and the fix (`_errors.numpy_fix`). None for a
    dtype tensorbridge holds (the refusal was about something else)."""
    dtype = array.dtype
    fix = numpy_fix(dtype)
    if fix is None:
        return None
    if dtype.isnative or dtype.kind in "OUSVMm":
        msg = (
            f"{api}(): can't convert np.ndarray of type {dtype.type.__module__}."
            f"{dtype.type.__name__}; got {short_repr(array)}. {fix}"
        )
        return TypeError(msg)
    msg = (
        f"{api}(): given numpy array has byte order different from the native byte order; got "
        f"{short_repr(array)}. {fix}"
    )
    return ValueError(msg)


def to_torch(obj: Any, *, force: bool = False) -> Any:
    """A ``torch.Tensor`` sharing ``obj``'s memory: `Tensor.torch` of ``asarray(obj)``.

    ``obj`` is anything `asarray` takes, converted by its rules first (zero-copy where `asarray`
    is: a NumPy array, a DLPack producer, a buffer, ...; nested sequences are copied). A tensor
    PyTorch cannot share (read-only memory, negative strides) is a `BufferError` unless
    ``force=True``, which hands PyTorch a copy; errors name ``to_torch``.

    Args:
        obj: anything `asarray` takes.
        force: hand PyTorch a copy where it cannot share the memory (read-only memory, negative
            strides) instead of raising `BufferError`; memory PyTorch can share is shared anyway.

    Example:
        >>> to_torch([1, 2, 3])  # doctest: +SKIP
        tensor([1, 2, 3])
    """
    api = "to_torch"
    try:
        t = obj if type(obj) is Tensor else convert(obj, None, None, None, False, api)
        return _peers.to_torch(t, force=force, api=api)
    except BaseException as exc:
        release_frames(exc)
        raise


def _convert_value(value: Any, dtype: DType | None, api: str) -> Tensor:
    return _copy_of(value, dtype, None, False, api)


_tensor.set_converter(_convert_value)
