"""xarray and Dask arrays, both ways: NumPy's dtype and ``__array__`` doors.

Out: ``np.dtype(t.dtype)`` names the NumPy dtype, so ``dask.array.from_array(t)`` and
``xarray.DataArray(t)`` take a tensor as they take an ndarray. In: ``tb.asarray`` takes a Dask
array and a DataArray through ``__array__``: without a copy where the ndarray returned is a view
that the object keeps alive (a DataArray over NumPy memory), a copy otherwise (a Dask array
computes a new one), and ``copy=False`` is refused with ValueError where a copy is needed.
NumPy's own dtypes and ndarrays as arguments are checked here too (the whole file skips without
xarray, which the test extra does not install).
"""

from __future__ import annotations

import gc

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")
xr = pytest.importorskip("xarray")
da = pytest.importorskip("dask.array")

# Every dtype NumPy and tensorbridge share (the same names).
NUMPY_DTYPES = [
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
    "complex64",
    "complex128",
]


def address(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_numpy_dtype_of_a_tensorbridge_dtype(name):
    """np.dtype(tb.<name>) is NumPy's dtype of that name, and NumPy's dtypes are dtype arguments."""
    assert np.dtype(getattr(tb, name)) == np.dtype(name)
    assert tb.zeros(2, dtype=np.dtype(name)).dtype is getattr(tb, name)
    assert tb.zeros(2, dtype=getattr(np, name if name != "bool" else "bool_")).dtype is getattr(
        tb, name
    )


def test_numpy_scalar_types_as_dtype_arguments():
    """tb.zeros(2, dtype=np.float32) and the other creation functions take NumPy's types."""
    assert tb.zeros(2, dtype=np.float32).dtype is tb.float32
    assert tb.ones(2, dtype=np.int64).dtype is tb.int64
    assert tb.full((2,), 1, dtype=np.complex64).dtype is tb.complex64
    assert tb.arange(3, dtype=np.uint8).dtype is tb.uint8


def test_to_torch_takes_an_ndarray():
    """tb.to_torch(np.ones(3)) gives PyTorch a tensor over the ndarray's memory."""
    torch = pytest.importorskip("torch")
    a = np.ones(3)
    x = tb.to_torch(a)
    assert isinstance(x, torch.Tensor)
    assert x.dtype == torch.float64 and x.tolist() == [1.0, 1.0, 1.0]
    assert x.data_ptr() == address(a)


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_dask_from_array_of_a_tensor(name):
    """dask.array.from_array takes a tensor, chunked, with its dtype and values."""
    t = tb.arange(12, dtype=tb.int64).to(getattr(tb, name)).reshape(3, 4)
    d = da.from_array(t, chunks=(2, 2))
    assert np.dtype(d.dtype) == np.dtype(name)
    assert d.shape == (3, 4)
    assert np.asarray(d.compute()).tolist() == t.tolist()


def test_asarray_of_a_dask_array_copies():
    """tb.asarray computes a Dask array into a new tensor; copy=False is refused (ValueError)."""
    d = da.arange(12, chunks=5, dtype=np.float32).reshape(3, 4)
    t = tb.asarray(d)
    assert t.dtype is tb.float32 and t.shape == (3, 4)
    assert t.tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
    assert not t.is_readonly
    # __array__ is asked with copy=False, as NumPy 2 asks it: Dask warns that it cannot keep that
    # (its FutureWarning, as for np.asarray(d, copy=False)) and tensorbridge refuses the copy.
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="copy"):
        tb.asarray(d, copy=False)
    assert tb.asarray(d, copy=True).tolist() == t.tolist()


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_xarray_dataarray_of_a_tensor(name):
    """xarray.DataArray(t) holds the tensor's values over its memory."""
    t = tb.arange(6, dtype=tb.int64).to(getattr(tb, name)).reshape(2, 3)
    x = xr.DataArray(t, dims=("a", "b"))
    assert x.dtype == np.dtype(name)
    assert x.shape == (2, 3)
    assert x.values.tolist() == t.tolist()
    assert address(x.values) == t.data_ptr()


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_asarray_of_a_dataarray_shares(name):
    """tb.asarray(DataArray) shares the ndarray the DataArray keeps (copy=False too); a write
    is seen by xarray, and the memory lives while the tensor does."""
    a = np.arange(6).astype(name).reshape(2, 3)
    x = xr.DataArray(a, dims=("a", "b"))
    for kwargs in ({}, {"copy": False}):
        t = tb.asarray(x, **kwargs)
        assert t.dtype is getattr(tb, name)
        assert t.shape == (2, 3) and t.stride() == (3, 1)
        assert t.data_ptr() == address(x.values)
        assert t.tolist() == a.tolist()
    copied = tb.asarray(x, copy=True)
    assert copied.data_ptr() != address(x.values) and copied.tolist() == a.tolist()
    t[1, 2] = t[0, 0].item()
    assert x.values[1, 2] == x.values[0, 0]
    expected = t.tolist()
    del x, a
    gc.collect()
    assert t.tolist() == expected


def test_asarray_of_a_dask_backed_dataarray_copies():
    """A DataArray over a Dask array computes into a new tensor; copy=False is refused."""
    x = xr.DataArray(da.arange(6, chunks=4, dtype=np.float64).reshape(2, 3), dims=("a", "b"))
    t = tb.asarray(x)
    assert t.dtype is tb.float64
    assert t.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    with pytest.raises(ValueError, match="copy"):
        tb.asarray(x, copy=False)
