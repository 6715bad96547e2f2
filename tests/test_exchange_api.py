"""The DLPack C exchange API (``__dlpack_c_exchange_api__``, PyTorch >= 2.10): the table's fast
path, and every fallback from it.

PyTorch's ``torch.Tensor`` advertises ``__dlpack_c_exchange_api__``; tensorbridge imports through its
``managed_tensor_from_py_object_no_sync`` and exports through ``managed_tensor_to_py_object_no_sync``.
Every test compares the fast path with the capsule path (``__dlpack__``), which the ``capsule_path``
fixture forces, or checks that the capsule path is taken. Tables of other shapes (another major
version, a ``prev_api`` chain, the DLPack 1.2 integer form, broken tables) are built with ctypes around
`CraftedDLPack` producers, whose deleter calls are counted.
"""

from __future__ import annotations

import ctypes
import gc
import warnings
from typing import Any, ClassVar

import pytest

import tensorbridge as tb
from tensorbridge import _cache, _capi, _dlpack, _dlpack_c, _dlpack_export, _exports

# -------------------------------------------------------------------------------------------------
# Helpers


def tensor_facts(t: tb.Tensor) -> tuple[Any, ...]:
    """Everything an import decides: pointer, layout, dtype, device, flags and the bytes."""
    return (
        t.data_ptr(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
        t.is_readonly,
        t._storage.is_copied,
        bytes(t._bytes("test")) if t.numel() else b"",
    )


def _forget(monkeypatch, table: str, lookup: str) -> None:
    """Give `_dlpack` an empty per-type or per-address table (and its bound lookup) for one test."""
    empty: dict = {} if table == "_DELETERS" else _cache.TypeTable()
    monkeypatch.setattr(_dlpack, table, empty)
    monkeypatch.setattr(_dlpack, lookup, empty.get)


@pytest.fixture
def capsule_path(monkeypatch):
    """Make from_dlpack forget every exchange API: each producer goes through ``__dlpack__``."""
    _forget(monkeypatch, "_PRODUCERS", "_producer_of")
    monkeypatch.setattr(_dlpack_c, "_EXCHANGE_APIS", _cache.TypeTable())
    monkeypatch.setattr(_dlpack_c, "exchange_api", lambda cls: None)


@pytest.fixture
def fresh_producers(monkeypatch):
    """An empty per-type cache, so that each test looks its types up again."""
    _forget(monkeypatch, "_PRODUCERS", "_producer_of")
    monkeypatch.setattr(_dlpack_c, "_EXCHANGE_APIS", _cache.TypeTable())


class _Header(ctypes.Structure):
    _fields_ = (
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("prev_api", ctypes.c_void_p),
    )


class _Table(ctypes.Structure):
    _fields_ = (
        ("header", _Header),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    )


_API_NAME = b"dlpack_exchange_api"  # a capsule keeps a pointer to its name: module-level bytes
_FromPy = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))
_ToPy = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
_Unused = ctypes.CFUNCTYPE(ctypes.c_int)


@_FromPy
def _crafted_from_py(obj, out):
    """Hands over the managed tensor of ``obj.inner`` (a CraftedDLPack), or fails with -1."""
    obj.exchange_calls += 1
    if obj.inner is None:
        return -1
    out[0] = obj.inner.address
    return 0


@_ToPy
def _never_to_py(tensor, out):
    return -1


@_Unused
def _unused():
    return -1


def _function(fn: Any) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def _table(
    major: int = 1,
    prev: int | None = None,
    *,
    from_py: Any = _crafted_from_py,
    to_py: Any = _never_to_py,
) -> _Table:
    table = _Table()
    table.header.major, table.header.minor, table.header.prev_api = major, 3, prev
    table.managed_tensor_allocator = table.dltensor_from_py_object_no_sync = _function(_unused)
    table.current_work_stream = _function(_unused)
    table.managed_tensor_from_py_object_no_sync = from_py and _function(from_py)
    table.managed_tensor_to_py_object_no_sync = to_py and _function(to_py)
    return table


class _ExchangeProducer:
    """Instances hand over ``inner`` through the exchange API, and ``fallback`` through __dlpack__."""

    tables: ClassVar[list] = []  # the tables and capsules every made type points into, kept alive

    def __init__(self, inner, fallback=None):
        self.inner = inner
        self.fallback = fallback
        self.exchange_calls = 0
        self.dlpack_calls = 0

    def __dlpack__(self, **kwargs):
        self.dlpack_calls += 1
        return self.fallback.take()

    def __dlpack_device__(self):
        return self.fallback.__dlpack_device__()


