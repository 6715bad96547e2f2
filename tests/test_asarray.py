"""asarray: the dispatch table, the order of preference, copy/dtype/device/requires_grad, buffer formats.

The dispatch-table test has one case per kind of input and asserts the path `asarray` took (through
``_dispatch_path``, the function asarray itself uses) as well as the result.
"""

from __future__ import annotations

import array
import ctypes
import gc
import re
import struct
import weakref
from typing import Any, ClassVar

import pytest

import tensorbridge as tb
from tensorbridge import _cuda
from tensorbridge._convert import _dispatch_path, is_protocol_object

np = pytest.importorskip("numpy")

# NumPy's __dlpack__ takes max_version from 2.1.
NUMPY_DLPACK_1 = np.lib.NumpyVersion(np.__version__) >= "2.1.0"


def _arrow_stream_or_skip() -> Any:
    """pyarrow, when its ChunkedArray has ``__arrow_c_stream__`` (pyarrow 16+)."""
    pa = pytest.importorskip("pyarrow")
    if not hasattr(pa.ChunkedArray, "__arrow_c_stream__"):
        pytest.skip(f"pyarrow {pa.__version__} has no ChunkedArray.__arrow_c_stream__")
    return pa


FAKE_CUDA_PTR = 0x7F00_0000_0000


class DLPackOnly:
    """Exposes an array through __dlpack__/__dlpack_device__ only."""

    def __init__(self, arr: Any):
        self.arr = arr

    @property
    def __dlpack__(self) -> Any:
        # The array's own method, signature included (NumPy before 2.1 takes no max_version).
        return self.arr.__dlpack__

    def __dlpack_device__(self) -> Any:
        return self.arr.__dlpack_device__()


class InterfaceOnly:
    """Exposes an array through __array_interface__ only (and keeps the array alive)."""

    def __init__(self, arr: Any):
        self.arr = arr
        self.__array_interface__ = arr.__array_interface__


class CudaOnly:
    """A fake CUDA producer: metadata for memory the host must never read."""

    __cuda_array_interface__: ClassVar = {
        "data": (FAKE_CUDA_PTR, False),
        "shape": (4,),
        "typestr": "<f4",
        "version": 3,
    }


@pytest.fixture
def no_driver(monkeypatch):
    """Pretend no CUDA driver is installed (fake pointers must never reach a real driver)."""
    monkeypatch.setattr(_cuda, "driver", lambda: None)


# ---------------------------------------------------------------------------------------------- dispatch table
def _case_tensor():
    src = tb.arange(3)
    return src, "tensor", lambda t: t is src


def _case_dlpack():
    a = np.arange(3, dtype=np.int16)
    return DLPackOnly(a), "dlpack", lambda t: t.data_ptr() == a.ctypes.data and t.dtype is tb.int16


def _case_capsule():
    a = np.arange(3.0)
    return (
        a.__dlpack__(**({"max_version": (1, 0)} if NUMPY_DLPACK_1 else {})),
        "dlpack_capsule",
        lambda t: t.data_ptr() == a.ctypes.data,
    )


def _case_cuda_array_interface():
    return (
        CudaOnly(),
        "cuda_array_interface",
        lambda t: (
            t.data_ptr() == FAKE_CUDA_PTR
            and t.device == tb.device("cuda:0")
            and t.dtype is tb.float32
        ),
    )


def _case_array_interface():
    a = np.arange(4, dtype=np.uint32).reshape(2, 2)
    return (
        InterfaceOnly(a),
        "array_interface",
        lambda t: (
            t.data_ptr() == a.ctypes.data and t.dtype is tb.uint32 and t.tolist() == a.tolist()
        ),
    )


def _case_array_i():
    return (
        array.array("i", [1, 2, 3]),
        "buffer",
        lambda t: t.dtype is tb.int32 and t.tolist() == [1, 2, 3],
    )


def _case_bytes():
    return (
        b"\x01\x02",
        "buffer",
        lambda t: t.dtype is tb.uint8 and t.tolist() == [1, 2] and t.is_readonly,
    )


def _case_memoryview_d():
    mv = memoryview(struct.pack("=2d", 1.5, -2.0)).cast("d")
    return mv, "buffer", lambda t: t.dtype is tb.float64 and t.tolist() == [1.5, -2.0]


def _case_arrow():
    pa = pytest.importorskip("pyarrow")
    arr = pa.array([7, 8], type=pa.int8())
    return arr, "arrow", lambda t: t.dtype is tb.int8 and t.tolist() == [7, 8] and t.is_readonly


def _case_arrow_stream():
    pa = _arrow_stream_or_skip()
    return pa.chunked_array([[1.0, 2.0]]), "arrow_stream", lambda t: t.tolist() == [1.0, 2.0]


def _case_sequence():
    return (
        [[1, 2], [3, 4]],
        "sequence",
        lambda t: t.dtype is tb.int64 and t.tolist() == [[1, 2], [3, 4]],
    )


def _case_scalar():
    return 2.5, "scalar", lambda t: t.dtype is tb.float32 and t.ndim == 0 and t.item() == 2.5


DISPATCH_CASES = {
    "tensor": _case_tensor,
    "dlpack": _case_dlpack,
    "capsule": _case_capsule,
    "cuda_array_interface": _case_cuda_array_interface,
    "array_interface": _case_array_interface,
    "buffer_array_i": _case_array_i,
    "buffer_bytes": _case_bytes,
    "buffer_memoryview_d": _case_memoryview_d,
    "arrow": _case_arrow,
    "arrow_stream": _case_arrow_stream,
    "sequence": _case_sequence,
    "scalar": _case_scalar,
}


