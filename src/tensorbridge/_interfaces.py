"""Array interfaces and Arrow: ``__array_interface__``, ``__cuda_array_interface__`` v3, Arrow PyCapsules.

Import turns each protocol's metadata into a `Tensor` over the producer's memory (`wrap_memory` does the
checks every raw-pointer import shares). Export is `_interface_export` (the dictionaries) and `_peers`
(``numpy()``, ``torch()``, ``jax()``), both below `Tensor`.

Who owns what:

* ``__array_interface__`` / ``__cuda_array_interface__``: the exporting object owns the memory; the
  storage keeps it alive (and, for data given as a buffer object, holds that buffer's export open). The
  interface gives no extent, so the producer's layout is trusted: tensorbridge checks only what can be
  checked (sizes, overflow, NULL, strides that are whole elements) — the same contract as `from_pointer`
  without ``nbytes``.
* Arrow: the consumer owns the ``ArrowArray`` it imported. tensorbridge moves the struct into memory it
  owns, marks the producer's copy released (Arrow C data interface, "Moving an array"), and calls the
  ``release`` callback exactly once, when the last view dies.

CUDA streams (``__cuda_array_interface__`` v3 ``stream``): tensorbridge launches no work, so it cannot
order work on a stream; it *synchronises* instead. A non-None ``stream`` is waited for on the host
(``cuStreamSynchronize`` through the CUDA driver, ``libcuda``, loaded with ctypes at run time) before the
tensor is built. Without a driver the import is refused with `BufferError`: never a silent race.
"""

from __future__ import annotations

import ctypes
import json
import math
import sys
from typing import Any, Final, NamedTuple

from . import _capi, _cuda, _dtype, _layout, _native
from ._args import as_int
from ._arrow_abi import ARROW_ARRAY as _ARROW_ARRAY
from ._arrow_abi import ARROW_ARRAY_STREAM as _ARROW_ARRAY_STREAM
from ._arrow_abi import ARROW_BOOL as _ARROW_BOOL
from ._arrow_abi import ARROW_SCHEMA as _ARROW_SCHEMA
from ._arrow_abi import ArrowArray, ArrowArrayStream, ArrowSchema
from ._arrow_abi import ArrowGet as _ArrowGet
from ._arrow_abi import ArrowLastError as _ArrowLastError
from ._arrow_abi import ArrowRelease as _ArrowRelease
from ._arrow_export import EXTENSION_NAME as _FIXED_SHAPE_TENSOR
from ._arrow_export import KEY_METADATA as _KEY_METADATA
from ._arrow_export import KEY_NAME as _KEY_NAME
from ._arrow_export import read_metadata as _read_metadata
from ._device import CPU, Device
from ._dtype import BY_ARROW_FORMAT, BY_TYPESTR, BYTE_ORDER_CHAR, DType
from ._errors import ValuesRefused, short_repr
from ._storage import Refusal, hold_buffer, refusal_of, refused, wrap
from ._tensor import Tensor, _construct, _from_bytes

__all__ = [
    "ArrowArray",
    "ArrowArrayStream",
    "ArrowSchema",
    "import_array_interface",
    "import_arrow_array",
    "import_arrow_stream",
    "import_cuda_array_interface",
    "memory_refused",
    "wrap_memory",
]


# ---------------------------------------------------------------------------------------------- raw memory
def wrap_memory(
    ptr: int,
    offset: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: DType,
    *,
    device: Device,
    readonly: bool,
    owner: object,
    api: str,
    nbytes: int | None = None,
) -> Tensor:
    """A tensor over memory that ``owner`` keeps valid; the checks every pointer-based import shares.

    Element ``[0, ..., 0]`` lies at ``ptr + offset * itemsize``; ``strides`` are in elements and may be
    negative. With ``nbytes`` the memory is ``[ptr, ptr + nbytes)`` and the layout must stay inside it;
    without, the storage is exactly the bytes the layout reaches, which the caller vouches for.
    Refused: a NULL pointer with elements, sizes whose bytes overflow ``Py_ssize_t``, and addresses outside
    the platform's pointer range. Nothing is read: the memory may live on a device.
    """
    try:
        storage, element_offset = wrap(
            ptr,
            nbytes,
            device,
            readonly,
            owner,
            offset,
            shape,
            strides,
            dtype.itemsize,
            api,
            refused,
        )
    except BufferError as exc:
        refusal = refusal_of(exc)
        if refusal is None:
            raise
        raise memory_refused(refusal, dtype) from None
    return _construct(Tensor, storage, element_offset, shape, strides, dtype, api, False, True)


