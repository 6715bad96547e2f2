"""Faults: producers that raise, return garbage or hand out one capsule twice, deleters that fail,
and allocations that fail. Each ends in a clean exception or a correct result, and every deleter
still runs exactly once.
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
from typing import Any

import pytest
from tests.soak import crafted

import tensorbridge as tb
from tensorbridge import _capi, _exports, testing
from tensorbridge import _dlpack_abi as abi

_VALUES = (ctypes.c_float * 4)(1, 2, 3, 4)


def _managed(**fields: Any) -> testing.CraftedDLPack:
    """A well-formed crafted 1-D float32 tensor over `_VALUES` (fields override)."""
    return testing.CraftedDLPack(
        (), data=ctypes.addressof(_VALUES), shape=(4,), strides=(1,), keep=_VALUES, **fields
    )


class _Producer:
    """A DLPack producer whose ``__dlpack__`` and ``__dlpack_device__`` do whatever the test
    says."""

    def __init__(self, export: Any, device: Any = (1, 0)) -> None:
        self._export, self._device = export, device
        self.calls: list[dict[str, Any]] = []

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return self._export(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._device() if callable(self._device) else self._device


def _returning(obj: Any) -> _Producer:
    """A producer whose ``__dlpack__`` returns ``obj``, every time."""
    return _Producer(lambda **kw: obj)


def _raise(exc: BaseException) -> Any:
    def export(**kwargs: Any) -> Any:
        raise exc

    return export


# --------------------------------------------------------------------------------------------------
# __dlpack__ raises


@pytest.mark.parametrize(
    "exc",
    [
        BufferError("producer: no"),
        RuntimeError("producer: broken"),
        ValueError("producer: bad value"),
        MemoryError("producer: out of memory"),
    ],
)
@crafted.isolated
def test_producer_exception_passes_through(exc: Exception) -> None:
    """An exception raised by ``__dlpack__`` reaches the caller unchanged, and nothing is
    retried."""
    producer = _Producer(_raise(exc))
    with pytest.raises(type(exc)) as info:
        tb.from_dlpack(producer)
    assert info.value is exc
    assert len(producer.calls) == 1


@crafted.isolated
def test_unrelated_type_error_is_not_retried() -> None:
    """A ``TypeError`` that is not about the keywords propagates; the producer is called once
    (PyTorch 2.13 retries on any TypeError)."""
    producer = _Producer(_raise(TypeError("producer: unsupported dtype")))
    with pytest.raises(TypeError, match="unsupported dtype"):
        tb.from_dlpack(producer)
    assert len(producer.calls) == 1


@crafted.isolated
def test_keyword_rejection_retries_without_keywords() -> None:
    """A pre-2023.12 producer rejecting ``max_version`` is called again without keywords and
    imported."""
    record = _managed(versioned=False)

    class Legacy:
        def __dlpack__(self, stream: Any = None) -> Any:
            return record.take()

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    assert tb.from_dlpack(Legacy()).tolist() == [1.0, 2.0, 3.0, 4.0]
    gc.collect()
    assert record.deleter_calls == 1


@crafted.isolated
def test_keyword_rejection_with_copy_request_copies_host_memory() -> None:
    """A keyword-rejecting host producer asked for ``copy=True`` is called again without the
    keywords; the copy it could not be asked for is made after the import, and its capsule is
    still released exactly once."""
    record = _managed(versioned=False)

    class Legacy:
        def __dlpack__(self, stream: Any = None) -> Any:
            return record.take()

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    t = tb.from_dlpack(Legacy(), copy=True)
    assert t.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert t.data_ptr() != ctypes.addressof(_VALUES)
    del t
    gc.collect()
    assert record.deleter_calls == 1


@crafted.isolated
def test_keyword_rejection_not_retried_with_device_copy_request() -> None:
    """When ``copy`` was requested of device memory, which tensorbridge cannot copy, the
    keyword-rejecting producer is not retried without it: a TypeError names the keywords."""

    class Legacy:
        def __dlpack__(self, stream: Any = None) -> Any:
            raise AssertionError("not reached")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 0)

    with pytest.raises(TypeError, match="does not take the keywords"):
        tb.from_dlpack(Legacy(), copy=True)


@crafted.isolated
def test_dlpack_device_raises() -> None:
    """An exception from ``__dlpack_device__`` propagates, and no capsule is requested."""
    producer = _Producer(
        _raise(AssertionError("not reached")), device=_raise(RuntimeError("device lost"))
    )
    with pytest.raises(RuntimeError, match="device lost"):
        tb.from_dlpack(producer, device="cpu")


@pytest.mark.parametrize(
    "device",
    [
        None,
        "cpu",
        (1,),
        ("a", 0),
        (99, 0),
        5,
        [1, 0],
    ],
)
@crafted.isolated
def test_dlpack_device_returns_garbage(device: Any) -> None:
    """A ``__dlpack_device__`` answer that is not a device pair ends in a clean exception or is
    ignored; the capsule, if one was made, is still released exactly once."""
    record = _managed()
    producer = _Producer(lambda **kw: record.take(), device=device)
    try:
        t = tb.from_dlpack(producer)
    except (TypeError, ValueError, BufferError, RuntimeError):
        pass
    else:
        assert t.tolist() == [1.0, 2.0, 3.0, 4.0]
        del t
    del producer
    gc.collect()
    assert record.deleter_calls == (0 if record.capsule is not None else 1)


# --------------------------------------------------------------------------------------------------
# __dlpack__ returns garbage


@pytest.mark.parametrize(
    "garbage",
    [None, 7, b"dltensor", [1, 2], object(), tb.arange(3)],
    ids=["None", "int", "bytes", "list", "object", "tensor"],
)
@crafted.isolated
def test_producer_returns_non_capsule(garbage: Any) -> None:
    """A ``__dlpack__`` that returns something other than a capsule is a TypeError naming its
    type."""
    with pytest.raises(TypeError, match=type(garbage).__name__):
        tb.from_dlpack(_Producer(lambda **kw: garbage))


@pytest.mark.parametrize("name", [b"foo", b"", b"dltensor_versioned_x", None])
@crafted.isolated
def test_producer_returns_foreign_capsule(name: bytes | None) -> None:
    """A capsule of another kind (or without a name) is a TypeError naming it, and stays
    unconsumed."""
    capsule = _capi.PyCapsule_New(ctypes.addressof(_VALUES), name, None)
    with pytest.raises(TypeError, match="capsule named"):
        tb.from_dlpack(_returning(capsule))
    assert (_capi.PyCapsule_GetName(capsule) or None) == (
        None if name is None else _capi.PyCapsule_GetName(capsule)
    )


@pytest.mark.parametrize("versioned", [True, False])
@crafted.isolated
def test_capsule_over_a_null_struct(versioned: bool) -> None:
    """A DLPack capsule whose managed struct is all zeros (NULL data, shape, strides, deleter) is
    refused with a BufferError and left unconsumed."""
    struct = abi.DLManagedTensorVersioned() if versioned else abi.DLManagedTensor()
    if versioned:
        struct.version.major = 1
    name = abi.DLTENSOR_VERSIONED if versioned else abi.DLTENSOR
    capsule = _capi.PyCapsule_New(ctypes.addressof(struct), name, None)
    with pytest.raises(BufferError, match="from_dlpack"):
        tb.from_dlpack(capsule)
    assert testing.capsule_name(capsule) == name


@crafted.isolated
def test_null_deleter_is_never_called() -> None:
    """A managed tensor with a NULL deleter imports, and its death calls nothing (no crash)."""
    record = _managed(deleter=False)
    t = tb.from_dlpack(record.take())
    assert t[1:].tolist() == [2.0, 3.0, 4.0]
    del t
    gc.collect()
    assert record.deleter_calls == 0
    assert testing.stats()["stray"] == 0


@crafted.isolated
def test_same_capsule_twice() -> None:
    """A producer returning the same capsule on every call: the first import takes it, the second is
    PyTorch's "consumed only once" RuntimeError, and the deleter runs exactly once."""
    record = _managed()
    capsule = record.take()
    producer = _returning(capsule)
    first = tb.from_dlpack(producer)
    with pytest.raises(RuntimeError, match="DLTensor capsules can be consumed only once"):
        tb.from_dlpack(producer)
    assert first.tolist() == [1.0, 2.0, 3.0, 4.0]
    del first, producer, capsule
    gc.collect()
    assert record.deleter_calls == 1


