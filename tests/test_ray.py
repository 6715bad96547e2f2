"""Ray: tensors travel through Ray's shared-memory object store without a copy.

Ray pickles objects with protocol 5 and keeps every out-of-band buffer in its object store; ``ray.get``
hands those buffers back read-only. tensorbridge's reduction gives Ray a ``pickle.PickleBuffer`` over
the tensor's memory, and unpickling turns a read-only buffer into a read-only tensor over it, so every
``ray.get`` (in the driver, or in a task receiving an argument) maps the stored bytes in place: two gets
share memory and writes raise, for every dtype.

Starting Ray takes seconds and the CI machine has two cores, so one child process starts one local Ray
and runs every check; it prints one JSON line that the tests read. Ray is imported only in the child.
"""

from __future__ import annotations

import importlib.util

import pytest
from tests.conftest import run_script_for_result

pytestmark = [
    pytest.mark.ray,
    pytest.mark.subprocess,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed"),
]

# Objects under Ray's inline limit (100 KiB) are copied into the owner's memory store; larger ones
# go to the shared object store, which is what these checks are about.
_CHILD = """
import json

import tensorbridge as tb
from tensorbridge.testing import local_ray

results = {}
with local_ray() as ray:
    N = 1 << 18  # elements: 256 KiB and more for every dtype, above the inline limit

    def raises(fn):
        try:
            fn()
        except ValueError as exc:
            return "read-only" in str(exc)
        return False

    # 1. put / get: read-only views of one stored copy
    t = tb.arange(N, dtype=tb.float32)
    ref = ray.put(t)
    a, b = ray.get(ref), ray.get(ref)
    c = a.clone()
    c[0] = 5.0
    results["get"] = {
        "readonly": [a.is_readonly, b.is_readonly],
        "shared": a.data_ptr() == b.data_ptr(),
        "not_the_original": a.data_ptr() != t.data_ptr(),
        "equal": tb.equal(a, t),
        "write_raises": raises(lambda: a.__setitem__(0, 1.0)),
        "fill_raises": raises(lambda: a.fill_(1.0)),
        "clone_writable": not c.is_readonly and a[0].item() == 0.0,
    }

    # 2. every dtype, bfloat16, float8 and complex included
    dtypes = {}
    for d in sorted({v for v in vars(tb).values() if isinstance(v, tb.dtype)}, key=str):
        raw = bytes(range(256)) * (N * d.itemsize // 256)
        src = tb.frombuffer(bytearray(raw), dtype=d)
        r = ray.put(src)
        x, y = ray.get(r), ray.get(r)
        dtypes[d.name] = [
            x.dtype is d,
            x.shape == src.shape,
            bytes(x.as_memoryview()) == raw,
            x.is_readonly,
            x.data_ptr() == y.data_ptr(),
        ]
    results["dtypes"] = dtypes

    # 3. layouts: strides and storage offset kept; views with gaps packed
    base = tb.arange(N, dtype=tb.int64).reshape(512, 512)
    layouts = {"transposed": base.T, "offset": base[3:], "reversed": base[::-1]}
    results["layouts"] = {
        name: [ray.get(ray.put(v)).stride() == v.stride(), ray.get(ray.put(v)).tolist() == v.tolist()]
        for name, v in layouts.items()
    }
    stepped = base[:, ::2]
    s = ray.get(ray.put(stepped))
    results["layouts"]["stepped"] = [s.is_contiguous(), tb.equal(s, stepped)]

    # 4. task arguments and return values
    @ray.remote
    def describe(x):
        return [x.is_readonly, x.dtype.name, x.shape[0], x[0].item(), x[-1].item()]

    @ray.remote
    def make(n):
        return tb.arange(n, dtype=tb.bfloat16) if n < 256 else tb.arange(n, dtype=tb.int32)

    @ray.remote
    def write(x):
        try:
            x[0] = 1
        except ValueError as exc:
            return str(exc)
        return "written"

    arg = tb.arange(N, dtype=tb.int32)
    big = ray.get(make.remote(N))
    small = ray.get(make.remote(8))
    ref_arg = ray.put(arg)
    results["tasks"] = {
        "argument": ray.get(describe.remote(arg)),
        "argument_ref": ray.get(describe.remote(ref_arg)),
        "worker_cannot_write": "read-only" in ray.get(write.remote(ref_arg)),
        "returned": [big.is_readonly, tb.equal(big, arg)],
        "returned_small": [small.dtype.name, small.tolist() == [float(i) for i in range(8)]],
    }

    # 5. PyTorch through Ray: explicit steps only
    try:
        import torch
    except ImportError:
        results["torch"] = None
    else:
        src = torch.arange(N, dtype=torch.float32)
        got = ray.get(ray.put(tb.asarray(src)))
        try:
            got.torch()
            refused = False
        except Exception:
            refused = True
        forced = got.torch(force=True)
        cloned = got.clone().torch()
        forced[0] = -1.0
        cloned[1] = -1.0
        results["torch"] = [
            refused,
            bool(torch.equal(got.clone().torch(), src)),
            got[0].item() == 0.0 and got[1].item() == 1.0,
        ]
print("RESULT " + json.dumps(results))
"""


def test_ray_objects_through_the_store(tmp_path):
    """ray.get, task arguments and results are read-only views of one stored copy, every dtype."""
    # One local Ray in one child process, every check run there.
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    ray_results = run_script_for_result(_CHILD, tmp_path, env=env)[1]
    got = ray_results["get"]
    assert got["readonly"] == [True, True]
    assert got["shared"]
    assert got["not_the_original"]
    assert got["equal"]
    assert got["write_raises"] and got["fill_raises"]
    assert got["clone_writable"]
    dtypes = ray_results["dtypes"]
    assert {"bfloat16", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128"} <= set(dtypes)
    bad = {name: checks for name, checks in dtypes.items() if checks != [True] * 5}
    assert not bad, bad  # [dtype, shape, bytes, read-only, two gets share memory]
    layouts = ray_results["layouts"]
    assert layouts == {name: [True, True] for name in layouts}, layouts
    tasks = ray_results["tasks"]
    n = 1 << 18
    assert tasks["argument"] == [True, "int32", n, 0, n - 1]
    assert tasks["argument_ref"] == [True, "int32", n, 0, n - 1]
    assert tasks["worker_cannot_write"]
    assert tasks["returned"] == [True, True]
    assert tasks["returned_small"] == ["bfloat16", True]
    if ray_results["torch"] is not None:
        # torch() refuses read-only memory; force=True and clone().torch() copy, the store is intact.
        assert ray_results["torch"] == [True, True, True]
