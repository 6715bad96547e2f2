"""Layout arithmetic (`tensorbridge._layout`): pure functions of shapes and strides.

Each function is checked against a brute-force model (the storage index of every element, row-major)
and, where a peer defines the same function, against NumPy or PyTorch on random layouts.
"""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests import strategies as S

import tensorbridge as tb
from tensorbridge import _layout


@pytest.fixture(scope="module")
def np():
    """NumPy, the reference for contiguity and broadcasting."""
    return pytest.importorskip("numpy")


@pytest.fixture(scope="module")
def torch():
    """PyTorch, the reference for view strides and messages."""
    return pytest.importorskip("torch")


# ----------------------------------------------------------------------------- Size, as_shape
def test_size_is_a_tuple_printed_like_torch():
    """Size is a tuple of ints with PyTorch's repr and numel(); it pickles as itself."""
    s = tb.Size([2, 3])
    assert s == (2, 3)
    assert isinstance(s, tuple)
    assert repr(s) == "tensorbridge.Size([2, 3])"
    assert repr(tb.Size([])) == "tensorbridge.Size([])"
    assert s.numel() == 6
    assert tb.Size([]).numel() == 1
    assert pickle.loads(pickle.dumps(s)) == s


@pytest.mark.parametrize(
    ("args", "shape"),
    [
        ((2, 3), (2, 3)),
        (((2, 3),), (2, 3)),
        (([2, 3],), (2, 3)),
        ((), ()),
        (((),), ()),
        ((tb.Size([4]),), (4,)),
        ((0,), (0,)),
    ],
)
def test_as_shape_accepts_pytorch_spellings(args, shape):
    """as_shape takes f(2, 3), f((2, 3)), f([2, 3]) and f(Size) alike."""
    assert _layout.as_shape(args, "zeros") == shape


@pytest.mark.parametrize(
    ("args", "exc", "text"),
    [
        ((2.0,), TypeError, "zeros(): size must be a sequence of ints; got 2.0 (float)"),
        ((2, "3"), TypeError, "zeros(): each size must be an int; got '3' (str)"),
        ((True,), TypeError, "zeros(): each size must be an int; got True (bool)"),
        ((2, -1), ValueError, "Trying to create tensor with negative dimension -1: [2, -1]"),
        (((1,) * 65,), ValueError, "at most 64 dimensions are supported; got 65"),
    ],
)
def test_as_shape_errors(args, exc, text):
    """Bad sizes name the function and the value; negative sizes keep PyTorch's text."""
    with pytest.raises(exc) as info:
        _layout.as_shape(args, "zeros")
    assert text in str(info.value)


# ----------------------------------------------------------------------------- strides, contiguity
@given(shape=S.shapes(max_dims=5))
def test_contiguous_strides_enumerate_row_major(shape):
    """Row-major strides visit storage 0, 1, 2, ... in row-major order."""
    strides = _layout.contiguous_strides(shape)
    assert S.element_offsets(0, shape, strides) == list(range(math.prod(shape)))
    assert _layout.is_contiguous(shape, strides)


@given(layout=S.layouts())
def test_is_contiguous_means_row_major_compact(layout):
    """is_contiguous is True exactly when the elements sit at offset, offset + 1, ... in order."""
    offsets = layout.offsets()
    compact = offsets == list(range(layout.offset, layout.offset + len(offsets)))
    assert _layout.is_contiguous(layout.shape, layout.strides) == compact


@given(layout=S.layouts())
def test_is_contiguous_matches_numpy_flags(np, layout):
    """is_contiguous agrees with NumPy's C_CONTIGUOUS flag (size-1 dims may have any stride)."""
    base = np.zeros(layout.size, dtype=np.int32)
    view = np.lib.stride_tricks.as_strided(
        base[layout.offset :], layout.shape, [4 * s for s in layout.strides]
    )
    assert _layout.is_contiguous(layout.shape, layout.strides) == view.flags.c_contiguous


@given(layout=S.layouts())
def test_extent_is_the_lowest_and_highest_element(layout):
    """extent() is (min, max) of the element indices, or None when there is no element."""
    offsets = layout.offsets()
    want = (min(offsets), max(offsets)) if offsets else None
    assert _layout.extent(layout.offset, layout.shape, layout.strides) == want


@given(layout=S.layouts(), itemsize=st.sampled_from([2, 4, 8]), data=st.data())
def test_element_strides_reach_the_same_elements(layout, itemsize, data):
    """Byte strides become item strides that reach the same elements; a stride that addresses
    nothing (a size-1 dimension's, any of an empty layout) may be any byte count, and becomes the
    row-major stride when it is not whole items; one that addresses memory must be whole items."""
    idle = [0 in layout.shape or n == 1 for n in layout.shape]
    odd = [data.draw(st.integers(0, itemsize - 1)) for _ in layout.shape]
    byte_strides = [s * itemsize + o for s, o in zip(layout.strides, odd, strict=True)]
    got = _layout.element_strides(layout.shape, byte_strides, itemsize)
    if any(o and not i for o, i in zip(odd, idle, strict=True)):
        assert got is None
        return
    row_major = _layout.contiguous_strides(layout.shape)
    assert got == tuple(
        r if o else s for s, o, r in zip(layout.strides, odd, row_major, strict=True)
    )
    assert S.element_offsets(layout.offset, layout.shape, got) == layout.offsets()