def handed(crafted, *args, **kwargs):
    """A crafted managed tensor to hand over through a table: its capsule has no destructor, so
    only the importer may call the deleter (the capsule is never consumed)."""
    return crafted(*args, destructor=False, **kwargs)


def producer_type(
    table: _Table | None = None, *, advertised: Any = None, attribute: str = ""
) -> type:
    """A new `_ExchangeProducer` type advertising ``table`` (a capsule), or ``advertised`` as is."""
    if advertised is None:
        advertised = _capi.PyCapsule_New(ctypes.addressof(table), _API_NAME, None)
    _ExchangeProducer.tables.append((table, advertised))
    name = attribute or "__dlpack_c_exchange_api__"
    return type("Producer", (_ExchangeProducer,), {name: advertised})


# -------------------------------------------------------------------------------------------------
# The table: where it is looked up, and which tables are used


def test_exchange_api_is_read_from_the_advertising_type_only(fresh_producers):
    """The type that defines the attribute gets the API; a subclass (maybe another __dlpack__) not."""
    cls = producer_type(_table())
    assert _dlpack_c.exchange_api(cls) is not None
    assert _dlpack_c.exchange_api(type("Sub", (cls,), {})) is None
    assert _dlpack_c.exchange_api(_ExchangeProducer) is None


def test_exchange_api_lookup_is_cached_per_type(fresh_producers, monkeypatch, crafted):
    """The table is read once per type, including "no table" for types without one."""
    looked_up = []
    real = _dlpack_c.exchange_api
    monkeypatch.setattr(_dlpack_c, "exchange_api", lambda cls: looked_up.append(cls) or real(cls))
    cls = producer_type(_table())
    for _ in range(3):
        tb.from_dlpack(cls(handed(crafted)))
        tb.from_dlpack(crafted())
    assert looked_up == [cls, crafted]


@pytest.mark.parametrize(
    "case",
    [
        "major 2 without prev_api",
        "NULL from_py",
        "NULL to_py",
        "wrong capsule name",
        "not a capsule",
    ],
)
def test_unusable_tables_are_ignored(fresh_producers, crafted, case):
    """A table that cannot be used means the __dlpack__ path, never a crash or a half import."""
    if case == "wrong capsule name":
        cls = producer_type(
            advertised=_capi.PyCapsule_New(ctypes.addressof(_table()), b"other", None)
        )
    elif case == "not a capsule":
        cls = producer_type(advertised="dlpack_exchange_api")
    else:
        table = {
            "major 2 without prev_api": lambda: _table(major=2),
            "NULL from_py": lambda: _table(from_py=None),
            "NULL to_py": lambda: _table(to_py=None),
        }[case]()
        cls = producer_type(table)
    assert _dlpack_c.exchange_api(cls) is None
    inner, fallback = handed(crafted), crafted((5.0, 6.0))
    obj = cls(inner, fallback)
    assert tb.from_dlpack(obj).tolist() == [5.0, 6.0]
    assert (obj.exchange_calls, obj.dlpack_calls) == (0, 1)


def test_a_newer_major_is_followed_down_prev_api(fresh_producers, crafted):
    """A major-2 table whose prev_api is a major-1 table: the major-1 functions are used."""
    old = _table(major=1)
    cls = producer_type(_table(major=2, prev=ctypes.addressof(old), from_py=_unused))
    _ExchangeProducer.tables.append((old, None))
    obj = cls(handed(crafted, (7.0,)))
    assert tb.from_dlpack(obj).tolist() == [7.0]
    assert (obj.exchange_calls, obj.dlpack_calls) == (1, 0)


def test_dlpack_1_2_integer_form_is_accepted(fresh_producers, crafted):
    """``__c_dlpack_exchange_api__`` holding the table's address (DLPack 1.2) works as the capsule does."""
    table = _table()
    cls = producer_type(advertised=ctypes.addressof(table), attribute="__c_dlpack_exchange_api__")
    _ExchangeProducer.tables.append((table, None))
    obj = cls(handed(crafted, (1.0, 2.0)))
    assert tb.from_dlpack(obj).tolist() == [1.0, 2.0]
    assert obj.exchange_calls == 1


