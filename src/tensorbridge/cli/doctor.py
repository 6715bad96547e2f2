"""``python -m tensorbridge doctor``: what this interpreter can exchange, and the proof of it.

The doctor finds the array libraries installed here (from their distribution metadata, importing
none until it needs it), then proves every exchange cell by running it:

* **exchange matrix** -- every producer (the standard library's buffer exporters, a safetensors
  and an ``.npy`` file the doctor writes and tensorbridge loads, each array library, tensorbridge)
  against every consumer, once *through tensorbridge* (producer -> tensorbridge -> consumer)
  and once *directly* where the two sides share a protocol. A cell is
  ``shared`` when a write through the producer is seen through the consumer (or, when neither side
  may be written, when both report the same address), ``copied`` when the values arrive but the
  memory is not shared, ``refused`` when a side raises (the reason is kept), and ``broken`` when
  tensorbridge breaks a guarantee.
* **dtype coverage** -- for each producer/consumer pair through tensorbridge, every dtype.
* **safety checks** -- read-only propagation, capsule reuse, deleters called exactly once (counted
  on capsules crafted with ctypes), buffer exports held while a view lives, overflow-checked sizes.

The exit status is 1 only when tensorbridge breaks one of its own guarantees; a peer's limitation
is reported, never failed. ``--json`` prints one object with the keys ``doctor`` (format version),
``tensorbridge``, ``python``, ``implementation``, ``platform``, ``machine``, ``libraries``
(`Library`), ``devices``, ``matrix`` and ``dtypes`` (`Cell`), ``checks`` (`Check`), ``broken`` (one
line per broken guarantee), ``ok`` and ``elapsed_s`` (see `Report.to_json`).
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import tensorbridge as tb
from tensorbridge.testing import DTYPES

from .checks import CHECKS, Check, ChildCheck, run_check
from .environment import Library, find_libraries
from .errors import one_line
from .exchange import BROKEN, Cell, Exchange
from .files import FileSide, file_producers
from .peers import SIDES
from .progress import Progress
from .scaleout import start as start_scaleout
from .sides import MemoryviewSide, Side, Stdlib, TensorbridgeSide, stdlib_producers

__all__ = ["Options", "Report", "run"]


@dataclass
class Options:
    """What to run: ``peers`` None means every library found; an empty tuple means none."""

    peers: tuple[str, ...] | None = None
    progress: bool = False
    child_checks: bool = True


@dataclass
class Report:
    """Everything the doctor found; `to_json` is the ``--json`` output."""

    libraries: list[Library]
    devices: list[str]
    matrix: list[Cell]
    dtypes: list[Cell]
    checks: list[Check]
    elapsed_s: float = 0.0

    @property
    def broken(self) -> list[str]:
        found = [
            f"{c.route}: {c.producer} -> {c.consumer} ({c.device}, {c.dtype}): {c.reason}"
            for c in (*self.matrix, *self.dtypes)
            if c.outcome == BROKEN and c.blame == "tensorbridge"
        ]
        return found + [f"check: {c.name}: {c.detail}" for c in self.checks if c.ok is False]

    @property
    def ok(self) -> bool:
        return not self.broken

    def to_json(self) -> dict[str, Any]:
        """The report as plain data (``doctor`` is the format version)."""
        return {
            "doctor": 1,
            "tensorbridge": tb.__version__,
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "libraries": [asdict(lib) for lib in self.libraries],
            "devices": self.devices,
            "matrix": [asdict(c) for c in self.matrix],
            "dtypes": [asdict(c) for c in self.dtypes],
            "checks": [asdict(c) for c in self.checks],
            "broken": self.broken,
            "ok": self.ok,
            "elapsed_s": round(self.elapsed_s, 3),
        }


def _load_sides(
    libraries: list[Library], wanted: tuple[str, ...] | None, progress: Callable[[str], None]
) -> list[Side]:
    sides: list[Side] = []
    for lib in libraries:
        if lib.version is None:
            continue
        if lib.key not in SIDES:
            lib.status = "listed"
            continue
        if wanted is not None and lib.key not in wanted:
            lib.status = "not selected"
            continue
        progress(f"importing {lib.name} ({lib.module})")
        try:
            side = SIDES[lib.key]()
            lib.devices = list(side.devices())
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: a peer's import must not end the doctor
            lib.status, lib.error = "import failed", one_line(exc)
            continue
        lib.status = "used"
        sides.append(side)
    for lib in libraries:
        if lib.key == "ml_dtypes" and lib.version and any(s.key in ("numpy", "jax") for s in sides):
            lib.status, lib.error = "used", None  # through NumPy's extended dtypes
    return sides


def _matrix(
    ex: Exchange,
    producers: list[Side],
    consumers: list[Side],
    devices: list[str],
    progress: Callable[[str], None],
) -> list[Cell]:
    cells = []
    for device in devices:
        for p in producers:
            if device not in p.devices() and p is not ex.tb:
                continue
            dtype = p.dtypes()[0] if isinstance(p, Stdlib) else "int32"
            for c in consumers:
                if device not in c.devices() and c is not ex.tb:
                    continue
                progress(f"exchange {device}: {p.key} -> {c.key}")
                cells.append(ex.run(p, c, device, "tensorbridge", dtype, unaligned=True))
                if ex.tb not in (p, c) and not isinstance(p, FileSide):  # files need a loader
                    cells.append(ex.run(p, c, device, "direct", dtype, unaligned=True))
    return cells


def _dtype_cells(
    ex: Exchange, producers: list[Side], consumers: list[Side], progress: Callable[[str], None]
) -> list[Cell]:
    cells = []
    for p in producers:
        for c in consumers:
            if p is c is ex.tb:
                continue
            progress(f"dtypes: {p.key} -> {c.key}")
            cells += [ex.run(p, c, "cpu", "tensorbridge", d.name) for d in DTYPES]
    return cells


def _start_child(options: Options, libraries: list[Library]) -> ChildCheck | None:
    torch_found = any(lib.key == "torch" and lib.version for lib in libraries)
    if not (options.child_checks and torch_found):
        return None
    if options.peers is not None and "torch" not in options.peers:
        return None
    return ChildCheck()  # runs on another core while this process works


def run(options: Options, stderr: TextIO | None = None) -> Report:
    """Find the libraries, run every cell and check, and return the report."""
    start = time.perf_counter()
    progress = Progress(options.progress, stderr or sys.stderr)
    libraries = find_libraries()
    child = _start_child(options, libraries)
    scale = start_scaleout(libraries, options.peers) if options.child_checks else None
    try:
        sides = _load_sides(libraries, options.peers, progress)
        tbside = TensorbridgeSide()
        ex = Exchange(tbside)
        devices = ["cpu", *sorted({d for s in sides for d in s.devices() if d.startswith("cuda")})]
        files = file_producers()
        producers = [*stdlib_producers(), *files, *sides, tbside]
        matrix = _matrix(ex, producers, [tbside, MemoryviewSide(), *sides], devices, progress)
        typed = [s for s in sides if s.dtypes() and "cpu" in s.devices()]
        dtype_consumers = [tbside, *(s for s in typed if s.protocol in ("dlpack", "both"))]
        dtypes = _dtype_cells(ex, [*files, *typed, tbside], dtype_consumers, progress)
        by_key = {s.key: s for s in sides}
        checks = []
        for name, fn in CHECKS:
            progress(f"check: {name}")
            checks.append(run_check(name, fn, by_key))
        if child is not None and "torch" in by_key:
            progress("waiting for the child-interpreter check")
            checks.append(child.result())
        if scale is not None:
            progress(scale.waiting_line)
            checks += scale.result()
    finally:
        if child is not None:
            child.stop()
        if scale is not None:
            scale.stop()
        progress.close()
    report = Report(libraries, devices, matrix, dtypes, checks)
    report.elapsed_s = time.perf_counter() - start
    return report
