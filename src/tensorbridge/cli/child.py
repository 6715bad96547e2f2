"""One peer proved in a process of its own: ``python -m tensorbridge.cli.child KEY [options]``.

The doctor starts one such process per peer (`families`), so that a peer that aborts or segfaults
(or two peers that crash each other when imported together) ends that process, not the doctor.
It imports the peer (and NumPy, the library each peer is exchanged with directly), proves every
cell of `plan` from ``--start`` on, the safety checks that need this peer, and the peer's own
defects, and reports each as one JSON line on its standard output, as soon as it is known:

``{"library": {...}}``, ``{"begin": i, "step": text}`` (before cell ``i``), ``{"cell": i, "kind":
..., "data": {...}}``, ``{"check": {...}}``, ``{"defect": {...}}``, ``{"step": text}``, ``{"done":
true}``. What the peer itself prints goes to standard error.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TextIO

from .checks import CHECKS, HOMES, readonly_protection_name, run_check
from .errors import one_line
from .exchange import Exchange
from .plan import plan
from .registry import load_side
from .sides import Side, TensorbridgeSide

__all__ = ["main"]


def _channel() -> TextIO:
    """The report stream: this process's stdout, with file descriptor 1 pointed at stderr so that
    a peer's own prints (Warp's banner, TensorFlow's logs) cannot mix into the report."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tensorbridge.cli.child")
    parser.add_argument("key")
    parser.add_argument("--start", type=int, default=0, help="the first cell to prove")
    parser.add_argument("--no-checks", action="store_true", help="prove the cells only")
    parser.add_argument("--readonly-check", action="store_true")
    parser.add_argument("--no-partner", action="store_true", help="do not import NumPy")
    return parser


def _load(key: str, emit: Callable[..., None]) -> Side | None:
    """The peer's side, reported; None (and the reason reported) when it cannot be used."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            side = load_side(key)
            devices = list(side.devices())
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a peer's import must not hide its reason
        emit(library={"status": "import failed", "error": one_line(exc)})
        return None
    if not devices:  # CuPy without a GPU
        emit(library={"status": "no device", "error": f"{side.label} found no device it runs on"})
        return None
    emit(library={"status": "used", "devices": devices})
    return side


def _partners(key: str, wanted: bool) -> list[Side]:
    """NumPy, the library each peer is exchanged with directly (none where it does not load)."""
    if key == "numpy" or not wanted:
        return []
    with contextlib.suppress(Exception):  # no NumPy: proved against tensorbridge alone
        return [load_side("numpy")]
    return []


def _checks(side: Side, partners: list[Side], readonly: bool, emit: Callable[..., None]) -> None:
    """The safety checks that need this peer, then its own defects."""
    sides = {s.key: s for s in [*partners, side]}
    for registered, fn in CHECKS:
        home = HOMES.get(registered)
        if home == "readonly" and readonly:
            name = readonly_protection_name(sides)
        elif home == side.key:
            name = registered
        else:
            continue
        emit(step=f"check: {name}")
        emit(check=asdict(run_check(name, fn, sides)))
    emit(step=f"looking for {side.label}'s own defects")
    try:
        for defect in side.defects():
            emit(defect=asdict(defect))
    except Exception as exc:  # a probe that failed tells nothing about the peer
        emit(step=f"the defect probes stopped: {one_line(exc)}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = _channel()
    faulthandler.enable()  # a crash names the Python line it happened on, on stderr

    def emit(**fields: Any) -> None:
        out.write(json.dumps(fields) + "\n")

    side = _load(args.key, emit)
    if side is not None:
        partners = _partners(args.key, not args.no_partner)
        tbside = TensorbridgeSide()
        ex = Exchange(tbside)
        for i, job in enumerate(plan(tbside, [side], partners)):
            if i < args.start:
                continue
            where = {"producer": job.p.key, "consumer": job.c.key, "device": job.device}
            where |= {"route": job.route, "dtype": job.dtype}
            emit(begin=i, step=job.label, kind=job.kind, cell=where)
            cell = ex.run(job.p, job.c, job.device, job.route, job.dtype, unaligned=job.unaligned)
            emit(cell=i, kind=job.kind, data=asdict(cell))
        if not args.no_checks:
            _checks(side, partners, args.readonly_check, emit)
    emit(done=True)
    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
