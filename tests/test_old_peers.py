"""The peers users actually have, imitated: NumPy before 2.1 and pyarrow's legacy capsules.

NumPy 2.0's ``ndarray.__dlpack__(self, stream=None)`` takes no ``max_version``, ``dl_device`` or
``copy``, exports legacy ``"dltensor"`` capsules only, and refuses read-only arrays with a
`BufferError`; NumPy 1.26 behaves the same. pyarrow 15 exports Arrow's immutable memory as legacy
capsules only, which cannot say ``READ_ONLY`` (pyarrow 14 arrays have no ``__dlpack__``). The
fakes here behave exactly so, over tensorbridge memory, so that these paths are tested whatever
NumPy and pyarrow are installed; tests/test_interop_numpy.py and tests/test_arrow.py run the same
requests against the real peers.
"""

from __future__ import annotations

from typing import Any

import pytest

import tensorbridge as tb

# NumPy 1.26 and 2.0's refusal of a read-only array (numpy/_core/src/multiarray/dlpack.c).
_NUMPY_READONLY = "Cannot export readonly array since signalling readonly is unsupported by DLPack."


class OldNumPyArray:
    """An array with NumPy 2.0's DLPack surface, its array interface and no buffer protocol."""

    def __init__(self, t: tb.Tensor) -> None:
        self.t = t
        self.calls: list[Any] = []

    def __dlpack__(self, stream: Any = None) -> Any:
        self.calls.append(stream)
        if stream is not None:
            msg = "NumPy only supports stream=None."
            raise RuntimeError(msg)
        if self.t.is_readonly:
            raise BufferError(_NUMPY_READONLY)
        return tb.utils.dlpack.to_dlpack(self.t)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return self.t.__array_interface__


@pytest.mark.parametrize(
    "call",
    [
        lambda a: tb.tensor(a),
        lambda a: tb.asarray(a, copy=True),
        lambda a: tb.from_dlpack(a, copy=True),
    ],
    ids=["tensor", "asarray copy=True", "from_dlpack copy=True"],
)
def test_old_producer_copy_requests_give_a_private_copy(call: Any) -> None:
    """A copy asked of a producer that takes no ``copy`` keyword is made after the import: the
    values, in new memory, and the producer is called once without keywords."""
    source = tb.arange(3)
    old = OldNumPyArray(source)
    t = call(old)
    assert t.tolist() == [0, 1, 2]
    assert t.data_ptr() != source.data_ptr()
    assert old.calls == [None]


@pytest.mark.parametrize(
    "call",
    [
        lambda a: tb.asarray(a, device="cpu"),
        lambda a: tb.from_dlpack(a, copy=False),
        lambda a: tb.from_dlpack(a, device="cpu"),
        lambda a: tb.from_dlpack(a),
    ],
    ids=["asarray device=cpu", "from_dlpack copy=False", "from_dlpack device=cpu", "from_dlpack"],
)
def test_old_producer_sharing_requests_share(call: Any) -> None:
    """Requests an old producer meets without the keywords (the host device, no copy) share its
    memory, writable as PyTorch imports legacy capsules."""
    source = tb.arange(3)
    t = call(OldNumPyArray(source))
    assert t.data_ptr() == source.data_ptr()
    t[0] = 7
    assert source.tolist() == [7, 1, 2]


class _ReadOnlyOld(OldNumPyArray):
    """NumPy 2.0 with a read-only (or broadcast) array: DLPack refused, the interface serves."""

    def __dlpack__(self, stream: Any = None) -> Any:
        self.calls.append(stream)
        raise BufferError(_NUMPY_READONLY)

    @property
    def __array_interface__(self) -> dict[str, Any]:
        iface = dict(self.t.__array_interface__)
        iface["data"] = (iface["data"][0], True)
        return iface


