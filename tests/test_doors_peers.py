"""asarray's doors with the real array libraries: ``__array__`` (Dask, xarray, pandas, polars,
TensorFlow), a refused protocol falling through to the next one, Arrow extension types
(``arrow.fixed_shape_tensor`` with and without a permutation), and `to_torch` taking any array-like.

TensorFlow and PaddlePaddle crash when both are imported in one process, so their checks run in a
child process each.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")


# ---------------------------------------------------------------------------------------------- __array__
class _Recorder:
    """An object with only ``__array__``, recording how it is called."""

    def __init__(self, make):
        self.make = make
        self.calls = []

    def __array__(self, dtype=None, copy=None):
        self.calls.append((dtype, copy))
        out = self.make()
        return out if dtype is None else out.astype(dtype, copy=False)


class _Legacy:
    """An ``__array__`` that does not take ``copy`` (NumPy 1 style)."""

    def __init__(self, array):
        self.array = array
        self.calls = 0

    def __array__(self, dtype=None):
        self.calls += 1
        return self.array


def test_array_door_shares_an_array_the_object_keeps():
    held = np.arange(6.0)
    obj = _Recorder(lambda: held[::2])
    t = tb.asarray(obj)
    assert t.tolist() == [0.0, 2.0, 4.0] and t.dtype is tb.float64
    assert t.data_ptr() == held.ctypes.data and t.stride() == (2,)
    held[2] = 40.0
    assert t[1].item() == 40.0
    assert obj.calls == [(None, None)]
    shared = tb.asarray(obj, copy=False)
    assert shared.data_ptr() == held.ctypes.data
    assert obj.calls[-1] == (None, False)
    copied = tb.asarray(obj, copy=True)
    assert copied.data_ptr() != held.ctypes.data and copied.tolist() == [0.0, 40.0, 4.0]
    assert obj.calls[-1] == (None, True)


def test_array_door_passes_dtype_as_numpy_does():
    obj = _Recorder(lambda: np.arange(3))
    t = tb.asarray(obj, dtype=tb.float32)
    assert t.dtype is tb.float32 and t.tolist() == [0.0, 1.0, 2.0]
    assert obj.calls == [(np.dtype("float32"), None)]


# CPython 3.14 counts references differently (stack references), and the measurement that tells
# an array nothing else holds from a view does not see it there yet: a new array from
# __array__(copy=False) is then taken instead of refused.
_PRIVATE_UNSEEN = pytest.mark.xfail(
    sys.version_info >= (3, 14), reason="a new array is not told from a view on 3.14", strict=False
)


@_PRIVATE_UNSEEN
def test_array_door_refuses_copy_false_for_a_new_array():
    obj = _Recorder(lambda: np.arange(3.0))
    with pytest.raises(ValueError, match=r"asarray\(\): Unable to avoid copy .*copy=None"):
        tb.asarray(obj, copy=False)
    view_of_new = _Recorder(lambda: np.arange(6.0)[::2])
    with pytest.raises(ValueError, match="Unable to avoid copy"):
        tb.asarray(view_of_new, copy=False)
    assert tb.asarray(obj).tolist() == [0.0, 1.0, 2.0]


def test_array_door_copies_a_shared_result_for_copy_true():
    """An __array__ that ignores copy=True still gives a private tensor."""
    held = np.arange(3.0)

    class Ignores:
        def __array__(self, dtype=None, copy=None):
            return held

    t = tb.asarray(Ignores(), copy=True)
    assert t.data_ptr() != held.ctypes.data and t.tolist() == [0.0, 1.0, 2.0]


def test_array_door_retries_without_copy_and_refuses_copy_false(recwarn):
    held = np.arange(3.0)
    legacy = _Legacy(held)
    assert tb.asarray(legacy).data_ptr() == held.ctypes.data
    copied = tb.asarray(legacy, copy=True)
    assert copied.data_ptr() != held.ctypes.data and legacy.calls == 2  # copy= refused, retried
    with pytest.raises(ValueError, match=r"Unable to avoid copy.*does not take copy="):
        tb.asarray(legacy, copy=False)
    assert not [w for w in recwarn if "tensorbridge" in w.filename]


def test_array_door_refuses_a_result_that_is_not_an_ndarray():
    class Bad:
        def __array__(self, dtype=None, copy=None):
            return [1, 2]

    with pytest.raises(TypeError, match=r"asarray\(\): Bad.__array__\(\) must return"):
        tb.asarray(Bad())


def test_tensor_copies_through_the_array_door():
    held = np.arange(3.0)
    t = tb.tensor(_Recorder(lambda: held))
    assert t.data_ptr() != held.ctypes.data and t.tolist() == [0.0, 1.0, 2.0]


def test_a_refused_arrow_stream_falls_through_to_array():
    pa = pytest.importorskip("pyarrow")
    held = np.arange(4.0)

    class Records:
        def __arrow_c_stream__(self, requested_schema=None):
            return pa.chunked_array([pa.array([{"a": 1}])]).__arrow_c_stream__()

        def __array__(self, dtype=None, copy=None):
            return held

    t = tb.asarray(Records())
    assert t.data_ptr() == held.ctypes.data and t.tolist() == [0.0, 1.0, 2.0, 3.0]


# ---------------------------------------------------------------------------------------------- peers
@_PRIVATE_UNSEEN
def test_dask_array_is_computed_through_array():
    da = pytest.importorskip("dask.array")
    x = da.arange(3.0, chunks=2)
    t = tb.asarray(x)
    assert t.tolist() == [0.0, 1.0, 2.0] and t.dtype is tb.float64 and t.shape == (3,)
    assert tb.asarray(x, dtype=tb.float32).dtype is tb.float32
    assert tb.tensor(x).tolist() == [0.0, 1.0, 2.0]
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="Unable to avoid copy"):
        tb.asarray(x, copy=False)  # Dask warns and computes a new array


def test_xarray_dataarray_is_shared():
    xr = pytest.importorskip("xarray")
    data = np.arange(6.0).reshape(2, 3)
    arr = xr.DataArray(data, dims=("y", "x"))
    t = tb.asarray(arr)
    assert t.shape == (2, 3) and t.dtype is tb.float64 and t.data_ptr() == data.ctypes.data
    t[0, 0] = 7.0
    assert data[0, 0] == 7.0
    assert tb.asarray(arr, copy=False).data_ptr() == data.ctypes.data
    assert tb.asarray(arr, copy=True).data_ptr() != data.ctypes.data


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_a_failing_arrow_export_falls_through_to_the_next_door(dtype):
    # pyarrow cannot export complex NumPy data, which xarray hands its Arrow stream export:
    # __array__ serves it, zero-copy.
    xr = pytest.importorskip("xarray")
    data = np.arange(3, dtype=dtype) * 1j
    t = tb.asarray(xr.DataArray(data))
    assert t.tolist() == [0j, 1j, 2j] and t.dtype.name == dtype
    assert t.data_ptr() == data.ctypes.data


def test_pandas_series_and_dataframe():
    pd = pytest.importorskip("pandas")
    series = pd.Series([1.0, 2.0, 3.0])
    t = tb.asarray(series)
    assert t.tolist() == [1.0, 2.0, 3.0] and t.dtype is tb.float64
    assert t.data_ptr() == series.to_numpy().ctypes.data
    frame = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    t = tb.asarray(frame)
    assert t.shape == (2, 2) and t.tolist() == [[1.0, 3.0], [2.0, 4.0]]
    assert t.data_ptr() == frame.to_numpy().ctypes.data
    mixed = pd.DataFrame({"a": [1.0, 2.0], "b": [3, 4]})
    assert tb.asarray(mixed).tolist() == [[1.0, 3.0], [2.0, 4.0]]
    with pytest.raises(ValueError, match="Unable to avoid copy"):
        tb.asarray(mixed, copy=False)


def test_polars_series():
    pl = pytest.importorskip("polars")
    s = pl.Series([1, 2, 3], dtype=pl.Int32)
    t = tb.asarray(s)
    assert t.tolist() == [1, 2, 3] and t.dtype is tb.int32
    assert tb.to_torch(s, force=True).tolist() == [1, 2, 3]


def _installed(name):
    """Skip unless ``name`` is installed, without importing it here (see the module docstring)."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed")