@pytest.mark.parametrize("case", list(DISPATCH_CASES))
def test_dispatch_table(case, no_driver):
    """Each kind of input takes its own path, and the result is what that protocol describes."""
    obj, path, check = DISPATCH_CASES[case]()
    assert _dispatch_path(obj) == path
    assert check(tb.asarray(obj))


def test_dispatch_big_endian_memoryview_is_refused():
    """A '>i4' buffer takes the buffer path and is refused: tensors are native-endian."""
    mv = memoryview((ctypes.c_int32.__ctype_be__ * 2)(1, 2))
    assert mv.format == ">i"
    assert _dispatch_path(mv) == "buffer"
    with pytest.raises(BufferError, match="non-native byte order"):
        tb.asarray(mv)


def test_dispatch_never_reads_cuda_memory(subprocess_run):
    """The fake CUDA producer's pointer is carried as metadata only: nothing dereferences it."""
    proc = subprocess_run(f"""
        import tensorbridge as tb
        from tensorbridge import _cuda
        _cuda.driver = lambda: None
        class CudaOnly:
            __cuda_array_interface__ = {{"data": ({FAKE_CUDA_PTR}, False), "shape": (4,),
                                         "typestr": "<f4", "version": 3}}
        t = tb.asarray(CudaOnly())
        print(t.data_ptr() == {FAKE_CUDA_PTR}, t.device, tuple(t.shape))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True cuda:0 (4,)"


# ---------------------------------------------------------------------------------------------- preference order
def _protocols() -> list[tuple[str, dict[str, Any]]]:
    """Each protocol as class attributes whose data is the single value that names it."""
    pa = _arrow_stream_or_skip()
    keep = {
        name: np.array([value], dtype=np.int32)
        for value, name in enumerate(
            ["arrow", "arrow_stream", "dlpack", "cuda_array_interface", "array_interface"], start=1
        )
    }
    cai = {**keep["array_interface"].__array_interface__, "data": (FAKE_CUDA_PTR, False)}
    return [
        (
            "arrow",
            {"__arrow_c_array__": lambda self, s=None: pa.array(keep["arrow"]).__arrow_c_array__()},
        ),
        (
            "arrow_stream",
            {
                "__arrow_c_stream__": lambda self, s=None: pa.chunked_array(
                    [keep["arrow_stream"]]
                ).__arrow_c_stream__()
            },
        ),
        (
            "dlpack",
            {
                "__dlpack__": property(lambda self: keep["dlpack"].__dlpack__),
                "__dlpack_device__": lambda self: keep["dlpack"].__dlpack_device__(),
            },
        ),
        ("cuda_array_interface", {"__cuda_array_interface__": cai}),
        (
            "array_interface",
            {"__array_interface__": keep["array_interface"].__array_interface__, "keep": keep},
        ),
    ]


def test_preference_order(no_driver):
    """An object with several protocols takes the first in the documented order; dropping it, the next."""
    protocols = _protocols()
    for start, (expected, _) in enumerate(protocols):
        attrs: dict[str, Any] = {}
        for _, more in protocols[start:]:
            attrs.update(more)
        cls = type("Multi", (bytearray,), attrs)  # a buffer exporter too: the last resort
        obj = cls(struct.pack("=i", 99))
        assert _dispatch_path(obj) == expected
        t = tb.asarray(obj)
        if expected == "cuda_array_interface":
            assert t.data_ptr() == FAKE_CUDA_PTR
        else:
            assert t.tolist() == [start + 1]
    assert _dispatch_path(bytearray(4)) == "buffer"


def test_tensor_and_capsule_come_first():
    """Tensors and capsules are recognised by type before any attribute is looked at."""
    assert _dispatch_path(tb.zeros(2)) == "tensor"
    assert _dispatch_path(tb.to_dlpack(tb.zeros(2))) == "dlpack_capsule"


# ---------------------------------------------------------------------------------------------- per-type decisions
class _Slotted:
    """Instances without a ``__dict__``: the type alone says which protocol they speak."""

    __slots__ = ("_a",)

    def __init__(self, a):
        self._a = a

    @property
    def __array_interface__(self):
        return self._a.__array_interface__


class _Plain:
    """Instances with a ``__dict__``: one may carry an interface another lacks."""


def test_a_type_is_probed_once_and_answers_the_same():
    """A remembered type takes the path its first instance took, for every later instance."""
    from tensorbridge import _convert

    for _ in range(3):
        a = np.arange(3, dtype=np.int16)
        assert _convert._dispatch(a)[0] == "ndarray"
        t = tb.asarray(a)
        assert t.data_ptr() == a.ctypes.data and t.tolist() == [0, 1, 2]
    assert _convert._PATHS_BY_TYPE[np.ndarray] == ("ndarray", None)  # a static type: its own key
    b = np.arange(4, dtype=np.uint8)
    for obj in (_Slotted(b), _Slotted(b)):
        t = tb.asarray(obj)
        assert t.data_ptr() == b.ctypes.data and t.tolist() == [0, 1, 2, 3]
    assert _convert._PATHS_BY_TYPE[id(_Slotted)] == ("array_interface", "__array_interface__")


def test_instance_attributes_are_followed_per_object():
    """An interface set on one instance is used for it alone: instances with a ``__dict__`` that
    took an attribute path are probed each time, never answered from their type."""
    from tensorbridge import _convert

    a = np.arange(3, dtype=np.int32)
    with_interface = _Plain()
    with_interface.__array_interface__ = a.__array_interface__
    without = _Plain()
    for _ in range(2):
        assert _dispatch_path(with_interface) == "array_interface"
        assert tb.asarray(with_interface).tolist() == [0, 1, 2]
        assert _dispatch_path(without) == "sequence"
    assert id(_Plain) not in _convert._PATHS_BY_TYPE


def test_a_property_that_declines_is_asked_again():
    """A class-level protocol property that returns None for some instances is read per object."""
    b = np.arange(2, dtype=np.uint8)

    class Sometimes:
        __slots__ = ("_a",)

        def __init__(self, a):
            self._a = a

        @property
        def __array_interface__(self):
            return None if self._a is None else self._a.__array_interface__

    assert _dispatch_path(Sometimes(None)) == "sequence"
    assert _dispatch_path(Sometimes(b)) == "array_interface"
    assert tb.asarray(Sometimes(b)).tolist() == [0, 1]
    assert _dispatch_path(Sometimes(None)) == "sequence"


def test_c_types_with_the_standard_lookup_are_probed_once():
    """C types that set the standard attribute lookup themselves (array.array, mmap) are decided
    once per type, as Python classes are; a type with its own ``__getattribute__`` is not."""
    import array
    import mmap

    from tensorbridge import _cache, _capi, _convert

    assert _capi.has_generic_getattr(array.array) and _capi.has_generic_getattr(mmap.mmap)
    assert array.array.__getattribute__ is not object.__getattribute__  # a wrapper of its own
    for values in ([1.5, 2.5], [3.5]):
        t = tb.asarray(array.array("d", values))
        assert t.tolist() == values and t.dtype is tb.float64
    assert _convert._PATHS_BY_TYPE[_cache.type_key(array.array)] == ("buffer", None)

    class Computed:
        __slots__ = ()

        def __getattribute__(self, name):
            return object.__getattribute__(self, name)

    assert not _capi.has_generic_getattr(Computed)
    assert not _capi.has_generic_getattr(type)


def test_proxies_with_getattr_are_probed_per_object():
    """A type that computes attributes (``__getattr__``) may answer differently per instance."""

    class Proxy:
        __slots__ = ("_target",)

        def __init__(self, target):
            self._target = target

        def __getattr__(self, name):
            return getattr(self._target, name)

    a = np.arange(3, dtype=np.float32)
    assert _dispatch_path(Proxy(a)) == "dlpack"
    assert tb.asarray(Proxy(a)).data_ptr() == a.ctypes.data
    assert _dispatch_path(Proxy([1, 2])) == "sequence"


def test_the_per_type_table_is_bounded():
    """Types made on the fly do not grow the table without end."""
    from tensorbridge import _cache, _convert

    for i in range(3 * _cache.REMEMBER_MAX):
        cls = type(f"Made{i}", (), {"__slots__": (), "__len__": lambda self: 0})
        assert _dispatch_path(cls()) == "sequence"
        table = _convert._PATHS_BY_TYPE
        assert len(table) <= _cache.REMEMBER_MAX + len(table.seeds)  # learnt + seeded
    assert _dispatch_path([1]) == "sequence" and _dispatch_path(b"x") == "buffer"


def test_is_protocol_object():
    """True exactly for inputs asarray reads through a protocol."""
    assert is_protocol_object(np.arange(2))
    assert is_protocol_object(b"ab")
    assert is_protocol_object(InterfaceOnly(np.arange(2)))
    assert not is_protocol_object([1, 2])
    assert not is_protocol_object(3)
    assert not is_protocol_object(x for x in range(2))


# ---------------------------------------------------------------------------------------------- copy / dtype / device
def test_tensor_is_aliased_and_copied_on_request():
    """A tensor comes back as itself; copy=True gives new memory with the same values."""
    t = tb.arange(4)
    assert tb.asarray(t) is t
    c = tb.asarray(t, copy=True)
    assert c.data_ptr() != t.data_ptr()
    assert c.tolist() == t.tolist()


def test_alias_errors_keep_torch_texts():
    """copy=False with a dtype change or a sequence gives PyTorch's messages."""
    with pytest.raises(ValueError, match="can't alias tensor with dtype 'Long' into dtype 'Float'"):
        tb.asarray(tb.arange(3), dtype=tb.float32, copy=False)
    with pytest.raises(ValueError, match=r"can't alias arbitrary sequence into a tensor\."):
        tb.asarray([1, 2], copy=False)
    with pytest.raises(ValueError, match=r"can't alias arbitrary sequence into a tensor\."):
        tb.asarray(3, copy=False)


def test_dtype_on_every_sharing_path_copies():
    """dtype= different from the source converts (copy=None) and keeps values."""
    a = np.arange(3, dtype=np.int32)
    for obj in (a, InterfaceOnly(a), memoryview(a), tb.asarray(a)):
        t = tb.asarray(obj, dtype=tb.float64)
        assert t.dtype is tb.float64
        assert t.tolist() == [0.0, 1.0, 2.0]
        assert t.data_ptr() != a.ctypes.data


def test_same_dtype_with_copy_false_shares():
    """dtype= equal to the source's is no conversion: copy=False still shares."""
    a = np.arange(3, dtype=np.int32)
    assert tb.asarray(a, dtype=tb.int32, copy=False).data_ptr() == a.ctypes.data


def test_copy_true_on_every_sharing_path():
    """copy=True gives private memory with equal values, whatever the path."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for obj in (a, DLPackOnly(a), InterfaceOnly(a), memoryview(a)):
        t = tb.asarray(obj, copy=True)
        assert t.data_ptr() != a.ctypes.data
        assert t.tolist() == a.tolist()


def test_copy_must_be_bool_or_none():
    """copy='yes' is a TypeError."""
    with pytest.raises(TypeError, match="copy must be None, True or False"):
        tb.asarray([1], copy="yes")


def test_device_alias_and_move():
    """Same device: shared. Another device with copy=False: torch's alias error; else tb cannot move it."""
    t = tb.arange(3)
    assert tb.asarray(t, device="cpu") is t
    with pytest.raises(ValueError, match="can't alias tensor from device 'cpu' to 'cuda'"):
        tb.asarray(t, device="cuda", copy=False)
    with pytest.raises(BufferError, match="cannot move"):
        tb.asarray(t, device="cuda")


def test_requires_grad_is_applied_without_touching_the_input():
    """requires_grad=True marks the result; a tensor passed in keeps its own flag."""
    t = tb.arange(3, dtype=tb.float32)
    r = tb.asarray(t, requires_grad=True)
    assert r.requires_grad
    assert not t.requires_grad
    assert r.data_ptr() == t.data_ptr()
    assert tb.asarray([1.0, 2.0], requires_grad=True).requires_grad
    assert tb.asarray(np.arange(2.0), requires_grad=True).requires_grad


def test_requires_grad_on_integers_is_refused():
    """Only floating and complex tensors may require gradients."""
    with pytest.raises(RuntimeError, match="floating point"):
        tb.asarray(np.arange(2), requires_grad=True)


def test_tensor_copies_and_as_tensor_shares():
    """tb.tensor copies protocol objects through asarray; tb.as_tensor shares."""
    a = np.arange(4, dtype=np.int16)
    copied = tb.tensor(a)
    assert copied.dtype is tb.int16
    assert copied.data_ptr() != a.ctypes.data
    assert tb.as_tensor(a).data_ptr() == a.ctypes.data


def test_tensor_from_dlpack_only_wrapper():
    """tensor(W(x)) for a wrapper with only __dlpack__/__dlpack_device__ equals x."""
    a = np.arange(6.0).reshape(2, 3)
    assert tb.tensor(DLPackOnly(a)).tolist() == a.tolist()


# ---------------------------------------------------------------------------------------------- buffers
@pytest.mark.parametrize(
    ("obj", "dtype", "values"),
    [
        (array.array("b", [-1, 2]), tb.int8, [-1, 2]),
        (array.array("H", [1, 65535]), tb.uint16, [1, 65535]),
        (array.array("l", [-5]), tb.int64 if struct.calcsize("l") == 8 else tb.int32, [-5]),
        (array.array("q", [2**40]), tb.int64, [2**40]),
        (array.array("f", [0.5]), tb.float32, [0.5]),
        (np.array([1.5], dtype=np.float16).data, tb.float16, [1.5]),
        (memoryview(struct.pack("=2?", True, False)).cast("?"), tb.bool, [True, False]),
        (np.array([1 + 2j], dtype=np.complex128).data, tb.complex128, [1 + 2j]),
        (np.array([1 + 2j], dtype=np.complex64).data, tb.complex64, [1 + 2j]),
    ],
)
def test_buffer_dtype_comes_from_the_format(obj, dtype, values):
    """The buffer's format gives the dtype (PyTorch 2.13 ignores it)."""
    t = tb.asarray(obj)
    assert t.dtype is dtype
    assert t.tolist() == values


def test_buffer_shape_and_strides_are_kept():
    """Multi-dimensional and strided buffers keep their shape and (element) strides."""
    mv = memoryview(bytearray(range(24))).cast("B", (4, 6))
    t = tb.asarray(mv)
    assert tuple(t.shape) == (4, 6)
    assert t.stride() == (6, 1)
    s = tb.asarray(mv[::2])
    assert tuple(s.shape) == (2, 6)
    assert s.stride() == (12, 1)
    assert s.tolist() == [list(range(6)), list(range(12, 18))]
    r = tb.asarray(memoryview(bytearray(range(5)))[::-2])
    assert r.tolist() == [4, 2, 0]


def test_buffer_is_shared_and_held():
    """A bytearray is shared both ways and cannot be resized while a view lives."""
    data = bytearray(b"\x01\x02\x03")
    t = tb.asarray(data)
    t[0] = 9
    assert data[0] == 9
    view = t[1:]
    del t
    with pytest.raises(BufferError):
        data.append(0)
    del view
    gc.collect()
    data.append(0)


def test_readonly_buffer_gives_readonly_tensor():
    """bytes and read-only memoryviews give read-only tensors."""
    assert tb.asarray(b"ab").is_readonly
    assert tb.asarray(memoryview(bytearray(2)).toreadonly()).is_readonly
    assert not tb.asarray(bytearray(2)).is_readonly


def test_buffer_unknown_format_is_refused():
    """A struct format with no tensor dtype is a BufferError pointing to frombuffer."""

    class Pair(ctypes.Structure):
        _fields_ = (("a", ctypes.c_int16), ("b", ctypes.c_int32))

    with pytest.raises(BufferError, match=r"names no tensor dtype.*frombuffer"):
        tb.asarray((Pair * 2)())


def test_single_byte_formats_ignore_byte_order():
    """'>b' is still int8: byte order means nothing for one byte."""
    mv = memoryview(np.array([-3, 4], dtype=">i1"))
    assert tb.asarray(mv).tolist() == [-3, 4]


def test_empty_bytes():
    """An empty bytes object is an empty uint8 tensor."""
    t = tb.asarray(b"")
    assert tuple(t.shape) == (0,)
    assert t.dtype is tb.uint8


# ---------------------------------------------------------------------------------------------- peers
@pytest.mark.parametrize(
    "make",
    [lambda a: a, DLPackOnly, InterfaceOnly, memoryview],
    ids=["dlpack", "dlpack_only", "array_interface", "buffer"],
)
def test_numpy_negative_strides_on_every_path(make):
    """A NumPy view with negative strides imports with the same pointer and values on every path."""
    a = np.arange(24, dtype=np.int32).reshape(4, 6)[::-1, ::-2]
    t = tb.asarray(make(a))
    assert t.data_ptr() == a.ctypes.data
    assert t.stride() == tuple(s // 4 for s in a.strides)
    assert t.tolist() == a.tolist()


def test_numpy_readonly_stays_readonly():
    """A read-only NumPy array gives a read-only tensor (DLPack READ_ONLY)."""
    a = np.arange(3)
    a.flags.writeable = False
    assert tb.asarray(a).is_readonly


NUMPY_BUFFER_DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


@pytest.mark.parametrize("name", NUMPY_BUFFER_DTYPES)
def test_numpy_array_is_read_through_its_buffer(name):
    """A NumPy array of each dtype a buffer format names takes the "ndarray" path and gives what
    DLPack gives: its dtype, pointer, shape, strides and values, shared both ways."""
    from tensorbridge._storage import BufferStorage

    a = (np.arange(12) % 3).astype(name).reshape(3, 4)[:, ::2]
    t, via_dlpack = tb.asarray(a), tb.from_dlpack(a)
    assert _dispatch_path(a) == "ndarray"
    assert isinstance(t._storage.owner, BufferStorage)  # the held buffer, not a DLPack import
    whole = tb.asarray(a.base)  # contiguous: the held export is the storage itself
    assert isinstance(whole._storage, BufferStorage) and whole._storage.owner is whole._storage
    assert t.dtype is via_dlpack.dtype is getattr(tb, name)
    assert (t.data_ptr(), t.shape, t.stride()) == (a.ctypes.data, (3, 2), (4, 2))
    assert t.tolist() == a.tolist() and not t.is_readonly
    a[2, 1] = a[0, 1]
    assert t.tolist() == a.tolist()


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.array(7, dtype=np.int16),
        lambda: np.zeros((0, 3), dtype=np.float32),
        lambda: np.broadcast_to(np.arange(3.0), (4, 3)),
        lambda: np.frombuffer(bytearray(13), dtype=np.int32, offset=1),
        lambda: np.arange(24, dtype=np.int64).reshape(2, 3, 4).transpose(2, 0, 1)[::-1],
        lambda: np.arange(4.0)[None],
        lambda: np.arange(10)[::5][:1],
        lambda: np.broadcast_to(np.arange(3.0), (1, 3)),
    ],
    ids=[
        "0-d",
        "empty",
        "broadcast",
        "unaligned",
        "permuted_reversed",
        "new_axis",
        "one_of_a_step",
        "broadcast_1",
    ],
)
def test_numpy_layouts_through_the_buffer(make):
    """0-d, empty, broadcast (stride 0, read-only), unaligned and permuted arrays import as they
    are, with the strides DLPack gives: also for dimensions of size 0 or 1, which NumPy's buffer
    rewrites (``np.arange(4.0)[None]`` has strides (0, 8), its buffer (32, 8)). There DLPack gives
    NumPy's own strides where NumPy exports them (2.4 does; 2.2 and older normalise them)."""
    from tensorbridge import _convert

    a = make()
    t = tb.asarray(a)
    via_dlpack = _convert._import("dlpack", a, None, None, None, None, "asarray")[0]
    assert t.shape == a.shape and t.tolist() == a.tolist()
    assert t.stride() == via_dlpack.stride()
    if all(n > 1 for n in a.shape):
        assert t.stride() == tuple(s // a.itemsize for s in a.strides)
    assert t.is_readonly is (not a.flags.writeable)
    if a.size:
        assert t.data_ptr() == a.ctypes.data


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.array(["2024-01-01", "2024-06-01"], dtype="datetime64[D]"),
        lambda: np.zeros(3, dtype=[("x", "<i4"), ("y", "<f8")]),
        lambda: np.arange(4, dtype=">i4"),
        lambda: np.array([1, "a"], dtype=object),
        lambda: np.zeros(2, dtype=np.longdouble),
        lambda: np.zeros(3, dtype=[("x", "<i2"), ("y", "<f4")])["y"],
    ],
    ids=["datetime", "record", "big_endian", "object", "longdouble", "packed_record_field"],
)
def test_numpy_arrays_the_buffer_cannot_describe_take_dlpack(make):
    """Where the buffer cannot say what an array holds, `asarray` gives exactly what its DLPack
    path gives (the same tensor, or the same refusal)."""
    from tensorbridge import _convert

    a = make()

    def outcome(convert):
        try:
            t = convert()
        except Exception as exc:  # the refusal itself is what is compared
            return type(exc), str(exc)
        return t.dtype, t.shape, t.stride(), t.data_ptr(), t.tolist()

    assert outcome(lambda: tb.asarray(a)) == outcome(
        lambda: _convert._import("dlpack", a, None, None, None, None, "asarray")[0]
    )


