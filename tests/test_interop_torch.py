"""DLPack interchange with PyTorch in both directions (torch.from_dlpack, to_dlpack, __dlpack__)."""

from __future__ import annotations

import gc
import weakref

import pytest

import tensorbridge as tb

torch = pytest.importorskip("torch")

# Every torch dtype with a DLPack encoding, by tensorbridge name.
TORCH_DTYPES = [
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex32",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
]


def bits(x):
    """The raw bytes of a torch tensor (every dtype, including float8/float4/complex32)."""
    return bytes(x.contiguous().view(-1).view(torch.uint8).tolist())


def tb_bits(t):
    return bytes(t._bytes("test"))


def torch_sample(name, n=4):
    dtype = getattr(torch, name)
    raw = torch.arange(1, n * dtype.itemsize + 1, dtype=torch.uint8)
    if name == "bool":
        raw = torch.tensor([0, 1] * (n // 2), dtype=torch.uint8)
    return raw.view(dtype)


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_tensorbridge_from_torch_every_dtype(name):
    """tb.from_dlpack(torch tensor): same pointer, dtype and bytes; writes visible in torch."""
    x = torch_sample(name)
    t = tb.from_dlpack(x)
    assert t.dtype is getattr(tb, name)
    assert t.data_ptr() == x.data_ptr()
    assert tb_bits(t) == bits(x)
    t._storage.host_view("test")[0] = 0  # a write through tensorbridge's view of the memory
    assert bits(x)[0] == 0


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_from_tensorbridge_every_dtype(name):
    """torch.from_dlpack(tensor): same pointer, dtype and bytes; writes visible both ways."""
    t = tb.from_dlpack(torch_sample(name)).clone()
    x = torch.from_dlpack(t)
    assert x.dtype == getattr(torch, name)
    assert x.data_ptr() == t.data_ptr()
    assert bits(x) == tb_bits(t)
    x.view(torch.uint8)[0] = 0
    assert tb_bits(t)[0] == 0


@pytest.mark.parametrize(
    "name",
    [
        "bool",
        "uint8",
        "int16",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ],
)
def test_values_both_ways(name):
    """Values agree in both directions for the dtypes with tolist()."""
    x = torch.arange(6).reshape(2, 3).to(getattr(torch, name))
    assert tb.from_dlpack(x).tolist() == x.tolist()
    t = tb.from_dlpack(x.clone())
    assert torch.from_dlpack(t).tolist() == t.tolist()


def test_legacy_capsules_both_ways():
    """to_dlpack capsules from either library import in the other and share memory."""
    x = torch.arange(4)
    t = tb.from_dlpack(torch.utils.dlpack.to_dlpack(x))
    t[0] = -9
    assert x[0].item() == -9
    y = torch.from_dlpack(tb.utils.dlpack.to_dlpack(t))
    assert y.data_ptr() == x.data_ptr()
    assert y.tolist() == [-9, 1, 2, 3]


def test_layout_to_torch(layout):
    """Every layout reaches torch with its values and strides (negative strides as a copy)."""
    name, t = layout
    x = torch.from_dlpack(t)
    assert tuple(x.shape) == tuple(t.shape)
    assert x.tolist() == t.tolist()
    if t.numel() and name != "negative_step":
        assert x.data_ptr() == t.data_ptr()
        assert x.stride() == t.stride()
    back = tb.from_dlpack(x)
    assert back.tolist() == t.tolist()


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(25).reshape(5, 5)[0],
        lambda: torch.arange(25).reshape(5, 5)[:, 0],
        lambda: torch.arange(25).reshape(5, 5).t(),
        lambda: torch.arange(16)[::3][:1],
        lambda: torch.arange(4).reshape(1, 4).expand(3, 4),
        lambda: torch.zeros(0, 3),
        lambda: torch.tensor(3.5),
        lambda: torch.zeros((1,) * 64),
        lambda: torch.zeros((1,) * 33),
    ],
    ids=["row", "column", "transpose", "size1_stride", "expanded", "empty", "zero_d", "64d", "33d"],
)
def test_torch_layouts_import(make):
    """Torch views (non-contiguous, expanded, empty, 0-d, 33-D, 64-D) import with strides kept."""
    x = make()
    t = tb.from_dlpack(x)
    assert t.shape == tuple(x.shape)
    assert t.tolist() == x.tolist()
    if x.numel():
        assert t.stride() == x.stride()
        assert t.data_ptr() == x.data_ptr()


