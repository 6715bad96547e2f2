"""DLPack interchange with NumPy in both directions (np.from_dlpack, ndarray.__dlpack__)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref

import pytest

import tensorbridge as tb
from tensorbridge._tensor import _from_bytes

np = pytest.importorskip("numpy")

# NumPy 2.1 brought DLPack 1.0 to NumPy: ``__dlpack__`` takes max_version, dl_device and copy,
# np.from_dlpack reads versioned capsules and takes copy/device. Before, NumPy (1.26, 2.0) imports
# DLPack read-only and refuses to export read-only arrays, so they cannot go back through DLPack.
NUMPY_DLPACK_1 = np.lib.NumpyVersion(np.__version__) >= "2.1.0"

NUMPY_DTYPES = [
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
    "float32",
    "float64",
    "complex64",
    "complex128",
]
# tensorbridge dtypes NumPy 2.4 cannot import through DLPack (no code 4/5-32/7-14, no lanes=2).
NON_NUMPY_DTYPES = [
    "bfloat16",
    "complex32",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
]


def np_sample(name, n=6):
    values = (
        np.arange(1, n + 1) % 2
        if name == "bool"
        else np.arange(1, n + 1) * (1 + 1j if "complex" in name else 1)
    )
    return values.astype(name)


def tb_sample(name, n=6):
    dtype = getattr(tb, name)
    data = bytes(range(1, n * dtype.itemsize + 1)) if name != "bool" else bytes([0, 1] * (n // 2))
    return _from_bytes(data, (n,), dtype)


def data_ptr(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_tensorbridge_from_numpy_shares_every_dtype(name):
    """tb.from_dlpack(ndarray) shares memory: same pointer and values, writes seen both ways."""
    a = np_sample(name)
    t = tb.from_dlpack(a)
    assert t.dtype is getattr(tb, name)
    assert t.data_ptr() == data_ptr(a)
    assert t.tolist() == a.tolist()
    t[0] = a[1].item()
    assert a[0] == a[1]
    a[2] = a[3]
    assert t[2].item() == a[3].item()


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_numpy_from_tensorbridge_shares_every_dtype(name):
    """np.from_dlpack(tensor) shares memory: same pointer and values, writes seen both ways."""
    t = tb_sample(name)
    a = np.from_dlpack(t)
    assert a.dtype == np.dtype(name)
    assert data_ptr(a) == t.data_ptr()
    assert a.tolist() == t.tolist()
    assert a.flags.writeable is NUMPY_DLPACK_1
    if not NUMPY_DLPACK_1:
        return
    a[0] = a[1]
    assert t[0].item() == t[1].item()
    t[2] = t[3].item()
    assert a[2] == a[3]


_LACKS_CHILD = """
import gc, json, sys, weakref
sys.modules["ml_dtypes"] = None  # nothing registers a dtype with NumPy
import numpy as np
import tensorbridge as tb
t = tb.zeros(4, dtype=getattr(tb, sys.argv[1]))
alive = weakref.ref(t)
try:
    np.from_dlpack(t)
except Exception as exc:
    error = [type(exc).__name__, str(exc)]
else:
    error = None
