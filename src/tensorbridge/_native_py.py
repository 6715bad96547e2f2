"""The native layer in pure Python: ctypes and `struct` doing what `_native_c` does in C.

One of the two twins behind `_native` (which chooses between them; no other module does): the same
public names, signatures, results and errors as `_native_c`, each function documented there and
here alike. tests/test_native.py holds the twins to that: names and signatures, byte for byte on
the DLPack structs, and the same behaviour on the same inputs. What the pure build cannot do is
said where it stands: its capsule destructors are None (a destructor written in Python cannot run
while an exception is pending), and its callbacks take a pending exception out before they run.

Only mechanics live here, as in the compiled twin: every rule about what the calls mean stays in
the modules that make them.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from typing import Any, Final

from . import _capi
from ._capi import Py_buffer, Py_DecRef, PyBuffer_IsContiguous, PyObject_GetBuffer
from ._dlpack_abi import (
    DLPACK_MAJOR_VERSION,
    INT64_ARRAYS,
    LEGACY_WRITE,
    VERSIONED_READ,
    VERSIONED_WRITE,
)

__all__ = [
    "ManagedFromPy",
    "VoidFunction",
    "acquire_buffer",
    "capsule_is_valid",
    "capsule_new",
    "capsule_pointer",
    "capsule_set_name",
    "describe_buffer",
    "dlpack_capsule_destructor",
    "guarded_destructor_address",
    "new_managed",
    "new_object",
    "read_dims",
    "read_versioned",
    "tuple_maker",
    "void_callback",
]

_vp, _int = ctypes.c_void_p, ctypes.c_int

# The capsule calls: ``capsule_new(pointer, name, destructor)`` (``name`` bytes or None, outliving
# the capsule; ``destructor`` an address or None), ``capsule_pointer(capsule, name)``,
# ``capsule_is_valid(capsule, name)`` and ``capsule_set_name(capsule, name)``, with the C-API's
# results and errors (`ValueError` for a NULL pointer or another name).
capsule_new: Final = _capi.PyCapsule_New
capsule_pointer: Final = _capi.PyCapsule_GetPointer
capsule_is_valid: Final = _capi.PyCapsule_IsValid
capsule_set_name: Final = _capi.PyCapsule_SetName

_VOID_PROTOTYPE: Final = ctypes.PYFUNCTYPE(None, _vp)


class VoidFunction(ctypes._CFuncPtr):  # type: ignore[name-defined]
    """A callable for the C function ``void f(void *)`` at an address (a DLPack deleter), called
    with the GIL held, as NumPy and PyTorch, as consumers, call it too: a ctypes function pointer
    of ``PYFUNCTYPE(None, c_void_p)``'s prototype that refuses a NULL address (ctypes itself would
    make one, and calling it would crash)."""

    _argtypes_ = _VOID_PROTOTYPE._argtypes_
    _restype_ = _VOID_PROTOTYPE._restype_
    _flags_ = _VOID_PROTOTYPE._flags_
    __slots__ = ()

    def __new__(cls, address: int) -> VoidFunction:
        if not address:
            msg = "VoidFunction(): the function address is NULL"
            raise ValueError(msg)
        return super().__new__(cls, address)


class ManagedFromPy:
    """``int f(PyObject *obj, DLManagedTensorVersioned **out)`` at an address (a DLPack exchange
    API's ``managed_tensor_from_py_object_no_sync``), through ctypes, which holds the GIL and
    raises the error the function sets: ``f(obj)`` returns the managed tensor's address, 0 when the
    function failed, or wrote NULL, without setting an error."""

    __slots__ = ("_function",)
    _prototype = ctypes.PYFUNCTYPE(_int, ctypes.py_object, ctypes.POINTER(_vp))

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


def guarded_destructor_address() -> int | None:
    """The address of a capsule destructor that runs the capsule's context (a Python callable) on
    the capsule's address with any pending exception kept aside; None here. A destructor written
    in Python (ctypes) can neither run with an exception set nor return with one set again."""
    return None


def dlpack_capsule_destructor(release: Any) -> int | None:
    """The address of a C destructor for tensorbridge's DLPack capsules, which releases one that
    no consumer took through ``release(address, None)``; None here, for the reason
    `guarded_destructor_address` gives: `_exports` then watches the capsules instead."""
    return None


# The callbacks tensorbridge hands to C code as ``void f(void *)`` (DLPack deleters, Arrow release
# callbacks). A consumer may call one on any thread, and while its own exception propagates (an
# imported array freed during unwinding). A ctypes callback takes the GIL but can neither run with
# that exception set nor set it again when it returns: its first step takes the exception out, so
# the release itself always runs, and reports it as unraisable (3.12+; 3.11 has no call that
# returns it and can only clear it). The consumer's caller then gets ``SystemError`` instead.
_VoidCallback: Final = ctypes.CFUNCTYPE(None, _vp)
# Takes the pending exception out: a new reference, or NULL (3.12+); 3.11 only clears it.
_take_pending: Final = _capi.PyErr_GetRaisedException or _capi.PyErr_Clear


class _Unraisable:
    """The argument ``sys.unraisablehook`` takes."""

    __slots__ = ("err_msg", "exc_traceback", "exc_type", "exc_value", "object")

    def __init__(self, exc: BaseException, err_msg: str) -> None:
        self.exc_type, self.exc_value, self.exc_traceback = type(exc), exc, exc.__traceback__
        self.err_msg = err_msg
        self.object = None


def _report_pending(address: int, where: str) -> None:
    """Report the exception at ``address`` (a new reference) that a consumer had pending."""
    exc = _capi.steal(address)
    hook = getattr(sys, "unraisablehook", None)
    if hook is not None and isinstance(exc, BaseException):
        hook(_Unraisable(exc, f"Exception pending in the consumer that called {where}"))


def void_callback(function: Any) -> int:
    """The address of a C callback ``void f(void *pointer)`` that runs ``function(pointer as an
    int)`` on any thread, with the GIL taken; a pending exception is taken out first (see above).
    ``function`` lives as long as the process and also runs while the interpreter finalises: it
    decides what is safe then, and binds what it calls as defaults (module globals may be cleared)."""

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
    _capi.keep_forever(c_function)  # consumers may call it after this module's globals are cleared
    address: int = ctypes.cast(c_function, ctypes.c_void_p).value  # type: ignore[assignment]
    return address


def acquire_buffer(obj: object, flags: int) -> tuple[Py_buffer, int, int, bool]:
    """``PyObject_GetBuffer(obj, view, flags)`` into a new held view: ``(view, buf, len,
    readonly)``, the address 0 for NULL and ``readonly`` a bool. The view releases itself when it
    dies; its fields read as `_capi.Py_buffer`'s. Raises the exporter's error, holding nothing."""
    view = Py_buffer()
    PyObject_GetBuffer(obj, view, flags)
    exporter = view.obj
    if exporter:  # its reference moves to ``view.exporter``, which the collector sees
        view.exporter = ctypes.cast(exporter, ctypes.py_object).value
        Py_DecRef(exporter)
    return view, view.buf or 0, view.len, view.readonly != 0


def describe_buffer(
    view: Py_buffer,
) -> tuple[
    int, int, bytes | None, int, int, tuple[int, ...] | None, tuple[int, ...] | None, bool, bool
]:
    """The fields of the buffer ``view`` holds, in one call: ``(buf, len, format, itemsize, ndim,
    shape, strides, indirect, contiguous)``. ``buf`` is the address (0 for NULL); ``format`` is
    bytes or None; ``shape`` and ``strides`` are tuples of ``ndim`` ints, or None for NULL;
    ``indirect`` is True when a suboffset is non-negative (a PIL-style array of pointers);
    ``contiguous`` is ``PyBuffer_IsContiguous(view, 'C')``."""
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
        PyBuffer_IsContiguous(view, b"C") == 1,
    )


# ``new_object(cls)``: ``cls.__new__(cls)`` for a class that defines no ``__new__`` in Python (no
# ``__init__`` runs). Here no base is an extension type, so that allocator is ``object``'s.
new_object: Final = object.__new__


def tuple_maker(cls: type) -> Any:
    """A callable that makes an instance of ``cls``, a subclass of tuple that defines no
    ``__new__`` or ``__init__``, from a tuple, as ``tuple.__new__(cls, items)`` does (``Tensor._new``
    makes a `Size` per tensor): here the class itself, the fastest call Python has for that."""
    if not issubclass(cls, tuple) or cls.__new__ is not tuple.__new__:
        msg = f"tuple_maker(): {cls.__name__} is not a subclass of tuple with tuple's __new__"
        raise TypeError(msg)
    return cls


# The managed structs an export writes: the struct, then ``shape[ndim]`` and ``strides[ndim]`` in
# one block. Per (versioned, ndim): the block's `struct` format, the ctypes array type that holds
# it, and the offset of the shape (the struct's size: every DLPack struct ends 8-aligned).
_BLOCKS: dict[tuple[bool, int], tuple[struct.Struct, Any, int]] = {}


def _block_layout(versioned: bool, ndim: int) -> tuple[struct.Struct, Any, int]:
    layout = _BLOCKS.get((versioned, ndim))
    if layout is None:
        header = VERSIONED_WRITE if versioned else LEGACY_WRITE
        fmt = struct.Struct(f"{header.format}{ndim}q{ndim}q")
        layout = _BLOCKS[versioned, ndim] = (fmt, ctypes.c_char * fmt.size, header.size)
    return layout


def new_managed(
    versioned: bool,
    version: tuple[int, int],
    deleter: int,
    flags: int,
    data: int,
    device: tuple[int, int],
    dtype: tuple[int, int, int],
    byte_offset: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
) -> tuple[int, Any]:
    """A ``DLManagedTensorVersioned`` (``versioned``; else a ``DLManagedTensor``, which has no
    ``version`` or ``flags``) with these fields, followed by its shape and strides, in one new block.

    ``device`` is ``(device_type, device_id)``, ``dtype`` ``(code, bits, lanes)``; ``manager_ctx``
    is the struct's own address; ``shape`` and ``strides`` are tuples (or subclasses). Returns
    ``(address, block)``; the struct lives as long as the block. `OverflowError` for a value its
    field cannot hold, `ValueError` when ``strides`` is not as long as ``shape``: nothing stays
    allocated then.
    """
    ndim = len(shape)
    if len(strides) != ndim:
        msg = f"new_managed(): {ndim} dimensions but {len(strides)} strides"
        raise ValueError(msg)
    fmt, block_type, shape_at = _BLOCKS.get((versioned, ndim)) or _block_layout(versioned, ndim)
    block = block_type()
    address: int = ctypes.addressof(block)
    shape_p = address + shape_at
    dltensor = (data, *device, ndim, *dtype, shape_p, shape_p + 8 * ndim)
    try:
        if versioned:
            fmt.pack_into(
                block,
                0,
                *version,
                address,
                deleter,
                flags,
                *dltensor,
                byte_offset,
                *shape,
                *strides,
            )
        else:
            fmt.pack_into(block, 0, *dltensor, byte_offset, address, deleter, *shape, *strides)
    except struct.error as e:
        raise OverflowError(str(e)) from None
    return address, block


# Reading what a producer handed over, straight out of `_capi.MEMORY` (the address space as one
# read-only memoryview): one `unpack_from` per struct, no copy and no ctypes object per call. A
# reader returns None for memory outside that view, so that `_dlpack_c.read` judges the address in
# its own words.
_MEMORY: Final = _capi.MEMORY
_BASE: Final = _capi.MEMORY_BASE


def read_versioned(address: int, max_ndim: int) -> tuple[Any, ...] | None:
    """The fields of the ``DLManagedTensorVersioned`` at ``address``, in `_dlpack_abi.VERSIONED_READ`'s
    order: major, minor, manager_ctx, deleter, flags, then the DLTensor's data, device type and id,
    ndim, dtype (its 4 bytes as one native uint32), shape, strides and byte_offset; pointers as
    unsigned ints. Then the shape and strides as read by `read_dims`, when the major version is
    `DLPACK_MAJOR_VERSION`, ``0 < ndim <= max_ndim`` and neither pointer is NULL, else None (nothing
    of another major version may be trusted). None for an address outside ``[1, PY_SSIZE_T_MAX)``."""
    try:
        fields = VERSIONED_READ.unpack_from(_MEMORY, address - _BASE)
    except (struct.error, OverflowError):
        return None
    major, ndim, shape, strides = fields[0], fields[8], fields[10], fields[11]
    if major == DLPACK_MAJOR_VERSION and 0 < ndim <= max_ndim and shape and strides:
        return (*fields, read_dims(shape, strides, ndim))
    return (*fields, None)


def read_dims(
    shape: int, strides: int, ndim: int
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ``ndim`` int64s at ``shape`` and the ``ndim`` at ``strides``, as a pair of tuples; two
    empty tuples for ``ndim`` 0, whatever the addresses. None when either array lies outside
    ``[1, PY_SSIZE_T_MAX)``; `ValueError` for a negative ``ndim``."""
    if ndim > 0:
        try:
            try:
                fmt = INT64_ARRAYS[ndim]
            except IndexError:  # more dimensions than a tensor may have: the caller refuses them
                fmt = struct.Struct(f"@{ndim}q")
            sizes = fmt.unpack_from(_MEMORY, shape - _BASE)
            return sizes, fmt.unpack_from(_MEMORY, strides - _BASE)
        except (struct.error, OverflowError):
            return None
    if ndim == 0:  # nothing to read: no address is touched
        return (), ()
    msg = f"read_dims(): ndim must be non-negative; got {ndim}"
    raise ValueError(msg)
