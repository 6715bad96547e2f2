"""``to_shareable`` / ``from_shareable``: a tensor as a tuple of values CPython shares between
interpreters natively, and back, over the same memory.

These cases run in one interpreter, on every Python: the tuple's contents, the round trip of every
layout and dtype, memory and lifetime, and the refusal of every malformed tuple. Crossing real
interpreters (CPython 3.14's ``concurrent.interpreters``) is tests/test_interpreters.py.
"""

from __future__ import annotations

import doctest
import gc
import weakref

import pytest

import tensorbridge as tb
from tensorbridge import _shareable
from tensorbridge._device import Device
from tensorbridge._storage import Storage
from tensorbridge._tensor import Tensor

ALL_DTYPES = [d for d in vars(tb).values() if isinstance(d, tb.dtype)]
# What CPython 3.14 shares between interpreters without pickling.
SHAREABLE_TYPES = (type(None), bool, int, float, str, bytes, memoryview)


def _natively_shareable(value: object) -> bool:
    if type(value) is tuple:
        return all(_natively_shareable(item) for item in value)
    return type(value) in SHAREABLE_TYPES


def _round_trip(t: Tensor) -> Tensor:
    return tb.from_shareable(tb.to_shareable(t))


def test_the_tuple_holds_only_natively_shareable_values(layout):
    _, t = layout
    shared = tb.to_shareable(t)
    assert _natively_shareable(shared)
    assert shared[0] == "tensorbridge.Tensor/1"
    data = shared[1]
    assert data.format == "B" and data.ndim == 1 and data.readonly == t.is_readonly


def test_every_layout_round_trips_over_the_same_memory(layout):
    """Shape, strides and values are kept; the tensor views the same bytes (a gapped view too)."""
    _, t = layout
    u = _round_trip(t)
    assert (u.shape, u.stride(), u.dtype) == (t.shape, t.stride(), t.dtype)
    assert u.tolist() == t.tolist()
    if t.numel():
        assert u.data_ptr() == t.data_ptr()


def test_a_gapped_view_sends_its_span_not_a_copy():
    base = tb.arange(24, dtype=tb.float32).reshape(4, 6)
    t = base[1:3, ::2]
    data = tb.to_shareable(t)[1]
    assert data.nbytes == (6 + 4 + 1) * 4  # from [1, 0] to [2, 4], gaps included
    u = tb.from_shareable(tb.to_shareable(t))
    u[1, 2] = -1.0
    assert base[2, 4].item() == -1.0


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips(dtype):
    t = tb.zeros((3, 2), dtype=dtype).T
    u = _round_trip(t)
    assert u.dtype is dtype and u.stride() == (1, 2)
    assert bytes(u.contiguous().as_memoryview()) == bytes(t.contiguous().as_memoryview())


def test_writes_are_seen_both_ways():
    t = tb.zeros(4)
    u = _round_trip(t)
    u[1] = 5.0
    t[2] = 7.0
    assert t.tolist() == [0.0, 5.0, 7.0, 0.0] == u.tolist()


def test_read_only_stays_read_only():
    t = tb.frombuffer(b"\x01\x02\x03\x04", dtype=tb.uint8)
    assert t.is_readonly
    u = _round_trip(t)
    assert u.is_readonly and u.data_ptr() == t.data_ptr()
    with pytest.raises((ValueError, RuntimeError), match="read-only"):
        u[0] = 9


def test_requires_grad_is_kept():
    t = tb.ones(3).requires_grad_()
    assert _round_trip(t).requires_grad


def test_an_empty_tensor_keeps_shape_strides_and_writability():
    for t in (tb.empty((0, 3)), tb.frombuffer(b"abcd", dtype=tb.float32)[:0]):
        u = _round_trip(t)
        assert (u.shape, u.stride(), u.is_readonly) == (t.shape, t.stride(), t.is_readonly)


def test_the_memory_outlives_the_sent_tensor():
    owner = bytearray(b"abcd")
    t = tb.frombuffer(owner, dtype=tb.uint8)
    shared = tb.to_shareable(t)
    del t
    gc.collect()
    with pytest.raises(BufferError):
        owner.extend(b"!")  # the tuple's memoryview still exports it
    u = tb.from_shareable(shared)
    del shared
    gc.collect()
    assert bytes(u.as_memoryview()) == b"abcd"
    del u
    gc.collect()
    owner.extend(b"!")  # the last view is gone: the export is released


def test_any_array_like_crosses_zero_copy():
    np = pytest.importorskip("numpy")
    a = np.arange(6.0).reshape(2, 3)[:, ::2]
    u = tb.from_shareable(tb.to_shareable(a))
    assert np.shares_memory(u.numpy(), a)
    ref = weakref.ref(a.base)
    del a
    gc.collect()
    assert ref() is not None  # the memory lives while the tensor does
    assert u.tolist() == [[0.0, 2.0], [3.0, 5.0]]


