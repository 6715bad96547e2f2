"""Pure integer arithmetic on shapes and strides (strides in elements). No ctypes, no memory.

Everything here is a function of tuples of ints, so it is exhaustively property-tested against NumPy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Final, SupportsIndex

from ._args import as_int

__all__ = [
    "Size",
    "as_shape",
    "broadcast_shapes",
    "check_int64",
    "check_sizes",
    "contiguous_strides",
    "element_strides",
    "extent",
    "infer_shape",
    "is_contiguous",
    "normalize_dim",
    "view_strides",
]

# DLPack and NumPy both cap dimensions at 64; nothing larger is representable downstream.
MAX_NDIM: Final = 64

# The one limit on sizes: DLPack, PyTorch and NumPy hold sizes, strides and element counts in int64
# (NumPy's npy_intp), so nothing larger can be exported, and a size past it is a lie (or a request
# no machine can serve). Every door where a size enters checks it with `check_sizes`.
MAX_SIZE: Final = (1 << 63) - 1


class Size(tuple[int, ...]):
    """A tensor shape: a tuple of ints, printed as ``tensorbridge.Size([2, 3])``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"tensorbridge.Size({list(self)!r})"

    def numel(self) -> int:
        """Number of elements a tensor of this shape holds."""
        return math.prod(self)


def as_shape(
    args: Sequence[Any], api: str, *, negative: type[Exception] = ValueError
) -> tuple[int, ...]:
    """Accept ``f(2, 3)``, ``f((2, 3))`` and ``f([2, 3])`` as PyTorch does; sizes must be >= 0.

    A negative size, and sizes that multiply past int64, raise ``negative`` (creation functions
    pass RuntimeError, PyTorch's type); a size past int64 is PyTorch's TypeError.
    """
    if len(args) == 1 and not isinstance(args[0], SupportsIndex):
        if not isinstance(args[0], Iterable):
            msg = f"{api}(): size must be a sequence of ints; got {args[0]!r} ({type(args[0]).__name__})."
            raise TypeError(msg)
        args = tuple(args[0])
    shape = tuple(as_int(s, api, "each size") for s in args)
    for s in shape:
        if s < 0:
            msg = (
                f"{api}(): Trying to create tensor with negative dimension {s}: {list(shape)}. "
                f"Dimension size must be non-negative."
            )
            raise negative(msg)
    if len(shape) > MAX_NDIM:
        msg = f"{api}(): at most {MAX_NDIM} dimensions are supported; got {len(shape)}."
        raise ValueError(msg)
    check_sizes(shape, api, "size", negative, unpack=TypeError)
    return shape


def check_int64(value: int, api: str, what: str, error: type[Exception] = TypeError) -> int:
    """``value`` when it fits int64 (a size, stride or offset); else ``error`` (PyTorch's type and
    words for an argument it cannot unpack)."""
    if -MAX_SIZE - 1 <= value <= MAX_SIZE:
        return value
    msg = (
        f"{api}(): Overflow when unpacking long long: {what} {value} lies outside int64 "
        f"[-2**63, 2**63 - 1], the range DLPack, PyTorch and NumPy hold sizes, strides and offsets in."
    )
    raise error(msg)


