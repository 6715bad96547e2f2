"""``python -m tensorbridge doctor``: what this interpreter can exchange, and the proof of it.

The doctor finds the array libraries installed here (from their distribution metadata, importing
none until it needs it), then proves every exchange cell by running it:

* **exchange matrix** -- every producer (the standard library's buffer exporters, a safetensors
  and an ``.npy`` file the doctor writes and tensorbridge loads, each array library, tensorbridge)
  against every consumer, once *through tensorbridge* (producer -> tensorbridge -> consumer)
  and once *directly* where the two sides share a protocol. A cell is ``shared`` when a write
  through the producer is seen through the consumer (or, when the doctor cannot write through the
  producer, when both report the same address: ``proof`` says which), ``copied`` when the values
  arrive but the memory is not shared, ``refused`` when a side raises (the reason is kept), and
  ``broken`` when tensorbridge breaks a guarantee.
* **dtype coverage** -- for each producer/consumer pair through tensorbridge, every dtype.
* **safety checks** -- read-only propagation, capsule reuse, deleters called exactly once (counted
  on capsules crafted with ctypes), buffer exports held while a view lives, overflow-checked sizes.

The text report opens with a summary (`render.summary`, one screen: the build, the verdict, one
line per peer, what to install); ``--verbose`` adds everything above after it. The exit status is
1 only when tensorbridge breaks one of its own guarantees; a peer's limitation is reported, never
failed. ``--json`` prints one object with the keys ``doctor`` (format version),
``tensorbridge``, ``python``, ``implementation``, ``platform``, ``machine``, ``libraries``
(`Library`), ``devices``, ``matrix`` and ``dtypes`` (`Cell`), ``checks`` (`Check`), ``peers`` (each
peer proved or failed, cell by cell, with its own defects: `peer_summary`), ``broken`` (one line
per broken guarantee), ``ok`` and ``elapsed_s`` (see `Report.to_json`).

Each peer is proved in a child process of its own (`families`): the doctor imports none of them,
so a peer that aborts or segfaults, or two that crash each other, cannot end it; such a death is
reported with its signal, and the proof goes on after the exchange it happened in.
"""

from __future__ import annotations

import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import tensorbridge as tb

from .checks import (
    CHECKS,
    HOMES,
    READONLY_PROTECTION,
    Check,
    ChildCheck,
    readonly_protection_name,
    run_check,
)
from .environment import Library, find_libraries
from .exchange import BROKEN, CRASHED, SHARED, Cell, Exchange
from .families import PeerResult, prove_peers
from .plan import plan
from .progress import Progress
from .registry import PEERS
from .scaleout import start as start_scaleout
from .sides import Defect, TensorbridgeSide

__all__ = ["Options", "Report", "peer_summary", "run"]


@dataclass
class Options:
    """What to run: ``peers`` None means every library found; an empty tuple means none."""

    peers: tuple[str, ...] | None = None
    progress: bool = False
    child_checks: bool = True
    jobs: int | None = None  # peers proved at once (default: one per CPU core)


@dataclass
class Report:
    """Everything the doctor found; `to_json` is the ``--json`` output."""

    libraries: list[Library]
    devices: list[str]
    matrix: list[Cell]
    dtypes: list[Cell]
    checks: list[Check]
    peers: list[PeerResult] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def defects(self) -> list[Defect]:
        return [d for p in self.peers for d in p.defects]

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
            "peers": [peer_summary(p) for p in self.peers],
            "broken": self.broken,
            "ok": self.ok,
            "elapsed_s": round(self.elapsed_s, 3),
        }