def test_numpy_array_stays_alive_while_a_view_does():
    """The tensor keeps the array (its buffer export) alive; the last view's death releases it."""
    a = np.arange(5.0)
    ref = weakref.ref(a)
    t = tb.asarray(a)[1:]
    del a
    gc.collect()
    assert ref() is not None and t.tolist() == [1.0, 2.0, 3.0, 4.0]
    del t
    gc.collect()
    assert ref() is None


def test_numpy_array_copy_and_device_requests():
    """``copy=True`` gives a private writable copy, also of a read-only array; ``device`` and
    ``copy=False`` are honoured as on every other path."""
    a = np.arange(4, dtype=np.int32)
    a.flags.writeable = False
    c = tb.asarray(a, copy=True)
    assert c.data_ptr() != a.ctypes.data and not c.is_readonly and c.tolist() == [0, 1, 2, 3]
    same = tb.asarray(a, device="cpu", copy=False)
    assert same.data_ptr() == a.ctypes.data and same.is_readonly


def test_numpy_subclasses_take_dlpack():
    """Only ``numpy.ndarray`` itself is read through its buffer: a subclass may export otherwise."""

    class Sub(np.ndarray):
        pass

    s = np.arange(3).view(Sub)
    assert _dispatch_path(s) == "dlpack"
    assert tb.asarray(s).tolist() == [0, 1, 2]