_CHILD_PRELUDE = """
import json
import numpy as np
import tensorbridge as tb
out = {}
"""


def test_tensorflow_variable_in_a_child(subprocess_run):
    _installed("tensorflow")
    code = _CHILD_PRELUDE + textwrap.dedent(
        """
        import tensorflow as tf
        v = tf.Variable([1.0, 2.0])
        t = tb.asarray(v)
        out["values"] = t.tolist()
        out["dtype"] = str(t.dtype)
        try:
            tb.asarray(v, copy=False)
        except ValueError as exc:
            out["copy_false"] = str(exc)
        out["torch"] = tb.to_torch(v).tolist()
        c = tf.constant([3, 4])
        out["constant"] = tb.asarray(c).tolist()
        print("RESULT " + json.dumps(out))
        """
    )
    result = subprocess_run(code, timeout=300)
    lines = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got["values"] == [1.0, 2.0] and got["dtype"] == "tensorbridge.float32"
    assert "Unable to avoid copy" in got["copy_false"]
    assert got["torch"] == [1.0, 2.0] and got["constant"] == [3, 4]


def test_paddle_to_torch_in_a_child(subprocess_run):
    _installed("paddle")
    code = _CHILD_PRELUDE + textwrap.dedent(
        """
        import paddle
        p = paddle.to_tensor([1.0, 2.0, 3.0])
        t = tb.to_torch(p)
        out["values"] = t.tolist()
        out["shared"] = t.data_ptr() == p.data_ptr()
        print("RESULT " + json.dumps(out))
        """
    )
    result = subprocess_run(code, timeout=300)
    lines = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got == {"values": [1.0, 2.0, 3.0], "shared": True}


