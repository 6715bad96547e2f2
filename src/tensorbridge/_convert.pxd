# C declarations for the compiled build, read by Cython beside _convert.py: `asarray` calls its own
# dispatch and import steps as C functions (each stays callable from Python).
cpdef tuple _dispatch(obj)
cpdef tuple _import(path, obj, found, device, copy, dtype, api)
cpdef convert(obj, dtype, device, copy, requires_grad, api)
