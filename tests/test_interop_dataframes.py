"""Columns of Polars, pandas and nanoarrow, both ways (the Arrow C data interface, ``__array__``).

Arrow memory is immutable: a column imported from Polars or nanoarrow is read-only in
tensorbridge, and so is one from pandas 3, whose copy-on-write columns hand NumPy read-only views.
Arrow's bool is bit-packed, tensorbridge's one byte each: bool columns cross by value; every other
shared dtype crosses without a copy.
"""

from __future__ import annotations

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")

# Every dtype the three libraries and tensorbridge share (NumPy's names in all).
COLUMN_DTYPES = [
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
    "float32",
    "float64",
]


def np_sample(name, n=8):
    """A NumPy array of ``name`` with the values 1, 2, 3, ... (bool: alternating)."""
    if name == "bool":
        return np.array([False, True] * (n // 2))
    return np.arange(1, n + 1).astype(name)


def address(a):
    return a.__array_interface__["data"][0]


def _import_checks(column, a, expected_address):
    """``column`` (made from ``a``) imports through asarray with a's dtype and values, read-only,
    over ``expected_address`` (None: bool, copied by value)."""
    t = tb.asarray(column)
    assert t.dtype is getattr(tb, a.dtype.name)
    assert t.tolist() == a.tolist()
    assert t.shape == a.shape
    if expected_address is not None:
        assert t.data_ptr() == expected_address
        assert t.is_readonly
        with pytest.raises(ValueError, match="read-only"):
            t[0] = t[1].item()
    return t


@pytest.mark.parametrize("name", COLUMN_DTYPES)
def test_polars_both_ways(name):
    """A Polars Series imports read-only over its own memory, and a tensor becomes a Series
    over the tensor's memory."""
    pl = pytest.importorskip("polars")
    a = np_sample(name)
    s = pl.Series("x", a)
    _import_checks(s, a, None if name == "bool" else address(s.to_numpy()))
    t = tb.asarray(a).clone()
    y = pl.Series("x", t)
    assert y.to_list() == a.tolist()
    if name != "bool":
        assert address(y.to_numpy()) == t.data_ptr()


@pytest.mark.parametrize("name", COLUMN_DTYPES)
def test_pandas_both_ways(name):
    """A pandas Series imports read-only over its memory (pandas 3 hands out read-only views),
    and a tensor becomes a Series over the tensor's memory."""
    pd = pytest.importorskip("pandas")
    a = np_sample(name)
    ser = pd.Series(a)
    # pandas offers the Arrow C stream too: a bool column may come as Arrow's packed bits.
    _import_checks(ser, a, None if name == "bool" else address(ser.to_numpy()))
    t = tb.asarray(a).clone()
    y = pd.Series(t)
    assert y.dtype == np.dtype(name)
    assert y.tolist() == a.tolist()
    assert address(y.to_numpy()) == t.data_ptr()


@pytest.mark.parametrize("name", COLUMN_DTYPES)
def test_nanoarrow_both_ways(name):
    """A nanoarrow Array imports read-only over its data buffer, and a tensor becomes an Array
    whose data buffer is the tensor's memory."""
    na = pytest.importorskip("nanoarrow")
    pa = pytest.importorskip("pyarrow")
    a = np_sample(name)
    arr = na.Array(pa.array(a))
    _import_checks(arr, a, None if name == "bool" else na.c_array(arr).buffers[1])
    t = tb.asarray(a).clone()
    y = na.Array(t)
    assert list(y.to_pylist()) == a.tolist()
    if name != "bool":
        assert na.c_array(y).buffers[1] == t.data_ptr()


def test_pandas_frame_of_one_dtype():
    """A pandas DataFrame of one dtype imports as a 2-d tensor with its values."""
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": np.arange(3.0), "b": np.arange(3.0) * 2})
    t = tb.asarray(df)
    assert t.shape == (3, 2)
    assert t.tolist() == [[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]]


def test_polars_slice_keeps_its_offset():
    """A sliced Polars Series imports from its offset, over the same buffer."""
    pl = pytest.importorskip("polars")
    s = pl.Series("x", np.arange(10, dtype=np.int32))[3:7]
    t = tb.asarray(s)
    assert t.tolist() == [3, 4, 5, 6]
    assert t.data_ptr() == address(s.to_numpy())
