"""Creation functions: `tensor`, `arange`, `zeros`/`ones`/`empty`/`full` and their ``*_like`` forms.

Every function here allocates new tensorbridge memory (zeroed, 64-byte aligned) and fills it through the
dtype's codec. Zero-copy constructors live with their protocol: `from_dlpack` (`_dlpack`), `frombuffer`
and `from_file` (`_buffer`, `_file`), `asarray` and `from_pointer` (`_convert`).
"""

from __future__ import annotations

import builtins
import math
import numbers
import operator
from collections.abc import Sequence
from typing import Any, Final

from . import _codec, _dtype, _layout
from ._args import GRAD_MSG_CREATE
from ._device import CPU, Device, as_device
from ._dtype import DType, as_dtype
from ._errors import short_repr
from ._storage import allocate
from ._tensor import Tensor, _from_bytes

__all__ = [
    "arange",
    "empty",
    "empty_like",
    "from_data",
    "full",
    "full_like",
    "is_numpy_scalar",
    "ones",
    "ones_like",
    "zeros",
    "zeros_like",
]

# PyTorch's defaults: torch.get_default_dtype() is float32; complex follows it.
_DEFAULT_FOR_KIND = {
    "b": _dtype.bool,
    "i": _dtype.int64,
    "f": _dtype.float32,
    "c": _dtype.complex64,
}


def _scalar_kind(value: Any, api: str) -> str:
    if isinstance(value, builtins.bool):
        return "b"
    if isinstance(value, numbers.Integral):
        return "i"
    if isinstance(value, numbers.Real):
        return "f"
    if isinstance(value, numbers.Complex):
        return "c"
    if hasattr(value, "__index__"):
        return "i"
    if hasattr(value, "__float__"):
        return "f"
    if hasattr(value, "__complex__"):
        return "c"
    msg = (
        f"{api}(): Could not infer dtype of {type(value).__name__}; got {short_repr(value)}. "
        f"Elements must be bool, int, float or complex."
    )
    raise TypeError(msg)


def _foreign_dtype(value: Any) -> DType | None:
    """The dtype of a NumPy scalar or array (its ``dtype.str``), or None (also for a `DType`, which
    shows NumPy before 2.4 a ``dtype`` of its own but is no data)."""
    if isinstance(value, DType):
        return None
    typestr = getattr(getattr(value, "dtype", None), "str", None)
    return _dtype.BY_TYPESTR.get(typestr[1:]) if isinstance(typestr, str) else None


# Python scalar types and the dtype kind PyTorch infers for each.
_PYTHON_SCALARS: Final = {builtins.bool: "b", int: "i", builtins.float: "f", complex: "c"}


def _flatten(
    data: Any, api: str, depth: int = 0
) -> tuple[list[Any], tuple[int, ...], DType | None]:
    """Flatten nested sequences (and tensors inside them) row-major, inferring PyTorch's dtype.

    Returns the values, the shape and the promoted dtype of the leaves (None when there are none):
    Python bools, ints, floats and complex count as bool, int64, float32 and complex64; tensors,
    NumPy scalars and arrays as their own dtype (``tensor([t1, t2])`` keeps the tensors' dtype).
    ``depth`` is the nesting level of ``data``, for the error message.
    """
    if isinstance(data, Tensor):
        return data._values(api), tuple(data.shape), data.dtype
    if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
        if hasattr(data, "tolist") and not isinstance(data, numbers.Number):
            if is_numpy_scalar(data):  # a number: `_check_values` converts it for the dtype
                return [data], (), _foreign_dtype(data) or _DEFAULT_FOR_KIND["b"]
            values, shape, inferred = _flatten(data.tolist(), api, depth)
            return values, shape, _foreign_dtype(data) or inferred
        return [data], (), _foreign_dtype(data) or _DEFAULT_FOR_KIND[_scalar_kind(data, api)]
    if len(data) == 0:
        return [], (0,), None
    leaf_types = set(map(type, data))
    if (
        leaf_types <= _PYTHON_SCALARS.keys()
    ):  # a flat run of Python numbers: no recursion per element
        kind = max((_PYTHON_SCALARS[t] for t in leaf_types), key="bifc".index)
        return list(data), (len(data),), _DEFAULT_FOR_KIND[kind]
    parts = [_flatten(item, api, depth + 1) for item in data]
    first_shape = parts[0][1]
    for i, part in enumerate(parts):
        if part[1] != first_shape:
            msg = (
                f"{api}(): expected sequence of length {first_shape[0] if first_shape else 0} at dim "
                f"{depth + 1} (got {part[1][0] if part[1] else 0}); element {i} at dim {depth} has shape "
                f"{list(part[1])}, element 0 has shape {list(first_shape)}. Nested sequences must be "
                f"rectangular."
            )
            raise ValueError(msg)
    values = [v for part in parts for v in part[0]]
    dtypes = [p[2] for p in parts if p[2] is not None]
    inferred = dtypes[0] if dtypes else None
    for d in dtypes[1:]:
        inferred = _dtype.promote_types(inferred, d, api)  # type: ignore[arg-type]
    return values, (len(data), *first_shape), inferred


