"""The only user of ``ctypes.pythonapi``: private prototypes for the C-API calls tensorbridge needs.

Both builds use these; the calls on every import's and export's path have a direct twin in the
compiled build, and the native layer (`_native`) is where the build is chosen, never here.
``ctypes.pythonapi.X.restype``/``argtypes`` are shared by every library in the process, so they are never
touched here (another package that sets them would break every caller that relies on them). Each function is bound through its own ``PYFUNCTYPE`` prototype, which holds
the GIL and turns a set Python error into an exception.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Final

__all__ = [
    "MEMORY",
    "MEMORY_BASE",
    "MEMORY_COVERS_ALL",
    "PY_BUF_FULL_RO",
    "PY_BUF_ND",
    "PY_BUF_WRITABLE",
    "PyBuffer_IsContiguous",
    "PyBuffer_Release",
    "PyCapsule_GetName",
    "PyCapsule_GetPointer",
    "PyCapsule_IsValid",
    "PyCapsule_New",
    "PyCapsule_SetName",
    "PyObject_GetBuffer",
    "Py_buffer",
    "has_generic_getattr",
    "keep_forever",
    "steal",
]

_api = ctypes.pythonapi
_py, _vp, _cp, _int, _ssize = (
    ctypes.py_object,
    ctypes.c_void_p,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_ssize_t,
)

# Capsule destructor type: void (*)(PyObject *).
PyCapsule_Destructor = ctypes.CFUNCTYPE(None, _vp)


def _bind(name: str, restype: object, *argtypes: object) -> Any:
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, _api))  # type: ignore[arg-type]


PyCapsule_GetName: Final = _bind("PyCapsule_GetName", _vp, _py)


# The capsule calls, through ctypes: what `_native_py` offers as the native layer's capsule calls
# (`_native_c` makes them directly), and what tests and `testing` use to inspect any capsule.
PyCapsule_New: Final = _bind("PyCapsule_New", _py, _vp, _cp, _vp)
PyCapsule_IsValid: Final = _bind("PyCapsule_IsValid", _int, _py, _cp)
PyCapsule_GetPointer: Final = _bind("PyCapsule_GetPointer", _vp, _py, _cp)
PyCapsule_SetName: Final = _bind("PyCapsule_SetName", _int, _py, _cp)
PyCapsule_SetDestructor: Final = _bind("PyCapsule_SetDestructor", _int, _py, _vp)
PyErr_Clear: Final = _bind("PyErr_Clear", None)
# PyObject *PyErr_GetRaisedException(void) (3.12+): takes the pending exception out; NULL if none.
PyErr_GetRaisedException: Final = (
    _bind("PyErr_GetRaisedException", _vp) if sys.version_info >= (3, 12) else None
)


# Py_IncRef on an address (a ``Py_buffer``'s ``obj``), where `_Py_IncRef` below takes an object.
_Py_IncRef_address: Final = _bind("Py_IncRef", None, _vp)


class Py_buffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (Include/pybuffer.h), stable since 3.3.

    One that ``PyObject_GetBuffer`` filled is released exactly once: by ``PyBuffer_Release``
    (which sets ``obj`` to NULL), or else when the struct dies (never while the interpreter is
    finalising: the memory is then left to the OS). One filled by hand leaves ``obj`` NULL.

    `_native_py.acquire_buffer` moves the reference that ``obj`` stands for to the attribute ``exporter``,
    which the garbage collector sees (``obj`` is then an alias of it, and gets its reference back
    for the release): an exporter that holds a tensor over its own buffer is a cycle the collector
    can break, as it breaks one through a ``memoryview``. The struct releases the export in its
    finaliser, which the collector runs before it clears anything.
    """

    _fields_ = (
        ("buf", _vp),
        ("obj", _vp),
        ("len", _ssize),
        ("itemsize", _ssize),
        ("readonly", _int),
        ("ndim", _int),
        ("format", _cp),
        ("shape", ctypes.POINTER(_ssize)),
        ("strides", ctypes.POINTER(_ssize)),
        ("suboffsets", ctypes.POINTER(_ssize)),
        ("internal", _vp),
    )

    def __del__(
        self, _finalizing: Any = sys.is_finalizing, _incref: Any = _Py_IncRef_address
    ) -> None:
        if not self.obj:
            return
        exporter = self.__dict__.pop("exporter", None)  # alive until the release is done
        if exporter is not None:
            _incref(self.obj)  # the reference `_native_py.acquire_buffer` moved to ``exporter``
        if _finalizing():
            return  # the export, and its exporter, are left to the OS, as the memory is
        # A global, not a default (it is bound below this class): module globals are cleared
        # only while the interpreter is finalising, and then this returned above.
        PyBuffer_Release(self)


