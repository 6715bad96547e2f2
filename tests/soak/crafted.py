"""A hostile DLPack producer made of ctypes, for the safety tests (soak, threads, hostile, faults).

Every managed tensor is written field by field with tensorbridge's own ctypes mirrors
(`_dlpack_abi`) and wrapped in a capsule with `_capi.PyCapsule_New`, so a test can set any field to
any value: version, flags, ndim, shape, strides, dtype, device, byte_offset, NULL pointers, names.
Two things make misbehaviour visible:

* Counting. Each `Managed` counts the calls of its deleter (`deleter_calls`); `Managed.live` holds
  the ones whose deleter has not run yet, and `stats()` sums everything up. The capsule destructor
  behaves like NumPy's: it calls the deleter only while the capsule still has its unused name.
* Fences. `Fenced` memory sits between two ``PROT_NONE`` pages, so reading or writing a single byte
  outside it kills the process with SIGSEGV instead of passing unnoticed. Shape and strides arrays
  can be fenced (an over-read of ``ndim`` entries crashes), and so can data. Tests that may crash
  run in a child process.

Nothing here imports NumPy or PyTorch, nor pytest outside `isolated` (which runs a test in a forked
child): child interpreters import this module by name.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import itertools
import mmap
import os
import pickle
import signal
import sys
import threading
import traceback
import types
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from tensorbridge import _capi, _dlpack, _exports
from tensorbridge import _dlpack_abi as abi

__all__ = ["PAGE", "ExportCounter", "Fenced", "Managed", "capsule_name", "isolated", "stats"]

PAGE = mmap.PAGESIZE

# Private prototypes (never the shared ctypes.pythonapi attributes). The destructor gets a raw
# PyObject* of a capsule being deallocated: it must not become a Python object again, so these take
# void*.
_name_of_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
_pointer_of_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# A private handle on libc, so setting restype/argtypes here touches nobody else's prototypes.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FAILED = ctypes.c_void_p(-1).value


class Fenced:
    """``nbytes`` of zeroed read-write memory between two inaccessible pages.

    ``at_end=True`` puts the last usable byte right before the trailing fence (an over-read past the
    end faults); ``at_end=False`` puts the first right after the leading fence (an under-read
    faults).
    """

    def __init__(self, nbytes: int, *, at_end: bool = True) -> None:
        body = -(-max(nbytes, 1) // PAGE) * PAGE
        self._size = body + 2 * PAGE
        base = _libc.mmap(None, self._size, _PROT_RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if base in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mmap failed")
        self._base = base
        _libc.mprotect(base, PAGE, _PROT_NONE)
        _libc.mprotect(base + PAGE + body, PAGE, _PROT_NONE)
        self.nbytes = nbytes
        self.start = base + PAGE + (body - nbytes if at_end else 0)

    def write(self, data: bytes, offset: int = 0) -> None:
        """Copy ``data`` in at byte ``offset`` (checked against the usable range)."""
        if offset < 0 or offset + len(data) > self.nbytes:
            raise ValueError("write outside the fenced range")
        ctypes.memmove(self.start + offset, data, len(data))

    def read(self, offset: int = 0, nbytes: int | None = None) -> bytes:
        """The bytes at ``offset`` (all the rest by default), checked against the usable range."""
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError("read outside the fenced range")
        return ctypes.string_at(self.start + offset, nbytes)

    def __del__(self) -> None:
        if not sys.is_finalizing() and getattr(self, "_base", None):
            _libc.munmap(self._base, self._size)
            self._base = None


def _int64_array(values: Sequence[int], fence: bool) -> tuple[int, object]:
    """The address of ``values`` as int64s (wrapped to 64 bits), and the object keeping them
    alive."""
    raw = (ctypes.c_int64 * max(len(values), 1))(*((v + 2**63) % 2**64 - 2**63 for v in values))
    if not fence:
        return ctypes.addressof(raw), raw
    block = Fenced(8 * len(values))
    if values:
        block.write(bytes(raw)[: 8 * len(values)])
    return block.start, block


_LOCK = threading.Lock()
_NAMES: dict[bytes, bytes] = {}  # capsules keep a pointer to their name: one interned copy per name


class Managed:
    """One crafted ``DLManagedTensor[Versioned]`` and a capsule holding it.

    Args:
        data: address of element memory (None for NULL); `Fenced` memory faults on overrun.
        shape: the int64 shape array.
        strides: the int64 strides array; None leaves the pointer NULL.
        ndim: the ``ndim`` field (defaults to ``len(shape)``), independent of the arrays.
        dtype: ``(code, bits, lanes)``.
        versioned: write a ``DLManagedTensorVersioned`` (else the legacy struct).
        version: the versioned struct's ``(major, minor)``.
        flags: the versioned struct's flags.
        device: ``(device_type, device_id)``.
        byte_offset: the ``byte_offset`` field.
        null_shape: leave the shape pointer NULL.
        adjacent: put strides right after shape in one block (the NumPy layout).
        fence: place shape and strides against an inaccessible page: reading past them faults.
        deleter: set the deleter (else NULL).
        name: capsule name (default ``dltensor_versioned`` / ``dltensor``).
        destructor: give the capsule a NumPy-style destructor (else an unconsumed capsule leaks).
        keep: objects that own ``data``, kept alive until the deleter runs.
    """

    # address -> (struct, arrays, keep): what a producer's manager_ctx would keep alive until the
    # deleter.
    live: ClassVar[dict[int, tuple[Any, ...]]] = {}
    _records: ClassVar[weakref.WeakValueDictionary[int, Managed]] = weakref.WeakValueDictionary()
    made: ClassVar[int] = 0
    deleted: ClassVar[int] = 0
    stray: ClassVar[int] = 0  # deleter calls for an address no live record had

    def __init__(
        self,
        data: int | None,
        shape: Sequence[int] = (),
        strides: Sequence[int] | None = None,
        *,
        ndim: int | None = None,
        dtype: tuple[int, int, int] = (abi.kDLFloat, 32, 1),
        versioned: bool = True,
        version: tuple[int, int] = (1, 3),
        flags: int = 0,
        device: tuple[int, int] = (1, 0),
        byte_offset: int = 0,
        null_shape: bool = False,
        adjacent: bool = False,
        fence: bool = False,
        deleter: bool = True,
        name: bytes | None = None,
        destructor: bool = True,
        keep: object = None,
    ) -> None:
        self.deleter_calls = 0
        ndim = len(shape) if ndim is None else ndim
        if adjacent and strides is not None:
            both, self._arrays = _int64_array([*shape, *strides], fence)
            shape_p, strides_p = both, both + 8 * len(shape)
        else:
            shape_p, shape_keep = _int64_array(shape, fence)
            strides_p, strides_keep = (0, None) if strides is None else _int64_array(strides, fence)
            self._arrays = (shape_keep, strides_keep)
        managed = abi.DLManagedTensorVersioned() if versioned else abi.DLManagedTensor()
        self.struct = managed
        dl = managed.dl_tensor
        dl.data = data
        dl.device.device_type, dl.device.device_id = device
        dl.ndim = ndim
        dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = dtype
        dl.shape = ctypes.cast(None if null_shape else shape_p, ctypes.POINTER(ctypes.c_int64))
        dl.strides = ctypes.cast(strides_p or None, ctypes.POINTER(ctypes.c_int64))
        dl.byte_offset = byte_offset % 2**64
        managed.deleter = _DELETER if deleter else abi.DLPackDeleter()
        if versioned:
            managed.version.major, managed.version.minor = version
            managed.flags = flags % 2**64
        self.address = ctypes.addressof(managed)
        if name is None:
            name = abi.DLTENSOR_VERSIONED if versioned else abi.DLTENSOR
        name = _NAMES.setdefault(name, name)
        with _LOCK:
            Managed.made += 1
            if deleter:
                Managed.live[self.address] = (managed, self._arrays, keep, data)
            Managed._records[self.address] = self
        self.capsule: Any = _capi.PyCapsule_New(
            self.address, name, _DESTRUCTOR_ADDRESS if destructor else None
        )

    def take(self) -> Any:
        """The capsule, with this record's reference dropped (the caller's is then the only one)."""
        capsule, self.capsule = self.capsule, None
        return capsule


@abi.DLPackDeleter
def _deleter(address: int | None) -> None:
    with _LOCK:
        record = Managed._records.get(address or 0)
        if record is not None:
            record.deleter_calls += 1
        if Managed.live.pop(address or 0, None) is None:
            Managed.stray += 1  # a second call, or an address this module never handed out
        else:
            Managed.deleted += 1


@_CapsuleDestructor
def _destructor(capsule: int | None) -> None:
    """NumPy's ``dlpack_capsule_deleter``: call the deleter only if nobody consumed the capsule."""
    if sys.is_finalizing():
        return
    name_p = _name_of_raw(capsule)
    if not name_p or ctypes.string_at(name_p).startswith(b"used_"):
        return
    address = _pointer_of_raw(capsule, name_p) or 0
    entry = Managed.live.get(address)
    if entry is not None:
        entry[0].deleter(address)
        return
    record = Managed._records.get(address)
    if record is None or record.struct.deleter:
        _deleter(
            address
        )  # the deleter already ran: this is the double release a real producer would do


