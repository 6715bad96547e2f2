"""The doctor's scale-out checks: Ray's object store and Dask's frames carry tensors without a copy.

When Ray or Dask (``distributed``) is installed, one child interpreter, started early so that it runs
on another core while the doctor proves the exchange matrix, checks:

* **Ray** -- a local Ray (one CPU, no dashboard) stores a tensor with ``ray.put``; two ``ray.get``
  calls give read-only tensors at one address (views of the object store, not copies), writes
  raise, and the bytes are right, for float32, bfloat16, float8_e4m3fn and complex64; a task
  receives its argument the same way. Starting Ray takes seconds, which the progress line says.
* **Dask** -- ``distributed.protocol.serialize`` hands the tensor's own memory over as its one frame
  (the header holds only the metadata; registered through the ``dask.sizeof`` entry point), also
  in a message at pickle protocol 4 (the scheduler's), ``deserialize`` rebuilds the tensor over
  that frame, and Dask's ``sizeof`` is the tensor's ``nbytes``.

A check is failed only when the transport works and tensorbridge copies, loses the read-only flag
or the bytes; a transport that cannot start here is reported as skipped. The child uses the
public API only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Final

from .checks import Check
from .environment import Library
from .errors import PACKAGE_DIR

__all__ = ["DASK_CHECK", "RAY_CHECK", "ScaleoutCheck", "start"]

RAY_CHECK: Final = "Ray: ray.get gives read-only views of the object store, no copy"
DASK_CHECK: Final = "Dask: a tensor travels as its own memory, out of band"
_TIMEOUT: Final = 120.0  # seconds: Ray usually starts in a few

_CHILD: Final = """
import contextlib, json, sys, time

import tensorbridge as tb
from tensorbridge.testing import local_ray

DTYPES = ("float32", "bfloat16", "float8_e4m3fn", "complex64")
out = {}


def tensor(name):
    # 256 KiB: above Ray's 100 KiB limit for objects kept inline, so it goes to the shared store
    return tb.frombuffer(bytearray(bytes(range(256)) * 1024), dtype=getattr(tb, name))


def refuses_writes(x):
    try:
        x.fill_(0)
    except ValueError as exc:
        return "read-only" in str(exc)
    return False


def check_ray():
    start = time.perf_counter()
    ray_block = contextlib.ExitStack()
    try:
        ray = ray_block.enter_context(local_ray())
    except Exception as exc:
        return {"skipped": f"Ray did not start: {type(exc).__name__}: {exc}"[:200]}
    with ray_block:
        result = {"started_s": round(time.perf_counter() - start, 1), "dtypes": {}}
        for name in DTYPES:
            t = tensor(name)
            ref = ray.put(t)
            a, b = ray.get(ref), ray.get(ref)
            result["dtypes"][name] = {
                "readonly": a.is_readonly and b.is_readonly,
                "shared": a.data_ptr() == b.data_ptr() != t.data_ptr(),
                "bytes": a.dtype is t.dtype and bytes(a.as_memoryview()) == bytes(t.as_memoryview()),
                "refuses_writes": refuses_writes(a),
            }

        @ray.remote
        def probe(x):
            return [x.is_readonly, refuses_writes(x), bytes(x.as_memoryview())[:8]]

        readonly, refused, head = ray.get(probe.remote(ray.put(tensor("float32"))))
        result["task"] = {"readonly": readonly, "refuses_writes": refused, "bytes": head == bytes(range(8))}
        return result


def check_dask():
    from dask.sizeof import sizeof
    from distributed.protocol import deserialize, dumps, serialize, to_serialize

    t = tensor("bfloat16").reshape(256, 512).T
    header, frames = serialize(t)
    if header.get("serializer") != "dask" or len(frames) != 1:
        return {"unregistered": f"{header.get('serializer')} serializer, {len(frames)} frames"}
    address = tb.frombuffer(frames[0], dtype=tb.uint8).data_ptr()
    u = deserialize(header, frames)
    # pickle protocol 4: what the scheduler's connections use (results and gathers pass there)
    message = dumps({"x": to_serialize(t)}, context={"pickle-protocol": 4})
    sizes = [len(memoryview(f).cast("B")) for f in message]
    return {
        "header_bytes": sum(sizes) - t.nbytes,
        "sizeof": sizeof(t) == t.nbytes,
        "frame_is_the_tensor": address == t.data_ptr(),
        "rebuilt_over_the_frame": u.data_ptr() == address,
        "same": u.dtype is t.dtype and u.stride() == t.stride() and bytes(u.contiguous().as_memoryview())
        == bytes(t.contiguous().as_memoryview()),
        "protocol_4_out_of_band": t.nbytes in sizes and sum(sizes) - t.nbytes < 1000,
    }


