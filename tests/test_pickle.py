"""Pickling (``Tensor.__reduce_ex__``) and shared memory (``Tensor.share_memory_``).

Round trips keep dtype, shape, strides (dense layouts) or a contiguous copy (views with gaps), the
read-only flag and requires_grad; protocol 5 moves bytes out of band without copying, and a read-only
out-of-band buffer gives a read-only tensor over that very memory (NumPy's rule). Shared-memory
tensors cross process boundaries by name through multiprocessing's pickler, so a worker's writes are
seen by the parent; exports made before ``share_memory_()`` keep the old memory alive.
"""

from __future__ import annotations

import concurrent.futures
import copy
import gc
import multiprocessing
import operator
import pickle
import re
import sys
from multiprocessing import shared_memory
from multiprocessing.reduction import ForkingPickler

import pytest

import tensorbridge as tb
from tensorbridge import _buffer, _shared, _tensor
from tensorbridge._device import Device
from tensorbridge._layout import extent
from tensorbridge._storage import Storage
from tensorbridge._tensor import Tensor

PROTOCOLS = list(range(pickle.HIGHEST_PROTOCOL + 1))
ALL_DTYPES = [d for d in vars(tb).values() if isinstance(d, tb.dtype)]


def _np():
    return pytest.importorskip("numpy")


def _has_gaps(t: Tensor) -> bool:
    """True when the elements span more memory than they fill (then pickling packs them)."""
    span = extent(t.storage_offset(), t.shape, t.stride())
    return span is not None and span[1] - span[0] + 1 > t.numel()


def _same(a: Tensor, b: Tensor) -> None:
    assert a.dtype is b.dtype
    assert tuple(a.shape) == tuple(b.shape)
    assert bytes(a._bytes("test")) == bytes(b._bytes("test"))
    assert a.is_readonly is b.is_readonly
    assert a.requires_grad is b.requires_grad


@pytest.fixture(scope="module")
def pool():
    """One spawned worker for the whole module: processes are slow to start."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as ex:
        yield ex


# -------------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_layout_matrix_round_trip(layout, protocol):
    """Every layout and protocol: same values; strides kept unless the view has gaps."""
    _, t = layout
    u = pickle.loads(pickle.dumps(t, protocol=protocol))
    _same(t, u)
    if _has_gaps(t):
        assert u.is_contiguous()
    else:
        assert u.stride() == t.stride()


@pytest.mark.parametrize(
    "dtype", sorted(set(ALL_DTYPES), key=lambda d: d.name), ids=lambda d: d.name
)
def test_every_dtype(dtype):
    """Every dtype round-trips its exact bytes."""
    t = tb.frombuffer(bytearray(range(16 * dtype.itemsize)), dtype=dtype)
    for protocol in (2, 5):
        _same(t, pickle.loads(pickle.dumps(t, protocol=protocol)))


def test_requires_grad_and_readonly_round_trip():
    """requires_grad and the read-only flag survive every protocol."""
    g = tb.frombuffer(bytearray(16), dtype=tb.float32, requires_grad=True)
    r = tb.frombuffer(bytes(16), dtype=tb.float64)
    for protocol in PROTOCOLS:
        assert pickle.loads(pickle.dumps(g, protocol=protocol)).requires_grad
        assert pickle.loads(pickle.dumps(r, protocol=protocol)).is_readonly


def test_unpickled_tensor_is_independent():
    """An in-band round trip is a copy: writing it leaves the original alone, and it is writable."""
    t = tb.arange(4)
    for protocol in (2, 5):
        u = pickle.loads(pickle.dumps(t, protocol=protocol))
        u[0] = 99
        assert t[0].item() == 0


def test_copy_and_deepcopy():
    """copy.copy and copy.deepcopy give equal, independent tensors."""
    t = tb.arange(6, dtype=tb.float32).reshape(2, 3)
    for c in (copy.copy(t), copy.deepcopy(t)):
        _same(t, c)
        c[0, 0] = -1.0
        assert t[0, 0].item() == 0.0


def test_broadcast_view_stays_small():
    """A broadcast view pickles its few distinct elements, not the expanded size."""
    t = tb.arange(4, dtype=tb.float64).reshape(1, 4).expand(100_000, 4)
    data = pickle.dumps(t, protocol=5)
    assert len(data) < 1000
    u = pickle.loads(data)
    assert u.stride() == (0, 1)
    assert u[99_999].tolist() == [0.0, 1.0, 2.0, 3.0]


# -------------------------------------------------------------------------------------------------
# Protocol 5, out of band


def test_out_of_band_is_zero_copy():
    """buffer_callback gets a PickleBuffer over the tensor's memory; loads() maps it back, writable."""
    np = _np()
    t = tb.arange(100_000, dtype=tb.float64)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1
    assert len(data) < 300  # metadata only
    assert np.frombuffer(buffers[0], dtype=np.float64).ctypes.data == t.data_ptr()
    u = pickle.loads(data, buffers=buffers)
    assert u.data_ptr() == t.data_ptr()
    u[0] = 5.0
    assert t[0].item() == 5.0


