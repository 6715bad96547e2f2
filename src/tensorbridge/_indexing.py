"""Index expressions: Python subscripts -> a basic strided view plus optional advanced indices.

Basic indexing (ints, slices of either step sign, ``...``, ``None``) is pure layout arithmetic and
never copies. Integer and boolean index arrays ("advanced" indexing) are returned separately; the
tensor resolves them into element offsets and copies, as PyTorch and NumPy do.

A Python bool (or a 0-d bool or uint8 tensor) is an advanced index too, as in PyTorch 2.13 and NumPy:
it inserts a dimension of size 1 indexed by ``[0]`` (True) or ``[]`` (False), which broadcasts with
the other index arrays, so ``x[[1], True]`` has shape ``(1, ...)`` and ``x[[0, 1], False]`` is an
IndexError. A uint8 index tensor of one or more dimensions is a boolean mask, with PyTorch's
deprecation warning.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex

__all__ = [
    "INDEX_DTYPES",
    "UINT8_INDEX_WARNING",
    "Advanced",
    "BasicView",
    "IndexArray",
    "check_bounds",
    "parse_index",
]

# PyTorch 2.13's words (aten/src/ATen/native/IndexingUtils.h), kept verbatim so that warning
# filters written for PyTorch match.
UINT8_INDEX_WARNING = (
    "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead."
)
INDEX_DTYPES = frozenset({"int64", "int32", "uint8", "bool"})


# What `parse_index` asks of its caller for index arrays (see there).
IndexArray = Callable[[Any, str], "tuple[list[Any], tuple[int, ...], str] | None"]


@dataclass(frozen=True)
class Advanced:
    """An integer index array applied to view dimension ``dim``: flat values and their shape.

    The values may be negative or out of range until `check_bounds` has wrapped them.
    """

    dim: int
    values: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class BasicView:
    """The result of basic indexing: an offset delta (elements), shape, strides, and advanced indices.

    ``single_mask`` is True when the key's only advanced item is one boolean (or uint8) mask, for
    which PyTorch's assignment takes a one-element value of any dtype (``masked_fill_``).
    """

    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    advanced: tuple[Advanced, ...]
    single_mask: bool = False


def _normalize(key: Any, api: str, index_array: IndexArray) -> list[Any]:
    """Each subscript item as an int, slice, None, Ellipsis, bool, or an ("int"|"mask", values, shape)."""
    items = key if isinstance(key, tuple) else (key,)
    expanded: list[Any] = []
    for item in items:
        if item is None or item is Ellipsis or isinstance(item, (slice, bool)):
            expanded.append(item)
        elif type(item) is int or (
            isinstance(item, SupportsIndex) and not hasattr(item, "__len__")
        ):
            # Ints and integer scalars (NumPy's np.int64, ...: no __len__, unlike any array).
            expanded.append(_scalar_index(item, api))
        else:
            arr = index_array(item, api)
            if arr is None:
                msg = (
                    f"{api}(): only integers, slices (`:`), ellipsis (`...`), None and long or "
                    f"byte Variables are valid indices; got {item!r} ({type(item).__name__})."
                )
                raise IndexError(msg)
            values, ishape, kind = arr
            if not ishape:
                # A 0-d index tensor acts as the scalar it holds, as in PyTorch: an int selects (a
                # view); a bool (or uint8) is a bool index.
                expanded.append(bool(values[0]) if kind == "b" else operator.index(values[0]))
            elif kind == "b":
                expanded.append(("mask", values, ishape))
            else:
                expanded.append(("int", values, ishape))
    return expanded


def _scalar_index(item: Any, api: str) -> int:
    try:
        return operator.index(item)
    except TypeError:
        # NumPy's np.bool_ defines __index__ only to refuse it; PyTorch refuses it as an index.
        msg = (
            f"{api}(): only integers, slices (`:`), ellipsis (`...`), None and long or "
            f"byte Variables are valid indices; got {item!r} ({type(item).__name__})."
        )
        raise IndexError(msg) from None


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
    key: Any, shape: Sequence[int], strides: Sequence[int], api: str, index_array: IndexArray
) -> BasicView:
    """Apply ``key`` to a layout; advanced entries keep their dim and are returned for the caller.

    ``index_array(item, api)`` flattens an item that is neither an int, a slice, None, Ellipsis nor
    a bool (a list, a tensor, an array) to ``(values, shape, kind)`` (``kind`` ``"b"`` for a mask,
    ``"i"`` for indices), or None when it is no index array: reading arrays is the tensor's part.
    """
    expanded = _normalize(key, api, index_array)

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
        elif item is None or isinstance(item, bool):
            # PyTorch inserts the dim with unsqueeze's stride: that of the next dim, times its size.
            out_shape.append(1)
            out_strides.append(shape[d] * strides[d] if d < len(shape) else 1)
            if item is not None:
                # A bool is an index of shape (1,) or (0,) into the new dim; it broadcasts with the
                # other advanced indices (PyTorch 2.13, NumPy).
                advanced.append(Advanced(len(out_shape) - 1, (0,) if item else (), (int(item),)))
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
            # Bounds are checked by the caller after broadcasting (`check_bounds`), which is
            # PyTorch's order: a shape mismatch is reported before an out-of-range index.
            advanced.append(Advanced(len(out_shape), tuple(values), ishape))
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
    items = [it for it in expanded if isinstance(it, (bool, tuple))]
    single_mask = len(items) == 1 and isinstance(items[0], tuple) and items[0][0] == "mask"
    return BasicView(offset, tuple(out_shape), tuple(out_strides), tuple(advanced), single_mask)


def _slice_indices(item: slice, size: int, api: str) -> tuple[int, int, int]:
    for part in (item.start, item.stop, item.step):
        if part is not None and (isinstance(part, bool) or not isinstance(part, SupportsIndex)):
            msg = f"{api}(): slice indices must be integers or None; got {item!r}."
            raise TypeError(msg)
    if item.step is not None and operator.index(item.step) == 0:
        msg = f"{api}(): slice step cannot be zero"
        raise ValueError(msg)
    return item.indices(size)


def check_bounds(values: Sequence[int], size: int, dim: int, api: str) -> list[int]:
    """``values`` wrapped into ``range(size)``; IndexError (PyTorch's text) for any outside it."""
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
