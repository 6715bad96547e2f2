"""Tensor: metadata, views, copies, casts and conversions, on every layout.

Views are checked against NumPy on random layouts (negative and zero strides, offsets): each view
holds NumPy's values, and writing through it changes exactly the storage elements NumPy's view
maps to. Metadata and messages are checked against PyTorch on the layout matrix.
"""

from __future__ import annotations

import gc
import math
import re
import weakref
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests import strategies as S

import tensorbridge as tb
from tensorbridge import _capi, _codec, _layout, _storage
from tensorbridge._device import CPU
from tensorbridge._storage import Storage
from tensorbridge._tensor import Tensor


@pytest.fixture(scope="module")
def np():
    """NumPy, the reference for values (imported once, outside hypothesis' deadline)."""
    return pytest.importorskip("numpy")


@pytest.fixture(scope="module")
def torch():
    """PyTorch, the reference for metadata and messages."""
    return pytest.importorskip("torch")


def readonly_tensor(values: list[Any], dtype: tb.dtype = tb.int32) -> Tensor:
    """A 1-d read-only tensor over a ``bytes`` object's buffer (held open while the tensor lives)."""
    data = bytes(_codec.pack(dtype, values))
    owner, view = _storage.hold_buffer(data, _capi.PY_BUF_SIMPLE)
    storage = Storage(view.buf or 0, view.len, CPU, True, owner)
    return Tensor._new(storage, 0, (len(values),), (1,), dtype)


def np_pair(np: Any, layout: S.Layout, dtype: tb.dtype = tb.int64) -> tuple[Any, Any, Any]:
    """(values, view, offsets): NumPy's view of the layout, and the storage index of each element."""
    base = np.array(S.storage_values(dtype, layout.size), dtype=np.dtype(dtype.typestr))
    strides = [s * base.itemsize for s in layout.strides]
    view = np.lib.stride_tricks.as_strided(base[layout.offset :], layout.shape, strides)
    index = np.arange(layout.size, dtype=np.int64)
    offsets = np.lib.stride_tricks.as_strided(
        index[layout.offset :], layout.shape, [s * 8 for s in layout.strides]
    )
    return base, view, offsets


# ----------------------------------------------------------------------------- the layout matrix
_TORCH_LAYOUTS = {  # the conftest layout matrix, built the same way in PyTorch (no negative steps)
    "c_order": lambda torch: torch.arange(24, dtype=torch.int32).reshape(2, 3, 4),
    "f_order": lambda torch: torch.arange(24, dtype=torch.int32).reshape(4, 3, 2).permute(2, 1, 0),
    "sliced": lambda torch: torch.arange(24, dtype=torch.int32).reshape(4, 6)[1:3, ::2],
    "zero_d": lambda torch: torch.arange(24, dtype=torch.int32)[5],
    "empty": lambda torch: torch.arange(24, dtype=torch.int32).reshape(4, 6)[:, 6:],
    "size1_odd_stride": lambda torch: torch.arange(24, dtype=torch.int32).as_strided(
        (3, 1), (2, 7)
    ),
    "broadcast": lambda torch: torch.arange(4, dtype=torch.int32).reshape(1, 4).expand(3, 4),
    "offset": lambda torch: torch.arange(24, dtype=torch.int32)[7:],
}


def test_metadata_is_consistent(layout):
    """shape, size(), ndim, numel, nbytes, stride, offset and data_ptr describe one layout."""
    _, t = layout
    assert isinstance(t.shape, tb.Size)
    assert t.size() == t.shape
    assert t.ndim == t.dim() == len(t.shape)
    assert t.numel() == math.prod(t.shape)
    assert t.element_size() == t.itemsize == t.dtype.itemsize == 4
    assert t.nbytes == t.numel() * 4
    assert len(t.stride()) == t.ndim
    assert all(t.size(d) == t.shape[d] and t.stride(d) == t.stride()[d] for d in range(t.ndim))
    assert t.data_ptr() == t._storage.ptr + t.storage_offset() * 4
    assert t.device == tb.device("cpu") and t.is_cpu and not t.is_cuda
    assert t.dtype is tb.int32
    assert not t.requires_grad and not t.is_readonly


def test_metadata_matches_torch(torch, layout):
    """Every metadata accessor agrees with PyTorch for the same layout (negative steps aside)."""
    name, t = layout
    if name not in _TORCH_LAYOUTS:
        pytest.skip("PyTorch has no negative strides")
    x = _TORCH_LAYOUTS[name](torch)
    assert tuple(t.shape) == tuple(x.shape)
    assert t.stride() == x.stride()
    assert t.storage_offset() == x.storage_offset()
    assert t.is_contiguous() == x.is_contiguous()
    assert (t.numel(), t.nbytes, t.ndim) == (x.numel(), x.nbytes, x.ndim)
    assert t.tolist() == x.tolist()
    assert t.contiguous().tolist() == x.contiguous().tolist()
    assert t.contiguous().stride() == x.contiguous().stride()


