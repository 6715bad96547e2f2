"""CUDA memory exchanged with PyTorch, CuPy and JAX through tensorbridge (skipped without a GPU).

tensorbridge carries device memory and never dereferences it: these tests check that pointers
survive every hop, that streams are passed as DLPack specifies (the legacy default stream, 1, on
import; the consumer's stream honoured on export), and that nothing is read on the host. Nothing
here touches a device at collection time: every device query happens inside a fixture.
"""

from __future__ import annotations

import gc

import pytest

import tensorbridge as tb

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch_cuda():
    """PyTorch with a usable CUDA device, or skip."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


@pytest.fixture
def cupy():
    """CuPy with a usable CUDA device, or skip."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except Exception as exc:  # CUDARuntimeError without a driver
        pytest.skip(f"no CUDA device ({exc})")
    return cupy


@pytest.fixture
def jax_gpu():
    """JAX with a GPU backend, or skip."""
    jax = pytest.importorskip("jax")
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("no JAX GPU backend")
    return jax, devices[0]


class Recording:
    """Forwards ``__dlpack__`` to ``x`` and records the keywords the consumer passed."""

    def __init__(self, x):
        self.x = x
        self.kwargs = []

    def __dlpack__(self, **kwargs):
        self.kwargs.append(kwargs)
        return self.x.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()


def test_torch_cuda_import_shares_and_never_reads(torch_cuda):
    """A CUDA tensor imports with its pointer and device; host reads are refused, not attempted."""
    torch = torch_cuda
    x = torch.arange(16, dtype=torch.float32, device="cuda")
    t = tb.from_dlpack(x)
    assert t.device == tb.device("cuda", 0)
    assert t.data_ptr() == x.data_ptr()
    assert t._storage.nbytes == 64
    assert t.__dlpack_device__() == (tb.DLDeviceType.kDLCUDA, 0)
    with pytest.raises(BufferError):
        t.tolist()
    with pytest.raises(BufferError):
        t.clone()


def test_import_passes_the_legacy_default_stream(torch_cuda):
    """tensorbridge asks a CUDA producer with stream=1 (the legacy default stream, explicitly)."""
    torch = torch_cuda
    producer = Recording(torch.ones(4, device="cuda"))
    tb.from_dlpack(producer)
    assert producer.kwargs == [{"max_version": (1, 3), "stream": 1}]


def test_torch_cuda_round_trip(torch_cuda):
    """torch -> tensorbridge -> torch keeps the pointer; writes are shared; slices keep offsets."""
    torch = torch_cuda
    x = torch.zeros(4, 8, device="cuda")
    t = tb.from_dlpack(x)
    y = torch.from_dlpack(t[1:, ::2])
    assert y.data_ptr() == x[1:, ::2].data_ptr()
    assert y.stride() == (8, 2)
    assert y.device == x.device
    x.fill_(3.0)
    torch.cuda.synchronize()
    assert y.sum().item() == 3.0 * 12


def test_torch_consumer_streams(torch_cuda, counting_exporter):
    """torch passes its current stream; a side stream is ordered after the legacy stream."""
    torch = torch_cuda
    t = tb.from_dlpack(torch.arange(1 << 20, dtype=torch.float32, device="cuda"))
    exporter = counting_exporter(t)
    y = torch.from_dlpack(exporter)
    assert exporter.kwargs[-1]["stream"] == 1
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        z = torch.from_dlpack(exporter)
        total = z.sum()
    side.synchronize()
    assert exporter.kwargs[-1]["stream"] == side.cuda_stream
    assert total.item() == float(sum(range(1 << 20)))
    del y, z, total
    gc.collect()
    torch.cuda.synchronize()
    assert exporter.total == 2


def test_cuda_stream_values(torch_cuda):
    """stream 0 is refused on CUDA; None, -1, 1 and 2 are accepted."""
    torch = torch_cuda
    t = tb.from_dlpack(torch.ones(3, device="cuda"))
    with pytest.raises(BufferError, match="unsupported stream on CUDA: 0"):
        t.__dlpack__(stream=0)
    for stream in (None, -1, 1, 2):
        assert (
            torch.from_dlpack(t.__dlpack__(stream=stream, max_version=(1, 0))).sum().item() == 3.0
        )


def test_cuda_memory_outlives_the_producer(torch_cuda):
    """The producer's memory stays alive while a tensorbridge view lives, then is released once."""
    torch = torch_cuda
    x = torch.full((256,), 7.0, device="cuda")
    t = tb.from_dlpack(x)
    del x
    gc.collect()
    view = t[128:]
    del t
    gc.collect()
    assert torch.from_dlpack(view).sum().item() == 7.0 * 128


def test_copy_and_device_requests_go_to_torch(torch_cuda):
    """copy=True goes to the producer (trusted on the device); device='cpu' makes torch copy."""
    torch = torch_cuda
    x = torch.arange(4.0, device="cuda")
    c = tb.from_dlpack(x, copy=True)
    assert c.device.type == "cuda"
    assert c.data_ptr() != x.data_ptr()
    producer = Recording(x)
    h = tb.from_dlpack(producer, device="cpu")
    assert h.device == tb.device("cpu")
    assert h.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert producer.kwargs == [
        {"max_version": (1, 3), "dl_device": (1, 0)}
    ]  # no stream for the host
    with pytest.raises(
        ValueError, match=r"cannot move DLPack tensor from device .* without copying"
    ):
        tb.from_dlpack(x, device="cpu", copy=False)


def test_cuda_export_refuses_copies(torch_cuda):
    """Device memory is never copied: copy=True, dl_device=CPU and negative strides refuse."""
    torch = torch_cuda
    t = tb.from_dlpack(torch.ones(4, device="cuda"))
    for kwargs in ({"copy": True}, {"dl_device": (1, 0)}):
        with pytest.raises(BufferError):
            t.__dlpack__(max_version=(1, 0), **kwargs)
    with pytest.raises(BufferError, match="negative strides"):
        t[::-1].__dlpack__(max_version=(1, 0))


def test_cupy_both_ways(cupy):
    """CuPy -> tensorbridge -> CuPy keeps the pointer and shares writes."""
    a = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
    t = tb.from_dlpack(a)
    assert t.data_ptr() == a.data.ptr
    assert t.device.type == "cuda"
    b = cupy.from_dlpack(t)
    assert b.data.ptr == a.data.ptr
    assert b.strides == a.strides
    b[0, 0] = -1
    assert float(a[0, 0]) == -1.0


def test_cupy_torch_through_tensorbridge(cupy, torch_cuda):
    """CuPy -> tensorbridge -> PyTorch shares one device buffer."""
    torch = torch_cuda
    a = cupy.ones(8, dtype=cupy.float32)
    x = torch.from_dlpack(tb.from_dlpack(a))
    assert x.data_ptr() == a.data.ptr
    x.mul_(5)
    torch.cuda.synchronize()
    assert float(a.sum()) == 40.0


def test_jax_gpu_both_ways(jax_gpu):
    """A JAX GPU array imports with its pointer; tensorbridge hands it back to JAX on the GPU."""
    jax, device = jax_gpu
    x = jax.device_put(jax.numpy.arange(16, dtype=jax.numpy.float32), device)
    t = tb.from_dlpack(x)
    assert t.data_ptr() == x.unsafe_buffer_pointer()
    assert t.device.type == "cuda"
    y = jax.numpy.from_dlpack(t)
    assert float(y.sum()) == float(sum(range(16)))