def memory_refused(r: Refusal, dtype: DType) -> ValueError:
    """The words of `wrap_memory` (and the buffer import) for each reason `_storage.locate` refuses
    a layout."""
    shape, strides = list(r.shape), list(r.strides)
    if r.kind == "numel":
        msg = (
            f"{r.api}(): shape {shape} of {dtype} holds {r.numel} elements "
            f"({r.numel * r.itemsize} bytes), more than a process can address ({sys.maxsize} "
            f"bytes). Check the shape."
        )
    elif r.kind == "null":
        msg = (
            f"{r.api}(): the data pointer is NULL but the shape {shape} has {r.numel} elements. "
            f"Pass the address of the memory, or a shape with a zero size."
        )
    elif r.kind == "address":
        msg = (
            f"{r.api}(): shape {shape}, strides {strides} (elements) and offset {r.offset} from "
            f"pointer 0x{r.ptr:x} reach bytes [{r.start}, {r.stop}), outside the address space. "
            f"Check the pointer, strides and shape."
        )
    else:
        msg = (
            f"{r.api}(): shape {shape}, strides {strides} (elements) and offset {r.offset} reach "
            f"bytes [{r.low * r.itemsize}, {(r.high + 1) * r.itemsize}) from the pointer, outside "
            f"the {r.nbytes} bytes of memory given. Pass a layout that stays inside the memory."
        )
    return ValueError(msg)


def _ints(values: tuple[object, ...] | list[object], api: str, what: str) -> tuple[int, ...]:
    """A tuple of ints; plain ints take a fast path (``as_int``'s protocol check costs microseconds)."""
    if all(type(v) is int for v in values):
        return tuple(values)  # type: ignore[arg-type]
    return tuple(as_int(v, api, what) for v in values)


