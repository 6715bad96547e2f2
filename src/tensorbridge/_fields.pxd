# C declarations for the compiled build, read by Cython beside _fields.py: a tensor's fields are C
# struct members, which the modules that declare a local of this type (in their own .pxd, with
# `cimport`) read and write directly.
cdef class TensorFields:
    cdef public object _storage, _offset, _shape, _strides, _dtype, _requires_grad
    cdef object __weakref__
