"""Refusals lose nothing: every refused import raises its own error and releases what it took.

A refused import must leave the caller with the error tensorbridge documents, and with nothing
held: the producer's memory freed (its deleter run exactly once, by its capsule's destructor,
before the exception reaches the caller) and a buffer exporter free to release or resize at once.
Two ways to break that, one per build:

* compiled, a capsule whose last reference tensorbridge held was dropped while the refusal was
  pending: a destructor written in Python (ctypes, as many small producers write theirs) cannot
  run then, the refusal became ``SystemError`` and the deleter never ran;
* pure Python, the frames of a traceback keep their locals (the capsule, the held buffer) for as
  long as the caller keeps the exception.

The producer here is written the way such producers are: a ctypes managed struct, a ctypes
deleter, and a ``PyCapsule`` with a ctypes destructor that calls the deleter of a capsule still
under its unconsumed name, as the DLPack standard asks. The corpus runs in a child process (a
crash is possible on the code this guards against), once per build where both are installed, and
the two builds must agree on every exception type, message and deleter count.
"""

from __future__ import annotations

import json
import sys

import pytest
from tests.conftest import run_in_subprocess

import tensorbridge as tb

pytestmark = pytest.mark.subprocess

# The producer and the corpus, run in a child. Each case prints (door, case, exception type,
# message, deleter calls while the exception is still held, deleter calls once it is gone).
_CORPUS = r"""
import ctypes, gc, json, sys
import tensorbridge as tb
from tensorbridge._dlpack_abi import DLManagedTensor, DLManagedTensorVersioned, DLPackDeleter

api = ctypes.pythonapi
capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", api))
get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_GetName", api))
get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", api))
Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
calls = {}
live = {}

@DLPackDeleter
def deleter(address):
    calls[address] = calls.get(address, 0) + 1
    live.pop(address, None)

@Destructor
def destructor(capsule):
    # A destructor in Python: the deleter of a capsule no consumer took (still "dltensor*").
    name = get_name(capsule)
    if name is not None and not name.startswith(b"used_"):
        deleter(get_pointer(capsule, name))

class Producer:
    # Makes one capsule and keeps no reference to it: from_dlpack holds the only one.
    def __init__(self, case):
        self.case = case
        versioned = case != "legacy_bad_dtype"
        managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
        data = (ctypes.c_float * 4)()
        shape = (ctypes.c_int64 * 2)(2, 2)
        strides = (ctypes.c_int64 * 2)(2, 1)
        dl = managed.dl_tensor
        dl.data = ctypes.addressof(data)
        dl.device.device_type, dl.device.device_id = 1, 0
        dl.ndim = 2
        dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = 2, 32, 1
        dl.shape, dl.strides = shape, strides
        if versioned:
            managed.version.major, managed.version.minor = 1, 3
        managed.deleter = deleter
        name = b"dltensor_versioned" if versioned else b"dltensor"
        if case in ("bad_dtype", "legacy_bad_dtype"):
            dl.dtype.code = 99
        elif case == "major_2":
            managed.version.major = 2
        elif case == "negative_shape":
            shape[0] = -2
        elif case == "null_data":
            dl.data = None
        elif case == "wrong_name":
            name = b"not_a_dltensor"
        elif case == "used_name":
            name = b"used_dltensor_versioned"
        self.address = ctypes.addressof(managed)
        self.keep = (managed, data, shape, strides, name)
        live[self.address] = self
        calls[self.address] = 0
        self.capsule = capsule_new(self.address, name, ctypes.cast(destructor, ctypes.c_void_p))

    def __dlpack__(self, **kwargs):
        capsule, self.capsule = self.capsule, None
        return capsule

    def __dlpack_device__(self):
        return (1, 0)

doors = {
    "from_dlpack": lambda p: tb.from_dlpack(p),
    "from_dlpack(copy=True)": lambda p: tb.from_dlpack(p, copy=True),
    "from_dlpack(device='cpu')": lambda p: tb.from_dlpack(p, device="cpu"),
    "asarray": lambda p: tb.asarray(p),
    "asarray(copy=True)": lambda p: tb.asarray(p, copy=True),
    "as_tensor": lambda p: tb.as_tensor(p),
    "tensor": lambda p: tb.tensor(p),
}
cases = ["bad_dtype", "legacy_bad_dtype", "major_2", "negative_shape", "null_data", "wrong_name",
         "used_name"]
rows = []
for door, call in doors.items():
    for case in cases:
        p = Producer(case)
        address = p.address
        error = None
        try:
            call(p)
        except BaseException as exc:
            error = exc
        held = calls[address]  # the exception is still alive here
        kind = type(error).__name__
        message = str(error)
        del error
        gc.collect()
        rows.append([door, case, kind, message, held, calls[address]])
print("RESULT " + json.dumps({"build": tb.build_info().kind, "rows": rows}))
"""

