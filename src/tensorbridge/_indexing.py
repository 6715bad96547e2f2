"""Index expressions: Python subscripts -> a basic strided view plus optional advanced indices.

Basic indexing (ints, slices of either step sign, ``...``, ``None``) is pure layout arithmetic and
never copies. Integer and boolean index arrays ("advanced" indexing) are returned separately; the
tensor resolves them into element offsets and copies, as PyTorch and NumPy do.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex

__all__ = ["Advanced", "BasicView", "parse_index"]


@dataclass(frozen=True)
class Advanced:
    """An integer index array applied to view dimension ``dim``: flat values and their shape."""

    dim: int
    values: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class BasicView:
    """The result of basic indexing: an offset delta (elements), shape, strides, and advanced indices."""

    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    advanced: tuple[Advanced, ...]


def _index_array(item: Any, api: str) -> tuple[list[Any], tuple[int, ...], str] | None:
    """Flatten an index array (a Tensor, a list, anything with ``tolist``) to (values, shape, kind)."""
    from ._tensor import Tensor  # local: _tensor imports this module

    if isinstance(item, Tensor):
        if item.dtype.kind not in "biu":
            msg = (
                f"{api}(): tensors used as indices must be long, int, byte or bool tensors; "
                f"got a tensor of dtype {item.dtype}."
            )
            raise IndexError(msg)
        flat = item.reshape(-1).tolist()
        return flat, tuple(item.shape), "b" if item.dtype.kind == "b" else "i"
    if (
        isinstance(item, list)
        or hasattr(item, "__array_interface__")
        or hasattr(item, "__dlpack__")
    ):
        from ._creation import tensor

        try:
            t = tensor(item.tolist() if hasattr(item, "tolist") else item)
        except (TypeError, ValueError) as exc:
            msg = f"{api}(): invalid index {item!r}; index lists must hold ints or bools."
            raise IndexError(msg) from exc
        if t.numel() == 0 and t.dtype.kind == "f":
            return [], tuple(t.shape), "i"  # [] indexes nothing, as in PyTorch
        return _index_array(t, api)
    return None


def _normalize(key: Any, api: str) -> list[Any]:
    """Each subscript item as an int, slice, None, Ellipsis, bool, or an ("int"|"mask", values, shape)."""
    items = key if isinstance(key, tuple) else (key,)
    expanded: list[Any] = []
    for item in items:
        if item is None or item is Ellipsis or isinstance(item, (slice, bool)):
            expanded.append(item)
        elif isinstance(item, SupportsIndex) and not hasattr(item, "shape"):
            expanded.append(operator.index(item))
        else:
            arr = _index_array(item, api)
            if arr is None:
                if isinstance(item, SupportsIndex):  # 0-d integer tensors of foreign libraries
                    expanded.append(operator.index(item))
                    continue
                msg = (
                    f"{api}(): only integers, slices (`:`), ellipsis (`...`), None and long or "
                    f"byte Variables are valid indices; got {item!r} ({type(item).__name__})."
                )
                raise IndexError(msg)
            values, ishape, kind = arr
            if not ishape:
                # A 0-d index tensor acts as the scalar it holds, as in PyTorch: an int selects (a view),
                # a bool adds a dimension of size 1 or 0.
                expanded.append(bool(values[0]) if kind == "b" else operator.index(values[0]))
            elif kind == "b":
                expanded.append(("mask", values, ishape))
            else:
                expanded.append(("int", values, ishape))
    return expanded


def _count_consumed(expanded: list[Any], ndim: int, api: str) -> int:
    """How many tensor dimensions the items index; more than ``ndim``, or two ellipses, is an error."""
    consumed = sum(
        len(it[2]) if isinstance(it, tuple) and it[0] == "mask" else 1
        for it in expanded
        if it is not None and it is not Ellipsis and not isinstance(it, bool)
    )
    if sum(1 for it in expanded if it is Ellipsis) > 1:
        msg = f"{api}(): an index can only have a single ellipsis ('...')"
        raise IndexError(msg)
    if consumed > ndim:
        msg = f"{api}(): too many indices for tensor of dimension {ndim}"
        raise IndexError(msg)
    return consumed


def parse_index(
    key: Any, shape: Sequence[int], strides: Sequence[int], api: str = "__getitem__"
) -> BasicView:
    """Apply ``key`` to a layout; advanced entries keep their dim and are returned for the caller."""
    expanded = _normalize(key, api)

    consumed = _count_consumed(expanded, len(shape), api)

    offset = 0
    out_shape: list[int] = []
    out_strides: list[int] = []
    advanced: list[Advanced] = []
    d = 0
    for item in expanded:
        if item is Ellipsis:
            for _ in range(len(shape) - consumed):
                out_shape.append(shape[d])
                out_strides.append(strides[d])
                d += 1
        elif item is None or item is True:
            out_shape.append(1)
            out_strides.append(0)
        elif item is False:
            out_shape.append(0)
            out_strides.append(0)
        elif isinstance(item, int):
            size = shape[d]
            if not -size <= item < size:
                msg = f"{api}(): index {item} is out of bounds for dimension {d} with size {size}"
                raise IndexError(msg)
            offset += (item % size) * strides[d]
            d += 1
        elif isinstance(item, slice):
            start, stop, step = _slice_indices(item, shape[d], api)
            length = len(range(start, stop, step))
            if length or step > 0:
                # An empty slice moves the offset as PyTorch does (start is then in [0, size]); with a
                # negative step its start may be -1, so the offset stays.
                offset += start * strides[d]
            out_shape.append(length)
            out_strides.append(strides[d] * step)
            d += 1
        elif item[0] == "int":
            _, values, ishape = item
            checked = tuple(_check_bounds(values, shape[d], d, api))
            advanced.append(Advanced(len(out_shape), checked, ishape))
            out_shape.append(shape[d])
            out_strides.append(strides[d])
            d += 1
        else:
            _, values, mshape = item
            for k, coords in enumerate(_mask_coordinates(values, mshape, shape, d, api)):
                advanced.append(Advanced(len(out_shape), coords, (len(coords),)))
                out_shape.append(shape[d + k])
                out_strides.append(strides[d + k])
            d += len(mshape)
    while d < len(shape):
        out_shape.append(shape[d])
        out_strides.append(strides[d])
        d += 1
    return BasicView(offset, tuple(out_shape), tuple(out_strides), tuple(advanced))


def _slice_indices(item: slice, size: int, api: str) -> tuple[int, int, int]:
    for part in (item.start, item.stop, item.step):
        if part is not None and (isinstance(part, bool) or not isinstance(part, SupportsIndex)):
            msg = f"{api}(): slice indices must be integers or None; got {item!r}."
            raise TypeError(msg)
    if item.step is not None and operator.index(item.step) == 0:
        msg = f"{api}(): slice step cannot be zero"
        raise ValueError(msg)
    return item.indices(size)


def _check_bounds(values: Sequence[int], size: int, dim: int, api: str) -> list[int]:
    out = []
    for v in values:
        if not -size <= v < size:
            msg = f"{api}(): index {v} is out of bounds for dimension {dim} with size {size}"
            raise IndexError(msg)
        out.append(v % size)
    return out


def _mask_coordinates(
    values: Sequence[bool], mshape: tuple[int, ...], shape: Sequence[int], d: int, api: str
) -> list[tuple[int, ...]]:
    """Coordinates selected by a boolean mask applied at dimension ``d``; its shape must match."""
    if mshape != tuple(shape[d : d + len(mshape)]):
        msg = (
            f"{api}(): The shape of the mask {list(mshape)} at index {d} does not match the "
            f"shape of the indexed tensor {list(shape)} at index {d}"
        )
        raise IndexError(msg)
    return _nonzero(values, mshape)


def _nonzero(values: Sequence[bool], shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Coordinates of the True entries of a flat row-major mask, one tuple per mask dimension."""
    coords: list[list[int]] = [[] for _ in shape]
    for flat, v in enumerate(values):
        if v:
            rem = flat
            for k in range(len(shape) - 1, -1, -1):
                rem, c = divmod(rem, shape[k])
                coords[k].append(c)
    return [tuple(c) for c in coords]
