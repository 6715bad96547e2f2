"""Devices: a value type naming where memory lives, and the DLPack device-type enum."""

from __future__ import annotations

import builtins
import enum
import operator
from typing import Any, Final

from ._errors import short_repr

__all__ = ["ADDRESSABLE_TYPES", "HOST_TYPES", "DLDeviceType", "Device", "device", "dlpack_pair"]


class DLDeviceType(enum.IntEnum):
    """DLPack ``DLDeviceType`` (dlpack.h v1.3). Values 5 and 6 are unassigned."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14
    kDLWebGPU = 15
    kDLHexagon = 16
    kDLMAIA = 17
    kDLTrn = 18


# Device types whose memory the host reads directly (DLPack producers get no ``stream`` for them).
HOST_TYPES: Final = frozenset(
    int(d)
    for d in (
        DLDeviceType.kDLCPU,
        DLDeviceType.kDLCUDAHost,
        DLDeviceType.kDLROCMHost,
        DLDeviceType.kDLCUDAManaged,
    )
)
# Device types whose pointers are addresses in a linear address space, so that ``data + offset``
# is the first element. Elsewhere (OpenCL ``cl_mem``, Metal ``MTLBuffer``, Vulkan, WebGPU, ...)
# a pointer may be an opaque handle: an offset cannot be added to it (pytorch/pytorch#168193).
ADDRESSABLE_TYPES: Final = HOST_TYPES | {
    int(DLDeviceType.kDLCUDA),
    int(DLDeviceType.kDLROCM),
    int(DLDeviceType.kDLOneAPI),
}


def dlpack_pair(value: Any, api: str, owner: str) -> tuple[int, int]:
    """What a producer's ``__dlpack_device__()`` returned, as a ``(device_type, device_id)`` pair
    of Python ints: the one reading of that pair, for every caller.

    Producers disagree on the spelling: PyTorch returns `IntEnum` members, PaddlePaddle returns
    ``(kDLCPU, None)`` for its CPU tensors, others return NumPy integers or a list. Accepted: a
    tuple or list of two integers (anything with ``__index__`` but `bool`); on a host device
    (`HOST_TYPES`) the id may be None or missing (a one-element sequence), and means 0, the only
    host device. Anything else is a `TypeError` naming ``api`` (the function the user called) and
    the producer type ``owner``.
    """
    if type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is int:
        return value  # the common spelling, as it is
    if isinstance(value, (tuple, list)) and len(value) in (1, 2):
        kind = _as_index(value[0])
        given = value[1] if len(value) == 2 else None
        index = 0 if given is None and kind in HOST_TYPES else _as_index(given)
        if kind is not None and index is not None:
            return kind, index
    msg = (
        f"{api}(): {owner}.__dlpack_device__() must return a (device_type, device_id) tuple of "
        f"ints (device_id may be None for host memory); got {short_repr(value)}. The producer is "
        f"broken; pass its capsule (__dlpack__()) instead."
    )
    raise TypeError(msg)


def _as_index(value: Any) -> int | None:
    """``value`` as a Python int (an `IntEnum` member, a NumPy integer); None for a `bool` or a
    non-integer."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


# tensorbridge device-type names, one per DLPack device type. Device types that PyTorch names
# differently are accepted under PyTorch's name too (_ALIASES).
_NAME_OF: Final[dict[DLDeviceType, str]] = {
    DLDeviceType.kDLCPU: "cpu",
    DLDeviceType.kDLCUDA: "cuda",
    DLDeviceType.kDLCUDAHost: "cuda_host",
    DLDeviceType.kDLOpenCL: "opencl",
    DLDeviceType.kDLVulkan: "vulkan",
    DLDeviceType.kDLMetal: "metal",
    DLDeviceType.kDLVPI: "vpi",
    DLDeviceType.kDLROCM: "rocm",
    DLDeviceType.kDLROCMHost: "rocm_host",
    DLDeviceType.kDLExtDev: "ext_dev",
    DLDeviceType.kDLCUDAManaged: "cuda_managed",
    DLDeviceType.kDLOneAPI: "oneapi",
    DLDeviceType.kDLWebGPU: "webgpu",
    DLDeviceType.kDLHexagon: "hexagon",
    DLDeviceType.kDLMAIA: "maia",
    DLDeviceType.kDLTrn: "trn",
}
_TYPE_OF: Final[dict[str, DLDeviceType]] = {name: code for code, name in _NAME_OF.items()}
_ALIASES: Final[dict[str, str]] = {"mps": "metal", "xpu": "oneapi", "hip": "rocm"}

# The largest device index: DLPack's DLDevice.device_id is an int32_t.
_MAX_INDEX: Final = 2**31 - 1

# Memory a host CPU may read and write directly (the set NumPy's from_dlpack accepts).
_HOST_ACCESSIBLE: Final = frozenset(
    {
        DLDeviceType.kDLCPU,
        DLDeviceType.kDLCUDAHost,
        DLDeviceType.kDLROCMHost,
        DLDeviceType.kDLCUDAManaged,
    }
)