# What each refusal raises: the type, and a substring of its message.
_EXPECTED = {
    "bad_dtype": ("BufferError", "unsupported DLPack dtype (code=99"),
    "legacy_bad_dtype": ("BufferError", "unsupported DLPack dtype (code=99"),
    "major_2": ("BufferError", "DLPack 2.3 tensor"),
    "negative_shape": ("BufferError", "negative size"),
    "null_data": ("BufferError", "DLTensor.data is NULL"),
    "wrong_name": ("TypeError", "capsule named 'not_a_dltensor'"),
    "used_name": ("RuntimeError", "consumed only once"),
}


def _corpus(env: dict[str, str] | None = None) -> dict:
    result = run_in_subprocess(_CORPUS, timeout=120, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Exception ignored" not in result.stderr, result.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module")
def corpus():
    return _corpus()


def test_every_refusal_raises_its_error_and_frees_the_producer_at_once(corpus):
    assert len(corpus["rows"]) == 49
    for door, case, kind, message, held, after in corpus["rows"]:
        want_kind, want_text = _EXPECTED[case]
        assert kind == want_kind, (door, case, kind, message)
        assert want_text in message, (door, case, message)
        # A used capsule belongs to its consumer: its producer's destructor never calls the
        # deleter. Every other capsule is freed, once, before the caller sees the exception.
        expected = 0 if case == "used_name" else 1
        assert (held, after) == (expected, expected), (door, case, held, after)


def test_messages_name_the_function_the_user_called(corpus):
    for door, case, _kind, message, _held, _after in corpus["rows"]:
        if case in ("wrong_name", "used_name"):
            continue  # PyTorch's own text, or the capsule's name, whatever the door
        api = door.split("(")[0] + "()"
        assert message.startswith(api), (door, case, message)


def test_both_builds_refuse_alike(corpus):
    """The pure-Python build (TENSORBRIDGE_NO_EXTENSIONS=1) gives the same rows as this one."""
    pure = _corpus({"TENSORBRIDGE_NO_EXTENSIONS": "1"})
    assert pure["build"] == "pure-python"
    assert pure["rows"] == corpus["rows"]


# -------------------------------------------------------------------------------------------------
# Buffer imports: a refused import leaves the exporter free at once
# -------------------------------------------------------------------------------------------------


def _refused_exporters():
    import array
    import ctypes

    yield "big-endian ctypes array", memoryview((ctypes.c_int32.__ctype_be__ * 4)())

    class Pair(ctypes.Structure):
        _fields_ = (("a", ctypes.c_int32), ("b", ctypes.c_double))

    yield "ctypes Structure", memoryview((Pair * 3)())
    yield "long double array", memoryview((ctypes.c_longdouble * 2)())
    # 'w' (Py_UCS4, format 'w') from Python 3.13, which deprecates 'u' (wchar_t)
    unicode = "w" if sys.version_info >= (3, 13) else "u"
    yield "array of unicode", memoryview(array.array(unicode, "abc"))


@pytest.mark.parametrize(
    "door",
    [
        lambda m: tb.asarray(m),
        lambda m: tb.asarray(m, copy=True),
        lambda m: tb.as_tensor(m),
        lambda m: tb.frombuffer(m, dtype=tb.float64),
    ],
    ids=["asarray", "asarray(copy=True)", "as_tensor", "frombuffer"],
)
def test_a_refused_buffer_import_leaves_the_exporter_free(door):
    refused = []
    for what, m in _refused_exporters():
        try:
            door(m)
        except (BufferError, TypeError, ValueError, RuntimeError) as exc:
            refused.append((what, exc))  # the caller keeps the exception while it releases
        else:
            continue  # this door reads this exporter; nothing to release
        m.release()  # raises BufferError "memoryview has 1 exported buffer" if still held
    assert refused, "no exporter was refused: the test checked nothing"


def test_a_refused_bytearray_can_be_resized_while_the_error_lives():
    b = bytearray(10)
    with pytest.raises(ValueError, match="frombuffer") as info:
        tb.frombuffer(b, dtype=tb.float32)
    kept = info.value  # the exception is still alive here
    b.append(0)  # BufferError if the refusal still held the export
    assert isinstance(kept, ValueError)


# -------------------------------------------------------------------------------------------------
# Exports: a stride that addresses nothing never stops an export
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stride", [-(2**63), 2**63 - 1, -1, 2**40])
def test_a_size_one_dimension_exports_whatever_its_stride(stride):
    np = pytest.importorskip("numpy")
    t = tb.arange(3, dtype=tb.int64).as_strided((1,), (stride,), 1)
    for capsule in (t.__dlpack__(), t.__dlpack__(max_version=(1, 0)), tb.utils.dlpack.to_dlpack(t)):
        u = tb.from_dlpack(capsule)
        assert u.tolist() == [1]
    a = np.from_dlpack(t)
    assert a.tolist() == [1]
    assert a.__array_interface__["data"][0] == t.data_ptr()  # shared, not copied
    m = tb.arange(8, dtype=tb.int32).as_strided((1, 4), (stride, 1), 2)
    assert np.from_dlpack(m).tolist() == [[2, 3, 4, 5]]