def test_numpy_scalar():
    """A NumPy scalar imports as a 0-d tensor through its array interface."""
    t = tb.asarray(np.float64(1.25))
    assert t.ndim == 0
    assert t.item() == 1.25


# PyTorch 2.13's refusal of copy=False for a NumPy scalar (torch/csrc/utils/tensor_new.cpp), a
# RuntimeError; tensorbridge's message holds it, the function's name and the fix.
NUMPY_SCALAR_ALIAS = (
    "can't alias NumPy scalars. Either remove copy=False or transform it in a ndarray."
)

NUMPY_SCALARS = {
    "float64": lambda: np.float64(0.5),
    "float32": lambda: np.float32(-1.25),
    "float16": lambda: np.float16(1.5),
    "int64": lambda: np.int64(-7),
    "int32": lambda: np.int32(3),
    "int8": lambda: np.int8(-2),
    "uint8": lambda: np.uint8(200),
    "uint64": lambda: np.uint64(2**63),
    "bool": lambda: np.bool_(True),
    "complex64": lambda: np.complex64(1 - 2j),
    "complex128": lambda: np.complex128(0.5j),
    "datetime64": lambda: np.datetime64("2020-01-02"),
    "timedelta64": lambda: np.timedelta64(3, "s"),
    "void": lambda: np.void(b"ab"),
    "structured": lambda: np.zeros(1, dtype="i4,f8")[0],
    "str": lambda: np.str_("a"),
    "bytes": lambda: np.bytes_(b"a"),
}
# The NumPy scalars whose dtype tensorbridge has (the others are refused with copy=None too).
NUMERIC_SCALARS = [name for name in NUMPY_SCALARS if name[0] in "fiucb" and name != "bytes"]


