"""The doctor's text report, and the column tables it is made of (also used by ``bench``)."""

from __future__ import annotations

import platform
import re
import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

import tensorbridge as tb
from tensorbridge.testing import DTYPES

from .checks import SUBINTERPRETER, Check
from .environment import Library, install_spec
from .exchange import BROKEN, COPIED, CRASHED, NONE, REFUSED, SHARED, Cell, writable_sides
from .registry import PEERS

if TYPE_CHECKING:
    from .doctor import Report
    from .families import PeerResult

__all__ = [
    "SUMMARY_LINES",
    "WIDTH",
    "can_print_marks",
    "no_library_hint",
    "render",
    "summary",
    "table",
]

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
    "shared: a write through the producer was seen through the consumer. shared*: the doctor could "
    "not write through the producer (its memory is read-only or immutable: bytes, JAX arrays...), "
    "so it proved the sharing by the address: both sides report the same memory; this says "
    "nothing about whether either view may be written (a footnote says so where a view of "
    "read-only memory is writable). copied: the values arrived, in memory of the consumer's own "
    "(a copy, or a conversion to another dtype). no: a side refused (who and why in the "
    "footnote). -: not tried: the consumer has no entry point for this object, or the producer "
    "cannot make it. Blank: not in the plan (each peer is proved in a process of its own, with "
    "NumPy and tensorbridge only). CRASH: the peer's process died (see Peers). wrong: the "
    "consumer read other values than the producer holds, on a direct exchange (the peers' fault). "
    "BROKEN: tensorbridge broke a guarantee. The doctor allocates 64-byte-aligned memory; a/b: a "
    "over such memory, b over memory that is not (for consumers that share only aligned memory). "
    "[n]: the reasons below."
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
    """``numpy>tb>torch``; ``jax>tb`` (into tensorbridge), ``tb>jax`` (out of it), ``jax>tb>jax``
    (there and back: not the same row as ``jax>tb``)."""
    hops = [cell.producer, "tensorbridge", cell.consumer]
    names = ["tb" if h == "tensorbridge" else h for h in hops]
    return ">".join(h for i, h in enumerate(names) if i == 0 or h != names[i - 1])


