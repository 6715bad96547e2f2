# cython: language_level=3
"""The native layer, compiled: the C-API calls and the DLPack struct accesses of every import's and export's path.

One of the two twins behind `_native` (which chooses between them; no other module does): the same
public names, signatures, results and errors as `_native_py`, which does the same through ctypes
and `struct` (a ctypes call costs about 0.4 µs; these cost what a Python call does). Only C-API
mechanics live here: every rule about what the calls mean stays in the modules that make them.

The DLPack structs are declared from include/dlpack/dlpack.h, so the C compiler lays them out:
`new_managed` stores the fields of an exported managed struct that `_dlpack_export` has decided,
`read_versioned` and `read_dims` load a producer's managed struct and its shape and strides
(tests/test_native.py checks both twins byte for byte and value for value). What only C can do:
the capsule destructors that keep a pending exception (`dlpack_capsule_destructor`,
`guarded_destructor_address`) and callbacks that keep one too (`void_callback`).
"""

cimport cython
import functools
import sys

from cpython.buffer cimport PyBuffer_IsContiguous, PyBuffer_Release, PyObject_GetBuffer
from cpython.pycapsule cimport (
    PyCapsule_Destructor,
    PyCapsule_GetPointer,
    PyCapsule_IsValid,
    PyCapsule_New,
    PyCapsule_SetName,
)
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyTypeObject
from cpython.exc cimport PyErr_Occurred
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from cpython.long cimport PyLong_FromLongLong
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy, strcmp


cdef inline const char* _name(object name) except? NULL:
    # A capsule name, as ctypes passes a c_char_p: bytes, or None for NULL. The caller keeps the
    # bytes alive for as long as C code may read them (a capsule stores the pointer it is given).
    if name is None:
        return NULL
    return <bytes>name


def capsule_new(uintptr_t pointer, object name, object destructor):
    """``PyCapsule_New``: a capsule of ``pointer`` under ``name`` (which must outlive it), with the
    destructor at the address ``destructor`` (an int, or None for none); `ValueError` for a NULL
    pointer."""
    cdef uintptr_t function = 0 if destructor is None else <uintptr_t>destructor
    return PyCapsule_New(<void*>pointer, _name(name), <PyCapsule_Destructor><void*>function)


def capsule_pointer(object capsule, object name):
    """``PyCapsule_GetPointer``: the pointer as an int; `ValueError` for another name (and None for
    NULL, which a valid capsule never holds)."""
    cdef void* pointer = PyCapsule_GetPointer(capsule, _name(name))
    return None if pointer == NULL else <uintptr_t>pointer


def capsule_is_valid(object capsule, object name):
    """``PyCapsule_IsValid``: 1 for a capsule under ``name`` (bytes, or None) with a pointer, else 0."""
    return PyCapsule_IsValid(capsule, _name(name))


def capsule_set_name(object capsule, object name):
    """``PyCapsule_SetName``: 0, or the C-API's exception. ``name`` must outlive the capsule."""
    return PyCapsule_SetName(capsule, _name(name))


ctypedef void (*_void_function)(void*) noexcept nogil


cdef class VoidFunction:
    """A callable for the C function ``void f(void *)`` at an address (a DLPack deleter), called
    with the GIL held, as a ctypes ``PYFUNCTYPE(None, c_void_p)`` object calls it."""

    cdef _void_function function

    def __cinit__(self, uintptr_t address):
        if address == 0:
            raise ValueError("VoidFunction(): the function address is NULL")
        self.function = <_void_function><void*>address

    def __call__(self, uintptr_t argument):
        self.function(<void*>argument)


ctypedef int (*_from_py_function)(void* py_object, void** out)


cdef int _failed(int status) except -1:
    # -1 with the error the called function set raises it; a failure without one is 1.
    if status != 0:
        return -1 if PyErr_Occurred() != NULL else 1
    return 0


