"""DLPack interchange with PaddlePaddle on the CPU (paddle.from_dlpack, paddle.Tensor.__dlpack__).

PaddlePaddle and TensorFlow crash when both are imported into one process (Paddle after
TensorFlow), and pytest-xdist workers run many test files each: no pytest process imports
PaddlePaddle. Every check runs in one child interpreter (one Paddle import for the file), which
prints one JSON line of results that the tests read; the tests skip when PaddlePaddle is not
installed, found without importing it.

Paddle tensors are mutable: memory is shared both ways, writable. Paddle's CPU tensors answer
``__dlpack_device__()`` with ``(kDLCPU, None)`` (no device id); tensorbridge reads that as CPU
device 0, so ``copy=True`` and ``device="cpu"`` work.
"""

from __future__ import annotations

import importlib.util

import pytest
from tests.conftest import run_script_for_result

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(
        importlib.util.find_spec("paddle") is None, reason="paddlepaddle is not installed"
    ),
]

_CHECKS = r'''
import json, traceback, warnings
warnings.simplefilter("ignore")  # Paddle warns at import about a missing ccache
import numpy as np
import paddle
import tensorbridge as tb

CHECKS = {}


def check(f):
    CHECKS[f.__name__] = f
    return f


# Every dtype Paddle and tensorbridge share through DLPack (same names in both), but uint16.
SHARED = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "bfloat16", "float32",
          "float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"]


def owned_sample(name, n=8):
    """A tensorbridge tensor of ``name`` whose bytes are 1, 2, 3, ... (bool: alternating)."""
    dtype = getattr(tb, name)
    if name == "bool":
        return tb.tensor([False, True] * (n // 2))
    return tb.frombuffer(bytearray(range(1, n * dtype.itemsize + 1)), dtype=dtype).clone()


def tb_bytes(t):
    return bytes(t.contiguous().as_memoryview())


def paddle_bytes(p):
    return tb_bytes(tb.from_dlpack(p.clone()))


@check
def every_dtype_both_ways():
    for name in SHARED:
        owned = owned_sample(name)
        for convert in (paddle.from_dlpack, paddle.utils.dlpack.from_dlpack):
            p = convert(owned)
            assert str(p.dtype) == f"paddle.{name}", (name, p.dtype)
            assert p.data_ptr() == owned.data_ptr(), name
        # A tensor Paddle made itself (a clone: Paddle's own memory) comes back without a copy.
        q = p.clone()
        for convert in (tb.from_dlpack, tb.asarray):
            t = convert(q)
            assert t.dtype is getattr(tb, name), (name, t.dtype)
            assert t.data_ptr() == q.data_ptr(), name
            assert tb_bytes(t) == tb_bytes(owned), name
            assert not t.is_readonly, name


@check
def paddle_labels_uint16_as_bfloat16():
    # Paddle's peer defect: its "uint16" dtype is its old name for bfloat16 storage, and it maps
    # DLPack's (kDLUInt, 16) to it: uint16 crosses as bfloat16 both ways.
    p = paddle.zeros([3], dtype="uint16")
    assert tb.from_dlpack(p).dtype is tb.bfloat16
    assert str(paddle.from_dlpack(tb.zeros(3, dtype=tb.uint16)).dtype) == "paddle.bfloat16"


@check
def shapes_and_strides_from_paddle():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    p = paddle.to_tensor(a)
    t = tb.from_dlpack(p)
    assert t.shape == (2, 3, 4) and t.stride() == (12, 4, 1)
    assert t.tolist() == a.tolist()
    q = paddle.to_tensor(np.arange(12, dtype=np.float32).reshape(3, 4))[:, 1:3]
    tq = tb.from_dlpack(q)
    assert tq.shape == (3, 2) and tq.stride() == tuple(q.strides)
    assert tq.tolist() == [[1.0, 2.0], [5.0, 6.0], [9.0, 10.0]]
    for x in (paddle.to_tensor(2.5), paddle.zeros([0, 3])):
        assert tb.from_dlpack(x).shape == tuple(x.shape)


@check
def strides_to_paddle():
    s = tb.arange(12, dtype=tb.float32).reshape(3, 4)
    for view in (s[:, ::2], s.T, s[1:]):
        y = paddle.from_dlpack(view)
        assert tuple(y.shape) == tuple(view.shape)
        assert tuple(y.strides) == view.stride()
        assert y.data_ptr() == view.data_ptr()
        assert y.numpy().tolist() == view.tolist()


@check
def writes_seen_both_ways():
    s = tb.arange(6, dtype=tb.float32)
    y = paddle.from_dlpack(s)
    s[0] = 42.0
    assert float(y[0]) == 42.0
    p = paddle.to_tensor(np.arange(6, dtype=np.float32))
    t = tb.from_dlpack(p)
    t[1] = -1.0
    assert float(p[1]) == -1.0
    p[2] = 7.0
    assert t.tolist()[2] == 7.0


@check
def cpu_device_without_id():
    p = paddle.to_tensor(np.arange(6, dtype=np.float32))
    device = p.__dlpack_device__()
    assert int(device[0]) == 1 and device[1] is None, device  # (kDLCPU, None)
    c = tb.from_dlpack(p, copy=True)
    assert c.data_ptr() != p.data_ptr() and c.tolist() == p.numpy().tolist()
    c[0] = 9.0
    assert float(p[0]) == 0.0
    for device in ("cpu", tb.device("cpu")):
        t = tb.from_dlpack(p, device=device)
        assert t.data_ptr() == p.data_ptr() and t.device.type == "cpu"
    assert tb.from_dlpack(p, device="cpu", copy=True).data_ptr() != p.data_ptr()


@check
def paddle_dtypes_as_arguments():
    for p_dtype, expected in [(paddle.float32, tb.float32), (paddle.int64, tb.int64),
                              (paddle.bool, tb.bool), (paddle.bfloat16, tb.bfloat16),
                              (paddle.complex64, tb.complex64)]:
        assert tb.zeros(2, dtype=p_dtype).dtype is expected, (p_dtype, expected)
        assert tb.ones(2, dtype=p_dtype).dtype is expected


results = {}
for name, f in CHECKS.items():
    try:
        f()
        results[name] = "ok"
    except BaseException as exc:
        results[name] = "".join(traceback.format_exception(exc)[-3:]).strip()
print("RESULT " + json.dumps(results))
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every check of this file, run once in a child interpreter that imports PaddlePaddle."""
    return run_script_for_result(_CHECKS, tmp_path_factory.mktemp("paddle"))[1]


def _passed(results, name):
    assert results[name] == "ok", results[name]


def test_every_dtype_both_ways(results):
    """Every shared dtype crosses both ways with its bytes, without a copy, writable."""
    _passed(results, "every_dtype_both_ways")


def test_paddle_labels_uint16_as_bfloat16(results):
    """Paddle's uint16 crosses as bfloat16 both ways (Paddle's own mapping)."""
    _passed(results, "paddle_labels_uint16_as_bfloat16")


def test_shapes_and_strides_from_paddle(results):
    """Paddle tensors and their strided views import with their shape, strides and values."""
    _passed(results, "shapes_and_strides_from_paddle")


def test_strides_to_paddle(results):
    """Strided views reach Paddle with their strides, over the same memory."""
    _passed(results, "strides_to_paddle")


def test_writes_seen_both_ways(results):
    """Memory is shared both ways: a write on either side is seen on the other."""
    _passed(results, "writes_seen_both_ways")


def test_cpu_device_without_id(results):
    """Paddle's (kDLCPU, None) device: copy=True copies, device="cpu" shares."""
    _passed(results, "cpu_device_without_id")


def test_paddle_dtypes_as_arguments(results):
    """dtype arguments take Paddle's dtypes (tb.zeros(2, dtype=paddle.float32))."""
    _passed(results, "paddle_dtypes_as_arguments")
