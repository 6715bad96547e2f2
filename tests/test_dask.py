"""Dask: the size Dask accounts a tensor at, and tensors as task arguments and results, out of band.

tensorbridge registers a ``sizeof`` and a ``dask_serialize``/``dask_deserialize`` pair through the
``dask.sizeof`` entry point (``tensorbridge._dask``), never by ``import tensorbridge``. Dask's
``sizeof`` of a NumPy array is ``x.nbytes`` with each dimension of stride 0 counted once, views
charged their own elements (dask/sizeof.py); a tensor is charged the same. ``distributed`` sends a
registered type as a msgpack header and frames sent as they are, at any pickle protocol; a pickle
goes out of band only at protocol 5, and the scheduler's connections use protocol 4, so results and
gathers, which pass through the scheduler, carried a pickled tensor's bytes inside the pickle.

Every check runs in a fresh interpreter (the registration happens when Dask loads); a local cluster
starts worker processes, so one child starts one cluster and runs every cluster check, and prints
one JSON line that the tests read.
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

_SIZEOF = """
import json, sys
FIRST = {first!r}
if FIRST == "tensorbridge":
    import tensorbridge as tb
    imported_dask = sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed"))
    import dask
else:
    import dask
    imported_dask = None
    import tensorbridge as tb
import numpy as np
from dask.sizeof import sizeof

dtypes = sorted({{v for v in vars(tb).values() if isinstance(v, tb.dtype)}}, key=str)
by_dtype = {{d.name: [sizeof(tb.zeros(3, 5, dtype=d)), tb.zeros(3, 5, dtype=d).nbytes]
            for d in dtypes}}
base = tb.arange(24, dtype=tb.float32)
a = np.arange(24, dtype=np.float32)
views = {{
    "contiguous": (base.reshape(4, 6), a.reshape(4, 6)),
    "strided": (base.reshape(4, 6)[1:3, ::2], a.reshape(4, 6)[1:3, ::2]),
    "transposed": (base.reshape(4, 6).T, a.reshape(4, 6).T),
    "reversed": (base[::-1], a[::-1]),
    "zero_d": (base[5], a[5:6].reshape(())),
    "empty": (base[:0], a[:0]),
    "broadcast": (base[:4].reshape(1, 4).expand(3, 4), np.broadcast_to(a[:4], (3, 4))),
    "broadcast_empty": (base[:0].reshape(0, 1).expand(0, 5), np.broadcast_to(a[:0].reshape(0, 1), (0, 5))),
}}
print("RESULT " + json.dumps({{
    "imported_dask": imported_dask,
    "by_dtype": by_dtype,
    "views": {{k: [sizeof(t), t.nbytes, sizeof(x)] for k, (t, x) in views.items()}},
}}))
"""

_SERIALIZE = """
import json
import tensorbridge as tb
from distributed.protocol import deserialize, dumps, loads, serialize, to_serialize

def address(buffer):
    return tb.frombuffer(buffer, dtype=tb.uint8).data_ptr()