@pytest.mark.parametrize("name", list(NUMPY_SCALARS))
def test_numpy_scalar_with_copy_false_is_refused(name):
    """copy=False never copies, and a NumPy scalar has no memory to share (its interface points
    into a new array at each read): PyTorch's RuntimeError, naming the call and the fix, for every
    ``numpy.generic``, before any dtype or device is considered."""
    value = NUMPY_SCALARS[name]()
    for kwargs in ({}, {"dtype": tb.float32}, {"device": "cpu"}):
        with pytest.raises(RuntimeError) as info:
            tb.asarray(value, copy=False, **kwargs)
        message = str(info.value)
        assert message.startswith("asarray(): ") and NUMPY_SCALAR_ALIAS in message
        assert "copy=None or copy=True" in message and type(value).__name__ in message


def test_numpy_scalar_refusal_is_torchs():
    """torch.asarray refuses copy=False for NumPy scalars with the type and words kept above."""
    torch = pytest.importorskip("torch")
    for make in NUMPY_SCALARS.values():
        with pytest.raises(RuntimeError, match=re.escape(NUMPY_SCALAR_ALIAS)):
            torch.asarray(make(), copy=False)


@pytest.mark.parametrize("copy", [None, True])
@pytest.mark.parametrize("name", NUMERIC_SCALARS)
def test_numpy_scalar_with_copy_none_or_true_holds_its_value(name, copy):
    """copy=None and copy=True give a 0-d tensor of the scalar's dtype and value, as torch does."""
    value = NUMPY_SCALARS[name]()
    t = tb.asarray(value, copy=copy)
    assert t.ndim == 0 and t.dtype.name == value.dtype.name
    assert t.item() == value.item() and not t.is_readonly
    t.fill_(0)  # the tensor's memory is its own: the scalar keeps its value
    assert value == NUMPY_SCALARS[name]()
    torch = pytest.importorskip("torch")
    theirs = torch.asarray(NUMPY_SCALARS[name](), copy=copy)
    assert t.dtype.name == str(theirs.dtype).removeprefix("torch.")
    assert tb.asarray(value, copy=copy).item() == theirs.item()


