"""Arrow PyCapsule import: ``__arrow_c_array__`` and ``__arrow_c_stream__`` through asarray.

Against pyarrow (the reference producer) and a crafted ctypes producer that counts ``release`` calls,
so that "released exactly once, when the last view dies" is observed directly.
"""

from __future__ import annotations

import ctypes
import gc
import weakref
from typing import Any

import pytest

import tensorbridge as tb
from tensorbridge import _capi
from tensorbridge._convert import _dispatch_path
from tensorbridge._interfaces import ArrowArray, ArrowSchema

pa = pytest.importorskip("pyarrow")
np = pytest.importorskip("numpy")

# ChunkedArray.__arrow_c_stream__ arrived in pyarrow 16; before, a ChunkedArray has no stream.
needs_chunked_stream = pytest.mark.skipif(
    not hasattr(pa.ChunkedArray, "__arrow_c_stream__"),
    reason=f"pyarrow {pa.__version__} has no ChunkedArray.__arrow_c_stream__",
)

SCHEMA_NAME = b"arrow_schema"
ARRAY_NAME = b"arrow_array"


class ArrowOnly:
    """Exposes an Arrow array through ``__arrow_c_array__`` and nothing else (no DLPack, no buffer)."""

    def __init__(self, arr: Any):
        self.arr = arr

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        return self.arr.__arrow_c_array__(requested_schema)


class StreamOnly:
    """Exposes Arrow data through ``__arrow_c_stream__`` only."""

    def __init__(self, data: Any):
        self.data = data

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.data.__arrow_c_stream__(requested_schema)


_Release = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CountingProducer:
    """A minimal Arrow producer in ctypes: an int32 array whose release callback counts its calls.

    The capsules have no destructor: this producer owns the structs, and tensorbridge must move the
    array out (setting this copy's release to NULL) and release the moved copy exactly once.
    """

    def __init__(self, values: list[int], offset: int = 0, null_count: int = 0, fmt: bytes = b"i"):
        self.values = (ctypes.c_int32 * len(values))(*values)
        self.buffers = (ctypes.c_void_p * 2)(None, ctypes.addressof(self.values))
        self.releases: list[int] = []
        self.callback = _Release(self._release)
        release = ctypes.cast(self.callback, ctypes.c_void_p).value
        self.fmt = ctypes.c_char_p(fmt)
        self.schema = ArrowSchema(format=self.fmt)
        self.array = ArrowArray(
            length=len(values) - offset,
            null_count=null_count,
            offset=offset,
            n_buffers=2,
            buffers=self.buffers,
            release=release,
        )

    def _release(self, address: int) -> None:
        self.releases.append(address)
        ArrowArray.from_address(address).release = None

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        return (
            _capi.PyCapsule_New(ctypes.addressof(self.schema), SCHEMA_NAME, None),
            _capi.PyCapsule_New(ctypes.addressof(self.array), ARRAY_NAME, None),
        )


def _data_address(arr: Any) -> int:
    return arr.buffers()[1].address + arr.offset * arr.type.bit_width // 8


PRIMITIVES = [
    (pa.int8(), tb.int8),
    (pa.int16(), tb.int16),
    (pa.int32(), tb.int32),
    (pa.int64(), tb.int64),
    (pa.uint8(), tb.uint8),
    (pa.uint16(), tb.uint16),
    (pa.uint32(), tb.uint32),
    (pa.uint64(), tb.uint64),
    (pa.float16(), tb.float16),
    (pa.float32(), tb.float32),
    (pa.float64(), tb.float64),
]


@pytest.mark.parametrize(("pa_type", "dtype"), PRIMITIVES, ids=[str(p[0]) for p in PRIMITIVES])
def test_primitive_arrays_are_shared_read_only(pa_type, dtype):
    """Every fixed-width primitive type imports zero-copy, read-only, with its values and dtype."""
    arr = pa.array(np.arange(1, 8).astype(dtype.name), type=pa_type)
    t = tb.asarray(ArrowOnly(arr))
    assert t.dtype is dtype
    assert t.data_ptr() == _data_address(arr)
    assert t.is_readonly
    assert t.tolist() == arr.to_pylist()


