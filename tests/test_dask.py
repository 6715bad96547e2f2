"""Dask: tensors as task arguments and results, serialised out of band.

``distributed`` serialises an object it has no dedicated serialiser for with pickle protocol 5 and a
``buffer_callback``: each out-of-band buffer becomes a frame of its own, sent as it is. tensorbridge's
reduction hands over a ``pickle.PickleBuffer`` over the tensor's memory, so the frame is that memory
(no pickle copy of the bytes on top of the transport), and the receiver rebuilds the tensor over the
received frame. Dask keeps the writable flag of each frame, so a writable tensor arrives writable.

A local cluster starts worker processes, so one child process starts one cluster and runs every
check; it prints one JSON line that the tests read.
"""

from __future__ import annotations

import importlib.util

import pytest
from tests.conftest import run_script_for_result

pytestmark = [
    pytest.mark.dask,
    pytest.mark.subprocess,
    pytest.mark.skipif(
        importlib.util.find_spec("dask") is None or importlib.util.find_spec("distributed") is None,
        reason="dask and distributed are not installed",
    ),
]

_SERIALIZE = """
import json
import tensorbridge as tb
from distributed.protocol import deserialize, dumps, loads, serialize, to_serialize

def address(buffer):
    return tb.frombuffer(buffer, dtype=tb.uint8).data_ptr()

t = tb.arange(1 << 16, dtype=tb.float32).reshape(256, 256).T
header, frames = serialize(t)
u = deserialize(header, frames)
messages = dumps({"x": to_serialize(t)})
carriers = [f for f in messages if len(memoryview(f)) and address(f) == t.data_ptr()]
m = loads(messages)["x"]
print("RESULT " + json.dumps({
    "serializer": header["serializer"],
    "frames": len(frames),
    "pickle_bytes": len(frames[0]),
    "buffer_is_the_tensor": address(frames[1]) == t.data_ptr(),
    "buffer_bytes": len(memoryview(frames[1])),
    "rebuilt_over_the_frame": u.data_ptr() == address(frames[1]),
    "rebuilt": [u.stride() == t.stride(), tb.equal(u, t), u.is_readonly],
    "message_carriers": len(carriers),
    "message_bytes": sum(len(memoryview(f)) for f in messages),
    "message_rebuilt": [tb.equal(m, t), m.is_readonly],
}))
"""

_CLUSTER = """
import json
import tensorbridge as tb
from distributed import Client, LocalCluster

def describe(x):
    return [x.dtype.name, list(x.shape), list(x.stride()), x.is_readonly, bytes(x.contiguous().as_memoryview()).hex()]

def make(name, n):
    d = getattr(tb, name)
    return tb.frombuffer(bytearray(bytes(range(256)) * (n * d.itemsize // 256)), dtype=d)

def keep(x):
    return x

if __name__ == "__main__":
    results = {}
    with LocalCluster(
        processes=True,
        n_workers=1,
        threads_per_worker=1,
        dashboard_address=None,
        silence_logs=50,
    ) as cluster, Client(cluster) as client:
        dtypes = sorted({v for v in vars(tb).values() if isinstance(v, tb.dtype)}, key=str)
        n = 1 << 12  # elements: a few KiB to 64 KiB
        for d in dtypes:
            src = make(d.name, n)
            expected = bytes(src.as_memoryview()).hex()
            argument = client.submit(describe, src, pure=False).result()
            returned = client.submit(make, d.name, n, pure=False).result()
            echoed = client.submit(keep, src, pure=False).result()
            results[d.name] = [
                argument == [d.name, [n], [1], False, expected],
                returned.dtype is d and bytes(returned.as_memoryview()).hex() == expected,
                echoed.dtype is d
                and bytes(echoed.as_memoryview()).hex() == expected
                and not echoed.is_readonly,
            ]
        v = tb.arange(24, dtype=tb.int16)[3:].reshape(3, 7).T  # strides (1, 7), offset 3
        got = client.submit(keep, v, pure=False).result()
        results["layout"] = [got.stride() == v.stride(), got.tolist() == v.tolist()]
        r = tb.frombuffer(bytes(range(16)), dtype=tb.uint8)
        results["readonly"] = client.submit(describe, r, pure=False).result()[3]
    print("RESULT " + json.dumps(results))
"""


def test_frames_carry_the_tensor_memory(tmp_path):
    """serialize() puts the tensor's own memory in a frame: no pickle copy; loads rebuilds over it."""
    got = run_script_for_result(_SERIALIZE, tmp_path)[1]
    assert got["serializer"] == "pickle"
    assert got["frames"] == 2
    assert got["pickle_bytes"] < 400  # metadata only
    assert got["buffer_is_the_tensor"]
    assert got["buffer_bytes"] == 4 << 16
    assert got["rebuilt_over_the_frame"]
    assert got["rebuilt"] == [True, True, False]
    assert got["message_carriers"] == 1
    assert got["message_bytes"] < (4 << 16) + 1000
    assert got["message_rebuilt"] == [True, False]


def test_local_cluster_every_dtype(tmp_path):
    """Tensors as task arguments and results in a process cluster: values, dtypes, layout, flags."""
    got = run_script_for_result(_CLUSTER, tmp_path)[1]
    assert {"bfloat16", "float8_e4m3fn", "complex64", "bool"} <= set(got)
    bad = {k: v for k, v in got.items() if k not in ("layout", "readonly") and v != [True] * 3}
    assert not bad, bad  # [argument, returned, echoed]
    assert got["layout"] == [True, True]
    assert got["readonly"] is True