class _FreshArrayEachRead:
    """``__array_interface__`` describes a new array at each read, kept alive by the dictionary
    (its ``data`` is the array itself)."""

    @property
    def __array_interface__(self):
        a = np.arange(3.0)
        return {**a.__array_interface__, "data": a}


class _FreshPointerEachRead:
    """``__array_interface__`` points at a new array at each read, which the object keeps."""

    def __init__(self):
        self.made: list[Any] = []

    @property
    def __array_interface__(self):
        self.made.append(np.arange(3.0))
        return self.made[-1].__array_interface__


class _MarkedTemporary:
    """``__array_interface__`` with NumPy's ``'__ref'``: the array made for this dictionary."""

    @property
    def __array_interface__(self):
        a = np.arange(3.0)
        return {**a.__array_interface__, "__ref": a}


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_FreshArrayEachRead, "describes other memory each time it is read"),
        (_FreshPointerEachRead, "describes other memory each time it is read"),
        (_MarkedTemporary, "'__ref'"),
    ],
)
def test_copy_false_refuses_an_interface_over_a_temporary(make, reason):
    """An ``__array_interface__`` over memory made for the dictionary (marked by ``'__ref'``, or
    other memory at each read) is nothing ``copy=False`` could share: ValueError, as for every
    alias refusal, naming the call, the object and the fix. copy=None and True still copy it."""
    obj = make()
    with pytest.raises(ValueError, match=re.escape(reason)) as info:
        tb.asarray(obj, copy=False)
    message = str(info.value)
    assert message.startswith("asarray(): can't alias the memory of ")
    assert type(obj).__name__ in message and "copy=None or copy=True" in message
    for copy in (None, True):
        t = tb.asarray(make(), copy=copy)
        assert t.dtype is tb.float64 and t.tolist() == [0.0, 1.0, 2.0]


