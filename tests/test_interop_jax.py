"""DLPack interchange with JAX on the CPU (jax.dlpack/jnp.from_dlpack, jax.Array.__dlpack__)."""

from __future__ import annotations

import gc
import importlib
import weakref

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

JAX_DTYPES = [
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "int8",
    "int16",
    "int32",
    "float16",
    "bfloat16",
    "float32",
    "complex64",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]
X64_DTYPES = ["uint64", "int64", "float64", "complex128"]

# JAX's runtime error: JAX_RUNTIME_ERROR in current JAX, jaxlib's XlaRuntimeError in 0.4.
JAX_RUNTIME_ERROR = (
    getattr(jax.errors, "JaxRuntimeError", None)
    or importlib.import_module("jaxlib.xla_extension").XlaRuntimeError
)


@pytest.fixture
def x64():
    """JAX with 64-bit types enabled for the duration of one test."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def jax_sample(name, n=8):
    """A JAX array of ``name`` whose bytes are 1, 2, 3, ... (bool: alternating)."""
    dtype = jnp.dtype(name)
    if name == "bool":
        return jnp.array([False, True] * (n // 2))
    raw = jnp.arange(1, n * dtype.itemsize + 1, dtype=jnp.uint8)
    return raw.view(dtype)


def jax_bits(x):
    return np.asarray(x).tobytes()


def tb_bits(t):
    return bytes(t._bytes("test"))


def _jax_exports_or_skip(name):
    """A JAX sample of ``name``, when this JAX has the dtype and exports it through DLPack (JAX
    0.4.30 has no float8_e3m4, float8_e4m3 or float8_e8m0fnu, and exports no float8 at all)."""
    try:
        x = jax_sample(name)
        x.__dlpack__()
    except (TypeError, JAX_RUNTIME_ERROR) as exc:
        pytest.skip(f"JAX {jax.__version__} does not export {name}: {exc}")
    return x


def _both_ways(name):
    x = _jax_exports_or_skip(name)
    t = tb.from_dlpack(x)
    assert t.dtype is getattr(tb, name)
    assert t.data_ptr() == x.unsafe_buffer_pointer()
    assert tb_bits(t) == jax_bits(x)
    owned = t.clone()  # 64-byte aligned tensorbridge memory: JAX imports it without copying
    for convert in (jnp.from_dlpack, jax.dlpack.from_dlpack):
        y = convert(owned)
        assert y.dtype == jnp.dtype(name)
        assert jax_bits(y) == tb_bits(owned)
        assert y.unsafe_buffer_pointer() == owned.data_ptr()


@pytest.mark.parametrize("name", JAX_DTYPES)
def test_jax_both_ways_every_dtype(name):
    """JAX -> tensorbridge shares the buffer; back to JAX shares aligned memory; bytes equal."""
    _both_ways(name)


@pytest.mark.parametrize("name", X64_DTYPES)
def test_jax_both_ways_64_bit_dtypes(name, x64):
    """With jax_enable_x64, the 64-bit dtypes cross both ways too."""
    _both_ways(name)


def test_dtypes_jax_lacks_fail_cleanly():
    """JAX's own errors for complex32 and float4_e2m1fn_x2 (lanes=2) pass through; nothing leaks."""
    for dtype in (tb.complex32, tb.float4_e2m1fn_x2):
        t = (
            tb.zeros(4, dtype=tb.uint8).view(dtype)
            if dtype.itemsize == 1
            else tb.zeros(2, dtype=dtype)
        )
        alive = weakref.ref(t)
        with pytest.raises(Exception, match=r"(?i)dlpack") as info:
            jnp.from_dlpack(t)
        assert not isinstance(info.value, SystemError)
        del t, info
        gc.collect()
        assert alive() is None


def test_jax_float4_is_refused_by_tensorbridge():
    """JAX's unpacked float4_e2m1fn (17, 4, 1) has no tensorbridge dtype: BufferError naming it."""
    if not hasattr(jnp, "float4_e2m1fn"):
        pytest.skip(f"JAX {jax.__version__} has no float4_e2m1fn")
    with pytest.raises(BufferError, match="code=17, bits=4, lanes=1"):
        tb.from_dlpack(jnp.zeros(4, dtype=jnp.float4_e2m1fn))


def test_unaligned_view_is_copied_by_jax(counting_exporter):
    """JAX copies memory that is not 64-byte aligned; values are right and the deleter runs once."""
    t = tb.arange(9, dtype=tb.float32)[1:]
    exporter = counting_exporter(t)
    y = jnp.from_dlpack(exporter)
    assert y.tolist() == t.tolist()
    del y
    gc.collect()
    assert exporter.total == 1


def _jax_asks(counting_exporter) -> dict[str, object]:
    """The keywords ``jnp.from_dlpack`` passes to ``__dlpack__``, observed: JAX 0.10 passes
    ``stream=None`` alone (a legacy capsule), JAX 0.12 ``max_version=(1, 3)`` too."""
    exporter = counting_exporter(tb.arange(4, dtype=tb.float32))
    assert jnp.from_dlpack(exporter).tolist() == [0.0, 1.0, 2.0, 3.0]
    (kwargs,) = exporter.kwargs
    return kwargs


def test_jax_asks_for_a_capsule_tensorbridge_gives(counting_exporter):
    """JAX asks once, with ``stream=None`` and at most a ``max_version`` of DLPack 1.x."""
    kwargs = _jax_asks(counting_exporter)
    assert kwargs["stream"] is None and set(kwargs) <= {"stream", "max_version"}
    version = kwargs.get("max_version", (1, 0))
    assert isinstance(version, tuple) and version[0] == 1


