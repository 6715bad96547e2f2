"""Devices: parsing, equality and hashing, and the mapping to and from DLPack device types."""

from __future__ import annotations

import copy
import pickle

import pytest

import tensorbridge as tb
from tensorbridge._device import _ALIASES, CPU, Device, DLDeviceType, as_device


@pytest.fixture(scope="module")
def torch():
    """PyTorch, the reference for device strings and messages."""
    return pytest.importorskip("torch")


_TYPES = {  # every device type name and its DLPack code (dlpack.h v1.3)
    "cpu": 1,
    "cuda": 2,
    "cuda_host": 3,
    "opencl": 4,
    "vulkan": 7,
    "metal": 8,
    "vpi": 9,
    "rocm": 10,
    "rocm_host": 11,
    "ext_dev": 12,
    "cuda_managed": 13,
    "oneapi": 14,
    "webgpu": 15,
    "hexagon": 16,
    "maia": 17,
    "trn": 18,
}


def test_dldevicetype_values_follow_dlpack_h():
    """DLDeviceType holds dlpack.h's numbers (5 and 6 unassigned) and equals torch's enum where both have one."""
    assert {m.name: m.value for m in DLDeviceType} == {
        "kDLCPU": 1,
        "kDLCUDA": 2,
        "kDLCUDAHost": 3,
        "kDLOpenCL": 4,
        "kDLVulkan": 7,
        "kDLMetal": 8,
        "kDLVPI": 9,
        "kDLROCM": 10,
        "kDLROCMHost": 11,
        "kDLExtDev": 12,
        "kDLCUDAManaged": 13,
        "kDLOneAPI": 14,
        "kDLWebGPU": 15,
        "kDLHexagon": 16,
        "kDLMAIA": 17,
        "kDLTrn": 18,
    }
    assert tb.utils.dlpack.DLDeviceType is DLDeviceType


def test_dldevicetype_matches_torch(torch):
    """Every member torch's DLDeviceType has carries the same value here."""
    for member in torch.utils.dlpack.DLDeviceType:
        assert DLDeviceType[member.name].value == member.value


@pytest.mark.parametrize(
    ("args", "type_", "index"),
    [
        (("cpu",), "cpu", None),
        (("cuda",), "cuda", None),
        (("cuda", 1), "cuda", 1),
        (("cuda:1",), "cuda", 1),
        (("cpu:0",), "cpu", 0),
        (("cuda:10",), "cuda", 10),
        (("mps",), "metal", None),
        (("xpu:2",), "oneapi", 2),
        (("hip",), "rocm", None),
        (("cuda", 0), "cuda", 0),
    ],
)
def test_parsing(args, type_, index):
    """device() takes a type, 'type:index', or a type and an index; PyTorch's aliases map to DLPack names."""
    d = tb.device(*args)
    assert (d.type, d.index) == (type_, index)
    assert tb.device(d) is d


@pytest.mark.parametrize("text", ["cpu", "cuda", "cuda:1", "cpu:0", "cuda:10"])
def test_parsing_agrees_with_torch(torch, text):
    """type, index, str and repr equal torch.device's for the names both know."""
    ours, theirs = tb.device(text), torch.device(text)
    assert (ours.type, ours.index, str(ours), repr(ours)) == (
        theirs.type,
        theirs.index,
        str(theirs),
        repr(theirs),
    )


@pytest.mark.parametrize(
    ("args", "exc", "text"),
    [
        (("cuda:01",), ValueError, "Invalid device string: 'cuda:01'"),
        (("cuda:-1",), ValueError, "Invalid device string: 'cuda:-1'"),
        (("cuda:x",), ValueError, "Invalid device string: 'cuda:x'"),
        (("cuda:",), ValueError, "Invalid device string: 'cuda:'"),
        (("cuda:1:2",), ValueError, "Invalid device string: 'cuda:1:2'"),
        (
            ("cuda:\u00b9",),
            ValueError,
            "Invalid device string",
        ),  # a superscript one is a digit, not an index
        (("foo",), ValueError, "device type at start of device string: foo"),
        (("CUDA",), ValueError, "device type at start of device string: CUDA"),
        ((" cuda",), ValueError, "device type at start of device string:  cuda"),
        (("cuda", -1), ValueError, "Device index must not be negative"),
        (
            ("cuda:1", 1),
            ValueError,
            "type (string) must not include an index because index was passed explicitly",
        ),
        (("cuda", True), TypeError, "index must be an int; got True"),
        (("cuda", "1"), TypeError, "index must be an int; got '1'"),
        ((1,), TypeError, "expected a device string such as 'cpu' or 'cuda:0'; got 1 (int)"),
        ((None,), TypeError, "got None (NoneType)"),
    ],
)
def test_bad_devices(args, exc, text):
    """Bad device strings and indices raise clear errors naming device() and the value."""
    with pytest.raises(exc) as info:
        tb.device(*args)
    assert text in str(info.value)
    assert str(info.value).startswith("device()")


