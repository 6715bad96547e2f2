"""Indexing: ``t[key]`` and ``t[key] = value`` on every layout, against NumPy and a list model.

Index semantics are PyTorch's: basic items (ints, slices, ``...``, ``None``) apply first and give a
view; integer and boolean index tensors or lists then gather a copy, placed by NumPy's adjacency rule
on the dims that remain. (NumPy differs when an int sits between index arrays; the NumPy reference
below applies the two steps explicitly, so it computes PyTorch's result.) Negative slice steps are a
tensorbridge extension.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests import strategies as S

import tensorbridge as tb


@pytest.fixture(scope="module")
def np():
    """NumPy, the reference for values (imported once, outside hypothesis' deadline)."""
    return pytest.importorskip("numpy")


@pytest.fixture(scope="module")
def torch():
    """PyTorch, the reference for semantics and messages."""
    return pytest.importorskip("torch")


# ----------------------------------------------------------------------------- reference models
def _expand_ellipsis(items: list[Any], ndim: int) -> list[Any]:
    """Replace ``...`` with the full slices it stands for."""
    consumed = sum(
        S.mask_ndim(it) if S.is_mask(it) else 1
        for it in items
        if it is not None and it is not Ellipsis and not isinstance(it, bool)
    )
    out: list[Any] = []
    for it in items:
        out.extend([slice(None)] * (ndim - consumed) if it is Ellipsis else [it])
    return out


def _list_getitem(
    nested: Any, shape: tuple[int, ...], items: list[Any]
) -> tuple[Any, tuple[int, ...]]:
    """Basic indexing of nested Python lists, using Python's own slice semantics: (value, shape)."""
    if not items:
        return nested, shape
    head, rest = items[0], items[1:]
    if head is None or head is True:
        value, sub = _list_getitem(nested, shape, rest)
        return [value], (1, *sub)
    if head is False:
        _, sub = (
            _list_getitem(nested, shape, rest)
            if math.prod(shape)
            else (None, _shape_only(shape, rest))
        )
        return [], (0, *sub)
    if isinstance(head, int):
        return _list_getitem(nested[head], shape[1:], rest)
    picked = nested[head]
    length = len(range(*head.indices(shape[0])))
    if not picked:
        return [], (length, *_shape_only(shape[1:], rest))
    parts = [_list_getitem(sub, shape[1:], rest) for sub in picked]
    return [p[0] for p in parts], (length, *parts[0][1])


def _shape_only(shape: tuple[int, ...], items: list[Any]) -> tuple[int, ...]:
    """The shape `_list_getitem` gives, for layouts holding no element."""
    out: list[int] = []
    d = 0
    for it in items:
        if it is None or it is True:
            out.append(1)
        elif it is False:
            out.append(0)
        elif isinstance(it, int):
            d += 1
        else:
            out.append(len(range(*it.indices(shape[d]))))
            d += 1
    return (*out, *shape[d:])


def _reference_basic(values: list[Any], layout: S.Layout, key: Any) -> tuple[Any, tuple[int, ...]]:
    items = list(key) if isinstance(key, tuple) else [key]
    items = _expand_ellipsis(items, len(layout.shape))
    nested = S.reference_tolist(values, layout) if math.prod(layout.shape) else None
    if nested is None:
        return [] if _shape_only(layout.shape, items) else None, _shape_only(layout.shape, items)
    return _list_getitem(nested, layout.shape, items)


def _np_key_parts(np: Any, key: Any, ndim: int) -> tuple[tuple[Any, ...], list[tuple[int, Any]]]:
    """Split a drawn key into PyTorch's two steps: a basic key, then (position, array) pairs."""
    items = _expand_ellipsis(list(key) if isinstance(key, tuple) else [key], ndim)
    basic: list[Any] = []
    arrays: list[tuple[int, Any]] = []
    out_dim = 0
    for it in items:
        if S.is_array(it):
            arrays.append((out_dim, np.asarray(it.values, dtype=np.intp).reshape(it.shape)))
            basic.append(slice(None))
            out_dim += 1
        elif S.is_mask(it):
            mask = np.asarray(it.values, dtype=bool).reshape(it.shape)
            arrays.append((out_dim, mask))
            basic.extend([slice(None)] * mask.ndim)
            out_dim += mask.ndim
        elif isinstance(it, slice) or it is None or it is True or it is False:
            basic.append(it)
            out_dim += 1
        else:
            basic.append(it)
    return tuple(basic), arrays


def _np_second_key(ndim: int, arrays: list[tuple[int, Any]]) -> tuple[Any, ...]:
    key: list[Any] = []
    d = 0
    for pos, arr in arrays:
        key.extend([slice(None)] * (pos - d))
        key.append(arr)
        d = pos + (arr.ndim if arr.dtype == bool else 1)
    key.extend([slice(None)] * (ndim - d))
    return tuple(key)


def np_getitem(np: Any, arr: Any, key: Any) -> Any:
    """``arr[key]`` with PyTorch's semantics, computed with NumPy (see the module docstring)."""
    basic, arrays = _np_key_parts(np, key, arr.ndim)
    view = arr[
        (*basic, Ellipsis)
    ]  # the trailing ... keeps a 0-d result an array view, not a scalar
    if not arrays:
        return view
    return view[_np_second_key(view.ndim, arrays)]


def np_setitem(np: Any, arr: Any, key: Any, value: Any) -> None:
    """``arr[key] = value`` with PyTorch's semantics, computed with NumPy."""
    basic, arrays = _np_key_parts(np, key, arr.ndim)
    view = arr[(*basic, Ellipsis)]
    if not arrays:
        view[...] = value
    else:
        view[_np_second_key(view.ndim, arrays)] = value


def np_strided(np: Any, layout: S.Layout, dtype: tb.dtype) -> tuple[Any, Any]:
    """(base, view): a NumPy array over `S.storage_values` and its ``as_strided`` view."""
    base = np.array(S.storage_values(dtype, layout.size), dtype=np.dtype(dtype.typestr))
    item = base.itemsize
    view = np.lib.stride_tricks.as_strided(
        base[layout.offset :], layout.shape, [s * item for s in layout.strides]
    )
    return base, view


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except IndexError as exc:
        return "IndexError", exc


# ----------------------------------------------------------------------------- __getitem__
@given(layout=S.layouts(), data=st.data())
def test_basic_indexing_matches_list_model(layout, data):
    """Basic indexing of any layout equals indexing nested Python lists, and is a view."""
    key = data.draw(S.basic_indices(layout.shape))
    values = S.storage_values(tb.int64, layout.size)
    t = S.strided_tensor(layout)
    result = t[key]
    expected_value, expected_shape = _reference_basic(values, layout, key)
    assert tuple(result.shape) == expected_shape
    if math.prod(expected_shape):
        assert result.tolist() == expected_value
    items = key if isinstance(key, tuple) else (key,)
    # A Python bool is an advanced index (PyTorch 2.13): the result is then a copy.
    has_bool = any(isinstance(it, bool) for it in items)
    assert (result._storage is t._storage) is not has_bool


@given(layout=S.layouts(), dtype=S.dtypes(), data=st.data())
def test_indexing_matches_numpy(np, layout, dtype, data):
    """Any index expression on any layout gives NumPy's values and shape (PyTorch's placement)."""
    key = data.draw(S.indices(layout.shape))
    as_tensor = data.draw(st.booleans())
    _, view = np_strided(np, layout, dtype)
    t = S.strided_tensor(layout, dtype)
    want = _outcome(lambda: np_getitem(np, view, key))
    got = _outcome(lambda: t[S.tb_key(key, as_tensor)])
    assert got[0] == want[0], (got, want)
    if want[0] == "ok":
        assert tuple(got[1].shape) == want[1].shape
        assert got[1].dtype is dtype
        assert got[1].tolist() == want[1].tolist()


@given(layout=S.layouts(), data=st.data())
def test_basic_index_aliases_and_advanced_index_copies(np, layout, data):
    """A basic index returns a view (writes reach the base); an index list returns a copy."""
    key = data.draw(S.indices(layout.shape))
    base_np, view_np = np_strided(np, layout, tb.int64)
    base = tb.tensor(S.storage_values(tb.int64, layout.size), dtype=tb.int64)
    t = base.as_strided(layout.shape, layout.strides, layout.offset)
    try:
        result = t[S.tb_key(key, as_tensor=False)]
    except IndexError:
        return
    result.fill_(-99)
    if S.has_advanced(key):
        assert base.tolist() == base_np.tolist()
        assert result._storage is not base._storage
    else:
        np_getitem(np, view_np, key)[...] = -99
        assert base.tolist() == base_np.tolist()


@pytest.mark.parametrize(
    ("key", "shape"),
    [
        (
            (0, slice(None), [0, 1]),
            (3, 2),
        ),  # int, then a list: PyTorch's (3, 2), not NumPy's (2, 3)
        ((slice(None), [0], Ellipsis, [0]), (2, 1)),  # an empty ... keeps the lists adjacent
        (([[0], [1]], slice(None), [0, 1, 2]), (2, 3, 3)),
        ((None, [0, 1], [1, 2]), (1, 2, 4)),
        (([0, 1], None, [1, 2]), (2, 1, 4)),
        ((Ellipsis, None), (2, 3, 4, 1)),
        ((None, 1), (1, 3, 4)),
        ((slice(None, None, -1), 0, slice(1, None, 2)), (2, 2)),
    ],
)
def test_index_placement_follows_pytorch(key, shape):
    """Result shapes follow PyTorch for mixed basic and advanced keys."""
    assert tuple(tb.arange(24).reshape(2, 3, 4)[key].shape) == shape


@given(shape=S.shapes(max_dims=3), data=st.data())
def test_indexing_matches_torch(torch, shape, data):
    """On a contiguous tensor, every index expression gives PyTorch's shape and values."""
    key = data.draw(S.indices(shape, negative_steps=False))
    n = math.prod(shape)
    t = tb.arange(n).reshape(shape)
    x = torch.arange(n).reshape(shape)

    def torch_key(item: Any) -> Any:
        if S.is_array(item):
            return torch.tensor(item.values, dtype=torch.int64).reshape(item.shape)
        if S.is_mask(item):
            return torch.tensor(item.values, dtype=torch.bool).reshape(item.shape)
        return item

    tkey = tuple(torch_key(i) for i in key) if isinstance(key, tuple) else torch_key(key)
    try:
        want: Any = x[tkey]
    except IndexError:
        with pytest.raises(IndexError):
            t[S.tb_key(key, as_tensor=True)]
        return
    got = t[S.tb_key(key, as_tensor=True)]
    assert tuple(got.shape) == tuple(want.shape)
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("layout_case", ["0-d int tensor", "0-d bool tensor", "numpy 0-d int"])
def test_zero_d_index_tensor_acts_as_scalar(layout_case):
    """A 0-d integer index tensor selects like an int (a view); a 0-d bool adds a dim, like True."""
    t = tb.arange(24).reshape(2, 3, 4)
    if layout_case == "0-d int tensor":
        r = t[tb.tensor(1)]
        assert tuple(r.shape) == (3, 4)
        assert r._storage is t._storage
        assert r.storage_offset() == 12
    elif layout_case == "0-d bool tensor":
        assert tuple(t[tb.tensor(True)].shape) == (1, 2, 3, 4)
        assert tuple(t[tb.tensor(False)].shape) == (0, 2, 3, 4)
    else:
        np = pytest.importorskip("numpy")
        assert t[np.array(1), 2].tolist() == [20, 21, 22, 23]


def test_negative_steps_view_backwards():
    """Negative slice steps (a tensorbridge extension) give negative strides over the same memory."""
    t = tb.arange(10)
    r = t[::-3]
    assert r.tolist() == [9, 6, 3, 0]
    assert r.stride() == (-3,)
    assert r.storage_offset() == 9
    assert r.data_ptr() == t.data_ptr() + 9 * 8
    assert t[7:2:-2].tolist() == [7, 5, 3]
    assert t[2:7:-1].tolist() == []


def test_index_lists_of_each_kind():
    """Integer lists, bool lists, int64/int32/bool tensors and NumPy arrays index alike."""
    t = tb.arange(6)
    for key in (
        [4, 0, -1],
        tb.tensor([4, 0, -1]),
        tb.tensor([4, 0, 5], dtype=tb.int32),
    ):
        assert t[key].tolist() == [4, 0, 5]
    mask = [True, False, True, False, False, True]
    assert t[mask].tolist() == [0, 2, 5]
    assert t[tb.tensor(mask)].tolist() == [0, 2, 5]
    assert t[[]].tolist() == []
    np = pytest.importorskip("numpy")
    assert t[np.array([1, 1])].tolist() == [1, 1]
    assert t[np.array(mask)].tolist() == [0, 2, 5]


def test_two_d_mask_and_index_tensor_shapes():
    """A 2-d mask consumes two dims; a 2-d index tensor adds its shape."""
    t = tb.arange(24).reshape(2, 3, 4)
    mask = [[True, False, True], [False, True, False]]
    assert t[mask].tolist() == [[0, 1, 2, 3], [8, 9, 10, 11], [16, 17, 18, 19]]
    assert tuple(t[:, [[0, 1], [2, 0]]].shape) == (2, 2, 2, 4)


# ----------------------------------------------------------------------------- __setitem__
def _castable(src: tb.dtype, dst: tb.dtype) -> bool:
    """Casts whose result NumPy and PyTorch agree on for the values `S.storage_values` makes."""
    if dst.kind == "u":
        return src.kind in "bu"
    if dst.kind in "bc":
        return True
    return src.kind != "c"


@given(layout=S.layouts(), dtype=S.dtypes(), data=st.data())
def test_setitem_matches_numpy(np, layout, dtype, data):
    """``t[key] = value`` writes what NumPy writes, for scalars, lists and tensors, broadcasting."""
    key = data.draw(S.indices(layout.shape))
    base_np, view_np = np_strided(np, layout, dtype)
    base = tb.tensor(S.storage_values(dtype, layout.size), dtype=dtype)
    t = base.as_strided(layout.shape, layout.strides, layout.offset)
    try:
        target = np_getitem(np, view_np, key)
    except IndexError:
        with pytest.raises(IndexError):
            t[S.tb_key(key, as_tensor=False)] = 1
        return
    offsets = np_getitem(
        np,
        np.lib.stride_tricks.as_strided(
            np.arange(layout.size)[layout.offset :], layout.shape, [s * 8 for s in layout.strides]
        ),
        key,
    )
    unique = len(set(offsets.ravel().tolist())) == offsets.size
    form = data.draw(
        st.sampled_from(["scalar", "list", "tensor", "other dtype"])
        if unique
        else st.just("scalar")
    )
    if form == "scalar":
        value: Any = S.storage_values(dtype, 7)[data.draw(st.integers(0, 6))]
        np_value: Any = value
    else:
        vshape = data.draw(S.broadcastable_shapes(target.shape))
        src_dtype = (
            dtype
            if form != "other dtype"
            else data.draw(S.dtypes().filter(lambda d: _castable(d, dtype)))
        )
        flat = S.storage_values(src_dtype, math.prod(vshape) + 3)[3:]
        np_value = np.array(flat, dtype=np.dtype(src_dtype.typestr)).reshape(vshape)
        value = S.nest(flat, vshape) if vshape else flat[0]
        if form != "list" or 0 in vshape:  # nested lists cannot spell (0, 1)
            value = tb.tensor(flat, dtype=src_dtype).reshape(vshape)
            if form == "other dtype" and S.has_advanced(key):
                # PyTorch's index_put_ takes only its own dtype (test_advanced_assignment_...).
                value = value.to(dtype)
    tb_key = S.tb_key(key, as_tensor=data.draw(st.booleans()))
    if not unique and not S.has_advanced(key):
        # PyTorch (unlike NumPy) refuses to write a scalar through copy_ into a view whose
        # elements share memory through a stride 0.
        try:
            t[tb_key] = value
        except RuntimeError as exc:
            message = str(exc)
        else:
            message = ""
        if message:
            assert "more than one element of the written-to tensor" in message
            return
    np_setitem(np, view_np, key, np_value)
    t[tb_key] = value
    assert base.tolist() == base_np.tolist()


@given(layout=S.layouts(), data=st.data())
def test_setitem_from_overlapping_view_of_itself(np, layout, data):
    """``t[key] = t[other]`` reads the whole source before writing, like NumPy."""
    key = data.draw(S.basic_indices(layout.shape, allow_bool=False))
    base_np, view_np = np_strided(np, layout, tb.int64)
    base = tb.tensor(S.storage_values(tb.int64, layout.size), dtype=tb.int64)
    t = base.as_strided(layout.shape, layout.strides, layout.offset)
    target_np = np_getitem(np, view_np, key)
    offsets = np_getitem(
        np,
        np.lib.stride_tricks.as_strided(
            np.arange(layout.size)[layout.offset :], layout.shape, [s * 8 for s in layout.strides]
        ),
        key,
    )
    if len(set(offsets.ravel().tolist())) != offsets.size:
        return  # aliased destination elements: the written value is order-dependent
    src_layout = data.draw(S.layouts(shape=st.just(target_np.shape), size=layout.size))
    src_np = np.lib.stride_tricks.as_strided(
        base_np[src_layout.offset :], src_layout.shape, [s * 8 for s in src_layout.strides]
    )
    src = base.as_strided(src_layout.shape, src_layout.strides, src_layout.offset)
    target_np[...] = src_np.copy()
    t[key] = src
    assert base.tolist() == base_np.tolist()


def test_setitem_value_forms():
    """Scalars, nested lists, tensors of another dtype and leading size-1 dims all broadcast in."""
    t = tb.zeros(2, 3, dtype=tb.int32)
    t[0] = 7
    t[1] = [1, 2, 3]
    assert t.tolist() == [[7, 7, 7], [1, 2, 3]]
    t[:, 1:] = tb.tensor([[4.7], [-5.2]])
    assert t.tolist() == [[7, 4, 4], [1, -5, -5]]
    t[...] = tb.tensor([[[9, 8, 7]]])  # leading size-1 dims are dropped, as NumPy and PyTorch do
    assert t.tolist() == [[9, 8, 7], [9, 8, 7]]
    t[[0, 1], [2, 0]] = tb.tensor([1, 0], dtype=tb.int32)
    assert t.tolist() == [[9, 8, 1], [0, 8, 7]]
    t[tb.tensor([[True, False, False], [False, False, True]])] = -1
    assert t.tolist() == [[-1, 8, 1], [0, 8, -1]]


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("key", "exc", "text"),
    [
        (6, IndexError, "index 6 is out of bounds for dimension 0 with size 6"),
        (-7, IndexError, "index -7 is out of bounds for dimension 0 with size 6"),
        ((0, 0), IndexError, "too many indices for tensor of dimension 1"),
        (([0, 1], [0]), IndexError, "too many indices for tensor of dimension 1"),
        ([0, 6], IndexError, "index 6 is out of bounds for dimension 0 with size 6"),
        (tb.tensor([-7]), IndexError, "index -7 is out of bounds for dimension 0 with size 6"),
        (
            [True, False],
            IndexError,
            "The shape of the mask [2] at index 0 does not match the shape of the indexed tensor [6] at index 0",
        ),
        (
            1.0,
            IndexError,
            "only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are "
            "valid indices",
        ),
        ("a", IndexError, "valid indices; got 'a' (str)"),
        (
            tb.tensor([1.0]),
            IndexError,
            "tensors used as indices must be long, int, byte or bool tensors",
        ),
        ([[0.5]], IndexError, "tensors used as indices must be long, int, byte or bool tensors"),
        (["x"], IndexError, "index lists must hold ints or bools"),
        (slice(None, None, 0), ValueError, "slice step cannot be zero"),
        (slice(0.5, None), TypeError, "slice indices must be integers or None"),
        ((Ellipsis, Ellipsis), IndexError, "an index can only have a single ellipsis"),
    ],
)
def test_getitem_errors(key, exc, text):
    """Bad keys raise the documented type with PyTorch's text and the offending value."""
    with pytest.raises(exc) as info:
        tb.arange(6)[key]
    assert text in str(info.value)
    assert str(info.value).startswith(("__getitem__()", "index "))


