# C declarations for the compiled build, read by Cython beside _buffer.py: `frombuffer` calls its
# own steps as C functions, as does `asarray` for a described buffer (each stays callable from Python),
# and the bounds check and the tensor constructor of the modules below as C functions too.
from tensorbridge._storage cimport locate
from tensorbridge._tensor cimport _construct

cpdef _acquire(obj, api)
cpdef _element_count(length, count, offset, itemsize)
cpdef _described(obj, api, numpy=*)
cpdef tuple _odd_shape(obj, ndim, shape, count, api)
cpdef tuple _element_strides(shape, byte_strides, itemsize, api)