cdef class ManagedFromPy:
    """A callable for ``int f(void* py_object, DLManagedTensorVersioned** out)`` at an address (a
    DLPack exchange API's ``managed_tensor_from_py_object_no_sync``), called with the GIL held, as
    a ctypes ``PYFUNCTYPE`` object calls it: ``f(obj)`` returns the managed tensor's address; 0
    when the function failed, or wrote NULL, without setting an error; its error is raised."""

    cdef _from_py_function function

    def __cinit__(self, uintptr_t address):
        if address == 0:
            raise ValueError("ManagedFromPy(): the function address is NULL")
        self.function = <_from_py_function><void*>address

    def __call__(self, object obj):
        cdef void* out = NULL
        if _failed(self.function(<void*>obj, &out)):
            return 0
        return <uintptr_t>out


cdef object _is_finalizing = sys.is_finalizing


cdef tuple _ssize_tuple(Py_ssize_t* values, int ndim):
    # ``ndim`` C integers as a tuple of ints; None for NULL.
    if values == NULL:
        return None
    cdef tuple out = PyTuple_New(ndim)
    cdef int i
    cdef object item
    for i in range(ndim):
        item = values[i]
        Py_INCREF(item)  # PyTuple_SET_ITEM steals the reference the tuple keeps
        PyTuple_SET_ITEM(out, i, item)
    return out


@cython.no_gc_clear
cdef class BufferView:
    """A ``Py_buffer`` held open: filled by `acquire_buffer`, ``PyBuffer_Release`` exactly once, when
    the object dies (never while the interpreter is finalising: the memory is then left
    to the OS). Its fields read as those of `_capi.Py_buffer` do: addresses as ints or None,
    ``format`` as bytes or None, ``shape``/``strides``/``suboffsets`` as tuples (or None for NULL).

    The garbage collector sees the exporter: ``exporter`` (a second reference to what
    ``view.obj`` points to) makes the type a collected one, and Cython's traversal of such a type
    visits both ``exporter`` and the ``obj`` of its ``Py_buffer``. An exporter that holds a
    tensor over its own buffer is then a cycle the collector can break, as it breaks one through
    a ``memoryview``. The collector never clears either reference itself (``no_gc_clear``): the
    release needs them, and the cycle is broken on the exporter's side.
    """

    cdef Py_buffer view
    cdef bint held
    cdef object exporter

    def __cinit__(self):
        self.held = False  # until `acquire_buffer` fills it

    def __dealloc__(self):
        # Cython keeps a pending exception around this (a view may die while one propagates),
        # and drops ``exporter`` after it, once the export is released.
        if self.held and _is_finalizing is not None and not _is_finalizing():
            self.held = False
            PyBuffer_Release(&self.view)

    @property
    def buf(self):
        return None if self.view.buf == NULL else <uintptr_t>self.view.buf

    @property
    def obj(self):
        cdef PyObject* exporter = <PyObject*>self.view.obj  # no new reference
        return None if not self.held or exporter == NULL else <uintptr_t>exporter

    @property
    def len(self):
        return self.view.len

    @property
    def itemsize(self):
        return self.view.itemsize

    @property
    def readonly(self):
        return self.view.readonly

    @property
    def ndim(self):
        return self.view.ndim

    @property
    def format(self):
        return None if self.view.format == NULL else <bytes>self.view.format

    @property
    def shape(self):
        return _ssize_tuple(self.view.shape, self.view.ndim)

    @property
    def strides(self):
        return _ssize_tuple(self.view.strides, self.view.ndim)

    @property
    def suboffsets(self):
        return _ssize_tuple(self.view.suboffsets, self.view.ndim)


def acquire_buffer(object obj, int flags):
    """``PyObject_GetBuffer(obj, view, flags)`` into a new `BufferView`: ``(view, buf, len,
    readonly)``, the address 0 for NULL and ``readonly`` a bool. Raises the exporter's error,
    holding nothing."""
    cdef BufferView view = BufferView.__new__(BufferView)
    PyObject_GetBuffer(obj, &view.view, flags)
    view.held = True
    cdef PyObject* exporter = <PyObject*>view.view.obj  # no new reference
    if exporter != NULL:  # seen by the collector (see `BufferView`)
        view.exporter = <object>exporter
    return view, <uintptr_t>view.view.buf, view.view.len, view.view.readonly != 0