# -------------------------------------------------------------------------------------------------
# Ownership of what the table hands over


def test_exchange_import_owns_the_managed_tensor(fresh_producers, crafted):
    """No __dlpack__, no capsule; the deleter runs exactly once, after the last view."""
    inner = handed(crafted, (1.0, 2.0, 3.0))
    obj = producer_type(_table())(inner)
    t = tb.from_dlpack(obj)
    assert (obj.exchange_calls, obj.dlpack_calls) == (1, 0)
    assert t.data_ptr() == ctypes.addressof(inner.buffer) and t.tolist() == [1.0, 2.0, 3.0]
    views = [t[1:], t.view(3, 1)]
    del t
    gc.collect()
    assert inner.deleter_calls == 0
    del views
    gc.collect()
    assert inner.deleter_calls == 1


@pytest.mark.parametrize(
    ("flags", "readonly", "copied"), [(0, False, False), (1, True, False), (2, False, True)]
)
def test_exchange_import_honours_the_flags(fresh_producers, crafted, flags, readonly, copied):
    """READ_ONLY and IS_COPIED mean what they mean in a capsule."""
    t = tb.from_dlpack(producer_type(_table())(handed(crafted, flags=flags)))
    assert (t.is_readonly, t._storage.is_copied) == (readonly, copied)


def test_exchange_import_failure_releases_exactly_once(fresh_producers, crafted):
    """An invalid tensor from the table is a BufferError, and its deleter runs at once."""
    inner = handed(crafted, dtype=(2, 24, 1))
    with pytest.raises(BufferError, match="unsupported DLPack dtype"):
        tb.from_dlpack(producer_type(_table())(inner))
    assert inner.deleter_calls == 1


def test_exchange_import_refusal_falls_back_to_dlpack(fresh_producers, crafted):
    """A non-zero return (nothing handed over) sends the import through __dlpack__."""
    obj = producer_type(_table())(None, crafted((4.0,)))
    assert tb.from_dlpack(obj).tolist() == [4.0]
    assert (obj.exchange_calls, obj.dlpack_calls) == (1, 1)


def test_device_memory_from_the_table_is_given_back(fresh_producers, crafted):
    """*_no_sync orders nothing on a stream: CUDA memory is released and asked for with a stream."""
    inner = handed(crafted, device=(2, 0), data=0x10000)
    fallback = crafted(device=(2, 0), data=0x20000)
    obj = producer_type(_table())(inner, fallback)
    t = tb.from_dlpack(obj)
    assert inner.deleter_calls == 1
    assert (obj.exchange_calls, obj.dlpack_calls) == (1, 1)
    assert t.device == tb.device("cuda:0") and t.data_ptr() == 0x20000


def test_another_major_from_the_table_is_refused_and_leaked(fresh_producers, crafted):
    """A managed tensor of another major version: BufferError; its deleter cannot be found safely."""
    inner = handed(crafted, version=(2, 0))
    with pytest.raises(BufferError, match="major version 1 only"):
        tb.from_dlpack(producer_type(_table())(inner))
    assert inner.deleter_calls == 0


def test_null_deleter_from_the_table(fresh_producers, crafted):
    """A NULL deleter imports, and nothing is called when the views die."""
    inner = handed(crafted, deleter=False)
    t = tb.from_dlpack(producer_type(_table())(inner))
    del t
    gc.collect()
    assert inner.deleter_calls == 0


# -------------------------------------------------------------------------------------------------
# PyTorch

torch_dtype_names = [
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
    "bfloat16",
    "float32",
    "float64",
    "complex32",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "uint1",
    "int4",
]


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _torch_sample(torch, name: str, shape: tuple[int, ...] = (4, 6)):
    """Distinct raw bytes viewed as ``name`` (no factory: some dtypes have none, complex32 warns)."""
    dtype = getattr(torch, name)
    itemsize = max(dtype.itemsize, 1)
    n = 1
    for size in shape:
        n *= size
    raw = torch.arange(n * itemsize, dtype=torch.uint8) % (2 if name == "bool" else 251)
    return raw.view(dtype).reshape(shape) if itemsize else raw.reshape(shape)