def test_extent_uses_python_ints():
    """Huge strides do not wrap: the extent is exact."""
    assert _layout.extent(0, (3,), (2**62,)) == (0, 2**63)
    assert _layout.extent(2**63, (2, 2), (-(2**62), -(2**62))) == (0, 2**63)


# ----------------------------------------------------------------------------- dims
@pytest.mark.parametrize(
    ("dim", "ndim", "want"), [(0, 3, 0), (-1, 3, 2), (2, 3, 2), (-3, 3, 0), (0, 0, 0), (-1, 0, 0)]
)
def test_normalize_dim_wraps(dim, ndim, want):
    """Negative dims count from the end; a 0-d tensor accepts 0 and -1 (PyTorch's rule)."""
    assert _layout.normalize_dim(dim, ndim, "f") == want


@pytest.mark.parametrize(
    ("dim", "ndim", "exc", "text"),
    [
        (
            3,
            3,
            IndexError,
            "f(): Dimension out of range (expected to be in range of [-3, 2], but got 3)",
        ),
        (
            -4,
            3,
            IndexError,
            "Dimension out of range (expected to be in range of [-3, 2], but got -4)",
        ),
        (
            1,
            0,
            IndexError,
            "Dimension out of range (expected to be in range of [-1, 0], but got 1)",
        ),
        (1.0, 3, TypeError, "f(): dim must be an int; got 1.0 (float)"),
        (True, 3, TypeError, "dim must be an int; got True"),
    ],
)
def test_normalize_dim_errors(dim, ndim, exc, text):
    """Out-of-range dims are IndexError with PyTorch's text; non-ints are TypeError."""
    with pytest.raises(exc) as info:
        _layout.normalize_dim(dim, ndim, "f")
    assert text in str(info.value)


def test_normalize_dim_without_scalar_wrap():
    """Operations that need a real dimension refuse 0-d tensors with PyTorch's text."""
    with pytest.raises(
        IndexError, match="f\\(\\): Dimension specified as 0 but tensor has no dimensions"
    ):
        _layout.normalize_dim(0, 0, "f", scalar_ok=False)


# ----------------------------------------------------------------------------- infer_shape
@given(shape=S.shapes(max_dims=4), data=st.data())
def test_infer_shape_resolves_minus_one(shape, data):
    """infer_shape fills a -1 so that the element count is kept, and keeps explicit sizes."""
    target = data.draw(S.reshape_targets(shape))
    result = _layout.infer_shape(math.prod(shape), target, "view")
    assert math.prod(result) == math.prod(shape)
    assert all(t in (-1, r) for t, r in zip(target, result, strict=True))


@pytest.mark.parametrize(
    ("numel", "shape", "text"),
    [
        (6, (2, 5), "view(): shape '[2, 5]' is invalid for input of size 6"),
        (6, (4, -1), "shape '[4, -1]' is invalid for input of size 6"),
        (6, (0, -1), "shape '[0, -1]' is invalid for input of size 6"),
        (6, (-1, -1), "only one dimension can be inferred"),
        (6, (-2, 3), "invalid shape dimension -2 at index 0 of shape [-2, 3]"),
        (
            0,
            (-1, 0),
            "cannot reshape tensor of 0 elements into shape [-1, 0] because the unspecified "
            "dimension size -1 can be any value and is ambiguous",
        ),
    ],
)
def test_infer_shape_errors(numel, shape, text):
    """Impossible shapes are RuntimeError (PyTorch's type) carrying PyTorch's text."""
    with pytest.raises(RuntimeError) as info:
        _layout.infer_shape(numel, shape, "view")
    assert text in str(info.value)


@pytest.mark.parametrize("shape", [(2, 5), (4, -1), (0, -1), (-1, -1), (-2, 3), (-1, 0), (7,)])
@pytest.mark.parametrize("numel", [0, 6])
def test_infer_shape_fails_where_torch_fails(torch, numel, shape):
    """infer_shape refuses exactly what torch.reshape refuses, with torch's message inside ours."""
    try:
        want = tuple(torch.zeros(numel).view(*shape).shape)
    except RuntimeError as exc:
        torch_message = str(exc).split("\n")[0]
    else:
        assert _layout.infer_shape(numel, shape, "view") == want
        return
    with pytest.raises(RuntimeError) as info:
        _layout.infer_shape(numel, shape, "view")
    assert torch_message in str(info.value)


