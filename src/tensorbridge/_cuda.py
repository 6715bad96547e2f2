"""The CUDA driver (``libcuda``), loaded with ctypes on first use: the few calls tensorbridge makes.

tensorbridge launches no work and allocates no device memory. It needs the driver for three things,
all about CUDA memory that another library owns:

* the device a pointer belongs to (``__cuda_array_interface__`` import);
* a host-side wait for a stream (the CUDA Array Interface v3 ``stream`` entry);
* ordering a consumer's raw stream after the legacy default stream (``__dlpack__(stream=...)`` of a
  CUDA tensor), with an event.

Nothing is loaded until one of them is needed, so tensorbridge has no CUDA dependency. Each call runs
in the primary context of the device it concerns, made current for the call and then popped, so the
caller's current context is left as it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["Driver", "driver"]

_DRIVER_NAMES: Final = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")

CUDA_ERROR_INVALID_CONTEXT: Final = 201
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: Final = 9
CU_EVENT_DISABLE_TIMING: Final = 2
CU_STREAM_LEGACY: Final = 1
# Stream handles that mean "a default stream of the current context" (legacy, per-thread).
DEFAULT_STREAMS: Final = (1, 2)


class Driver:
    """The driver entry points tensorbridge uses, bound on a library object of its own.

    ``lib`` is a `ctypes.CDLL` loaded for tensorbridge alone, so setting ``restype``/``argtypes`` on
    its functions affects no other library (unlike ``ctypes.pythonapi``, whose prototypes every
    package in the process shares). ctypes
    releases the GIL during each call, so a stream wait does not block other threads.
    """

    def __init__(self, lib: Any) -> None:
        vp, pvp, cint, cuint = (
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_uint,
        )

        def bind(name: str, *argtypes: Any) -> Any:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = ctypes.c_int, argtypes  # CUresult
            return fn

        self.cuInit = bind("cuInit", cuint)
        self.cuGetErrorName = bind("cuGetErrorName", cint, ctypes.POINTER(ctypes.c_char_p))
        self.cuDeviceGet = bind("cuDeviceGet", ctypes.POINTER(cint), cint)
        self.cuDevicePrimaryCtxRetain = bind("cuDevicePrimaryCtxRetain", pvp, cint)
        self.cuDevicePrimaryCtxRelease = bind("cuDevicePrimaryCtxRelease_v2", cint)
        self.cuCtxPushCurrent = bind("cuCtxPushCurrent_v2", vp)
        self.cuCtxPopCurrent = bind("cuCtxPopCurrent_v2", pvp)
        self.cuPointerGetAttribute = bind("cuPointerGetAttribute", vp, cint, ctypes.c_uint64)
        self.cuStreamSynchronize = bind("cuStreamSynchronize", vp)
        self.cuEventCreate = bind("cuEventCreate", pvp, cuint)
        self.cuEventRecord = bind("cuEventRecord", vp, vp)
        self.cuEventDestroy = bind("cuEventDestroy_v2", vp)
        self.cuStreamWaitEvent = bind("cuStreamWaitEvent", vp, vp, cuint)

    def check(self, rc: int, what: str, api: str) -> None:
        """Raise `BufferError` naming ``what`` and the CUDA error when ``rc`` is not success."""
        if rc == 0:
            return
        text = ctypes.c_char_p()
        found = self.cuGetErrorName(rc, ctypes.byref(text)) == 0 and text.value
        name = f" ({text.value.decode()})" if found and text.value else ""
        msg = f"{api}(): {what} failed with CUDA error {rc}{name}."
        raise BufferError(msg)

    @contextlib.contextmanager
    def primary_context(self, ordinal: int, api: str) -> Iterator[None]:
        """Make the primary context of device ``ordinal`` current (retained) for the ``with`` block."""
        device, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet", api)
        self.check(
            self.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device),
            "cuDevicePrimaryCtxRetain",
            api,
        )
        try:
            self.check(self.cuCtxPushCurrent(ctx), "cuCtxPushCurrent", api)
            try:
                yield
            finally:
                self.cuCtxPopCurrent(ctypes.byref(ctypes.c_void_p()))
        finally:
            self.cuDevicePrimaryCtxRelease(device)

    def pointer_device(self, ptr: int, api: str) -> int:
        """The device number owning ``ptr``; memory the driver does not know is a `BufferError`."""
        ordinal = ctypes.c_int()
        rc = self.cuPointerGetAttribute(
            ctypes.byref(ordinal), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr
        )
        self.check(rc, f"looking up the device of pointer 0x{ptr:x}", api)
        return ordinal.value

    def synchronize(self, stream: int, device: int, api: str) -> None:
        """Wait on the host until ``stream`` has finished its work.

        The default-stream handles (1, 2) name a stream of the *current* context, so the primary
        context of ``device`` is made current around the call; other handles carry their context,
        which is made current only if the driver asks for one.
        """
        what = f"synchronising stream {stream:#x}"
        if stream not in DEFAULT_STREAMS:
            rc = self.cuStreamSynchronize(stream)
            if rc != CUDA_ERROR_INVALID_CONTEXT:
                self.check(rc, what, api)
                return
        with self.primary_context(device, api):
            self.check(self.cuStreamSynchronize(stream), what, api)

    def wait_on_legacy_stream(self, stream: int, device: int, api: str) -> None:
        """Make ``stream`` wait (on the device, not the host) for the work queued so far on the
        legacy default stream of ``device``."""
        with self.primary_context(device, api):
            event = ctypes.c_void_p()
            self.check(
                self.cuEventCreate(ctypes.byref(event), CU_EVENT_DISABLE_TIMING),
                "cuEventCreate",
                api,
            )
            try:
                self.check(self.cuEventRecord(event, CU_STREAM_LEGACY), "cuEventRecord", api)
                self.check(self.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent", api)
            finally:
                self.cuEventDestroy(event)


def load(lib: Any) -> Driver | None:
    """A `Driver` over ``lib``, initialised; None when an entry point is missing or cuInit fails."""
    try:
        found = Driver(lib)
    except AttributeError:  # a driver too old to have every entry point
        return None
    return found if found.cuInit(0) == 0 else None


@functools.cache
def driver() -> Driver | None:
    """The CUDA driver, loaded and initialised once; None when there is no usable driver or GPU."""
    for name in _DRIVER_NAMES:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        return load(lib)
    return None
