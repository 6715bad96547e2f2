"""DLPack interchange with NVIDIA Warp on the CPU (wp.from_dlpack, wp.to_dlpack, wp.array.__dlpack__).

Warp arrays are mutable: memory is shared both ways, writable. Warp's strides are in bytes.
"""

from __future__ import annotations

import gc
import weakref

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")
wp = pytest.importorskip("warp")

# Every scalar dtype Warp and tensorbridge share (same names in both).
WARP_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
]


@pytest.fixture(scope="module", autouse=True)
def _warp_initialised():
    """Warp initialised once, quietly (its banner goes to stdout)."""
    wp.config.quiet = True
    wp.init()


def owned_sample(name, n=8):
    """A tensorbridge tensor of ``name`` whose bytes are 1, 2, 3, ... (bool: alternating)."""
    dtype = getattr(tb, name)
    if name == "bool":
        return tb.tensor([False, True] * (n // 2))
    return tb.frombuffer(bytearray(range(1, n * dtype.itemsize + 1)), dtype=dtype).clone()


def tb_bytes(t):
    return bytes(t.contiguous().as_memoryview())


@pytest.mark.parametrize("name", WARP_DTYPES)
def test_every_dtype_both_ways(name):
    """Every shared dtype goes to Warp over tensorbridge's memory, and a Warp-owned array comes
    back over Warp's memory, with its bytes, both ways writable."""
    owned = owned_sample(name)
    for y in (wp.from_dlpack(owned), wp.from_dlpack(owned.__dlpack__())):
        assert y.dtype is getattr(wp, name)
        assert y.ptr == owned.data_ptr()
        assert y.device.is_cpu
    w = wp.clone(y)  # Warp's own memory
    for convert in (tb.from_dlpack, tb.asarray):
        t = convert(w)
        assert t.dtype is getattr(tb, name)
        assert t.data_ptr() == w.ptr
        assert tb_bytes(t) == tb_bytes(owned)
        assert not t.is_readonly
    assert tb.from_dlpack(wp.to_dlpack(w)).data_ptr() == w.ptr


def test_shapes_and_strides_from_warp():
    """Warp arrays and their strided views import with their shape, strides and values."""
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    w = wp.array(a, dtype=wp.float32, device="cpu")
    t = tb.from_dlpack(w)
    assert t.shape == (2, 3, 4) and t.stride() == (12, 4, 1)
    assert t.tolist() == a.tolist()
    view = wp.array(np.arange(12, dtype=np.float32).reshape(3, 4), device="cpu")[:, 1:3]
    tv = tb.from_dlpack(view)
    assert tv.shape == (3, 2) and tv.stride() == tuple(s // 4 for s in view.strides)
    assert tv.data_ptr() == view.ptr
    assert tv.tolist() == [[1.0, 2.0], [5.0, 6.0], [9.0, 10.0]]


def test_strides_to_warp():
    """Strided views reach Warp with their strides (Warp's in bytes) over the same memory."""
    s = tb.arange(12, dtype=tb.float32).reshape(3, 4)
    for view in (s[:, ::2], s.T, s[1:]):
        y = wp.from_dlpack(view)
        assert y.shape == tuple(view.shape)
        assert y.strides == tuple(4 * k for k in view.stride())
        assert y.ptr == view.data_ptr()
        assert y.numpy().tolist() == view.tolist()


def test_writes_seen_both_ways():
    """Memory is shared both ways: a write on either side is seen on the other."""
    s = tb.arange(6, dtype=tb.float32)
    y = wp.from_dlpack(s)
    s[0] = 42.0
    assert y.numpy()[0] == 42.0
    w = wp.zeros(6, dtype=wp.float32, device="cpu")
    t = tb.from_dlpack(w)
    t[1] = -1.0
    assert w.numpy()[1] == -1.0


def test_warp_memory_lives_while_the_tensor_does():
    """A tensor imported from Warp keeps Warp's allocation alive after the array is gone."""
    w = wp.array(np.arange(64, dtype=np.float32), device="cpu")
    t = tb.from_dlpack(w)
    alive = weakref.ref(w)
    del w
    gc.collect()
    assert t.tolist()[63] == 63.0
    del t
    gc.collect()
    assert alive() is None