def _dtype_lines(cells: list[Cell]) -> list[str]:
    if not cells:
        return []
    pairs = list(dict.fromkeys(_pair(c) for c in cells))
    grid = {(_pair(c), c.dtype): c for c in cells}
    standard = [d.name for d in DTYPES if d.name in _SHORT and d.name != "float4_e2m1fn_x2"]
    low = [d.name for d in DTYPES if d.name not in standard]
    legend = (
        "dtype coverage through tensorbridge, cpu: = shared; c copied, or converted by the "
        "consumer; x refused by a peer; r refused by tensorbridge as documented (a read-only "
        "tensor asked for as a legacy capsule, or a consumer that has no type for these "
        "elements); . not tried (the producer has no such dtype, or the consumer takes no such "
        "object); # the peer's process died (see Peers); ? a peer read other values; ! BROKEN"
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
    return [*lines, ""]


def no_library_hint(libraries: list[Library]) -> str | None:
    """Why the run used no array library and what to do; None when it used one."""
    if any(lib.status == "used" for lib in libraries):
        return None
    exchangeable = [lib for lib in libraries if lib.key in PEERS]
    unselected = [lib.name for lib in exchangeable if lib.status == "not selected"]
    failed = [lib.name for lib in exchangeable if lib.status == "import failed"]
    text = (
        "No array library was used: the doctor proved the standard library's buffers, two files "
        "and tensorbridge only."
    )
    if unselected:
        text += (
            f" To prove the ones installed here too ({', '.join(unselected)}), run without "
            f"--peers and with TB_DOCTOR_PEERS unset."
        )
    elif failed:
        names = ", ".join(failed) if len(failed) <= 3 else f"{len(failed)} libraries"
        text += f" {names} failed to import (the reasons are above); fix that first."
    else:
        text += (
            " To prove exchanges with array libraries, install one or more of them (the pip "
            "line below) and run the doctor again."
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


# The summary: what a new user reads first.

SUMMARY_LINES: Final = 25  # the summary fits one terminal screen
# The libraries the doctor uses besides the peers: NumPy's extended dtypes, and the two transports
# between processes its checks prove. The install line offers them too.
_HELPERS: Final = ("ml_dtypes", "ray", "dask")
_UNICODE_MARKS: Final = ("\u2713", "\u2717")  # check mark, ballot x
_ASCII_MARKS: Final = ("yes", "no")


_KEY: Final = (
    "Each library with tensorbridge (tb): into tb, its arrays read by tb; out of tb, the reverse"
)


def can_print_marks(stream: object) -> bool:
    """Whether ``stream``'s encoding can print the summary's check marks (else: yes / no)."""
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        "".join(_UNICODE_MARKS).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _clip(text: str, width: int = WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def _arrived(cell: Cell) -> bool:
    return cell.outcome in (SHARED, COPIED)


def _direction(cells: list[Cell], ok: str, no: str) -> str:
    """One direction's mark: the values arrived at least once, and nothing crashed or broke."""
    if any(c.outcome in (CRASHED, BROKEN) for c in cells) or not any(map(_arrived, cells)):
        return no
    return ok


def _zero_copy(cells: list[Cell], ok: str, no: str) -> str:
    """Of the exchanges whose values arrived (each dtype, both directions), how many shared."""
    arrived = [c for c in cells if _arrived(c)]
    shared = sum(c.outcome == SHARED for c in arrived)
    if not arrived:
        return ""
    if shared == len(arrived):
        return ok
    if not shared:
        return no
    return f"{shared}/{len(arrived)}"  # dtypes shared, of those whose values arrived


def _writable_note(key: str, cells: list[Cell]) -> str:
    """Why read-only memory ended up writable on ``key``'s side (the first reason seen)."""
    for cell in cells:
        if key not in writable_sides(cell):
            continue
        if cell.producer == key:
            return "exports its read-only arrays writable"
        if any(n.startswith(f"{key} has no read-only arrays") for n in cell.notes):
            return "has no read-only arrays"
        return "ignores the read-only mark"
    return ""


def _crash_note(crashes: list[str], *, went_on: bool) -> str:
    """``crashed: SIGSEGV (signal 11) while importing TVM FFI`` (the first crash, short)."""
    found = re.search(r"died with (.+?) while (.+?)(?: \(|$)", crashes[0]) if crashes else None
    how = f"{found[1]} while {found[2]}" if found else (crashes[0] if crashes else "")
    times = "" if len(crashes) < 2 else f" {len(crashes)} times"
    return f"crashed{times}{', went on' if went_on else ''}: {how}".rstrip(": ")


def _peer_row(result: PeerResult, marks: tuple[str, str]) -> tuple[list[str], str]:
    """A peer's columns in the summary, and its note."""
    ok, no = marks
    lib = result.library
    if lib.status == "crashed":
        return [lib.name, no, no, "", ""], _crash_note(result.crashes, went_on=False)
    if lib.status != "used":
        why = lib.error or ""
        return [lib.name, no, no, "", ""], f"{lib.status}: {why}".rstrip(": ")
    cells = [c for kind, c in result.cells.values() if c.route == "tensorbridge"]
    into = [c for c in cells if (c.producer, c.consumer) == (lib.key, "tensorbridge")]
    out = [c for c in cells if (c.producer, c.consumer) == ("tensorbridge", lib.key)]
    pairs = {(lib.key, "tensorbridge"), ("tensorbridge", lib.key)}
    counted = [
        c
        for kind, c in result.cells.values()
        if kind == "dtypes" and c.route == "tensorbridge" and (c.producer, c.consumer) in pairs
    ]
    lost = _writable_note(lib.key, cells)
    notes = []
    if result.crashes:
        notes.append(_crash_note(result.crashes, went_on=True))
    if lost:
        notes.append(lost)
    for name, way in (("into tb", into), ("out of tb", out)):
        copied = [_short(c.dtype) for c in counted if c in way and c.outcome == COPIED]
        if any("has no memory of its own" in n for c in way for n in c.notes):
            notes.append(f"{name}: it computes each export")
        elif copied:
            what = ", ".join(copied) if len(copied) <= 2 else f"{len(copied)} dtypes"
            notes.append(f"{name} copies {what}")
    row = [
        lib.name,
        _direction(into, ok, no),
        _direction(out, ok, no),
        _zero_copy(counted or into + out, ok, no),
        no if lost else ok,
    ]
    return row, "; ".join(notes)


def _peer_table(report: Report, marks: tuple[str, str], merge: bool) -> list[str]:
    """One line per peer the run tried; with ``merge``, those it could not use share one line."""
    results = list(report.peers)
    unusable = [r for r in results if r.library.status != "used"] if merge else []
    shown = [r for r in results if r not in unusable]
    lines = []
    if shown:
        rows, notes = zip(*(_peer_row(r, marks) for r in shown), strict=True)
        headers = ["library", "into tb", "out of tb", "zero-copy", "read-only"]
        body = table(headers, rows, width=10 * WIDTH)  # one block: the note follows each row
        width = len(body[0])
        lines += [body[0] + ("  notes" if any(notes) else "")]
        lines += [
            _clip(f"{row:<{width}}  {note}".rstrip())
            for row, note in zip(body[1:], notes, strict=True)
        ]
    if unusable:
        names = ", ".join(f"{r.library.name} ({r.library.status})" for r in unusable)
        lines.append(_clip(f"  {marks[1]} not usable here: {names}"))
    return lines


def _install_lines(libraries: list[Library]) -> list[str]:
    """``python -m pip install ...`` for the libraries the doctor would use but cannot find."""
    missing = [
        install_spec(lib.key)
        for lib in libraries
        if lib.version is None and (lib.key in PEERS or lib.key in _HELPERS)
    ]
    if not missing:
        return []
    words = ["Also supported, not installed:", "python", "-m", "pip", "install", *missing]
    lines = textwrap.wrap(
        " ".join(words),
        WIDTH - 2,
        subsequent_indent="    ",
        break_long_words=False,
        break_on_hyphens=False,  # a name split at its hyphen would be two names to the shell
    )
    return [line + " \\" for line in lines[:-1]] + lines[-1:]


def _verdict(report: Report) -> str:
    if report.ok:
        tried = sum(c.outcome != NONE for c in (*report.matrix, *report.dtypes))
        return (
            f"OK: tensorbridge kept every guarantee it checked ({tried:,} exchanges, "
            f"{len(report.checks)} safety checks; {report.elapsed_s:.1f} s)."
        )
    n = len(report.broken)
    return f"BROKEN: tensorbridge broke {n} guarantee{'s' if n != 1 else ''} (listed below)."


def _interpreter_lines(report: Report, marks: tuple[str, str]) -> list[str]:
    """A line for the subinterpreter check where it ran (CPython 3.14 and later)."""
    for check in report.checks:
        if check.name == SUBINTERPRETER and check.ok is not None:
            said = "without a copy" if check.ok else "FAILED (below)"
            there = "pure-Python" if "pure-python there" in check.detail else "compiled"
            return [
                _clip(f"subinterpreters: {marks[not check.ok]} tensors cross {said}; {there} there")
            ]
    return []


def summary(report: Report, *, ascii_only: bool = False) -> list[str]:
    """The report's first lines (at most `SUMMARY_LINES`): the build, the verdict, one line per
    peer, what to install, and where the details are."""
    marks = _ASCII_MARKS if ascii_only else _UNICODE_MARKS
    build = tb.build_info()
    if build.kind == "pure-python":
        built = "pure-Python" + (f": {build.reason}" if build.reason else "")
    else:
        built = str(build)  # compiled (Cython 3.x; n modules), and any module that was not
    head = [
        f"tensorbridge {tb.__version__} doctor, Python {platform.python_version()} "
        f"({platform.python_implementation()}) on {platform.system()} {platform.machine()}",
        _clip(f"build: {built}"),
        _verdict(report),
        *_interpreter_lines(report, marks),
    ]
    hint = no_library_hint(report.libraries)
    hint_lines = textwrap.wrap(hint, WIDTH) if hint else []
    install = _install_lines(report.libraries)
    defects = len(report.defects)
    more = "every exchange, dtype and check" + (
        f"; {defects} defect{'s' if defects != 1 else ''} of the libraries, with fixes"
        if defects
        else ""
    )
    tail = [_clip(f"More: --verbose ({more}) or --json")]
    table_lines = _peer_table(report, marks, merge=False)
    key = [_KEY] if table_lines else []
    # The fullest layout that fits: with the columns' key and blank lines, then without the key,
    # then without blank lines, then with the peers that could not be used on one line.
    for merge, explain, blank in ((0, 1, 1), (0, 0, 1), (0, 0, 0), (1, 0, 0)):
        gap = [""] if blank else []
        peers = _peer_table(report, marks, merge=True) if merge else table_lines
        lines = [*head, *gap, *(key if explain else []), *peers, *hint_lines, *install]
        lines += [*gap, *tail]
        if len(lines) <= SUMMARY_LINES:
            break
    return lines[:SUMMARY_LINES]


def render(report: Report, *, verbose: bool = False, ascii_only: bool = False) -> str:
    """The human-readable report; every line fits in `WIDTH` columns.

    First the `summary`; then, when tensorbridge broke a guarantee, each one. With ``verbose``,
    everything the doctor proved follows: the libraries, the exchange matrices with their legend
    and footnotes, the dtype coverage, the peers, their own defects and the safety checks.
    """
    lines = summary(report, ascii_only=ascii_only)
    if verbose:
        lines += ["", *_details(report)]  # ends with the verdict and each broken guarantee
    elif not report.ok:
        lines += ["", *_broken_lines(report)]
    text = "\n".join(line[:WIDTH].rstrip() for line in lines) + "\n"
    return text if not ascii_only else text.encode("ascii", "replace").decode("ascii")


def _details(report: Report) -> list[str]:
    """Everything the doctor proved, after the summary (``--verbose``)."""
    lines = [
        f"Python {platform.python_version()} ({platform.python_implementation()}) on "
        f"{platform.platform()}",
        f"build: {tb.build_info()}",
        "",
        *_library_lines(report.libraries),
    ]
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
    return [*lines, _verdict(report), *_broken_lines(report)]


def _broken_lines(report: Report) -> list[str]:
    lines = []
    for item in report.broken:
        lines += textwrap.wrap(item, WIDTH, initial_indent="  - ", subsequent_indent="    ")
    return lines