@crafted.isolated
def test_capsule_consumed_by_another_consumer() -> None:
    """A capsule that NumPy already consumed is refused by tensorbridge, and vice versa."""
    np = pytest.importorskip("numpy")
    # NumPy reads and writes versioned capsules from 2.1, legacy ones before.
    versioned = np.lib.NumpyVersion(np.__version__) >= "2.1.0"
    capsule = tb.arange(3).__dlpack__(max_version=(1, 3) if versioned else None)
    np.from_dlpack(_returning(capsule))
    with pytest.raises(RuntimeError, match="consumed only once"):
        tb.from_dlpack(capsule)
    capsule = np.arange(3).__dlpack__(**({"max_version": (1, 0)} if versioned else {}))
    tb.from_dlpack(capsule)
    with pytest.raises((RuntimeError, ValueError, TypeError, BufferError)):
        np.from_dlpack(_returning(capsule))


# --------------------------------------------------------------------------------------------------
# Deleters that misbehave (in a child: an exception in a ctypes callback is reported as unraisable)

_RAISING_DELETER = """
import ctypes, gc, sys
import tensorbridge as tb
from tensorbridge import _capi, _dlpack_abi as abi
calls = []
@abi.DLPackDeleter
def deleter(address):
    calls.append(address)
    raise RuntimeError("deleter failed")
values = (ctypes.c_float * 2)(1, 2)
shape = (ctypes.c_int64 * 1)(2)
managed = abi.DLManagedTensorVersioned()
managed.version.major = 1
managed.dl_tensor.data = ctypes.addressof(values)
managed.dl_tensor.device.device_type = 1
managed.dl_tensor.ndim = 1
managed.dl_tensor.dtype.code, managed.dl_tensor.dtype.bits, managed.dl_tensor.dtype.lanes = 2, 32, 1
managed.dl_tensor.shape = shape
managed.deleter = deleter
t = tb.from_dlpack(_capi.PyCapsule_New(ctypes.addressof(managed), abi.DLTENSOR_VERSIONED, None))
assert t.tolist() == [1.0, 2.0]
del t
gc.collect()
assert len(calls) == 1, calls
u = tb.from_dlpack(tb.arange(3).__dlpack__(max_version=(1, 3)))  # still working
assert u.tolist() == [0, 1, 2]
print("ok")
"""