def peer_summary(result: PeerResult) -> dict[str, Any]:
    """One peer in ``--json``: ``verdict`` is ``proved`` (every cell ran and kept every
    guarantee), ``failed`` (tensorbridge broke a guarantee with it, or its process died) or the
    library's status where it was not used; ``shares_memory`` says whether any exchange with
    tensorbridge shared memory; ``to_tensorbridge``/``from_tensorbridge`` list the dtypes by
    outcome; ``cells`` lists every cell it was in, with each one's outcome."""
    lib = result.library
    cells = [cell for _, (_, cell) in sorted(result.cells.items())]

    def direction(producer: str, consumer: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for kind, cell in sorted(result.cells.values(), key=lambda kc: kc[0]):
            if kind == "dtypes" and (cell.producer, cell.consumer) == (producer, consumer):
                found.setdefault(cell.outcome, []).append(cell.dtype)
        return found

    broken = [c for c in cells if c.outcome == BROKEN and c.blame == "tensorbridge"]
    if lib.status != "used":
        verdict = lib.status
    else:
        verdict = "failed" if broken or result.crashes else "proved"
    shares = any(c.outcome == SHARED and "tensorbridge" in (c.producer, c.consumer) for c in cells)
    return {
        "key": lib.key,
        "name": lib.name,
        "version": lib.version,
        "status": lib.status,
        "verdict": verdict,
        "shares_memory": shares,
        "error": lib.error,
        "crashes": result.crashes,
        "seconds": round(result.seconds, 2),
        "to_tensorbridge": direction(lib.key, "tensorbridge"),
        "from_tensorbridge": direction("tensorbridge", lib.key),
        "cells": [
            {
                "producer": c.producer,
                "consumer": c.consumer,
                "route": c.route,
                "device": c.device,
                "dtype": c.dtype,
                "outcome": c.outcome,
                "proof": c.proof,
                "verdict": "failed"
                if c.outcome == CRASHED or (c.outcome == BROKEN and c.blame == "tensorbridge")
                else "proved",
                "reason": c.reason,
            }
            for c in cells
        ],
        "defects": [asdict(d) for d in result.defects],
    }


def _select(libraries: list[Library], wanted: tuple[str, ...] | None) -> list[Library]:
    """The libraries to prove, in display order; the others get their status."""
    chosen = []
    for lib in libraries:
        if lib.version is None:
            continue
        if lib.key not in PEERS:
            lib.status = "listed"
        elif wanted is not None and lib.key not in wanted:
            lib.status = "not selected"
        else:
            chosen.append(lib)
    return chosen


def _readonly_home(chosen: list[Library]) -> str | None:
    """Where the read-only protection check runs: with PyTorch, else NumPy, else here (None)."""
    keys = {lib.key for lib in chosen}
    return next((k for k in ("torch", "numpy") if k in keys), None)


def _child_args(home: str | None) -> Callable[[Library], list[str]]:
    def args(lib: Library) -> list[str]:
        return ["--readonly-check"] if lib.key == home else []

    return args


def _start_child(options: Options, libraries: list[Library]) -> ChildCheck | None:
    torch_found = any(lib.key == "torch" and lib.version for lib in libraries)
    if not (options.child_checks and torch_found):
        return None
    if options.peers is not None and "torch" not in options.peers:
        return None
    return ChildCheck()  # runs on another core while this process works


def _own_checks(readonly: bool, progress: Callable[[str], None]) -> list[Check]:
    """The checks that need no peer, run here (``readonly``: the read-only protection one too)."""
    checks = []
    for registered, fn in CHECKS:
        home = HOMES.get(registered)
        if home == "readonly" and readonly:
            name = readonly_protection_name(())
        elif home is None:
            name = registered
        else:
            continue
        progress(f"check: {name}")
        checks.append(run_check(name, fn, {}))
    return checks


def _check_order(check: Check) -> int:
    names = [name for name, _ in CHECKS]
    if check.name.startswith(READONLY_PROTECTION):
        return names.index(READONLY_PROTECTION)
    return names.index(check.name) if check.name in names else len(names)


def run(options: Options, stderr: TextIO | None = None) -> Report:
    """Find the libraries, prove every cell and check (each peer in its own process), and return
    the report."""
    start = time.perf_counter()
    progress = Progress(options.progress, stderr or sys.stderr)
    libraries = find_libraries()
    chosen = _select(libraries, options.peers)
    home = _readonly_home(chosen)
    child = _start_child(options, libraries)
    scale = start_scaleout(libraries, options.peers) if options.child_checks else None
    found: list[PeerResult] = []

    def prove() -> None:
        found.extend(prove_peers(chosen, _child_args(home), progress, options.jobs))

    peers_thread = threading.Thread(target=prove, name="tensorbridge-doctor-peers", daemon=True)
    try:
        peers_thread.start()
        tbside = TensorbridgeSide()
        ex = Exchange(tbside)
        matrix: list[Cell] = []
        dtypes: list[Cell] = []
        for job in plan(tbside, [], []):
            progress(job.label)
            cell = ex.run(job.p, job.c, job.device, job.route, job.dtype, unaligned=job.unaligned)
            (matrix if job.kind == "matrix" else dtypes).append(cell)
        checks = _own_checks(home is None, progress)
        peers_thread.join()
        for result in found:
            for _, (kind, cell) in sorted(result.cells.items()):
                (matrix if kind == "matrix" else dtypes).append(cell)
            checks += result.checks
        checks.sort(key=_check_order)
        if child is not None and any(
            r.library.key == "torch" and r.library.status == "used" for r in found
        ):
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
    for lib in libraries:
        numpy_used = any(r.library.key == "numpy" and r.library.status == "used" for r in found)
        if lib.key == "ml_dtypes" and lib.version and numpy_used:
            lib.status, lib.error = "used", None  # through NumPy's extended dtypes
    devices = sorted({d for r in found for d in r.library.devices if d.startswith("cuda")})
    report = Report(libraries, ["cpu", *devices], matrix, dtypes, checks, found)
    report.elapsed_s = time.perf_counter() - start
    return report