class Device:
    """Where a tensor's memory lives: ``device(type='cuda', index=1)``.

    ``tb.device("cpu")``, ``tb.device("cuda", 1)``, ``tb.device("cuda:1")`` and ``tb.device(other_device)``
    are accepted. PyTorch's names ``mps``, ``xpu`` and ``hip`` map to the DLPack device types
    Metal, oneAPI and ROCm.

    """

    __slots__ = ("_dlpack", "_index", "_type")

    _type: str
    _index: int | None
    _dlpack: tuple[DLDeviceType, int]  # what `to_dlpack` returns, made once

    def __new__(cls, type: Device | str, index: int | None = None) -> Device:
        """A device, as ``torch.device`` makes one.

        Args:
            type: a device type (``"cpu"``, ``"cuda"``, ...), a ``"type:index"`` string, or a
                `Device`.
            index: the device's index (``tb.device("cuda", 1)``); None for the default or for a
                string that names it.
        """
        if isinstance(type, Device):
            if index is not None:
                msg = f"device(): index given twice; got {type!r} and index={index!r}. Pass one of them."
                raise TypeError(msg)
            return type
        if not isinstance(type, str):
            msg = (  # type: ignore[unreachable]  # checked at run time too
                f"device(): expected a device string such as 'cpu' or 'cuda:0'; got "
                f"{type!r} ({builtins_type_name(type)})."
            )
            raise TypeError(msg)
        name, sep, idx = type.partition(":")
        if sep:
            if index is not None:
                msg = (
                    f"device(): type (string) must not include an index because index was passed "
                    f"explicitly: {type}; got index={index!r} too. Pass one of them."
                )
                raise ValueError(msg)
            # ASCII digits without a leading zero, as PyTorch's parser ("cuda:01" is invalid there).
            if not (idx.isascii() and idx.isdigit()) or (len(idx) > 1 and idx[0] == "0"):
                msg = (
                    f"device(): Invalid device string: {type!r}; expected 'type' or 'type:index' like "
                    f"'cuda:0'."
                )
                raise ValueError(msg)
            index = int(idx)
        name = _ALIASES.get(name, name)
        if name not in _TYPE_OF:
            msg = (
                f"device(): Expected one of {', '.join(sorted(_TYPE_OF))} device type at start of device "
                f"string: {type}"
            )
            raise ValueError(msg)
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int):
                msg = f"device(): index must be an int; got {index!r}."
                raise TypeError(msg)
            if index < 0:
                msg = f"device(): Device index must not be negative; got {index!r}."
                raise ValueError(msg)
            if index > _MAX_INDEX:
                # DLPack's device_id is an int32_t. (PyTorch 2.13 keeps an int8 and wraps: index 128
                # becomes -128.)
                msg = (
                    f"device(): Device index must fit in a 32-bit int (at most {_MAX_INDEX}); got "
                    f"{index!r}. Pass the index of an existing device."
                )
                raise ValueError(msg)
        self = super().__new__(cls)
        object.__setattr__(self, "_type", name)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_dlpack", (_TYPE_OF[name], index or 0))
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        msg = f"Device is immutable; cannot set {name!r}"
        raise AttributeError(msg)

    @property
    def type(self) -> str:
        """The device type name (``"cpu"``, ``"cuda"``, ...)."""
        return self._type

    @property
    def index(self) -> int | None:
        """The device number, or None when not given."""
        return self._index

    @property
    def dlpack_type(self) -> DLDeviceType:
        """The DLPack device type."""
        return _TYPE_OF[self._type]

    @property
    def is_host_accessible(self) -> bool:
        """True when the host CPU may dereference this memory."""
        return _TYPE_OF[self._type] in _HOST_ACCESSIBLE

    def to_dlpack(self) -> tuple[DLDeviceType, int]:
        """``(device_type, device_id)`` as ``__dlpack_device__`` reports it (id 0 when unnumbered)."""
        return self._dlpack

    @classmethod
    def from_dlpack(cls, device_type: int, device_id: int) -> Device:
        """The device for a DLPack ``(device_type, device_id)``; unknown types are a `BufferError`."""
        try:
            code = DLDeviceType(device_type)
        except ValueError:
            msg = f"Unsupported device_type: {device_type}"
            raise BufferError(msg) from None
        if code == DLDeviceType.kDLCPU:
            return CPU
        return cls(_NAME_OF[code], device_id if device_id >= 0 else None)

    def __eq__(self, other: object) -> bool:
        # A device also equals its canonical string ("cuda:1"), and hashes as that string, so that
        # equal objects hash equal (an alias such as "mps" is not the canonical "metal").
        if isinstance(other, str):
            return str(self) == other
        if not isinstance(other, Device):
            return NotImplemented
        return self._type == other._type and self._index == other._index

    def __hash__(self) -> int:
        return hash(str(self))

    def __repr__(self) -> str:
        if self._index is None:
            return f"device(type='{self._type}')"
        return f"device(type='{self._type}', index={self._index})"

    def __str__(self) -> str:
        return self._type if self._index is None else f"{self._type}:{self._index}"

    def __reduce__(self) -> tuple[builtins.type[Device], tuple[str, int | None]]:
        return Device, (self._type, self._index)


def builtins_type_name(value: object) -> str:
    return type(value).__name__


device = Device
CPU: Final = Device("cpu")


def as_device(value: object, api: str) -> Device:
    """Validate a ``device=`` argument (a `Device`, a string or an ``int`` CUDA index as PyTorch allows)."""
    if isinstance(value, Device):
        return value
    if isinstance(value, str):
        return Device(value)
    if isinstance(value, int) and not isinstance(value, bool):  # negative: Device raises ValueError
        return Device("cuda", value)
    msg = (
        f"{api}(): device must be a tensorbridge.device or a string like 'cpu' or 'cuda:0'; "
        f"got {value!r} ({type(value).__name__})."
    )
    raise TypeError(msg)