def check_sizes(
    shape: Sequence[int],
    api: str,
    what: str = "shape",
    error: type[Exception] = ValueError,
    strides: Sequence[int] = (),
    unpack: type[Exception] | None = None,
) -> None:
    """Raise unless every size and stride, and the product of the positive sizes, fit int64.

    The product leaves zeros out, so a size-0 tensor's other sizes are bounded too: ``(0, 2**64 - 1)``
    is refused (PyTorch cannot unpack the size; NumPy's shape cannot hold it). Negative sizes are
    each door's to refuse in its own words (a view's -1 passes here). ``error`` is the type raised,
    ``unpack`` (default ``error``) the type for one value past int64: constructors and views pass
    TypeError, PyTorch's for an argument it cannot unpack. Sizes that multiply past int64 are a
    request larger than any memory: ValueError, as tensorbridge refuses every layout larger than
    its memory (creation functions pass RuntimeError, PyTorch's "Storage size calculation
    overflowed"). Headers and pickles keep ValueError for both.
    """
    count = 1
    for size in shape:
        check_int64(size, api, f"{what} {list(shape)} has size", unpack or error)
        if size > 0:
            count *= size
    if count > MAX_SIZE:
        msg = (
            f"{api}(): numel: integer multiplication overflow: {what} {list(shape)} holds more than "
            f"2**63 - 1 elements, more than a process can address (its sizes, zeros aside, multiply "
            f"past int64, the count DLPack, PyTorch and NumPy hold)."
        )
        raise error(msg)
    for stride in strides:
        check_int64(stride, api, f"strides {list(strides)} have stride", unpack or error)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides (in elements) for ``shape``; size-0/1 dims get the stride they would have."""
    strides = [0] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= max(shape[i], 1)
    return tuple(strides)


def element_strides(
    shape: Sequence[int], byte_strides: Sequence[int], itemsize: int
) -> tuple[int, ...] | None:
    """Byte strides counted in items of ``itemsize`` bytes; None when one that matters is not a
    whole number of items.

    The stride of a dimension of size 1, and every stride of a layout that holds no element,
    addresses nothing (NumPy exports such strides to DLPack whatever they are): one that is not
    whole items becomes the row-major stride of its dimension.
    """
    row_major: tuple[int, ...] | None = None
    empty = 0 in shape
    strides = []
    for i, stride in enumerate(byte_strides):
        if stride % itemsize == 0:
            strides.append(stride // itemsize)
            continue
        if not empty and shape[i] != 1:
            return None
        if row_major is None:
            row_major = contiguous_strides(shape)
        strides.append(row_major[i])
    return tuple(strides)


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True when the layout is row-major compact; size-1 dims may have any stride, size-0 is contiguous."""
    if 0 in shape:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def extent(offset: int, shape: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """``(lowest, highest)`` element index a layout touches, or None when it holds no element."""
    low = high = offset
    for i in range(len(shape)):  # indexed: a compiled loop, where zip() would cost a call
        size = shape[i]
        if size == 0:
            return None
        span = (size - 1) * strides[i]
        if span < 0:
            low += span
        else:
            high += span
    return low, high


def normalize_dim(dim: object, ndim: int, api: str, *, scalar_ok: bool = True) -> int:
    """Wrap a possibly negative dimension index.

    0-d tensors accept -1 and 0 as PyTorch does for shape changes (``transpose``, ``unsqueeze``); pass
    ``scalar_ok=False`` for operations that need a real dimension (``size(d)``, ``unbind``, ``narrow``).
    """
    d = as_int(dim, api, "dim")
    if ndim == 0 and not scalar_ok:
        msg = f"{api}(): Dimension specified as {d} but tensor has no dimensions"
        raise IndexError(msg)
    n = max(ndim, 1)
    if not -n <= d < n:
        msg = f"{api}(): Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})"
        raise IndexError(msg)
    return d % n


def infer_shape(numel: int, shape: Sequence[int], api: str) -> tuple[int, ...]:
    """Resolve one ``-1`` in a requested shape against ``numel`` (PyTorch's ``infer_size``).

    Errors are RuntimeError with PyTorch's text, as PyTorch raises them.
    """
    infer_at = None
    known = 1
    for i, s in enumerate(shape):
        if s == -1:
            if infer_at is not None:
                msg = f"{api}(): only one dimension can be inferred; got shape {list(shape)}."
                raise RuntimeError(msg)
            infer_at = i
        elif s < 0:
            msg = (
                f"{api}(): invalid shape dimension {s} at index {i} of shape {list(shape)}; "
                f"sizes must be non-negative, or -1 for one inferred dimension."
            )
            raise RuntimeError(msg)
        else:
            known *= s
    result = list(shape)
    if infer_at is None and known == numel:
        return tuple(result)
    if infer_at is not None and numel == known == 0:
        msg = (
            f"{api}(): cannot reshape tensor of 0 elements into shape {list(shape)} because the "
            f"unspecified dimension size -1 can be any value and is ambiguous. Give every size."
        )
        raise RuntimeError(msg)
    if infer_at is None or known == 0 or numel % known != 0:
        msg = f"{api}(): shape '{list(shape)}' is invalid for input of size {numel}"
        raise RuntimeError(msg)
    result[infer_at] = numel // known
    return tuple(result)


def view_strides(
    shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]
) -> tuple[int, ...] | None:
    """Strides that view ``(shape, strides)`` as ``new_shape`` without copying, or None if impossible.

    This is PyTorch's ``computeStride``: walk the old dims from the back in chunks that are contiguous
    among themselves, and carve each chunk into the new dims it must cover exactly.
    """
    if not shape:
        return (1,) * len(new_shape)  # a 0-d tensor views as any all-ones shape
    numel = math.prod(shape)
    if numel == 0:
        return tuple(strides) if tuple(shape) == tuple(new_shape) else contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1] if strides else 1
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (
            shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride
        ):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def broadcast_shapes(*shapes: Sequence[int], api: str = "broadcast_shapes") -> tuple[int, ...]:
    """NumPy/PyTorch broadcasting of several shapes; a mismatch is a `ValueError` naming both."""
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, ndim - len(shape)):
            if size != result[i]:
                if result[i] == 1:
                    result[i] = size
                elif size != 1:
                    msg = (
                        f"{api}(): shape mismatch: objects cannot be broadcast to a single shape; "
                        f"got {[list(s) for s in shapes]}."
                    )
                    raise ValueError(msg)
    return tuple(result)


