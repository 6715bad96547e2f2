"""Which cells the doctor proves, as a list of jobs in a fixed order: the same list in the doctor's
own process (no peer: the standard library, the files and tensorbridge) and in each peer's process
(the cells that involve that peer), so that a process that died can be started again after the
cell it died in."""

from __future__ import annotations

from dataclasses import dataclass

from tensorbridge.testing import DTYPES

from .files import FileSide, file_producers
from .sides import MemoryviewSide, Side, Stdlib, TensorbridgeSide, stdlib_producers

__all__ = ["Job", "plan"]


@dataclass(frozen=True)
class Job:
    """One cell to prove: ``kind`` is ``"matrix"`` (one dtype, every pair, both routes) or
    ``"dtypes"`` (one pair through tensorbridge, one dtype)."""

    kind: str
    p: Side
    c: Side
    device: str
    route: str
    dtype: str
    unaligned: bool = False

    @property
    def label(self) -> str:
        if self.kind == "dtypes":
            return f"dtypes: {self.p.key} -> {self.c.key} ({self.dtype})"
        via = " -> tb" if self.route == "tensorbridge" else ""
        return f"exchange {self.device}: {self.p.key}{via} -> {self.c.key}"


def plan(tbside: TensorbridgeSide, own: list[Side], partners: list[Side]) -> list[Job]:
    """Every cell of a process: with ``own`` empty, the cells that need no peer; else the cells
    with one of ``own`` (the peer proved here) on either side, ``partners`` (NumPy) as the other
    library they are exchanged with directly."""

    def mine(p: Side, c: Side) -> bool:
        return not own or p in own or c in own

    sides = [*partners, *own]
    files = file_producers()
    producers: list[Side] = [*stdlib_producers(), *files, *sides, tbside]
    consumers: list[Side] = [tbside, MemoryviewSide(), *sides]
    devices = ["cpu", *sorted({d for s in sides for d in s.devices() if d.startswith("cuda")})]
    jobs = []
    for device in devices:
        for p in producers:
            if device not in p.devices() and p is not tbside:
                continue
            dtype = p.dtypes()[0] if isinstance(p, Stdlib) else "int32"
            for c in consumers:
                if (device not in c.devices() and c is not tbside) or not mine(p, c):
                    continue
                jobs.append(Job("matrix", p, c, device, "tensorbridge", dtype, unaligned=True))
                if tbside not in (p, c) and not isinstance(p, FileSide):  # files need a loader
                    jobs.append(Job("matrix", p, c, device, "direct", dtype, unaligned=True))
    typed = [s for s in sides if s.dtypes() and "cpu" in s.devices()]
    dtype_consumers = [tbside, *(s for s in typed if s in own or s.protocol in ("dlpack", "both"))]
    for p in [*files, *typed, tbside]:
        for c in dtype_consumers:
            if p is c is tbside or not mine(p, c):
                continue
            jobs += [Job("dtypes", p, c, "cpu", "tensorbridge", d.name) for d in DTYPES]
    return jobs
