"""Arrow export: ``Tensor.__arrow_c_schema__`` / ``__arrow_c_array__`` against the real pyarrow.

Expected values come from the Arrow C data interface (formats, metadata encoding, release rules)
and pyarrow's own types (``pa.fixed_shape_tensor``). Release counts come from
``_arrow_export.release_counts()``; what could crash runs in a child interpreter.
"""

from __future__ import annotations

import ctypes
import gc
import weakref
from typing import Any

import pytest

import tensorbridge as tb
from tensorbridge import _arrow_export, _capi, _exports
from tensorbridge._arrow_abi import ArrowArray, ArrowSchema

pa = pytest.importorskip("pyarrow")
np = pytest.importorskip("numpy")

DTYPES = [
    (tb.int8, pa.int8()),
    (tb.int16, pa.int16()),
    (tb.int32, pa.int32()),
    (tb.int64, pa.int64()),
    (tb.uint8, pa.uint8()),
    (tb.uint16, pa.uint16()),
    (tb.uint32, pa.uint32()),
    (tb.uint64, pa.uint64()),
    (tb.float16, pa.float16()),
    (tb.float32, pa.float32()),
    (tb.float64, pa.float64()),
]


def settle() -> None:
    """Collect twice: a full collection reaps abandoned capsules, whose guards then die."""
    gc.collect()
    gc.collect()


@pytest.mark.parametrize(("dtype", "arrow_type"), DTYPES, ids=lambda d: str(d))
def test_1d_tensor_is_a_primitive_array_over_its_memory(dtype: Any, arrow_type: Any) -> None:
    """A 1-d tensor becomes a primitive array of the same values sharing its memory."""
    t = tb.arange(5, dtype=dtype)
    arr = pa.array(t)
    assert arr.type == arrow_type
    assert arr.to_pylist() == t.tolist()
    assert arr.null_count == 0
    assert arr.buffers()[0] is None  # no validity bitmap
    assert arr.buffers()[1].address == t.data_ptr()


def test_storage_offset_is_folded_into_the_pointer() -> None:
    """A view at an offset shares memory from its first element, with Arrow offset 0."""
    base = tb.arange(10, dtype=tb.int64)
    t = base[3:8]
    arr = pa.array(t)
    assert arr.to_pylist() == [3, 4, 5, 6, 7]
    assert arr.offset == 0
    assert arr.buffers()[1].address == t.data_ptr()


def test_nd_tensor_is_a_fixed_shape_tensor_array_over_its_memory() -> None:
    """An n-d tensor becomes arrow.fixed_shape_tensor equal to pa.fixed_shape_tensor(...)."""
    t = tb.arange(24, dtype=tb.float32).reshape(4, 2, 3)
    arr = pa.array(t)
    assert arr.type == pa.fixed_shape_tensor(pa.float32(), [2, 3])
    assert arr.type.extension_name == "arrow.fixed_shape_tensor"
    assert arr.type.shape == [2, 3]
    assert len(arr) == 4
    assert np.array_equal(arr.to_numpy_ndarray(), np.arange(24, dtype=np.float32).reshape(4, 2, 3))
    assert arr.storage.values.buffers()[1].address == t.data_ptr()


def test_schema_capsule_matches_pyarrow_types() -> None:
    """__arrow_c_schema__ gives the type pa.array(t) has: element type or fixed_shape_tensor."""
    assert pa.DataType._import_from_c_capsule(tb.zeros(3).__arrow_c_schema__()) == pa.float32()
    nd = pa.DataType._import_from_c_capsule(tb.zeros(2, 5, dtype=tb.int16).__arrow_c_schema__())
    assert nd == pa.fixed_shape_tensor(pa.int16(), [5])


def test_extension_metadata_is_encoded_as_the_spec_says() -> None:
    """The schema metadata is int32 count + length-prefixed key/values with the canonical keys."""
    capsule = tb.zeros(2, 3, 4, dtype=tb.int32).__arrow_c_schema__()
    schema = ArrowSchema.from_address(_capi.PyCapsule_GetPointer(capsule, b"arrow_schema"))
    assert schema.format == b"+w:12"
    key1, val1 = b"ARROW:extension:name", b"arrow.fixed_shape_tensor"
    key2, val2 = b"ARROW:extension:metadata", b'{"shape":[3,4]}'
    parts = [2, key1, val1, key2, val2]
    expected = b"".join(
        p.to_bytes(4, "little") if isinstance(p, int) else len(p).to_bytes(4, "little") + p
        for p in parts
    )
    assert ctypes.string_at(schema.metadata, len(expected)) == expected
    child = schema.children[0][0]
    assert (child.format, child.name, child.n_children) == (b"i", b"item", 0)


