"""`TensorFields`: the fields every tensor has, and nothing else.

A tensor is ``(storage, offset, shape, strides, dtype)`` plus ``requires_grad``; `_tensor.Tensor`
derives from this class and adds every behaviour. The class sits at the bottom of the package, below
the modules that build and export tensors, so that the compiled build can read and write the fields
as C struct members from each of them (``_fields.pxd`` makes it an extension type; `Tensor` stays a
Python class on top of it, with the special methods a Python class gets, ``__buffer__`` among them).
In pure Python the fields are slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._dtype import DType
    from ._layout import Size
    from ._storage import Storage

__all__ = ["TensorFields"]


class TensorFields:
    """The fields of a `Tensor`, its only base. Only `_tensor._construct` sets them all."""

    __slots__ = (
        "__weakref__",
        "_dtype",
        "_offset",
        "_requires_grad",
        "_shape",
        "_storage",
        "_strides",
    )

    _storage: Storage
    _offset: int
    _shape: Size
    _strides: tuple[int, ...]
    _dtype: DType
    _requires_grad: bool