def test_pyarrow_array_takes_the_arrow_path():
    """A pyarrow Array (which also has __dlpack__) is imported through the Arrow C data interface."""
    arr = pa.array([1, 2, 3])
    assert _dispatch_path(arr) == "arrow"
    assert tb.asarray(arr).tolist() == [1, 2, 3]


def test_offset_is_honoured():
    """A sliced array starts at its offset: same pointer as pyarrow's, storage offset in elements."""
    arr = pa.array(list(range(10)), type=pa.int32()).slice(3, 4)
    t = tb.asarray(arr)
    assert t.tolist() == [3, 4, 5, 6]
    assert t.data_ptr() == _data_address(arr)
    assert t.storage_offset() == 3


def test_writes_are_refused():
    """Arrow memory is immutable: writing through the tensor raises."""
    t = tb.asarray(pa.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 5.0


def test_copy_true_gives_a_private_writable_copy():
    """copy=True copies: another pointer, writable."""
    arr = pa.array([1, 2, 3], type=pa.int16())
    t = tb.asarray(arr, copy=True)
    assert t.data_ptr() != _data_address(arr)
    t[0] = 9
    assert arr.to_pylist() == [1, 2, 3]


def test_dtype_conversion():
    """dtype= converts with a copy, and is refused with copy=False."""
    arr = pa.array([1, 2], type=pa.int32())
    assert tb.asarray(arr, dtype=tb.float64).tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="can't alias tensor with dtype 'Int' into dtype 'Double'"):
        tb.asarray(arr, dtype=tb.float64, copy=False)


@pytest.mark.parametrize(("length", "offset"), [(1, 0), (8, 0), (19, 0), (19, 3), (5, 7), (0, 0)])
def test_bool_is_unpacked_into_a_copy(length, offset):
    """Bit-packed booleans become one byte per value, the array offset honoured across byte edges."""
    values = [bool((i * 7) % 3) for i in range(length + offset)]
    arr = pa.array(values, type=pa.bool_()).slice(offset)
    t = tb.asarray(arr)
    assert t.dtype is tb.bool
    assert t.tolist() == values[offset:]
    assert not t.is_readonly


def test_bool_with_copy_false_is_refused():
    """A bool array cannot be shared (bits vs bytes): copy=False is a ValueError saying so."""
    with pytest.raises(ValueError, match="bit-packed"):
        tb.asarray(pa.array([True, False]), copy=False)


def test_nulls_are_refused():
    """An array with nulls is a BufferError that suggests how to fill them."""
    with pytest.raises(BufferError, match=r"1 nulls.*fill_null"):
        tb.asarray(pa.array([1, None, 3]))


def test_slice_without_nulls_of_a_nullable_array_is_accepted():
    """A validity bitmap is fine when the slice itself has no nulls (null_count == 0)."""
    arr = pa.array([None, 1, 2, 3]).slice(1)
    assert arr.null_count == 0
    assert tb.asarray(arr).tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "arr",
    [
        pa.array(["a", "b"]),
        pa.array([1, 2], type=pa.timestamp("us")),
        pa.array([1, 2], type=pa.date32()),
        pa.array([[1], [2]]),
        pa.array(["a", "b", "a"]).dictionary_encode(),
        pa.array([1], type=pa.decimal128(5, 2)),
        pa.array([None, None]),
    ],
    ids=["utf8", "timestamp", "date32", "list", "dictionary", "decimal", "null"],
)
def test_non_primitive_types_are_refused(arr):
    """Strings, temporal, nested, dictionary, decimal and null types are a BufferError naming the format."""
    with pytest.raises(BufferError, match="not a fixed-width primitive type"):
        tb.asarray(ArrowOnly(arr))


class _StreamOnly:
    """Offers ``obj``'s Arrow stream and nothing else (no ``__array__`` to fall through to)."""

    def __init__(self, obj):
        self.obj = obj

    def __arrow_c_stream__(self, requested_schema=None):
        return self.obj.__arrow_c_stream__(requested_schema)


def test_record_batch_is_refused():
    """A RecordBatch's stream is a struct ('+s'): refused, not flattened; the batch itself is
    read through the next protocol it offers, ``__array__``, as NumPy reads it."""
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2])], names=["a"])
    with pytest.raises(BufferError, match="'\\+s'"):
        tb.asarray(_StreamOnly(batch))
    assert tb.asarray(batch).tolist() == np.asarray(batch).tolist()


