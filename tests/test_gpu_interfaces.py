"""__cuda_array_interface__ on a real GPU: device lookup, stream synchronisation, export, peers.

Memory is allocated with the CUDA driver through ctypes, so only a driver and a GPU are needed; PyTorch
with CUDA is used for the cross-checks when it is installed. Nothing touches a device at collection
time: the driver is loaded by a fixture, which skips when there is none.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

import tensorbridge as tb
from tensorbridge import _cuda

pytestmark = pytest.mark.gpu

_MB = 1 << 20
_CUDA_ERROR_NOT_READY = 600


class Cuda:
    """Driver calls for the tests: allocate, fill asynchronously, create streams; device 0 context."""

    def __init__(self, driver: Any):
        self.driver = driver
        lib = ctypes.CDLL("libcuda.so.1")
        vp, pvp, size = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t

        def bind(name: str, *argtypes: Any) -> Any:
            return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)((name, lib))

        self.mem_alloc = bind("cuMemAlloc_v2", ctypes.POINTER(ctypes.c_uint64), size)
        self.mem_free = bind("cuMemFree_v2", ctypes.c_uint64)
        self.memset_async = bind("cuMemsetD8Async", ctypes.c_uint64, ctypes.c_ubyte, size, vp)
        self.memcpy_dtoh = bind("cuMemcpyDtoH_v2", vp, ctypes.c_uint64, size)
        self.stream_create = bind("cuStreamCreate", pvp, ctypes.c_uint)
        self.stream_destroy = bind("cuStreamDestroy_v2", vp)
        self.stream_query = bind("cuStreamQuery", vp)

    def check(self, rc: int) -> None:
        assert rc == 0, f"CUDA error {rc}"

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self.check(self.mem_alloc(ctypes.byref(ptr), nbytes))
        return ptr.value

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        self.check(self.stream_create(ctypes.byref(handle), 1))  # CU_STREAM_NON_BLOCKING
        return handle.value

    def read(self, ptr: int, nbytes: int) -> bytes:
        out = ctypes.create_string_buffer(nbytes)
        self.check(self.memcpy_dtoh(out, ptr, nbytes))
        return out.raw


@pytest.fixture(scope="module")
def cuda() -> Iterator[Cuda]:
    """The CUDA driver with device 0's primary context current; skips without a GPU."""
    _cuda.driver.cache_clear()
    driver = _cuda.driver()
    if driver is None:
        pytest.skip("no CUDA driver or GPU")
    with driver.primary_context(0, "test"):
        yield Cuda(driver)


class DeviceMemory:
    """A CUDA allocation exposed through the CUDA Array Interface; freed when collected."""

    def __init__(
        self, cuda: Cuda, shape: tuple[int, ...], typestr: str = "<f4", stream: int | None = None
    ):
        self.cuda = cuda
        itemsize = int(typestr[2:])
        self.nbytes = itemsize
        for n in shape:
            self.nbytes *= n
        self.ptr = cuda.alloc(max(self.nbytes, 1))
        self.__cuda_array_interface__ = {
            "data": (self.ptr, False),
            "shape": shape,
            "typestr": typestr,
            "version": 3,
            "stream": stream,
        }

    def __del__(self) -> None:
        self.cuda.mem_free(self.ptr)


def test_import_finds_the_device_and_shares(cuda):
    """Imported device memory is a cuda:0 tensor over the same pointer; the host never reads it."""
    mem = DeviceMemory(cuda, (4, 8))
    t = tb.asarray(mem)
    assert t.device == tb.device("cuda", 0)
    assert t.data_ptr() == mem.ptr
    assert t._storage.owner is mem
    with pytest.raises(BufferError, match="cannot be read"):
        t.tolist()


def test_stream_is_synchronised_before_import_returns(cuda):
    """Work queued on the producer's stream has finished when asarray returns."""
    stream = cuda.stream()
    try:
        mem = DeviceMemory(cuda, (1024 * _MB,), "|u1", stream=stream)
        for value in range(1, 33):  # ~32 GiB of writes: still running when asarray is called
            cuda.check(cuda.memset_async(mem.ptr, value, mem.nbytes, stream))
        if cuda.stream_query(stream) != _CUDA_ERROR_NOT_READY:
            pytest.skip(
                "the GPU finished the queued work before the import; nothing left to observe"
            )
        tb.asarray(mem)
        assert cuda.stream_query(stream) == 0  # CUDA_SUCCESS: nothing pending
        assert cuda.read(mem.ptr + mem.nbytes - 4, 4) == b"\x20" * 4
    finally:
        cuda.stream_destroy(stream)


@pytest.mark.parametrize("stream", [1, 2])
def test_default_streams_are_accepted(cuda, stream):
    """The legacy (1) and per-thread (2) default streams synchronise in the device's primary context."""
    t = tb.asarray(DeviceMemory(cuda, (16,), stream=stream))
    assert t.is_cuda


def test_unknown_pointer_is_refused(cuda):
    """A pointer the driver does not know is a BufferError naming the CUDA error, not a crash."""

    class Bogus:
        __cuda_array_interface__: ClassVar = {
            "data": (0x7F00_0000_0000, False),
            "shape": (2,),
            "typestr": "<f4",
            "version": 3,
        }

    with pytest.raises(BufferError, match="CUDA error"):
        tb.asarray(Bogus())


def test_export_round_trip(cuda):
    """A CUDA tensor's interface re-imports to the same view (stream 1 synchronised)."""
    mem = DeviceMemory(cuda, (6, 4), "<i4")
    t = tb.asarray(mem)[1:, ::2]
    iface = t.__cuda_array_interface__
    assert iface["stream"] == 1

    class Again:
        __cuda_array_interface__ = iface

    back = tb.asarray(Again())
    assert back.data_ptr() == t.data_ptr()
    assert back.stride() == t.stride()
    assert back.device == t.device


def test_torch_reads_our_interface_and_we_read_torchs(cuda):
    """PyTorch imports a tensorbridge CUDA tensor through the interface, and the other way round."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)

    class FromTorch:
        __cuda_array_interface__ = x.__cuda_array_interface__

    t = tb.asarray(FromTorch())
    assert t.data_ptr() == x.data_ptr()
    assert t.device == tb.device("cuda", x.device.index or 0)
    y = torch.as_tensor(t, device="cuda")
    assert y.data_ptr() == x.data_ptr()
    assert torch.equal(y, x)