@crafted.isolated
def test_raising_deleter(subprocess_run: Any) -> None:
    """A producer deleter that raises is called once; its exception is reported as unraisable and
    tensorbridge keeps working."""
    proc = subprocess_run(_RAISING_DELETER)
    assert (proc.returncode, proc.stdout) == (0, "ok\n"), proc.stderr
    # One report of the exception (3.15 also prints the deleter's source line, which names it).
    assert proc.stderr.splitlines().count("RuntimeError: deleter failed") == 1, proc.stderr


_REENTRANT_DELETER = """
import ctypes, gc
import tensorbridge as tb
from tensorbridge import testing
held = [tb.arange(5), tb.from_dlpack(tb.arange(4).__dlpack__(max_version=(1, 3)))]
values = (ctypes.c_float * 2)(1, 2)
record = testing.CraftedDLPack((), data=ctypes.addressof(values), shape=(2,), strides=(1,), keep=values)
# The producer's memory is freed by a deleter that drops tensors, exports, imports and collects:
struct = record.managed
original = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(struct.deleter)  # a copy
@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def reentrant(address):
    held.clear()
    tb.from_dlpack(tb.to_dlpack(tb.arange(2)))
    gc.collect()
    original(address)
struct.deleter = ctypes.cast(reentrant, ctypes.c_void_p).value
t = tb.from_dlpack(record.take())
del t
gc.collect()
assert record.deleter_calls == 1 and held == [], (record.deleter_calls, held)
assert testing.stats() == {"made": 1, "deleted": 1, "stray": 0, "live": 0}, testing.stats()
print("ok")
"""


@crafted.isolated
def test_reentrant_deleter(subprocess_run: Any) -> None:
    """A deleter that re-enters tensorbridge (drops tensors, exports, imports, collects) runs
    once."""
    proc = subprocess_run(_REENTRANT_DELETER)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")


# --------------------------------------------------------------------------------------------------
# Allocation failures