_DELETER = _deleter
_DESTRUCTOR_ADDRESS = ctypes.cast(_destructor, ctypes.c_void_p).value


def capsule_name(capsule: Any) -> bytes:
    """A capsule's current name (``used_*`` once a consumer took it)."""
    return ctypes.string_at(_capi.PyCapsule_GetName(capsule))


def stats() -> dict[str, int]:
    """Totals: managed tensors made, deleter calls, calls for unknown addresses, still undeleted."""
    with _LOCK:
        return {
            "made": Managed.made,
            "deleted": Managed.deleted,
            "stray": Managed.stray,
            "live": len(Managed.live),
        }


class ExportCounter:
    """Counts tensorbridge's capsule exports and releases from now on, on whatever thread they
    happen.

    Exports: ``_dlpack._new_capsule`` is wrapped. Releases: the capsule deleter is a ctypes callback
    that consumers call through a C function pointer, so it cannot be replaced; it binds
    ``_exports.forget_managed`` as its ``_forget`` default, which is wrapped there (``deleter``);
    the reaper calls the module's ``forget_managed``, wrapped too (``releases`` counts both). ``itertools.count`` makes each
    count one atomic C call.
    """

    def __init__(self) -> None:
        self._exports, self._releases, self._deleter = (
            itertools.count(),
            itertools.count(),
            itertools.count(),
        )
        new_capsule, release = _dlpack._new_capsule, _exports.forget_managed
        deleter = next(
            r for r in gc.get_referents(_dlpack._deleter) if isinstance(r, types.FunctionType)
        )
        position = deleter.__code__.co_varnames.index("_forget") - deleter.__code__.co_argcount
        exports, releases, deleter_calls = self._exports, self._releases, self._deleter

        def counted_export(*args: Any) -> Any:
            next(exports)
            return new_capsule(*args)

        def counted_release(address: int, *args: Any) -> object:
            next(releases)
            return release(address, *args)

        def counted_deleter_release(address: int, *args: Any) -> object:
            next(deleter_calls)
            return counted_release(address, *args)

        defaults = list(deleter.__defaults__ or ())
        defaults[position] = counted_deleter_release
        deleter.__defaults__ = tuple(defaults)
        _dlpack._new_capsule, _exports.forget_managed = counted_export, counted_release

    @staticmethod
    def _value(counter: itertools.count[int]) -> int:
        return int(repr(counter)[len("count(") : -1])

    def counts(self) -> dict[str, int]:
        """``exports``, ``releases`` (deleter + reaper) and ``deleter`` calls so far."""
        return {
            "exports": self._value(self._exports),
            "releases": self._value(self._releases),
            "deleter": self._value(self._deleter),
        }

    @staticmethod
    def registry() -> int:
        """Exports tensorbridge still holds (not yet released)."""
        return len(_exports._MANAGED) + len(_exports._PENDING)


