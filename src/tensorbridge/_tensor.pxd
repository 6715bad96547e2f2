# C declarations for the compiled build, read by Cython beside _tensor.py: `_construct` writes the
# fields of the tensor it makes as C struct members (see _fields.pxd).
cimport cython
from tensorbridge._fields cimport TensorFields

@cython.locals(self=TensorFields)
cpdef _construct(type cls, storage, offset, shape, strides, dtype, api=*, requires_grad=*, checked=*)