def test_memory_stays_allocated_while_a_view_lives():
    """pyarrow's allocation stays alive through the tensor (and a view of it) and is freed after."""
    gc.collect()
    before = pa.total_allocated_bytes()
    arr = pa.array(range(100_000), type=pa.int64())  # allocated by pyarrow's pool
    view = tb.asarray(arr)[10:]
    del arr
    gc.collect()
    assert pa.total_allocated_bytes() >= before + 800_000
    assert view[0].item() == 10
    del view
    gc.collect()
    assert pa.total_allocated_bytes() <= before


def test_numpy_backed_array_keeps_the_ndarray_alive():
    """pyarrow wraps a NumPy array without copying; the tensor keeps that ndarray alive through Arrow."""
    base = np.arange(6, dtype=np.int32)
    ref = weakref.ref(base)
    t = tb.asarray(pa.array(base))
    assert t.data_ptr() == base.ctypes.data
    del base
    gc.collect()
    assert ref() is not None
    del t
    gc.collect()
    assert ref() is None


def test_release_is_called_exactly_once_when_the_last_view_dies():
    """The array is moved out of the producer and its release runs once, after the last view."""
    producer = CountingProducer([5, 6, 7, 8])
    t = tb.asarray(producer)
    assert producer.array.release is None  # moved: the producer's copy is marked released
    view = t[2:]
    del t
    gc.collect()
    assert producer.releases == []
    assert view.tolist() == [7, 8]
    del view
    gc.collect()
    assert len(producer.releases) == 1
    assert producer.releases[0] != ctypes.addressof(producer.array)  # our moved copy was released


def test_crafted_offset_and_readonly():
    """A producer's offset is honoured and the result is read-only."""
    producer = CountingProducer([1, 2, 3, 4, 5], offset=2)
    t = tb.asarray(producer)
    assert t.tolist() == [3, 4, 5]
    assert t.data_ptr() == ctypes.addressof(producer.values) + 8
    assert t.is_readonly


def test_failed_import_leaves_the_array_with_its_producer():
    """A refused array is neither moved nor released: its producer still owns it."""
    producer = CountingProducer([1, 2], null_count=1)
    producer.buffers[0] = ctypes.addressof(
        producer.values
    )  # a validity bitmap to go with the nulls
    with pytest.raises(BufferError, match="nulls"):
        tb.asarray(producer)
    gc.collect()
    assert producer.array.release is not None
    assert producer.releases == []


def test_released_array_is_refused():
    """An array capsule whose struct is already released is a RuntimeError, not a use-after-free."""
    producer = CountingProducer([1])
    producer.array.release = None
    with pytest.raises(RuntimeError, match="released"):
        tb.asarray(producer)


def test_wrong_capsules_are_refused():
    """__arrow_c_array__ returning something other than two Arrow capsules is a TypeError."""

    class Bad:
        def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
            return (1, 2)

    with pytest.raises(TypeError, match="arrow_schema"):
        tb.asarray(Bad())