def _torch_layouts(torch, x):
    return {
        "contiguous": x,
        "transposed": x.t(),
        "sliced": x[1:, ::2],
        "row": x[2],
        "zero_d": x[1, 1],
        "empty": x[:0],
        "expanded": x[:1].expand(3, -1),
        "offset": x[1:3, 2:5],
    }


def _outcome(fn):
    try:
        return tensor_facts(fn())
    except Exception as exc:  # both paths must refuse alike
        return type(exc), str(exc)


@pytest.mark.parametrize("name", torch_dtype_names)
def test_torch_fast_path_equals_the_capsule_path(torch, monkeypatch, name):
    """Every torch dtype and layout imports (or is refused) exactly as through __dlpack__."""
    x = _torch_sample(torch, name)
    cases = _torch_layouts(torch, x)
    fast = {k: _outcome(lambda v=v: tb.from_dlpack(v)) for k, v in cases.items()}
    _forget(monkeypatch, "_PRODUCERS", "_producer_of")
    monkeypatch.setattr(_dlpack_c, "_EXCHANGE_APIS", _cache.TypeTable())
    monkeypatch.setattr(_dlpack_c, "exchange_api", lambda cls: None)
    slow = {k: _outcome(lambda v=v: tb.from_dlpack(v)) for k, v in cases.items()}
    assert fast == slow


def test_torch_fast_path_is_taken(torch, fresh_producers, monkeypatch):
    """A plain CPU torch tensor goes through the table: one exchange call, no __dlpack__ call."""
    calls = {"exchange": 0, "dlpack": 0}
    tb.from_dlpack(torch.zeros(1))  # looks the table up
    exchange = _dlpack._PRODUCERS[_cache.type_key(torch.Tensor)].exchange
    real_from_py, real_dlpack = exchange.from_py, torch.Tensor.__dlpack__

    def counted_from_py(*args):
        calls["exchange"] += 1
        return real_from_py(*args)

    def counted_dlpack(self, *args, **kwargs):
        calls["dlpack"] += 1
        return real_dlpack(self, *args, **kwargs)

    monkeypatch.setattr(exchange, "from_py", counted_from_py)
    monkeypatch.setattr(torch.Tensor, "__dlpack__", counted_dlpack)
    x = torch.arange(6.0).reshape(2, 3)
    t = tb.from_dlpack(x)
    assert calls == {"exchange": 1, "dlpack": 0}
    assert t.data_ptr() == x.data_ptr() and t.stride() == (3, 1)
    t[0, 0] = 9
    assert x[0, 0].item() == 9


def test_torch_deleter_runs_exactly_once(torch, fresh_producers, monkeypatch):
    """The storage calls torch's deleter once, after the last view, and never before."""
    calls = []
    real = _dlpack._deleter_function
    _forget(monkeypatch, "_DELETERS", "_deleter_of")

    def counting(address):
        fn = real(address)
        return lambda managed: calls.append(managed) or fn(managed)

    monkeypatch.setattr(_dlpack, "_deleter_function", counting)
    x = torch.arange(8.0)
    t = tb.from_dlpack(x)
    view = t[2:]
    del t
    gc.collect()
    assert calls == []
    del view
    gc.collect()
    assert len(calls) == 1
    assert x.tolist() == list(range(8))


