"""Creation functions: `tensor`, `arange`, `zeros`/`ones`/`empty`/`full` and their ``*_like`` forms.

Every function here allocates new tensorbridge memory (zeroed, 64-byte aligned) and fills it through the
dtype's codec. Zero-copy constructors live with their protocol: `from_dlpack` (`_dlpack`), `frombuffer`
and `from_file` (`_buffer`, `_file`), `asarray` and `from_pointer` (`_convert`).
"""

from __future__ import annotations

import builtins
import math
import numbers
from collections.abc import Sequence
from typing import Any

from . import _codec, _dtype, _layout
from ._device import CPU, Device, as_device
from ._dtype import DType, as_dtype
from ._tensor import Tensor, _from_bytes

__all__ = [
    "arange",
    "empty",
    "empty_like",
    "full",
    "full_like",
    "ones",
    "ones_like",
    "tensor",
    "zeros",
    "zeros_like",
]

# PyTorch's defaults: torch.get_default_dtype() is float32; complex follows it.
_DEFAULT_FOR_KIND = {"b": _dtype.bool, "i": _dtype.int64, "f": _dtype.float32, "c": _dtype.complex64}
_KIND_RANK = {"b": 0, "i": 1, "f": 2, "c": 3}


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
    msg = (f"{api}(): invalid data type '{type(value).__name__}'; got {value!r}. "
           f"Elements must be bool, int, float or complex.")
    raise TypeError(msg)


def _flatten(data: Any, api: str) -> tuple[list[Any], tuple[int, ...], str, DType | None]:
    """Flatten nested sequences (and tensors inside them) row-major.

    Returns the values, the shape, the widest kind seen, and the dtype when every leaf is a tensor of one
    dtype (PyTorch keeps it: ``tensor([t1, t2])`` has the tensors' dtype).
    """
    if isinstance(data, Tensor):
        return data._values(api), tuple(data.shape), data.dtype.kind if data.dtype.kind != "u" else "i", data.dtype
    if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
        if hasattr(data, "tolist") and not isinstance(data, numbers.Number):
            return _flatten(data.tolist(), api)
        kind = _scalar_kind(data, api)
        return [data], (), kind, None
    if len(data) == 0:
        return [], (0,), "f", None
    parts = [_flatten(item, api) for item in data]
    first_shape = parts[0][1]
    for i, part in enumerate(parts):
        if part[1] != first_shape:
            msg = (f"{api}(): expected sequence of length {first_shape[0] if first_shape else 0} at dim 1 "
                   f"(got {part[1][0] if part[1] else 0}); element {i} has shape {list(part[1])}. "
                   f"Nested sequences must be rectangular.")
            raise ValueError(msg)
    values = [v for part in parts for v in part[0]]
    kind = max((p[2] for p in parts), key=_KIND_RANK.__getitem__)
    leaf = parts[0][3] if all(p[3] is parts[0][3] for p in parts) else None
    return values, (len(data), *first_shape), kind, leaf


def _result_device(device: Any, api: str) -> Device:
    dev = CPU if device is None else as_device(device, api)
    if not dev.is_host_accessible:
        msg = (f"{api}(): tensorbridge creates tensors in host memory only; got device={device!r}. "
               f"Create the tensor on the host and export it with __dlpack__(dl_device=...) to a library "
               f"for {dev.type}.")
        raise BufferError(msg)
    return dev


def _grad(t: Tensor, requires_grad: bool) -> Tensor:
    return t.requires_grad_(True) if requires_grad else t


