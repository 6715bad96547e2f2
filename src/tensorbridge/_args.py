"""Argument parsing shared by every entry point: ints, bools, the ``copy`` flag, the grad messages.

A base module: it imports nothing of the package but `_errors`, so every floor above may use it.
"""

from __future__ import annotations

import operator
from typing import Any

from ._errors import short_repr

__all__ = [
    "GRAD_MSG",
    "GRAD_MSG_CREATE",
    "GRAD_MSG_EXPORT",
    "GRAD_MSG_METHOD",
    "as_bool",
    "as_copy",
    "as_int",
]

# PyTorch words this error three ways, by entry point; each is kept verbatim.
GRAD_MSG = "only Tensors of floating point and complex dtype can require gradients"  # t.requires_grad = True
GRAD_MSG_METHOD = "only Tensors of floating point dtype can require gradients"  # t.requires_grad_()
GRAD_MSG_CREATE = (
    "Only Tensors of floating point and complex dtype can require gradients"  # tensor(...)
)
# PyTorch's words when a tensor that requires gradients is handed to DLPack.
GRAD_MSG_EXPORT = "Can't export tensors that require gradient, use tensor.detach()"


def as_int(value: object, api: str, what: str, *, argument: bool = False) -> int:
    """An int argument: ints and ``__index__`` objects, not bool.

    Args:
        value: what the caller passed.
        api: the public function's name, for the message.
        what: what the value is (``"dim"``, ``"each size"``), or with ``argument`` the argument's name.
        argument: word the error as PyTorch's argument parser does (``argument 'count' must be int,
            not float``), for arguments PyTorch parses that way.

    Raises:
        TypeError: ``value`` is a bool or has no ``__index__``.
    """
    if type(value) is int:  # the common case, without the slower protocol check
        return value
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        if argument:
            msg = (
                f"{api}(): argument '{what}' must be int, not {type(value).__name__}; "
                f"got {value!r}."
            )
        else:
            msg = f"{api}(): {what} must be an int; got {value!r} ({type(value).__name__})."
        raise TypeError(msg)
    return operator.index(value)  # type: ignore[arg-type]


def as_bool(value: object, api: str, name: str) -> bool:
    """A bool argument, as PyTorch's parser takes it: exactly True or False."""
    if type(value) is not bool:
        msg = f"{api}(): argument '{name}' must be bool, not {type(value).__name__}; got {value!r}."
        raise TypeError(msg)
    return value is True


def as_copy(copy: Any, api: str) -> bool | None:
    """The array API's ``copy`` argument (None, True or False; also `asarray`'s)."""
    if copy is None or isinstance(copy, bool):
        return copy
    msg = f"{api}(): copy must be None, True or False; got {short_repr(copy)} ({type(copy).__name__})."
    raise TypeError(msg)