@pytest.mark.parametrize("text", ["cuda:01", "cuda:-1", "cuda:x", "foo", "cuda:1:2"])
def test_bad_strings_carry_torch_text(torch, text):
    """Where torch.device refuses a string, our message contains its text."""
    with pytest.raises(RuntimeError) as theirs:
        torch.device(text)
    with pytest.raises(ValueError) as ours:
        tb.device(text)
    torch_text = str(theirs.value)
    if torch_text.startswith("Expected one of"):  # the lists of device types differ
        torch_text = torch_text[torch_text.index("device type at start") :]
    assert torch_text in str(ours.value)


def test_equality_and_hashing():
    """Devices compare by (type, index), equal their canonical string, and hash consistently with both."""
    assert tb.device("cuda", 1) == tb.device("cuda:1")
    assert tb.device("cuda") != tb.device("cuda:0")
    assert tb.device("cpu") != tb.device("cuda")
    assert tb.device("cuda:1") == "cuda:1" and tb.device("cpu") == "cpu"
    assert tb.device("cpu") != "cpu:0" and tb.device("cpu") != "not a device"
    assert tb.device("mps") != "mps"  # only the canonical string ("metal") is equal...
    assert tb.device("mps") == tb.device("metal")  # ...the devices are the same
    for d in (tb.device("cpu"), tb.device("cuda:3"), tb.device("metal")):
        assert hash(d) == hash(tb.device(str(d))) == hash(str(d))
    assert len({tb.device("cuda:1"), tb.device("cuda", 1), "cuda:1"}) == 1
    assert tb.device("cpu") != 1


def test_devices_are_immutable_and_picklable():
    """Devices cannot change; copies and pickles are equal."""
    d = tb.device("cuda:2")
    with pytest.raises(AttributeError, match="Device is immutable"):
        d.index = 3  # type: ignore[misc]
    assert copy.copy(d) == d and copy.deepcopy(d) == d
    assert pickle.loads(pickle.dumps(d)) == d
    assert tb.Device is Device and tb.device is Device


@pytest.mark.parametrize(("name", "code"), list(_TYPES.items()))
def test_dlpack_round_trip(name, code):
    """Each device type maps to its DLPack code and back, numbered and unnumbered."""
    numbered = tb.device(name, 3)
    assert numbered.dlpack_type == code
    assert numbered.to_dlpack() == (code, 3)
    assert isinstance(numbered.to_dlpack()[0], DLDeviceType)
    back = Device.from_dlpack(code, 3)
    assert back == (CPU if code == 1 else numbered)
    assert tb.device(name).to_dlpack() == (
        code,
        0,
    )  # unnumbered devices report id 0, as PyTorch does


def test_host_accessible_devices():
    """Only CPU, CUDA/ROCm host-pinned and CUDA managed memory is readable on the host."""
    readable = {name for name in _TYPES if tb.device(name).is_host_accessible}
    assert readable == {"cpu", "cuda_host", "rocm_host", "cuda_managed"}


@pytest.mark.parametrize("code", [0, 5, 6, 19, 255, -1])
def test_unknown_dlpack_device_types(code):
    """Unassigned DLPack device types are BufferError with PyTorch's text."""
    with pytest.raises(BufferError, match=f"Unsupported device_type: {code}"):
        Device.from_dlpack(code, 0)


def test_cpu_export_matches_torch(torch):
    """tensorbridge's CPU device reports what torch's __dlpack_device__ reports."""
    assert tb.arange(3).__dlpack_device__() == torch.arange(3).__dlpack_device__()
    assert CPU.to_dlpack() == (DLDeviceType.kDLCPU, 0)


def test_as_device():
    """as_device takes devices, strings and CUDA ordinals; anything else is a TypeError naming the API."""
    assert as_device(CPU, "f") is CPU
    assert as_device("cuda:1", "f") == tb.device("cuda", 1)
    assert as_device(2, "f") == tb.device("cuda:2")
    with pytest.raises(ValueError, match="Device index must not be negative"):
        as_device(-1, "f")
    for bad in (True, 1.0, None, [0]):
        with pytest.raises(
            TypeError, match=r"f\(\): device must be a tensorbridge.device or a string"
        ):
            as_device(bad, "f")
    assert set(_ALIASES) == {"mps", "xpu", "hip"}


def test_device_index_must_fit_in_int32():
    """An index past DLPack's int32 device_id is refused (PyTorch silently wraps it)."""
    assert tb.device("cuda", 2**31 - 1).index == 2**31 - 1
    for args in (("cuda", 2**31), ("cuda:2147483648",), ("cuda", 2**64)):
        with pytest.raises(ValueError, match="Device index must fit in a 32-bit int"):
            tb.device(*args)