def test_tensor_cannot_be_constructed_directly():
    """Tensor() is refused with a pointer to the creation functions."""
    with pytest.raises(TypeError, match=r"use tensorbridge.tensor\(data\)"):
        Tensor()


def test_dim_arguments_of_zero_d_tensors(torch):
    """size(d), stride(d) and unbind on a 0-d tensor raise PyTorch's IndexError."""
    t = tb.tensor(5)
    for fn in (lambda: t.size(0), lambda: t.stride(-1), lambda: t.unbind(0)):
        with pytest.raises(
            IndexError, match=r"Dimension specified as (0|-1) but tensor has no dimensions"
        ):
            fn()
    with pytest.raises(IndexError) as torch_info:
        torch.tensor(5).size(0)
    with pytest.raises(IndexError) as info:
        t.size(0)
    assert str(torch_info.value) in str(info.value)


# ----------------------------------------------------------------------------- requires_grad
def test_requires_grad_is_carried_and_dropped():
    """requires_grad_ sets the flag, views and clones keep it, detach() and integer casts drop it."""
    t = tb.zeros(3)
    assert t.requires_grad_() is t and t.requires_grad
    assert t[1:].requires_grad and t.clone().requires_grad and t.view(3, 1).requires_grad
    assert not t.detach().requires_grad
    assert t.detach().data_ptr() == t.data_ptr()
    assert not t.to(tb.int32).requires_grad
    assert t.to(tb.float64).requires_grad
    t.requires_grad = False
    assert not t.requires_grad
    assert tb.zeros(2, dtype=tb.complex64).requires_grad_().requires_grad


def _torch_grad_messages(torch: Any) -> dict[str, str]:
    messages = {}
    for name, fn in {
        "tensor": lambda: torch.tensor([1], requires_grad=True),
        "requires_grad_": lambda: torch.tensor([1]).requires_grad_(),
        "setter": lambda: setattr(torch.tensor([1]), "requires_grad", True),
    }.items():
        with pytest.raises(RuntimeError) as info:
            fn()
        messages[name] = str(info.value)
    return messages


def test_requires_grad_refused_for_integers_with_torch_text(torch):
    """Integer and bool tensors cannot require grad; each entry point keeps PyTorch's own text."""
    want = _torch_grad_messages(torch)
    cases = {
        "tensor": lambda: tb.tensor([1], requires_grad=True),
        "requires_grad_": lambda: tb.tensor([1]).requires_grad_(),
        "setter": lambda: setattr(tb.tensor([1]), "requires_grad", True),
    }
    for name, fn in cases.items():
        with pytest.raises(RuntimeError) as info:
            fn()
        assert want[name] in str(info.value), name
        assert "tensorbridge.int64" in str(info.value)
    for creator in (
        lambda: tb.zeros(2, dtype=tb.bool, requires_grad=True),
        lambda: tb.arange(3, requires_grad=True),
        lambda: tb.full((2,), 1, requires_grad=True),
    ):
        with pytest.raises(RuntimeError, match="Only Tensors of floating point and complex dtype"):
            creator()


def test_requires_grad_false_is_always_allowed():
    """Clearing requires_grad on an integer tensor is fine."""
    t = tb.tensor([1])
    assert t.requires_grad_(False) is t
    assert not t.requires_grad


# ----------------------------------------------------------------------------- read-only
def test_readonly_tensor_refuses_every_write():
    """Writes through any view of read-only memory raise; reads, views and clones work."""
    t = readonly_tensor([1, 2, 3, 4])
    assert t.is_readonly and t[1:].is_readonly and t.view(2, 2).is_readonly
    writes = {
        "__setitem__": lambda: t.__setitem__(0, 9),
        "fill_": lambda: t.fill_(0),
        "zero_": lambda: t.zero_(),
        "copy_": lambda: t.copy_(tb.zeros(4, dtype=tb.int32)),
    }
    for api, write in writes.items():
        with pytest.raises(
            ValueError, match=rf"{api}\(\): cannot write to a read-only tensor"
        ) as info:
            write()
        assert "clone()" in str(info.value)
    with pytest.raises(ValueError, match="read-only"):
        t[1:3][0] = 7
    assert t.tolist() == [1, 2, 3, 4]
    c = t.clone()
    c[0] = 9
    assert not c.is_readonly and c.tolist() == [9, 2, 3, 4]
    assert t.to(tb.float32).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_readonly_buffer_is_released_with_the_last_view():
    """The storage holding a bytes buffer's export lives exactly as long as the last view."""
    t = readonly_tensor([1, 2])
    owner = weakref.ref(t._storage)
    view = t[1:]
    del t
    gc.collect()
    assert owner() is not None
    assert view.tolist() == [2]
    del view
    gc.collect()
    assert owner() is None


