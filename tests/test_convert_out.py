"""Conversions out: Tensor.numpy(), to_torch / Tensor.torch(), Tensor.jax().

Each is a thin wrapper over a protocol the peer reads; the tests check the peer sees the same memory
(pointer, strides, writes both ways), the lifetime (the tensor outlives its own references while the
peer's array lives), read-only handling, dtypes the peer lacks, and requires_grad.
"""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

import tensorbridge as tb
from tensorbridge._peers import to_torch

FAKE_CUDA_PTR = 0x7F00_0000_0000


def _readonly_tensor() -> tb.Tensor:
    t = tb.asarray(b"\x01\x02\x03\x04")
    assert t.is_readonly
    return t


# ---------------------------------------------------------------------------------------------- numpy
np = pytest.importorskip("numpy")


def test_numpy_shares_every_layout(layout):
    """Every layout converts zero-copy: same first-element address, byte strides and values."""
    _, t = layout
    a = t.numpy()
    assert a.tolist() == t.tolist()
    assert a.shape == tuple(t.shape)
    if t.numel():
        assert a.ctypes.data == t.data_ptr()
        nontrivial = [i for i, n in enumerate(t.shape) if n > 1]
        assert [a.strides[i] for i in nontrivial] == [t.stride(i) * t.itemsize for i in nontrivial]


def test_numpy_writes_are_shared_both_ways():
    """A write through the array shows in the tensor and back."""
    t = tb.arange(6, dtype=tb.float32).reshape(2, 3)
    a = t.numpy()
    a[1, 2] = -1.0
    assert t[1, 2].item() == -1.0
    t[0, 0] = 7.0
    assert a[0, 0] == 7.0


def test_numpy_array_keeps_the_tensor_alive():
    """The array holds the tensor (and so its memory) until the array dies."""
    t = tb.arange(3, dtype=tb.int16)
    ref = weakref.ref(t)
    a = t.numpy()
    del t
    gc.collect()
    assert ref() is not None
    assert a.tolist() == [0, 1, 2]
    del a
    gc.collect()
    assert ref() is None


def test_numpy_readonly_tensor_gives_readonly_array():
    """Read-only memory stays read-only in NumPy."""
    a = _readonly_tensor().numpy()
    assert not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 5


@pytest.mark.parametrize(
    "dtype",
    [
        tb.bool,
        tb.uint8,
        tb.int8,
        tb.uint16,
        tb.int16,
        tb.uint32,
        tb.int32,
        tb.uint64,
        tb.int64,
        tb.float16,
        tb.float32,
        tb.float64,
        tb.complex64,
        tb.complex128,
    ],
)
def test_numpy_native_dtypes(dtype):
    """Each dtype NumPy has converts to the NumPy dtype of the same name."""
    t = tb.tensor([0, 1, 1], dtype=dtype)
    a = t.numpy()
    assert a.dtype == np.dtype(dtype.name)
    assert a.tolist() == t.tolist()


@pytest.mark.parametrize(
    "dtype",
    [
        tb.bfloat16,
        tb.float8_e4m3fn,
        tb.float8_e5m2,
        tb.float8_e4m3fnuz,
        tb.float8_e5m2fnuz,
        tb.complex32,
    ],
)
def test_numpy_ml_dtypes(dtype):
    """Types NumPy lacks become ml_dtypes arrays over the same memory."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not hasattr(ml_dtypes, dtype.name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {dtype.name}")
    t = tb.tensor([1, 2, -0.5], dtype=dtype)
    a = t.numpy()
    assert a.dtype == np.dtype(getattr(ml_dtypes, dtype.name))
    assert a.ctypes.data == t.data_ptr()
    assert [complex(v) for v in a.tolist()] == [complex(v) for v in t.tolist()]


def test_numpy_without_ml_dtypes_is_a_clear_error(monkeypatch):
    """Without ml_dtypes, bfloat16 is refused with an install hint and a raw-bits alternative."""
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(TypeError, match=r"install ml_dtypes.*view\(tensorbridge\.uint16\)"):
        tb.zeros(2, dtype=tb.bfloat16).numpy()


def test_numpy_float4_is_refused():
    """Packed float4 pairs have no NumPy dtype: refused, pointing to a uint8 view."""
    with pytest.raises(TypeError, match="uint8"):
        tb.zeros(2, dtype=tb.uint8).view(tb.float4_e2m1fn_x2).numpy()


def test_numpy_requires_grad():
    """requires_grad is refused with PyTorch's text; force=True detaches and still shares."""
    t = tb.arange(3, dtype=tb.float32).requires_grad_()
    with pytest.raises(RuntimeError, match=r"Can't call numpy\(\) on Tensor that requires grad"):
        t.numpy()
    a = t.numpy(force=True)
    assert a.ctypes.data == t.data_ptr()


def test_numpy_device_memory_is_refused():
    """Device memory cannot become a NumPy array: TypeError with PyTorch's wording, nothing read."""
    t = tb.from_pointer(FAKE_CUDA_PTR, (2,), tb.float32, device="cuda")
    with pytest.raises(TypeError, match="can't convert cuda device type tensor to numpy"):
        t.numpy()
    with pytest.raises(TypeError, match="can't convert"):
        t.numpy(force=True)


def test_numpy_round_trip_through_asarray():
    """asarray(t.numpy()) views the original memory again."""
    t = tb.arange(8, dtype=tb.int32).reshape(2, 4)[:, 1:3]
    back = tb.asarray(t.numpy())
    assert back.data_ptr() == t.data_ptr()
    assert back.tolist() == t.tolist()