def tensor(data: Any, *, dtype: DType | None = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested sequences, scalars, or any object with memory).

    dtype inference follows PyTorch: bools -> bool, ints -> int64, floats -> float32, complex -> complex64;
    the widest kind wins. Objects with ``__dlpack__``, a buffer or an array interface are copied through
    `asarray`.

    Example:
        >>> tensor([[1, 2], [3, 4]])
        tensor([[1, 2],
                [3, 4]])
    """
    if dtype is not None:
        dtype = as_dtype(dtype, "tensor")
    dev = _result_device(device, "tensor")
    if not isinstance(data, (Tensor, Sequence, numbers.Number)) and _convert.is_protocol_object(data):
        return _convert.asarray(data, dtype=dtype, device=device, copy=True, requires_grad=requires_grad)
    values, shape, kind, leaf_dtype = _flatten(data, "tensor")
    target = dtype or leaf_dtype or _DEFAULT_FOR_KIND[kind]
    if len(shape) > _layout.MAX_NDIM:
        msg = f"tensor(): at most {_layout.MAX_NDIM} dimensions are supported; got {len(shape)}."
        raise ValueError(msg)
    return _grad(_from_bytes(_codec.pack(target, values), shape, target, dev), requires_grad)


def as_tensor(data: Any, dtype: DType | None = None, device: Any = None) -> Tensor:
    """`asarray` without ``copy``: shares memory when possible (PyTorch's ``as_tensor``)."""
    return _convert.asarray(data, dtype=dtype, device=device)


def _filled(shape: tuple[int, ...], value: Any, dtype: DType, device: Device, requires_grad: bool,
            api: str) -> Tensor:
    _codec.check_scalar(dtype, value, api)
    nbytes = math.prod(shape) * dtype.itemsize
    data = _codec.pack(dtype, [value]) * math.prod(shape) if value != 0 else bytes(nbytes)
    return _grad(_from_bytes(data, shape, dtype, device), requires_grad)


def _creation_args(size: Sequence[Any], dtype: Any, device: Any, api: str) -> tuple[tuple[int, ...], DType, Device]:
    shape = _layout.as_shape(size, api)
    return shape, as_dtype(dtype, api) if dtype is not None else _dtype.float32, _result_device(device, api)


def zeros(*size: Any, dtype: DType | None = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor of zeros (float32 unless ``dtype`` says otherwise)."""
    shape, dt, dev = _creation_args(size, dtype, device, "zeros")
    return _filled(shape, 0, dt, dev, requires_grad, "zeros")


def ones(*size: Any, dtype: DType | None = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor of ones (float32 unless ``dtype`` says otherwise)."""
    shape, dt, dev = _creation_args(size, dtype, device, "ones")
    return _filled(shape, 1, dt, dev, requires_grad, "ones")


def empty(*size: Any, dtype: DType | None = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor; tensorbridge memory is always zero-initialised, so this equals `zeros`."""
    shape, dt, dev = _creation_args(size, dtype, device, "empty")
    return _filled(shape, 0, dt, dev, requires_grad, "empty")


def full(size: Any, fill_value: Any, *, dtype: DType | None = None, device: Any = None,
         requires_grad: bool = False) -> Tensor:
    """A new tensor filled with ``fill_value``; dtype inferred from it as PyTorch does."""
    shape = _layout.as_shape((size,), "full")
    if dtype is None:
        dt = _DEFAULT_FOR_KIND[_scalar_kind(fill_value, "full")]
    else:
        dt = as_dtype(dtype, "full")
    return _filled(shape, fill_value, dt, _result_device(device, "full"), requires_grad, "full")


def _like(t: Tensor, dtype: Any, device: Any, api: str) -> tuple[tuple[int, ...], DType, Device]:
    if not isinstance(t, Tensor):
        msg = f"{api}(): expected a tensorbridge Tensor; got {type(t).__name__}."
        raise TypeError(msg)
    dt = t.dtype if dtype is None else as_dtype(dtype, api)
    dev = _result_device(t.device if device is None and t.device.is_host_accessible else device, api)
    return tuple(t.shape), dt, dev


def zeros_like(t: Tensor, *, dtype: DType | None = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Zeros with ``t``'s shape (and dtype unless given)."""
    shape, dt, dev = _like(t, dtype, device, "zeros_like")
    return _filled(shape, 0, dt, dev, requires_grad, "zeros_like")


def ones_like(t: Tensor, *, dtype: DType | None = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Ones with ``t``'s shape (and dtype unless given)."""
    shape, dt, dev = _like(t, dtype, device, "ones_like")
    return _filled(shape, 1, dt, dev, requires_grad, "ones_like")


def empty_like(t: Tensor, *, dtype: DType | None = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A zeroed tensor with ``t``'s shape (and dtype unless given)."""
    shape, dt, dev = _like(t, dtype, device, "empty_like")
    return _filled(shape, 0, dt, dev, requires_grad, "empty_like")


def full_like(t: Tensor, fill_value: Any, *, dtype: DType | None = None, device: Any = None,
              requires_grad: bool = False) -> Tensor:
    """``fill_value`` everywhere, with ``t``'s shape (and dtype unless given)."""
    shape, dt, dev = _like(t, dtype, device, "full_like")
    return _filled(shape, fill_value, dt, dev, requires_grad, "full_like")


def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: DType | None = None, device: Any = None,
           requires_grad: bool = False) -> Tensor:
    """Values from ``start`` (inclusive) to ``end`` (exclusive) by ``step``.

    Length is PyTorch's ``ceil((end - start) / step)`` computed in double precision; values are computed
    as ``start + i * step`` in double (float dtypes) or exactly (integer dtypes), then cast.

    Example:
        >>> arange(4)
        tensor([0, 1, 2, 3])
    """
    if end is None:
        start, end = 0, start
    for name, v in (("start", start), ("end", end), ("step", step)):
        if isinstance(v, Tensor):
            v = v.item()
        if isinstance(v, complex) or not isinstance(v, numbers.Real):
            msg = f"arange(): argument '{name}' must be a real number; got {v!r} ({type(v).__name__})."
            raise TypeError(msg)
        if isinstance(v, builtins.float) and not math.isfinite(v):
            msg = f"arange(): unsupported range: {start} -> {end}; start and end must be finite."
            raise RuntimeError(msg)
    if step == 0:
        msg = "arange(): step must be nonzero"
        raise RuntimeError(msg)
    if (end - start) * step < 0 and end != start:
        msg = "arange(): upper bound and larger bound inconsistent with step sign"
        raise RuntimeError(msg)
    is_float = any(isinstance(v, builtins.float) or not isinstance(v, numbers.Integral) for v in (start, end, step))
    dt = as_dtype(dtype, "arange") if dtype is not None else (_dtype.float32 if is_float else _dtype.int64)
    if is_float or dt.kind in "fc":
        length = math.ceil((builtins.float(end) - builtins.float(start)) / builtins.float(step))
        s, d = builtins.float(start), builtins.float(step)
        values: list[Any] = [s + i * d for i in range(max(length, 0))]
    else:
        values = list(range(int(start), int(end), int(step)))
    dev = _result_device(device, "arange")
    return _grad(_from_bytes(_codec.pack(dt, values), (len(values),), dt, dev), requires_grad)


from . import _convert  # noqa: E402  (asarray dispatcher; it imports tensor from here)
