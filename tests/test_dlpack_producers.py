"""DLPack import from every kind of producer: builtin ``__dlpack__`` methods that refuse keywords
as pybind11 does (ONNX Runtime), ``__dlpack_device__`` spellings (PaddlePaddle's ``(kDLCPU,
None)``, IntEnum members, NumPy integers), and producers of immutable memory (JAX, TensorFlow)."""

from __future__ import annotations

import enum
import importlib.util
import textwrap

import pytest

import tensorbridge as tb
from tensorbridge import _device, _dlpack

# pybind11's refusal of keywords a bound function does not declare, word for word (ONNX Runtime
# 1.32's ``OrtValue.__dlpack__``); ``{kwargs}`` is what it was called with.
PYBIND11_REFUSAL = (
    "__dlpack__(): incompatible function arguments. The following argument types are "
    "supported:\n    1. (self: fake_ext.Value, stream: object = None) -> object\n\n"
    "Invoked with: <fake_ext.Value object at 0x7f00>; kwargs: {kwargs}"
)


class _Builtin:
    """A method as pybind11 binds it: a builtin whose signature ``inspect`` cannot read, that takes
    ``stream`` only and refuses any other keyword with ``refusal``."""

    def __init__(self, export, refusal):
        self.export = export
        self.refusal = refusal
        self.calls = []

    @property
    def __signature__(self):
        # What inspect.signature meets on a pybind11 builtin.
        raise ValueError("no signature found for builtin <built-in method __dlpack__>")

    def __call__(self, **kwargs):
        self.calls.append(dict(kwargs))
        if set(kwargs) - {"stream"}:
            shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            raise TypeError(self.refusal.format(kwargs=shown))
        return self.export()


class PybindProducer:
    """A host producer whose ``__dlpack__`` behaves as a pybind11 binding taking ``stream`` only."""

    def __init__(self, t, refusal=PYBIND11_REFUSAL, device=(1, 0)):
        self.t = t
        self.device = device
        # An instance attribute, as pybind11's method is for the consumer: a builtin, not a
        # Python function.
        self.__dlpack__ = _Builtin(lambda: t.__dlpack__(max_version=(1, 0)), refusal)

    def __dlpack_device__(self):
        return self.device


class _BrokenBuiltin(_Builtin):
    """A builtin ``__dlpack__`` that raises a TypeError about something else than its arguments."""

    def __call__(self, **kwargs):
        self.calls.append(dict(kwargs))
        raise TypeError("unsupported dtype object for export")


class UnrelatedTypeError:
    """A producer whose builtin ``__dlpack__`` raises a TypeError not about its arguments."""

    def __init__(self):
        self.__dlpack__ = _BrokenBuiltin(None, "")

    def __dlpack_device__(self):
        return (1, 0)


# -------------------------------------------------------------------------------------------------
# Keyword negotiation
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"copy": False}, {"device": "cpu"}])
def test_pybind11_producer_is_asked_again_with_stream_only(kwargs):
    """A pybind11 ``__dlpack__`` that takes only ``stream`` is asked again without the keywords
    its "incompatible function arguments" refusal lists, and shares the memory."""
    t = tb.arange(4)
    p = PybindProducer(t)
    out = tb.from_dlpack(p, **kwargs)
    assert out.tolist() == [0, 1, 2, 3]
    assert out.data_ptr() == t.data_ptr()
    assert len(p.__dlpack__.calls) == 2
    assert p.__dlpack__.calls[0]["max_version"] == (1, 3)
    assert set(p.__dlpack__.calls[1]) <= {"stream"}


def test_pybind11_producer_copy_true_is_copied_after_import():
    """copy=True that a pybind11 producer cannot take is met by a copy of its host memory."""
    t = tb.arange(4)
    p = PybindProducer(t)
    out = tb.from_dlpack(p, copy=True)
    assert out.tolist() == [0, 1, 2, 3]
    assert out.data_ptr() != t.data_ptr()
    out[0] = 9
    assert t.tolist() == [0, 1, 2, 3]


def test_pybind11_producer_through_asarray():
    """asarray takes the same negotiation."""
    t = tb.arange(3)
    out = tb.asarray(PybindProducer(t))
    assert out.data_ptr() == t.data_ptr()
    assert tb.asarray(PybindProducer(t), copy=True).data_ptr() != t.data_ptr()