def test_bool_is_bit_packed_into_a_copy() -> None:
    """bool tensors become Arrow booleans (bits, least significant first) with equal values."""
    values = [True, False, True, True, False, False, False, False, True, True]
    t = tb.tensor(values)
    assert pa.array(t).to_pylist() == values
    assert pa.array(t).buffers()[1].to_pybytes()[:2] == bytes([0b00001101, 0b00000011])
    grid = pa.array(t.reshape(2, 5))
    assert grid.type == pa.fixed_shape_tensor(pa.bool_(), [5])
    assert grid.storage.flatten().to_pylist() == values


@pytest.mark.parametrize(
    "make",
    [
        lambda: tb.arange(12, dtype=tb.int32)[::3],
        lambda: tb.arange(12, dtype=tb.int32)[::-1],
        lambda: tb.arange(12, dtype=tb.int32).reshape(3, 4).T,
        lambda: tb.arange(12, dtype=tb.int32).reshape(3, 4)[:, 1:3],
        lambda: tb.arange(4, dtype=tb.int32).expand(3, 4),
    ],
    ids=["step", "negative", "transpose", "columns", "broadcast"],
)
def test_non_contiguous_layouts_are_copied_with_equal_values(make: Any) -> None:
    """Layouts Arrow cannot describe are exported as a row-major copy with the same values."""
    t = make()
    arr = pa.array(t)
    expected = np.asarray(t.tolist(), dtype=np.int32)
    got = arr.to_numpy() if t.ndim == 1 else arr.to_numpy_ndarray()
    assert np.array_equal(got, expected)
    address = (arr if t.ndim == 1 else arr.storage.values).buffers()[1].address
    assert address != t.data_ptr()


def test_empty_tensors_export() -> None:
    """Tensors without elements export as empty arrays (1-d and n-d)."""
    assert pa.array(tb.empty(0)).to_pylist() == []
    arr = pa.array(tb.empty(0, 3, dtype=tb.int64))
    assert len(arr) == 0
    assert arr.type == pa.fixed_shape_tensor(pa.int64(), [3])


def test_readonly_and_writable_tensors_share_memory() -> None:
    """Read-only tensors export like writable ones; a write through a writable one shows."""
    ro = tb.frombuffer(b"\x01\x02\x03\x04", dtype=tb.uint8)
    assert ro.is_readonly
    arr = pa.array(ro)
    assert arr.to_pylist() == [1, 2, 3, 4]
    assert arr.buffers()[1].address == ro.data_ptr()
    rw = tb.zeros(3, dtype=tb.int32)
    shared = pa.array(rw)
    rw[1] = 7
    assert shared.to_pylist() == [0, 7, 0]


def test_round_trip_through_asarray() -> None:
    """tb.asarray(pa.array(t)) gives the tensor's values back over the same memory."""
    t = tb.arange(6, dtype=tb.float64)
    back = tb.asarray(pa.array(t))
    assert back.tolist() == t.tolist()
    assert back.dtype is tb.float64
    assert back.data_ptr() == t.data_ptr()


def test_memory_lives_until_arrow_releases_it_exactly_once() -> None:
    """The storage outlives the tensor while the Arrow array lives; each struct is released once."""
    settle()
    before = _arrow_export.release_counts()
    t = tb.arange(1000, dtype=tb.int64).reshape(10, 100)
    storage = weakref.ref(t._storage)
    arr = pa.array(t)
    del t
    settle()
    assert storage() is not None
    assert arr.storage.flatten().to_pylist() == list(range(1000))
    del arr
    settle()
    assert storage() is None
    after = _arrow_export.release_counts()
    # One schema with one child, one array with one child.
    assert after["schemas"] - before["schemas"] == 2
    assert after["arrays"] - before["arrays"] == 2
    assert _exports.counts()["pending"] == 0


def test_unconsumed_capsules_are_released_once_by_the_reap() -> None:
    """Capsules dropped without a consumer release their structs once and free the memory."""
    settle()
    before = _arrow_export.release_counts()
    t = tb.arange(8, dtype=tb.int32)
    storage = weakref.ref(t._storage)
    schema, array = t.__arrow_c_array__()
    address = _capi.PyCapsule_GetPointer(array, b"arrow_array")
    assert ArrowArray.from_address(address).release
    del t, schema, array
    settle()
    assert storage() is None
    after = _arrow_export.release_counts()
    assert (after["schemas"] - before["schemas"], after["arrays"] - before["arrays"]) == (1, 1)