del t
gc.collect()  # the rejected capsule was abandoned; the reaper releases it
print(json.dumps({"error": error, "alive": alive() is not None}))
"""


@pytest.mark.parametrize("name", NON_NUMPY_DTYPES)
def test_dtypes_numpy_lacks_fail_cleanly(name):
    """NumPy's error for a dtype it lacks passes through (no SystemError); nothing leaks.

    In a child that never imports ml_dtypes: ml_dtypes 0.7 registers its types with NumPy 2.5's
    DLPack (below), and any test (or JAX) that imported it would have done so in this process.
    """
    proc = subprocess.run(
        [sys.executable, "-c", _LACKS_CHILD, name],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["error"] is not None, f"NumPy imported {name}"
    kind, message = result["error"]
    assert kind in ("RuntimeError", "BufferError"), result  # NumPy 2.4 / 2.5
    assert "Unsupported" in message, result
    assert not result["alive"]


def _ml_dtypes_registers(ml_dtypes):
    """Whether importing ml_dtypes registered its types with NumPy's DLPack: NumPy 2.5 has
    ``np.dtypes.register_dlpack_dtype``, and ml_dtypes 0.7 calls it when imported under it."""
    return hasattr(np.dtypes, "register_dlpack_dtype") and (
        np.lib.NumpyVersion(ml_dtypes.__version__) >= "0.7.0"
    )


ML_DTYPES_NAMES = [d.name for d in tb._dtype.ALL_DTYPES if d.ml_dtypes is not None]


@pytest.mark.parametrize("name", ML_DTYPES_NAMES)
def test_ml_dtypes_registered_dtypes_reach_numpy_through_dlpack(name):
    """Decision: where ml_dtypes registers its types with NumPy (NumPy 2.5, ml_dtypes 0.7),
    np.from_dlpack shares a bfloat16, complex32 or float8 tensor as the ml_dtypes array, and that
    array comes back through DLPack as the same dtype over the same memory. Elsewhere NumPy's
    refusal passes through."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ml_type = getattr(ml_dtypes, name, None)
    if ml_type is None:
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    t = tb_sample(name, 4)
    if not _ml_dtypes_registers(ml_dtypes):
        with pytest.raises((RuntimeError, BufferError), match="Unsupported"):
            np.from_dlpack(t)
        return
    a = np.from_dlpack(t)
    assert a.dtype == np.dtype(ml_type)
    assert data_ptr(a) == t.data_ptr()
    assert a.tobytes() == t.numpy().tobytes()
    back = tb.from_dlpack(a)
    assert back.dtype is t.dtype
    assert back.data_ptr() == t.data_ptr()
    assert tb.asarray(a).dtype is t.dtype


def test_float4_pairs_stay_refused_by_numpy_with_ml_dtypes():
    """float4_e2m1fn_x2 (two values per byte, lanes=2) has no NumPy dtype even where ml_dtypes
    registers its types: NumPy's refusal passes through."""
    pytest.importorskip("ml_dtypes")
    with pytest.raises((RuntimeError, BufferError), match="Unsupported"):
        np.from_dlpack(tb_sample("float4_e2m1fn_x2"))