_ALLOCATION = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # fail fast instead of swapping
import tensorbridge as tb
results = {}
cases = {
    "zeros(2**60)": lambda: tb.zeros(2**60),
    "zeros(2**62, float64)": lambda: tb.zeros(2**62, dtype=tb.float64),
    "empty(2**40)": lambda: tb.empty(2**40),
    "ones(2**31, 2**31)": lambda: tb.ones(2**31, 2**31),
    "full((2**40,), 1)": lambda: tb.full((2**40,), 1),
    "empty_like(broadcast)": lambda: tb.empty_like(tb.zeros(1).expand(2**40)),
    "contiguous(broadcast)": lambda: tb.zeros(1).expand(2**40).contiguous(),
    "clone(broadcast)": lambda: tb.zeros(1).expand(2**40).clone(),
    "tolist(broadcast)": lambda: tb.zeros(1).expand(2**40).tolist(),
    "to(float64)(broadcast)": lambda: tb.zeros(1).expand(2**40).to(tb.float64),
    "dlpack copy=True(broadcast)": lambda: tb.from_dlpack(tb.zeros(1).expand(2**40), copy=True),
}
for name, make in cases.items():
    try:
        make()
    except (MemoryError, ValueError) as exc:
        results[name] = type(exc).__name__ + (": " + str(exc) if str(exc) else "")
    except BaseException as exc:
        results[name] = "UNCLEAN " + type(exc).__name__ + ": " + str(exc)
    else:
        results[name] = "UNCLEAN: succeeded"
assert tb.zeros(10).tolist() == [0.0] * 10  # still healthy
for name, outcome in results.items():
    print(f"{name} -> {outcome}")
"""


_ALLOCATION_CASES = [
    "zeros(2**60)",
    "zeros(2**62, float64)",
    "empty(2**40)",
    "ones(2**31, 2**31)",
    "full((2**40,), 1)",
    "empty_like(broadcast)",
    "contiguous(broadcast)",
    "clone(broadcast)",
    "tolist(broadcast)",
    "to(float64)(broadcast)",
    "dlpack copy=True(broadcast)",
]


@pytest.fixture(scope="module")
def allocation_outcomes() -> dict[str, str]:
    """Each case of `_ALLOCATION`, run in one child with a 3 GiB address-space limit."""
    proc = subprocess.run(
        [sys.executable, "-c", _ALLOCATION],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert (proc.returncode, proc.stderr[-3000:]) == (0, "")
    return dict(line.split(" -> ", 1) for line in proc.stdout.splitlines())


@pytest.mark.parametrize("case", _ALLOCATION_CASES)
@crafted.isolated
def test_allocation_failures_are_clean(case: str, allocation_outcomes: dict[str, str]) -> None:
    """A request for more memory than exists raises MemoryError or ValueError with a message,
    leaves nothing half-built, and the process carries on (the child checks it still allocates
    afterwards); creation functions name the size they could not allocate."""
    outcome = allocation_outcomes[case]
    assert outcome.startswith(("MemoryError: ", "ValueError: ")), outcome
    if case.startswith(("zeros", "ones", "empty", "full")):
        assert "cannot allocate" in outcome and "bytes for a tensor of shape" in outcome, outcome


@crafted.isolated
def test_allocation_failure_after_consuming_a_capsule(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the copy made for ``copy=True`` fails after the capsule was consumed, the imported
    memory is still released exactly once and the error reaches the caller."""
    record = _managed()

    def fail(self: tb.Tensor) -> tb.Tensor:
        raise MemoryError("clone(): out of memory (injected)")

    monkeypatch.setattr(tb.Tensor, "clone", fail)
    with pytest.raises(MemoryError, match="injected"):
        tb.from_dlpack(_Producer(lambda **kw: record.take()), copy=True)
    gc.collect()
    assert record.deleter_calls == 1


@crafted.isolated
def test_allocation_failure_during_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """An export that fails while copying (negative strides) creates no capsule and holds
    nothing."""

    def fail(self: tb.Tensor) -> tb.Tensor:
        raise MemoryError("clone(): out of memory (injected)")

    before = len(_exports._MANAGED) + len(_exports._PENDING)
    monkeypatch.setattr(tb.Tensor, "clone", fail)
    t = tb.arange(6)[::-1]
    refs = sys.getrefcount(t)
    with pytest.raises(MemoryError, match="injected"):
        t.__dlpack__(max_version=(1, 3))
    assert len(_exports._MANAGED) + len(_exports._PENDING) == before
    assert sys.getrefcount(t) == refs
