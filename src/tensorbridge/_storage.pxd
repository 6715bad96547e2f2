# C declarations for the compiled build, read by Cython beside _storage.py (the pure-Python package
# never sees them): the storages are extension types, so their fields are C struct members and
# `_fill` is a C method. Nothing is cimported from another module: each module compiles, or falls
# back to its .py, on its own.
cdef class Storage:
    cdef public object ptr, nbytes, device, readonly, _owner, is_copied, _mv
    cdef object __weakref__

    cdef _fill(self, ptr, nbytes, device, readonly, owner, is_copied)

cdef class _SelfOwned(Storage):
    pass

cdef class BufferStorage(_SelfOwned):
    cdef public object view

cdef class DLPackStorage(_SelfOwned):
    cdef public object deleter, managed
