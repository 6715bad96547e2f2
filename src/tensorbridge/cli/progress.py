"""The doctor's progress line on stderr."""

from __future__ import annotations

import os
import threading
import time
from typing import Final, TextIO

from .render import WIDTH

__all__ = ["Progress", "silence"]


def silence(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at the null device once its reader has gone away.

    What the stream still buffers then goes nowhere: Python flushes stdout and stderr again at
    exit, and a failed flush turns the exit status into 120 (stdout's, with "Exception ignored ...
    BrokenPipeError"; stderr's too on Python 3.14 and later, where 3.11 ignores it).
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor (the stream was replaced)
        pass


class Progress:
    """One status line on stderr, shown only once the run has taken more than a second.

    A background thread shows the step in progress even while that step blocks (a peer that takes
    30 s to import is named within a second), and updates the elapsed time on a terminal. A stream
    that fails (its reader went away) ends the progress display, not the run.
    """

    _TICK: Final = 0.25  # seconds between the thread's looks at the current step

    def __init__(self, enabled: bool, stream: TextIO, *, ticking: bool = True) -> None:
        self.enabled, self.stream = enabled, stream
        try:
            self.tty = enabled and stream.isatty()
        except (OSError, ValueError, AttributeError):
            self.tty = False
        self.start = self.last = time.perf_counter()
        self.shown = False
        self.text = ""  # the step in progress
        self.written = ""  # the step last written
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if enabled and ticking:
            self._thread = threading.Thread(
                target=self._tick, name="tensorbridge-doctor-progress", daemon=True
            )
            self._thread.start()

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.text = text
            self._show(time.perf_counter())

    def _tick(self) -> None:
        while not self._stop.wait(self._TICK):
            with self._lock:
                self._show(time.perf_counter())

    def _show(self, now: float) -> None:
        """Write the current step if the rate allows (a pipe gets each step at most once)."""
        if not self.enabled or not self.text or now - self.start < 1.0:
            return
        if now - self.last < (0.1 if self.tty else 1.0):
            return
        if not self.tty and self.text == self.written:
            return
        self.last, self.written = now, self.text
        line = f"doctor: {now - self.start:4.1f}s {self.text}"[: WIDTH - 1]
        self._write(f"\r{line:<{WIDTH - 1}}" if self.tty else line + "\n")
        self.shown = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # closed or broken: stop showing progress, go on
            self.enabled = False
            silence(self.stream)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.shown and self.tty and self.enabled:
                self._write("\r" + " " * (WIDTH - 1) + "\r")
            self.enabled = False