class _SameMemoryNewDict:
    """A new dictionary at each read, over the same memory: a pointer, or a new memoryview."""

    def __init__(self, arr, as_buffer):
        self.arr, self.as_buffer = arr, as_buffer

    @property
    def __array_interface__(self):
        iface = self.arr.__array_interface__
        return {**iface, "data": memoryview(self.arr)} if self.as_buffer else iface


@pytest.mark.parametrize("as_buffer", [False, True])
def test_copy_false_shares_an_interface_read_anew_over_the_same_memory(as_buffer):
    """An interface rebuilt at each read but over the object's own memory is shared with
    copy=False (the second read's memory is compared, not its dictionary)."""
    a = np.arange(4, dtype=np.int32)
    t = tb.asarray(_SameMemoryNewDict(a, as_buffer), copy=False)
    assert t.data_ptr() == a.ctypes.data
    t[0] = 9
    assert a[0] == 9
    shared = tb.asarray(InterfaceOnly(a), copy=False)
    assert shared.data_ptr() == a.ctypes.data


def test_torch_tensor_is_shared():
    """A torch tensor imports through DLPack with the same pointer."""
    torch = pytest.importorskip("torch")
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    t = tb.asarray(x)
    assert _dispatch_path(x) == "dlpack"
    assert t.data_ptr() == x.data_ptr()
    assert t.stride() == x.stride()


def test_jax_array_imports():
    """A JAX array imports through DLPack with its values."""
    jnp = pytest.importorskip("jax.numpy")
    assert tb.asarray(jnp.arange(4, dtype=jnp.float32)).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_torch_asarray_agrees_on_plain_inputs():
    """Where torch.asarray is right (sequences, scalars, tensors), tb.asarray gives the same dtype and values."""
    torch = pytest.importorskip("torch")
    for obj in ([1, 2], [1.5], [[True]], 3, 2.0, [1 + 1j]):
        ours, theirs = tb.asarray(obj), torch.asarray(obj)
        assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
        assert ours.tolist() == theirs.tolist()


# ------------------------------------------------------------------------------- lying buffers
def _crafted_buffer(memory: ctypes.Array, shape: tuple[int, ...], length: int) -> memoryview:
    """A memoryview over ``memory`` (int32 items) whose Py_buffer claims ``shape`` and ``len``."""
    from tensorbridge import _capi

    view = _capi.Py_buffer()
    view.buf = ctypes.addressof(memory)
    view.len = length
    view.itemsize = 4
    view.readonly = 1
    view.ndim = len(shape)
    view.format = b"i"
    dims = (ctypes.c_ssize_t * max(len(shape), 1))(*shape)
    view.shape = dims
    view.strides = None
    exporter = _capi.PyMemoryView_FromBuffer(view)
    _KEEP.append((memory, dims))
    return exporter


_KEEP: list[Any] = []


def _strided_exporter() -> Any:
    return np.arange(12, dtype=np.int32).reshape(3, 4)[::-1, ::2]