def test_pybind11_device_producer_does_not_lose_a_copy():
    """Device memory tensorbridge cannot copy: a pybind11 producer that cannot take copy=True is
    refused with a TypeError naming the keyword, and not asked again."""
    t = tb.from_pointer(0x10000, (3,), tb.float32, device="cuda:0")
    p = PybindProducer(t, device=(2, 0))
    with pytest.raises(TypeError, match=r"does not take the keywords .*'copy'.*incompatible"):
        tb.from_dlpack(p, copy=True)
    assert len(p.__dlpack__.calls) == 1


def test_pybind11_device_producer_keeps_its_stream():
    """Asked again, a pybind11 device producer still gets ``stream=1``."""
    t = tb.from_pointer(0x10000, (3,), tb.float32, device="cuda:0")
    p = PybindProducer(t, device=(2, 0))
    out = tb.from_dlpack(p)
    assert p.__dlpack__.calls[1] == {"stream": 1}
    assert out.data_ptr() == t.data_ptr()


@pytest.mark.parametrize(
    "refusal",
    [
        "__dlpack__() takes no keyword arguments",
        "'max_version' is an invalid keyword argument for __dlpack__()",
        "Value.__dlpack__() got an unexpected keyword argument 'max_version'",
        "__dlpack__(): incompatible function arguments. The following argument types are "
        "supported:\n    1. __dlpack__(self, stream: object | None = None) -> object\n",
    ],
)
def test_builtin_refusals_in_other_words(refusal):
    """A builtin's refusal in CPython's, Cython's or nanobind's words is about the keywords too."""
    t = tb.arange(3)
    p = PybindProducer(t, refusal=refusal)
    assert tb.from_dlpack(p).data_ptr() == t.data_ptr()


def test_unrelated_type_error_of_a_builtin_propagates():
    """A TypeError about something else than the arguments propagates unchanged, after one
    call."""
    p = UnrelatedTypeError()
    with pytest.raises(TypeError, match=r"^unsupported dtype object for export$"):
        tb.from_dlpack(p)
    assert len(p.__dlpack__.calls) == 1
    with pytest.raises(TypeError, match="unsupported dtype object for export"):
        tb.asarray(p)


def test_pybind11_refusal_that_lists_every_keyword_propagates():
    """A refusal listing every keyword asked for is not about their names: it propagates."""
    every = PYBIND11_REFUSAL.replace(
        "stream: object = None",
        "stream: object = None, max_version: object = None, dl_device: object = None, "
        "copy: object = None",
    )
    p = PybindProducer(tb.arange(3), refusal=every)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        tb.from_dlpack(p)
    assert len(p.__dlpack__.calls) == 1


def test_onnxruntime_ortvalue():
    """ONNX Runtime's C-level OrtValue (pybind11, ``stream`` only) imports, zero-copy, through
    from_dlpack and asarray, as NumPy imports it."""
    np = pytest.importorskip("numpy")
    ort = pytest.importorskip("onnxruntime")
    a = np.arange(6, dtype=np.float32)
    value = ort.OrtValue.ortvalue_from_numpy(a)._ortvalue
    expected = np.from_dlpack(value)
    for out in (tb.from_dlpack(value), tb.asarray(value), tb.from_dlpack(value, device="cpu")):
        assert out.tolist() == expected.tolist()
        assert out.data_ptr() == expected.ctypes.data
    copied = tb.from_dlpack(value, copy=True)
    assert copied.data_ptr() != expected.ctypes.data
    copied[0] = 9
    assert a[0] == 0


# -------------------------------------------------------------------------------------------------
# __dlpack_device__ spellings
# -------------------------------------------------------------------------------------------------


class _Kind(enum.IntEnum):
    kDLCPU = 1


class DeviceSaysProducer:
    """A host producer whose ``__dlpack_device__`` returns ``device`` as it is."""

    def __init__(self, t, device):
        self.t = t
        self.device = device

    def __dlpack__(self, **kwargs):
        return self.t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device


def _np_int(value):
    np = pytest.importorskip("numpy")
    return np.int32(value)


