# C declarations for the compiled build, read by Cython beside _storage.py (the pure-Python package
# never sees them): the storages are extension types, so their fields are C struct members and
# `_fill` is a C method; `locate`, the one bounds check on every import, and `own_managed`, the
# constructor of a `DLPackStorage`, are C functions that the importers cimport; `locate` calls
# `extent` as one.
cimport cython
from tensorbridge._layout cimport extent

cdef class Storage:
    cdef public object ptr, nbytes, device, readonly, _owner, is_copied, _mv
    cdef object __weakref__

    cdef _fill(self, ptr, nbytes, device, readonly, owner, is_copied)

cdef class _SelfOwned(Storage):
    pass

cdef class BufferStorage(_SelfOwned):
    cdef public object view

cdef object _finalizing

cdef class DLPackStorage(_SelfOwned):
    cdef public object deleter, managed

    cdef _own(self, ptr, nbytes, device, readonly, is_copied, managed)

cpdef tuple locate(ptr, nbytes, offset, shape, strides, itemsize, api, fail, bint sized=*, bint anchored=*, bint check_empty=*)

@cython.locals(storage=DLPackStorage)
cpdef DLPackStorage own_managed(ptr, nbytes, device, readonly, is_copied, managed)