@pytest.mark.parametrize("stride", [2**63, -(2**63) - 1, 2**70, -(2**70)])
def test_a_stride_past_int64_is_refused_as_pytorch_refuses_it(stride):
    # A DLPack stride is an int64_t: PyTorch's as_strided cannot unpack such a value (TypeError).
    t = tb.arange(3, dtype=tb.int64)
    with pytest.raises(TypeError, match="Overflow when unpacking long long"):
        t.as_strided((1,), (stride,), 1)


def test_a_capsule_with_an_int64_min_unit_stride_imports_and_exports_again(crafted):
    np = pytest.importorskip("numpy")
    producer = crafted([1.0, 2.0, 3.0, 4.0], shape=(1, 4), strides=(-(2**63), 1))
    t = tb.from_dlpack(producer)
    assert t.stride() == (-(2**63), 1)
    assert np.from_dlpack(t).tolist() == [[1.0, 2.0, 3.0, 4.0]]
    assert tb.from_dlpack(tb.utils.dlpack.to_dlpack(t)).tolist() == [[1.0, 2.0, 3.0, 4.0]]


# -------------------------------------------------------------------------------------------------
# The collector sees what a held buffer holds
# -------------------------------------------------------------------------------------------------

_CYCLES = r"""
import array, gc, json, weakref
import tensorbridge as tb

class BA(bytearray):
    pass

class AA(array.array):
    pass

collected = {}
for name, make, door in [
    ("bytearray subclass, frombuffer", lambda: BA(16), lambda b: tb.frombuffer(b, dtype=tb.uint8)),
    ("bytearray subclass, asarray", lambda: BA(16), lambda b: tb.asarray(b)),
    ("array subclass, asarray", lambda: AA("i", [1, 2, 3]), lambda b: tb.asarray(b)),
    ("view of a view", lambda: BA(16), lambda b: tb.frombuffer(b, dtype=tb.uint8)[2:]),
]:
    b = make()
    b.t = door(b)
    ref = weakref.ref(b)
    del b
    gc.collect()
    collected[name] = ref() is None
# A held export still stops a resize while a view lives, and lets go when it dies.
b = bytearray(8)
t = tb.frombuffer(b, dtype=tb.uint8)
try:
    b.append(0)
    locked = False
except BufferError:
    locked = True
del t
b.append(0)
print("RESULT " + json.dumps({"build": tb.build_info().kind, "collected": collected,
                              "locked": locked}))
"""


@pytest.mark.parametrize("pure", [False, True], ids=["this build", "pure Python"])
def test_an_exporter_that_holds_a_tensor_over_itself_is_collected(pure):
    env = {"TENSORBRIDGE_NO_EXTENSIONS": "1"} if pure else None
    result = run_in_subprocess(_CYCLES, timeout=60, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Exception ignored" not in result.stderr and "SystemError" not in result.stderr
    outcome = json.loads(lines[-1][len("RESULT ") :])
    assert all(outcome["collected"].values()), outcome
    assert outcome["locked"]


# -------------------------------------------------------------------------------------------------
# Private fields cleared from Python: an error, never a crash
# -------------------------------------------------------------------------------------------------

_CLEARED = r"""
import json
import tensorbridge as tb
from tensorbridge import _dlpack_export

rows = []
def attempt(what, call):
    try:
        call()
        rows.append([what, None])
    except Exception as exc:
        rows.append([what, type(exc).__name__])

for field in ("_storage", "_shape", "_strides", "_dtype", "_offset"):
    for how in ("set to None", "deleted"):
        t = tb.arange(4)
        try:
            if how == "deleted":
                delattr(t, field)
            else:
                setattr(t, field, None)
        except AttributeError:
            rows.append([f"{field} {how}", "refused"])
            continue
        attempt(f"{field} {how}: __dlpack__", lambda: t.__dlpack__())
        attempt(f"{field} {how}: versioned", lambda: t.__dlpack__(max_version=(1, 0)))
        attempt(f"{field} {how}: to_dlpack", lambda: tb.utils.dlpack.to_dlpack(t))
        attempt(f"{field} {how}: from_dlpack", lambda: tb.from_dlpack(t))
        attempt(f"{field} {how}: memoryview", lambda: memoryview(t))
        attempt(f"{field} {how}: repr", lambda: repr(t))
attempt("_export(None)", lambda: _dlpack_export._export(None, None, None, None, None, "x"))
attempt("_new_managed(t, None)",
        lambda: _dlpack_export._new_managed(tb.arange(2), None, tb.device("cpu"), True, False))
print("RESULT " + json.dumps(rows))
"""


def test_a_tensor_with_cleared_private_fields_raises_and_never_crashes():
    result = run_in_subprocess(_CLEARED, timeout=60)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-2000:] + result.stderr[-2000:]
    rows = dict(json.loads(lines[-1][len("RESULT ") :]))
    assert len(rows) >= 12, rows  # the child went through every case: nothing crashed it
    for how in ("set to None", "deleted"):
        if rows.get(f"_storage {how}") == "refused":
            continue
        for door in ("__dlpack__", "versioned", "to_dlpack"):
            assert rows[f"_storage {how}: {door}"] == "AttributeError", (how, door, rows)
    assert rows["_export(None)"] == "AttributeError"
    assert rows["_new_managed(t, None)"] == "AttributeError"