def isolated(test: Callable[..., None]) -> Callable[..., None]:
    """Run the test ``test`` in a forked child; report its failure, skip or crash in the parent.

    A test whose subject may crash the interpreter then fails alone, naming the signal, instead of
    killing the whole run. Objects left alive by the test are never finalised (the child leaves with
    ``os._exit``). Imports pytest lazily, so child interpreters can use this module without it.
    """
    import pytest

    if not hasattr(os, "fork"):
        return test

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        read, write = os.pipe()
        with warnings.catch_warnings():
            # 3.12+ warns about forking a multi-threaded process, and JAX's at-fork hook warns
            # (RuntimeWarning) once JAX is imported; the child runs only tensorbridge code.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            pid = os.fork()
        if pid == 0:  # the child: run the test, send the outcome, leave without any cleanup
            os.close(read)
            try:
                test(*args, **kwargs)
                outcome: tuple[str, str] = ("passed", "")
            except pytest.skip.Exception as exc:
                outcome = ("skipped", str(exc))
            except BaseException:  # any failure is reported to the parent
                outcome = ("failed", traceback.format_exc())
            with os.fdopen(write, "wb") as pipe:
                pipe.write(pickle.dumps(outcome))
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            pytest.fail(f"crashed: {signal.Signals(os.WTERMSIG(status)).name}", pytrace=False)
        kind, text = pickle.loads(data)
        if kind == "skipped":
            pytest.skip(text)
        if kind == "failed":
            pytest.fail(text, pytrace=False)

    return run
