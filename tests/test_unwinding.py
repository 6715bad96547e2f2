"""Callbacks that run while an exception propagates keep the user's exception and still release.

An array a consumer imported from a tensorbridge tensor may die while an exception propagates: a
temporary in a failing expression (``np.from_dlpack(t).no_such_name``) is freed by the interpreter
with the ``AttributeError`` already set. The consumer then calls tensorbridge's DLPack deleter (or
the release callback of an Arrow struct) with the error indicator set. NumPy's and PyTorch's own
deleters set that exception aside and put it back; tensorbridge's do the same in the compiled
build, where they are C functions (`_native.void_callback`). Written in Python (the pure-Python
build, a ctypes callback), a callback can neither run with the exception set nor set it again: it
takes the exception out first, so the export is released all the same, and reports it as
unraisable (Python 3.12+); the consumer's caller gets ``SystemError``. Both builds must release.

Each scenario runs in a child process, in the build installed here and in pure Python
(``TENSORBRIDGE_NO_EXTENSIONS=1``).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from tests.conftest import run_in_subprocess

pytestmark = pytest.mark.subprocess

_SCENARIOS = r"""
import gc, json, sys
import tensorbridge as tb

reported = []
sys.unraisablehook = lambda u: reported.append(type(u.exc_value).__name__)

def released(buffer):
    # The export is released when the bytearray can be resized again.
    gc.collect()
    try:
        buffer.append(0)
    except BufferError:
        return False
    return True

def scenario(name, consume):
    buffer = bytearray(64)
    t = tb.frombuffer(buffer, dtype=tb.float32)
    before = len(reported)
    try:
        consume(t)
        raised = None
    except BaseException as exc:
        raised = type(exc).__name__
    del t
    rows[name] = {"raised": raised, "released": released(buffer),
                  "reported": reported[before:]}

def in_a_frame(t):
    import numpy as np
    a = np.from_dlpack(t)
    raise KeyError("the user's own")

rows = {}
scenario("buffer: temporary memoryview", lambda t: t.as_memoryview().no_such_name)
scenario("buffer: temporary slice", lambda t: t.as_memoryview()[1:].no_such_name)
scenario("capsule: unconsumed, refused", lambda t: int(t.__dlpack__()))
scenario("capsule: legacy, refused", lambda t: int(tb.utils.dlpack.to_dlpack(t)))
peers = {name: True for name in ("numpy", "torch", "pyarrow")}
for name in peers:
    try:
        __import__(name)
    except ImportError:
        peers[name] = False
if peers["numpy"]:
    import numpy as np
    scenario("numpy: array interface", lambda t: np.asarray(t).no_such_name)
    scenario("numpy: temporary, attribute", lambda t: np.from_dlpack(t).no_such_name)
    scenario("numpy: temporary, operator", lambda t: np.from_dlpack(t) + "x")
    scenario("numpy: legacy capsule", lambda t: np.from_dlpack(t).reshape(3, 5))
    scenario("numpy: in a frame", in_a_frame)
if peers["torch"]:
    import torch
    scenario("torch: temporary, attribute", lambda t: torch.from_dlpack(t).no_such_name)
    scenario("torch: capsule", lambda t: torch.utils.dlpack.from_dlpack(
        tb.utils.dlpack.to_dlpack(t)).no_such_name)
if peers["pyarrow"]:
    import pyarrow as pa
    scenario("pyarrow: temporary, attribute", lambda t: pa.array(t).no_such_name)
print("RESULT " + json.dumps({"build": tb.build_info().kind, "rows": rows,
                              "version": sys.version_info[:2]}))
"""

# What each scenario raises in the user's code.
_RAISED = {
    "buffer: temporary memoryview": "AttributeError",
    "buffer: temporary slice": "AttributeError",
    "capsule: unconsumed, refused": "TypeError",
    "capsule: legacy, refused": "TypeError",
    "numpy: temporary, attribute": "AttributeError",
    "numpy: array interface": "AttributeError",
    "numpy: temporary, operator": ("UFuncTypeError", "_UFuncNoLoopError", "TypeError"),
    "numpy: legacy capsule": "ValueError",
    "numpy: in a frame": "KeyError",
    "torch: temporary, attribute": "AttributeError",
    "torch: capsule": "AttributeError",
    "pyarrow: temporary, attribute": "AttributeError",
}


def _run(pure: bool) -> dict:
    env = {"TENSORBRIDGE_NO_EXTENSIONS": "1"} if pure else None
    result = run_in_subprocess(_SCENARIOS, timeout=180, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.skipif(importlib.util.find_spec("numpy") is None, reason="needs NumPy")
@pytest.mark.parametrize("pure", [False, True], ids=["this build", "pure Python"])
def test_a_callback_during_unwinding_releases_and_keeps_what_the_build_can(pure):
    outcome = _run(pure)
    rows = outcome["rows"]
    assert rows, outcome
    compiled = outcome["build"] == "compiled"
    for name, row in rows.items():
        assert row["released"], (name, row)  # the export is gone: the bytearray resizes
        expected = _RAISED[name]
        expected = (expected,) if isinstance(expected, str) else expected
        if compiled:
            # The user's own exception, and nothing reported on the side.
            assert row["raised"] in expected, (name, row)
            assert row["reported"] == [], (name, row)
        elif row["raised"] not in expected:
            # Where the interpreter freed the array with the exception set, a ctypes callback
            # cannot set it again: the caller sees SystemError, and the exception it lost is
            # reported (3.10 and 3.11 have no call that returns it, and can only clear it).
            assert row["raised"] == "SystemError", (name, row)
            if tuple(outcome["version"]) >= (3, 12):
                assert any(r in expected for r in row["reported"]), (name, row)