def test_release_at_interpreter_exit_is_safe(subprocess_run):
    """A tensor over Arrow memory alive at exit neither crashes nor hangs the interpreter."""
    proc = subprocess_run("""
        import pyarrow as pa, tensorbridge as tb
        keep = tb.asarray(pa.array(list(range(1000))))[5:]
        cycle = [keep]
        cycle.append(cycle)
        print(keep[0].item())
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "5"


# ---------------------------------------------------------------------------------------------- streams
@needs_chunked_stream
def test_single_chunk_stream_is_shared():
    """A ChunkedArray with one chunk imports through __arrow_c_stream__ without a copy."""
    chunked = pa.chunked_array([pa.array([1.5, 2.5, 3.5]).slice(1)])
    assert _dispatch_path(chunked) == "arrow_stream"
    t = tb.asarray(chunked, copy=False)
    assert t.tolist() == [2.5, 3.5]
    assert t.data_ptr() == _data_address(chunked.chunk(0))
    assert t.is_readonly


@needs_chunked_stream
def test_multi_chunk_stream_is_concatenated():
    """Several chunks are copied into one tensor; copy=False refuses, naming the chunk count."""
    chunked = pa.chunked_array([[1, 2], [3], [4, 5, 6]], type=pa.int16())
    t = tb.asarray(StreamOnly(chunked))
    assert t.dtype is tb.int16
    assert t.tolist() == [1, 2, 3, 4, 5, 6]
    assert not t.is_readonly
    with pytest.raises(ValueError, match="3 chunks"):
        tb.asarray(chunked, copy=False)


@needs_chunked_stream
def test_bool_stream_and_empty_stream():
    """Bool chunks unpack and concatenate; a stream with no chunks is an empty tensor of its type."""
    assert tb.asarray(pa.chunked_array([[True], [False, True]])).tolist() == [True, False, True]
    empty = tb.asarray(pa.chunked_array([], type=pa.float32()))
    assert tuple(empty.shape) == (0,)
    assert empty.dtype is tb.float32


@needs_chunked_stream
def test_stream_with_nulls_is_refused():
    """A chunk with nulls is refused; every chunk read so far is still released."""
    gc.collect()
    before = pa.total_allocated_bytes()
    chunked = pa.chunked_array([pa.array(range(50_000)), pa.array([1, None])])
    with pytest.raises(BufferError, match="nulls"):
        tb.asarray(_StreamOnly(chunked))
    # The ChunkedArray itself too: its __array__ could only change the values (NaN for nulls,
    # floats for integers), so a refusal about the values does not fall through to it.
    with pytest.raises(BufferError, match="nulls"):
        tb.asarray(chunked)
    del chunked
    gc.collect()
    assert pa.total_allocated_bytes() <= before


@needs_chunked_stream
def test_stream_memory_lives_with_the_tensor():
    """A one-chunk stream's memory stays allocated while the tensor lives, and is freed after."""
    gc.collect()
    before = pa.total_allocated_bytes()
    chunked = pa.chunked_array([pa.array(range(100_000), type=pa.float64())])
    t = tb.asarray(chunked)
    del chunked
    gc.collect()
    assert pa.total_allocated_bytes() >= before + 800_000
    del t
    gc.collect()
    assert pa.total_allocated_bytes() <= before


def test_table_stream_is_refused():
    """A Table streams struct batches: refused with the format named."""
    with pytest.raises(BufferError, match="'\\+s'"):
        tb.asarray(StreamOnly(pa.table({"a": [1, 2]})))


# ---------------------------------------------------------------------------------------------- other producers
def test_polars_series():
    """A polars Series (Arrow stream) imports with its values."""
    pl = pytest.importorskip("polars")
    assert tb.asarray(pl.Series([1, 2, 3])).tolist() == [1, 2, 3]


def test_pandas_arrow_backed_series():
    """A pandas Series backed by pyarrow imports through its Arrow array."""
    pd = pytest.importorskip("pandas")
    s = pd.Series([1.0, 2.0], dtype="float64[pyarrow]")
    arr = pa.array(s)
    assert tb.asarray(arr).tolist() == [1.0, 2.0]


def test_from_dlpack_of_pyarrow_array_is_read_only():
    """pyarrow's ``__dlpack__`` hands out immutable Arrow memory (as a legacy capsule, which
    cannot say READ_ONLY, in pyarrow 15): the import shares it read-only, so a write cannot
    change the Arrow array."""
    arr = pa.array([1, 2, 3], type=pa.int64())
    if not hasattr(arr, "__dlpack__"):
        pytest.skip(f"pyarrow {pa.__version__} arrays have no __dlpack__")
    t = tb.from_dlpack(arr)
    assert t.is_readonly
    assert t.data_ptr() == arr.buffers()[1].address
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 7
    assert arr.to_pylist() == [1, 2, 3]
    c = tb.from_dlpack(arr, copy=True)
    c[0] = 7
    assert (c.tolist(), arr.to_pylist()) == ([7, 2, 3], [1, 2, 3])


def test_asarray_of_chunked_array_reads_its_values():
    """A ChunkedArray is read through its Arrow stream (pyarrow 16+); where pyarrow has none, through
    its ``__array__`` (a copy, as NumPy reads it)."""
    chunked = pa.chunked_array([[1, 2], [3]])
    t = tb.asarray(chunked)
    assert t.tolist() == [1, 2, 3] and t.dtype is tb.int64