def test_index_tensors_that_do_not_broadcast():
    """Index tensors of incompatible shapes: IndexError with PyTorch's text, for get and set."""
    t = tb.zeros(3, 3)
    text = "shape mismatch: indexing tensors could not be broadcast together with shapes [2], [3]"
    with pytest.raises(IndexError, match=r"__getitem__\(\): shape mismatch") as info:
        t[[0, 1], [0, 1, 2]]
    assert text in str(info.value)
    with pytest.raises(IndexError) as info:
        t[[0, 1], [0, 1, 2]] = 1
    assert text in str(info.value)


def test_setitem_errors():
    """Shape mismatches and unconvertible values fail with expand's text, before any write."""
    t = tb.zeros(2, 3)
    with pytest.raises(
        RuntimeError,
        match=r"__setitem__\(\): The expanded size of the tensor \(3\) must match "
        r"the existing size \(2\) at non-singleton dimension 1",
    ):
        t[...] = tb.zeros(2)
    with pytest.raises(RuntimeError, match="the number of sizes provided"):
        t[0] = tb.zeros(2, 3)
    with pytest.raises(TypeError, match="Could not infer dtype of str"):
        t[0] = ["a", "b", "c"]
    with pytest.raises(IndexError, match="out of bounds"):
        t[5] = 1
    assert t.tolist() == [[0.0] * 3] * 2