def describe_buffer(BufferView view not None):
    """The fields of the buffer ``view`` holds, in one call: ``(buf, len, format, itemsize, ndim,
    shape, strides, indirect, contiguous)``. ``buf`` is the address (0 for NULL); ``format`` is
    bytes or None; ``shape`` and ``strides`` are tuples of ``ndim`` ints, or None for NULL; ``indirect`` is True when a suboffset is
    non-negative (a PIL-style array of pointers); ``contiguous`` is ``PyBuffer_IsContiguous(view,
    'C')``: the items fill ``[buf, buf + len)`` in row-major order."""
    cdef Py_buffer* b = &view.view
    cdef int i
    cdef bint indirect = False
    if b.suboffsets != NULL:
        for i in range(b.ndim):
            if b.suboffsets[i] >= 0:
                indirect = True
    return (
        <uintptr_t>b.buf,
        b.len,
        None if b.format == NULL else <bytes>b.format,
        b.itemsize,
        b.ndim,
        _ssize_tuple(b.shape, b.ndim),
        _ssize_tuple(b.strides, b.ndim),
        indirect,
        PyBuffer_IsContiguous(b, b'C') == 1,
    )


cdef extern from "Python.h":
    void* _capsule_context "PyCapsule_GetContext" (PyObject* capsule)
    void* _capsule_pointer_of "PyCapsule_GetPointer" (PyObject* capsule, const char* name)
    const char* _capsule_name "PyCapsule_GetName" (PyObject* capsule)
    void _err_fetch "PyErr_Fetch" (PyObject** kind, PyObject** value, PyObject** traceback)
    void _err_restore "PyErr_Restore" (PyObject* kind, PyObject* value, PyObject* traceback)
    void _write_unraisable "PyErr_WriteUnraisable" (PyObject* where)
    PyObject* _int_from_pointer "PyLong_FromVoidPtr" (void* pointer)
    PyObject* _vectorcall "PyObject_Vectorcall" (PyObject* function, PyObject** args, size_t nargs, PyObject* names)
    void _decref "Py_DecRef" (PyObject* obj)


cdef extern from *:
    """
    static int tensorbridge_finalizing(void) {
    #if PY_VERSION_HEX >= 0x030D0000
        return Py_IsFinalizing();
    #else
        return _Py_IsFinalizing();
    #endif
    }
    """
    int _finalizing "tensorbridge_finalizing" ()


# Both destructors below run while a capsule is freed, which may happen while an exception
# propagates (a consumer refusing the capsule). Python code cannot run with that exception set,
# nor set it again when it returns, so they take it out, call Python, and put it back: the caller
# gets its own exception. The callable's own failure is reported as unraisable, as ctypes does.
# They take the capsule as a borrowed PyObject*: it is being freed, so no reference may be made.


cdef void _call_keeping_error(PyObject* function, void* pointer, PyObject* second) noexcept:
    """``function(pointer as an int)``, or ``function(pointer as an int, second)`` when ``second``
    is not NULL, with any pending exception kept as it was."""
    cdef PyObject* kind
    cdef PyObject* value
    cdef PyObject* traceback
    cdef PyObject* result = NULL
    cdef PyObject* arguments[2]
    _err_fetch(&kind, &value, &traceback)
    cdef PyObject* address = _int_from_pointer(pointer)
    if address != NULL:
        arguments[0], arguments[1] = address, second
        result = _vectorcall(function, arguments, 1 if second == NULL else 2, NULL)
    if address != NULL:
        _decref(address)
    if result == NULL:
        _write_unraisable(function)
    else:
        _decref(result)
    _err_restore(kind, value, traceback)