# ---------------------------------------------------------------------------------------------- torch
def _torch():
    return pytest.importorskip("torch")


def test_torch_shares_memory():
    """to_torch is zero-copy: same pointer, strides, writes both ways."""
    torch = _torch()
    t = tb.arange(12, dtype=tb.float32).reshape(3, 4).t()
    x = to_torch(t)
    assert isinstance(x, torch.Tensor)
    assert x.data_ptr() == t.data_ptr()
    assert x.stride() == t.stride()
    x[0, 0] = 42
    assert t[0, 0].item() == 42
    assert t.torch().data_ptr() == t.data_ptr()


def test_torch_layouts(layout):
    """Every layout PyTorch can represent converts zero-copy; negative steps are refused, not aborted."""
    name, t = layout
    _torch()
    if name == "negative_step":
        with pytest.raises(BufferError, match="negative strides"):
            to_torch(t)
        return
    x = to_torch(t)
    assert x.tolist() == t.tolist()
    if t.numel():
        assert x.data_ptr() == t.data_ptr()


def test_torch_keeps_requires_grad():
    """requires_grad carries over: the torch tensor is a leaf that requires grad, sharing memory."""
    _torch()
    t = tb.ones(3, dtype=tb.float32).requires_grad_()
    x = to_torch(t)
    assert x.requires_grad
    assert x.is_leaf
    assert x.data_ptr() == t.data_ptr()
    (x * 2).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_torch_refuses_readonly_unless_forced():
    """PyTorch has no read-only tensors: BufferError suggesting a copy; force=True hands it a copy."""
    _torch()
    t = _readonly_tensor()
    with pytest.raises(BufferError, match=r"read-only.*clone\(\)"):
        t.torch()
    x = to_torch(t, force=True)
    assert x.data_ptr() != t.data_ptr()
    assert x.tolist() == [1, 2, 3, 4]


def test_torch_refuses_negative_strides_unless_forced():
    """Negative strides (which abort torch.from_dlpack) are refused; force=True copies."""
    _torch()
    t = tb.arange(6)[::-1]
    with pytest.raises(BufferError, match="negative strides"):
        to_torch(t)
    assert to_torch(t, force=True).tolist() == [5, 4, 3, 2, 1, 0]


def test_torch_negative_stride_on_size_one_dim_is_fine():
    """A negative stride on a size-1 dimension moves nothing: shared as is."""
    _torch()
    t = tb.arange(4).as_strided((1, 4), (-3, 1), 0)
    assert to_torch(t).data_ptr() == t.data_ptr()


@pytest.mark.parametrize(
    "dtype",
    [
        tb.bool,
        tb.uint8,
        tb.int64,
        tb.float16,
        tb.bfloat16,
        tb.complex64,
        tb.float8_e4m3fn,
        tb.float8_e5m2,
    ],
)
def test_torch_dtypes(dtype):
    """Dtypes map to the PyTorch dtype of the same name."""
    torch = _torch()
    x = to_torch(tb.zeros(2, dtype=dtype))
    assert x.dtype == getattr(torch, dtype.name)


def test_torch_tensor_keeps_memory_alive():
    """The torch tensor holds the tensorbridge storage until it dies."""
    _torch()
    t = tb.arange(4, dtype=tb.int32)
    ref = weakref.ref(t._storage)
    x = to_torch(t)
    del t
    gc.collect()
    assert ref() is not None
    assert x.tolist() == [0, 1, 2, 3]
    del x
    gc.collect()
    assert ref() is None


# ---------------------------------------------------------------------------------------------- jax
def _jax():
    return pytest.importorskip("jax")


def test_jax_values_and_dtype():
    """A tensor converts to a JAX array with its values and dtype (32-bit, JAX's default)."""
    _jax()
    t = tb.arange(6, dtype=tb.float32).reshape(2, 3)
    j = t.jax()
    assert j.dtype.name == "float32"
    assert j.tolist() == t.tolist()


def test_jax_shares_aligned_memory():
    """Compact, 64-byte aligned tensorbridge memory is shared by JAX."""
    _jax()
    t = tb.arange(16, dtype=tb.float32)
    assert t.jax().unsafe_buffer_pointer() == t.data_ptr()


def test_jax_layouts(layout):
    """Every layout converts with equal values (non-compact ones through a contiguous copy)."""
    _jax()
    _, t = layout
    assert t.jax().tolist() == t.tolist()


def test_jax_readonly_and_requires_grad():
    """Read-only tensors convert (through a copy); requires_grad is dropped."""
    _jax()
    assert _readonly_tensor().jax().tolist() == [1, 2, 3, 4]
    assert tb.ones(2, dtype=tb.float32).requires_grad_().jax().tolist() == [1.0, 1.0]


def test_jax_bfloat16():
    """bfloat16 converts to JAX's bfloat16."""
    _jax()
    assert tb.tensor([1.5, -2.0], dtype=tb.bfloat16).jax().dtype.name == "bfloat16"


def test_numpy_with_ml_dtypes_lacking_the_type_is_a_clear_error(monkeypatch):
    """An ml_dtypes without the type (0.5 has no complex32) is a TypeError naming the type and
    the version, not an AttributeError from inside numpy()."""

    class OldMlDtypes:
        __version__ = "0.5.4"

    monkeypatch.setitem(sys.modules, "ml_dtypes", OldMlDtypes())
    t = tb.zeros(2, dtype=tb.complex32)
    with pytest.raises(TypeError, match=r"complex32 .*ml_dtypes 0\.5\.4"):
        t.numpy()
    with pytest.raises(TypeError, match="complex32"):
        np.asarray(t)
