"""The native layer: the calls that touch C on every import's and export's path, from one of two twins.

This is the one place where the build is chosen. The compiled twin, `_native_c` (a ``.pyx`` over
``include/dlpack/dlpack.h``), makes the calls directly; the pure-Python twin, `_native_py`, makes
them through ctypes and `struct`. Both offer exactly the names below, with the same signatures,
results and errors (tests/test_native.py holds them to it). `_native_c` is taken whenever it
imports: a non-editable install builds it, and ``TENSORBRIDGE_NO_EXTENSIONS`` (which routes every
import of the package to its ``.py`` files, and `_native_c` has none) or a build without it leaves
`_native_py`. setup.py ships no compiled module without `_native_c`, so the two never mix.

What the layer offers:

* the capsule calls (`capsule_new`, `capsule_pointer`, `capsule_is_valid`, `capsule_set_name`);
* a held ``Py_buffer`` that releases itself (`acquire_buffer`) and its layout in one call
  (`describe_buffer`);
* DLPack managed structs: one written with its shape and strides into one block (`new_managed`),
  a producer's read with its shape and strides (`read_versioned`, `read_dims`);
* calls into C: a DLPack deleter (`VoidFunction`), an exchange API's import function
  (`ManagedFromPy`);
* callbacks from C: `void_callback` (every ``void f(void *)`` tensorbridge hands out), and the two
  capsule destructors that keep a pending exception (`dlpack_capsule_destructor`,
  `guarded_destructor_address`), which only C can write: None from `_native_py`;
* allocation for ``Tensor._new``: `new_object` (``cls.__new__(cls)``) and `tuple_maker` (a `Size`
  from a tuple).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Final

__all__ = [
    "COMPILED",
    "NAMES",
    "ManagedFromPy",
    "VoidFunction",
    "acquire_buffer",
    "capsule_is_valid",
    "capsule_new",
    "capsule_pointer",
    "capsule_set_name",
    "describe_buffer",
    "dlpack_capsule_destructor",
    "guarded_destructor_address",
    "new_managed",
    "new_object",
    "read_dims",
    "read_versioned",
    "tuple_maker",
    "twin",
    "void_callback",
]

# The native layer's names: both twins define each of them.
NAMES: Final = tuple(name for name in __all__ if name not in ("COMPILED", "NAMES", "twin"))


def _choose() -> ModuleType:
    try:
        from . import _native_c
    except ImportError:
        from . import _native_py

        return _native_py
    return _native_c


twin: Final = _choose()
COMPILED: Final = twin.__name__.endswith("_native_c")

ManagedFromPy: Final[Any] = twin.ManagedFromPy
VoidFunction: Final[Any] = twin.VoidFunction
acquire_buffer: Final[Any] = twin.acquire_buffer
capsule_is_valid: Final[Any] = twin.capsule_is_valid
capsule_new: Final[Any] = twin.capsule_new
capsule_pointer: Final[Any] = twin.capsule_pointer
capsule_set_name: Final[Any] = twin.capsule_set_name
describe_buffer: Final[Any] = twin.describe_buffer
dlpack_capsule_destructor: Final[Any] = twin.dlpack_capsule_destructor
guarded_destructor_address: Final[Any] = twin.guarded_destructor_address
new_managed: Final[Any] = twin.new_managed
new_object: Final[Any] = twin.new_object
read_dims: Final[Any] = twin.read_dims
read_versioned: Final[Any] = twin.read_versioned
tuple_maker: Final[Any] = twin.tuple_maker
void_callback: Final[Any] = twin.void_callback