def test_consumed_capsule_is_not_released_by_the_reap() -> None:
    """A capsule whose struct pyarrow moved out is left alone when it dies: no early release."""
    t = tb.arange(4, dtype=tb.int16)
    schema, array = t.__arrow_c_array__()
    arr = pa.Array._import_from_c_capsule(schema, array)
    del schema, array, t
    settle()
    assert arr.to_pylist() == [0, 1, 2, 3]


def test_requested_schema_equal_to_the_export_is_honoured() -> None:
    """pa.array(t, type=...) with the exported type, or the bare storage type, is honoured."""
    t = tb.arange(6, dtype=tb.int32).reshape(2, 3)
    ext = pa.fixed_shape_tensor(pa.int32(), [3])
    capsules = t.__arrow_c_array__(requested_schema=ext.__arrow_c_schema__())
    assert pa.Array._import_from_c_capsule(*capsules).type == ext
    bare = pa.array(t, type=pa.list_(pa.int32(), 3))
    assert bare.type == pa.list_(pa.int32(), 3)
    assert bare.to_pylist() == [[0, 1, 2], [3, 4, 5]]
    assert pa.array(t[0], type=pa.int32()).to_pylist() == [0, 1, 2]


def test_other_requested_types_are_a_clear_error() -> None:
    """A requested type of another element type or nesting is a ValueError naming the fix."""
    with pytest.raises(ValueError, match=r"__arrow_c_array__\(\): .*dtype float32.*cast"):
        pa.array(tb.zeros(3), type=pa.float64())
    with pytest.raises(ValueError, match=r"fixed-size list of 6 values"):
        pa.array(tb.zeros(2, 6), type=pa.float32())
    with pytest.raises(TypeError, match=r"requested_schema must be None or a PyCapsule"):
        tb.zeros(3).__arrow_c_array__(requested_schema="f")


@pytest.mark.parametrize(
    "dtype", [tb.bfloat16, tb.float8_e4m3fn, tb.float8_e5m2, tb.complex64, tb.complex128]
)
def test_dtypes_arrow_cannot_name_are_a_type_error(dtype: Any) -> None:
    """dtypes without an Arrow type are a TypeError naming the dtype and a fix."""
    t = tb.zeros(2, dtype=dtype)
    with pytest.raises(TypeError, match=rf"Arrow has no type for {dtype}.*t\.(to|view)\("):
        pa.array(t)
    with pytest.raises(TypeError, match="Arrow has no type"):
        t.__arrow_c_schema__()


def test_zero_d_tensor_is_a_value_error() -> None:
    """A 0-d tensor has no Arrow array form: a ValueError suggesting reshape(1)."""
    with pytest.raises(ValueError, match=r"0-d tensor.*reshape\(1\)"):
        pa.array(tb.tensor(1.0))
    with pytest.raises(ValueError, match="0-d tensor"):
        tb.tensor(1).__arrow_c_schema__()


def test_tensor_that_requires_grad_is_refused() -> None:
    """A tensor that requires grad is refused, as its DLPack export is."""
    t = tb.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"require gradient, use tensor\.detach"):
        pa.array(t)
    assert pa.array(t.detach()).to_pylist() == [0.0, 0.0, 0.0]


def test_device_memory_is_refused() -> None:
    """Memory that is not on the host is a TypeError: Arrow's C data interface is host-only."""
    from tensorbridge._device import Device
    from tensorbridge._storage import Storage

    storage = Storage(0x1000, 16, Device("cuda", 0), False, None)
    with pytest.raises(TypeError, match="host memory only"):
        _arrow_export.export_array(storage, 0, (4,), (1,), tb.float32, False)


@pytest.mark.subprocess
def test_release_runs_once_and_arrays_alive_at_exit_shut_down_cleanly(subprocess_run: Any) -> None:
    """A second release call is a no-op, and Arrow arrays still alive at exit end cleanly."""
    proc = subprocess_run(
        """
        import ctypes
        import pyarrow as pa
        import tensorbridge as tb
        from tensorbridge import _arrow_export, _capi
        from tensorbridge._arrow_abi import ArrowArray, ArrowRelease

        t = tb.arange(4, dtype=tb.int32).reshape(2, 2)
        schema, array = t.__arrow_c_array__()
        struct = ArrowArray.from_address(_capi.PyCapsule_GetPointer(array, b"arrow_array"))
        release = ArrowRelease(struct.release)
        release(ctypes.addressof(struct))
        release(ctypes.addressof(struct))  # already released: nothing happens
        print("counts", _arrow_export.release_counts()["arrays"], struct.release)
        kept = pa.array(tb.arange(100).reshape(10, 10))  # alive at exit
        alone = tb.zeros(3).__arrow_c_array__()  # never consumed, alive at exit
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "counts 2 None" in proc.stdout, proc.stdout
