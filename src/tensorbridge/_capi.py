"""The only user of ``ctypes.pythonapi``: private prototypes for the C-API calls tensorbridge needs.

``ctypes.pythonapi.X.restype``/``argtypes`` are shared by every library in the process, so they are never
touched here (another package that sets them would break every caller that relies on them). Each function is bound through its own ``PYFUNCTYPE`` prototype, which holds
the GIL and turns a set Python error into an exception.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Final

__all__ = [
    "GUARDED_DESTRUCTOR",
    "PY_BUF_FULL_RO",
    "PY_BUF_ND",
    "PY_BUF_WRITABLE",
    "ManagedFromPy",
    "PyBuffer_Release",
    "PyCapsule_GetName",
    "PyCapsule_GetPointer",
    "PyCapsule_IsValid",
    "PyCapsule_New",
    "PyCapsule_SetName",
    "PyObject_GetBuffer",
    "Py_buffer",
    "VoidFunction",
    "acquire_buffer",
    "describe_buffer",
    "dlpack_capsule_destructor",
    "has_generic_getattr",
    "keep_forever",
    "new_managed",
    "new_object",
    "new_tuple",
    "offers_buffer",
    "read_dims",
    "read_versioned",
    "steal",
    "void_callback",
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


# The calls on every import's and export's path: direct in the compiled build (`_capi_c`, same
# signatures and errors), through ctypes otherwise. ``VoidFunction(address)`` calls
# ``void f(void *)`` at an address with the GIL held: a DLPack deleter, which must work with the GIL
# held or not, and which NumPy and PyTorch, as consumers, call with it held too.
def _compiled() -> Any:
    """The compiled `_capi_c`, or None (the pure-Python build, or TENSORBRIDGE_NO_EXTENSIONS=1)."""
    try:
        from . import _capi_c
    except ImportError:
        return None
    return _capi_c


_direct = _compiled()
PyCapsule_New: Any
PyCapsule_IsValid: Any
PyCapsule_GetPointer: Any
PyCapsule_SetName: Any
VoidFunction: Any
if _direct is not None:
    PyCapsule_New = _direct.capsule_new
    PyCapsule_IsValid = _direct.capsule_is_valid
    PyCapsule_GetPointer = _direct.capsule_pointer
    PyCapsule_SetName = _direct.capsule_set_name
    VoidFunction = _direct.VoidFunction
else:
    PyCapsule_New = _bind("PyCapsule_New", _py, _vp, _cp, _vp)
    PyCapsule_IsValid = _bind("PyCapsule_IsValid", _int, _py, _cp)
    PyCapsule_GetPointer = _bind("PyCapsule_GetPointer", _vp, _py, _cp)
    PyCapsule_SetName = _bind("PyCapsule_SetName", _int, _py, _cp)
    VoidFunction = ctypes.PYFUNCTYPE(None, _vp)


class _ManagedFromPy:
    """``int f(PyObject *obj, DLManagedTensorVersioned **out)`` at an address (a DLPack exchange
    API's ``managed_tensor_from_py_object_no_sync``), through ctypes, which holds the GIL and
    raises the error the function sets: ``f(obj)`` returns the managed tensor's address, 0 when the
    function failed, or wrote NULL, without setting an error."""

    __slots__ = ("_function",)
    _prototype = ctypes.PYFUNCTYPE(_int, _py, ctypes.POINTER(_vp))

    def __init__(self, address: int) -> None:
        if not address:
            msg = "ManagedFromPy(): the function address is NULL"
            raise ValueError(msg)
        self._function = self._prototype(address)

    def __call__(self, obj: object) -> int:
        out = _vp()
        if self._function(obj, ctypes.byref(out)):
            return 0
        return out.value or 0


# ``ManagedFromPy(address)``: the exchange API's import function, callable as ``f(obj)``; a direct C
# call in the compiled build.
ManagedFromPy: Final = _ManagedFromPy if _direct is None else _direct.ManagedFromPy
# A capsule destructor in C that runs the capsule's context (a Python callable) on the capsule's
# address with any pending exception kept aside, so that the caller gets its own exception back:
# compiled only. A destructor written in Python (ctypes) cannot do that: Python code cannot run
# with an exception set, nor return with one set again.
GUARDED_DESTRUCTOR: Final = None if _direct is None else _direct.guarded_destructor_address()
# `cls.__new__(cls)` for a class that defines no `__new__` in Python (no `__init__` runs): compiled,
# a direct call of the class's C allocator, with no argument tuple to build or parse; otherwise
# `object.__new__`, the allocator of such a class when no base is an extension type.
new_object: Final = object.__new__ if _direct is None else _direct.new_object
# `tuple.__new__(cls, items)` for a tuple subclass and a tuple: compiled, allocated through the
# class's C slot and filled in place (no argument tuple, no temporary tuple, no `__init__`).
new_tuple: Final = tuple.__new__ if _direct is None else _direct.new_tuple
# Writes a DLPack managed tensor with its shape and strides into one new block, from C: compiled
# only (`_dlpack_export` packs the same struct with `struct` without it). See `_capi_c.new_managed`.
new_managed: Final = None if _direct is None else _direct.new_managed
# Load a producer's DLManagedTensorVersioned, and its shape and strides, from C: compiled only
# (`_dlpack_c` unpacks the same fields with `struct` without them). See `_capi_c.read_versioned`.
read_versioned: Final = None if _direct is None else _direct.read_versioned
read_dims: Final = None if _direct is None else _direct.read_dims


def dlpack_capsule_destructor(release: Any) -> int | None:
    """The address of a C destructor for tensorbridge's DLPack capsules, or None without one.

    Freeing a capsule no consumer took (still named ``dltensor``/``dltensor_versioned``), it calls
    ``release(address of the managed tensor, None)``, with any pending exception kept aside; nothing
    while the interpreter finalises. Compiled only: without it the capsules carry no destructor and
    `_exports` watches them instead.
    """
    return None if _direct is None else _direct.dlpack_capsule_destructor(release)


PyCapsule_SetDestructor: Final = _bind("PyCapsule_SetDestructor", _int, _py, _vp)
PyErr_Clear: Final = _bind("PyErr_Clear", None)
# PyObject *PyErr_GetRaisedException(void) (3.12+): takes the pending exception out; NULL if none.
PyErr_GetRaisedException: Final = (
    _bind("PyErr_GetRaisedException", _vp) if sys.version_info >= (3, 12) else None
)


# The callbacks tensorbridge hands to C code as ``void f(void *)`` (DLPack deleters, Arrow release
# callbacks), made in one place. A consumer may call one on any thread, and while its own exception
# propagates (an imported array freed during unwinding). Compiled, `_capi_c.void_callback` makes a
# C function that takes the GIL and keeps that exception, as NumPy's and PyTorch's deleters do.
# Without it, the callback is ctypes code, which takes the GIL but can neither run with the
# exception set nor set it again when it returns: its first step takes the exception out, so the
# release itself always runs, and reports it as unraisable (3.12+; 3.10 and 3.11 have no call that
# returns it and can only clear it). The consumer's caller then gets ``SystemError`` instead.
_VoidCallback: Final = ctypes.CFUNCTYPE(None, _vp)
# Takes the pending exception out: a new reference, or NULL (3.12+); 3.10 and 3.11 only clear it.
_take_pending: Final = PyErr_GetRaisedException or PyErr_Clear


class _Unraisable:
    """The argument ``sys.unraisablehook`` takes."""

    __slots__ = ("err_msg", "exc_traceback", "exc_type", "exc_value", "object")

    def __init__(self, exc: BaseException, err_msg: str) -> None:
        self.exc_type, self.exc_value, self.exc_traceback = type(exc), exc, exc.__traceback__
        self.err_msg = err_msg
        self.object = None


def _report_pending(address: int, where: str) -> None:
    """Report the exception at ``address`` (a new reference) that a consumer had pending."""
    exc = steal(address)
    hook = getattr(sys, "unraisablehook", None)
    if hook is not None and isinstance(exc, BaseException):
        hook(_Unraisable(exc, f"Exception pending in the consumer that called {where}"))


def _ctypes_void_callback(function: Any) -> int:
    def callback(
        address: int | None,
        _take: Any = _take_pending,
        _report: Any = _report_pending,
        _function: Any = function,
        _where: str = getattr(function, "__qualname__", "a callback"),
    ) -> None:
        pending = _take()  # first: every other call fails while an exception is set
        if pending:
            _report(pending, _where)
        _function(address or 0)

    c_function = _VoidCallback(callback)
    keep_forever(c_function)  # consumers may call it after this module's globals are cleared
    address: int = ctypes.cast(c_function, ctypes.c_void_p).value  # type: ignore[assignment]
    return address


def void_callback(function: Any) -> int:
    """The address of a C callback ``void f(void *pointer)`` that runs ``function(pointer as an
    int)`` on any thread, with the GIL taken. Compiled, a pending exception is kept as it was;
    otherwise it is taken out first (see above). ``function`` lives as long as the process and
    also runs while the interpreter finalises: it decides what is safe then, and binds what it
    calls as defaults (module globals may be cleared)."""
    if _direct is not None:
        address: int = _direct.void_callback(function)
        return address
    return _ctypes_void_callback(function)


# Py_IncRef on an address (a ``Py_buffer``'s ``obj``), where `_Py_IncRef` below takes an object.
_Py_IncRef_address: Final = _bind("Py_IncRef", None, _vp)


class Py_buffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (Include/pybuffer.h), stable since 3.3.

    One that ``PyObject_GetBuffer`` filled is released exactly once: by ``PyBuffer_Release``
    (which sets ``obj`` to NULL), or else when the struct dies (never while the interpreter is
    finalising: the memory is then left to the OS). One filled by hand leaves ``obj`` NULL.

    `acquire_buffer` moves the reference that ``obj`` stands for to the attribute ``exporter``,
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
            _incref(self.obj)  # the reference `acquire_buffer` moved to ``exporter``
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


# A held buffer, in one call on every buffer import's path: ``acquire_buffer(obj, flags)`` returns
# ``(view, buf, len, readonly)`` (the held view, which releases itself when it dies; the address, 0
# for NULL; the length; a bool) and raises the exporter's error with nothing held. The view's
# fields read as `Py_buffer`'s (``view.shape[:n]`` works on both builds). The compiled `BufferView`
# holds the struct inline; here it is the ctypes struct itself.
def _acquire_buffer(obj: object, flags: int) -> tuple[Py_buffer, int, int, bool]:
    view = Py_buffer()
    PyObject_GetBuffer(obj, view, flags)
    exporter = view.obj
    if exporter:  # its reference moves to ``view.exporter``, which the collector sees
        view.exporter = ctypes.cast(exporter, ctypes.py_object).value
        Py_DecRef(exporter)
    return view, view.buf or 0, view.len, view.readonly != 0


# ``describe_buffer(view)``: the held buffer's fields, ``(buf, len, format, itemsize, ndim, shape,
# strides, indirect, contiguous)``: ``buf`` the address (0 for NULL), ``format`` bytes or None,
# ``shape``/``strides`` tuples of ``ndim`` ints or None for NULL, ``indirect`` whether a suboffset is
# non-negative, ``contiguous`` whether the items fill ``[buf, buf + len)`` in row-major order
# (``PyBuffer_IsContiguous(view, 'C')``). One call, where field reads cost one each.
_PyBuffer_IsContiguous: Final = _bind(
    "PyBuffer_IsContiguous", _int, ctypes.POINTER(Py_buffer), ctypes.c_char
)


def _describe_buffer(
    view: Py_buffer,
) -> tuple[
    int, int, bytes | None, int, int, tuple[int, ...] | None, tuple[int, ...] | None, bool, bool
]:
    ndim = view.ndim
    suboffsets = view.suboffsets
    return (
        view.buf or 0,
        view.len,
        view.format,
        view.itemsize,
        ndim,
        tuple(view.shape[:ndim]) if view.shape else None,
        tuple(view.strides[:ndim]) if view.strides else None,
        bool(suboffsets) and any(suboffsets[i] >= 0 for i in range(ndim)),
        _PyBuffer_IsContiguous(view, b"C") == 1,
    )


acquire_buffer: Any
describe_buffer: Any
if _direct is None:
    acquire_buffer, describe_buffer = _acquire_buffer, _describe_buffer
else:
    acquire_buffer, describe_buffer = _direct.acquire_buffer, _direct.describe_buffer


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
# `offers_buffer` instead.
PyObject_CheckBuffer: Final = _bind("PyObject_CheckBuffer", _int, _py)


def offers_buffer(obj: object, flags: int = PY_BUF_FULL_RO) -> bool:
    """Whether a consumer asking ``obj`` for a buffer with ``flags`` gets one (the default is what
    ``memoryview(obj)`` asks): the one answer every buffer probe gives.

    A failed request means no, whatever it raised: ``TypeError`` (no buffer protocol),
    ``BufferError`` (the exporter refused this request: from Python 3.12 a class's ``__buffer__``
    may, as a bfloat16 `Tensor` refuses to name its format) or any other error of the exporter's,
    as NumPy treats a failed request while it looks for an array. The buffer is released before
    this returns.
    """
    try:
        acquire_buffer(obj, flags)  # the held view it returns releases itself as it dies here
    except Exception:
        return False
    return True


# ``types.CapsuleType`` exists only from Python 3.13; every capsule shares this type.
CapsuleType: Final[type] = type(PyCapsule_New(id(_api), None, None))

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