@pytest.mark.parametrize(
    "make",
    [lambda: tb.arange(4, dtype=tb.float64), lambda: tb.arange(3).reshape(1, 3).expand(2, 3)],
    ids=["read-only", "broadcast"],
)
def test_asarray_reads_a_refused_array_through_its_array_interface(make: Any) -> None:
    """When the producer refuses DLPack, asarray takes the next protocol it offers: the array
    interface shares the memory, read-only as the interface says."""
    source = make()
    old = _ReadOnlyOld(source)
    t = tb.asarray(old)
    assert old.calls == [None]
    assert t.is_readonly
    assert t.data_ptr() == source.data_ptr()
    assert t.stride() == source.stride()
    assert t.tolist() == source.tolist()
    c = tb.asarray(old, copy=True)
    assert not c.is_readonly
    assert c.data_ptr() != source.data_ptr()
    assert c.tolist() == source.tolist()


def test_from_dlpack_passes_the_refusal_through() -> None:
    """from_dlpack has no other protocol to try: the producer's BufferError reaches the caller."""
    with pytest.raises(BufferError, match="Cannot export readonly array") as info:
        tb.from_dlpack(_ReadOnlyOld(tb.arange(2)))
    assert str(info.value) == _NUMPY_READONLY


def test_asarray_passes_the_refusal_through_without_another_protocol() -> None:
    """A producer with nothing but ``__dlpack__`` that refuses: its very exception is raised."""
    refusal = BufferError("producer: not today")

    class Refusing:
        def __dlpack__(self, **kwargs: Any) -> Any:
            raise refusal

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    with pytest.raises(BufferError) as info:
        tb.asarray(Refusing())
    assert info.value is refusal


def test_asarray_raises_the_refusal_when_the_next_protocol_fails_too() -> None:
    """The next protocol failing as well, the producer's refusal is the error raised."""
    refusal = BufferError("producer: not today")

    class Refusing:
        def __init__(self) -> None:
            self.__array_interface__ = {"version": 3, "shape": (2,), "typestr": "|V8"}

        def __dlpack__(self, **kwargs: Any) -> Any:
            raise refusal

    with pytest.raises(BufferError) as info:
        tb.asarray(Refusing())
    assert info.value is refusal


# --------------------------------------------------------------------------------------------------
# Producers of immutable memory that export legacy capsules (pyarrow)


class ArrowLike:
    """pyarrow's surface: the Arrow C data interface, and ``__dlpack__`` giving legacy capsules."""

    def __init__(self, t: tb.Tensor, versioned: bool = False) -> None:
        self.t, self.versioned = t, versioned

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        raise AssertionError("from_dlpack does not read the Arrow interface")

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **kwargs: Any) -> Any:
        return self.t.__dlpack__(max_version=(1, 0) if self.versioned else None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


@pytest.mark.parametrize("kwargs", [{}, {"copy": False}, {"device": "cpu"}])
def test_legacy_capsule_of_an_arrow_producer_imports_read_only(kwargs: dict[str, Any]) -> None:
    """Arrow memory is immutable: its legacy capsule, which cannot say READ_ONLY, gives a
    read-only view of the same memory, and writing through it is refused."""
    source = tb.arange(3)
    t = tb.from_dlpack(ArrowLike(source), **kwargs)
    assert t.is_readonly
    assert t.data_ptr() == source.data_ptr()
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 7
    assert source.tolist() == [0, 1, 2]


def test_copy_of_an_arrow_producer_is_writable() -> None:
    """copy=True gives private memory, which may be written."""
    source = tb.arange(3)
    t = tb.from_dlpack(ArrowLike(source), copy=True)
    t[0] = 7
    assert (t.tolist(), source.tolist()) == ([7, 1, 2], [0, 1, 2])


def test_versioned_capsule_of_an_arrow_producer_says_for_itself() -> None:
    """A versioned capsule carries the producer's own READ_ONLY flag, which is followed."""
    source = tb.arange(3)
    assert not tb.from_dlpack(ArrowLike(source, versioned=True)).is_readonly
    read_only = tb.from_dlpack(ArrowLike(source))
    assert tb.from_dlpack(ArrowLike(read_only, versioned=True)).is_readonly
