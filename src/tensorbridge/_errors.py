"""The exception classes tensorbridge defines, and how error messages show the values they got.

Every exception a caller can see is either a built-in one or a class defined here and exported from
``tensorbridge`` under the same name, so that tracebacks and ``except`` clauses name public classes.
"""

from __future__ import annotations

from typing import Final

__all__ = ["NotDLPackError", "short_repr"]


class NotDLPackError(TypeError, AttributeError):
    """`tensorbridge.from_dlpack` got neither a DLPack producer nor a DLPack capsule.

    A `TypeError` by meaning (an argument of the wrong type), and an `AttributeError`, which the
    array API standard specifies for an object without ``__dlpack__``: ``except TypeError`` and
    ``except AttributeError`` both catch it.

    Example:
        >>> import tensorbridge as tb
        >>> try:
        ...     tb.from_dlpack([1, 2])
        ... except tb.NotDLPackError as exc:
        ...     print(type(exc).__name__, isinstance(exc, TypeError))
        NotDLPackError True
    """

    __module__ = "tensorbridge"


# Longest rendering of a value inside an error message.
_REPR_LIMIT: Final = 80


def short_repr(value: object, limit: int = _REPR_LIMIT) -> str:
    """``repr(value)`` on one line and at most ``limit`` characters, for error messages.

    Error messages stay one line however the caller's object prints (a pyarrow ``ChunkedArray`` or
    a large list prints over many lines): runs of whitespace become one space, and a long text is
    cut with ``...``. A ``__repr__`` that raises is not allowed to replace the error being built.
    """
    try:
        text = repr(value)
    except Exception:  # the message must still be raised
        text = f"<{type(value).__name__} object>"
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