_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def _check_values(values: list[Any], dtype: DType, api: str) -> list[Any]:
    """Each number converted for ``dtype`` as PyTorch 2.13's ``tensor()`` converts it, or its error.

    Integer and bool targets read a float (``float`` and its subclasses, such as NumPy's float64)
    as a float and anything else through ``__index__`` (TypeError "'X' object cannot be
    interpreted as an integer" otherwise: NumPy's float32, np.bool_ for ints, complex); an int
    outside int64 is a ValueError ("Overflow when unpacking long long"), a value outside the
    target a RuntimeError ("value cannot be converted to type int32 without overflow"). Ints may
    wrap into unsigned types down to ``-max`` (-1 is 255 as uint8), floats may not, and NaN fits
    no integer type. Float targets read ``__float__`` (then ``__index__``); complex targets
    ``complex()``. Floats past a float dtype's range become inf, as in PyTorch.

    Two PyTorch refusals are not copied: for uint64 it accepts only Python ints ("an integer is
    required" for every float and NumPy scalar); here they convert as for uint32. And a float of
    2**63 into int64, which PyTorch stores as -2**63, is a RuntimeError here.
    """
    kind = dtype.kind
    if dtype is _dtype.float4_e2m1fn_x2:
        return values  # packed pairs: the codec takes the byte values as ints
    if kind == "b":
        return [
            builtins.bool(v if isinstance(v, (float, complex)) or _is_bool(v) else _index(v))
            for v in values
        ]
    if kind in "fc":
        return [_real(v, api) if kind == "f" else _complex(v, api) for v in values]
    high = 2**dtype.bits - 1 if kind == "u" else 2 ** (dtype.bits - 1) - 1
    low = 0 if kind == "u" else -high - 1
    out = []
    for v in values:
        if isinstance(v, float):
            if not low <= v <= high:  # False for NaN
                _overflow(dtype, v, api)
            out.append(v)
            continue
        i = _index(v)
        if dtype is _dtype.uint64:
            if i < 0:
                msg = f"{api}(): can't convert negative int to unsigned; got {v!r} for {dtype}."
                raise OverflowError(msg)
            if i > high:
                msg = f"{api}(): int too big to convert; got {v!r} for {dtype}."
                raise OverflowError(msg)
        elif not _INT64_MIN <= i <= _INT64_MAX:
            msg = (
                f"{api}(): Overflow when unpacking long long; got {v!r}, outside the int64 range. "
                f"Pass an int in [-2**63, 2**63)."
            )
            raise ValueError(msg)
        elif not (-high if kind == "u" else low) <= i <= high:
            _overflow(dtype, v, api)
        out.append(i)
    return out


def _is_bool(value: Any) -> bool:
    return isinstance(value, builtins.bool) or (
        is_numpy_scalar(value) and type(value).__name__ == "bool"
    )


def is_numpy_scalar(value: Any) -> bool:
    """A NumPy scalar (np.bool_, np.float32, ...): a number to convert, not an array to copy."""
    return type(value).__module__ == "numpy" and not hasattr(value, "__len__")


