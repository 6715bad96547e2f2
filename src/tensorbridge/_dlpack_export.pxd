# C declarations for the compiled build, read by Cython beside _dlpack_export.py: an export calls
# its own steps as C functions (each stays callable from Python), and reads the fields of the tensor
# and of its storage as C struct members.
cimport cython
from tensorbridge._fields cimport TensorFields
from tensorbridge._storage cimport Storage

@cython.locals(storage=Storage)
cpdef _export(TensorFields t, stream, max_version, dl_device, copy, api)
cpdef _new_capsule(t, storage, device, bint versioned, bint copied)
cpdef tuple _new_managed(TensorFields t, Storage storage, device, bint versioned, bint copied)
