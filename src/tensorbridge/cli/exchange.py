"""One exchange cell, run and proved: a producer's object handed to a consumer through tensorbridge
or directly, its values checked, shared memory told from a copy (by a write, or by the address
where neither side may be written), and a failure attributed to the producer, the consumer or
tensorbridge."""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Final

import tensorbridge as tb
from tensorbridge.testing import FLAG_READ_ONLY, capsule_flags

from .errors import Unavailable, one_line, raised_in_tensorbridge, warning_text
from .files import FileSide
from .sides import ALIGN, Side, Stdlib, TensorbridgeSide, handoff, is_buffer, pattern

__all__ = [
    "BROKEN",
    "COPIED",
    "CRASHED",
    "NONE",
    "REFUSED",
    "SHARED",
    "Cell",
    "Exchange",
    "writable_sides",
]

SHARED, COPIED, REFUSED, BROKEN, NONE = "shared", "copied", "refused", "broken", "n/a"
CRASHED = "crashed"  # the peer's process died during the exchange (`families`)
_TRIES: Final = 64  # allocations tried for a wanted alignment before giving up


@dataclass
class Cell:
    """One proved exchange.

    Attributes:
        producer, consumer: side keys.
        device: ``"cpu"`` or ``"cuda:0"``...
        route: ``"tensorbridge"`` (producer -> tensorbridge -> consumer) or ``"direct"``.
        dtype: the tensorbridge dtype name exchanged.
        outcome: ``shared``, ``copied``, ``refused``, ``broken``, ``crashed`` (the process
            died during it: ``reason`` gives the signal) or ``n/a``.
        proof: ``"write"`` (a write through one side was read through the other) or ``"address"``
            (neither side may be written: both report the same address); None unless shared.
        blame: who refused or broke it (a side key), or None.
        reason: the exception or the mismatch, one line.
        calls: the entry points used (``"tb.from_dlpack -> torch.from_dlpack"``).
        notes: what else was seen (warnings, a writable view of read-only memory, the entry
            points the consumer refused before the one in ``calls`` took the object).
        unaligned: the outcome over producer memory that is not 64-byte aligned, for consumers
            that share only aligned memory (JAX) and producers that can make such memory; None
            where not tested. ``outcome`` is always over 64-byte-aligned memory where the
            producer can make it.
    """

    producer: str
    consumer: str
    device: str
    route: str
    dtype: str
    outcome: str = NONE
    proof: str | None = None
    blame: str | None = None
    reason: str | None = None
    calls: str = ""
    notes: list[str] = field(default_factory=list)
    unaligned: str | None = None


def _exports(x: Any) -> bool:
    """Whether a producer can export itself at all (to tell its refusals from tensorbridge's)."""
    if not hasattr(x, "__dlpack__"):
        return is_buffer(x)
    try:
        try:
            x.__dlpack__(max_version=(1, 0))
        except TypeError:
            x.__dlpack__()
    except Exception:
        return False
    return True


def _arrow_only(x: Any) -> bool:
    """Whether tensorbridge imports ``x`` through an Arrow export (no DLPack, no buffer)."""
    arrow = hasattr(x, "__arrow_c_array__") or hasattr(x, "__arrow_c_stream__")
    return arrow and not hasattr(x, "__dlpack__") and not is_buffer(x)


_DOCUMENTED: Final = (TypeError, ValueError, BufferError, RuntimeError)


def _numpy_can_name(dtype: tb.dtype) -> bool:
    """Whether NumPy (with ml_dtypes, when installed) has a type for elements of ``dtype``."""
    if dtype.typestr is not None:
        return True
    if dtype.ml_dtypes is None:
        return False
    try:
        import ml_dtypes
    except ImportError:
        return False
    return hasattr(ml_dtypes, dtype.ml_dtypes)  # older ml_dtypes lack some (0.5: complex32)


@dataclass
class _Flow:
    """The objects of one exchange: producer side and object, consumer side and result, and the
    tensorbridge tensor in between (None on a direct route)."""

    p: Side
    x: Any
    c: Side
    t: Any = None
    y: Any = None


class Exchange:
    """Runs cells between sides: through tensorbridge and directly."""

    def __init__(self, tbside: TensorbridgeSide) -> None:
        self.tb = tbside

    def run(
        self, p: Side, c: Side, device: str, route: str, dtype: str, *, unaligned: bool = False
    ) -> Cell:
        """One cell over producer memory that is 64-byte aligned wherever the producer allows.

        With ``unaligned`` and a consumer that shares only aligned memory, the exchange runs again
        over memory that is not aligned (where the producer can make such memory), and the cell
        keeps that outcome too: both are facts of the same pair, and each is reproducible.
        """
        cell = self._run(p, c, device, route, dtype, aligned=True)
        assert cell is not None  # an aligned run always gives a cell
        if not (unaligned and c.needs_alignment and device == "cpu") or cell.outcome == NONE:
            return cell
        other = self._run(p, c, device, route, dtype, aligned=False)
        if other is None:  # this producer's memory is always aligned
            return cell
        cell.unaligned = other.outcome
        if other.outcome == BROKEN and cell.outcome != BROKEN:
            cell.outcome, cell.blame = BROKEN, other.blame
            cell.reason = f"over memory that is not {ALIGN}-byte aligned: {other.reason}"
        elif other.outcome != cell.outcome:
            why = [n for n in other.notes if n not in cell.notes] or [other.reason or ""]
            cell.notes.append(
                f"{'; '.join(filter(None, why))}: {cell.outcome} over {ALIGN}-byte-aligned "
                f"memory (as the doctor allocates it), {other.outcome} over memory that is not"
            )
        return cell

    def _make(self, p: Side, dtype: str, raw: bytes, device: str, aligned: bool) -> Any:
        """A producer object whose memory is (or, with ``aligned`` False, is not) 64-byte aligned.

        A side that can place its memory does (`Side.place`). For the others the doctor allocates
        until it gets the alignment it wants: small blocks land on any 16-byte boundary, and the
        misses are kept alive meanwhile so that each try gets a new address. Returns None when no
        try gave the wanted alignment.
        """
        if device != "cpu":  # device allocators align to at least 256 bytes
            return p.make(dtype, raw, device) if aligned else None
        if p.fixed_alignment:
            if (p.fixed_alignment % ALIGN == 0) != aligned:
                return None
            return p.make(dtype, raw, device)
        placed = p.place(dtype, raw, aligned)
        if placed is not None:
            return placed
        missed: list[Any] = []
        try:
            for _ in range(_TRIES):
                x = p.make(dtype, bytes(bytearray(raw)), device)  # a new copy: a new address
                if (p.address(x) % ALIGN == 0) == aligned:
                    return x
                missed.append(x)
            return None
        finally:
            for x in missed:
                p.release(x)

    def _run(
        self, p: Side, c: Side, device: str, route: str, dtype: str, *, aligned: bool
    ) -> Cell | None:
        cell = Cell(p.key, c.key, device, route, dtype)
        raw = pattern(getattr(tb, dtype))
        try:
            x = self._make(p, dtype, raw, device, aligned)
            if x is None and aligned:  # the allocator never gave aligned memory: say so
                x = p.make(dtype, raw, device)
                cell.notes.append(f"{p.key} gave no {ALIGN}-byte-aligned memory in {_TRIES} tries")
        except Unavailable as exc:
            cell.reason = str(exc)
            return cell
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a producer's failure is its own
            cell.reason, cell.blame = one_line(exc), p.key
            return cell
        if x is None:
            return None
        flow = _Flow(p, x, c, t=x if p is self.tb else None)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self._exchange(cell, flow)
            cell.notes += sorted({warning_text(w) for w in caught})
        finally:
            in_path = self._in_path(cell, flow)
            flow.t = flow.y = None  # drop every view before the producer lets go of its memory
            self._release(cell, p, x, in_path)
        return cell

    def _release(self, cell: Cell, p: Side, x: Any, in_path: bool) -> None:
        try:
            p.release(x)
        except BufferError:
            gc.collect()
            try:
                p.release(x)
            except BufferError as exc:
                if in_path:
                    held = f"{p.key}'s export is still held after every view died ({exc})"
                    self._break(cell, held)
                else:  # no tensorbridge object was involved: the consumer keeps the export
                    cell.notes.append(f"{cell.consumer} still holds {p.key}'s buffer export")

    def _break(self, cell: Cell, reason: str) -> None:
        cell.outcome, cell.blame, cell.reason = BROKEN, "tensorbridge", reason

    def _in_path(self, cell: Cell, flow: _Flow) -> bool:
        return cell.route == "tensorbridge" or self.tb in (flow.p, flow.c)

    def _exchange(self, cell: Cell, flow: _Flow) -> None:
        through = cell.route == "tensorbridge"
        calls: list[str] = []
        try:
            if flow.t is None and (through or flow.c is self.tb):
                if isinstance(flow.p, FileSide):  # tensorbridge's import of a file: its loader
                    flow.t, call = flow.p.load(flow.x)
                else:
                    flow.t, call = self.tb.consume(flow.x)
                calls.append(call)
        except Unavailable as exc:
            cell.reason = str(exc)
            return
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # every failure is classified and reported
            cell.calls = " -> ".join(calls)
            self._failed(cell, exc, "import", flow)
            return
        if flow.c is self.tb:
            flow.y = flow.t
        else:
            given = handoff(flow.c, flow.t, calls) if through else flow.x
            if not self._consume(cell, flow, given, calls):
                return
        cell.calls = " -> ".join(calls)
        try:
            self._prove(cell, flow)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # the consumer took it but cannot show its values
            cell.outcome, cell.blame = REFUSED, flow.c.key
            cell.reason = f"{flow.c.key} cannot read what it imported: {one_line(exc)}"

    def _consume(self, cell: Cell, flow: _Flow, given: Any, calls: list[str]) -> bool:
        """Import ``given`` through the consumer's entry points in turn, as its users would: the
        first that takes it wins, and the refusals before it become notes. False when none took it
        (or one broke a guarantee); the cell then says why."""
        try:
            points = flow.c.entry_points(given)
        except Unavailable as exc:
            cell.reason = str(exc)
            return False
        refusals: list[Cell] = []
        for name, call in points:
            try:
                flow.y = call()
            except Unavailable as exc:
                cell.reason = str(exc)
                continue
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                tried = replace(cell, notes=[], calls=" -> ".join([*calls, name]))
                self._failed(tried, exc, "export", flow)
                if tried.outcome == BROKEN:  # no other entry point excuses a broken guarantee
                    cell.outcome, cell.blame, cell.reason = BROKEN, tried.blame, tried.reason
                    cell.calls = tried.calls
                    return False
                refusals.append(tried)
                continue
            calls.append(name)
            cell.reason = None
            cell.notes += [_refusal_note(r) for r in refusals]
            return True
        if refusals:
            first = refusals[0]
            cell.outcome, cell.blame, cell.reason = first.outcome, first.blame, first.reason
            cell.calls = first.calls
            cell.notes += [_refusal_note(r) for r in refusals[1:]]
        return False

    def _failed(self, cell: Cell, exc: BaseException, stage: str, flow: _Flow) -> None:
        """Who refused: the producer (it cannot export this), the consumer, or tensorbridge."""
        cell.reason = one_line(exc)
        if not self._in_path(cell, flow):
            cell.outcome, cell.blame = REFUSED, (flow.p if stage == "import" else flow.c).key
        elif stage == "import" and isinstance(flow.p, FileSide):
            if isinstance(exc, OSError):  # the file system would not map it: not a guarantee
                cell.outcome, cell.blame = REFUSED, flow.p.key
            else:  # the doctor wrote the file as the format specifies
                self._break(cell, f"tensorbridge could not load the {flow.p.key}: {cell.reason}")
        elif stage == "import":
            # Only tensorbridge's entry point and the producer's export ran: if the producer can
            # export, the failure is tensorbridge's, whatever its type.
            if _exports(flow.x):
                reason = f"tensorbridge could not import what {flow.p.key} exports: {cell.reason}"
                self._break(cell, reason)
            else:
                cell.outcome, cell.blame = REFUSED, flow.p.key
        elif isinstance(exc, SystemError):  # a capsule destructor clobbered the consumer's error
            self._break(cell, cell.reason)
        elif not raised_in_tensorbridge(exc):
            cell.outcome, cell.blame = REFUSED, flow.c.key
        elif isinstance(exc, NotImplementedError) or not isinstance(exc, _DOCUMENTED):
            self._break(cell, cell.reason)
        elif isinstance(exc, TypeError) and flow.c.protocol == "arrow":
            # Arrow has no type for these elements (bfloat16, complex): a documented refusal.
            cell.outcome, cell.blame = REFUSED, "tensorbridge"
        elif isinstance(exc, TypeError) and not _numpy_can_name(flow.t.dtype):
            # NumPy has no type for these elements (float4 pairs; bfloat16 or float8 without
            # ml_dtypes): tensorbridge refuses rather than hand out an object array or raw bytes
            # in disguise, as documented.
            cell.outcome, cell.blame = REFUSED, "tensorbridge"
        elif not flow.t.is_readonly:
            self._break(cell, f"tensorbridge refused to export a writable tensor: {cell.reason}")
        else:  # a documented refusal: a read-only tensor asked for as a legacy capsule
            cell.outcome, cell.blame = REFUSED, "tensorbridge"

    def _imported_wrong(self, cell: Cell, flow: _Flow) -> str | None:
        """What tensorbridge's import got wrong (the dtype, or a copy for a view), or None."""
        p, x, t = flow.p, flow.x, flow.t
        if t is None or p is self.tb:
            return None
        if t.dtype.name != cell.dtype:
            return f"tensorbridge read {cell.dtype} from {p.key} as {t.dtype.name}"
        if isinstance(p, FileSide):
            # A map's address is not known before the load: a write to the file must be seen.
            before = self.tb.read(t)
            if not p.poke(x):
                return None
            seen = self.tb.read(t) != before
            p.poke(x)  # flips the same bit back
            if not seen:
                return f"tensorbridge copied the {p.key} on load instead of mapping it"
            return None
        if not p.has_memory:  # the producer computes a new array for each export
            cell.notes.append(f"{p.key} has no memory of its own to share: it computes each export")
            return None
        if t.data_ptr() != p.address(x):
            if t.dtype is tb.bool and _arrow_only(x):
                cell.notes.append(
                    "tensorbridge copies Arrow booleans, which are bit-packed, to one byte per "
                    "value (documented); tb.asarray takes an Arrow export before __array__"
                )
                return None
            return f"tensorbridge copied {p.key}'s memory on import instead of sharing it"
        return None

    def _prove(self, cell: Cell, flow: _Flow) -> None:
        """Check the values, then share or copy: by a write where one side may be written."""
        p, x, c, y = flow.p, flow.x, flow.c, flow.y
        expected = p.read(x)
        wrong = self._imported_wrong(cell, flow)
        if wrong:
            self._break(cell, wrong)
            return
        got_dtype = c.dtype_of(y)
        if got_dtype is not None and got_dtype != cell.dtype:
            cell.outcome, cell.blame = COPIED, c.key
            cell.reason = f"{c.key} converted {cell.dtype} to {got_dtype}"
            return
        if c.read(y) != expected:
            if self._in_path(cell, flow):
                self._break(cell, "the consumer read different values than the producer holds")
            else:
                cell.outcome, cell.blame, cell.reason = BROKEN, c.key, "values differ"
            return
        if p.poke(x):
            shared, proof = c.read(y)[0] != expected[0], "write"
        else:
            shared, proof = p.address(x) == c.address(y), "address"
        if shared:
            cell.outcome, cell.proof = SHARED, proof
            self._check_readonly(cell, flow)
            return
        cell.outcome = COPIED
        note = c.copy_note(p.address(x))
        if note:
            cell.notes.append(note)

    def _check_readonly(self, cell: Cell, flow: _Flow) -> None:
        """Read-only memory must stay read-only wherever tensorbridge can say so."""
        p, c, t = flow.p, flow.c, flow.t
        if not p.readonly(flow.x):
            return
        if t is not None and not t.is_readonly:
            if isinstance(p, (Stdlib, FileSide)):  # the buffer protocol or the map said so
                self._break(cell, f"tensorbridge made a writable tensor over read-only {p.key}")
            else:
                cell.notes.append(_EXPORTS_WRITABLE.format(p=p.key))
        elif not c.has_readonly:
            cell.notes.append(_NO_READONLY.format(c=c.key, p=p.key))
        elif c.readonly(flow.y) is False and t is not None:
            call = cell.calls.rpartition(" -> ")[2]
            if _marked_readonly(t, call):  # tensorbridge said read-only; the consumer ignored it
                cell.notes.append(_IGNORES_MARK.format(c=c.key, call=call))
            else:
                self._break(
                    cell, f"{call} got a writable view of a read-only tensor: READ_ONLY lost"
                )
        elif c.readonly(flow.y) is False:
            cell.notes.append(_CAN_WRITE.format(c=c.key, p=p.key))


# The notes `Exchange._check_readonly` leaves where read-only memory ends up writable on one side
# (that side's doing, not a broken guarantee). Each begins with the key of that side, and
# `writable_sides` reads them back for the doctor's summary.
_EXPORTS_WRITABLE: Final = (
    "{p}'s arrays are read-only, but it exports them without a read-only mark: tensorbridge's "
    "view of them is writable (the doctor did not write through it)"
)
_NO_READONLY: Final = "{c} has no read-only arrays: it can write into read-only {p} memory"
_IGNORES_MARK: Final = "{c} ignores the read-only mark ({call}): its view is writable"
_CAN_WRITE: Final = "{c} can write to read-only {p} memory"
_WRITABLE_MARKS: Final = (
    "tensorbridge's view of them is writable",
    "it can write into read-only",
    "its view is writable",
    "can write to read-only",
)


def writable_sides(cell: Cell) -> set[str]:
    """The sides of ``cell`` whose view of read-only memory was writable (read from its notes)."""
    return {
        key
        for note in cell.notes
        for key in (cell.producer, cell.consumer)
        if note.startswith((f"{key} ", f"{key}'s ")) and any(m in note for m in _WRITABLE_MARKS)
    }


def _refusal_note(cell: Cell) -> str:
    """A refused entry point, for the cell of the one that worked after it."""
    call = cell.calls.rpartition(" -> ")[2]
    who = f"{cell.blame}: " if cell.blame and not (cell.reason or "").startswith(cell.blame) else ""
    return f"{call} refused ({who}{cell.reason})"


def _marked_readonly(t: Any, call: str) -> bool:
    """Whether tensorbridge marks read-only tensor ``t`` read-only on the protocol ``call`` uses."""
    try:
        if call.endswith("from_dlpack"):
            return bool(capsule_flags(t.__dlpack__(max_version=(1, 0))) & FLAG_READ_ONLY)
        if call == "np.asarray":
            return bool(t.__array_interface__["data"][1])
        with t.as_memoryview() as mv:
            return bool(mv.readonly)
    except Exception:  # no such export at all: nothing was marked
        return False