cdef void _guarded_destructor(PyObject* capsule) noexcept:
    # Calls the Python callable stored as the capsule's context with the capsule's address, as a
    # ctypes destructor receives it. PyCapsule_GetContext sets no error for a valid capsule.
    cdef PyObject* function = <PyObject*>_capsule_context(capsule)
    if function != NULL:  # NULL: no callable was set
        _call_keeping_error(function, <void*>capsule, NULL)


def guarded_destructor_address():
    """The address of a capsule destructor (``void (*)(PyObject *)``) that calls the capsule's
    context, a Python callable the caller keeps alive, with the capsule's address, keeping any
    exception that is set when the capsule is freed."""
    return <uintptr_t>&_guarded_destructor


cdef object _dlpack_release = None  # set once, by `dlpack_capsule_destructor`


cdef void _release_unconsumed_dlpack(PyObject* capsule) noexcept:
    # A capsule still under its own name was never consumed: its export is released as the
    # deleter would release it (DLPack: the producer's capsule destructor calls the deleter of an
    # unconsumed capsule). A renamed one ("used_*") belongs to its consumer, which calls the
    # deleter when it is done. While the interpreter finalises, nothing runs (leak, never crash).
    # PyCapsule_GetName and PyCapsule_GetPointer under the capsule's own name set no error for a
    # capsule being freed (it is valid: its pointer is not NULL).
    cdef const char* name
    cdef void* managed
    if _dlpack_release is None or _finalizing():
        return
    name = _capsule_name(capsule)
    if name == NULL or (strcmp(name, b"dltensor_versioned") != 0 and strcmp(name, b"dltensor") != 0):
        return
    managed = _capsule_pointer_of(capsule, name)
    if managed != NULL:
        _call_keeping_error(<PyObject*>_dlpack_release, managed, <PyObject*>None)


def dlpack_capsule_destructor(object release):
    """The address of the destructor of tensorbridge's DLPack capsules: for a capsule no consumer
    took, it calls ``release(address of the managed tensor, None)``, keeping any pending exception.
    ``release`` is held for the life of the process (one per process: a later call replaces it)."""
    global _dlpack_release
    _dlpack_release = release
    return <uintptr_t>&_release_unconsumed_dlpack


# Callbacks handed to C code that calls them as ``void f(void *)``: the deleter of every DLPack
# managed tensor tensorbridge exports, and the release callbacks of its Arrow structs. A consumer
# calls one on any thread, with or without the GIL, and possibly while its own exception
# propagates (an imported array freed during unwinding): each takes the GIL, sets that exception
# aside around the Python callable it runs, and puts it back, as NumPy's and PyTorch's deleters
# do. One C function per slot, since a C function pointer carries no data of its own.
cdef extern from "Python.h":
    int _initialized "Py_IsInitialized" () nogil
    int _holds_gil "PyGILState_Check" () nogil

cdef enum:
    _CALLBACK_SLOTS = 4
cdef list _callbacks = [None] * _CALLBACK_SLOTS


cdef void _run_callback(int slot, void* pointer) noexcept with gil:
    # The callable runs while the interpreter finalises too: it decides what is safe then (a
    # DLPack deleter does nothing, an Arrow release must still mark its struct released, or Arrow
    # aborts the process). During the interpreter's teardown only a thread that holds the GIL
    # (the one tearing it down) gets here: another one may no longer take it.
    if _callbacks is None:
        return
    function = _callbacks[slot]
    if function is not None:
        _call_keeping_error(<PyObject*>function, pointer, NULL)


cdef void _callback_0(void* pointer) noexcept nogil:
    if _holds_gil() or _initialized():
        _run_callback(0, pointer)


cdef void _callback_1(void* pointer) noexcept nogil:
    if _holds_gil() or _initialized():
        _run_callback(1, pointer)


cdef void _callback_2(void* pointer) noexcept nogil:
    if _holds_gil() or _initialized():
        _run_callback(2, pointer)


