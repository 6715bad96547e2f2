# C declarations for the compiled build, read by Cython beside _dlpack.py: `from_dlpack` calls its
# own steps as C functions (each stays callable from Python), and the bounds check and the tensor
# constructor of the modules below as C functions too; what it knows of a producer type, the
# tensor it made and that tensor's storage are C structs whose fields it reads and writes directly.
cimport cython
from tensorbridge._fields cimport TensorFields
from tensorbridge._storage cimport DLPackStorage, locate, own_managed
from tensorbridge._tensor cimport _construct

cdef dict _DTYPES

cdef class _Producer:
    cdef public object exchange, immutable, methods, neg_bit, screen

@cython.locals(producer=_Producer, t=TensorFields, storage=DLPackStorage)
cpdef _from_dlpack(ext_tensor)
cpdef _request(obj, _Producer producer, target, copy)
cpdef tuple _open(capsule, bint immutable=*)
cpdef tuple _versioned(managed)
cpdef _tensor(managed, data, dev_type, dev_id, ndim, dtype_word, shape_p, strides_p, byte_offset, readonly, copied, dims)