# ------------------------------------------------------------------------ __(cuda_)array_interface__ import
class _Layout(NamedTuple):
    """What an array interface describes, strides converted to elements."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType


# Versions accepted: NumPy's interface has been at 3 since 2006; the CUDA interface's versions 0-2 are
# subsets of 3 (no ``stream``, which then means "no synchronisation needed").
_VERSIONS: Final = {"__array_interface__": (3,), "__cuda_array_interface__": (0, 1, 2, 3)}


def _typestr_dtype(typestr: object, api: str, name: str) -> DType:
    """The dtype of a typestr such as ``'<f4'``; other byte orders and kinds are a `BufferError`."""
    if not isinstance(typestr, str):
        msg = f"{api}(): {name} 'typestr' must be a str like '<f4'; got {short_repr(typestr)} ({type(typestr).__name__})."
        raise TypeError(msg)
    dtype = BY_TYPESTR.get(typestr[1:]) if typestr[:1] in "<>|=" else None
    if dtype is None:
        msg = (
            f"{api}(): {name} typestr {short_repr(typestr)} is not supported; tensorbridge takes bool ('|b1'), "
            f"integers ('<i4', '|u1', ...), floats ('<f2', '<f4', '<f8') and complex ('<c8', '<c16')."
        )
        raise BufferError(msg)
    if dtype.itemsize > 1 and typestr[0] in "<>" and typestr[0] != BYTE_ORDER_CHAR:
        # Tensors are native-endian (DLPack has no byte-order field); a byte-swapped view reads garbage.
        msg = (
            f"{api}(): {name} typestr {short_repr(typestr)} has non-native byte order; tensorbridge needs native "
            f"order ({BYTE_ORDER_CHAR!r}). Byte-swap the data first (NumPy: a.astype(a.dtype.newbyteorder('='))."
        )
        raise BufferError(msg)
    return dtype


def _check_descr(iface: dict[str, Any], dtype: DType, api: str, name: str) -> None:
    """``descr`` may only restate a simple typestr (``[('', '<f4')]``); structured records are refused."""
    descr = iface.get("descr")
    if descr is None:
        return
    ok = (
        isinstance(descr, (list, tuple))
        and len(descr) == 1
        and isinstance(descr[0], tuple)
        and len(descr[0]) == 2
        and descr[0][0] == ""
        and isinstance(descr[0][1], str)
    )
    if not ok or _typestr_dtype(descr[0][1], api, name) is not dtype:
        msg = (
            f"{api}(): {name} descr {short_repr(descr)} describes a structured or different type than typestr "
            f"{short_repr(iface['typestr'])}; only simple types are supported. Pass each field separately."
        )
        raise BufferError(msg)


def _shape_of(value: object, api: str, name: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        msg = f"{api}(): {name} 'shape' must be a tuple of ints; got {short_repr(value)} ({type(value).__name__})."
        raise TypeError(msg)
    shape = _ints(value, api, f"each {name} shape entry")
    if any(s < 0 for s in shape) or len(shape) > _layout.MAX_NDIM:
        msg = (
            f"{api}(): {name} shape {list(shape)} is invalid; sizes must be non-negative and there may "
            f"be at most {_layout.MAX_NDIM} dimensions."
        )
        raise ValueError(msg)
    _layout.check_sizes(shape, api, f"{name} shape")
    return shape


def _strides_of(
    value: object, shape: tuple[int, ...], itemsize: int, api: str, name: str
) -> tuple[int, ...]:
    """Byte strides (None: C-contiguous) converted to element strides; each that addresses memory
    must be whole elements."""
    if value is None:
        return _layout.contiguous_strides(shape)
    if not isinstance(value, (tuple, list)):
        msg = f"{api}(): {name} 'strides' must be None or a tuple of ints; got {short_repr(value)} ({type(value).__name__})."
        raise TypeError(msg)
    strides = _ints(value, api, f"each {name} stride")
    if len(strides) != len(shape):
        msg = (
            f"{api}(): {name} has {len(strides)} strides for {len(shape)} dimensions; got strides "
            f"{list(strides)} and shape {list(shape)}."
        )
        raise ValueError(msg)
    _layout.check_sizes((), api, strides=strides)
    elements = _layout.element_strides(shape, strides, itemsize)
    if elements is None:
        # As NumPy's DLPack export: "DLPack only supports strides which are a multiple of itemsize."
        msg = (
            f"{api}(): {name} strides {list(strides)} (bytes) are not all multiples of the itemsize "
            f"({itemsize}); tensor strides count whole elements. Copy the data to a compact array first."
        )
        raise BufferError(msg)
    return elements


def _parse_layout(iface: object, api: str, name: str) -> tuple[dict[str, Any], _Layout]:
    """Validate the metadata both interfaces share: version, mask, typestr, descr, shape, strides."""
    if not isinstance(iface, dict):
        msg = f"{api}(): {name} must be a dict; got {type(iface).__name__}."
        raise TypeError(msg)
    for key in ("shape", "typestr", "version"):
        if key not in iface:
            msg = f"{api}(): {name} has no {key!r} key; got keys {short_repr(sorted(iface))}. The producer is malformed."
            raise ValueError(msg)
    if iface["version"] not in _VERSIONS[name] or isinstance(iface["version"], bool):
        msg = (
            f"{api}(): {name} version {short_repr(iface['version'])} is not supported; expected one of "
            f"{list(_VERSIONS[name])}."
        )
        raise BufferError(msg)
    if iface.get("mask") is not None:
        msg = (
            f"{api}(): {name} has a 'mask'; masked arrays are not supported. Fill the masked "
            f"elements and export the data without a mask."
        )
        raise BufferError(msg)
    dtype = _typestr_dtype(iface["typestr"], api, name)
    _check_descr(iface, dtype, api, name)
    shape = _shape_of(iface["shape"], api, name)
    strides = _strides_of(iface.get("strides"), shape, dtype.itemsize, api, name)
    return iface, _Layout(shape, strides, dtype)


def _data_pointer(data: object, api: str, name: str) -> tuple[int, bool]:
    """``data`` as the ``(address, read-only flag)`` pair."""
    if not (isinstance(data, tuple) and len(data) == 2):
        msg = (
            f"{api}(): {name} 'data' must be a (pointer, read_only) tuple; got {short_repr(data)} "
            f"({type(data).__name__})."
        )
        raise TypeError(msg)
    ptr = data[0] if type(data[0]) is int else as_int(data[0], api, f"the {name} data pointer")
    if ptr < 0:
        msg = f"{api}(): {name} data pointer must be non-negative; got {ptr}."
        raise ValueError(msg)
    return ptr, bool(data[1])


def import_array_interface(obj: object, iface: object, api: str, alias: bool = False) -> Tensor:
    """A tensor sharing the memory ``obj`` describes through ``__array_interface__`` (version 3).

    ``data`` is a ``(pointer, read_only)`` pair, a buffer object, or None/absent (``obj``'s own buffer).
    ``offset`` (bytes) applies to buffer data only, as in NumPy; buffer data also gives an extent, so the
    layout is bounds-checked against it. The storage keeps ``obj`` alive (and NumPy's ``__ref``, the
    temporary array a NumPy scalar's interface points into). With ``alias`` (``copy=False``) the
    memory must be ``obj``'s own, not a temporary made for the dictionary: `_refuse_temporary`.
    """
    name = "__array_interface__"
    iface, layout = _parse_layout(iface, api, name)
    data = iface.get("data")
    if isinstance(data, tuple):
        ptr, readonly = _data_pointer(data, api, name)
        if alias:
            _refuse_temporary(obj, iface, ptr, api)
        ref = iface.get("__ref")
        owner = obj if ref is None else (obj, ref)
        return wrap_memory(
            ptr,
            0,
            layout.shape,
            layout.strides,
            layout.dtype,
            device=CPU,
            readonly=readonly,
            owner=owner,
            api=api,
        )
    held, view = _hold_data_buffer(obj if data is None else data, api, name)
    offset = as_int(iface.get("offset", 0), api, f"{name} offset")
    if not 0 <= offset <= view.len:
        msg = f"{api}(): {name} offset {offset} lies outside the data buffer of {view.len} bytes."
        raise ValueError(msg)
    if alias and data is not None:  # obj's own buffer (no data) is obj's memory by definition
        _refuse_temporary(obj, iface, (view.buf or 0) + offset, api)
    return wrap_memory(
        (view.buf or 0) + offset,
        0,
        layout.shape,
        layout.strides,
        layout.dtype,
        device=CPU,
        readonly=bool(view.readonly),
        owner=(obj, held),
        api=api,
        nbytes=view.len - offset,
    )


def _refuse_temporary(obj: object, iface: dict[str, Any], address: int, api: str) -> None:
    """Raise `ValueError` when ``iface``, ``obj``'s ``__array_interface__``, describes a temporary
    (memory made for that dictionary alone) rather than memory ``obj`` keeps: ``copy=False`` would
    then share nothing with ``obj``.

    Detected: a ``'__ref'`` entry (NumPy's mark of the array it made for the dictionary, as every
    NumPy scalar's interface has), and an interface that describes other memory when read again
    while the first one's memory is still held (a property that makes a new array at each read and
    keeps it alive through the dictionary). Not detectable: memory that nothing keeps alive (a
    property handing out the address of an array that dies as it returns): freed memory cannot be
    told from live memory, and a second read may be given the same address again.
    """
    if "__ref" in iface:
        reason = (
            "it points into the temporary array NumPy made for that dictionary alone (its '__ref')"
        )
    else:
        again = getattr(obj, "__array_interface__", None)
        if again is iface:
            return
        other = _first_byte(obj, again)
        if other == address:
            return
        seen = "no memory" if other is None else f"{other:#x}"
        reason = (
            f"it describes other memory each time it is read ({address:#x}, then {seen}), so the "
            f"memory is a temporary made for each dictionary"
        )
    msg = (
        f"{api}(): can't alias the memory of {short_repr(obj)} with copy=False: "
        f"{reason}, not memory the object keeps. Pass copy=None or copy=True for a tensor holding "
        f"a copy."
    )
    raise ValueError(msg)


def _first_byte(obj: object, iface: object) -> int | None:
    """The address an ``__array_interface__`` dictionary's data starts at (its buffer held while
    it is read), or None when it names none."""
    if not isinstance(iface, dict):
        return None
    data = iface.get("data")
    if isinstance(data, tuple):
        return data[0] if data and type(data[0]) is int else None
    offset = iface.get("offset", 0)
    try:
        _held, view = hold_buffer(obj if data is None else data, _capi.PY_BUF_SIMPLE)
    except (TypeError, BufferError):
        return None
    return (view.buf or 0) + offset if type(offset) is int else None


def _hold_data_buffer(data: object, api: str, name: str) -> tuple[object, Any]:
    """Hold the contiguous buffer behind ``data`` open; writable or not, as the exporter says."""
    try:
        return hold_buffer(data, _capi.PY_BUF_SIMPLE)
    except (TypeError, BufferError) as exc:
        msg = (
            f"{api}(): {name} gives no (pointer, read_only) 'data', so the data must come from a "
            f"contiguous buffer, but {type(data).__name__} does not export one: {exc}."
        )
        raise TypeError(msg) from exc


def import_cuda_array_interface(obj: object, iface: object, api: str) -> Tensor:
    """A tensor on ``cuda:N`` sharing the device memory ``obj`` describes (CUDA Array Interface v3).

    The device number comes from the pointer (``cuPointerGetAttribute``) when a CUDA driver is present;
    without one it is assumed to be 0 (nothing in the process can then touch the memory anyway). A
    ``stream`` other than None is synchronised on the host before the tensor is returned, or refused
    when no driver is available. The memory is never read on the host.
    """
    name = "__cuda_array_interface__"
    iface, layout = _parse_layout(iface, api, name)
    if "data" not in iface:
        msg = f"{api}(): {name} has no 'data' key; got keys {short_repr(sorted(iface))}. The producer is malformed."
        raise ValueError(msg)
    ptr, readonly = _data_pointer(iface["data"], api, name)
    stream = _cai_stream(iface.get("stream"), api)
    driver = _cuda.driver()
    if driver is None:
        if stream is not None:
            msg = (
                f"{api}(): {name} asks the consumer to synchronise with stream {stream:#x}, but no CUDA "
                f"driver (libcuda) could be loaded to do so. Synchronise the stream in the producer and "
                f"export stream=None, or import through __dlpack__."
            )
            raise BufferError(msg)
        index = 0
    else:
        index = driver.pointer_device(ptr, api) if ptr else 0
        if stream is not None:
            driver.synchronize(stream, index, api)
    return wrap_memory(
        ptr,
        0,
        layout.shape,
        layout.strides,
        layout.dtype,
        device=Device("cuda", index),
        readonly=readonly,
        owner=obj,
        api=api,
    )


def _cai_stream(stream: object, api: str) -> int | None:
    """Validate the v3 ``stream`` entry: None, 1 (legacy default), 2 (per-thread default) or a handle."""
    if stream is None:
        return None
    value = as_int(stream, api, "__cuda_array_interface__ stream")
    if value <= 0:
        # CUDA Array Interface v3: "0 is disallowed due to its ambiguity between None and 1".
        msg = (
            f"{api}(): __cuda_array_interface__ stream must be None, 1 (legacy default stream), 2 "
            f"(per-thread default stream) or a cudaStream_t handle; got {value}."
        )
        raise ValueError(msg)
    return value


# ---------------------------------------------------------------------------------------------- Arrow
_BITS_TO_BYTES: Final = bytes.maketrans(b"01", b"\x00\x01")


class _ArrowOwner:
    """An Arrow struct this process owns; its ``release`` callback runs exactly once, when this dies.

    The struct is moved here from the producer's memory (a bitwise copy, then the producer's ``release``
    set to NULL, as the Arrow spec prescribes), so the producer's capsule destructor no longer frees it.
    """

    __slots__ = ("struct",)

    def __init__(self, struct: ArrowSchema | ArrowArray | ArrowArrayStream) -> None:
        # Typed loosely: the three structs share only ``release``, which is all this class touches.
        self.struct: Any = struct

    @classmethod
    def move_from(
        cls, address: int, struct_type: type[ArrowArray | ArrowArrayStream]
    ) -> _ArrowOwner:
        owned = struct_type()
        ctypes.memmove(ctypes.addressof(owned), address, ctypes.sizeof(struct_type))
        struct_type.from_address(address).release = None
        return cls(owned)

    def release(
        self,
        _finalizing: Any = sys.is_finalizing,
        _prototype: Any = _ArrowRelease,
        _address: Any = ctypes.addressof,
    ) -> None:
        # What it calls is bound as defaults: it runs from __del__, possibly while module globals
        # are being cleared.
        struct = self.struct
        if struct.release and not _finalizing():
            _prototype(struct.release)(_address(struct))
        struct.release = None  # a conforming release does this itself; never call it twice

    def __del__(self) -> None:
        self.release()


class _ArrowType(NamedTuple):
    """What tensorbridge reads from an Arrow schema: the element dtype (None: bit-packed bool),
    the logical shape of each row and its strides in elements (``()`` for a primitive array, one
    value per row), the values per row (0: a primitive array, else a fixed-size list's size) and
    the extension type's name, if any."""

    dtype: DType | None
    row_shape: tuple[int, ...]
    row_strides: tuple[int, ...]
    row_size: int
    extension: bytes | None


def _arrow_refusal(fmt: bytes, dictionary: bool, extension: bytes | None, api: str) -> BufferError:
    """The refusal of an Arrow type that has no tensor form, with the fix for its kind."""
    if dictionary:
        kind, fix = "dictionary-encoded", "decode it first (pyarrow: arr.dictionary_decode())"
    elif fmt.startswith(b"+"):
        kind = f"nested format {fmt.decode(errors='replace')!r}"
        fix = (
            "import one primitive field or column at a time (pyarrow: arr.field(0), "
            "table.column('x')), or pass the object's __array__ (numpy.asarray(obj))"
        )
    else:
        kind = f"format {fmt.decode(errors='replace')!r}"
        fix = "cast the array first (pyarrow: arr.cast(pa.int64()))"
    if extension is not None:
        kind = f"extension type {extension.decode(errors='replace')!r} (storage {kind})"
        if not dictionary and not fmt.startswith(b"+"):
            fix = "cast its storage first (pyarrow: arr.storage.cast(pa.int64()))"
    msg = (
        f"{api}(): Arrow {kind} is not a fixed-width primitive type and has no tensor form; "
        f"tensorbridge imports int8..int64, "
        f"uint8..uint64, float16/32/64 and bool arrays, fixed-size lists of them and "
        f"arrow.fixed_shape_tensor. To import it, {fix}."
    )
    return BufferError(msg)


def _primitive_dtype(schema: ArrowSchema) -> tuple[bool, DType | None]:
    """Whether ``schema`` is a primitive type tensorbridge reads, and its dtype (None: bool)."""
    fmt = schema.format or b""
    if schema.n_children or schema.dictionary:
        return False, None
    if fmt == _ARROW_BOOL:
        return True, None
    dtype = BY_ARROW_FORMAT.get(fmt)
    return dtype is not None, dtype


def _list_size(fmt: bytes) -> int | None:
    """The size of a fixed-size list format (``+w:N``), else None."""
    if not fmt.startswith(b"+w:"):
        return None
    digits = fmt[3:]
    return int(digits) if digits.isdigit() and int(digits) > 0 else None


def _tensor_metadata(
    raw: bytes | None, size: int, api: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The logical shape and element strides of one ``arrow.fixed_shape_tensor`` row, from the
    extension metadata: ``shape`` (physical, row-major), optional ``dim_names`` (not kept) and
    ``permutation`` (logical dimension ``i`` is physical dimension ``permutation[i]``)."""
    name = "arrow.fixed_shape_tensor"
    try:
        meta = json.loads(raw or b"")
    except ValueError:
        meta = None
    shape = meta.get("shape") if isinstance(meta, dict) else None
    if not (
        isinstance(shape, list)
        and all(type(n) is int and n >= 0 for n in shape)
        and len(shape) < _layout.MAX_NDIM
        and math.prod(shape) == size
    ):
        msg = (
            f"{api}(): the {name} metadata {short_repr(raw)} gives no shape of {size} values per "
            f"row (a JSON object with 'shape': a list of sizes whose product is the list size). "
            f"The producer is malformed."
        )
        raise ValueError(msg)
    strides = _layout.contiguous_strides(tuple(shape))
    permutation = meta.get("permutation")
    if permutation is None:
        return tuple(shape), strides
    if not (
        isinstance(permutation, list)
        and all(type(p) is int for p in permutation)
        and sorted(permutation) == list(range(len(shape)))
    ):
        msg = (
            f"{api}(): the {name} permutation {short_repr(permutation)} is not a permutation of "
            f"the {len(shape)} dimensions of shape {shape}. The producer is malformed."
        )
        raise ValueError(msg)
    return tuple(shape[p] for p in permutation), tuple(strides[p] for p in permutation)


def _arrow_type(schema: ArrowSchema, api: str) -> _ArrowType:
    """The tensor form of an Arrow type: a primitive array (one value per row), a fixed-size list
    of primitives (a row of ``N`` values) or ``arrow.fixed_shape_tensor`` (a row of its shape,
    permuted as its metadata says). Any other extension type is read as its storage type; a type
    with no tensor form is a `BufferError` naming it (and the extension)."""
    fmt = schema.format or b""
    meta = _read_metadata(schema.metadata)
    extension = meta.get(_KEY_NAME)
    ok, dtype = _primitive_dtype(schema)
    if ok:
        return _ArrowType(dtype, (), (), 0, extension)
    size = _list_size(fmt)
    if size is not None and schema.n_children == 1 and schema.children and not schema.dictionary:
        ok, dtype = _primitive_dtype(schema.children[0][0])
        if ok:
            if extension == _FIXED_SHAPE_TENSOR:
                shape, strides = _tensor_metadata(meta.get(_KEY_METADATA), size, api)
                return _ArrowType(dtype, shape, strides, size, extension)
            return _ArrowType(dtype, (size,), (1,), size, extension)
        child = schema.children[0][0]
        fmt = child.format or b""
        raise _arrow_refusal(fmt, bool(child.dictionary), extension, api)
    raise _arrow_refusal(fmt, bool(schema.dictionary), extension, api)


def _check_nulls(array: ArrowArray, api: str) -> None:
    has_validity = bool(array.buffers[0]) if array.n_buffers else False
    if array.null_count > 0 or (array.null_count < 0 and has_validity):
        count = "an unknown number of" if array.null_count < 0 else str(array.null_count)
        msg = (
            f"{api}(): the Arrow array has {count} nulls; tensors have no validity bitmap. "
            f"Fill them first (pyarrow.compute.fill_null) or drop them (arr.drop_null())."
        )
        raise ValuesRefused(msg)


def _check_arrow_array(array: ArrowArray, kind: _ArrowType, api: str) -> ArrowArray:
    """Check ``array`` against its type; the array that holds the values (the list's child)."""
    lists = kind.row_size > 0
    if (
        array.n_buffers != (1 if lists else 2)
        or array.n_children != (1 if lists else 0)
        or array.length < 0
        or array.offset < 0
        or (lists and not (array.children and array.children[0]))
    ):
        layout = "a fixed-size list" if lists else "a primitive type"
        msg = (
            f"{api}(): malformed Arrow array for {layout}: {array.n_buffers} buffers, "
            f"{array.n_children} children, length {array.length}, offset {array.offset}."
        )
        raise ValueError(msg)
    _check_nulls(array, api)
    if not lists:
        return array
    values = array.children[0][0]
    needed = (array.offset + array.length) * kind.row_size
    if values.n_buffers != 2 or values.n_children or values.offset < 0 or values.length < needed:
        msg = (
            f"{api}(): malformed Arrow fixed-size list: its values array has {values.n_buffers} "
            f"buffers, {values.n_children} children, offset {values.offset} and length "
            f"{values.length}, fewer than the {needed} values its {array.length} lists of "
            f"{kind.row_size} (offset {array.offset}) reach."
        )
        raise ValueError(msg)
    _check_nulls(values, api)
    return values


def _unpack_bits(ptr: int, offset: int, length: int) -> bytes:
    """Bits ``[offset, offset + length)`` of an LSB-first bitmap, one byte (0 or 1) per bit."""
    if length == 0:
        return b""
    first = offset // 8
    raw = ctypes.string_at(ptr + first, (offset + length + 7) // 8 - first)
    bits = int.from_bytes(raw, "little") >> (offset % 8)
    # format() writes the most significant bit first: reverse into bitmap order, pad the high zeros.
    return (
        format(bits, "b")[::-1]
        .ljust(length, "0")[:length]
        .encode("ascii")
        .translate(_BITS_TO_BYTES)
    )


def _arrow_tensor(
    array: ArrowArray, owner: _ArrowOwner | None, kind: _ArrowType, copy: bool | None, api: str
) -> tuple[Tensor, bool]:
    """The tensor for a validated array: a read-only view (owner given) or a bool copy. A list
    array's rows are its values array's, from element ``values.offset + array.offset * N``."""
    values = array.children[0][0] if kind.row_size else array
    size = kind.row_size or 1
    first = values.offset + array.offset * size if kind.row_size else array.offset
    shape = (array.length, *kind.row_shape)
    strides = (size, *kind.row_strides)
    data = values.buffers[1] or 0
    if kind.dtype is None:
        if copy is False:
            msg = (
                f"{api}(): an Arrow boolean array is bit-packed and tensors hold one byte per bool, so it "
                f"cannot be shared without a copy; got copy=False. Pass copy=None or copy=True."
            )
            raise ValueError(msg)
        count = array.length * size
        bits = _unpack_bits(data, first, count) if data else bytes(count)
        packed = _from_bytes(bits, (count,), _dtype.bool)
        if not kind.row_strides:
            return packed, True
        view = packed.as_strided(shape, strides)
        return (view if _layout.is_contiguous(shape, strides) else view.contiguous()), True
    nbytes = (first + array.length * size) * kind.dtype.itemsize
    # Arrow data is immutable (the C data interface shares it freely), so the view is read-only.
    view = wrap_memory(
        data,
        first,
        shape,
        strides,
        kind.dtype,
        device=CPU,
        readonly=True,
        owner=owner,
        api=api,
        nbytes=nbytes,
    )
    return view, False


def _capsule_pointer(capsule: object, name: bytes, api: str) -> int:
    if not isinstance(capsule, _capi.CapsuleType) or not _native.capsule_is_valid(capsule, name):
        msg = f"{api}(): expected a PyCapsule named {name.decode()!r} from the Arrow producer; got {short_repr(capsule)}."
        raise TypeError(msg)
    return int(_native.capsule_pointer(capsule, name))


def import_arrow_array(method: Any, copy: bool | None, api: str) -> tuple[Tensor, bool]:
    """Import ``obj.__arrow_c_array__`` (passed as the bound ``method``): a 1-D tensor.

    Fixed-width primitive arrays without nulls are shared read-only (Arrow memory is immutable), with
    the array's ``offset`` honoured; the moved ``ArrowArray`` is released when the last view dies.
    Bit-packed booleans are unpacked into a new ``bool`` tensor (refused with ``copy=False``).
    Returns the tensor and whether it is a copy.
    """
    result = method()
    if not (isinstance(result, tuple) and len(result) == 2):
        msg = f"{api}(): __arrow_c_array__() must return (schema capsule, array capsule); got {short_repr(result)}."
        raise TypeError(msg)
    schema_capsule, array_capsule = result
    schema = ArrowSchema.from_address(_capsule_pointer(schema_capsule, _ARROW_SCHEMA, api))
    address = _capsule_pointer(array_capsule, _ARROW_ARRAY, api)
    array = ArrowArray.from_address(address)
    if not array.release:
        msg = f"{api}(): the Arrow array capsule holds a released array; it was already consumed."
        raise RuntimeError(msg)
    kind = _arrow_type(schema, api)
    _check_arrow_array(array, kind, api)
    if kind.dtype is None:  # a copy: read while the producer's capsule still owns the array
        return _arrow_tensor(array, None, kind, copy, api)
    owner = _ArrowOwner.move_from(address, ArrowArray)
    return _arrow_tensor(owner.struct, owner, kind, copy, api)


def _stream_call(stream: _ArrowOwner, fn: int, out: ctypes.Structure, what: str, api: str) -> None:
    rc = _ArrowGet(fn)(ctypes.addressof(stream.struct), ctypes.addressof(out))
    if rc != 0:
        last = stream.struct.get_last_error
        text = _ArrowLastError(last)(ctypes.addressof(stream.struct)) if last else None
        detail = text.decode(errors="replace") if text else f"error code {rc}"
        msg = f"{api}(): the Arrow stream's {what} failed: {detail}."
        raise BufferError(msg)


def import_arrow_stream(method: Any, copy: bool | None, api: str) -> tuple[Tensor, bool]:
    """Import ``obj.__arrow_c_stream__`` (a ChunkedArray, a polars Series, ...): a 1-D tensor.

    One chunk is shared exactly as `import_arrow_array` shares an array; several chunks (or none) are
    concatenated into a new tensor, which ``copy=False`` refuses. Every struct read from the stream is
    released exactly once, also when the import fails.
    """
    capsule = method()  # alive until the move: its destructor releases a stream not yet moved
    stream = _ArrowOwner.move_from(
        _capsule_pointer(capsule, _ARROW_ARRAY_STREAM, api), ArrowArrayStream
    )
    struct: ArrowArrayStream = stream.struct
    schema = _ArrowOwner(ArrowSchema())
    _stream_call(stream, struct.get_schema, schema.struct, "get_schema", api)
    kind = _arrow_type(schema.struct, api)
    chunks: list[_ArrowOwner] = []
    while True:
        chunk = _ArrowOwner(ArrowArray())
        _stream_call(stream, struct.get_next, chunk.struct, "get_next", api)
        if not chunk.struct.release:  # end of stream
            break
        _check_arrow_array(chunk.struct, kind, api)
        chunks.append(chunk)
    stream.release()  # chunks outlive their stream (C stream interface, "Result lifetimes")
    if len(chunks) == 1:
        return _arrow_tensor(chunks[0].struct, chunks[0], kind, copy, api)
    if copy is False and chunks:
        msg = (
            f"{api}(): the Arrow stream holds {len(chunks)} chunks, which one tensor cannot share "
            f"without a copy; got copy=False. Pass copy=None, or combine the chunks first "
            f"(pyarrow: chunked.combine_chunks())."
        )
        raise ValueError(msg)
    parts = [_arrow_tensor(c.struct, c, kind, None, api)[0] for c in chunks]
    joined = b"".join(p._bytes(api) for p in parts)
    result_dtype = kind.dtype or _dtype.bool
    rows = sum(c.struct.length for c in chunks)
    return _from_bytes(joined, (rows, *kind.row_shape), result_dtype), True