cdef void _callback_3(void* pointer) noexcept nogil:
    if _holds_gil() or _initialized():
        _run_callback(3, pointer)


cdef _void_function _CALLBACK_FUNCTIONS[_CALLBACK_SLOTS]
_CALLBACK_FUNCTIONS[:] = [_callback_0, _callback_1, _callback_2, _callback_3]


def void_callback(object function not None):
    """The address of a C function ``void f(void *pointer)`` that calls ``function(pointer as an
    int)`` from any thread, taking the GIL, with any pending exception kept as it was (the
    callable's own failure is reported as unraisable), until the interpreter is torn down.
    ``function`` is held for the life of the process; at most four per process."""
    for slot in range(_CALLBACK_SLOTS):
        if _callbacks[slot] is None:
            _callbacks[slot] = function
            return <uintptr_t>_CALLBACK_FUNCTIONS[slot]
    raise RuntimeError(f"void_callback(): all {_CALLBACK_SLOTS} callback slots are taken")


def new_object(type cls not None):
    """``cls.__new__(cls)`` through the class's own C slot, with no argument tuple to build or
    parse and no ``__init__`` (``Tensor._new`` makes one per tensor). For a class that defines no
    ``__new__`` in Python, the slot is its nearest extension-type base's allocator, or ``object``'s."""
    if (<PyTypeObject*>cls).tp_new == NULL:
        raise TypeError(f"cannot create '{cls.__name__}' instances")
    return (<PyTypeObject*>cls).tp_new(cls, <PyObject*>(), NULL)


cdef extern from "Python.h":
    # The one PyTypeObject slot Cython's declaration leaves out.
    ctypedef struct _AllocatingType "PyTypeObject":
        PyObject* (*tp_alloc)(PyTypeObject*, Py_ssize_t)


def tuple_maker(type cls not None):
    """A callable that makes an instance of ``cls``, a subclass of tuple that defines no
    ``__new__`` or ``__init__``, from a tuple, as ``tuple.__new__(cls, items)`` does (``Tensor._new``
    makes a `Size` per tensor): here `_new_tuple` bound to ``cls``."""
    if not issubclass(cls, tuple) or cls.__new__ is not tuple.__new__:
        raise TypeError(
            f"tuple_maker(): {cls.__name__} is not a subclass of tuple with tuple's __new__"
        )
    return functools.partial(_new_tuple, cls)


def _new_tuple(type cls not None, tuple items not None):
    # ``tuple.__new__(cls, items)``, allocated through the class's C slot and filled in place,
    # with no argument tuple, no temporary tuple and no ``__init__``.
    cdef Py_ssize_t n = len(items), i
    cdef PyObject* raw = (<_AllocatingType*>cls).tp_alloc(<PyTypeObject*>cls, n)
    if raw == NULL:
        raise MemoryError()
    cdef object out = <object>raw  # a second reference: the one tp_alloc returned is dropped
    Py_DECREF(out)
    cdef object item
    for i in range(n):
        item = items[i]
        Py_INCREF(item)  # PyTuple_SET_ITEM steals the reference the tuple keeps
        PyTuple_SET_ITEM(out, i, item)
    return out


# The structs, declared from the header (include/dlpack/dlpack.h): the C compiler lays them out, and
# checks every access below against it. Only the fields read or written here are named.
cdef extern from "dlpack/dlpack.h":
    const int DLPACK_MAJOR_VERSION

    ctypedef struct DLDevice:
        int32_t device_type
        int32_t device_id

    ctypedef struct DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes

    ctypedef struct DLTensor:
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset

    ctypedef struct DLManagedTensor:
        DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(DLManagedTensor* self) noexcept

    ctypedef struct DLPackVersion:
        uint32_t major
        uint32_t minor

    ctypedef struct DLManagedTensorVersioned:
        DLPackVersion version
        void* manager_ctx
        void (*deleter)(DLManagedTensorVersioned* self) noexcept
        uint64_t flags
        DLTensor dl_tensor