def pattern(d, n):
    return tb.frombuffer(bytearray(bytes(range(256)) * (n * d.itemsize // 256)), dtype=d)

def same(u, t):  # dtype, layout and bytes (the patterns hold NaNs, which tb.equal tells apart)
    return (u.dtype is t.dtype and u.shape == t.shape and u.stride() == t.stride()
            and bytes(u.contiguous().as_memoryview()) == bytes(t.contiguous().as_memoryview()))

def travels(t, protocol):
    # what a connection writes and reads: at protocol 4 (the scheduler's connections) too
    messages = dumps({"x": to_serialize(t)}, context={"pickle-protocol": protocol})
    carriers = [f for f in messages if len(memoryview(f)) and address(f) == t.data_ptr()]
    received = [bytearray(f) for f in messages]  # what a socket fills: writable
    m = loads(received)["x"]
    return [
        len(carriers),
        sum(len(memoryview(f).cast("B")) for f in messages) - t.nbytes,
        same(m, t),
        m.is_readonly,
    ]

dtypes = sorted({v for v in vars(tb).values() if isinstance(v, tb.dtype)}, key=str)
by_dtype = {}
for d in dtypes:
    t = pattern(d, 1 << 12)
    header, frames = serialize(t)
    u = deserialize(header, frames)
    by_dtype[d.name] = [
        header["serializer"],
        len(frames),
        address(frames[0]) == t.data_ptr() and len(memoryview(frames[0])) == t.nbytes,
        u.data_ptr() == address(frames[0]),
        same(u, t) and not u.is_readonly,
        travels(t, 4),
        travels(t, 5),
    ]

def rebuilt(t, frame):
    u = deserialize(serialize(t)[0], [frame])
    return [u.is_readonly, u.stride() == t.stride(), same(u, t)]

t = tb.arange(1 << 10, dtype=tb.bfloat16).reshape(32, 32).T
raw = bytes(serialize(t)[1][0])  # the bytes in memory order
layouts = {}
for name, v in {
    "transposed": t,
    "gaps": t[::2, 1:],  # packed: only the view's bytes travel
    "broadcast": t.T[:1].expand(5, 32),  # strides (0, 1)
    "zero_d": t[3, 4],
    "empty": t[:, :0],
    "requires_grad": tb.ones(4, requires_grad=True),
}.items():
    header, frames = serialize(v)
    u = deserialize(header, frames)
    layouts[name] = [
        len(memoryview(frames[0]).cast("B")),
        u.shape == v.shape and u.dtype is v.dtype and u.tolist() == v.tolist(),
        u.requires_grad == v.requires_grad,
    ]
flags = {
    # tensor sent writable; frame writable / read-only
    "writable_frame": rebuilt(t, bytearray(raw)),
    "readonly_frame": rebuilt(t, raw),
    # tensor sent read-only; a writable frame stays read-only
    "readonly_tensor": rebuilt(tb.frombuffer(raw, dtype=tb.bfloat16).reshape(32, 32), bytearray(raw)),
}
ro = tb.frombuffer(raw, dtype=tb.bfloat16)
flags["readonly_header"] = serialize(ro)[0]["sub-header"]["readonly"]
flags["readonly_travels"] = travels(ro, 4)
print("RESULT " + json.dumps({"by_dtype": by_dtype, "layouts": layouts, "flags": flags}))
"""

_CLUSTER = """
import hashlib, json, logging
import tensorbridge as tb
from distributed import Client, LocalCluster
from distributed.core import rpc

MiB = 1 << 20

def describe(x):
    return [x.dtype.name, list(x.shape), list(x.stride()), x.is_readonly, bytes(x.contiguous().as_memoryview()).hex()]

def make(name, n):
    d = getattr(tb, name)
    return tb.frombuffer(bytearray(bytes(range(256)) * (n * d.itemsize // 256)), dtype=d)

def keep(x):
    return x

def big(name, readonly):
    raw = bytes(range(256)) * (16 * MiB // 256)  # 16 MiB
    return tb.frombuffer(raw if readonly else bytearray(raw), dtype=getattr(tb, name))

def digest(x):
    return hashlib.sha256(x.as_memoryview()).hexdigest()

def on_worker(key, dask_worker=None):
    # the worker's registry, and what it serialises its result as
    from dask.sizeof import sizeof
    from distributed.protocol import serialize
    x = dask_worker.data[key]
    header, frames = serialize(x)
    return [sizeof(x) == x.nbytes, header["serializer"], len(frames),
            tb.frombuffer(frames[0], dtype=tb.uint8).data_ptr() == x.data_ptr()]

async def through_the_scheduler(address, key):
    # what the scheduler forwards to a client: the worker's frames, not deserialised
    async with rpc(address, deserialize=False) as scheduler:
        response = await scheduler.gather(keys=[key])
    sent = response["data"][key]
    frame_bytes = [len(memoryview(f).cast("B")) for f in sent.frames]
    return [sent.header.get("serializer"), frame_bytes,
            [hashlib.sha256(memoryview(f).cast("B")).hexdigest() for f in sent.frames]]

if __name__ == "__main__":
    results = {}
    with LocalCluster(
        processes=True,
        n_workers=1,
        threads_per_worker=1,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    ) as cluster, Client(cluster) as client:
        dtypes = sorted({v for v in vars(tb).values() if isinstance(v, tb.dtype)}, key=str)
        n = 1 << 12  # elements: a few KiB to 64 KiB
        every = {}
        for d in dtypes:
            src = make(d.name, n)
            expected = bytes(src.as_memoryview()).hex()
            argument = client.submit(describe, src, pure=False).result()
            returned = client.submit(make, d.name, n, pure=False).result()
            echoed = client.submit(keep, src, pure=False).result()
            every[d.name] = [
                argument == [d.name, [n], [1], False, expected],
                returned.dtype is d and bytes(returned.as_memoryview()).hex() == expected,
                echoed.dtype is d
                and bytes(echoed.as_memoryview()).hex() == expected
                and not echoed.is_readonly,
            ]
        results["every"] = every
        v = tb.arange(24, dtype=tb.int16)[3:].reshape(3, 7).T  # strides (1, 7), offset 3
        got = client.submit(keep, v, pure=False).result()
        results["layout"] = [got.stride() == v.stride(), got.tolist() == v.tolist()]
        r = tb.frombuffer(bytes(range(16)), dtype=tb.uint8)
        results["readonly_argument"] = client.submit(describe, r, pure=False).result()[3]
        fetched = {}
        for name in ("float32", "bfloat16"):
            for readonly in (False, True):
                expected = digest(big(name, readonly))
                f = client.submit(big, name, readonly, pure=False)
                result = f.result()
                (gathered,) = client.gather([f])
                (direct,) = client.gather([f], direct=True)
                fetched[f"{name} {'read-only' if readonly else 'writable'}"] = {
                    "arrived": [
                        [x.dtype.name, x.nbytes, digest(x) == expected, x.is_readonly]
                        for x in (result, gathered, direct)
                    ],
                    "on_worker": client.run(on_worker, f.key).popitem()[1],
                    "forwarded": client.sync(through_the_scheduler, cluster.scheduler_address, f.key),
                    "expected": expected,
                }
                del f, result, gathered, direct
        results["fetched"] = fetched
    print("RESULT " + json.dumps(results))
"""


@pytest.mark.parametrize("first", ["tensorbridge", "dask"])
def test_sizeof_is_what_the_tensor_addresses(tmp_path, first):
    """dask.sizeof(t) is t.nbytes for every dtype, and for views what Dask charges the same NumPy
    view; registered through the entry point whichever is imported first, without tensorbridge
    importing Dask."""
    got = run_script_for_result(_SIZEOF.format(first=first), tmp_path)[1]
    if first == "tensorbridge":
        assert got["imported_dask"] == []
    assert {"bfloat16", "float8_e4m3fn", "complex64", "bool", "float64"} <= set(got["by_dtype"])
    bad = {k: v for k, v in got["by_dtype"].items() if v[0] != v[1] or v[0] == 0}
    assert not bad, bad
    views = got["views"]
    bad = {k: v for k, v in views.items() if v[0] != v[2]}
    assert not bad, bad  # [tensorbridge, nbytes, NumPy's]
    assert views["strided"] == [2 * 3 * 4] * 3  # the view's own elements, not its base's
    assert views["broadcast"][:2] == [4 * 4, 3 * 4 * 4]  # the bytes that exist, not 3x them
    assert views["empty"][0] == views["broadcast_empty"][0] == 0


def test_serialized_as_the_tensor_memory(tmp_path):
    """serialize() gives a header and the tensor's own memory as the one frame, for every dtype; a
    message carries it so at protocol 4 (the scheduler's) as at 5; flags follow the frame."""
    got = run_script_for_result(_SERIALIZE, tmp_path)[1]
    by_dtype = got["by_dtype"]
    assert {"bfloat16", "float8_e4m3fn", "complex32", "bool"} <= set(by_dtype)
    bad = {
        k: v
        for k, v in by_dtype.items()
        if v[:5] != ["dask", 1, True, True, True] or v[5] != v[6] or v[5][0] != 1
    }
    assert not bad, bad  # [serializer, frames, frame is t, rebuilt over it, equal, p4, p5]
    overhead = {k: v[5][1] for k, v in by_dtype.items()}
    assert max(overhead.values()) < 600, overhead  # the header only: no pickled copy of the bytes
    assert {tuple(v[5][2:]) for v in by_dtype.values()} == {(True, False)}
    layouts = got["layouts"]
    assert layouts["transposed"] == [2 << 10, True, True]
    assert layouts["gaps"] == [16 * 31 * 2, True, True]  # packed: only the view's bytes
    assert layouts["broadcast"] == [32 * 2, True, True]  # one row: what exists
    assert layouts["zero_d"] == [2, True, True]
    assert layouts["empty"] == [0, True, True]
    assert layouts["requires_grad"] == [16, True, True]
    flags = got["flags"]
    assert flags["writable_frame"] == [False, True, True]  # [is_readonly, strides, equal]
    assert flags["readonly_frame"] == [True, True, True]  # a read-only frame: read-only, no copy
    assert flags["readonly_tensor"] == [True, True, True]
    assert flags["readonly_header"] is True
    assert flags["readonly_travels"][0] == 1
    assert flags["readonly_travels"][2:] == [True, True]


def test_local_cluster(tmp_path):
    """A process cluster: every dtype as argument and result; 16 MiB float32 and bfloat16 results
    and gathers arrive equal with their read-only flag, sent by the worker and forwarded by the
    scheduler as one frame of the tensor's bytes (no pickle)."""
    got = run_script_for_result(_CLUSTER, tmp_path)[1]
    every = got["every"]
    assert {"bfloat16", "float8_e4m3fn", "complex64", "bool"} <= set(every)
    bad = {k: v for k, v in every.items() if v != [True] * 3}
    assert not bad, bad  # [argument, returned, echoed]
    assert got["layout"] == [True, True]
    assert got["readonly_argument"] is True
    fetched = got["fetched"]
    assert set(fetched) == {
        f"{d} {f}" for d in ("float32", "bfloat16") for f in ("writable", "read-only")
    }
    for case, found in fetched.items():
        name, flag = case.split()
        readonly = flag == "read-only"
        # [dtype, nbytes, bytes equal, read-only] for result(), gather(), gather(direct=True)
        assert found["arrived"] == [[name, 16 << 20, True, readonly]] * 3, case
        assert found["on_worker"] == [True, "dask", 1, True], case
        assert found["forwarded"] == ["dask", [16 << 20], [found["expected"]]], case


def _header(**changes):
    header = {
        "dtype": "float32",
        "shape": [2],
        "strides": [1],
        "offset": 0,
        "readonly": False,
        "requires_grad": False,
    }
    header.update(changes)
    return header


# Headers `serialize` never writes, as ``distributed`` could deliver them (msgpack: lists, ints of
# any size), with the error and what it says.
_BAD_HEADERS = [
    ("shape 2**64", _header(shape=[2**64]), [None], ValueError, "2**63 - 1"),
    (
        "shape (0, 2**70)",
        _header(shape=[0, 2**70], strides=[1, 1]),
        [None],
        ValueError,
        "2**63 - 1",
    ),
    (
        "elements past int64",
        _header(shape=[2**62, 4], strides=[4, 1]),
        [None],
        ValueError,
        "holds more than 2**63 - 1 elements",
    ),
    ("stride -2**63", _header(strides=[-(2**63)]), [None], ValueError, "past int64"),
    ("offset 2**63", _header(offset=2**63), [None], ValueError, "0 to 2**63 - 1"),
    ("negative offset", _header(offset=-1), [None], ValueError, "0 to 2**63 - 1; got -1"),
    ("shape not a list", _header(shape=2), [None], TypeError, "shape must be a tuple of ints"),
    (
        "missing key",
        {"dtype": "float32", "shape": [2]},
        [bytearray(8)],
        ValueError,
        "dask_deserialize(): a tensor's header lacks ['strides', 'offset', 'readonly', "
        "'requires_grad']",
    ),
    (
        "two frames",
        _header(),
        [bytearray(8), bytearray(8)],
        ValueError,
        "dask_deserialize(): a tensor travels as exactly one frame",
    ),
    ("no frame", _header(), [], ValueError, "dask_deserialize(): a tensor travels as exactly one"),
    (
        "header a list",
        ["float32", [2]],
        [bytearray(8)],
        TypeError,
        "dask_deserialize(): a tensor's header must be a dict; got ['float32', [2]] (list).",
    ),
]


@pytest.mark.parametrize(
    ("header", "frames", "error", "words"),
    [case[1:] for case in _BAD_HEADERS],
    ids=[case[0] for case in _BAD_HEADERS],
)
def test_a_header_past_int64_or_malformed_is_refused_before_the_frame(header, frames, error, words):
    """deserialize() checks the header as a pickle's metadata (sizes, strides and offset within
    int64; `_layout.check_sizes` for the shape) before it touches the frame (here None where the
    header alone is wrong); a header with keys missing, or other than one frame, is refused too."""
    from tensorbridge import _dask

    with pytest.raises(error) as info:
        _dask.deserialize(header, frames)
    assert words in str(info.value), str(info.value)
    assert _dask.deserialize(_header(), [bytearray(8)]).tolist() == [0.0, 0.0]  # a good one