@pytest.mark.parametrize(
    "device",
    [
        (_Kind.kDLCPU, None),
        (tb.DLDeviceType.kDLCPU, None),
        (1, None),
        (tb.DLDeviceType.kDLCPU, 0),
        (_Kind.kDLCPU, 0),
        [1, None],
        (1,),
        "numpy",
    ],
)
@pytest.mark.parametrize("kwargs", [{}, {"copy": True}, {"copy": False}, {"device": "cpu"}])
def test_host_device_spellings_with_copy_and_device(device, kwargs):
    """(kDLCPU, None) (PaddlePaddle's CPU tensors), IntEnum members, NumPy integers and a missing
    host id are read as (1, 0), with or without copy= and device=."""
    if device == "numpy":
        device = (_np_int(1), _np_int(0))
    t = tb.arange(3)
    out = tb.from_dlpack(DeviceSaysProducer(t, device), **kwargs)
    assert out.tolist() == [0, 1, 2]
    assert out.device == tb.device("cpu")
    assert (out.data_ptr() == t.data_ptr()) is (kwargs.get("copy") is not True)
    assert tb.asarray(DeviceSaysProducer(t, device), **kwargs).tolist() == [0, 1, 2]


@pytest.mark.parametrize("device", [(2, None), (2,), (None, 0), (1, "0"), (1, True), (1.0, 0)])
def test_device_spellings_that_say_nothing_are_refused(device):
    """No id for device memory, or a non-integer, is a TypeError naming the function and the
    producer's method."""
    p = DeviceSaysProducer(tb.arange(3), device)
    with pytest.raises(TypeError, match=r"^from_dlpack\(\): DeviceSaysProducer.__dlpack_device__"):
        tb.from_dlpack(p, copy=True)
    with pytest.raises(TypeError, match=r"^asarray\(\): DeviceSaysProducer.__dlpack_device__"):
        tb.asarray(p, copy=True)


def test_dlpack_pair_normalises_in_one_place():
    """`_device.dlpack_pair` gives plain ints for every accepted spelling."""
    for value in [(_Kind.kDLCPU, None), (1,), [1, 0], (tb.DLDeviceType.kDLCUDA, 3)]:
        pair = _device.dlpack_pair(value, "f", "T")
        assert all(type(v) is int for v in pair)
    assert _device.dlpack_pair((_Kind.kDLCPU, None), "f", "T") == (1, 0)
    assert _device.dlpack_pair((tb.DLDeviceType.kDLCUDAHost, None), "f", "T") == (3, 0)
    with pytest.raises(TypeError, match=r"^f\(\): T.__dlpack_device__\(\) must return"):
        _device.dlpack_pair((2, None), "f", "T")


# -------------------------------------------------------------------------------------------------
# Producers of immutable memory
# -------------------------------------------------------------------------------------------------


def test_immutable_producers_are_decided_by_module():
    """The per-type rule: a type (or a base) from jax, jaxlib or tensorflow is immutable; others
    are not, and no peer is imported to decide."""
    jax_like = type("ArrayImpl", (), {"__module__": "jaxlib._jax"})
    tf_like = type("EagerTensor", (), {"__module__": "tensorflow.python.framework.ops"})
    sub = type("Mine", (tf_like,), {"__module__": "mine"})
    other = type("Thing", (), {"__module__": "jaxx.core"})
    assert _dlpack._immutable(jax_like)
    assert _dlpack._immutable(tf_like)
    assert _dlpack._immutable(sub)
    assert not _dlpack._immutable(other)
    assert not _dlpack._immutable(DeviceSaysProducer)


def test_legacy_capsule_of_an_immutable_type_is_read_only():
    """A legacy capsule from a producer type of an immutable library imports read-only; the same
    capsule from another type is writable (PyTorch's rule); copy=True gives a writable copy."""
    t = tb.arange(3)

    def export(self, **kwargs):
        return tb.utils.dlpack.to_dlpack(t)

    def device(self):
        return (1, 0)

    namespace = {"__dlpack__": export, "__dlpack_device__": device}
    frozen = type("ArrayImpl", (), {**namespace, "__module__": "jaxlib._jax"})
    plain = type("Array", (), {**namespace, "__module__": "mine"})
    out = tb.from_dlpack(frozen())
    assert out.is_readonly
    assert out.data_ptr() == t.data_ptr()
    with pytest.raises(ValueError, match="read-only"):
        out[0] = 9
    assert not tb.from_dlpack(plain()).is_readonly
    assert tb.asarray(frozen()).is_readonly
    copied = tb.from_dlpack(frozen(), copy=True)
    assert not copied.is_readonly
    assert copied.data_ptr() != t.data_ptr()


