"""tensorbridge: zero-copy tensor interchange for Python.

A `Tensor` is a strided view of memory that someone else may own. tensorbridge imports and exports such
views through DLPack (versioned and legacy capsules), the buffer protocol, ``__array_interface__``,
``__cuda_array_interface__`` and Arrow, without copying, and with the safety checks PyTorch and NumPy lack.

Errors are built-in exceptions, chosen by meaning, plus two classes of tensorbridge's own:
`NotDLPackError` (a `TypeError` and an `AttributeError`), raised by `from_dlpack` for an object that
is neither a DLPack producer nor a capsule, and `ValuesRefused` (a `BufferError`), for values no
tensor can hold (an Arrow array with nulls), whichever protocol carries them.

    >>> import tensorbridge as tb
    >>> t = tb.arange(4)
    >>> t2 = tb.from_dlpack(t); t2[:2] = -1
    >>> t
    tensor([-1, -1,  2,  3])
"""

from __future__ import annotations

# ruff: noqa: E402  (each import is followed by the names it adds to __all__)

__version__ = "0.1.0"
__all__ = ["__version__"]

# First: TENSORBRIDGE_NO_EXTENSIONS, or a subinterpreter, routes every later import to the .py files.
from . import _build

if _build.source_reason() is not None:
    _build.route_to_source(__path__)

from ._build import build_info

__all__ += ["build_info"]

from ._dtype import *  # noqa: F403  (dtype constants and PyTorch's aliases)
from ._dtype import DType as dtype
from ._dtype import __all__ as _dtype_all

__all__ += [*_dtype_all, "dtype"]  # noqa: PLE0604  (_dtype.__all__ holds strings only)

from ._device import Device, DLDeviceType, device

__all__ += ["DLDeviceType", "Device", "device"]

from ._layout import Size
from ._tensor import Tensor, equal

__all__ += ["Size", "Tensor", "equal"]

from ._creation import (
    arange,
    empty,
    empty_like,
    full,
    full_like,
    ones,
    ones_like,
    zeros,
    zeros_like,
)

__all__ += [
    "arange",
    "empty",
    "empty_like",
    "full",
    "full_like",
    "ones",
    "ones_like",
    "zeros",
    "zeros_like",
]

from ._format import get_printoptions, printoptions, set_printoptions

__all__ += ["get_printoptions", "printoptions", "set_printoptions"]

from ._dlpack import from_dlpack, to_dlpack
from ._errors import NotDLPackError, ValuesRefused

__all__ += ["NotDLPackError", "ValuesRefused", "from_dlpack", "to_dlpack"]

from ._buffer import frombuffer
from ._file import from_file

__all__ += ["from_file", "frombuffer"]

from ._npy import load_npy, save_npy

__all__ += ["load_npy", "save_npy"]

from ._convert import as_tensor, asarray, from_numpy, from_pointer, tensor, to_torch

__all__ += ["as_tensor", "asarray", "from_numpy", "from_pointer", "tensor", "to_torch"]

from ._shareable import from_shareable, to_shareable

__all__ += ["from_shareable", "to_shareable"]

from . import utils

__all__ += ["utils"]
