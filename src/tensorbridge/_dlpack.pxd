# C declarations for the compiled build, read by Cython beside _dlpack.py: `from_dlpack` calls its
# own steps as C functions (each stays callable from Python), and the bounds check and the tensor
# constructor of the modules below as C functions too.
from tensorbridge._storage cimport locate, own_managed
from tensorbridge._tensor cimport _construct

cpdef _request(obj, producer, target, copy)
cpdef tuple _open(capsule, bint immutable=*)
cpdef tuple _versioned(managed)
cpdef _tensor(managed, data, dev_type, dev_id, ndim, dtype_word, shape_p, strides_p, byte_offset, readonly, copied)