def test_read_only_tensor_goes_to_jax_only_as_versioned(counting_exporter):
    """A legacy capsule cannot carry READ_ONLY, so a read-only tensor refuses one (JAX up to 0.10
    asks for it); a versioned capsule says read-only, and JAX, whose arrays are immutable, takes it."""
    versioned = "max_version" in _jax_asks(counting_exporter)
    a = np.arange(4.0, dtype=np.float32)
    a.flags.writeable = False
    t = tb.asarray(a)  # read-only on every NumPy (from_dlpack is refused before NumPy 2.1)
    assert t.is_readonly
    if versioned:
        assert jnp.from_dlpack(t).tolist() == [0.0, 1.0, 2.0, 3.0]
    else:
        with pytest.raises(BufferError, match="read-only"):
            jnp.from_dlpack(t)
    assert jnp.from_dlpack(t.clone()).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_jax_array_outlives_tensorbridge(counting_exporter):
    """A JAX array made from a tensor keeps the memory after every tensorbridge object is gone; JAX
    calls tensorbridge's deleter exactly once, when the array is deleted."""
    t = tb.arange(64, dtype=tb.float32)
    alive = weakref.ref(t)
    exporter = counting_exporter(t)
    y = jnp.from_dlpack(exporter)
    del t, exporter.tensor
    gc.collect()
    assert alive() is not None
    assert float(y[63]) == 63.0
    assert exporter.total == 0
    del y
    gc.collect()
    assert exporter.total == 1
    assert alive() is None


def test_jax_buffer_lives_while_tensorbridge_views_do():
    """Importing from JAX keeps JAX's buffer alive while any view lives."""
    x = jnp.arange(16, dtype=jnp.float32) * 2
    t = tb.from_dlpack(x)
    view = t[8:]
    del x, t
    gc.collect()
    assert view.tolist() == [float(2 * i) for i in range(8, 16)]


# JAX takes only compact layouts (a transposition is fine; size-1 dims with odd strides,
# broadcasts and gaps are not). tensorbridge hands its strides over as they are: the refusal is
# JAX's own.
JAX_COMPACT = {"c_order", "f_order", "negative_step", "zero_d", "empty", "offset"}


def _jax_reads_transposed_layouts() -> bool:
    """Whether this JAX reads a column-major DLPack tensor right. Some releases on CPU (0.6.2 on
    Python 3.10 here) read it as row-major, silently, whoever the producer (NumPy too)."""
    raw = np.zeros(24 + 16, dtype=np.int32)
    start = (-raw.ctypes.data % 64) // 4  # JAX shares (and misreads) only 64-byte aligned memory
    a = raw[start : start + 24]
    a[:] = np.arange(24)
    a = a.reshape(4, 3, 2).transpose(2, 1, 0)
    return jnp.from_dlpack(a).tolist() == a.tolist()


def test_layout_to_jax(layout):
    """Compact layouts reach JAX with their values; JAX refuses the others itself, cleanly."""
    name, t = layout
    if name in JAX_COMPACT:
        if name == "f_order" and not _jax_reads_transposed_layouts():
            pytest.skip(f"JAX {jax.__version__} misreads column-major DLPack tensors")
        assert jnp.from_dlpack(t).tolist() == t.tolist()
        return
    with pytest.raises(JAX_RUNTIME_ERROR, match="striding"):
        jnp.from_dlpack(t)
    assert jnp.from_dlpack(t.contiguous()).tolist() == t.tolist()


def test_jax_refusal_leaks_nothing():
    """A capsule JAX rejects after receiving it is released: the tensor is freed."""
    t = tb.arange(8, dtype=tb.int32)[::2]
    alive = weakref.ref(t)
    with pytest.raises(JAX_RUNTIME_ERROR, match="striding"):
        jnp.from_dlpack(t)
    del t
    gc.collect()
    assert alive() is None


def test_jax_layouts_import():
    """JAX arrays of every rank import with the right shape and values."""
    for x in (
        jnp.array(2.5),
        jnp.zeros((0, 3)),
        jnp.arange(6.0).reshape(2, 3).T,
        jnp.ones((1,) * 32),
    ):
        t = tb.from_dlpack(x)
        assert t.shape == x.shape
        assert t.tolist() == x.tolist()


def test_chain_numpy_tensorbridge_torch_tensorbridge_jax():
    """NumPy -> tensorbridge -> PyTorch -> tensorbridge -> JAX keeps the values, and the pointer
    as JAX (which copies only when the start is not 64-byte aligned)."""
    torch = pytest.importorskip("torch")
    a = np.arange(12, dtype=np.float32).reshape(4, 3)[1:3]
    t1 = tb.from_dlpack(a)
    x = torch.from_dlpack(t1)
    t2 = tb.from_dlpack(x)
    y = jnp.from_dlpack(t2)
    pointer = a.__array_interface__["data"][0]
    assert t1.data_ptr() == x.data_ptr() == t2.data_ptr() == pointer
    assert t2.stride() == (3, 1)
    assert y.tolist() == a.tolist()
    x[0, 0] = -1.0
    assert a[0, 0] == -1.0
    assert t2[0, 0].item() == -1.0
    del t1, x, t2
    gc.collect()
    assert y.tolist()[1] == [6.0, 7.0, 8.0]


def test_jax_method_gives_the_values_of_every_layout(layout):
    """t.jax() hands JAX a row-major tensor, so every layout arrives with its values, on every
    JAX (some releases misread column-major DLPack tensors)."""
    _, t = layout
    assert t.jax().tolist() == t.tolist()