def _index(value: Any) -> int:
    """``operator.index``, with its TypeError text ("'X' object cannot be interpreted ...")."""
    return operator.index(value)


def _real(value: Any, api: str) -> float:
    if type(value) is float:
        return value
    if hasattr(type(value), "__float__"):
        return builtins.float(value)  # OverflowError for ints past double, as PyTorch
    if hasattr(type(value), "__index__"):
        return builtins.float(operator.index(value))
    msg = (
        f"{api}(): must be real number, not {type(value).__name__}; got {value!r}. Pass a complex "
        f"dtype or the real parts."
    )
    raise TypeError(msg)


def _complex(value: Any, api: str) -> complex:
    try:
        return complex(value)
    except TypeError:
        msg = f"{api}(): must be a number, not {type(value).__name__}; got {value!r}."
        raise TypeError(msg) from None


def _overflow(dtype: DType, value: Any, api: str) -> None:
    msg = (
        f"{api}(): value cannot be converted to type {dtype.name} without overflow; got {value!r}. "
        f"Pass a value {dtype} can hold, or a wider dtype."
    )
    raise RuntimeError(msg)


def _result_device(device: Any, api: str) -> Device:
    dev = CPU if device is None else as_device(device, api)
    if not dev.is_host_accessible:
        msg = (
            f"{api}(): tensorbridge creates tensors in host memory only; got device={device!r}. "
            f"Create the tensor on the host and export it with __dlpack__(dl_device=...) to a library "
            f"for {dev.type}."
        )
        raise BufferError(msg)
    return dev


def _grad(t: Tensor, requires_grad: bool, api: str) -> Tensor:
    return t._set_requires_grad(True, api, GRAD_MSG_CREATE) if requires_grad else t


def from_data(data: Any, dtype: Any, device: Any, requires_grad: bool, api: str) -> Tensor:
    """A new tensor holding the values of nested sequences, scalars and tensors (a copy).

    The core of `tensor` and of `asarray`'s copy of sequences; errors name ``api``. Objects that
    hold memory (``__dlpack__``, buffers, array interfaces) are `asarray`'s to import first.
    """
    if dtype is not None:
        dtype = as_dtype(dtype, api)
    dev = _result_device(device, api)
    values, shape, inferred = _flatten(data, api)
    target = dtype or inferred or _dtype.float32
    if len(shape) > _layout.MAX_NDIM:
        msg = f"{api}(): at most {_layout.MAX_NDIM} dimensions are supported; got {len(shape)}."
        raise ValueError(msg)
    values = _check_values(values, target, api)
    return _grad(_from_bytes(_codec.pack(target, values), shape, target, dev), requires_grad, api)