# ---------------------------------------------------------------------------------------------- to_torch
def test_to_torch_takes_array_likes():
    torch = pytest.importorskip("torch")
    a = np.ones(3)
    t = tb.to_torch(a)
    assert isinstance(t, torch.Tensor) and t.data_ptr() == a.ctypes.data
    t[0] = 5.0
    assert a[0] == 5.0
    assert tb.to_torch([1, 2]).tolist() == [1, 2]
    src = torch.arange(3)
    assert tb.to_torch(src).data_ptr() == src.data_ptr()
    x = tb.arange(3)
    assert tb.to_torch(x).data_ptr() == x.data_ptr()


def test_to_torch_refuses_with_its_name():
    pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"^to_torch\(\): "):
        tb.to_torch(object())
    with pytest.raises(BufferError, match=r"^to_torch\(\): .*force=True"):
        tb.to_torch(b"ab")
    assert tb.to_torch(b"ab", force=True).tolist() == [97, 98]


# ---------------------------------------------------------------------------------------------- Arrow


def test_fixed_shape_tensor_round_trip_is_shared():
    pa = pytest.importorskip("pyarrow")
    t = tb.arange(24, dtype=tb.float32).reshape(2, 3, 4)
    arr = pa.array(t)
    back = tb.asarray(arr)
    assert back.shape == (2, 3, 4) and back.dtype is tb.float32 and tb.equal(back, t)
    assert back.data_ptr() == t.data_ptr() and back.is_readonly
    assert tb.asarray(arr[1:]).tolist() == t[1:].tolist()
    assert tb.asarray(pa.chunked_array([arr, arr])).shape == (4, 3, 4)
    storage = tb.asarray(arr.storage)
    assert storage.shape == (2, 12) and storage.data_ptr() == t.data_ptr()
    flags = tb.tensor([[True, False], [False, True]])
    assert tb.equal(tb.asarray(pa.array(flags)), flags)


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (0, 2, 1, 3), (0, 3, 2, 1), (0, 1, 3, 2)])
def test_pyarrow_fixed_shape_tensor_with_permutation(order):
    pa = pytest.importorskip("pyarrow")
    base = np.arange(2 * 3 * 4 * 5, dtype=np.int16).reshape(2, 3, 4, 5)
    source = base.transpose(order)
    arr = pa.FixedShapeTensorArray.from_numpy_ndarray(source)
    t = tb.asarray(arr)
    assert t.shape == source.shape and t.dtype is tb.int16
    np.testing.assert_array_equal(t.numpy(), source)
    np.testing.assert_array_equal(tb.asarray(arr[1:]).numpy(), source[1:])
    assert t.data_ptr() == arr.storage.values.buffers()[1].address


def test_other_extension_types_import_as_storage():
    pa = pytest.importorskip("pyarrow")

    class Meters(pa.ExtensionType):
        def __init__(self):
            super().__init__(pa.float64(), "example.meters")

        def __arrow_ext_serialize__(self):
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type, serialized):
            return cls()

    arr = pa.ExtensionArray.from_storage(Meters(), pa.array([1.5, 2.5]))
    assert tb.asarray(arr).tolist() == [1.5, 2.5]
    uuids = pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"a" * 16], pa.binary(16)))
    with pytest.raises(BufferError, match=r"'arrow\.uuid'.*storage"):
        tb.asarray(uuids)


def test_nested_refusal_hint_is_not_a_cast():
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(BufferError, match="nested format '\\+s'") as info:
        tb.asarray(pa.array([{"a": 1}]))
    assert "cast" not in str(info.value)
