"""Shared test configuration: hypothesis profiles, the layout matrix, and a subprocess runner."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100)
settings.register_profile(
    "ci",
    max_examples=500,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def run_in_subprocess(code: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, so that a crash fails the test instead of killing the run."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def subprocess_run():
    """The `run_in_subprocess` helper as a fixture."""
    return run_in_subprocess


def _layout_cases():
    """(name, builder) pairs: each builder returns a tensorbridge tensor with a distinctive layout."""
    import tensorbridge as tb

    def base(n=24, dtype=None):
        return tb.arange(n, dtype=dtype or tb.int32)

    return {
        "c_order": lambda: base().reshape(2, 3, 4),
        "f_order": lambda: base().reshape(4, 3, 2).permute(2, 1, 0),
        "sliced": lambda: base().reshape(4, 6)[1:3, ::2],
        "negative_step": lambda: base().reshape(4, 6)[::-1, ::-2],
        "zero_d": lambda: base()[5],
        "empty": lambda: base().reshape(4, 6)[:, 6:],
        "size1_odd_stride": lambda: base().as_strided((3, 1), (2, 7)),
        "broadcast": lambda: base(4).reshape(1, 4).expand(3, 4),
        "offset": lambda: base()[7:],
    }


@pytest.fixture(
    params=[
        "c_order",
        "f_order",
        "sliced",
        "negative_step",
        "zero_d",
        "empty",
        "size1_odd_stride",
        "broadcast",
        "offset",
    ]
)
def layout(request):
    """A tensorbridge tensor of each layout in the matrix."""
    return request.param, _layout_cases()[request.param]()


# -------------------------------------------------------------------------------------------------
# DLPack: a producer crafted with ctypes (tests/test_dlpack*.py, and child interpreters that import
# this file by path). Every field of the managed struct can be set to any value; deleter calls are
# counted.
# -------------------------------------------------------------------------------------------------

import ctypes as _ct  # noqa: E402 (appended section)
import struct as _struct  # noqa: E402
from typing import ClassVar  # noqa: E402

_api = _ct.pythonapi
_vp, _py, _cp = _ct.c_void_p, _ct.py_object, _ct.c_char_p
_capsule_new = _ct.PYFUNCTYPE(_py, _vp, _cp, _vp)(("PyCapsule_New", _api))
_capsule_name = _ct.PYFUNCTYPE(_vp, _vp)(("PyCapsule_GetName", _api))
_capsule_name_of = _ct.PYFUNCTYPE(_vp, _py)(("PyCapsule_GetName", _api))
_capsule_pointer = _ct.PYFUNCTYPE(_vp, _vp, _vp)(("PyCapsule_GetPointer", _api))
_capsule_pointer_of = _ct.PYFUNCTYPE(_vp, _py, _cp)(("PyCapsule_GetPointer", _api))
_DLDeleter = _ct.CFUNCTYPE(None, _vp)
_CapsuleDestructor = _ct.CFUNCTYPE(None, _vp)


class _DLTensor(_ct.Structure):
    _fields_ = (
        ("data", _vp),
        ("device_type", _ct.c_int32),
        ("device_id", _ct.c_int32),
        ("ndim", _ct.c_int32),
        ("code", _ct.c_uint8),
        ("bits", _ct.c_uint8),
        ("lanes", _ct.c_uint16),
        ("shape", _vp),
        ("strides", _vp),
        ("byte_offset", _ct.c_uint64),
    )


class _Versioned(_ct.Structure):
    _fields_ = (
        ("major", _ct.c_uint32),
        ("minor", _ct.c_uint32),
        ("manager_ctx", _vp),
        ("deleter", _vp),
        ("flags", _ct.c_uint64),
        ("dl_tensor", _DLTensor),
    )


class _Legacy(_ct.Structure):
    _fields_ = (("dl_tensor", _DLTensor), ("manager_ctx", _vp), ("deleter", _vp))


class CraftedDLPack:
    """A DLPack producer made of ctypes objects, for tests.

    ``CraftedDLPack(values, ...)`` lays out ``values`` (packed with struct ``fmt``) in a ctypes
    buffer and describes them with a ``DLManagedTensorVersioned`` (or legacy ``DLManagedTensor``)
    whose every field can be overridden. ``capsule`` is a fresh capsule; its destructor, like
    NumPy's, calls the deleter only while the capsule still has its unused name. ``deleter_calls``
    counts deleter runs. The object is also a producer (``__dlpack__``), handing out its capsule.
    """

    live: ClassVar[dict] = {}  # managed address -> producer, until its deleter runs
    double_calls: ClassVar[int] = 0  # deleter calls for an address already released

    def __init__(
        self,
        values=(1.0, 2.0, 3.0, 4.0),
        *,
        fmt="f",
        dtype=(2, 32, 1),
        shape=None,
        strides=None,
        versioned=True,
        version=(1, 3),
        flags=0,
        device=(1, 0),
        byte_offset=0,
        data=None,
        ndim=None,
        null_shape=False,
        null_strides=False,
        deleter=True,
        name=None,
        destructor=True,
    ):
        raw = _struct.pack(f"<{len(values)}{fmt}", *values) if values else b""
        self.buffer = (_ct.c_char * max(len(raw) + byte_offset, 1))()
        _ct.memmove(_ct.addressof(self.buffer) + byte_offset, raw, len(raw))
        shape = (len(values),) if shape is None else tuple(shape)
        ndim = len(shape) if ndim is None else ndim
        self.shape = (_ct.c_int64 * max(len(shape), 1))(*shape)
        self.strides = None if strides is None else (_ct.c_int64 * max(len(strides), 1))(*strides)
        self.deleter_calls = 0
        self.versioned = versioned
        managed = _Versioned() if versioned else _Legacy()
        self.managed = managed
        dl = managed.dl_tensor
        dl.data = _ct.addressof(self.buffer) if data is None else data
        dl.device_type, dl.device_id = device
        dl.ndim = ndim
        dl.code, dl.bits, dl.lanes = dtype
        dl.shape = None if null_shape else _ct.addressof(self.shape)
        no_strides = null_strides or self.strides is None
        dl.strides = None if no_strides else _ct.addressof(self.strides)
        dl.byte_offset = byte_offset
        managed.deleter = _CRAFTED_DELETER_ADDRESS if deleter else None
        if versioned:
            managed.major, managed.minor = version
            managed.flags = flags
        self.address = _ct.addressof(managed)
        CraftedDLPack.live[self.address] = self
        default_name = b"dltensor_versioned" if versioned else b"dltensor"
        self.name = name if name is not None else default_name
        _NAMES.append(self.name)  # the capsule keeps a pointer to its name: keep the bytes alive
        destructor_address = _CRAFTED_DESTRUCTOR_ADDRESS if destructor else None
        self.capsule = _capsule_new(self.address, self.name, destructor_address)

    @property
    def consumed(self):
        """True once a consumer renamed the capsule to ``used_*``."""
        return _ct.string_at(_capsule_name_of(self.capsule)).startswith(b"used_")

    def take_capsule(self):
        """The capsule, with this object's reference dropped (the caller's is the only one)."""
        capsule, self.capsule = self.capsule, None
        return capsule

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self.take_capsule()

    def __dlpack_device__(self):
        return (self.managed.dl_tensor.device_type, self.managed.dl_tensor.device_id)


_NAMES: list = []


@_DLDeleter
def _crafted_deleter(address):
    producer = CraftedDLPack.live.pop(address, None)
    if producer is not None:
        producer.deleter_calls += 1
    else:
        CraftedDLPack.double_calls += 1


@_CapsuleDestructor
def _crafted_destructor(
    capsule,
    _finalizing=sys.is_finalizing,
    _name=_capsule_name,
    _string_at=_ct.string_at,
    _pointer=_capsule_pointer,
    _deleter=_crafted_deleter,
):
    if _finalizing():
        return  # like a C producer at exit: leak rather than run code in a dying interpreter
    name = _name(capsule)
    if name and _string_at(name) in (b"dltensor", b"dltensor_versioned"):
        _deleter(_pointer(capsule, name))


_CRAFTED_DELETER_ADDRESS = _ct.cast(_crafted_deleter, _vp).value
_CRAFTED_DESTRUCTOR_ADDRESS = _ct.cast(_crafted_destructor, _vp).value


@pytest.fixture
def crafted():
    """The `CraftedDLPack` class: ctypes-built DLPack producers with counted deleter calls."""
    yield CraftedDLPack
    double, CraftedDLPack.double_calls = CraftedDLPack.double_calls, 0
    assert double == 0, f"{double} deleter call(s) for managed tensors already released"


class CountingExporter:
    """Wraps a tensorbridge tensor as a producer whose capsules' deleter calls are counted.

    ``__dlpack__`` asks the tensor for a capsule, then points the managed struct's ``deleter`` at a
    counting trampoline that forwards to tensorbridge's own deleter, so a test sees how often a
    consumer (NumPy, PyTorch, JAX, ...) calls it.
    """

    stray_calls: ClassVar[int] = 0  # deleter calls for an address already released

    def __init__(self, tensor):
        self.tensor = tensor
        self.calls = {}  # managed address -> number of deleter calls
        self.kwargs = []

    def __dlpack__(self, **kwargs):
        self.kwargs.append(kwargs)
        capsule = self.tensor.__dlpack__(**kwargs)
        name = _ct.string_at(_capsule_name_of(capsule))
        address = _capsule_pointer_of(capsule, name)
        mirror = _Versioned if name == b"dltensor_versioned" else _Legacy
        managed = mirror.from_address(address)
        _FORWARD[address] = (managed.deleter, self)
        self.calls[address] = 0
        managed.deleter = _COUNTING_DELETER_ADDRESS
        return capsule

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()

    @property
    def total(self):
        """Deleter calls over every capsule handed out."""
        return sum(self.calls.values())


_FORWARD: dict = {}


@_DLDeleter
def _counting_deleter(address):
    original, exporter = _FORWARD.pop(address, (None, None))
    if exporter is None:
        CountingExporter.stray_calls += 1
        return
    exporter.calls[address] += 1
    _DLDeleter(original)(address)


_COUNTING_DELETER_ADDRESS = _ct.cast(_counting_deleter, _vp).value


@pytest.fixture
def counting_exporter():
    """The `CountingExporter` class: counts a consumer's calls of tensorbridge's deleter."""
    yield CountingExporter
    stray, CountingExporter.stray_calls = CountingExporter.stray_calls, 0
    assert stray == 0, f"{stray} deleter call(s) for capsules already released"
