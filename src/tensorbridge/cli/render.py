"""The doctor's text report, and the column tables it is made of (also used by ``bench``)."""

from __future__ import annotations

import platform
import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

import tensorbridge as tb
from tensorbridge.testing import DTYPES

from .checks import Check
from .environment import Library
from .exchange import BROKEN, COPIED, CRASHED, NONE, REFUSED, SHARED, Cell
from .registry import PEERS

if TYPE_CHECKING:
    from .doctor import Report

__all__ = ["WIDTH", "no_library_hint", "render", "table"]

WIDTH: Final = 100  # the output fits a 100-column terminal


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  ", width: int = WIDTH
) -> list[str]:
    """Left-aligned columns; when too wide, split into blocks of columns that repeat column 0."""
    rows = [list(r) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    blocks: list[list[int]] = [[]]
    used = len(indent) + widths[0]
    for i in range(1, len(headers)):
        if used + 2 + widths[i] > width and blocks[-1]:
            blocks.append([])
            used = len(indent) + widths[0]
        blocks[-1].append(i)
        used += 2 + widths[i]
    lines = []
    for n, block in enumerate(blocks):
        if n:
            lines.append("")
        for row in (headers, *rows):
            cols = [0, *block]
            lines.append((indent + "  ".join(f"{row[i]:<{widths[i]}}" for i in cols)).rstrip())
    return lines


class _Footnotes:
    def __init__(self) -> None:
        self.texts: dict[str, int] = {}

    def ref(self, text: str) -> int:
        return self.texts.setdefault(text, len(self.texts) + 1)

    def lines(self) -> list[str]:
        out = []
        for text, n in self.texts.items():
            first = f"  [{n}] "
            out += textwrap.wrap(
                text, WIDTH, initial_indent=first, subsequent_indent=" " * len(first)
            )
        return out


def _outcome_text(outcome: str, proof: str | None, blame: str | None) -> str:
    if outcome == NONE:
        return "-"
    if outcome == SHARED:
        return "shared" if proof in ("write", None) else "shared*"
    if outcome == COPIED:
        return "copied"
    if outcome == REFUSED:
        return "no"
    if outcome == CRASHED:
        return "CRASH"
    return "BROKEN" if blame == "tensorbridge" else "wrong"


def _cell_text(cell: Cell | None, notes: _Footnotes) -> str:
    if cell is None:
        return ""
    if cell.outcome == NONE:
        return "-"
    text = _outcome_text(cell.outcome, cell.proof, cell.blame)
    if cell.unaligned is not None and cell.unaligned != cell.outcome:
        text += "/" + _outcome_text(cell.unaligned, cell.proof, None)
    detail = cell.reason if cell.outcome != SHARED else None
    detail = "; ".join(filter(None, [detail, *cell.notes]))
    if detail:
        who = (
            f"{cell.blame}: "
            if cell.blame and cell.reason and not cell.reason.startswith(cell.blame)
            else ""
        )
        text += f" [{notes.ref(who + detail)}]"
    return text


_LEGEND: Final = (
    "shared: a write through the producer was read through the consumer; shared*: neither side "
    "may be written, both see the same address; copied: the values arrived, the memory is not "
    "shared; no: refused; -: no common protocol; CRASH: the peer's process died (see Peers); "
    "BROKEN: tensorbridge broke a guarantee. The "
    "doctor allocates 64-byte-aligned memory; a/b: a over such memory, b over memory that is not "
    "(for consumers that share only aligned memory). [n]: the reasons below."
)


def _matrix_lines(title: str, cells: list[Cell], route: str, device: str) -> list[str]:
    chosen = [c for c in cells if c.route == route and c.device == device]
    producers = list(dict.fromkeys(c.producer for c in chosen))
    consumers = list(dict.fromkeys(c.consumer for c in chosen))
    if route == "direct":
        consumers = [c for c in consumers if c != "tensorbridge"]
    grid = {(c.producer, c.consumer): c for c in chosen}
    notes = _Footnotes()
    rows = [[p] + [_cell_text(grid.get((p, c)), notes) for c in consumers] for p in producers]
    if not rows:
        return []
    return [title, *table(["producer \\ consumer", *consumers], rows), *notes.lines(), ""]


_SHORT: Final = {
    "bool": "bool",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "complex32": "c32",
    "complex64": "c64",
    "complex128": "c128",
    "float4_e2m1fn_x2": "f4x2",
}


def _short(dtype: str) -> str:
    return _SHORT.get(dtype, dtype.removeprefix("float8_").replace("e8m0fnu", "e8m0"))


def _dtype_mark(cell: Cell) -> str:
    if cell.outcome == BROKEN:
        return "!" if cell.blame == "tensorbridge" else "?"
    if cell.outcome == SHARED:
        return "="
    if cell.outcome == COPIED:
        return "c"
    if cell.outcome == REFUSED:
        return "r" if cell.blame == "tensorbridge" else "x"
    if cell.outcome == CRASHED:
        return "#"
    return "."


def _pair(cell: Cell) -> str:
    hops = [cell.producer, "tensorbridge", cell.consumer]
    return ">".join(dict.fromkeys("tb" if h == "tensorbridge" else h for h in hops))


def _dtype_lines(cells: list[Cell]) -> list[str]:
    if not cells:
        return []
    pairs = list(dict.fromkeys(_pair(c) for c in cells))
    grid = {(_pair(c), c.dtype): c for c in cells}
    standard = [d.name for d in DTYPES if d.name in _SHORT and d.name != "float4_e2m1fn_x2"]
    low = [d.name for d in DTYPES if d.name not in standard]
    legend = (
        "dtype coverage through tensorbridge, cpu: = shared; c copied or converted by the "
        "consumer; x refused by a peer; r refused by tensorbridge as documented (a read-only "
        "tensor asked for as a legacy capsule); . the producer has no such dtype; # the peer's process "
        "died (see Peers); ! BROKEN"
    )
    lines = textwrap.wrap(legend, WIDTH)
    for names in (standard, low):
        rows = [
            [pair] + [_dtype_mark(grid[pair, d]) if (pair, d) in grid else "" for d in names]
            for pair in pairs
        ]
        lines += table(["pair", *(_short(d) for d in names)], rows)
        lines.append("")
    return lines


def _library_lines(libraries: list[Library]) -> list[str]:
    rows = []
    notes = _Footnotes()
    for lib in libraries:
        if lib.version is None:
            continue
        status = lib.status + (f" [{notes.ref(lib.error)}]" if lib.error else "")
        rows.append([lib.name, lib.version, ", ".join(lib.devices) or "-", status])
    missing = [lib.name for lib in libraries if lib.version is None]
    lines = ["Array libraries (versions from the installed metadata; devices of the ones used)"]
    lines += table(["library", "version", "devices", "status"], rows) if rows else ["  none"]
    lines += notes.lines()
    if any(lib.status == "listed" for lib in libraries):
        lines += textwrap.wrap(
            "listed: installed; the doctor exchanges with " + ", ".join(PEERS) + " only",
            WIDTH,
            initial_indent="  ",
            subsequent_indent="  ",
        )
    if missing:
        lines += textwrap.wrap(
            "not installed: " + ", ".join(missing),
            WIDTH,
            initial_indent="  ",
            subsequent_indent="  ",
        )
    hint = no_library_hint(libraries)
    if hint:
        lines += ["", *textwrap.wrap(hint, WIDTH)]
    return [*lines, ""]


def no_library_hint(libraries: list[Library]) -> str | None:
    """How to see the full matrix when the run used no array library; None when it used one."""
    if any(lib.status == "used" for lib in libraries):
        return None
    exchangeable = [lib for lib in libraries if lib.key in PEERS]
    unselected = [lib.name for lib in exchangeable if lib.status == "not selected"]
    failed = [lib.name for lib in exchangeable if lib.status == "import failed"]
    names = ", ".join(lib.name for lib in exchangeable)
    text = (
        "No array library was used, so the matrix shows the standard library and tensorbridge only."
    )
    if unselected:
        text += (
            f" To see the full matrix, run without --peers and with TB_DOCTOR_PEERS unset "
            f"(installed here: {', '.join(unselected)})."
        )
    elif failed:
        text += f" {', '.join(failed)} failed to import (the reason is above); fix that first."
    else:
        text += (
            f" To see the full matrix, install one or more of {names} "
            f"(python -m pip install numpy) and run the doctor again."
        )
    return text


def _count(cells: list[Cell], producer: str, consumer: str) -> str:
    """``"12/15"``: dtypes shared of those the pair tried (the producer could make)."""
    pair = [
        c for c in cells if (c.producer, c.consumer) == (producer, consumer) and c.outcome != NONE
    ]
    if not pair:
        return "-"
    return f"{sum(c.outcome == SHARED for c in pair)}/{len(pair)}"


def _peer_lines(report: Report) -> list[str]:
    if not report.peers:
        return []
    rows = []
    notes = _Footnotes()
    for result in report.peers:
        lib = result.library
        cells = [cell for kind, cell in result.cells.values() if kind == "dtypes"]
        verdict = lib.status
        if lib.status == "used":
            verdict = "crashed, went on" if result.crashes else "proved"
        if lib.error or result.crashes:
            why = lib.error or "; ".join(result.crashes)
            verdict += f" [{notes.ref(why)}]"
        rows.append(
            [
                lib.name,
                _count(cells, lib.key, "tensorbridge"),
                _count(cells, "tensorbridge", lib.key),
                f"{result.seconds:.1f} s",
                verdict,
            ]
        )
    lines = textwrap.wrap(
        "Peers, each proved in a process of its own (dtypes shared with no copy, read-only "
        "checked; into tb: the peer's arrays imported by tensorbridge; out of tb: tensorbridge's "
        "tensors imported by the peer)",
        WIDTH,
    )
    lines += table(["peer", "into tb", "out of tb", "time", "result"], rows)
    lines += notes.lines()
    defects = report.defects
    if defects:
        lines += ["", "The peers' own defects (not tensorbridge's), and what to do"]
        names = {r.library.key: r.library.name for r in report.peers}
        for d in defects:
            seen = "" if d.seen else " (known; not tried here, it would end the process)"
            lines += textwrap.wrap(
                f"{names.get(d.peer, d.peer)}: {d.what}{seen}. What to do: {d.fix}",
                WIDTH,
                initial_indent="  - ",
                subsequent_indent="    ",
            )
    return [*lines, ""]


def _check_lines(checks: list[Check]) -> list[str]:
    lines = ["Safety checks"]
    for check in checks:
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[check.ok]
        lines += textwrap.wrap(
            f"{mark}  {check.name}: {check.detail}",
            WIDTH,
            initial_indent="  ",
            subsequent_indent="        ",
        )
    return [*lines, ""]


def render(report: Report) -> str:
    """The human-readable report; every line fits in `WIDTH` columns."""
    head = [
        f"tensorbridge {tb.__version__} doctor",
        f"Python {platform.python_version()} ({platform.python_implementation()}) on "
        f"{platform.platform()}",
        f"build: {tb.build_info()}",
    ]
    lines = [*head, "", *_library_lines(report.libraries)]
    for device in report.devices:
        lines += _matrix_lines(
            f"Exchange through tensorbridge, {device}: producer -> tb -> consumer",
            report.matrix,
            "tensorbridge",
            device,
        )
        lines += _matrix_lines(
            f"Direct exchange, {device}: producer -> consumer (for comparison)",
            report.matrix,
            "direct",
            device,
        )
    lines += [*textwrap.wrap(_LEGEND, WIDTH), ""]
    lines += _dtype_lines(report.dtypes)
    lines += _peer_lines(report)
    lines += _check_lines(report.checks)
    if report.ok:
        lines.append(f"OK: tensorbridge kept every guarantee checked ({report.elapsed_s:.1f} s).")
    else:
        lines.append(
            f"BROKEN: tensorbridge broke {len(report.broken)} guarantee(s) "
            f"({report.elapsed_s:.1f} s):"
        )
        for item in report.broken:
            lines += textwrap.wrap(item, WIDTH, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(line[:WIDTH].rstrip() for line in lines) + "\n"
