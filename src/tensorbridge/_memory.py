"""The one strided copy routine, and the gather/scatter built on it. Host memory only.

A *region* is ``(mv, offset, shape, strides, itemsize)``: an unsigned-byte memoryview over a storage, and an
element layout inside it (offset and strides in elements). Every copy, cast, ``contiguous()``, ``clone()``,
``tolist()`` and ``copy=True`` import goes through `copy_region`.

Each innermost run is one extended-slice assignment between memoryviews cast to a machine word, so the
per-element work happens in C; Python loops only over the outer dimensions. memoryview slicing never reads
outside the view, so even a wrong layout cannot escape the storage: bounds are still checked up front.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from ._layout import coalesce, contiguous_strides

__all__ = ["copy_region", "gather", "scatter"]


def _unit(itemsize: int, *nbytes: int) -> int:
    """The widest word (8, 4, 2, 1 bytes) that divides the itemsize and every view length."""
    for unit in (8, 4, 2, 1):
        if itemsize % unit == 0 and all(n % unit == 0 for n in nbytes):
            return unit
    return 1


def _words(mv: memoryview, unit: int) -> memoryview:
    fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[unit]
    return mv if unit == 1 else mv.cast(fmt)  # type: ignore[call-overload]


def _outer_offsets(shape: Sequence[int], *stride_sets: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Offsets of every outer position (all dims but the last) for each stride set."""
    ranges = [range(s) for s in shape[:-1]]
    for idx in itertools.product(*ranges):
        yield tuple(sum(i * st for i, st in zip(idx, strides)) for strides in stride_sets)


def _run(start: int, step: int, count: int) -> slice:
    """A slice selecting ``count`` words from ``start`` every ``step`` (step may be negative, not 0)."""
    stop = start + step * count
    return slice(start, stop if stop >= 0 else None, step)


def copy_region(
    dst: memoryview,
    dst_offset: int,
    dst_strides: Sequence[int],
    src: memoryview,
    src_offset: int,
    src_strides: Sequence[int],
    shape: Sequence[int],
    itemsize: int,
) -> None:
    """Copy ``shape`` elements of ``itemsize`` bytes from a strided source to a strided destination.

    Source strides may be 0 (broadcast). The regions must not overlap: a caller copying within one
    block of memory gathers the source first (see ``Tensor.copy_``).
    """
    if math.prod(shape) == 0:
        return
    if any(n > 1 and st == 0 for n, st in zip(shape, dst_strides)):
        shape, dst_strides, src_offset, src_strides = _last_write_wins(
            shape, dst_strides, src_offset, src_strides
        )
    shape, (dst_strides, src_strides) = coalesce(shape, dst_strides, src_strides)
    if not shape:
        shape, dst_strides, src_strides = (1,), (1,), (1,)
    unit = _unit(itemsize, len(dst), len(src))
    k = itemsize // unit
    dw, sw = _words(dst, unit), _words(src, unit)
    n = shape[-1]
    ds, ss = dst_strides[-1] * k, src_strides[-1] * k
    for d_off, s_off in _outer_offsets(shape, dst_strides, src_strides):
        d0 = (dst_offset + d_off) * k
        s0 = (src_offset + s_off) * k
        if ds == k and ss == k:
            dw[d0 : d0 + n * k] = sw[s0 : s0 + n * k]
        elif ss == 0:
            for j in range(k):
                one = sw[s0 + j : s0 + j + 1].tobytes()
                repeated = memoryview(one * n).cast(dw.format)  # type: ignore[call-overload]
                dw[_run(d0 + j, ds, n)] = repeated
        else:
            for j in range(k):
                dw[_run(d0 + j, ds, n)] = sw[_run(s0 + j, ss, n)]


def _last_write_wins(
    shape: Sequence[int], dst_strides: Sequence[int], src_offset: int, src_strides: Sequence[int]
) -> tuple[list[int], list[int], int, list[int]]:
    """Drop destination dims of stride 0: each of their elements lands on one location in turn.

    A row-major loop would leave the last one there, so the copy reads only that one (a fill of a
    broadcast view, or a scatter through an expanded index).
    """
    keep = [k for k, (n, st) in enumerate(zip(shape, dst_strides)) if not (n > 1 and st == 0)]
    src_offset += sum((shape[k] - 1) * src_strides[k] for k in range(len(shape)) if k not in keep)
    return (
        [shape[k] for k in keep],
        [dst_strides[k] for k in keep],
        src_offset,
        [src_strides[k] for k in keep],
    )


def gather(
    mv: memoryview, offset: int, strides: Sequence[int], shape: Sequence[int], itemsize: int
) -> bytearray:
    """The elements of a strided region, packed row-major into a new bytearray."""
    out = bytearray(math.prod(shape) * itemsize)
    copy_region(memoryview(out), 0, contiguous_strides(shape), mv, offset, strides, shape, itemsize)
    return out


def scatter(
    mv: memoryview,
    offset: int,
    strides: Sequence[int],
    shape: Sequence[int],
    itemsize: int,
    data: bytes | bytearray | memoryview,
) -> None:
    """Write row-major packed ``data`` into a strided region."""
    copy_region(
        mv,
        offset,
        strides,
        memoryview(data).cast("B"),
        0,
        contiguous_strides(shape),
        shape,
        itemsize,
    )