def test_zero_d_indexing():
    """A 0-d tensor accepts ``...``, ``None`` and bools; an int is 'too many indices'."""
    t = tb.tensor(5)
    assert t[...].tolist() == 5
    assert tuple(t[None].shape) == (1,)
    assert tuple(t[True].shape) == (1,)
    assert tuple(t[False].shape) == (0,)
    with pytest.raises(IndexError, match="too many indices for tensor of dimension 0"):
        t[0]
    t[...] = 6
    assert t.item() == 6


# ----------------------------------------------------------------------------- PyTorch 2.13 rules
def test_python_bool_next_to_advanced_indices_is_an_index():
    """A bool beside index lists or tensors is an index of shape (1,) or (0,) that broadcasts."""
    x = tb.arange(12).reshape(3, 4)
    assert x[[1], True].tolist() == [[4, 5, 6, 7]]
    assert tuple(x[[[0], [1]], True].shape) == (2, 1, 4)
    assert x[tb.tensor([0, 1]), True, [1]].tolist() == [1, 5]
    assert tuple(x[True, :, True].shape) == (1, 3, 4)  # two bools: one index dim, as in PyTorch
    for key in (([0, 1], False), (tb.tensor([0, 1]), False, 1), (True, [1, 2], False)):
        with pytest.raises(IndexError, match="shape mismatch: indexing tensors could not be"):
            x[key]
        with pytest.raises(IndexError, match="shape mismatch"):
            x[key] = 7
    x[[1], True] = 7
    assert x.tolist() == [[0, 1, 2, 3], [7, 7, 7, 7], [8, 9, 10, 11]]


