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
from typing import Any, Final

from ._dtype import BY_ML_DTYPES

__all__ = [
    "NotDLPackError",
    "ValuesRefused",
    "as_called",
    "caller_module",
    "numpy_fix",
    "refusal_fix",
    "release_frames",
    "short_repr",
    "warn_user",
]


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


class ValuesRefused(BufferError):
    """The values themselves cannot be a tensor (an Arrow array with nulls: tensors have no
    validity bitmap), whatever protocol carries them.

    A `BufferError`, as every refusal of a protocol's memory is. `asarray` raises it rather than
    read the object through another protocol it offers, which could only change the values (a
    pyarrow array's ``__array__`` turns nulls into NaN and integers into floats).
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


# The names tensorbridge's inner steps give their refusals, which `as_called` renames to the
# function the user called: `from_dlpack` (asarray's DLPack paths) and `Tensor.to` (a device or
# dtype asked of asarray).
_INNER_NAMES: Final = ("from_dlpack(): ", "to(): ")


def as_called(exc: BaseException, api: str, value: object) -> BaseException:
    """``exc``, a lower-level refusal, in the words of ``api``, the function the user called.

    The one rule for a refusal that reaches the user through another function than the one that
    raised it:

    * tensorbridge's own words naming an inner step (``from_dlpack(): ...``, ``to(): ...``): the
      same exception, its message naming ``api`` instead;
    * Python's or another library's words, for a refusal `refusal_fix` can explain (a released
      memoryview, a tensor that requires grad, a NumPy dtype tensorbridge does not hold): a new
      exception of the nearest built-in type, ``"<api>(): <their words>; got <value>. <fix>"``,
      caused by ``exc``. Their words stay a substring, so what matched them still does;
    * anything else: ``exc`` itself, unchanged (a producer's own error passes through).

    Only error paths call this; callers raise the result ``from`` its ``__cause__``.
    """
    message = exc.args[0] if len(exc.args) == 1 else None
    if isinstance(message, str):
        for inner in _INNER_NAMES:
            if message.startswith(inner):
                if inner != f"{api}(): ":
                    exc.args = (f"{api}(): {message[len(inner) :]}",)
                return exc
        if message.startswith(f"{api}(): "):
            return exc
    fix = refusal_fix(value, exc)
    if fix is None:
        return exc
    text = " ".join(str(message if isinstance(message, str) else exc).split()).rstrip(".")
    builtin = next(cls for cls in type(exc).__mro__ if cls.__module__ == "builtins")
    called = builtin(f"{api}(): {text}; got {short_repr(value)}. {fix}")
    called.__cause__ = exc
    return called


def _attribute(value: object, name: str) -> Any:
    """``getattr(value, name, None)``, where any failure of the object's own is None: an error
    message being built must not be replaced by another."""
    try:
        return getattr(value, name, None)
    except Exception:
        return None


def refusal_fix(value: object, exc: BaseException) -> str | None:
    """How to get past ``exc``, which Python or a producer raised for ``value``; None when the
    refusal is not one tensorbridge can explain.

    Explained: a released ``memoryview``, a tensor that requires grad (PyTorch refuses to export
    it), and a NumPy array whose dtype is no number or bool in native byte order (`numpy_fix`).
    Called on error paths only.
    """
    try:
        text = str(exc)
    except Exception:  # an exception that cannot print is explained by nothing here
        return None
    if type(value) is memoryview and "released" in text:
        return (
            "The memoryview was released (memoryview.release()), so it reaches no memory: pass "
            "one that is still open, or the object it viewed."
        )
    if not isinstance(exc, BufferError):
        return None  # what follows are the producers' DLPack refusals
    if "grad" in text and _attribute(value, "requires_grad") is True:
        return (
            "Pass x.detach(), which shares the same memory without the autograd graph (add "
            "requires_grad=True to mark the result)."
        )
    dtype = _attribute(value, "dtype")
    if type(dtype).__module__.partition(".")[0] in _NUMPY_DTYPE_MODULES:
        return numpy_fix(dtype)
    return None


# The modules NumPy's dtype classes live in: NumPy's own, and ml_dtypes' for its types.
_NUMPY_DTYPE_MODULES: Final = frozenset({"numpy", "ml_dtypes"})


# What a NumPy dtype kind that is no number holds, and how to get numbers from it.
_NUMPY_KINDS: Final = {
    "U": ("text", "parse it into numbers first, e.g. x.astype(numpy.float64)"),
    "S": (
        "bytes",
        "view the raw bytes with x.view(numpy.uint8), or parse them, e.g. x.astype(numpy.float64)",
    ),
    "O": ("Python objects", "convert them to numbers first, e.g. x.astype(numpy.float64)"),
    "M": (
        "datetimes",
        "x.view(numpy.int64) shares the same memory as int64 counts of its unit "
        "since 1970-01-01 (NaT is the smallest int64)",
    ),
    "m": ("timedeltas", "x.view(numpy.int64) shares the same memory as int64 counts of its unit"),
    "V": ("raw or structured records", "view the raw bytes with x.view(numpy.uint8)"),
}


def numpy_fix(dtype: Any) -> str | None:
    """The fix for a NumPy dtype tensorbridge does not hold, naming it; None for one it holds
    (or may: ml_dtypes' types that tensorbridge has are its own)."""
    try:
        kind, name, native, itemsize = dtype.kind, dtype.str, dtype.isnative, dtype.itemsize
        names, module = dtype.names, dtype.type.__module__
    except Exception:  # not NumPy's dtype after all
        return None
    held = "which is all tensorbridge holds"
    if module == "ml_dtypes":
        if dtype.name in BY_ML_DTYPES:
            return None
        return (
            f"Its dtype {dtype.name} (ml_dtypes) has no tensorbridge equivalent: convert it, e.g. "
            f"x.astype(numpy.float32)."
        )
    if kind in _NUMPY_KINDS:
        what, fix = _NUMPY_KINDS[kind]
        if names:
            fix = f"take one field, e.g. x[{names[0]!r}] (a view of the same memory), or {fix}"
        return f"Its dtype {name!r} holds {what}, not numbers or bools, {held}: {fix}."
    if not native:
        swapped = dtype.newbyteorder("=").str
        return (
            f"Its dtype {name!r} is in non-native byte order, and tensorbridge holds numbers and "
            f"bools in native order only: convert with x.astype({swapped!r}) or "
            f"x.byteswap().view(x.dtype.newbyteorder()) (each a copy in native order)."
        )
    if kind in "fc" and itemsize > (8 if kind == "f" else 16):
        wide = "float64" if kind == "f" else "complex128"
        return (
            f"Its dtype {name!r} (long double) has no IEEE layout DLPack can name, and "
            f"tensorbridge holds IEEE floats: convert with x.astype(numpy.{wide})."
        )
    return None


def caller_module() -> str:
    """The ``__name__`` of the module whose code called into tensorbridge: that of the first
    frame outside the package ('' when there is none, or it has no name). Error paths only: what
    a refusal suggests may depend on who asked (JAX asks ``__dlpack__`` for a legacy capsule)."""
    try:
        frame: FrameType | None = sys._getframe()
    except ValueError:  # no Python frame at all: compiled code in a thread started from C
        return ""
    while frame is not None and _has_code(frame) and _in_package(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None or not _has_code(frame):
        return ""
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else ""


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