ctypedef void (*_legacy_deleter)(DLManagedTensor* self) noexcept
ctypedef void (*_versioned_deleter)(DLManagedTensorVersioned* self) noexcept


cdef class ManagedBlock:
    """One allocation holding a managed tensor followed by its shape and strides (``int64_t[ndim]``
    each), freed when the block dies: whoever holds the block holds the struct."""

    cdef void* memory

    def __dealloc__(self):
        PyMem_Free(self.memory)


def new_managed(
    bint versioned,
    tuple version not None,
    uintptr_t deleter,
    uint64_t flags,
    uintptr_t data,
    tuple device not None,
    tuple dtype not None,
    uint64_t byte_offset,
    object shape,
    object strides,
):
    """A ``DLManagedTensorVersioned`` (``versioned``; else a ``DLManagedTensor``, which has no
    ``version`` or ``flags``) with these fields, followed by its shape and strides, in one new block.

    ``device`` is ``(device_type, device_id)``, ``dtype`` ``(code, bits, lanes)``; ``manager_ctx``
    is the struct's own address; ``shape`` and ``strides`` are tuples (or subclasses). Returns
    ``(address, block)``; the struct lives as long as the block.
    `OverflowError` for a value its field cannot hold, `ValueError` when ``strides`` is not as long
    as ``shape``: nothing stays allocated then.
    """
    if not (isinstance(shape, tuple) and isinstance(strides, tuple)):
        raise TypeError("new_managed(): shape and strides must be tuples")
    cdef tuple dims_in = <tuple>shape
    cdef tuple steps_in = <tuple>strides
    cdef Py_ssize_t ndim = len(dims_in)
    cdef Py_ssize_t i
    if len(steps_in) != ndim:
        raise ValueError(f"new_managed(): {ndim} dimensions but {len(strides)} strides")
    if ndim > 0x7FFFFFFF:
        raise OverflowError(f"new_managed(): {ndim} dimensions do not fit DLTensor.ndim")
    cdef uint32_t major = version[0]
    cdef uint32_t minor = version[1]
    cdef int32_t device_type = device[0]
    cdef int32_t device_id = device[1]
    cdef uint8_t code = dtype[0]
    cdef uint8_t bits = dtype[1]
    cdef uint16_t lanes = dtype[2]
    cdef size_t header = sizeof(DLManagedTensorVersioned) if versioned else sizeof(DLManagedTensor)
    cdef ManagedBlock block = ManagedBlock.__new__(ManagedBlock)
    block.memory = PyMem_Malloc(header + 2 * sizeof(int64_t) * <size_t>ndim)
    if block.memory == NULL:
        raise MemoryError()
    cdef int64_t* dims = <int64_t*>(<char*>block.memory + header)
    for i in range(ndim):  # a value past int64 raises here, and the block frees the memory
        dims[i] = dims_in[i]
        dims[ndim + i] = steps_in[i]
    cdef DLManagedTensorVersioned* managed_versioned
    cdef DLManagedTensor* managed_legacy
    cdef DLTensor* tensor
    if versioned:
        managed_versioned = <DLManagedTensorVersioned*>block.memory
        managed_versioned.version.major = major
        managed_versioned.version.minor = minor
        managed_versioned.manager_ctx = block.memory
        managed_versioned.deleter = <_versioned_deleter><void*>deleter
        managed_versioned.flags = flags
        tensor = &managed_versioned.dl_tensor
    else:
        managed_legacy = <DLManagedTensor*>block.memory
        managed_legacy.manager_ctx = block.memory
        managed_legacy.deleter = <_legacy_deleter><void*>deleter
        tensor = &managed_legacy.dl_tensor
    tensor.data = <void*>data
    tensor.device.device_type = device_type
    tensor.device.device_id = device_id
    tensor.ndim = <int32_t>ndim
    tensor.dtype.code = code
    tensor.dtype.bits = bits
    tensor.dtype.lanes = lanes
    tensor.shape = dims
    tensor.strides = dims + ndim
    tensor.byte_offset = byte_offset
    return <uintptr_t>block.memory, block


