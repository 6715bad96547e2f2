# C declarations for the compiled build, read by Cython beside _dlpack_export.py: an export calls
# its own steps as C functions (each stays callable from Python).
cpdef _export(t, stream, max_version, dl_device, copy, api)
cpdef _new_capsule(t, storage, device, bint versioned, bint copied)
cpdef tuple _new_managed(t, storage, device, bint versioned, bint copied)