for key in sys.argv[1:]:
    try:
        out[key] = check_ray() if key == "ray" else check_dask()
    except ImportError as exc:  # the transport cannot start here: skipped, not failed
        out[key] = {"skipped": f"it could not be imported: {type(exc).__name__}: {exc}"[:300]}
    except Exception as exc:
        out[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
print("RESULT " + json.dumps(out))
"""


class ScaleoutCheck:
    """The Ray and Dask checks, started in a child interpreter and collected at the end."""

    def __init__(self, libraries: list[Library]) -> None:
        self.libraries = libraries
        self.transports = [lib.key for lib in libraries]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(PACKAGE_DIR).parent), env.get("PYTHONPATH")])
        )
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_CHILD), *self.transports],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    @property
    def waiting_line(self) -> str:
        """The progress line shown while the doctor waits for the child."""
        names = " and ".join("Ray" if t == "ray" else "Dask" for t in self.transports)
        if "ray" in self.transports:
            return f"waiting for the {names} checks (starting Ray takes several seconds)"
        return f"waiting for the {names} check"

    def stop(self) -> None:
        """End the child if its result was not collected (or the run failed)."""
        if self.proc.returncode is None:
            self.proc.kill()
            self.proc.communicate()

    def result(self, timeout: float = _TIMEOUT) -> list[Check]:
        """One `Check` per transport: ok True, False (tensorbridge broke it) or None (skipped)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            why = f"skipped: the check did not finish within {timeout:.0f} s"
            return [Check(_name(t), None, why) for t in self.transports]
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if not lines:
            last = (err.strip().splitlines() or ["no output"])[-1]
            why = f"the child interpreter ended with status {self.proc.returncode}: {last}"
            return [Check(_name(t), False, why[:300]) for t in self.transports]
        found = json.loads(lines[-1][len("RESULT ") :])
        checks = [_judge(t, found.get(t) or {}) for t in self.transports]
        for lib, check in zip(self.libraries, checks):
            if check.ok is not None:  # the transport ran here: it is used, not merely listed
                lib.status, lib.devices = "used", ["cpu"]
        return checks


def _name(transport: str) -> str:
    return RAY_CHECK if transport == "ray" else DASK_CHECK


def _judge(transport: str, found: dict[str, Any]) -> Check:
    name = _name(transport)
    if "skipped" in found:
        return Check(name, None, f"skipped: {found['skipped']}")
    if "error" in found:
        return Check(name, False, f"raised {found['error']}")
    if transport == "ray":
        dtypes = found.get("dtypes") or {}
        task = found.get("task") or {}
        bad = [f"{d}: {k}" for d, flags in dtypes.items() for k, v in flags.items() if not v]
        bad += [f"task argument: {k}" for k, v in task.items() if not v]
        if bad or not dtypes:
            return Check(name, False, "failed: " + ", ".join(bad or ["no dtype checked"]))
        return Check(
            name,
            True,
            f"two gets share one read-only copy, writes raise, task arguments too; "
            f"{', '.join(dtypes)} (Ray started in {found.get('started_s')} s)",
        )
    if "unregistered" in found:
        return Check(
            name,
            False,
            f"failed: distributed sends tensors with its fallback ({found['unregistered']}): "
            f"the dask.sizeof entry point did not register tensorbridge (reinstall tensorbridge)",
        )
    keys = ("sizeof", "frame_is_the_tensor", "rebuilt_over_the_frame", "same")
    flags = {k: found.get(k) for k in (*keys, "protocol_4_out_of_band")}
    if not all(flags.values()):
        detail = ", ".join(f"{k}={v}" for k, v in {**found, **flags}.items())
        return Check(name, False, f"failed: {detail}"[:300])
    return Check(
        name,
        True,
        f"serialize() sends the tensor's memory as one frame and a "
        f"{found.get('header_bytes')}-byte header, at the scheduler's pickle protocol 4 too; "
        f"deserialize() rebuilds over the frame; sizeof() is nbytes (bfloat16, transposed)",
    )


def start(libraries: list[Library], peers: tuple[str, ...] | None) -> ScaleoutCheck | None:
    """Start the child for the transports installed here; None when there is nothing to check.

    Only a run with every peer (no ``--peers``) checks the transports; those that ran are marked
    used when the result is collected.
    """
    if peers is not None:
        return None
    found = [lib for lib in libraries if lib.key in ("ray", "dask") and lib.version is not None]
    return ScaleoutCheck(found) if found else None
