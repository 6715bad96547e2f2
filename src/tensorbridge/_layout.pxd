# C declarations for the compiled build, read by Cython beside _layout.py: `extent`, on the path of
# every import and view, loops with a C index.
cimport cython

@cython.locals(i=Py_ssize_t)
cpdef extent(offset, shape, strides)
