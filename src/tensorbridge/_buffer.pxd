# C declarations for the compiled build, read by Cython beside _buffer.py: `frombuffer` calls its
# own steps as C functions (each stays callable from Python).
cpdef _acquire(obj, api)
cpdef _element_count(length, count, offset, itemsize)