def test_jax_array_imports_read_only():
    """A JAX array imports read-only and zero-copy through from_dlpack and asarray; a write raises
    and leaves the array as it was; .numpy() is a read-only view, .torch() refuses without force=;
    copy=True is writable and independent."""
    jnp = pytest.importorskip("jax.numpy")
    np = pytest.importorskip("numpy")
    x = jnp.arange(5.0)
    address = x.unsafe_buffer_pointer()
    for t in (tb.from_dlpack(x), tb.asarray(x), tb.from_dlpack(x, device="cpu")):
        assert t.is_readonly
        assert t.data_ptr() == address
        with pytest.raises(ValueError, match="read-only"):
            t[0] = 99
    n = tb.asarray(x).numpy()
    assert not n.flags.writeable
    assert np.shares_memory(n, np.asarray(x))
    with pytest.raises(ValueError, match="read-only"):
        n[0] = 99
    torch = pytest.importorskip("torch")
    with pytest.raises(BufferError, match="read-only"):
        tb.asarray(x).torch()
    forced = tb.asarray(x).torch(force=True)
    forced[0] = 99
    assert isinstance(forced, torch.Tensor)
    for copied in (tb.from_dlpack(x, copy=True), tb.asarray(x, copy=True)):
        assert not copied.is_readonly
        assert copied.data_ptr() != address
        copied[0] = 99
        assert copied.tolist()[0] == 99
    assert np.asarray(x).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


# TensorFlow and PaddlePaddle cannot share a process (importing Paddle after TensorFlow crashes):
# their checks run in a child.
_TF_CHECKS = """
import numpy as np
import tensorflow as tf
import tensorbridge as tb

x = tf.constant([1.0, 2.0, 3.0])
address = np.asarray(memoryview(x)).__array_interface__["data"][0]
for t in (tb.from_dlpack(x), tb.asarray(x)):
    assert t.is_readonly, t
    assert t.data_ptr() == address
    try:
        t[0] = 99
    except ValueError as exc:
        assert "read-only" in str(exc), exc
    else:
        raise AssertionError("a write went through")
n = tb.from_dlpack(x).numpy()
assert not n.flags.writeable
try:
    n[0] = 99
except ValueError:
    pass
else:
    raise AssertionError("a write went through .numpy()")
try:
    tb.from_dlpack(x).torch()
except BufferError as exc:
    assert "read-only" in str(exc), exc
except ImportError:
    pass
else:
    raise AssertionError(".torch() shared read-only memory")
assert x.numpy().tolist() == [1.0, 2.0, 3.0]
for copied in (tb.from_dlpack(x, copy=True), tb.asarray(x, copy=True)):
    assert not copied.is_readonly
    assert copied.data_ptr() != address
    copied[0] = 7
assert x.numpy().tolist() == [1.0, 2.0, 3.0]
# TensorFlow refuses any dl_device; a host tensor asked onto the host is not told it
for moved in (tb.from_dlpack(x, device="cpu"), tb.asarray(x, device="cpu")):
    assert moved.is_readonly and moved.data_ptr() == address
print("OK")
"""

_PADDLE_CHECKS = """
import paddle
import tensorbridge as tb

x = paddle.to_tensor([1.0, 2.0, 3.0])
assert x.__dlpack_device__()[1] is None, x.__dlpack_device__()
plain = tb.from_dlpack(x)
for kwargs in ({"copy": True}, {"copy": False}, {"device": "cpu"}):
    out = tb.from_dlpack(x, **kwargs)
    assert out.tolist() == [1.0, 2.0, 3.0], out
    assert (out.data_ptr() == plain.data_ptr()) is (kwargs.get("copy") is not True), kwargs
    assert tb.asarray(x, **kwargs).tolist() == [1.0, 2.0, 3.0]
print("OK")
"""


def _skip_unless_installed(module):
    """Skip without importing ``module`` here (it is imported in the child only)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


@pytest.mark.parametrize(("module", "checks"), [("tensorflow", _TF_CHECKS)])
def test_tensorflow_tensor_imports_read_only(subprocess_run, module, checks):
    """A TensorFlow tensor imports read-only and zero-copy; writes raise and leave the constant
    as it was; copy=True is writable and independent (checked in a child process)."""
    _skip_unless_installed(module)
    result = subprocess_run(textwrap.dedent(checks), timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), (
        result.stdout[-3000:] + result.stderr[-3000:]
    )


def test_paddle_cpu_tensor_with_copy_and_device(subprocess_run):
    """PaddlePaddle's CPU tensors say (kDLCPU, None); copy= and device= import them (checked in a
    child process)."""
    _skip_unless_installed("paddle")
    result = subprocess_run(textwrap.dedent(_PADDLE_CHECKS), timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), (
        result.stdout[-3000:] + result.stderr[-3000:]
    )