def test_bool_index_copies_and_none_strides_follow_unsqueeze():
    """``t[True]`` is a copy (an advanced index, as in PyTorch); ``None`` inserts unsqueeze's stride."""
    x = tb.arange(12).reshape(3, 4)
    assert x[True]._storage is not x._storage
    assert x[None].stride() == (12, 4, 1)
    assert x[:, None].stride() == (4, 4, 1)
    assert x[..., None].stride() == (4, 1, 1)


def test_uint8_index_tensor_is_a_mask_with_torch_warning():
    """A uint8 index tensor (tensorbridge, NumPy or PyTorch) is a mask and warns as PyTorch does; a
    0-d uint8 tensor is a bool, without the warning."""
    x = tb.arange(12).reshape(3, 4)
    text = (
        "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead"
    )
    with pytest.warns(UserWarning, match=text) as record:
        assert x[tb.tensor([1, 0, 2], dtype=tb.uint8)].tolist() == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert record[0].filename == __file__
    with pytest.warns(UserWarning, match=text):
        x[tb.tensor([0, 0, 1], dtype=tb.uint8)] = tb.tensor([-1, -2, -3, -4])
    assert x[2].tolist() == [-1, -2, -3, -4]
    assert tuple(x[tb.tensor(1, dtype=tb.uint8)].shape) == (1, 3, 4)
    assert tuple(x[tb.tensor(0, dtype=tb.uint8)].shape) == (0, 3, 4)
    np = pytest.importorskip("numpy")
    with pytest.warns(UserWarning, match=text):
        assert x[np.array([0, 1, 0], dtype=np.uint8)].tolist() == [[4, 5, 6, 7]]
    assert tuple(x[np.array(1, dtype=np.uint8)].shape) == (1, 3, 4)
    assert x[np.uint8(1)].tolist() == [4, 5, 6, 7]  # a NumPy integer scalar is an int


