"""Each peer proved in a child process of its own, several at once, and the doctor surviving them.

Some peers crash each other (importing PaddlePaddle after TensorFlow segfaults), and some abort the
process on input they do not support, so the doctor imports none of them: it starts ``python -m
tensorbridge.cli.child KEY`` for each peer (`child`), at most one per CPU core at a time, and reads
what each one proves as it goes. A child killed by a signal is reported with the signal and the
exchange it was in, and started again after that exchange (up to `_RESTARTS` times); a child that
does not finish within `_TIMEOUT` seconds is stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from .checks import Check
from .environment import Library
from .errors import PACKAGE_DIR
from .exchange import CRASHED, Cell
from .sides import Defect

__all__ = ["PeerResult", "prove_peers", "signal_name"]

_RESTARTS: Final = 3  # a peer that crashes more often than this is not started again
_TIMEOUT: Final = 300.0  # seconds for one peer, all its restarts together


def signal_name(number: int) -> str:
    """``"SIGSEGV (signal 11)"``."""
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


@dataclass
class PeerResult:
    """What one peer's process proved.

    Attributes:
        library: the peer's `Library` (its status, devices, error).
        cells: ``(kind, cell)`` by the cell's index in the plan (``kind``: matrix or dtypes).
        checks, defects: the safety checks run there, the peer's own defects.
        crashes: each death of the process: the signal and what it was doing.
        seconds: wall time, restarts included.
    """

    library: Library
    cells: dict[int, tuple[str, Cell]] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    defects: list[Defect] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    seconds: float = 0.0


class _Child:
    """One run of the child process for a peer, read line by line on a thread."""

    def __init__(self, result: PeerResult, args: list[str], start: int) -> None:
        self.result = result
        self.step = f"importing {result.library.name}"
        self.begun: dict[str, Any] | None = None  # the cell in progress
        self.begun_at = -1
        self.done = False
        # closed in close(), once the child has ended
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(PACKAGE_DIR).parent), env.get("PYTHONPATH")])
        )
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's start-up chatter
        env.setdefault("GLOG_minloglevel", "3")  # PaddlePaddle's
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"{__package__}.child",
                result.library.key,
                *args,
                "--start",
                str(start),
            ],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            self._take(msg)

    def _take(self, msg: dict[str, Any]) -> None:
        result, lib = self.result, self.result.library
        if "step" in msg:
            self.step = msg["step"]
        if "begin" in msg:
            self.begun, self.begun_at = {"kind": msg["kind"], **msg["cell"]}, msg["begin"]
        elif "cell" in msg:
            result.cells[msg["cell"]] = (msg["kind"], Cell(**msg["data"]))
            self.begun = None
        elif "library" in msg:
            info = msg["library"]
            lib.status, lib.error = info["status"], info.get("error")
            lib.devices = info.get("devices", [])
        elif "check" in msg:
            result.checks.append(Check(**msg["check"]))
        elif "defect" in msg:
            result.defects.append(Defect(**msg["defect"]))
        elif msg.get("done"):
            self.done = True

    def _last_error_line(self) -> str:
        """The crash's own words from stderr: faulthandler's first lines, or the last line."""
        self.stderr.seek(0)
        lines = [
            line.strip()
            for line in self.stderr.read().decode("utf-8", "replace").splitlines()
            if line.strip()
        ]
        fatal = [line for line in lines if line.startswith(("Fatal Python error", "File "))]
        return (fatal[:2] and " ".join(fatal[:2])) or (lines[-1] if lines else "")

    def close(self) -> None:
        """Collect the last report lines and the crash's words, once the process has ended."""
        self.thread.join(5)
        if not self.stderr.closed:
            self.error_line = self._last_error_line()
            self.stderr.close()


class _Peer:
    """A peer to prove: its child, restarted after a crash."""

    def __init__(self, lib: Library, args: list[str]) -> None:
        self.result = PeerResult(lib)
        self.args = args
        self.child: _Child | None = None
        self.started = 0.0
        self.finished = False

    def start(self, at: int = 0) -> None:
        if not self.started:
            self.started = time.perf_counter()
        self.child = _Child(self.result, self.args, at)

    def poll(self, now: float) -> bool:
        """Whether this peer is finished (restarting its child after a crash)."""
        child = self.child
        assert child is not None
        if now - self.started > _TIMEOUT and child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()
            child.close()
            lib = self.result.library
            if lib.status in ("installed", "used"):
                lib.status = "timed out"
                lib.error = f"did not finish within {_TIMEOUT:.0f} s (while {child.step})"
            return self._finish(now)
        code = child.proc.poll()
        if code is None:
            return False
        child.close()
        if child.done and code == 0:
            return self._finish(now)
        return self._died(child, code, now)

    def _died(self, child: _Child, code: int, now: float) -> bool:
        how = signal_name(-code) if code < 0 else f"exit status {code}"
        detail = child.error_line
        lib, result = self.result.library, self.result
        what = f"the process died with {how} while {child.step}" + (
            f" ({detail})" if detail else ""
        )
        result.crashes.append(what)
        if child.begun is None:  # importing, or a check or a probe: nothing to go on with
            if lib.status in ("installed", "used"):
                lib.status, lib.error = "crashed", what
            return self._finish(now)
        begun = dict(child.begun)
        kind = begun.pop("kind")
        cell = Cell(**begun, outcome=CRASHED, blame=lib.key, reason=what)
        result.cells[child.begun_at] = (kind, cell)
        if len(result.crashes) > _RESTARTS:
            lib.status, lib.error = "crashed", f"{len(result.crashes)} crashes; the last: {what}"
            return self._finish(now)
        self.start(child.begun_at + 1)  # on with the cell after the one it died in
        return False

    def _finish(self, now: float) -> bool:
        self.finished = True
        self.result.seconds = now - self.started
        return True

    def stop(self) -> None:
        if self.child is not None and self.child.proc.poll() is None:
            self.child.proc.kill()
            self.child.proc.wait()
            self.child.close()


def prove_peers(
    libraries: list[Library],
    args_for: Callable[[Library], list[str]],
    progress: Callable[[str], None],
    jobs: int | None = None,
) -> list[PeerResult]:
    """Prove each of ``libraries`` in its own child, ``jobs`` at a time (default: one per core).

    ``args_for(lib)`` gives the child's extra arguments (`child.main`'s options).
    """
    jobs = max(1, jobs or os.cpu_count() or 1)
    waiting = [_Peer(lib, args_for(lib)) for lib in libraries]
    peers = list(waiting)
    running: list[_Peer] = []
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                peer = waiting.pop(0)
                peer.start()
                running.append(peer)
            now = time.perf_counter()
            running = [p for p in running if not p.poll(now)]
            if running:
                done = len(peers) - len(waiting) - len(running)
                first = running[0]
                step = first.child.step if first.child else ""
                others = f"; {len(running) - 1} more running" if len(running) > 1 else ""
                progress(
                    f"{first.result.library.name}: {step}{others} "
                    f"({done} of {len(peers)} peers done)"
                )
                time.sleep(0.05)
    finally:
        for peer in running:
            peer.stop()
    return [p.result for p in peers]