# Request flags (Include/pybuffer.h).
PY_BUF_SIMPLE: Final = 0
PY_BUF_WRITABLE: Final = 0x0001
PY_BUF_FORMAT: Final = 0x0004
PY_BUF_ND: Final = 0x0008
PY_BUF_STRIDES: Final = 0x0010 | PY_BUF_ND
PY_BUF_C_CONTIGUOUS: Final = 0x0020 | PY_BUF_STRIDES
PY_BUF_FULL_RO: Final = 0x0100 | PY_BUF_STRIDES | PY_BUF_FORMAT  # INDIRECT | STRIDES | FORMAT
PY_BUF_CONTIG_RO: Final = PY_BUF_ND

PyObject_GetBuffer: Final = _bind("PyObject_GetBuffer", _int, _py, ctypes.POINTER(Py_buffer), _int)
PyBuffer_Release: Final = _bind("PyBuffer_Release", None, ctypes.POINTER(Py_buffer))
PyMemoryView_FromMemory: Final = _bind("PyMemoryView_FromMemory", _py, _vp, _ssize, _int)
PyBUF_READ: Final = 0x100
PyBUF_WRITE: Final = 0x200


# Whether a held buffer's items fill ``[buf, buf + len)`` in row-major order (``order=b"C"``).
PyBuffer_IsContiguous: Final = _bind(
    "PyBuffer_IsContiguous", _int, ctypes.POINTER(Py_buffer), ctypes.c_char
)


# ``PyType_GetSlot(cls, Py_tp_getattro)`` (Include/typeslots.h) against the generic lookup: a type
# whose attribute lookup is the standard one, whichever way it was set (C types that name
# ``PyObject_GenericGetAttr`` in their slots get a ``__getattribute__`` wrapper of their own).
_PyType_GetSlot: Final = _bind("PyType_GetSlot", _vp, _py, _int)
_PY_TP_GETATTRO: Final = 58
_GENERIC_GETATTR: Final = ctypes.cast(
    _bind("PyObject_GenericGetAttr", _py, _py, _py), ctypes.c_void_p
).value


def has_generic_getattr(cls: type) -> bool:
    """True when instances of ``cls`` look attributes up the standard way (``object``'s): no
    ``__getattribute__`` or ``__getattr__`` of its own, in Python or in C."""
    return bool(_PyType_GetSlot(cls, _PY_TP_GETATTRO) == _GENERIC_GETATTR)


# Used by asarray to recognise buffer exporters without acquiring (or failing to acquire) a buffer:
# whether the type implements the protocol, as PyTorch's asarray asks; from 3.12 every class with a
# ``__buffer__`` (PEP 688) does, whether or not a given request then succeeds. A probe asks
# `_storage.offers_buffer` instead.
PyObject_CheckBuffer: Final = _bind("PyObject_CheckBuffer", _int, _py)


# ``types.CapsuleType`` exists only from Python 3.13; every capsule shares this type.
CapsuleType: Final[type] = type(PyCapsule_New(id(_api), None, None))

# The address space as one read-only memoryview, from address 1 (PyMemoryView_FromMemory wants a
# non-NULL start; NULL pointers are checked before any read): producers' structs are unpacked
# straight out of it, with no copy and no ctypes object per read. On 64-bit platforms it covers
# every user-space address (`MEMORY_COVERS_ALL`); `_dlpack_c.read` handles the rest on 32-bit ones.
MEMORY_BASE: Final = 1
MEMORY: Final = PyMemoryView_FromMemory(MEMORY_BASE, sys.maxsize - MEMORY_BASE, PyBUF_READ)
MEMORY_COVERS_ALL: Final = sys.maxsize >= 2**63 - 1

# A memoryview over a filled-in Py_buffer: any format (``Zf``, ``e``), shape and strides, which
# ``memoryview.cast`` cannot make. The view does not own ``buf``: _buffer ties the lifetime.
PyMemoryView_FromBuffer: Final = _bind("PyMemoryView_FromBuffer", _py, ctypes.POINTER(Py_buffer))

# Takes over a new reference that C code handed back as an address (an out-parameter), see `steal`.
Py_DecRef: Final = _bind("Py_DecRef", None, _vp)


def steal(address: int) -> object:
    """The object at ``address``, taking over the new reference that C code wrote there.

    ``py_object.value`` adds a reference of its own; the one the C function gave is dropped, so the
    object's count ends where a C caller's would.
    """
    obj = ctypes.cast(address, ctypes.py_object).value
    Py_DecRef(address)
    return obj


_Py_IncRef: Final = _bind("Py_IncRef", None, _py)


def keep_forever(obj: object) -> None:
    """Add a reference to ``obj`` that is never dropped, so that it outlives its module.

    For the ctypes callbacks tensorbridge hands to C code (the DLPack deleter): a consumer may call
    one after tensorbridge's modules have been cleared at exit, and freed callback code would crash.
    """
    _Py_IncRef(obj)