def _out_of_band(t: Tensor) -> tuple[bytes, list[pickle.PickleBuffer]]:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
    return data, buffers


def _address(buffer: object) -> int:
    """The address of a buffer's first byte (read-only buffers included)."""
    return tb.frombuffer(buffer, dtype=tb.uint8).data_ptr()


@pytest.mark.parametrize(
    "dtype", sorted(set(ALL_DTYPES), key=lambda d: d.name), ids=lambda d: d.name
)
def test_out_of_band_readonly_buffer_gives_a_readonly_view(dtype):
    """Every dtype: a read-only out-of-band buffer gives a read-only tensor over that very memory."""
    t = tb.frombuffer(bytearray(range(16 * dtype.itemsize)), dtype=dtype).reshape(4, 4)
    data, buffers = _out_of_band(t)
    received = [bytes(b) for b in buffers]  # read-only memory, as a receiver holds it
    u = pickle.loads(data, buffers=received)
    assert u.is_readonly
    assert u.data_ptr() == _address(received[0])
    assert u.dtype is dtype
    assert u.shape == t.shape
    assert u.stride() == t.stride()
    assert bytes(u._bytes("test")) == bytes(t._bytes("test"))


def test_out_of_band_readonly_layouts_keep_strides_and_offset(layout):
    """Every layout: read-only buffers keep strides and storage offset (views with gaps are packed)."""
    _, t = layout
    data, buffers = _out_of_band(t)
    readonly = [memoryview(b).toreadonly() for b in buffers]
    u = pickle.loads(data, buffers=readonly)
    assert u.is_readonly
    assert u.tolist() == t.tolist()
    if t.numel() and not _has_gaps(t):
        assert u.stride() == t.stride()
        assert u.data_ptr() == t.data_ptr()  # the very memory: no copy anywhere
    elif t.numel():
        assert u.is_contiguous()


