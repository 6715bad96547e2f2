"""DLPack interchange with MLX on the CPU (mx.from_dlpack, mx.array.__dlpack__).

MLX exports its arrays' memory as it is (a view keeps its strides); ``mx.from_dlpack`` copies what
it imports (MLX's own behaviour: its arrays own their buffers), and casts float64 to float32 as
``mx.array`` does on the CPU.
"""

from __future__ import annotations

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")
# On Linux the mlx wheel needs a backend (mlx[cpu] installs mlx-cpu): without one, importing it
# raises ImportError (not ModuleNotFoundError), and MLX counts as absent.
mx = pytest.importorskip("mlx.core", exc_type=ImportError)

# Every dtype MLX and tensorbridge share (MLX spells bool "bool_").
MLX_DTYPES = {
    "bool": "bool_",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float64": "float64",
    "complex64": "complex64",
}


def owned_sample(name, n=8):
    """A tensorbridge tensor of ``name`` whose bytes are 1, 2, 3, ... (bool: alternating)."""
    dtype = getattr(tb, name)
    if name == "bool":
        return tb.tensor([False, True] * (n // 2))
    return tb.frombuffer(bytearray(range(1, n * dtype.itemsize + 1)), dtype=dtype).clone()


def tb_bytes(t):
    return bytes(t.contiguous().as_memoryview())


def address(x):
    """Where an MLX array's memory is: NumPy's view of it through the buffer protocol."""
    return np.asarray(memoryview(x)).__array_interface__["data"][0]


@pytest.mark.parametrize("name", sorted(MLX_DTYPES))
def test_every_dtype_both_ways(name):
    """Every shared dtype reaches MLX with its bytes (MLX copies), and MLX's own array comes back
    over MLX's memory with the same bytes."""
    owned = owned_sample(name)
    x = mx.from_dlpack(owned)
    if name == "float64":
        # MLX's from_dlpack makes its array as mx.array does: float64 becomes float32 on the CPU.
        assert x.dtype == mx.float32
        x = mx.array(np.asarray(owned.numpy()), dtype=mx.float64)
    assert x.dtype == getattr(mx, MLX_DTYPES[name])
    mx.eval(x)
    for convert in (tb.from_dlpack, tb.asarray):
        t = convert(x)
        assert t.dtype is getattr(tb, name)
        assert tb_bytes(t) == tb_bytes(owned)
        if name not in ("bfloat16",):  # NumPy has no bfloat16 buffer format to read MLX's through
            assert t.data_ptr() == address(x)


def test_mlx_from_dlpack_copies():
    """mx.from_dlpack copies (MLX's behaviour): a later write in tensorbridge is not seen."""
    t = tb.arange(6, dtype=tb.float32)
    x = mx.from_dlpack(t)
    t[0] = 42.0
    assert x.tolist()[0] == 0.0


def test_shapes_and_strides_from_mlx():
    """MLX arrays and views import with their shape, strides and values, over MLX's memory."""
    for shape in [(), (5,), (2, 3), (2, 3, 4)]:
        x = mx.arange(int(np.prod(shape)), dtype=mx.float32).reshape(shape)
        mx.eval(x)
        t = tb.from_dlpack(x)
        assert t.shape == shape
        assert t.tolist() == x.tolist()
    x = mx.arange(12, dtype=mx.float32).reshape(3, 4)[:, 1:3]
    mx.eval(x)
    t = tb.from_dlpack(x)
    assert t.shape == (3, 2) and t.stride() == (4, 1)
    assert t.tolist() == [[1.0, 2.0], [5.0, 6.0], [9.0, 10.0]]


def test_strides_to_mlx():
    """Strided views reach MLX with their values (MLX copies them into its own layout)."""
    s = tb.arange(12, dtype=tb.float32).reshape(3, 4)
    for view in (s[:, ::2], s.T, s[1:]):
        assert mx.from_dlpack(view).tolist() == view.tolist()


def test_write_in_tensorbridge_seen_by_mlx_array():
    """An imported MLX array is shared, writable memory: a write through tensorbridge is read
    back by MLX."""
    x = mx.zeros(6, dtype=mx.float32)
    mx.eval(x)
    t = tb.from_dlpack(x)
    t[1] = -1.0
    assert x.tolist()[1] == -1.0