def _storage_for(shape: tuple[int, ...], dtype: DType, device: Device, api: str) -> Any:
    """New zeroed storage for ``shape`` elements of ``dtype``; a clear MemoryError naming the size.

    Allocating before building anything else means an impossible request fails at once, with its
    size in the message, instead of deep inside a bytes repetition or a list of values.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    try:
        return allocate(nbytes, device)
    except MemoryError:
        msg = (
            f"{api}(): cannot allocate {nbytes} bytes for a tensor of shape {list(shape)} and dtype "
            f"{dtype}; the system is out of memory. Request a smaller tensor."
        )
        raise MemoryError(msg) from None


def _filled(
    shape: tuple[int, ...], value: Any, dtype: DType, device: Device, requires_grad: bool, api: str
) -> Tensor:
    """A new tensor holding ``value`` everywhere (one packed element, copied with stride 0)."""
    _codec.check_scalar(dtype, value, api, numel=math.prod(shape))
    element = _codec.pack(dtype, [value])
    storage = _storage_for(shape, dtype, device, api)
    t = Tensor._new(storage, 0, shape, _layout.contiguous_strides(shape), dtype, api)
    if t.numel() and any(element):
        t._fill_element(element, api)
    return _grad(t, requires_grad, api)


def _zeroed(
    shape: tuple[int, ...], dtype: DType, device: Device, requires_grad: bool, api: str
) -> Tensor:
    """A new tensor of all-zero bytes: zero in every dtype (PyTorch's ``zeros`` is a memset too).

    New storage is zero-filled already, so nothing is packed or copied.
    """
    storage = _storage_for(shape, dtype, device, api)
    t = Tensor._new(storage, 0, shape, _layout.contiguous_strides(shape), dtype, api)
    return _grad(t, requires_grad, api)


def _creation_args(
    size: Sequence[Any], dtype: Any, device: Any, api: str
) -> tuple[tuple[int, ...], DType, Device]:
    if not size:
        msg = f'{api}() missing 1 required positional arguments: "size"'
        raise TypeError(msg)
    shape = _layout.as_shape(size, api, negative=RuntimeError)
    return (
        shape,
        as_dtype(dtype, api) if dtype is not None else _dtype.float32,
        _result_device(device, api),
    )


def zeros(
    *size: Any, dtype: DType | None = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """A new tensor of zeros (float32 unless ``dtype`` says otherwise).

    Args:
        *size: the shape, as ``f(2, 3)`` or ``f((2, 3))``.
        dtype: the element type (a tensorbridge dtype, its name, or another library's dtype);
            float32 when None.
        device: where the tensor lives: None or ``"cpu"`` (tensorbridge allocates host memory
            only).
        requires_grad: mark the result as requiring grad (PyTorch's flag: exports refuse it).
    """
    shape, dt, dev = _creation_args(size, dtype, device, "zeros")
    return _zeroed(shape, dt, dev, requires_grad, "zeros")


def ones(
    *size: Any, dtype: DType | None = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """A new tensor of ones (float32 unless ``dtype`` says otherwise).

    Args:
        *size: the shape, as ``f(2, 3)`` or ``f((2, 3))``.
        dtype: the element type (a tensorbridge dtype, its name, or another library's dtype);
            float32 when None.
        device: where the tensor lives: None or ``"cpu"`` (tensorbridge allocates host memory
            only).
        requires_grad: mark the result as requiring grad (PyTorch's flag: exports refuse it).
    """
    shape, dt, dev = _creation_args(size, dtype, device, "ones")
    return _filled(shape, 1, dt, dev, requires_grad, "ones")


def empty(
    *size: Any, dtype: DType | None = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """A new tensor; tensorbridge memory is always zero-initialised, so this equals `zeros`.

    Args:
        *size: the shape, as ``f(2, 3)`` or ``f((2, 3))``.
        dtype: the element type (a tensorbridge dtype, its name, or another library's dtype);
            float32 when None.
        device: where the tensor lives: None or ``"cpu"`` (tensorbridge allocates host memory
            only).
        requires_grad: mark the result as requiring grad (PyTorch's flag: exports refuse it).
    """
    shape, dt, dev = _creation_args(size, dtype, device, "empty")
    return _zeroed(shape, dt, dev, requires_grad, "empty")


def full(
    size: Any,
    fill_value: Any,
    *,
    dtype: DType | None = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    """A new tensor filled with ``fill_value``; dtype inferred from it as PyTorch does.

    Args:
        size: the shape, a sequence of sizes.
        fill_value: the value of every element.
        dtype: the element type (a tensorbridge dtype, its name, or another library's dtype);
            when None, inferred from ``fill_value`` as PyTorch does (bool, int64,
            float32, complex64).
        device: where the tensor lives: None or ``"cpu"`` (tensorbridge allocates host memory
            only).
        requires_grad: mark the result as requiring grad (PyTorch's flag: exports refuse it).
    """
    shape = _layout.as_shape((size,), "full", negative=RuntimeError)
    if dtype is None:
        dt = _DEFAULT_FOR_KIND[_scalar_kind(fill_value, "full")]
    else:
        dt = as_dtype(dtype, "full")
    return _filled(shape, fill_value, dt, _result_device(device, "full"), requires_grad, "full")


def _like(t: Tensor, dtype: Any, device: Any, api: str) -> tuple[tuple[int, ...], DType, Device]:
    if not isinstance(t, Tensor):
        msg = f"{api}(): expected a tensorbridge Tensor; got {type(t).__name__}."  # type: ignore[unreachable]  # checked at run time too
        raise TypeError(msg)
    dt = t.dtype if dtype is None else as_dtype(dtype, api)
    dev = _result_device(
        t.device if device is None and t.device.is_host_accessible else device, api
    )
    return tuple(t.shape), dt, dev


def zeros_like(
    t: Tensor, *, dtype: DType | None = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """Zeros with ``t``'s shape (and dtype unless given).

    Args:
        t: the tensor whose shape (and, unless ``dtype`` is given, dtype) the result takes.
        dtype: the element type; None keeps ``t``'s.
        device: where the tensor lives; None keeps ``t``'s device when it is host memory, else
            ``"cpu"`` (tensorbridge allocates host memory only).
        requires_grad: mark the result as requiring grad (PyTorch's flag: exports refuse it).
    """
    shape, dt, dev = _like(t, dtype, device, "zeros_like")
    return _zeroed(shape, dt, dev, requires_grad, "zeros_like")


def ones_like(
    t: Tensor, *, dtype: DType | None = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """Ones with ``t``'s shape (and dtype unless given).

    Args:
        t: the tensor whose shape (and, unless ``dtype`` is given, dtype) the result takes.
        dtype: the element type; None keeps ``t``'s.
        device: where the tensor lives; None keeps ``t``'s device when it is host memory, else
            ``"cpu"`` (tensorbridge allocates host memory only).
        requires_grad: mark the result as requiring grad (PyTorch's flag: exports refuse it).
    """
    shape, dt, dev = _like(t, dtype, device, "ones_like")
    return _filled(shape, 1, dt, dev, requires_grad, "ones_like")


def empty_like(
    t: Tensor, *, dtype: DType | None = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """A zeroed tensor with ``t``'s shape (and dtype unless given).

    Args:
        t: the tensor whose shape (and, unless ``dtype`` is given, dtype) the result takes.
        dtype: the element type; None keeps ``t``'s.
        device: where the tensor lives; None keeps ``t``'s device when it is host memory, else
            ``"cpu"`` (tensorbridge allocates host memory only).
        requires_grad: mark the result as requiring grad (PyTorch's flag: exports refuse it).
    """
    shape, dt, dev = _like(t, dtype, device, "empty_like")
    return _zeroed(shape, dt, dev, requires_grad, "empty_like")


def full_like(
    t: Tensor,
    fill_value: Any,
    *,
    dtype: DType | None = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    """``fill_value`` everywhere, with ``t``'s shape (and dtype unless given).

    Args:
        t: the tensor whose shape (and, unless ``dtype`` is given, dtype) the result takes.
        fill_value: the value of every element.
        dtype: the element type; None keeps ``t``'s.
        device: where the tensor lives; None keeps ``t``'s device when it is host memory, else
            ``"cpu"`` (tensorbridge allocates host memory only).
        requires_grad: mark the result as requiring grad (PyTorch's flag: exports refuse it).
    """
    shape, dt, dev = _like(t, dtype, device, "full_like")
    return _filled(shape, fill_value, dt, dev, requires_grad, "full_like")


def arange(
    start: Any,
    end: Any = None,
    step: Any = 1,
    *,
    dtype: DType | None = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    """Values from ``start`` (inclusive) to ``end`` (exclusive) by ``step``.

    Length and values follow PyTorch: ``ceil((end - start) / step)`` elements computed in double
    precision, each ``start + i * step`` computed in double for floating dtypes and in integers for
    integer dtypes (float arguments truncated, as PyTorch does), then cast to ``dtype``.

    Args:
        start: the first value; with ``end`` None, the end (and the start is 0).
        end: the end, excluded.
        step: the distance between values, nonzero.
        dtype: the element type; None infers it as PyTorch does (int64 for integer arguments,
            float32 when any is a float).
        device: where the tensor lives: None or ``"cpu"`` (tensorbridge allocates host memory
            only).
        requires_grad: mark the result as requiring grad (PyTorch's flag: exports refuse it).

    Example:
        >>> arange(4)
        tensor([0, 1, 2, 3])
    """
    if end is None:
        start, end = 0, start
    start, end, step = (
        _arange_scalar(v, name) for name, v in (("start", start), ("end", end), ("step", step))
    )
    # PyTorch validates in double precision, in this order (RangeUtils.h arange_check_bounds), and
    # raises RuntimeError.
    dstart, dend, dstep = builtins.float(start), builtins.float(end), builtins.float(step)
    if not (dstep > 0 or dstep < 0):
        msg = f"arange(): step must be nonzero; got step={step!r}."
        raise RuntimeError(msg)
    if not (math.isfinite(dstart) and math.isfinite(dend)):
        msg = f"arange(): unsupported range: {start} -> {end}; start and end must be finite."
        raise RuntimeError(msg)
    if not ((dstep > 0 and dend >= dstart) or (dstep < 0 and dend <= dstart)):
        msg = (
            f"arange(): upper bound and lower bound inconsistent with step sign; got start={start!r}, "
            f"end={end!r}, step={step!r}. Swap start and end or negate step."
        )
        raise RuntimeError(msg)
    is_float = any(not isinstance(v, numbers.Integral) for v in (start, end, step))
    dt = (
        as_dtype(dtype, "arange")
        if dtype is not None
        else (_dtype.float32 if is_float else _dtype.int64)
    )
    dev = _result_device(device, "arange")
    values = _arange_values(start, end, step, dt)
    storage = _storage_for((len(values),), dt, dev, "arange")
    mv = storage.host_view("arange")
    chunk = 1 << 16  # pack a bounded run at a time: a long range never becomes one huge list
    for i in range(0, len(values), chunk):
        run = _codec.pack(dt, values[i : i + chunk])
        mv[i * dt.itemsize : i * dt.itemsize + len(run)] = run
    t = Tensor._new(storage, 0, (len(values),), (1,), dt, "arange")
    return _grad(t, requires_grad, "arange")


def _arange_scalar(value: Any, name: str) -> Any:
    """A real Python number from an ``arange`` argument (one-element tensors are unwrapped)."""
    if isinstance(value, Tensor):
        value = value.item()
    if isinstance(value, complex) or not isinstance(value, numbers.Real):
        msg = f"arange(): argument '{name}' must be a real number; got {value!r} ({type(value).__name__})."
        raise TypeError(msg)
    return value


class _FloatRange(Sequence[float]):
    """``start + i * step`` for ``i`` in ``range(length)``, computed on demand (in double)."""

    def __init__(self, start: float, step: float, length: int) -> None:
        self._start, self._step, self._length = start, step, max(length, 0)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._start + i * self._step for i in range(*index.indices(self._length))]
        return self._start + range(self._length)[index] * self._step


def _arange_values(start: Any, end: Any, step: Any, dtype: DType) -> Sequence[Any]:
    """PyTorch's ``arange`` values for ``dtype`` (``compute_arange_size`` and the CPU kernel).

    The length is ``ceil((end - start) / step)`` in double, except for int64, where start, end and
    step are first truncated to integers. Values are ``start + i * step`` in the accumulate type:
    double for floating dtypes, int64 (truncated start and step) for integer dtypes.
    """
    if dtype.kind in "fc":
        length = math.ceil((builtins.float(end) - builtins.float(start)) / builtins.float(step))
        return _FloatRange(builtins.float(start), builtins.float(step), length)
    istart, istep = int(start), int(step)
    if dtype is _dtype.int64:
        iend = int(end)
        if istep == 0:
            # ValueError here, as PyTorch 2.13 (its int64 path checks the truncated step itself).
            msg = f"arange(): step must be nonzero; got step={step!r}, which is 0 as an int64."
            raise ValueError(msg)
        return range(istart, iend, istep)
    length = math.ceil((builtins.float(end) - builtins.float(start)) / builtins.float(step))
    return range(istart, istart + length * istep, istep) if istep else [istart] * length