def test_index_tensor_dtypes_follow_torch():
    """Index tensors of one or more dims must be int64, int32, uint8 or bool; 0-d ones may be any
    integer type; NumPy bool and float scalars are refused, as in PyTorch."""
    x = tb.arange(6)
    for dtype in (tb.int8, tb.int16, tb.uint16, tb.float32):
        with pytest.raises(IndexError, match="tensors used as indices must be long, int, byte"):
            x[tb.tensor([1], dtype=dtype)]
    assert x[tb.tensor(4, dtype=tb.int8)].item() == 4
    np = pytest.importorskip("numpy")
    for scalar in (np.bool_(True), np.float64(1.0)):
        with pytest.raises(IndexError, match="only integers, slices"):
            x[scalar]


def test_advanced_assignment_dtype_rules_follow_torch():
    """An index list assignment needs a value of the same dtype (PyTorch's index_put_); one mask
    with a one-element value casts (masked_fill_); bare ``False`` assigns nothing."""
    x = tb.zeros(2, 3, dtype=tb.float16)
    with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes"):
        x[[0]] = tb.tensor([1.0, 2.0, 3.0], dtype=tb.float64)
    with pytest.raises(IndexError, match="shape mismatch"):  # reported before the dtype
        x[[0, 1], [0, 1, 2]] = tb.tensor(1.0, dtype=tb.float64)
    # An index into an empty dimension is refused before the dtypes, as index_put_ does; an
    # empty index there, or any index into a non-empty one, meets the dtype rule first.
    empty = tb.zeros(2, 0, dtype=tb.bool)
    for target, key in ((empty, ([0], [0])), (empty, (slice(None), [0])), (empty[0], [0])):
        with pytest.raises(IndexError, match="index is out of bounds for dimension with size 0"):
            target[key] = tb.tensor(0)
    with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes"):
        empty[[0]] = tb.tensor(0)  # dimension 0 has two rows
    with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes"):
        empty[:, tb.tensor([], dtype=tb.int64)] = tb.tensor(0)
    with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes"):
        tb.zeros(3, dtype=tb.bool)[[5]] = tb.tensor(0)
    x[tb.tensor([True, False])] = tb.tensor(3.0, dtype=tb.float64)
    x[True] = tb.tensor(1, dtype=tb.int64)  # bare True: an unsqueezed view, cast
    x[False] = tb.tensor([1.0, 2.0, 3.0, 4.0, 5.0])  # no write, no check
    assert x.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        tb.zeros(1).expand(3)[...] = 1