def _indirect_exporter() -> memoryview:
    """A crafted 1-D exporter with a non-negative suboffset (a PIL-style array of pointers)."""
    from tensorbridge import _capi

    memory = (ctypes.c_int32 * 4)()
    view = _capi.Py_buffer()
    view.buf = ctypes.addressof(memory)
    view.len, view.itemsize, view.readonly, view.ndim, view.format = 16, 4, 1, 1, b"i"
    dims = (ctypes.c_ssize_t * 3)(4, 4, 0)
    view.shape = ctypes.cast(ctypes.addressof(dims), ctypes.POINTER(ctypes.c_ssize_t))
    view.strides = ctypes.cast(ctypes.addressof(dims) + 8, ctypes.POINTER(ctypes.c_ssize_t))
    view.suboffsets = ctypes.cast(ctypes.addressof(dims) + 16, ctypes.POINTER(ctypes.c_ssize_t))
    exporter = _capi.PyMemoryView_FromBuffer(view)
    _KEEP.append((memory, dims))
    return exporter


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (_strided_exporter, (b"i", 4, 2, (3, 2), (-16, 8), False, False)),
        (lambda: array.array("d", [1.0, 2.0]), (b"d", 8, 1, (2,), (8,), False, True)),
        (lambda: b"abc", (b"B", 1, 1, (3,), (1,), False, True)),
        (
            lambda: np.arange(6.0).reshape(2, 3)[:, None],
            (b"d", 8, 3, (2, 1, 3), (24, 24, 8), False, True),
        ),
        (_indirect_exporter, (b"i", 4, 1, (4,), (4,), True, False)),
    ],
    ids=["strided", "array", "bytes", "unit_dimension", "indirect"],
)
def test_both_buffer_readers_read_the_same_fields(make, expected):
    """The compiled build reads a held buffer's layout from C, field for field what the
    pure-Python build reads from the ctypes ``Py_buffer``."""
    from tensorbridge import _capi

    from .conftest import native_twins

    obj = make()
    for twin in native_twins():
        view, buf, length, readonly = twin.acquire_buffer(obj, _capi.PY_BUF_FULL_RO)
        assert twin.describe_buffer(view) == (buf, length, *expected)
        assert buf == (view.buf or 0) and length == view.len and readonly is bool(view.readonly)
        if length:
            assert buf != 0


def test_buffer_with_suboffsets_is_refused():
    """An indirect (PIL-style) buffer cannot be a strided tensor: BufferError naming suboffsets."""
    with pytest.raises(BufferError, match=r"asarray\(\): the buffer of memoryview uses suboffsets"):
        tb.asarray(_indirect_exporter())


@pytest.mark.parametrize(("shape", "length"), [((32,), 64), ((2, 8), 32), ((4,), 32), ((), 8)])
def test_buffer_whose_shape_disagrees_with_its_len_is_refused(shape, length):
    """A buffer whose shape needs more or fewer bytes than its ``len`` is malformed: BufferError,
    never a tensor reaching past the exporter's memory."""
    memory = (ctypes.c_int32 * 32)(*range(32))
    with pytest.raises(BufferError, match=r"asarray\(\): the buffer of memoryview is malformed"):
        tb.asarray(_crafted_buffer(memory, shape, length))


def test_buffer_whose_shape_agrees_with_its_len_is_shared():
    """The same crafted exporter with a consistent ``len`` is imported as it describes."""
    memory = (ctypes.c_int32 * 32)(*range(32))
    t = tb.asarray(_crafted_buffer(memory, (4, 8), 128))
    assert t.shape == (4, 8)
    assert t.data_ptr() == ctypes.addressof(memory)
    assert t.flatten().tolist() == list(range(32))


# ----------------------------------------------------------------------- one-line error messages
class _Sprawling:
    """An object that is neither a sequence nor a number, printed over many long lines."""

    def __repr__(self) -> str:
        return "<Sprawling\n" + "\n".join(f"  line {i}: " + "x" * 60 for i in range(40)) + "\n>"


@pytest.mark.parametrize(
    ("call", "api"),
    [
        (lambda o: tb.asarray(o), "asarray"),
        (lambda o: tb.asarray([1, o]), "asarray"),
        (lambda o: tb.tensor(o), "tensor"),
        (lambda o: tb.from_dlpack(tb.arange(2), device=o), "from_dlpack"),
        (lambda o: tb.from_dlpack(tb.arange(2), copy=o), "from_dlpack"),
        (lambda o: tb.asarray(tb.arange(2), copy=o), "asarray"),
        (lambda o: tb.from_pointer(0, (0,), "int8", strides=o), "from_pointer"),
        (lambda o: tb.arange(2).__dlpack__(stream=o), "__dlpack__"),
        (lambda o: tb.arange(2).__dlpack__(max_version=o), "__dlpack__"),
        (lambda o: tb.arange(2).__dlpack__(dl_device=o), "__dlpack__"),
    ],
)
def test_errors_show_user_input_on_one_short_line(call, api):
    """An error embedding the caller's object names the function called and stays one line, with
    the object's repr shortened."""
    with pytest.raises(TypeError) as info:
        call(_Sprawling())
    text = str(info.value)
    assert text.startswith(f"{api}(): ")
    assert "\n" not in text
    assert "<Sprawling line 0: xxx" in text
    assert len(text) < 400


class _BrokenProducer:
    """A DLPack producer whose ``__dlpack_device__`` answers garbage."""

    def __dlpack__(self, **kwargs):
        return None

    def __dlpack_device__(self):
        return "not a device"


@pytest.mark.parametrize("api", ["asarray", "tensor", "from_dlpack"])
def test_dlpack_import_errors_name_the_function_called(api):
    """A DLPack import refused inside asarray() or tensor() names that function, not from_dlpack."""
    with pytest.raises(TypeError, match=rf"^{api}\(\): .*__dlpack_device__\(\) must return"):
        getattr(tb, api)(_BrokenProducer())