# ----------------------------------------------------------------------------- views against NumPy
@st.composite
def view_ops(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[str, Any, Any]:
    """(description, tensorbridge op, NumPy op) for a random view operation valid on ``shape``."""
    ndim = len(shape)
    names = [
        "transpose",
        "permute",
        "T",
        "unsqueeze",
        "squeeze",
        "expand",
        "flatten",
        "unbind",
        "view",
        "reshape",
        "detach",
        "as_strided",
    ]
    if ndim >= 2:
        names.append("mT")
    if ndim >= 1:
        names.append("narrow")
    name = draw(st.sampled_from(names))
    dim = st.integers(-max(ndim, 1), max(ndim, 1) - 1)
    if name == "transpose":
        a, b = draw(dim), draw(dim)
        return (
            f"transpose({a}, {b})",
            lambda t: t.transpose(a, b),
            lambda x: x.swapaxes(a, b) if ndim else x,
        )
    if name == "permute":
        order = draw(st.permutations(range(ndim)))
        order = [d - ndim if draw(st.booleans()) else d for d in order]
        return f"permute({order})", lambda t: t.permute(order), lambda x: x.transpose(order)
    if name == "T" and ndim:  # 0-d: see test_transposes_of_zero_d_tensors_warn_as_torch
        return "T", lambda t: t.T, lambda x: x.transpose(list(range(ndim))[::-1])
    if name == "mT":
        return "mT", lambda t: t.mT, lambda x: x.swapaxes(-2, -1)
    if name == "unsqueeze":
        d = draw(st.integers(-ndim - 1, ndim))
        return (
            f"unsqueeze({d})",
            lambda t: t.unsqueeze(d),
            lambda x: (
                x.reshape(_unsqueezed(x.shape, d)) if x.size == 0 else x[_unsqueeze_key(ndim, d)]
            ),
        )
    if name == "squeeze":
        distinct = st.lists(dim, max_size=ndim).filter(
            lambda ds: len({d % max(ndim, 1) for d in ds}) == len(ds)  # repeats: RuntimeError
        )
        dims = draw(st.none() | dim | distinct.map(tuple))
        keep = _squeeze_keep(shape, dims)
        return (
            f"squeeze({dims})",
            lambda t: t.squeeze(dims),
            lambda x: x[tuple(slice(None) if k else 0 for k in keep)],
        )
    if name == "expand":
        target = draw(S.expand_targets(shape))
        return f"expand({target})", lambda t: t.expand(target), lambda x: _np_expand(x, target)
    if name == "flatten":
        if ndim == 0:
            return "flatten()", lambda t: t.flatten(), lambda x: x.reshape(1)
        a = draw(st.integers(0, ndim - 1))
        b = draw(st.integers(a, ndim - 1))
        new = (*shape[:a], math.prod(shape[a : b + 1]), *shape[b + 1 :])
        return f"flatten({a}, {b})", lambda t: t.flatten(a, b - ndim), lambda x: x.reshape(new)
    if name == "unbind" and any(shape):
        d = draw(st.sampled_from([k for k in range(ndim) if shape[k]]))
        i = draw(st.integers(0, shape[d] - 1))
        key = (slice(None),) * d + (i,)
        return f"unbind({d})[{i}]", lambda t: t.unbind(d)[i], lambda x: x[key]
    if name in ("view", "reshape"):
        target = draw(S.reshape_targets(shape))
        new = _layout.infer_shape(math.prod(shape), target, "reshape")
        if name == "view":
            return f"view({target})", lambda t: _try_view(t, target), lambda x: x.reshape(new)
        return f"reshape({target})", lambda t: t.reshape(target), lambda x: x.reshape(new)
    if name == "narrow":
        d = draw(st.integers(0, ndim - 1))
        start = draw(st.integers(-shape[d], shape[d]))
        pos = start + shape[d] if start < 0 else start
        length = draw(st.integers(0, shape[d] - pos))
        key = (slice(None),) * d + (slice(pos, pos + length),)
        return (
            f"narrow({d}, {start}, {length})",
            lambda t: t.narrow(d, start, length),
            lambda x: x[key],
        )
    if name == "as_strided":
        return (
            "as_strided (same layout)",
            lambda t: t.as_strided(t.shape, t.stride(), t.storage_offset()),
            lambda x: x,
        )
    return "detach", lambda t: t.detach(), lambda x: x


def _unsqueezed(shape: tuple[int, ...], d: int) -> tuple[int, ...]:
    d = d + len(shape) + 1 if d < 0 else d
    return (*shape[:d], 1, *shape[d:])


def _unsqueeze_key(ndim: int, d: int) -> tuple[Any, ...]:
    d = d + ndim + 1 if d < 0 else d
    return (slice(None),) * d + (None,)


def _squeeze_keep(shape: tuple[int, ...], dims: Any) -> list[bool]:
    ndim = len(shape)
    if dims is None:
        return [n != 1 for n in shape]
    chosen = {(d % max(ndim, 1)) for d in ((dims,) if isinstance(dims, int) else dims)}
    return [not (i in chosen and n == 1) for i, n in enumerate(shape)]


def _np_expand(x: Any, target: tuple[int, ...]) -> Any:
    lead = len(target) - x.ndim
    shape = tuple(t if t != -1 else x.shape[i - lead] for i, t in enumerate(target))
    import numpy as np

    return np.broadcast_to(x, shape)


def _try_view(t: Tensor, target: tuple[int, ...]) -> Tensor:
    """view(), or reshape() when the strides forbid a view (the view-ability is tested in test_layout)."""
    try:
        return t.view(target)
    except RuntimeError:
        return t.reshape(target)


@given(layout=S.layouts(), data=st.data())
def test_views_match_numpy_and_alias_the_storage(np, layout, data):
    """Every view op gives NumPy's values, and writing through it changes exactly NumPy's elements."""
    name, tb_op, np_op = data.draw(view_ops(layout.shape))
    base_np, view_np, offsets = np_pair(np, layout)
    base = tb.tensor(base_np.tolist(), dtype=tb.int64)
    t = base.as_strided(layout.shape, layout.strides, layout.offset)
    result = tb_op(t)
    want = np_op(view_np)
    assert tuple(result.shape) == want.shape, name
    assert result.tolist() == want.tolist(), name
    if result._storage is not base._storage:  # reshape and flatten copy what cannot be viewed
        assert name.startswith(("reshape", "view", "flatten")), name
        return
    result.fill_(-7)
    expected = base_np.copy()
    expected[np_op(offsets).ravel()] = -7
    assert base.tolist() == expected.tolist(), name


@given(layout=S.layouts(), data=st.data())
def test_reshape_copies_only_when_a_view_is_impossible(layout, data):
    """reshape is a view exactly when view() succeeds (PyTorch's rule), else a compact copy."""
    t = S.strided_tensor(layout)
    target = data.draw(S.reshape_targets(layout.shape))
    new = _layout.infer_shape(math.prod(layout.shape), target, "reshape")
    viewable = _layout.view_strides(layout.shape, layout.strides, new) is not None
    r = t.reshape(target)
    assert (r._storage is t._storage) == viewable
    if not viewable:
        assert r.is_contiguous()
        with pytest.raises(
            RuntimeError, match="view size is not compatible with input tensor's size and stride"
        ):
            t.view(target)


@given(layout=S.layouts())
def test_tolist_matches_numpy_and_the_list_model(np, layout):
    """tolist() of any layout equals NumPy's and the pure-Python model's."""
    values = S.storage_values(tb.int64, layout.size)
    t = S.strided_tensor(layout)
    _, view_np, _ = np_pair(np, layout)
    assert t.tolist() == view_np.tolist()
    if math.prod(layout.shape):
        assert t.tolist() == S.reference_tolist(values, layout)


@given(layout=S.layouts())
def test_tolist_matches_the_list_model(layout):
    """tolist() of any non-empty layout equals the pure-Python model (no peer needed)."""
    if math.prod(layout.shape) == 0:
        assert (
            S.strided_tensor(layout).tolist() == S.nest_any([], layout.shape)
            if layout.shape
            else True
        )
        return
    values = S.storage_values(tb.int64, layout.size)
    assert S.strided_tensor(layout).tolist() == S.reference_tolist(values, layout)


@given(layout=S.layouts())
def test_contiguous_and_clone_copy_values_compactly(layout):
    """contiguous() is self when compact, else a compact copy; clone() always copies."""
    t = S.strided_tensor(layout)
    c = t.contiguous()
    assert (c is t) == t.is_contiguous()
    assert c.is_contiguous() and c.tolist() == t.tolist()
    k = t.clone()
    assert k._storage is not t._storage and k.is_contiguous() and k.tolist() == t.tolist()
    assert k.stride() == _layout.contiguous_strides(t.shape) and k.storage_offset() == 0


# ----------------------------------------------------------------------------- copy_, to, fill_
def _castable(src: tb.dtype, dst: tb.dtype) -> bool:
    """Casts whose results NumPy and PyTorch agree on for `S.storage_values` (no wrap, no UB)."""
    if dst.kind == "u":
        return src.kind in "bu"
    if dst.kind in "bc":
        return True
    return src.kind != "c"


@given(dst_layout=S.layouts(), dst_dtype=S.dtypes(), data=st.data())
def test_copy_matches_numpy(np, dst_layout, dst_dtype, data):
    """copy_ from any broadcastable layout and dtype (maybe the same memory) writes NumPy's values."""
    base_np, dst_np, offsets = np_pair(np, dst_layout, dst_dtype)
    base = tb.tensor(base_np.tolist(), dtype=dst_dtype)
    dst = base.as_strided(dst_layout.shape, dst_layout.strides, dst_layout.offset)
    if offsets.size > 1 and any(
        n > 1 and s == 0 for n, s in zip(dst_layout.shape, dst_layout.strides)
    ):
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            dst.copy_(tb.zeros(dst_layout.shape, dtype=dst_dtype))
        return
    if len(set(offsets.ravel().tolist())) != offsets.size:
        return  # elements sharing memory without a zero stride: the surviving value is order-dependent
    src_shape = data.draw(S.broadcastable_shapes(dst_layout.shape))
    same_memory = data.draw(st.booleans())
    if same_memory:
        src_dtype = dst_dtype
        src_layout = data.draw(S.layouts(shape=st.just(src_shape), size=dst_layout.size))
        src_np = np.lib.stride_tricks.as_strided(
            base_np[src_layout.offset :],
            src_shape,
            [s * base_np.itemsize for s in src_layout.strides],
        ).copy()
        src = base.as_strided(src_shape, src_layout.strides, src_layout.offset)
    else:
        src_dtype = data.draw(S.dtypes().filter(lambda d: _castable(d, dst_dtype)))
        src_layout = data.draw(S.layouts(shape=st.just(src_shape)))
        _, src_np, _ = np_pair(np, src_layout, src_dtype)
        src = S.strided_tensor(src_layout, src_dtype)
    assert dst.copy_(src) is dst
    dst_np[...] = src_np
    assert base.tolist() == base_np.tolist()
    assert src.tolist() == src_np.tolist() or same_memory


@given(layout=S.layouts(), src=S.dtypes(), dst=S.dtypes())
def test_to_dtype_matches_numpy(np, layout, src, dst):
    """to(dtype) converts every element as NumPy's astype does, into a new compact tensor."""
    if not _castable(src, dst):
        return
    _, view_np, _ = np_pair(np, layout, src)
    t = S.strided_tensor(layout, src)
    r = t.to(dst)
    assert r.dtype is dst and tuple(r.shape) == tuple(t.shape)
    assert r.tolist() == view_np.astype(np.dtype(dst.typestr)).tolist()
    if dst is src:
        assert r is t
    else:
        assert r.is_contiguous() and r._storage is not t._storage


# bfloat16 and the float8 types: NumPy has them through ml_dtypes (packed FP4 pairs excepted).
_EXTENDED_FLOATS = [
    d for d in S.CODEC_DTYPES if d.typestr is None and d.kind == "f" and d.dlpack[2] == 1
]


@given(
    layout=S.layouts(),
    dtype=st.sampled_from(_EXTENDED_FLOATS),
    wide=st.sampled_from([tb.float32, tb.float64]),
)
def test_extended_floats_match_ml_dtypes(np, layout, dtype, wide):
    """Strided reads and casts of bfloat16/float8 tensors equal ml_dtypes' for the same layout."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ml = np.dtype(getattr(ml_dtypes, dtype.name))
    values = S.storage_values(dtype, layout.size)
    base_np = np.array(values, dtype=np.float64).astype(ml)
    bits = base_np.view(
        f"u{ml.itemsize}"
    )  # as_strided cannot spell ml_dtypes' typestrs; their bits it can
    view_np = np.lib.stride_tricks.as_strided(
        bits[layout.offset :], layout.shape, [s * ml.itemsize for s in layout.strides]
    ).view(ml)
    t = S.strided_tensor(layout, dtype)
    assert t.tolist() == view_np.astype(np.float64).tolist()
    assert t.to(wide).tolist() == view_np.astype(np.dtype(wide.typestr)).tolist()
    assert t.to(wide).to(dtype).tolist() == t.tolist()


@pytest.mark.parametrize("dtype", S.CODEC_DTYPES, ids=str)
def test_to_dtype_round_trips_small_integers(dtype):
    """Every codec dtype holds 1, 2 and 4 exactly and converts them back to int64."""
    t = tb.tensor([1, 2, 4], dtype=tb.int64)
    if dtype is tb.float4_e2m1fn_x2:
        with pytest.raises(NotImplementedError, match="float4_e2m1fn_x2"):
            t.to(dtype)
        return
    back = t.to(dtype).to(tb.int64)
    want = [1, 1, 1] if dtype is tb.bool else [1, 2, 4]
    assert back.tolist() == want


def test_to_argument_forms():
    """to() takes a dtype, a device, a tensor, keywords and copy=, like PyTorch."""
    t = tb.arange(3)
    assert t.to(tb.int64) is t
    assert t.to("cpu") is t
    assert t.to(tb.device("cpu"), tb.int64) is t
    assert t.to(dtype=tb.float32).dtype is tb.float32
    assert t.to(tb.float64).dtype is tb.float64
    c = t.to(copy=True)
    assert c is not t and c.data_ptr() != t.data_ptr() and c.tolist() == t.tolist()
    assert t.to(tb.zeros(1, dtype=tb.int16)).dtype is tb.int16
    assert t.to(dtype="int8").dtype is tb.int8
    with pytest.raises(TypeError, match=r"to\(\): expected a dtype, a device or a tensor; got 3.5"):
        t.to(3.5)
    with pytest.raises(TypeError, match=r"to\(\): unexpected keyword argument 'layout'"):
        t.to(layout=None)
    with pytest.raises(ValueError, match="device type at start of device string: foo"):
        t.to("foo")


def test_to_another_device_is_refused():
    """tensorbridge never copies between host and device memory."""
    with pytest.raises(BufferError, match=r"to\(\): cannot move a tensor from cpu to cuda:0"):
        tb.arange(3).to("cuda:0")


@given(layout=S.layouts(), dtype=S.dtypes(numpy=False))
def test_fill_and_zero_set_every_element(layout, dtype):
    """fill_ and zero_ write one value to every element of any layout (broadcast views included)."""
    base = tb.tensor(S.storage_values(dtype, layout.size), dtype=dtype)
    t = base.as_strided(layout.shape, layout.strides, layout.offset)
    # PyTorch cannot fill packed FP4 pairs; their bytes can be filled through a uint8 view.
    target = t.view(tb.uint8) if dtype is tb.float4_e2m1fn_x2 else t
    value = S.storage_values(dtype, 3)[1]
    touched = set(layout.offsets())
    before = base.tolist()
    assert target.fill_(value) is target
    assert base.tolist() == [value if i in touched else v for i, v in enumerate(before)]
    assert t.zero_() is t
    zero = tb.zeros(
        1, dtype=dtype
    ).item()  # all-zero bytes (2**-127 for float8_e8m0fnu, as PyTorch)
    assert base.tolist() == [zero if i in touched else v for i, v in enumerate(before)]


def test_packed_fp4_zeroes_but_does_not_fill():
    """float4_e2m1fn_x2: zeros()/zero_() work (a memset), fill_/ones raise as in PyTorch."""
    t = tb.zeros(2, dtype=tb.float4_e2m1fn_x2)
    assert t.view(tb.uint8).tolist() == [0, 0]
    assert t.zero_() is t
    with pytest.raises(NotImplementedError, match="not implemented for 'Float4_e2m1fn_x2'"):
        t.fill_(1)
    with pytest.raises(NotImplementedError, match="not implemented for 'Float4_e2m1fn_x2'"):
        tb.ones(2, dtype=tb.float4_e2m1fn_x2)


def test_fill_takes_a_zero_d_tensor():
    """fill_ accepts a 0-d tensor, and refuses others with PyTorch's text."""
    t = tb.zeros(3)
    t.fill_(tb.tensor(2.5))
    assert t.tolist() == [2.5, 2.5, 2.5]
    with pytest.raises(
        RuntimeError,
        match=r"fill_ only supports 0-dimension value tensor but got tensor with 1 dimensions\.",
    ):
        t.fill_(tb.tensor([1.0]))


@pytest.mark.parametrize(
    ("dst", "src", "text"),
    [
        (
            (2, 3),
            (4,),
            "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1",
        ),
        (
            (2, 3, 4),
            (5, 1, 4),
            "The size of tensor a (2) must match the size of tensor b (5) at non-singleton "
            "dimension 0",
        ),
        ((3,), (2, 3), "output with shape [3] doesn't match the broadcast shape [2, 3]"),
        ((1, 3), (2, 3), "output with shape [1, 3] doesn't match the broadcast shape [2, 3]"),
    ],
)
def test_copy_shape_errors_carry_torch_text(torch, dst, src, text):
    """copy_ refuses what PyTorch refuses, with PyTorch's type and message."""
    with pytest.raises(RuntimeError) as torch_info:
        torch.zeros(dst).copy_(torch.zeros(src))
    assert text in str(torch_info.value)
    with pytest.raises(RuntimeError) as info:
        tb.zeros(dst).copy_(tb.zeros(src))
    assert text in str(info.value) and str(info.value).startswith("copy_()")


def test_copy_from_lists_and_scalars():
    """copy_ also takes nested sequences, converted to the destination dtype."""
    t = tb.zeros(2, 2, dtype=tb.int16)
    t.copy_([[1, 2], [3, 4]])
    assert t.tolist() == [[1, 2], [3, 4]]
    t.copy_(tb.tensor([9.9, -9.9]))
    assert t.tolist() == [[9, -9], [9, -9]]


# ----------------------------------------------------------------------------- scalars, len, iteration
def test_item_and_python_scalars():
    """item(), int(), float(), complex(), bool() and index() read one element."""
    assert tb.tensor([[7]]).item() == 7
    assert int(tb.tensor(7.9)) == 7 and float(tb.tensor(3)) == 3.0
    assert complex(tb.tensor(1 + 2j)) == 1 + 2j
    assert bool(tb.tensor([0])) is False and bool(tb.tensor(2)) is True
    assert [10, 20, 30][tb.tensor(2)] == 30
    assert tb.tensor(True).item() is True


@pytest.mark.parametrize(
    ("fn", "exc", "text"),
    [
        (
            lambda: tb.zeros(2).item(),
            RuntimeError,
            "a Tensor with 2 elements cannot be converted to Scalar",
        ),
        (
            lambda: tb.zeros(0).item(),
            RuntimeError,
            "a Tensor with 0 elements cannot be converted to Scalar",
        ),
        (
            lambda: bool(tb.zeros(2)),
            RuntimeError,
            "Boolean value of Tensor with more than one value is ambiguous",
        ),
        (
            lambda: bool(tb.zeros(0)),
            RuntimeError,
            "Boolean value of Tensor with no values is ambiguous",
        ),
        (
            lambda: int(tb.zeros(2)),
            ValueError,
            "only one element tensors can be converted to Python scalars",
        ),
        (
            lambda: float(tb.zeros(2)),
            ValueError,
            "only one element tensors can be converted to Python scalars",
        ),
        (
            lambda: [0][tb.tensor(0.0)],
            TypeError,
            "only integer tensors of a single element can be converted",
        ),
        (lambda: len(tb.tensor(1)), TypeError, "len() of a 0-d tensor"),
        (lambda: iter(tb.tensor(1)), TypeError, "iteration over a 0-d tensor"),
    ],
)
def test_scalar_conversion_errors_match_torch(torch, fn, exc, text):
    """Scalar conversions fail as PyTorch's do, with its type and text."""
    with pytest.raises(exc) as info:
        fn()
    assert text in str(info.value)


def test_len_and_iteration_unbind_dim_zero():
    """len() is the first size; iterating yields views along dim 0."""
    t = tb.arange(6).reshape(3, 2)
    assert len(t) == 3 and len(tb.zeros(0, 4)) == 0
    rows = list(t)
    assert [r.tolist() for r in rows] == [[0, 1], [2, 3], [4, 5]]
    assert all(r._storage is t._storage for r in rows)
    assert list(tb.zeros(0, 2)) == []


def test_equal_compares_shape_and_values():
    """tb.equal is torch.equal: same shape and values, across layouts and dtypes; NaN is unequal."""
    a = tb.arange(6).reshape(2, 3)
    assert tb.equal(a, a.T.contiguous().T)
    assert tb.equal(a, a.to(tb.float64))
    assert not tb.equal(a, a.reshape(3, 2))
    assert not tb.equal(a, a.clone().fill_(1))
    nan = tb.tensor([float("nan")])
    assert not tb.equal(nan, nan)
    assert a.equal(a.clone())
    with pytest.raises(TypeError, match=r"equal\(\): expected two tensors; got Tensor and list"):
        tb.equal(a, [[0, 1, 2], [3, 4, 5]])
    with pytest.raises(TypeError, match=r"use tensorbridge\.equal"):
        a == a  # noqa: B015


# ----------------------------------------------------------------------------- view errors
@pytest.mark.parametrize(
    ("name", "fn", "exc"),
    [
        ("view", lambda L: L.arange(6).view(2, 5), RuntimeError),
        ("reshape", lambda L: L.arange(6).reshape(4, -1), RuntimeError),
        ("view incompatible", lambda L: L.arange(6).reshape(2, 3).t().view(6), RuntimeError),
        ("transpose", lambda L: L.zeros(2, 3).transpose(0, 3), IndexError),
        ("expand", lambda L: L.zeros(2, 3).expand(2, 4), RuntimeError),
        ("expand fewer", lambda L: L.zeros(2, 3).expand(3), RuntimeError),
        ("narrow start", lambda L: L.arange(6).narrow(0, 7, 1), IndexError),
        ("narrow length", lambda L: L.arange(6).narrow(0, 4, 3), RuntimeError),
        ("narrow negative", lambda L: L.arange(6).narrow(0, 1, -1), RuntimeError),
        ("narrow 0-d", lambda L: L.tensor(1).narrow(0, 0, 1), RuntimeError),
        ("t 3-d", lambda L: L.zeros(2, 2, 2).t(), RuntimeError),
        ("mT 1-d", lambda L: L.zeros(2).mT, RuntimeError),
        ("permute duplicate", lambda L: L.zeros(2, 3).permute(0, 0), RuntimeError),
        ("permute length", lambda L: L.zeros(2, 3).permute(0), RuntimeError),
        ("flatten order", lambda L: L.zeros(2, 3, 4).flatten(2, 1), RuntimeError),
        ("squeeze dim", lambda L: L.zeros(2, 3).squeeze(3), IndexError),
        ("unsqueeze dim", lambda L: L.zeros(2, 3).unsqueeze(4), IndexError),
        ("as_strided bounds", lambda L: L.zeros(4).as_strided((3,), (2,)), ValueError),
        ("as_strided lengths", lambda L: L.zeros(4).as_strided((3,), (1, 1)), RuntimeError),
        ("as_strided offset", lambda L: L.zeros(4).as_strided((1,), (1,), -1), ValueError),
        ("unbind 0-d", lambda L: L.tensor(1).unbind(0), IndexError),
    ],
)
def test_view_errors_carry_torch_text(torch, name, fn, exc):
    """Each view error has PyTorch's type and contains PyTorch's message for the same call."""
    try:
        fn(torch)
    except (RuntimeError, IndexError) as torch_exc:
        torch_text = str(torch_exc).split("\n")[0]
    else:
        pytest.fail(f"torch accepted {name}")
    # Drop PyTorch's internal prefixes ("setStorage: ", "permute(sparse_coo): ", "expand(...): ").
    torch_text = re.sub(r"^(\w+: |\w+\([^)]*\): )", "", torch_text)
    with pytest.raises(exc) as info:
        fn(tb)
    assert torch_text in str(info.value), (torch_text, str(info.value))


def test_as_strided_is_bounds_checked_but_allows_negative_strides():
    """as_strided refuses layouts outside the storage, and allows any that fit (negative strides too)."""
    base = tb.arange(6)
    assert base.as_strided((3,), (-2,), 4).tolist() == [4, 2, 0]
    assert base[2:].as_strided((2, 2), (0, 1)).tolist() == [[2, 3], [2, 3]]
    assert base[2:].as_strided((2,), (1,), 0).tolist() == [
        0,
        1,
    ]  # offsets count from the storage start
    with pytest.raises(ValueError, match="outside the storage") as info:
        base.as_strided((3,), (-2,), 3)
    assert "reaches elements [-1, 3]" in str(info.value)
    with pytest.raises(TypeError, match=r"as_strided\(\): sizes must be ints"):
        base.as_strided((3,), (1.5,))


def test_view_and_reshape_argument_forms():
    """Shapes may be given as ints, a tuple, a list or a Size; a dtype view needs equal itemsize."""
    t = tb.arange(6, dtype=tb.int32)
    assert (
        t.view(2, 3).shape
        == t.view((2, 3)).shape
        == t.view([2, 3]).shape
        == t.view(tb.Size([2, 3])).shape
    )
    assert t.view(tb.float32).dtype is tb.float32 and t.view(tb.uint32).tolist() == list(range(6))
    with pytest.raises(RuntimeError, match="needs equal element sizes"):
        t.view(tb.int16)
    with pytest.raises(TypeError, match=r"view\(\): sizes must be ints; got 2.0"):
        t.view(2.0, 3)
    with pytest.raises(TypeError, match=r"narrow\(\): sizes must be ints; got 1.0"):
        t.narrow(0, 1.0, 2)


# ----------------------------------------------------------------------------- PyTorch 2.13 rules
def test_zero_d_dim_arguments_are_range_checked():
    """A 0-d tensor takes dims -1 and 0 only, as in PyTorch: flatten(1) is an IndexError."""
    s = tb.tensor(5)
    assert s.flatten(0).tolist() == [5] and s.flatten(-1, 0).tolist() == [5]
    for call in (lambda: s.flatten(1), lambda: s.flatten(-2), lambda: s.flatten(0, 1)):
        with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range"):
            call()


def test_transposes_of_zero_d_tensors_warn_as_torch():
    """``.mT`` and ``.T`` of a 0-d tensor return it unchanged with PyTorch's deprecation warning."""
    s = tb.tensor(5)
    with pytest.warns(UserWarning, match=r"Tensor\.mT is deprecated on 0-D tensors"):
        assert s.mT.tolist() == 5
    with pytest.warns(UserWarning, match=r"Tensor\.T is deprecated on 0-D tensors"):
        assert s.T.tolist() == 5
    with pytest.raises(RuntimeError, match=r"tensor\.mT is only supported on matrices"):
        _ = tb.zeros(2).mT


def test_shape_argument_errors_have_torch_types():
    """Repeated squeeze dims and missing shape arguments fail with PyTorch's types."""
    t = tb.zeros(1, 2)
    with pytest.raises(RuntimeError, match="dim 0 appears multiple times in the list of dims"):
        t.squeeze((0, -2))
    for call in (t.view, t.reshape, t.permute, t.expand):
        with pytest.raises(TypeError):
            call()


def test_int_of_complex_with_imaginary_part_is_refused():
    """``int()`` of a complex tensor with a nonzero imaginary part raises, as in PyTorch."""
    assert int(tb.tensor(3 + 0j)) == 3
    with pytest.raises(RuntimeError, match="value cannot be converted to type int64_t"):
        int(tb.tensor(3 + 1j))


def test_float_of_complex_with_imaginary_part_is_refused():
    """``float()`` of a complex tensor drops a zero imaginary part and refuses another, as PyTorch."""
    assert float(tb.tensor(1.5 + 0j)) == 1.5
    with pytest.raises(
        RuntimeError, match="value cannot be converted to type double without overflow"
    ):
        float(tb.tensor(1 + 2j))


def test_squeeze_checks_each_dim_in_order():
    """Each dim is wrapped, then checked for repeats, in order, as PyTorch does: the first fault wins."""
    t = tb.tensor(1.0)
    with pytest.raises(RuntimeError, match="dim 0 appears multiple times in the list of dims"):
        t.squeeze((0, 0, 1))
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.squeeze((1, 0, 0))
    assert tb.zeros(1, 2, 1).squeeze((0, -1)).shape == (2,)