@pytest.mark.subprocess
def test_negative_strides_to_torch_do_not_abort(subprocess_run):
    """Negative strides (tensorbridge views, NumPy arrays) reach torch as a correct copy instead of
    aborting the process (pytorch/pytorch#188023); tensorbridge itself imports NumPy's negative strides as a view."""
    pytest.importorskip("numpy")
    result = subprocess_run("""
        import numpy as np, tensorbridge as tb, torch
        t = tb.arange(6, dtype=tb.int32)[::-1]
        y = torch.from_dlpack(t)
        print(y.tolist(), y.data_ptr() != t.data_ptr())
        z = torch.from_dlpack(tb.utils.dlpack.to_dlpack(tb.arange(6).reshape(2, 3)[:, ::-1]))
        print(z.tolist())
        n = tb.from_dlpack(np.arange(6.0)[::-1])
        print(n.stride(), torch.from_dlpack(n).tolist())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "[5, 4, 3, 2, 1, 0] True",
        "[[2, 1, 0], [5, 4, 3]]",
        "(-1,) [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]",
    ]


def test_torch_refusals_pass_through():
    """torch's own BufferErrors (grad, conjugate bit, layout, quantized) pass through unchanged."""
    with pytest.raises(BufferError, match="require gradient"):
        tb.from_dlpack(torch.ones(2, requires_grad=True))
    with pytest.raises(BufferError, match="conjugate bit"):
        tb.from_dlpack(torch.tensor([1 + 2j]).conj())
    with pytest.raises(BufferError, match="strided"):
        tb.from_dlpack(torch.eye(2).to_sparse())
    with pytest.warns(UserWarning, match="deprecated"):
        q = torch.quantize_per_tensor(torch.tensor([1.0]), 0.1, 0, torch.qint8)
    with pytest.raises(BufferError, match=r".* types are not supported by dlpack"):
        tb.from_dlpack(q)


def test_negative_bit_view_is_resolved():
    """A torch negative-bit view imports with its sign (torch drops it), or refuses."""
    v = torch._neg_view(torch.tensor([1.0, -2.0]))
    assert v.is_neg()
    assert tb.from_dlpack(v).tolist() == [-1.0, 2.0]
    with pytest.raises(ValueError, match="negative-bit"):
        tb.from_dlpack(v, copy=False)


def test_requires_grad_tensor_is_refused_to_torch():
    """torch.from_dlpack of a tensor that requires grad is refused with torch's text."""
    t = tb.arange(3, dtype=tb.float32).requires_grad_()
    with pytest.raises(
        BufferError, match=r"Can't export tensors that require gradient, use tensor\.detach\(\)"
    ):
        torch.from_dlpack(t)


def test_torch_asks_versioned_without_stream(counting_exporter):
    """torch.from_dlpack asks a CPU tensor for max_version=(1, 0) and no stream."""
    exporter = counting_exporter(tb.arange(3))
    torch.from_dlpack(exporter)
    assert exporter.kwargs == [{"max_version": (1, 0)}]


def test_torch_tensor_outlives_tensorbridge(counting_exporter):
    """A torch tensor made from a tensor keeps the memory after every tensorbridge object is gone;
    torch calls tensorbridge's deleter exactly once, when its storage dies."""
    t = tb.arange(100)
    alive = weakref.ref(t)
    exporter = counting_exporter(t)
    x = torch.from_dlpack(exporter)
    view = x[50:]
    del t, exporter.tensor, x
    gc.collect()
    assert alive() is not None
    assert view[-1].item() == 99
    assert exporter.total == 0
    del view
    gc.collect()
    assert exporter.total == 1
    assert alive() is None


def test_torch_deleter_runs_once_when_tensorbridge_view_dies():
    """Importing from torch: torch's storage is released when the last tensorbridge view dies."""
    x = torch.arange(10.0)
    storage_ref = weakref.ref(x.untyped_storage())  # a fresh wrapper: only proves no crash
    t = tb.from_dlpack(x)
    address = x.data_ptr()
    del x
    gc.collect()
    assert t.data_ptr() == address
    assert t.tolist()[-1] == 9.0
    del t, storage_ref
    gc.collect()


def test_copy_semantics_with_torch():
    """copy=None/False share; copy=True copies (torch never sets IS_COPIED: tb copies)."""
    x = torch.arange(4.0)
    assert tb.from_dlpack(x, copy=False).data_ptr() == x.data_ptr()
    c = tb.from_dlpack(x, copy=True)
    assert c.data_ptr() != x.data_ptr()
    assert c.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert tb.from_dlpack(x, device="cpu").data_ptr() == x.data_ptr()
    t = tb.arange(4)
    assert torch.from_dlpack(t).data_ptr() == t.data_ptr()


def test_torch_round_trip_keeps_pointer_and_shares_writes():
    """torch -> tensorbridge -> torch keeps the pointer; writes are shared along the chain."""
    x = torch.zeros(3, 4)[:, 1:3]
    y = torch.from_dlpack(tb.from_dlpack(x))
    assert y.data_ptr() == x.data_ptr()
    assert y.stride() == x.stride()
    y[0, 0] = 5.0
    assert x[0, 0].item() == 5.0


def test_read_only_tensor_reaches_torch_versioned():
    """A read-only tensor exports versioned with READ_ONLY; torch 2.13 ignores the flag."""
    np = pytest.importorskip("numpy")
    a = np.arange(3.0)
    a.flags.writeable = False
    t = tb.asarray(a)  # NumPy < 2.1 refuses read-only DLPack exports; asarray reads it another way
    assert t.is_readonly
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr()
    assert x.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(BufferError, match="read-only"):
        torch.from_dlpack(tb.utils.dlpack.to_dlpack(t))