def test_bfloat16_reaches_numpy_through_ml_dtypes():
    """Decision: bfloat16/float8 reach NumPy as bits (uint views) that ml_dtypes reinterprets."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = tb.tensor([1.5, -2.0, 3.25], dtype=tb.bfloat16)
    a = np.from_dlpack(t.view(tb.uint16)).view(ml_dtypes.bfloat16)
    assert a.tolist() == [1.5, -2.0, 3.25]
    assert data_ptr(a) == t.data_ptr()
    f8 = tb.tensor([0.5, -1.0], dtype=tb.float8_e4m3fn)
    b = np.from_dlpack(f8.view(tb.uint8)).view(ml_dtypes.float8_e4m3fn)
    assert b.astype(np.float32).tolist() == [0.5, -1.0]


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "bcomplex32"])
def test_ml_dtypes_array_exported_by_numpy(name):
    """An ml_dtypes array reaches tensorbridge through NumPy's DLPack export where ml_dtypes
    registers its types (as its own dtype, over its memory; a type tensorbridge lacks, such as
    bcomplex32, is tensorbridge's clean refusal); elsewhere NumPy's BufferError passes through."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ml_type = getattr(ml_dtypes, name, None)
    if ml_type is None:
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    a = np.zeros(3, dtype=ml_type)
    if not _ml_dtypes_registers(ml_dtypes):
        with pytest.raises(BufferError, match="DLPack only supports"):
            tb.from_dlpack(a)
    elif not hasattr(tb, name):
        with pytest.raises(BufferError, match=r"from_dlpack\(\): unsupported DLPack dtype"):
            tb.from_dlpack(a)
    else:
        t = tb.from_dlpack(a)
        assert t.dtype is getattr(tb, name)
        assert t.data_ptr() == data_ptr(a)


def test_layout_to_numpy(layout):
    """Every layout reaches NumPy with its values (negative strides as a flagged copy)."""
    name, t = layout
    a = np.from_dlpack(t)
    assert a.shape == tuple(t.shape)
    assert a.tolist() == t.tolist()
    if t.numel() and name != "negative_step":
        assert data_ptr(a) == t.data_ptr()
        assert tuple(s // a.itemsize for s in a.strides) == tuple(
            st if n > 1 else s // a.itemsize
            for st, n, s in zip(t.stride(), t.shape, a.strides, strict=True)
        )


def test_layout_from_numpy_round_trip(layout):
    """NumPy views of every layout import back with the same values and memory."""
    _, t = layout
    a = np.from_dlpack(t)
    # NumPy before 2.1 refuses to export the read-only array it made; asarray reads it instead.
    back = tb.from_dlpack(a) if NUMPY_DLPACK_1 else tb.asarray(a)
    assert back.tolist() == t.tolist()
    assert back.shape == t.shape
    if t.numel():
        assert back.data_ptr() == data_ptr(a)


@pytest.mark.parametrize("index", [np.s_[::-1], np.s_[::-2, 1:], np.s_[:, ::-3], np.s_[::-1, ::-1]])
def test_numpy_negative_strides_import_as_views(index):
    """Negative strides from NumPy import as views with the right values (torch 2.13 aborts)."""
    a = np.arange(24.0).reshape(4, 6)[index]
    t = tb.from_dlpack(a)
    assert t.tolist() == a.tolist()
    assert t.data_ptr() == data_ptr(a)
    assert t.stride() == tuple(s // 8 for s in a.strides)


def test_unaligned_numpy_data():
    """Unaligned data (offset=1 into a buffer) imports with the right values."""
    raw = bytearray(b"\x00" + np.arange(4, dtype=np.int32).tobytes())  # writable: every NumPy
    a = np.frombuffer(raw, dtype=np.int32, offset=1)
    t = tb.from_dlpack(a)
    assert t.data_ptr() % 4 == 1
    assert t.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("ndim", [0, 1, 2, 32, 64])
def test_numpy_dimensions(ndim):
    """0-d to 64-d arrays round-trip (NumPy 2.4 exports NULL shape/strides for 0-d)."""
    if ndim > 32 and np.lib.NumpyVersion(np.__version__) < "2.0.0":
        pytest.skip("NumPy before 2.0 has at most 32 dimensions")
    a = np.arange(2.0).reshape((1,) * (ndim - 1) + (2,)) if ndim else np.array(7.0)
    t = tb.from_dlpack(a)
    assert t.shape == a.shape
    assert t.tolist() == a.tolist()
    assert np.from_dlpack(t).shape == a.shape


def test_size1_odd_strides_and_empty():
    """Size-1 dims with odd strides and size-0 arrays cross both ways."""
    a = np.arange(12.0).reshape(3, 4)[:, 1:2]
    assert tb.from_dlpack(a).tolist() == a.tolist()
    e = np.zeros((0, 3))
    assert tb.from_dlpack(e).shape == (0, 3)
    assert np.from_dlpack(tb.zeros(0, 3)).shape == (0, 3)


def test_read_only_both_ways():
    """A read-only array imports read-only; a read-only tensor exports to a read-only array."""
    a = np.arange(3.0)
    a.flags.writeable = False
    if not NUMPY_DLPACK_1:
        with pytest.raises(BufferError, match="readonly"):  # NumPy's refusal, passed through
            tb.from_dlpack(a)
        assert tb.asarray(a).is_readonly  # asarray reads the array interface instead
        return
    t = tb.from_dlpack(a)
    assert t.is_readonly
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 1.0
    b = np.from_dlpack(t)
    assert not b.flags.writeable
    assert data_ptr(b) == data_ptr(a)
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()
    w = np.arange(3.0)
    assert not tb.from_dlpack(w).is_readonly


def test_legacy_numpy_capsule_imports_writable():
    """NumPy's legacy capsule (no max_version) imports writable: the documented policy."""
    a = np.arange(3.0)
    t = tb.from_dlpack(a.__dlpack__())
    t[0] = 5.0
    assert a[0] == 5.0
    assert not t.is_readonly


@pytest.mark.parametrize("dtype", ["datetime64[s]", ">i8", "longdouble"])
def test_numpy_refusals_pass_through(dtype):
    """NumPy's BufferError for data DLPack cannot express passes through unchanged."""
    a = np.zeros(3, dtype=dtype)
    if dtype == "longdouble" and np.dtype(dtype).itemsize == 8:
        pytest.skip("longdouble is float64 here")
    with pytest.raises(BufferError, match="DLPack only supports"):
        tb.from_dlpack(a)


def test_structured_field_refusal_passes_through():
    """A structured field view (stride not a multiple of the itemsize) is NumPy's BufferError."""
    a = np.zeros(3, dtype=[("a", "i4"), ("b", "i8")])["b"]
    with pytest.raises(BufferError, match="multiple of itemsize"):
        tb.from_dlpack(a)


def test_copy_semantics_with_numpy():
    """copy=None/False share; copy=True gives NumPy's flagged copy; device='cpu' works both ways."""
    a = np.arange(4.0)
    assert tb.from_dlpack(a, copy=False).data_ptr() == data_ptr(a)
    assert tb.from_dlpack(a, device="cpu").data_ptr() == data_ptr(a)
    c = tb.from_dlpack(a, copy=True)
    assert c.data_ptr() != data_ptr(a)
    assert c._storage.is_copied is NUMPY_DLPACK_1  # older NumPy cannot copy: tensorbridge did
    assert c.tolist() == a.tolist()
    if not NUMPY_DLPACK_1:
        return  # np.from_dlpack takes copy and device from NumPy 2.1
    t = tb.arange(4)
    assert data_ptr(np.from_dlpack(t, copy=False)) == t.data_ptr()
    d = np.from_dlpack(t, copy=True)
    assert data_ptr(d) != t.data_ptr()
    assert d.tolist() == [0, 1, 2, 3]
    assert data_ptr(np.from_dlpack(t, device="cpu")) == t.data_ptr()


def test_import_holds_one_reference_on_the_array():
    """An imported tensor holds exactly +1 on the array, dropped when it dies."""
    a = np.arange(5.0)
    before = sys.getrefcount(a)
    t = tb.from_dlpack(a)
    assert sys.getrefcount(a) == before + 1
    v = t[1:]
    del t
    assert sys.getrefcount(a) == before + 1
    del v
    gc.collect()
    assert sys.getrefcount(a) == before


def test_numpy_array_outlives_tensorbridge(counting_exporter):
    """An array made from a tensor keeps its memory after every tensorbridge object is gone; NumPy
    calls tensorbridge's deleter exactly once, when the array dies."""
    t = tb.arange(1000)
    alive = weakref.ref(t)
    exporter = counting_exporter(t)
    a = np.from_dlpack(exporter)
    del t, exporter.tensor
    gc.collect()
    assert alive() is not None
    assert a[999] == 999
    assert exporter.total == 0
    if a.flags.writeable:  # NumPy before 2.1 imports DLPack read-only
        a[0] = 7
        assert a[0] == 7
    del a
    gc.collect()
    assert exporter.total == 1
    assert alive() is None


def test_each_numpy_import_calls_the_deleter_once(counting_exporter):
    """Several arrays from one tensor: one deleter call per capsule."""
    exporter = counting_exporter(tb.arange(6))
    arrays = [np.from_dlpack(exporter) for _ in range(4)]
    asked = {"dl_device": None, "copy": None, "max_version": (1, 0)} if NUMPY_DLPACK_1 else {}
    assert [k for k in exporter.kwargs] == [asked] * 4
    del arrays
    gc.collect()
    assert exporter.total == 4
    assert set(exporter.calls.values()) == {1}


def test_numpy_producer_deleter_runs_when_tensor_dies():
    """Importing from NumPy: the array (NumPy's manager_ctx) is released when the last view dies."""
    a = np.arange(10.0)
    alive = weakref.ref(a.base if a.base is not None else a)
    t = tb.from_dlpack(a)
    del a
    gc.collect()
    assert alive() is not None
    assert t.tolist()[-1] == 9.0
    del t
    gc.collect()
    assert alive() is None


def test_numpy_round_trip_keeps_pointer():
    """NumPy -> tensorbridge -> NumPy keeps the pointer and shares writes."""
    a = np.arange(12).reshape(3, 4)[:, ::2]
    b = np.from_dlpack(tb.from_dlpack(a))
    assert data_ptr(b) == data_ptr(a)
    assert b.strides == a.strides
    if not NUMPY_DLPACK_1:
        b = np.asarray(tb.from_dlpack(a))  # from_dlpack gives read-only arrays before NumPy 2.1
    b[0, 0] = -1
    assert a[0, 0] == -1


# ------------------------------------------------------------------ every NumPy users have (1.26+)
@pytest.mark.parametrize(
    ("call", "shared"),
    [
        (lambda a: tb.tensor(a), False),
        (lambda a: tb.asarray(a, copy=True), False),
        (lambda a: tb.from_dlpack(a, copy=True), False),
        (lambda a: tb.asarray(a, device="cpu"), True),
        (lambda a: tb.from_dlpack(a, copy=False), True),
        (lambda a: tb.from_dlpack(a), True),
    ],
)
def test_numpy_requests_on_every_numpy(call, shared):
    """Copy and device requests work whether NumPy's ``__dlpack__`` takes ``max_version`` (2.1+) or
    not (1.26, 2.0): copies are new memory, the rest shares."""
    a = np.arange(3)
    t = call(a)
    assert t.tolist() == [0, 1, 2]
    assert (t.data_ptr() == data_ptr(a)) is shared


@pytest.mark.parametrize(
    "make",
    [
        lambda: _read_only_numpy(),
        lambda: np.broadcast_to(np.arange(3), (2, 3)),
    ],
    ids=["read-only", "broadcast"],
)
def test_read_only_numpy_reaches_asarray_on_every_numpy(make):
    """A read-only or broadcast array is shared read-only by asarray: through a READ_ONLY capsule
    (NumPy 2.1+) or, where NumPy refuses DLPack (before 2.1), through its array interface."""
    a = make()
    t = tb.asarray(a)
    assert t.is_readonly
    assert t.data_ptr() == data_ptr(a)
    assert t.tolist() == a.tolist()
    assert tuple(s * a.itemsize for s in t.stride()) == a.strides


def _read_only_numpy():
    a = np.arange(4.0)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0, 2)])