@pytest.mark.parametrize(
    "case", ["requires_grad", "non-leaf", "conj", "sparse", "sparse_csr", "meta"]
)
def test_torch_refusals_are_the_capsule_paths(torch, monkeypatch, case):
    """What the __dlpack__ path refuses is refused with the same exception and text."""
    make = {
        "requires_grad": lambda: torch.ones(3, requires_grad=True),
        "non-leaf": lambda: torch.ones(3, requires_grad=True) * 2,
        "conj": lambda: torch.tensor([1 + 2j]).conj(),
        "sparse": lambda: torch.eye(3).to_sparse(),
        "sparse_csr": lambda: torch.eye(3).to_sparse_csr(),
        "meta": lambda: torch.zeros(3, device="meta"),
    }[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Sparse CSR tensor support is in beta"
        x, y = make(), make()
    fast = _outcome(lambda: tb.from_dlpack(x))
    _forget(monkeypatch, "_PRODUCERS", "_producer_of")
    monkeypatch.setattr(_dlpack_c, "_EXCHANGE_APIS", _cache.TypeTable())
    monkeypatch.setattr(_dlpack_c, "exchange_api", lambda cls: None)
    slow = _outcome(lambda: tb.from_dlpack(y))
    assert fast == slow
    assert isinstance(fast[0], type) and issubclass(fast[0], Exception)
    if case in ("requires_grad", "non-leaf", "conj"):
        assert fast[0] is BufferError


def test_torch_negative_bit_is_resolved_either_way(torch, monkeypatch):
    """A negative-bit view keeps its sign through either path (PyTorch exports it without)."""
    x = torch.tensor([1 + 2j, 3 - 4j]).conj().imag
    assert x.is_neg()
    fast = tb.from_dlpack(x).tolist()
    _forget(monkeypatch, "_PRODUCERS", "_producer_of")
    monkeypatch.setattr(_dlpack_c, "_EXCHANGE_APIS", _cache.TypeTable())
    monkeypatch.setattr(_dlpack_c, "exchange_api", lambda cls: None)
    assert fast == tb.from_dlpack(x).tolist() == [-2.0, 4.0]


def test_torch_negative_bit_skips_the_table(torch, fresh_producers, monkeypatch):
    """A negative-bit view is resolved on the __dlpack__ path; the table is not called."""
    tb.from_dlpack(torch.zeros(1))
    exchange = _dlpack._PRODUCERS[_cache.type_key(torch.Tensor)].exchange
    monkeypatch.setattr(exchange, "from_py", lambda *args: pytest.fail("exchange called"))
    x = torch.tensor([1 + 2j, 3 - 4j]).conj().imag
    assert tb.from_dlpack(x).tolist() == [-2.0, 4.0]


def test_torch_subclass_takes_the_dlpack_path(torch, fresh_producers):
    """A torch.Tensor subclass may override __dlpack__: it is called, and the table is not used."""

    class Tracked(torch.Tensor):
        calls = 0

        def __dlpack__(self, *args, **kwargs):
            Tracked.calls += 1
            return super().__dlpack__(*args, **kwargs)

    x = torch.arange(3.0).as_subclass(Tracked)
    assert tb.from_dlpack(x).tolist() == [0.0, 1.0, 2.0]
    assert Tracked.calls == 1
    assert _dlpack._PRODUCERS[id(Tracked)].exchange is None


def test_torch_export_through_the_table(torch, fresh_producers, monkeypatch):
    """t.torch() hands a managed tensor to torch's table: shared memory, released when torch is done."""
    calls = []
    tb.from_dlpack(torch.zeros(1))
    exchange = _dlpack._PRODUCERS[_cache.type_key(torch.Tensor)].exchange
    real = exchange.to_py
    monkeypatch.setattr(exchange, "to_py", lambda *args: calls.append(args) or real(*args))
    t = tb.arange(6, dtype=tb.float32).reshape(2, 3)
    x = t.torch()
    assert len(calls) == 1
    assert x.data_ptr() == t.data_ptr() and x.stride() == (3, 1) and x.dtype == torch.float32
    address = calls[0][0]
    assert address in _exports._MANAGED and address not in _exports._PENDING
    x[1, 1] = -1
    assert t[1, 1].item() == -1
    del t
    gc.collect()
    assert x.sum().item() == 10
    del x
    gc.collect()
    assert address not in _exports._MANAGED


def test_torch_export_keeps_requires_grad_and_refusals(torch):
    """requires_grad is carried over; read-only and negative strides are still refused."""
    t = tb.arange(3, dtype=tb.float32).requires_grad_(True)
    assert t.torch().requires_grad
    assert t.requires_grad
    with pytest.raises(BufferError, match="negative strides"):
        tb.arange(3, dtype=tb.float32)[::-1].torch()
    readonly = tb.frombuffer(b"\x00" * 8, dtype=tb.float32)
    with pytest.raises(BufferError, match="read-only"):
        readonly.torch()


def test_exchange_export_without_a_table_returns_none(crafted):
    """A class without the API, or device memory, gets None: the caller uses from_dlpack."""
    t = tb.arange(3)
    assert _dlpack_export.exchange_export(t, _ExchangeProducer) is None
    torch = pytest.importorskip("torch")
    cuda = tb.from_dlpack(crafted(device=(2, 0), data=0x10000).capsule)
    assert _dlpack_export.exchange_export(cuda, torch.Tensor) is None
    assert not _exports._MANAGED or all(
        entry[1] is not cuda for entry in _exports._MANAGED.values()
    )