# ----------------------------------------------------------------------------- view_strides
@given(layout=S.layouts(), data=st.data())
def test_view_strides_keep_the_element_order(layout, data):
    """When view_strides succeeds, the new layout lists the same elements in the same order."""
    target = _layout.infer_shape(
        math.prod(layout.shape), data.draw(S.reshape_targets(layout.shape)), "view"
    )
    strides = _layout.view_strides(layout.shape, layout.strides, target)
    if strides is not None:
        assert S.element_offsets(layout.offset, target, strides) == layout.offsets()


@given(layout=S.layouts(), data=st.data())
def test_view_strides_always_exist_for_contiguous_layouts(layout, data):
    """A row-major compact layout can be viewed as any shape of the same size."""
    shape = layout.shape
    target = _layout.infer_shape(math.prod(shape), data.draw(S.reshape_targets(shape)), "view")
    assert _layout.view_strides(shape, _layout.contiguous_strides(shape), target) is not None


@given(layout=S.layouts(min_stride=0), data=st.data())
def test_view_strides_match_torch(torch, layout, data):
    """view_strides succeeds exactly when torch.view does, with torch's strides."""
    target = _layout.infer_shape(
        math.prod(layout.shape), data.draw(S.reshape_targets(layout.shape)), "view"
    )
    x = torch.zeros(layout.size).as_strided(layout.shape, layout.strides, layout.offset)
    ours = _layout.view_strides(layout.shape, layout.strides, target)
    try:
        want = x.view(target).stride()
    except RuntimeError:
        assert ours is None
    else:
        assert ours == want


# ----------------------------------------------------------------------------- broadcasting
@given(shapes=st.lists(S.shapes(max_side=3), min_size=1, max_size=3))
def test_broadcast_shapes_match_numpy(np, shapes):
    """broadcast_shapes equals np.broadcast_shapes, and fails where NumPy fails."""
    try:
        want = np.broadcast_shapes(*shapes)
    except ValueError:
        with pytest.raises(ValueError, match="shape mismatch: objects cannot be broadcast"):
            _layout.broadcast_shapes(*shapes)
    else:
        assert _layout.broadcast_shapes(*shapes) == want


@given(layout=S.layouts(), data=st.data())
def test_expand_strides_repeat_size_one_dims(layout, data):
    """expand_strides gives stride 0 to grown dims and keeps the others; a new leading dim of
    size 1 continues the stride after it (its size times its stride), as PyTorch's expand
    infers the geometry, except over a 0-d tensor, whose new dims all have stride 0."""
    target = data.draw(S.expand_targets(layout.shape))
    strides = _layout.expand_strides(layout.shape, layout.strides, target, "expand")
    lead = len(target) - len(layout.shape)
    shape = [t if t != -1 else layout.shape[i - lead] for i, t in enumerate(target)]
    for i, (size, stride) in enumerate(zip(shape, strides, strict=True)):
        if i < lead:
            if size != 1 or not layout.shape:
                assert stride == 0
            else:
                assert stride == shape[i + 1] * strides[i + 1]
        elif layout.shape[i - lead] != size:
            assert stride == 0
        else:
            assert stride == layout.strides[i - lead]


@pytest.mark.parametrize(
    ("shape", "target", "text"),
    [
        (
            (2, 3),
            (2, 4),
            "The expanded size of the tensor (4) must match the existing size (3) at non-singleton "
            "dimension 1.  Target sizes: [2, 4].  Tensor sizes: [2, 3]",
        ),
        (
            (2, 3),
            (3,),
            "the number of sizes provided (1) must be greater or equal to the number of dimensions "
            "in the tensor (2)",
        ),
        (
            (3,),
            (-1, 3),
            "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing "
            "dimension 0",
        ),
    ],
)
def test_expand_strides_errors(shape, target, text):
    """expand mismatches are RuntimeError (PyTorch's type) with PyTorch's text."""
    with pytest.raises(RuntimeError) as info:
        _layout.expand_strides(shape, _layout.contiguous_strides(shape), target, "expand")
    assert text in str(info.value)


@given(layout=S.layouts(), other=st.lists(st.integers(-4, 4), max_size=4))
def test_coalesce_keeps_every_element_pair(layout, other):
    """coalesce merges dims without changing which elements pair up in two layouts."""
    strides2 = tuple((other + [1] * 4)[: len(layout.shape)])
    shape, (s1, s2) = _layout.coalesce(layout.shape, layout.strides, strides2)
    assert math.prod(shape) == math.prod(layout.shape)
    assert S.element_offsets(0, shape, s1) == S.element_offsets(0, layout.shape, layout.strides)
    assert S.element_offsets(0, shape, s2) == S.element_offsets(0, layout.shape, strides2)