def test_empty_tensors_reach_numpy(shape):
    """Tensors without elements reach NumPy through the array interface and numpy()."""
    t = tb.zeros(shape)
    assert np.asarray(t).shape == shape
    assert t.numpy().shape == shape
    assert np.asarray(t).dtype == np.float32


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "complex32"])
def test_numpy_asarray_of_ml_dtypes_tensor(name):
    """numpy.asarray of a dtype NumPy cannot name is the ml_dtypes array sharing the memory
    (as numpy()), never an object array of 0-d tensors."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if name == "complex32" and not hasattr(ml_dtypes, "complex32"):
        pytest.skip("this ml_dtypes has no complex32")
    t = tb_sample(name, 4)
    a = np.asarray(t)
    assert a.dtype == np.dtype(getattr(ml_dtypes, name))
    assert a.shape == (4,)
    assert data_ptr(a) == t.data_ptr()
    assert a.tobytes() == t.numpy().tobytes()


def test_numpy_array_of_bfloat16_with_dtype_and_copy():
    """numpy.array(t, dtype=...) converts with exact values; copy=False refuses a conversion."""
    pytest.importorskip("ml_dtypes")
    t = tb.tensor([1.5, -2.0, 3.25], dtype=tb.bfloat16)
    assert np.array(t, dtype=np.float32).tolist() == [1.5, -2.0, 3.25]
    assert np.array(t).tolist() == [1.5, -2.0, 3.25]
    with pytest.raises(ValueError, match="copy=False"):
        t.__array__(dtype=np.float32, copy=False)
    c = t.__array__(copy=True)
    assert data_ptr(c) != t.data_ptr()


def test_numpy_asarray_of_float4_is_a_type_error():
    """float4_e2m1fn_x2 (two values per byte) has no NumPy dtype: a TypeError naming it."""
    with pytest.raises(TypeError, match="float4_e2m1fn_x2"):
        np.asarray(tb_sample("float4_e2m1fn_x2", 4))


def test_numpy_asarray_without_ml_dtypes_is_a_type_error(subprocess_run):
    """Without ml_dtypes, numpy.asarray of a bfloat16 tensor is a TypeError naming bfloat16 and
    ml_dtypes, not an object array."""
    proc = subprocess_run(
        """
        import sys
        sys.modules["ml_dtypes"] = None  # not installed
        import numpy as np
        import tensorbridge as tb
        for name in ("bfloat16", "float8_e4m3fn", "complex32"):
            try:
                a = np.asarray(tb.ones(2, dtype=getattr(tb, name)))
            except TypeError as exc:
                assert name in str(exc) and "ml_dtypes" in str(exc), exc
            else:
                raise SystemExit(f"{name}: got {a.dtype} array")
        print("ok")
        """
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr
