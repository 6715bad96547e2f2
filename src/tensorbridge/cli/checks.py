"""The doctor's safety checks: read-only propagation, capsule reuse, deleters called exactly once
(counted on capsules crafted with `tensorbridge.testing`), buffer exports held while a view lives,
overflow-checked sizes, and a crash-prone PyTorch check run in a child interpreter.

Each check returns a short detail on success and raises `_Failed` (or anything) on failure, or
`_Skipped` when it does not apply here.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import mmap
import os
import subprocess
import sys
import textwrap
import warnings
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import tensorbridge as tb
from tensorbridge.testing import (
    DLPACK_VERSION,
    FLAG_READ_ONLY,
    CraftedDLPack,
    buffer_address,
    capsule_flags,
    capsule_name,
    consume_capsule,
)

from .errors import PACKAGE_DIR, one_line, raised_in_tensorbridge
from .sides import Side

__all__ = [
    "CHECKS",
    "HOMES",
    "READONLY_PROTECTION",
    "SUBINTERPRETER",
    "Check",
    "ChildCheck",
    "check_numpy_readonly",
    "check_pyarrow_import",
    "check_readonly_protection",
    "readonly_protection_name",
    "run_check",
]

_VERSIONED: Final = b"dltensor_versioned"


class _Failed(Exception):
    pass


@dataclass
class Check:
    """One safety check: ``ok`` is True, False (a broken guarantee) or None (skipped)."""

    name: str
    ok: bool | None
    detail: str


def _expect_raise(
    kinds: type[BaseException] | tuple[type[BaseException], ...],
    fn: Callable[[], Any],
    what: str,
    contains: str = "",
) -> str:
    try:
        fn()
    except kinds as exc:
        if contains not in str(exc):
            msg = f"{what} raised {one_line(exc)!r}, without {contains!r}"
            raise _Failed(msg) from None
        return type(exc).__name__
    msg = f"{what} did not raise"
    raise _Failed(msg)


def _crafted(values: Sequence[int], **fields: Any) -> CraftedDLPack:
    """A crafted int32 managed tensor without a capsule destructor: if tensorbridge never consumes
    it, `CraftedDLPack.release` calls the deleter, so the count tells exactly who released it and
    how often."""
    return CraftedDLPack(values, fmt="i", dtype=tb.int32.dlpack, destructor=False, **fields)


def _collect_until(predicate: Callable[[], bool]) -> bool:
    if predicate():
        return True
    gc.collect()
    return predicate()


CHECKS: list[tuple[str, Callable[[dict[str, Side]], str]]] = []
# The checks that need a peer, run in that peer's process (``"readonly"``: with PyTorch where it is
# proved, else NumPy, else in the doctor's own process); every other check needs none.
HOMES: Final = {
    "NumPy read-only arrays import read-only": "numpy",
    "pyarrow imports tensors through the Arrow C data interface, no copy": "pyarrow",
    "read-only tensors refuse writes": "readonly",
}


def _check(
    name: str,
) -> Callable[[Callable[[dict[str, Side]], str]], Callable[[dict[str, Side]], str]]:
    def register(fn: Callable[[dict[str, Side]], str]) -> Callable[[dict[str, Side]], str]:
        CHECKS.append((name, fn))
        return fn

    return register


@_check("read-only buffers give read-only tensors")
def _check_readonly_buffer(sides: dict[str, Side]) -> str:
    data = bytes(range(1, 9))
    t = tb.frombuffer(data, dtype=tb.uint8)
    if not t.is_readonly:
        msg = "frombuffer(bytes) returned a writable tensor"
        raise _Failed(msg)

    def write() -> None:
        t[0] = 99

    kind = _expect_raise(Exception, write, "writing to frombuffer(bytes)")
    if data[0] != 1:
        msg = "a write through a read-only tensor changed a bytes object"
        raise _Failed(msg)
    return f"frombuffer(bytes).is_readonly; a write raises {kind}"


@_check("READ_ONLY is set on versioned export and honoured on import")
def _check_readonly_flag(sides: dict[str, Side]) -> str:
    t = tb.frombuffer(bytes(range(1, 9)), dtype=tb.uint8)
    capsule = t.__dlpack__(max_version=(1, 3))
    name = capsule_name(capsule)
    if name != _VERSIONED:
        msg = f"__dlpack__(max_version=(1, 3)) returned a {name!r} capsule"
        raise _Failed(msg)
    if not capsule_flags(capsule) & FLAG_READ_ONLY:
        msg = "the versioned capsule of a read-only tensor lacks READ_ONLY"
        raise _Failed(msg)
    if not tb.from_dlpack(capsule).is_readonly:
        msg = "importing a READ_ONLY capsule gave a writable tensor"
        raise _Failed(msg)
    crafted = _crafted([1, 2, 3], flags=FLAG_READ_ONLY)
    try:
        if not tb.from_dlpack(crafted.capsule).is_readonly:
            msg = "importing a crafted READ_ONLY capsule gave a writable tensor"
            raise _Failed(msg)
    finally:
        gc.collect()
        crafted.release()
    return "flag set on export; tb and crafted READ_ONLY capsules import read-only"


@_check("a read-only tensor is never exported as a legacy capsule")
def _check_readonly_legacy(sides: dict[str, Side]) -> str:
    t = tb.frombuffer(bytes(range(1, 9)), dtype=tb.uint8)
    _expect_raise(BufferError, lambda: tb.utils.dlpack.to_dlpack(t), "to_dlpack(read-only)")
    _expect_raise(BufferError, t.__dlpack__, "read-only __dlpack__()")
    return "to_dlpack() and __dlpack__() without max_version raise BufferError"


@_check("a capsule is consumed once; wrong objects get distinct errors")
def _check_capsule_reuse(sides: dict[str, Side]) -> str:
    capsule = tb.utils.dlpack.to_dlpack(tb.arange(4))
    tb.from_dlpack(capsule)
    _expect_raise(
        RuntimeError,
        lambda: tb.from_dlpack(capsule),
        "a second from_dlpack(capsule)",
        "DLTensor capsules can be consumed only once",
    )
    _expect_raise(TypeError, lambda: tb.from_dlpack([1, 2]), "from_dlpack(list)")
    foreign = _crafted([1, 2], name=_FOREIGN)
    try:
        _expect_raise(
            TypeError,
            lambda: tb.from_dlpack(foreign.capsule),
            "from_dlpack(foreign capsule)",
            _FOREIGN.decode(),
        )
    finally:
        foreign.release()
    return "reuse: RuntimeError (PyTorch's text); list: TypeError; foreign capsule named"


_FOREIGN: Final = b"foreign_capsule"


def _consume_crafted(crafted: CraftedDLPack, expect: list[int]) -> None:
    t = tb.from_dlpack(crafted.capsule)
    view = t[1:]
    if t.tolist() != expect:
        msg = f"imported {t.tolist()}, expected {expect}"
        raise _Failed(msg)
    used = b"used_" + crafted.name
    if capsule_name(crafted.capsule) != used:
        msg = f"the consumed capsule is named {capsule_name(crafted.capsule)!r}, not {used!r}"
        raise _Failed(msg)
    del t
    if crafted.deleter_calls:
        msg = "the deleter ran while a view was alive"
        raise _Failed(msg)
    del view

    def calls() -> int:  # read again at each call: the collection runs the deleter
        return crafted.deleter_calls

    if not _collect_until(lambda: calls() > 0) or calls() != 1:
        msg = f"the deleter ran {calls()} times after the last view died"
        raise _Failed(msg)


@_check("an imported tensor's deleter runs exactly once")
def _check_deleter_once(sides: dict[str, Side]) -> str:
    for versioned in (True, False):
        crafted = _crafted([5, 6, 7, 8], versioned=versioned)
        try:
            _consume_crafted(crafted, [5, 6, 7, 8])
        finally:
            crafted.release()
    return "versioned and legacy crafted capsules: 0 calls while a view lives, 1 after"


@_check("negative strides and byte offsets import correctly")
def _check_negative_strides(sides: dict[str, Side]) -> str:
    # Elements 5, 3, 1 of [1..6]: the data pointer at the last element, walking backwards.
    block = (ctypes.c_int32 * 6)(1, 2, 3, 4, 5, 6)
    last = ctypes.addressof(block) + 5 * ctypes.sizeof(ctypes.c_int32)
    crafted = _crafted((), data=last, shape=(3,), strides=(-2,), keep=block)
    try:
        t = tb.from_dlpack(crafted.capsule)
        if t.tolist() != [6, 4, 2] or t.stride() != (-2,):
            msg = f"got {t.tolist()} with strides {t.stride()}, expected [6, 4, 2] with (-2,)"
            raise _Failed(msg)
        del t
        gc.collect()
    finally:
        crafted.release()
    return "a crafted stride -2 capsule reads [6, 4, 2] with stride (-2,)"


@_check("a failed import leaves the capsule unconsumed")
def _check_failed_import(sides: dict[str, Side]) -> str:
    crafted = _crafted([1, 2], version=(DLPACK_VERSION[0] + 1, 0))
    try:
        kind = _expect_raise(
            BufferError, lambda: tb.from_dlpack(crafted.capsule), "from_dlpack(major version + 1)"
        )
        gc.collect()
        if crafted.deleter_calls or capsule_name(crafted.capsule) != crafted.name:
            msg = (
                f"after the refusal the deleter ran {crafted.deleter_calls} times and the capsule "
                f"is named {capsule_name(crafted.capsule)!r}"
            )
            raise _Failed(msg)
    finally:
        crafted.release()
    return f"a too-new major version raises {kind}; name kept, deleter left to the producer"


@_check("an exported tensor is released once, consumed or abandoned")
def _check_export_release(sides: dict[str, Side]) -> str:
    t = tb.arange(4)
    alive = weakref.ref(t)
    capsule = t.__dlpack__(max_version=(1, 3))
    del t
    if alive() is None:
        msg = "the tensor died while its capsule was unconsumed"
        raise _Failed(msg)
    consume_capsule(capsule)  # what a C consumer does: rename, then one deleter call
    del capsule
    if not _collect_until(lambda: alive() is None):
        msg = "the tensor outlived its consumed capsule (the deleter did not release it)"
        raise _Failed(msg)
    t = tb.arange(4)
    alive = weakref.ref(t)
    t.__dlpack__(max_version=(1, 3))  # abandoned at once
    del t
    if not _collect_until(lambda: alive() is None):
        msg = "an abandoned capsule kept its tensor alive after a collection"
        raise _Failed(msg)
    return "consumed (by a ctypes C-style consumer) and abandoned capsules release the tensor"


@_check("frombuffer holds the export while any view lives")
def _check_holds_export(sides: dict[str, Side]) -> str:
    ba = bytearray(16)
    t = tb.frombuffer(ba, dtype=tb.uint8)
    view = t[4:]
    del t
    _expect_raise(BufferError, lambda: ba.extend(b"x"), "resizing a bytearray under a view")
    del view
    if not _collect_until(lambda: _resizable(ba)):
        msg = "the bytearray stayed locked after the last view died"
        raise _Failed(msg)
    m = mmap.mmap(-1, 4096)
    t = tb.frombuffer(m, dtype=tb.uint8)
    _expect_raise(BufferError, m.close, "closing an mmap under a view")
    del t
    gc.collect()
    m.close()
    return "bytearray resize and mmap.close raise BufferError; both work once the views die"


def _resizable(ba: bytearray) -> bool:
    try:
        ba.append(0)
    except BufferError:
        return False
    ba.pop()
    return True


@_check("sizes are computed without overflow")
def _check_overflow(sides: dict[str, Side]) -> str:
    kind = _expect_raise(
        ValueError,
        lambda: tb.frombuffer(bytearray(8), dtype=tb.float32, count=2**62 + 1),
        "count=2**62+1",
    )
    return f"frombuffer(bytearray(8), float32, count=2**62+1) raises {kind}"


class _Owner:
    """Stands for a library's memory owner: holds a ctypes block, and can be watched by weakref."""

    def __init__(self, values: Sequence[int]) -> None:
        self.block = (ctypes.c_int32 * len(values))(*values)


@_check("from_pointer keeps its owner alive and checks nbytes")
def _check_from_pointer(sides: dict[str, Side]) -> str:
    owner = _Owner([1, 2, 3, 4])
    address, nbytes = ctypes.addressof(owner.block), ctypes.sizeof(owner.block)
    alive = weakref.ref(owner)
    t = tb.from_pointer(address, (4,), tb.int32, owner=owner, nbytes=nbytes)
    view = t[1:]
    del owner, t
    if alive() is None or view.tolist() != [2, 3, 4]:
        msg = "the owner died (or the values changed) while a view was alive"
        raise _Failed(msg)
    del view
    if not _collect_until(lambda: alive() is None):
        msg = "the owner outlived every view"
        raise _Failed(msg)
    block = (ctypes.c_int32 * 4)()
    kind = _expect_raise(
        ValueError,
        lambda: tb.from_pointer(ctypes.addressof(block), (5,), tb.int32, owner=block, nbytes=16),
        "from_pointer(5 int32 in 16 bytes)",
    )
    return f"the owner lives exactly as long as the views; a layout beyond nbytes raises {kind}"


SUBINTERPRETER: Final = "tensors cross to a subinterpreter and back without a copy"
_SUBINTERPRETER_SIDE: Final = """
import tensorbridge as tb
u, r = tb.from_shareable(q.get()), tb.from_shareable(q.get())
u[1] = 5
try:
    r[0] = 9
    refused = False
except Exception:
    refused = True
q.put((tb.build_info().kind, u.data_ptr(), r.data_ptr(), r.is_readonly, refused))
q.put(tb.to_shareable(tb.full((3,), 2.0)))
"""


@_check(SUBINTERPRETER)
def _check_subinterpreter(sides: dict[str, Side]) -> str:
    try:
        interpreters = importlib.import_module("concurrent.interpreters")  # CPython 3.14+
    except ImportError:
        msg = f"needs CPython 3.14's concurrent.interpreters; this is {sys.version.split()[0]}"
        raise _Skipped(msg) from None
    t = tb.zeros(4)
    ro = tb.frombuffer(bytes(range(1, 5)), dtype=tb.uint8)
    interp = interpreters.create()  # its own GIL
    try:
        q = interpreters.create_queue()
        interp.prepare_main(q=q)
        q.put(tb.to_shareable(t))
        q.put(tb.to_shareable(ro))
        interp.exec(_SUBINTERPRETER_SIDE)
        kind, t_ptr, ro_ptr, readonly, refused = q.get()
        back = tb.from_shareable(q.get())
    finally:
        interp.close()  # the sender of `back` closes first: its memory must stay valid
    gc.collect()
    back[0] = 1.0
    if (t_ptr, ro_ptr) != (t.data_ptr(), ro.data_ptr()):
        msg = "the subinterpreter's tensors are at other addresses: the memory was copied"
        raise _Failed(msg)
    if t.tolist() != [0.0, 5.0, 0.0, 0.0] or back.tolist() != [1.0, 2.0, 2.0]:
        msg = f"writes were lost: sent {t.tolist()}, received {back.tolist()}"
        raise _Failed(msg)
    if not (readonly and refused) or ro.tolist() != [1, 2, 3, 4]:
        msg = "a read-only tensor became writable in the subinterpreter"
        raise _Failed(msg)
    return (
        f"to_shareable/from_shareable with an own-GIL interpreter ({kind} there): one address, "
        f"writes seen both ways, read-only kept, memory valid after the sender closed"
    )


def _dlpack_refusal(x: Any) -> str | None:
    """Why producer ``x`` refuses every DLPack export (versioned, then legacy), or None."""
    try:
        try:
            x.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer older than DLPack 1.0 takes no max_version
            x.__dlpack__()
    except Exception as exc:
        return one_line(exc)
    return None


@_check("NumPy read-only arrays import read-only")
def check_numpy_readonly(sides: dict[str, Side]) -> str:
    if "numpy" not in sides:
        msg = "NumPy not used"
        raise _Skipped(msg)
    np = sides["numpy"].np  # type: ignore[attr-defined]
    a = np.arange(4, dtype=np.int32)
    a.flags.writeable = False
    done = []
    if not tb.frombuffer(a, dtype=tb.int32).is_readonly:
        msg = "tb.frombuffer(read-only ndarray) is writable"
        raise _Failed(msg)
    done.append("tb.frombuffer(ro ndarray) is read-only")
    # NumPy before 2.1 has no versioned DLPack, so it refuses to export a read-only array at all:
    # its limitation, reported; tensorbridge is judged only on what NumPy does export.
    refusal = _dlpack_refusal(a)
    if refusal is None:
        if not tb.from_dlpack(a).is_readonly:
            msg = "tb.from_dlpack(read-only ndarray) is writable"
            raise _Failed(msg)
        done.append("so is tb.from_dlpack(it)")
    else:
        done.append(f"NumPy {np.__version__} refuses to export it by DLPack ({refusal})")
    t = tb.frombuffer(bytes(range(1, 9)), dtype=tb.int32)
    try:
        y = np.from_dlpack(t)
    except BufferError as exc:
        # NumPy before 2.1 asks for a legacy capsule, which cannot say read-only: tensorbridge
        # refuses it (documented), a refusal that must come from tensorbridge itself.
        if not raised_in_tensorbridge(exc):
            raise
        done.append("np.from_dlpack(ro tensor) asks for a legacy capsule: refused as documented")
    else:
        if y.flags.writeable:
            msg = "np.from_dlpack(read-only tensor) is writable"
            raise _Failed(msg)
        done.append("np.from_dlpack(ro tensor) is read-only")
    if np.asarray(t).flags.writeable:
        msg = "np.asarray(read-only tensor) is writable"
        raise _Failed(msg)
    done.append("np.asarray(ro tensor) is read-only")
    return "; ".join(done)


class _Skipped(Exception):
    pass


def _refuses_write(write: Callable[[], Any]) -> bool:
    try:
        write()
    except ValueError:  # tensorbridge's and NumPy's word for a write to read-only memory
        return True
    return False


def _torch_writes_through(torch: Any, t: tb.Tensor, memory: bytearray) -> list[str]:
    """What PyTorch's imports of read-only ``t`` do, measured: each writes one byte and looks for
    it in ``memory`` (which ``t`` views read-only, so a write that lands changes nothing else)."""
    found = []
    for i, (call, convert) in enumerate(
        (("torch.from_dlpack(t)", torch.from_dlpack), ("torch.asarray(t)", torch.asarray))
    ):
        marker = 200 + i
        try:
            y = convert(t)
            y[i] = marker
        except Exception as exc:  # a PyTorch that honours READ_ONLY
            found.append(f"{call} refuses ({one_line(exc)})")
            continue
        shared = y.data_ptr() == t.data_ptr()
        if memory[i] == marker:
            found.append(f"{call} is writable over the same memory (a write reached it)")
        else:
            found.append(f"{call} is {'writable but did not write' if shared else 'a copy'}")
    return found


READONLY_PROTECTION: Final = "read-only tensors refuse writes"


def readonly_protection_name(keys: Collection[str]) -> str:
    """The read-only protection check's name, naming only the libraries it runs with."""
    name = READONLY_PROTECTION + " in tensorbridge" + (" and NumPy" if "numpy" in keys else "")
    return name + ("; PyTorch imports them writable" if "torch" in keys else "")


@_check(READONLY_PROTECTION)
def check_readonly_protection(sides: dict[str, Side]) -> str:
    """What read-only protects, measured on a read-only view of a ``bytearray`` (as ``ray.get``
    gives a read-only view of Ray's object store): tensorbridge and NumPy refuse writes; PyTorch
    has no read-only tensors, so its imports are writable (a documented fact, not a failure)."""
    memory = bytearray(range(1, 9))
    t = tb.frombuffer(memoryview(memory).toreadonly(), dtype=tb.uint8)

    def write() -> None:
        t[0] = 99

    if not t.is_readonly or not _refuses_write(write) or memory[0] != 1:
        msg = "a read-only tensor over a bytearray took a write"
        raise _Failed(msg)
    done = ["t[0] = 99 raises ValueError"]
    if "numpy" in sides:
        np = sides["numpy"].np  # type: ignore[attr-defined]
        arrays = {"np.asarray(t)": np.asarray(t)}
        # NumPy before 2.1 asks for a legacy capsule, which a read-only tensor refuses (documented)
        with contextlib.suppress(BufferError):
            arrays["np.from_dlpack(t)"] = np.from_dlpack(t)
        for call, a in arrays.items():

            def write_array(a: Any = a) -> None:
                a[0] = 99

            if a.flags.writeable or not _refuses_write(write_array) or memory[0] != 1:
                msg = f"{call} of a read-only tensor took a write"
                raise _Failed(msg)
        done.append(f"{' and '.join(arrays)} are read-only and refuse writes")
    if "torch" in sides:
        found = _torch_writes_through(sides["torch"].torch, t, memory)  # type: ignore[attr-defined]
        done.append(
            "PyTorch has no read-only tensors (documented, not a failure): " + ", ".join(found)
        )
        done.append("to write, copy first (t.clone())")
    return "; ".join(done)


@_check("pyarrow imports tensors through the Arrow C data interface, no copy")
def check_pyarrow_import(sides: dict[str, Side]) -> str:
    if "pyarrow" not in sides:
        msg = "pyarrow not used"
        raise _Skipped(msg)
    pa = sides["pyarrow"].pa  # type: ignore[attr-defined]
    if not hasattr(pa.Array, "__arrow_c_array__"):  # the PyCapsule interface came in pyarrow 14
        msg = f"pyarrow {pa.__version__} predates the Arrow PyCapsule interface"
        raise _Skipped(msg)
    t = tb.arange(8, dtype=tb.int32)
    a = pa.array(t)
    if a.type != pa.int32() or a.buffers()[1].address != t.data_ptr():
        msg = f"pa.array(1-d int32 tensor) is a {a.type} array over other memory (a copy)"
        raise _Failed(msg)
    t[0] = 100  # the tensor is writable: the array must see the write
    if a[0].as_py() != 100 or a.to_pylist()[1:] != list(range(1, 8)):
        msg = f"pa.array(t) reads {a.to_pylist()}, not the tensor's values"
        raise _Failed(msg)
    done = ["pa.array(1-d tensor): an int32 array over the tensor's memory, a write seen"]
    grid = tb.arange(12, dtype=tb.float32).reshape(3, 4)
    b = pa.array(grid)
    name = getattr(b.type, "extension_name", None)
    storage = b.storage if name is not None else b
    values = storage.values
    if values.buffers()[1].address + values.offset * 4 != grid.data_ptr():
        msg = f"pa.array(3x4 tensor) is a {b.type} array over other memory (a copy)"
        raise _Failed(msg)
    if storage.values.to_pylist() != [float(i) for i in range(12)] or len(b) != 3:
        msg = f"pa.array(3x4 tensor) reads {b.to_pylist()}, not the tensor's rows"
        raise _Failed(msg)
    what = name or f"{b.type} (pyarrow {pa.__version__} has no extension type for it)"
    done.append(f"pa.array(3x4 tensor): {what} over the same memory")
    try:  # pyarrow's own conversion: reported, not judged
        shared = buffer_address(b.to_tensor()) == grid.data_ptr()
    except Exception:  # no to_tensor(), or a pa.Tensor without the buffer protocol
        pass
    else:
        done.append(f"its to_tensor() pa.Tensor {'shares' if shared else 'copies'} it")
    return "; ".join(done)


# Run in a child interpreter: if tensorbridge handed negative strides to PyTorch as they are, torch
# would abort the process (pytorch/pytorch#188023: torch.from_dlpack aborts on negative strides).
_TORCH_NEGATIVE_STRIDES: Final = """
import tensorbridge as tb, torch
t = tb.arange(6, dtype=tb.int32)[::-1]
try:
    y = torch.from_dlpack(t)
except Exception as exc:
    print("refused", type(exc).__name__)
else:
    print("ok" if y.tolist() == [5, 4, 3, 2, 1, 0] else "wrong values " + repr(y.tolist()))
"""


class ChildCheck:
    """A crash-prone check started early in a child interpreter and collected at the end."""

    name = "negative strides never reach PyTorch as they are (it aborts on them)"

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(PACKAGE_DIR).parent), env.get("PYTHONPATH")])
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_TORCH_NEGATIVE_STRIDES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def stop(self) -> None:
        """End the child if its result was not needed (or the run failed)."""
        if self.proc.returncode is None:  # result() was not collected
            self.proc.kill()
            self.proc.communicate()

    def result(self, timeout: float = 60.0) -> Check:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return Check(self.name, False, "the child interpreter hung")
        out = out.strip()
        if self.proc.returncode < 0:
            return Check(
                self.name,
                False,
                f"torch.from_dlpack(t[::-1]) killed the process (signal {-self.proc.returncode})",
            )
        if self.proc.returncode or out.startswith("wrong"):
            detail = out or (err.strip().splitlines() or ["no output"])[-1]
            return Check(self.name, False, f"torch.from_dlpack(t[::-1]): {detail}")
        return Check(self.name, True, f"torch.from_dlpack(t[::-1]) in a child: {out}")


def run_check(name: str, fn: Callable[[dict[str, Side]], str], sides: dict[str, Side]) -> Check:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Check(name, True, fn(sides))
    except _Skipped as exc:
        return Check(name, None, str(exc))
    except _Failed as exc:
        return Check(name, False, str(exc))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a peer's sys.exit() included: the run goes on
        where = "tensorbridge raised" if raised_in_tensorbridge(exc) else "raised"
        return Check(name, False, f"{where} {one_line(exc)}")
    finally:
        gc.collect()