def test_examples_in_the_docstrings_run():
    assert doctest.testmod(_shareable, optionflags=doctest.ELLIPSIS).failed == 0


# ------------------------------------------------------------------ refusals


def test_to_shareable_refuses_device_memory():
    storage = Storage(0x7F00_0000_0000, 16, Device("cuda", 0), False, None)
    t = Tensor._new(storage, 0, (4,), (1,), tb.float32)
    with pytest.raises(BufferError, match=r"to_shareable\(\).*cuda:0.*host"):
        tb.to_shareable(t)


def test_to_shareable_names_itself_for_what_asarray_refuses():
    with pytest.raises(TypeError, match=r"to_shareable\(\)"):
        tb.to_shareable(object())


def _good() -> tuple:
    return tb.to_shareable(tb.arange(6, dtype=tb.float32).reshape(2, 3))


def _with(index: int, value: object) -> tuple:
    shared = list(_good())
    shared[index] = value
    return tuple(shared)


class _Incomparable:
    """A first item whose comparison raises, as a NumPy array's truth value does."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("ambiguous")

    __ne__ = __eq__
    __hash__ = None  # type: ignore[assignment]


# Built in the test, not at collection: a tuple's memoryview is an export held while it lives.
NOT_SHAREABLE = {
    "none": lambda: None,
    "list": lambda: [1, 2],
    "tag": lambda: "tensorbridge.Tensor/1",
    "short": lambda: _good()[:7],
    "long": lambda: (*_good(), None),
    "as-list": lambda: list(_good()),
    "tag-not-str": lambda: (_Incomparable(), *_good()[1:]),
}


@pytest.mark.parametrize("name", NOT_SHAREABLE)
def test_what_is_not_a_shareable_tuple_is_a_type_error(name):
    with pytest.raises(TypeError, match=r"from_shareable\(\).*tb\.to_shareable\(t\)"):
        tb.from_shareable(NOT_SHAREABLE[name]())


def test_an_unknown_tag_is_refused():
    with pytest.raises(TypeError, match=r"from_shareable\(\).*'tensorbridge.Tensor/1'"):
        tb.from_shareable(_with(0, "tensorbridge.Tensor/2"))


@pytest.mark.parametrize(
    ("index", "value", "error", "words"),
    [
        (2, "float128", ValueError, "dtype 'float128' is not a tensorbridge dtype"),
        (2, 7, ValueError, "dtype 7 is not a tensorbridge dtype"),
        (3, (2.0, 3), TypeError, "shape must hold ints"),
        (3, "23", TypeError, "shape must be a tuple of ints"),
        (3, (2, -3), ValueError, "negative size"),
        (4, (3,), ValueError, "one stride per dimension"),
        (4, (3, 2**63), ValueError, "past int64"),
        (5, -1, ValueError, "storage offset must be 0"),
        (5, True, TypeError, "storage offset must be an int"),
        (6, 1, TypeError, "read-only flag must be True or False"),
        (7, "yes", TypeError, "requires_grad must be True or False"),
    ],
)
def test_a_malformed_description_is_refused_before_the_memory_is_touched(
    index, value, error, words
):
    with pytest.raises(error, match=r"from_shareable\(\): ") as info:
        tb.from_shareable(_with(index, value))
    assert words in str(info.value)
    assert "tb.to_shareable" in str(info.value) or "to_shareable()" in str(info.value)


@pytest.mark.parametrize(
    ("index", "value"),
    [(3, (2, 4)), (4, (3, 100)), (5, 1), (4, (-3, 1))],
    ids=["shape", "strides", "offset", "negative-stride"],
)
def test_a_layout_outside_the_bytes_sent_is_refused(index, value):
    with pytest.raises(ValueError, match=r"from_shareable\(\).*outside the storage"):
        tb.from_shareable(_with(index, value))


@pytest.mark.parametrize(
    "data", [None, "abc", memoryview(bytes(48))[::2]], ids=["none", "str", "strided"]
)
def test_data_that_exports_no_contiguous_memory_is_a_buffer_error(data):
    with pytest.raises(BufferError, match=r"from_shareable\(\).*C-contiguous.*to_shareable\(\)"):
        tb.from_shareable(_with(1, data))


def test_a_writable_description_over_read_only_bytes_gives_a_read_only_tensor():
    """The memory's own flag wins: bytes cannot be written, whatever the tuple says."""
    u = tb.from_shareable(_with(1, bytes(24)))
    assert u.is_readonly
