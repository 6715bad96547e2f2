"""Shared hypothesis strategies and the pure-Python reference model of a strided layout.

A *layout* is ``(storage_size, offset, shape, strides)`` in elements, valid by construction: every
element it addresses lies in ``range(storage_size)``. Strides may be negative or zero, offsets
non-zero, shapes empty or 0-d. Tests build a tensorbridge tensor and a NumPy array over the same
storage values with that layout (``as_strided`` on both sides) and compare the two.

Index expressions mirror what ``Tensor.__getitem__`` accepts: ints, slices of either step sign,
``...``, ``None``, and integer or boolean index lists.

Nothing here imports NumPy or PyTorch: the strategies and the reference model run where only
pytest and hypothesis are installed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from hypothesis import strategies as st

import tensorbridge as tb
from tensorbridge import _codec, _dtype

MAX_DIMS = 4
MAX_SIDE = 4
MAX_STRIDE = 5


def _codec_handles(dtype: tb.dtype) -> bool:
    """True when the codec in this build packs and unpacks ``dtype`` (so the tests pick up new ones)."""
    try:
        return _codec.unpack(dtype, _codec.pack(dtype, [1])) == [1]
    except Exception:
        return False


#: Every dtype whose elements the codec can read and write, in `_dtype`'s order.
CODEC_DTYPES: tuple[tb.dtype, ...] = tuple(d for d in _dtype.ALL_DTYPES if _codec_handles(d))
#: The codec dtypes NumPy has natively (an ``__array_interface__`` typestr).
NUMPY_DTYPES: tuple[tb.dtype, ...] = tuple(d for d in CODEC_DTYPES if d.typestr is not None)


def dtypes(*, numpy: bool = True) -> st.SearchStrategy[tb.dtype]:
    """A dtype the codec supports (and NumPy too, by default)."""
    return st.sampled_from(NUMPY_DTYPES if numpy else CODEC_DTYPES)


def shapes(
    min_dims: int = 0, max_dims: int = MAX_DIMS, min_side: int = 0, max_side: int = MAX_SIDE
) -> st.SearchStrategy[tuple[int, ...]]:
    """Small shapes, 0-d and size-0 included."""
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(
        tuple
    )


class Layout(NamedTuple):
    """A strided layout over a 1-d storage of ``size`` elements (all in elements)."""

    size: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def offsets(self) -> list[int]:
        """The storage index of every element, row-major."""
        return element_offsets(self.offset, self.shape, self.strides)


def element_offsets(offset: int, shape: Sequence[int], strides: Sequence[int]) -> list[int]:
    """Storage index of each element of a layout, in row-major order (the reference model)."""
    return [
        offset + sum(i * s for i, s in zip(idx, strides))
        for idx in itertools.product(*(range(n) for n in shape))
    ]


@st.composite
def layouts(
    draw: st.DrawFn,
    shape: st.SearchStrategy[tuple[int, ...]] | None = None,
    min_stride: int = -MAX_STRIDE,
    max_stride: int = MAX_STRIDE,
    size: int | None = None,
) -> Layout:
    """A valid layout: random shape, strides of any sign (zero included), offset and slack.

    With ``size``, the layout fits a storage of exactly that many elements (strides that would not
    fit become 0, so the layout broadcasts instead).
    """
    shp = draw(shape if shape is not None else shapes())
    strides = [draw(st.integers(min_stride, max_stride)) for _ in shp]

    def span(k: int) -> int:
        return (shp[k] - 1) * strides[k] if shp[k] > 0 else 0

    while size is not None and sum(abs(span(k)) for k in range(len(shp))) >= size:
        strides[max(range(len(shp)), key=lambda k: abs(span(k)))] = 0
    low = sum(min(span(k), 0) for k in range(len(shp)))
    high = sum(max(span(k), 0) for k in range(len(shp)))
    if size is None:
        offset = -low + draw(st.integers(0, 3))
        size = offset + high + 1 + draw(st.integers(0, 3))
    else:
        offset = -low + draw(st.integers(0, size - 1 - (high - low)))
    return Layout(size, offset, shp, tuple(strides))


def contiguous_layouts(
    shape: st.SearchStrategy[tuple[int, ...]] | None = None,
) -> st.SearchStrategy[Layout]:
    """Row-major compact layouts at offset 0 (what a fresh tensor has)."""

    def build(shp: tuple[int, ...]) -> Layout:
        strides = tuple(math.prod(shp[i + 1 :]) for i in range(len(shp)))
        return Layout(max(math.prod(shp), 1), 0, shp, strides)

    return (shape if shape is not None else shapes()).map(build)


def storage_values(dtype: tb.dtype, size: int) -> list[Any]:
    """``size`` values exactly representable in ``dtype``, distinct where the dtype allows."""
    if dtype.kind == "b":
        return [i % 3 == 1 for i in range(size)]
    if dtype is tb.float4_e2m1fn_x2:  # packed pairs of FP4: the codec passes the raw bytes through
        return [i % 256 for i in range(size)]
    if dtype is tb.float8_e8m0fnu:  # powers of two only
        return [2.0 ** (i % 8 - 4) for i in range(size)]
    if dtype.kind == "f" and dtype.itemsize == 1:  # few mantissa bits, small ranges
        return [(i % 8) * 0.5 - 2.0 for i in range(size)]
    if dtype.kind == "c":
        return [complex(i, -i % 7) for i in range(size)]
    if dtype.kind == "f":
        return [i - size // 2 + 0.5 * (i % 2) for i in range(size)]
    if dtype.kind == "u" or dtype.itemsize == 1:
        return [i % 100 for i in range(size)]
    return [i - size // 2 for i in range(size)]


def strided_tensor(layout: Layout, dtype: tb.dtype = tb.int64) -> tb.Tensor:
    """A tensorbridge tensor with ``layout`` over `storage_values` (a view of a fresh 1-d tensor)."""
    base = tb.tensor(storage_values(dtype, layout.size), dtype=dtype)
    return base.as_strided(layout.shape, layout.strides, layout.offset)


def reference_tolist(values: Sequence[Any], layout: Layout) -> Any:
    """The nested list a layout over ``values`` holds (pure Python)."""
    flat = [values[o] for o in layout.offsets()]
    return nest(flat, layout.shape)


def nest(flat: Sequence[Any], shape: Sequence[int]) -> Any:
    """Row-major flat values as nested lists of ``shape`` (a scalar for ``()``)."""
    if not shape:
        return flat[0]
    step = math.prod(shape[1:])
    return [
        nest(flat[i * step : (i + 1) * step], shape[1:]) if len(shape) > 1 else flat[i]
        for i in range(shape[0])
    ]


# ----------------------------------------------------------------------------- index expressions
@dataclasses.dataclass(frozen=True)
class IndexArray:
    """An advanced index in a drawn key: an integer ``"array"`` or a boolean ``"mask"``.

    ``values`` are nested lists and ``shape`` their shape (lists alone cannot spell ``(0, 1)``);
    each test turns it into its library's index (`tb_key`, NumPy or PyTorch arrays).
    """

    kind: str
    values: list[Any]
    shape: tuple[int, ...]


def _slices(size: int, negative_steps: bool = True) -> st.SearchStrategy[slice]:
    bound = st.none() | st.integers(-size - 2, size + 2)
    step = st.none() | st.sampled_from([1, 2, 3, -1, -2, -3] if negative_steps else [1, 2, 3])
    return st.builds(slice, bound, bound, step)


def _ints(size: int) -> st.SearchStrategy[int]:
    return st.integers(-size, size - 1)


@st.composite
def _int_array(draw: st.DrawFn, size: int, shape: tuple[int, ...]) -> list[Any]:
    flat = [draw(_ints(size)) for _ in range(math.prod(shape))]
    return nest(flat, shape) if shape else flat


@st.composite
def basic_indices(draw: st.DrawFn, shape: tuple[int, ...], *, allow_bool: bool = True) -> Any:
    """A basic index (ints, slices, ``...``, ``None``, optionally Python bools) valid for ``shape``."""
    return draw(indices(shape, advanced=False, allow_bool=allow_bool))


@st.composite
def indices(
    draw: st.DrawFn,
    shape: tuple[int, ...],
    *,
    advanced: bool = True,
    allow_bool: bool = False,
    negative_steps: bool = True,
) -> Any:
    """An index expression for ``shape``: a tuple (or a lone item) that consumes at most ndim dims.

    With ``advanced``, some dims get an integer list (all lists in one key share a shape) or a boolean
    mask over one or two dims; a mask's True count may not broadcast with the lists, which both
    libraries must then refuse with IndexError. With ``allow_bool``, Python
    ``True``/``False`` may appear (only without advanced items: NumPy treats them as 0-d masks).
    ``negative_steps=False`` keeps slices PyTorch accepts.
    """
    ndim = len(shape)
    use_ellipsis = draw(st.booleans())
    consumed = draw(st.integers(0, ndim))
    front = draw(st.integers(0, consumed)) if use_ellipsis else consumed
    dims = list(range(front)) + list(range(ndim - (consumed - front), ndim))
    array_shape = draw(shapes(min_dims=1, max_dims=2, max_side=3))
    items: list[Any] = []
    k = 0
    while k < len(dims):
        d = dims[k]
        size = shape[d]
        choices = ["int", "slice", "slice"] if size else ["slice"]
        if advanced:
            choices += ["array"] if size else []
            choices += ["mask"]
            if k + 1 < len(dims) and dims[k + 1] == d + 1:
                choices += ["mask2"]
        kind = draw(st.sampled_from(choices))
        if kind == "int":
            items.append(draw(_ints(size)))
        elif kind == "slice":
            items.append(draw(_slices(size, negative_steps)))
        elif kind == "array":
            items.append(IndexArray("array", draw(_int_array(size, array_shape)), array_shape))
        else:
            mshape = (size,) if kind == "mask" else (size, shape[d + 1])
            flat = draw(
                st.lists(st.booleans(), min_size=math.prod(mshape), max_size=math.prod(mshape))
            )
            items.append(IndexArray("mask", nest_any(flat, mshape), mshape))
            k += len(mshape) - 1
        k += 1
    if use_ellipsis:
        items.insert(front_items(items, front), Ellipsis)
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), None)
    if allow_bool and not advanced:
        for _ in range(draw(st.integers(0, 1))):
            items.insert(draw(st.integers(0, len(items))), draw(st.booleans()))
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


def front_items(items: Sequence[Any], front_dims: int) -> int:
    """How many leading items consume the first ``front_dims`` dims (a 2-d mask consumes two)."""
    dims = 0
    for i, item in enumerate(items):
        if dims >= front_dims:
            return i
        dims += mask_ndim(item) if is_mask(item) else 1
    return len(items)


def is_mask(item: Any) -> bool:
    return isinstance(item, IndexArray) and item.kind == "mask"


def is_array(item: Any) -> bool:
    return isinstance(item, IndexArray) and item.kind == "array"


def mask_ndim(item: Any) -> int:
    return len(item.shape)


def nest_any(flat: Sequence[Any], shape: Sequence[int]) -> list[Any]:
    """`nest` that also builds empty shapes such as ``(2, 0)`` (as ``[[], []]``)."""
    if len(shape) == 1:
        return list(flat)
    step = math.prod(shape[1:])
    return [nest_any(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def has_advanced(key: Any) -> bool:
    """True when a key drawn from `indices` holds an index list or mask."""
    items = key if isinstance(key, tuple) else (key,)
    return any(is_mask(it) or is_array(it) for it in items)


def tb_key(key: Any, as_tensor: bool) -> Any:
    """A drawn key for tensorbridge: index lists as lists, or as int64/bool tensors."""

    def convert(item: Any) -> Any:
        if not (is_array(item) or is_mask(item)):
            return item
        # Nested lists cannot spell every empty shape ((0, 1) is just []), nor say "mask" when
        # empty; tensors can.
        if as_tensor or math.prod(item.shape) == 0:
            return tb.tensor(item.values, dtype=tb.bool if is_mask(item) else tb.int64).reshape(
                item.shape
            )
        return item.values

    return tuple(convert(it) for it in key) if isinstance(key, tuple) else convert(key)


# ----------------------------------------------------------------------------- shape arguments
@st.composite
def reshape_targets(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape with as many elements as ``shape``, sometimes with one ``-1`` to infer."""
    numel = math.prod(shape)
    if numel == 0:  # any shape holding a 0; no -1, which would be ambiguous
        dims = draw(st.lists(st.integers(0, 3), max_size=MAX_DIMS - 1))
        dims.insert(draw(st.integers(0, len(dims))), 0)
        return tuple(dims)
    factors: list[int] = []
    rest = numel
    while rest > 1 and len(factors) < MAX_DIMS:
        f = draw(st.sampled_from([d for d in range(2, rest + 1) if rest % d == 0]))
        factors.append(f)
        rest //= f
    if rest > 1:
        factors[-1] *= rest
    for _ in range(draw(st.integers(0, 2))):
        factors.insert(draw(st.integers(0, len(factors))), 1)
    factors = list(draw(st.permutations(factors)))
    if factors and draw(st.booleans()):
        factors[draw(st.integers(0, len(factors) - 1))] = -1
    return tuple(factors)


@st.composite
def expand_targets(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A valid ``expand`` target: size-1 dims grow, others keep (or say ``-1``), new leading dims."""
    out = [draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 2)))]
    for n in shape:
        if n == 1:
            out.append(draw(st.sampled_from([1, -1, 0, 2, 3])))
        else:
            out.append(draw(st.sampled_from([n, -1])))
    return tuple(out)


@st.composite
def broadcastable_shapes(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape`` (dims dropped from the front or set to 1)."""
    keep = draw(st.integers(0, len(shape)))
    tail = shape[len(shape) - keep :]
    return tuple(n if draw(st.booleans()) else 1 for n in tail)