# Reading what a producer handed over. The address checks stay with the caller (`_dlpack_c`): a
# reader returns None for memory outside [1, PY_SSIZE_T_MAX), the range its `struct` twin reads
# through, so that `_dlpack_c.read` refuses the address in its own words. Fields are copied out
# with memcpy: a producer's pointer need not be aligned.
cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX


cdef inline bint _outside(uintptr_t address, size_t size) noexcept:
    # [address, address + size) outside [1, PY_SSIZE_T_MAX), with no sum that can wrap
    if address == 0 or size > <size_t>PY_SSIZE_T_MAX:
        return True
    return address > <uintptr_t>(PY_SSIZE_T_MAX - <Py_ssize_t>size)


def read_versioned(uintptr_t address, Py_ssize_t max_ndim):
    """The fields of the ``DLManagedTensorVersioned`` at ``address``, in `_dlpack_abi.VERSIONED_READ`'s
    order: major, minor, manager_ctx, deleter, flags, then the DLTensor's data, device type and id,
    ndim, dtype (its 4 bytes as one native uint32), shape, strides and byte_offset; pointers as
    unsigned ints. Then the shape and strides as read by `read_dims`, when the major version is this
    header's, ``0 < ndim <= max_ndim`` and neither pointer is NULL, else None (nothing of another
    major version may be trusted). None for an address outside ``[1, PY_SSIZE_T_MAX)``."""
    cdef DLManagedTensorVersioned m
    if _outside(address, sizeof(m)):
        return None
    memcpy(&m, <void*>address, sizeof(m))
    cdef DLTensor* t = &m.dl_tensor
    cdef uint32_t word
    memcpy(&word, &t.dtype, sizeof(word))
    dims = None
    if (
        m.version.major == DLPACK_MAJOR_VERSION
        and 0 < t.ndim <= max_ndim and t.shape != NULL and t.strides != NULL
    ):
        dims = read_dims(<uintptr_t>t.shape, <uintptr_t>t.strides, t.ndim)
    return (
        m.version.major, m.version.minor, <uintptr_t>m.manager_ctx, <uintptr_t>m.deleter, m.flags,
        <uintptr_t>t.data, t.device.device_type, t.device.device_id, t.ndim, word,
        <uintptr_t>t.shape, <uintptr_t>t.strides, t.byte_offset, dims,
    )


cdef tuple _int64s(uintptr_t address, Py_ssize_t n):
    cdef tuple out = PyTuple_New(n)
    cdef int64_t value
    cdef Py_ssize_t i
    cdef object item
    for i in range(n):
        memcpy(&value, <char*>address + i * <Py_ssize_t>sizeof(int64_t), sizeof(value))
        item = PyLong_FromLongLong(value)
        Py_INCREF(item)  # PyTuple_SET_ITEM steals the reference the local still owns
        PyTuple_SET_ITEM(out, i, item)
    return out


cpdef read_dims(uintptr_t shape, uintptr_t strides, Py_ssize_t ndim):
    """The ``ndim`` int64s at ``shape`` and the ``ndim`` at ``strides``, as a pair of tuples (what
    two reads of `_dlpack_abi.INT64_ARRAYS[ndim]` give); two empty tuples for ``ndim`` 0, whatever
    the addresses. None when either array lies outside ``[1, PY_SSIZE_T_MAX)``; `ValueError` for a
    negative ``ndim``."""
    if ndim < 0:
        raise ValueError(f"read_dims(): ndim must be non-negative; got {ndim}")
    if ndim == 0:  # nothing to read: no address is touched
        return (), ()
    if ndim > PY_SSIZE_T_MAX // <Py_ssize_t>sizeof(int64_t):
        return None
    cdef size_t size = <size_t>ndim * sizeof(int64_t)
    if _outside(shape, size) or _outside(strides, size):
        return None
    return _int64s(shape, ndim), _int64s(strides, ndim)