def test_out_of_band_readonly_view_refuses_writes_and_clone_is_private():
    """Writes to the read-only view raise; clone() is a writable copy that leaves the buffer alone."""
    t = tb.arange(6, dtype=tb.float32)
    data, buffers = _out_of_band(t)
    received = [bytes(b) for b in buffers]
    u = pickle.loads(data, buffers=received)
    with pytest.raises(ValueError, match="read-only"):
        u[0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        u.fill_(2.0)
    c = u.clone()
    assert not c.is_readonly
    c[0] = 9.0
    assert u[0].item() == 0.0
    assert received[0] == t.as_memoryview().tobytes()


def test_out_of_band_readonly_view_keeps_the_buffer_alive():
    """The tensor holds the buffer's export: the memory outlives every other reference to it."""
    t = tb.arange(1000, dtype=tb.int64)
    data, buffers = _out_of_band(t)
    received = [bytes(b) for b in buffers]
    u = pickle.loads(data, buffers=received)
    del received, buffers, t
    gc.collect()
    churn = [bytes(8000) for _ in range(50)]
    assert u.tolist() == list(range(1000))
    del churn


def test_out_of_band_writable_buffer_gives_a_writable_view():
    """A writable out-of-band buffer gives a writable tensor whose writes reach the buffer."""
    t = tb.arange(4, dtype=tb.int16)
    data, buffers = _out_of_band(t)
    received = [bytearray(b) for b in buffers]
    u = pickle.loads(data, buffers=received)
    assert not u.is_readonly
    u[1] = -7
    assert memoryview(received[0]).cast("h").tolist() == [0, -7, 2, 3]


def test_out_of_band_writable_buffer_for_a_readonly_tensor_stays_readonly():
    """A tensor pickled read-only is rebuilt read-only over a writable buffer too."""
    t = tb.frombuffer(bytes(range(8)), dtype=tb.uint8)
    data, buffers = _out_of_band(t)
    received = [bytearray(b) for b in buffers]
    u = pickle.loads(data, buffers=received)
    assert u.is_readonly
    assert u.data_ptr() == _address(received[0])


def test_out_of_band_requires_grad_survives_a_readonly_buffer():
    """requires_grad is kept when the buffer is read-only."""
    t = tb.arange(4, dtype=tb.float64).requires_grad_()
    data, buffers = _out_of_band(t)
    u = pickle.loads(data, buffers=[bytes(b) for b in buffers])
    assert u.requires_grad and u.is_readonly


def test_out_of_band_strided_buffer_is_refused():
    """A buffer that is not C-contiguous is a BufferError naming its type, never a wrong view."""
    data, _ = _out_of_band(tb.arange(4, dtype=tb.uint8))
    strided = memoryview(bytearray(8))[::2]
    with pytest.raises(BufferError, match=r"C-contiguous.*memoryview"):
        pickle.loads(data, buffers=[strided])


def test_out_of_band_short_buffer_is_bounds_checked():
    """A buffer shorter than the tensor's layout is a ValueError, never an out-of-bounds view."""
    data, _ = _out_of_band(tb.arange(4, dtype=tb.float64))
    with pytest.raises(ValueError, match="outside the storage"):
        pickle.loads(data, buffers=[bytes(16)])


def test_in_band_protocol_4_bytes_still_copy_for_a_writable_tensor():
    """In band, protocols 0 to 4 keep today's rule: a writable tensor gets a writable copy."""
    t = tb.arange(4, dtype=tb.int32)
    for protocol in range(5):
        u = pickle.loads(pickle.dumps(t, protocol=protocol))
        assert not u.is_readonly
        u[0] = 5
        assert t[0].item() == 0


def test_pickles_naming_the_old_module_still_load():
    """A pickle that names tensorbridge._buffer._rebuild_tensor (earlier versions) still loads."""
    new = pickle.dumps(tb.arange(3, dtype=tb.int64), protocol=2)
    old = new.replace(b"tensorbridge._tensor", b"tensorbridge._buffer")
    assert old != new
    u = pickle.loads(old)
    assert u.tolist() == [0, 1, 2]
    assert not u.is_readonly


def test_out_of_band_readonly_tensor_shares_readonly_buffers():
    """A read-only tensor rebuilt from read-only buffers shares them (no copy is needed)."""
    t = tb.frombuffer(bytes(range(8)), dtype=tb.uint8)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
    received = [bytes(b) for b in buffers]
    u = pickle.loads(data, buffers=received)
    assert u.is_readonly
    np = _np()
    assert u.data_ptr() == np.frombuffer(received[0], dtype=np.uint8).ctypes.data


def test_in_band_protocol_5_keeps_the_stream_bytes():
    """In band, protocol 5 stores a bytearray, which the rebuilt tensor adopts without a copy."""
    u = pickle.loads(pickle.dumps(tb.arange(4, dtype=tb.int64), protocol=5))
    assert isinstance(u._storage.owner.obj, bytearray)
    assert not u.is_readonly


def test_non_host_tensor_refuses():
    """A tensor whose memory is not on the host cannot be pickled."""
    storage = Storage(0x7F00_0000_0000, 16, Device("cuda", 0), False, None)
    t = Tensor._new(storage, 0, (4,), (1,), tb.float32)
    with pytest.raises(BufferError, match="cuda:0"):
        pickle.dumps(t)


def test_malformed_pickle_is_bounds_checked():
    """Metadata pointing outside the pickled bytes is a ValueError, never an out-of-bounds view."""
    with pytest.raises(ValueError, match="outside the storage"):
        _buffer._rebuild_tensor(bytearray(8), "float64", (2,), (1,), 0, False, False)
    with pytest.raises(ValueError, match="outside the storage"):
        _tensor._rebuild_from_buffer(bytes(8), "float64", (2,), (1,), 0, False, False)


class _Tampered:
    """Pickles as a tensor whose reduce tuple was edited: ``pickle.loads`` runs the real rebuild."""

    def __init__(self, t: Tensor, protocol: int, **changes: object) -> None:
        rebuild, args = t.__reduce_ex__(protocol)
        fields = dict(zip(("dtype", "shape", "strides", "offset", "readonly", "grad"), args[1:]))
        fields.update(changes)
        self.reduced = (rebuild, (args[0], *fields.values()))

    def __reduce__(self):
        return self.reduced


_REPICKLE = (
    "The pickle was damaged or altered after tensorbridge wrote it; pickle the tensor again."
)
_NOT_INTS = [
    # (field, value, what the message says)
    ("shape", (6.0,), "a pickled tensor's shape must hold ints; got 6.0 in (6.0,) (float)."),
    ("shape", (2.5,), "a pickled tensor's shape must hold ints; got 2.5 in (2.5,) (float)."),
    ("shape", (True,), "a pickled tensor's shape must hold ints; got True in (True,) (bool)."),
    ("shape", 6, "a pickled tensor's shape must be a tuple of ints; got 6 (int)."),
    ("shape", "6", "a pickled tensor's shape must be a tuple of ints; got '6' (str)."),
    ("strides", (1.0,), "a pickled tensor's strides must hold ints; got 1.0 in (1.0,) (float)."),
    (
        "strides",
        (False,),
        "a pickled tensor's strides must hold ints; got False in (False,) (bool).",
    ),
    ("offset", 0.0, "a pickled tensor's storage offset must be an int; got 0.0 (float)."),
    ("offset", 1.5, "a pickled tensor's storage offset must be an int; got 1.5 (float)."),
    ("offset", True, "a pickled tensor's storage offset must be an int; got True (bool)."),
    ("readonly", "no", "a pickled tensor's read-only flag must be True or False; got 'no' (str)."),
    ("grad", 1, "a pickled tensor's requires_grad must be True or False; got 1 (int)."),
]


@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize(("field", "value", "words"), _NOT_INTS)
def test_tampered_pickle_of_the_wrong_type_is_refused(protocol, field, value, words):
    """Floats (even 6.0) and bools where ints belong, and non-bool flags: a TypeError, never a tensor."""
    tampered = _Tampered(tb.arange(6, dtype=tb.float32), protocol, **{field: value})
    data = pickle.dumps(tampered, protocol=protocol)
    with pytest.raises(TypeError) as info:
        pickle.loads(data)
    assert str(info.value) == f"pickle.loads(): {words[:-1]}. {_REPICKLE}"


_BAD_VALUES = [
    ("dtype", "float128", "a pickled tensor's dtype 'float128' is not a tensorbridge dtype"),
    ("shape", (-6,), "a pickled tensor's shape [-6] has a negative size"),
    ("shape", (1,) * 65, "a pickled tensor has 65 dimensions; at most 64 are supported"),
    ("shape", (2, 3), "a pickled tensor's strides [1] do not match its shape [2, 3]"),
    ("strides", (1, 1), "a pickled tensor's strides [1, 1] do not match its shape [6]"),
    (
        "strides",
        (-(2**63),),
        f"a pickled tensor's strides [{-(2**63)}] hold {-(2**63)}, past int64: a stride is at "
        f"most 2**63 - 1 elements either way",
    ),
    ("offset", -1, "a pickled tensor's storage offset must be 0 to 2**63 - 1; got -1"),
    ("offset", 2**63, f"a pickled tensor's storage offset must be 0 to 2**63 - 1; got {2**63}"),
]


@pytest.mark.parametrize(("field", "value", "words"), _BAD_VALUES)
def test_tampered_pickle_with_a_bad_value_is_refused(field, value, words):
    """An unknown dtype, a negative size, too many dimensions, strides that miss a dimension."""
    data = pickle.dumps(_Tampered(tb.arange(6, dtype=tb.float32), 5, **{field: value}), protocol=5)
    with pytest.raises(ValueError, match=re.escape(f"pickle.loads(): {words}")) as info:
        pickle.loads(data)
    assert str(info.value).endswith(_REPICKLE)


# Protocol 0 writes each int as ``I<digits>\n``: the shape (2, 3), the strides (3, 1) and the
# offset 0 of ``arange(6).reshape(2, 3)``, then the two flags (``I00``: False).
_EDITS = [
    (b"(I2\nI3\nt", b"(F2.0\nI3\nt", "shape must hold ints; got 2.0 in (2.0, 3) (float)"),
    (b"(I2\nI3\nt", b"(I01\nI3\nt", "shape must hold ints; got True in (True, 3) (bool)"),
    (b"(I3\nI1\nt", b"(I3\nF1.0\nt", "strides must hold ints; got 1.0 in (3, 1.0) (float)"),
    (b"\nI0\nI00\n", b"\nF0.0\nI00\n", "storage offset must be an int; got 0.0 (float)"),
]


@pytest.mark.parametrize(("old", "new", "words"), _EDITS)
def test_pickle_bytes_edited_to_floats_and_bools_are_refused(old, new, words):
    """The same refusals for a pickle whose bytes were edited, protocol 0."""
    data = pickle.dumps(tb.arange(6, dtype=tb.int8).reshape(2, 3), protocol=0)
    assert data.count(old) == 1
    with pytest.raises(TypeError, match=re.escape(f"pickle.loads(): a pickled tensor's {words}.")):
        pickle.loads(data.replace(old, new))


class _Six(int):
    """An int subclass, as a pickle may carry one."""


def test_pickled_numpy_and_int_subclass_integers_are_taken_as_ints():
    """Integers are what operator.index takes (NumPy integers, int subclasses): kept as plain ints."""
    np = _np()
    t = tb.arange(12, dtype=tb.int16)
    data = pickle.dumps(
        _Tampered(t, 5, shape=(np.int64(2), _Six(6)), strides=[np.int32(6), 1], offset=np.uint8(0)),
        protocol=5,
    )
    u = pickle.loads(data)
    assert u.tolist() == t.reshape(2, 6).tolist()
    assert [type(v) for v in (*u.shape, *u.stride(), u.storage_offset())] == [int] * 5


# Layouts past int64 (the shape by `_layout.check_sizes`, the one rule for sizes that enter from
# outside; strides and offsets by magnitude), each with what the message says.
_PAST_INT64 = [
    ((2**64,), (1,), 0, "2**63 - 1"),
    ((0, 2**70), (1, 1), 0, "2**63 - 1"),  # no element, but no size past int64 either
    ((2**62, 4), (4, 1), 0, "holds more than 2**63 - 1 elements"),
    ((1,), (2**63,), 0, f"strides [{2**63}] hold {2**63}, past int64"),
    ((1,), (-(2**63),), 0, f"strides [{-(2**63)}] hold {-(2**63)}, past int64"),
    ((0,), (1,), 2**63, f"storage offset must be 0 to 2**63 - 1; got {2**63}"),
    ((0,), (1,), -1, "storage offset must be 0 to 2**63 - 1; got -1"),
]


@pytest.mark.parametrize("rebuild", [_tensor._rebuild_tensor, _tensor._rebuild_from_buffer])
@pytest.mark.parametrize(("shape", "strides", "offset", "words"), _PAST_INT64)
def test_layouts_past_int64_are_refused_before_the_data_is_used(
    rebuild, shape, strides, offset, words
):
    """Every size, their product, each stride's magnitude and the offset fit int64 (the offset is
    not negative): checked with the rest of what the pickle says, before its data is looked at
    (here None, which would be refused too)."""
    with pytest.raises(ValueError) as info:
        rebuild(None, "float32", shape, strides, offset, False, False)
    text = str(info.value)
    assert text.startswith("pickle.loads(): ") and words in text, text
    assert text.endswith(_REPICKLE)


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize(
    "data",
    [None, 5, "abcd", [1, 2], memoryview(bytearray(16))[::2]],
    ids=["None", "int", "str", "list", "strided"],
)
def test_pickled_data_that_is_not_memory_is_refused(data, readonly):
    """Protocols 0 to 4: the data must export C-contiguous memory, refused in a pickle's words
    (as protocol 5's buffers are), for a writable tensor and a read-only one."""
    with pytest.raises(BufferError) as info:
        _tensor._rebuild_tensor(data, "uint8", (0,), (1,), 0, readonly, False)
    text = str(info.value)
    prefix = "pickle.loads(): a tensor's data must export C-contiguous memory; got "
    assert text.startswith(f"{prefix}{type(data).__name__} ("), text
    assert text.endswith(_REPICKLE)


# -------------------------------------------------------------------------------------------------
# multiprocessing


def test_plain_tensor_through_a_process_pool(pool):
    """A tensor in ordinary memory reaches the worker as a copy: its writes stay there."""
    t = tb.arange(5, dtype=tb.int32)
    back = pool.submit(operator.methodcaller("fill_", 3), t).result()
    assert back.tolist() == [3] * 5
    assert t.tolist() == [0, 1, 2, 3, 4]


def test_process_pool_reads_layouts(pool):
    """Non-contiguous and read-only tensors arrive with their values."""
    t = tb.arange(12).reshape(3, 4)[:, 1::2].T
    assert pool.submit(Tensor.tolist, t).result() == t.tolist()
    r = tb.frombuffer(bytes(range(4)), dtype=tb.uint8)
    assert pool.submit(operator.attrgetter("is_readonly"), r).result()


def test_multiprocessing_pool():
    """multiprocessing.Pool (forkserver or spawn) sends and returns tensors."""
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(1) as p:
        assert p.map(Tensor.tolist, [tb.arange(3), tb.ones(2)]) == [[0, 1, 2], [1.0, 1.0]]


# -------------------------------------------------------------------------------------------------
# Shared memory


def test_share_memory_moves_the_storage():
    """share_memory_() returns the tensor, keeps values and layout, and every view moves with it."""
    base = tb.arange(12, dtype=tb.float32)
    t = base.reshape(3, 4)[1:]
    before = t.tolist()
    assert t.share_memory_() is t
    assert isinstance(t._storage.owner, _shared._SharedBlock)
    assert base._storage is t._storage
    assert t.tolist() == before
    base[4] = -1.0
    assert t[0, 0].item() == -1.0


def test_already_shared_returns_itself():
    """A tensor already in shared memory is returned as is, memory unchanged."""
    t = tb.arange(4).share_memory_()
    ptr = t.data_ptr()
    assert t.share_memory_() is t
    assert t.data_ptr() == ptr


def test_share_memory_keeps_readonly():
    """A read-only tensor stays read-only in shared memory."""
    t = tb.frombuffer(bytes(8), dtype=tb.uint8).share_memory_()
    assert t.is_readonly
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 1


def test_share_memory_refuses_device_memory():
    """Only CPU memory can be moved into shared memory."""
    storage = Storage(0x7F00_0000_0000, 16, Device("cuda", 0), False, None)
    t = Tensor._new(storage, 0, (4,), (1,), tb.float32)
    with pytest.raises(BufferError, match="CPU"):
        t.share_memory_()


def test_exports_before_the_move_keep_the_old_memory():
    """A memoryview, a NumPy array and a DLPack capsule made before share_memory_() stay valid."""
    np = _np()
    t = tb.arange(4, dtype=tb.int64)
    mv = t.as_memoryview()
    arr = np.asarray(t)
    old_ptr = t.data_ptr()
    try:
        capsule_holder = tb.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    except NotImplementedError:
        capsule_holder = None
    t.share_memory_()
    assert t.data_ptr() != old_ptr
    assert arr.ctypes.data == old_ptr
    t.fill_(9)
    del t
    gc.collect()
    churn = [tb.full((4,), -1, dtype=tb.int64) for _ in range(50)]
    assert mv.tolist() == [0, 1, 2, 3]
    assert arr.tolist() == [0, 1, 2, 3]
    if capsule_holder is not None:
        assert capsule_holder.tolist() == [0, 1, 2, 3]
    del churn


def test_shared_tensor_written_by_a_worker(pool):
    """A worker's writes to a shared-memory tensor reach the parent; the result aliases it."""
    t = tb.zeros(6, dtype=tb.float64).share_memory_()
    view = t[2:5]
    back = pool.submit(operator.methodcaller("fill_", 7.0), view).result()
    assert t.tolist() == [0.0, 0.0, 7.0, 7.0, 7.0, 0.0]
    assert isinstance(back._storage.owner, _shared._SharedBlock)
    assert back._storage.owner.name.partition(".")[0] == t._storage.owner.name  # one segment
    back[0] = -1.0
    assert t[2].item() == -1.0


def test_a_tensor_a_worker_shared_comes_back(pool):
    """A worker may drop a tensor it shared as soon as it is sent: the parent still attaches."""
    backs = [pool.submit(Tensor.share_memory_, tb.full((1000,), i)).result() for i in range(5)]
    assert [b.tolist() == [i] * 1000 for i, b in enumerate(backs)] == [True] * 5
    assert all(isinstance(b._storage.owner, _shared._SharedBlock) for b in backs)


def test_forking_pickler_sends_the_name():
    """multiprocessing's pickler sends a shared tensor by name: the copy maps the same memory."""
    t = tb.arange(6, dtype=tb.int16).reshape(2, 3).share_memory_().T
    data = bytes(ForkingPickler.dumps(t))
    assert len(data) < 400
    u = pickle.loads(data)
    assert u.stride() == t.stride()
    assert u.tolist() == t.tolist()
    u[0, 1] = 100
    assert t[0, 1].item() == 100
    assert u.data_ptr() != t.data_ptr()  # a second mapping of one segment


def test_plain_pickle_of_a_shared_tensor_carries_bytes():
    """pickle.dumps (not multiprocessing) sends the values, so the pickle outlives the segment."""
    t = tb.arange(3).share_memory_()
    u = pickle.loads(pickle.dumps(t))
    assert not isinstance(u._storage.owner, _shared._SharedBlock)
    u[0] = 5
    assert t[0].item() == 0


def test_segment_is_unlinked_when_the_storage_dies():
    """The creating process unlinks the segment with its storage: the name is gone."""
    t = tb.ones(4).share_memory_()
    name = t._storage.owner.name
    del t
    gc.collect()
    assert name not in _shared._OWNED
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)


def test_exit_with_live_shared_tensors_is_clean(subprocess_run):
    """Exiting with live shared tensors unlinks their segments and prints no leak warning."""
    result = subprocess_run("""
        import tensorbridge as tb
        t = tb.arange(10).share_memory_()
        keep = [t, t[2:]]
        print(t._storage.owner.name)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=result.stdout.strip())


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX shared memory names")
def test_worker_exit_does_not_unlink(pool):
    """A worker that received a shared tensor and dropped it leaves the segment to its creator."""
    t = tb.arange(4).share_memory_()
    pool.submit(Tensor.tolist, t).result()
    shm = shared_memory.SharedMemory(name=t._storage.owner.name)
    shm.close()