def expand_strides(
    shape: Sequence[int], strides: Sequence[int], target: Sequence[int], api: str
) -> tuple[int, ...]:
    """Strides viewing ``(shape, strides)`` broadcast to ``target``; ``-1`` in target keeps a size.

    A shape that cannot expand is a RuntimeError with PyTorch's text, as PyTorch raises it.
    """
    if len(target) < len(shape):
        msg = (
            f"{api}(): the number of sizes provided ({len(target)}) must be greater or equal to the "
            f"number of dimensions in the tensor ({len(shape)})"
        )
        raise RuntimeError(msg)
    check_sizes(target, api, "size", RuntimeError, unpack=TypeError)
    lead = len(target) - len(shape)
    out = [0] * len(target)
    # Right to left, as PyTorch infers the geometry: a new leading dimension is a size-1 dimension
    # whose stride continues the one after it (`follows`: that one's size times its stride), made 0
    # when it is expanded; a 0-d tensor's new dimensions all have stride 0.
    follows = 0
    for i in range(len(target) - 1, -1, -1):
        want = target[i]
        if i < lead:
            if want < 0:
                msg = (
                    f"{api}(): The expanded size of the tensor ({want}) isn't allowed in a leading, "
                    f"non-existing dimension {i}"
                )
                raise RuntimeError(msg)
            size, stride = 1, follows
        else:
            size, stride = shape[i - lead], strides[i - lead]
        if want in (-1, size):
            out[i] = stride
        elif size == 1 and want >= 0:
            size, out[i] = want, 0
        else:
            msg = (
                f"{api}(): The expanded size of the tensor ({want}) must match the existing size "
                f"({size}) at non-singleton dimension {i}.  Target sizes: {list(target)}.  "
                f"Tensor sizes: {list(shape)}"
            )
            raise RuntimeError(msg)
        follows = size * out[i]
    return tuple(out)


def coalesce(
    shape: Sequence[int], *stride_sets: Sequence[int]
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Drop size-1 dims and merge neighbours that are contiguous in every stride set.

    Used by the copy routine so that each inner run is as long as possible.
    """
    dims = [i for i, s in enumerate(shape) if s != 1]
    new_shape: list[int] = []
    new_strides: list[list[int]] = [[] for _ in stride_sets]
    for i in dims:
        if new_shape and all(
            st[-1] == ss[i] * shape[i] for st, ss in zip(new_strides, stride_sets)
        ):
            new_shape[-1] *= shape[i]
            for st, ss in zip(new_strides, stride_sets):
                st[-1] = ss[i]
        else:
            new_shape.append(shape[i])
            for st, ss in zip(new_strides, stride_sets):
                st.append(ss[i])
    return tuple(new_shape), tuple(tuple(st) for st in new_strides)
