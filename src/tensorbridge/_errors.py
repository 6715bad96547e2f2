"""The exception classes tensorbridge defines, and how error messages show the values they got.

Every exception a caller can see is either a built-in one or a class defined here and exported from
``tensorbridge`` under the same name, so that tracebacks and ``except`` clauses name public classes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from types import FrameType
from typing import Final

__all__ = ["NotDLPackError", "short_repr", "warn_user"]


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


# Frames whose code lies under this directory are tensorbridge's own (subpackages included).
_PACKAGE_PREFIX: Final = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn with ``message``, attributed to the first calling frame outside tensorbridge.

    PyTorch attributes its warnings to the user's line; a fixed ``stacklevel`` cannot, because the
    number of tensorbridge frames above the user's code depends on the call path and on the build
    (compiled functions have no frames at all). So the interpreter's real frames are counted from
    the innermost one (which ``warnings.warn`` calls level 1 in either build) past every one whose
    file lies in the package, and ``warnings.warn`` is called with that level: the warning is the
    one Python itself issues for that frame (its file, line, module name, ``__warningregistry__``,
    filters, "once" and "default"), wherever the frame's code lives: a file, a zip archive, the
    interactive prompt, ``python -c``, standard input, ``python -m``, or a string run by ``exec``
    with any globals (no ``__name__``, a ``__loader__`` that cannot give source). Nothing asks the
    frame's loader for its source, which such loaders refuse. With no frame outside the package
    (a thread that runs tensorbridge alone), the innermost frame is named; with no Python frame at
    all (compiled code in a thread started from C), it is named ``sys``, as Python names it.
    """
    # The walk starts here, in the function that calls warnings.warn (a helper would add a frame
    # in one build only): sys._getframe() is the frame warnings.warn counts as level 1.
    frame: FrameType | None
    try:
        frame = sys._getframe()
    except ValueError:  # no Python frame at all: compiled code in a thread started from C
        frame = None
        named = False
    else:
        named = True
    level = 1
    while frame is not None and _has_code(frame) and _in_package(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    if not named or (frame is not None and not _has_code(frame)):
        # No frame to name (3.15 gives compiled code in a thread started from C a frame with no
        # code, which `warnings.warn` cannot read either): named as Python names a frameless caller.
        warnings.warn_explicit(message, category, "sys", 1, "sys")
        return
    warnings.warn(message, category, stacklevel=1 if frame is None else level)


def _has_code(frame: FrameType) -> bool:
    return getattr(frame, "f_code", None) is not None


def _in_package(filename: str) -> bool:
    """True for a code file of tensorbridge (not a pseudo-file such as ``<string>``)."""
    if filename.startswith("<"):
        return False
    return os.path.abspath(filename).startswith(_PACKAGE_PREFIX)


def release_frames(exc: BaseException) -> None:
    """Let go of what tensorbridge's own frames in ``exc``'s tracebacks still hold.

    A refused import must release what it acquired (a held buffer export, a producer's capsule)
    before its exception leaves tensorbridge, not when the exception dies: a traceback keeps its
    frames, and the frames their locals, so an exporter would stay locked (a bytearray not
    resizable, a memoryview not releasable) and a producer's memory pinned for as long as the
    caller keeps the exception. Every import door calls this in its ``except`` clause, where no
    exception is pending, so that the destructors it sets off run cleanly. It clears the locals
    of every finished frame of the package in the tracebacks of ``exc`` and of the exceptions it
    was raised from (``__cause__``, ``__context__``); the traceback's lines stay as they were,
    and the caller's frames and the door's own, still running, are left alone. The compiled
    build has no such frames: its doors drop what they hold themselves.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if _in_package(frame.f_code.co_filename):
                # RuntimeError for a frame still running: the door's own, or its callers'
                with contextlib.suppress(RuntimeError):
                    frame.clear()
            tb = tb.tb_next
        pending += (current.__cause__, current.__context__)
