"""How the doctor words and attributes a failure: one-line texts, and whose code raised."""

from __future__ import annotations

import os
import traceback
import warnings
from pathlib import Path
from typing import Final

import tensorbridge as tb

__all__ = ["PACKAGE_DIR", "Unavailable", "one_line", "raised_in_tensorbridge", "warning_text"]

PACKAGE_DIR: Final = str(Path(tb.__file__).resolve().parent)
# The doctor's own code and its test tooling raise nothing tensorbridge is to blame for.
_OWN: Final = (str(Path(__file__).resolve().parent) + os.sep, str(Path(PACKAGE_DIR, "testing.py")))


class Unavailable(Exception):
    """This side cannot make this dtype/device, or the two sides share no protocol."""


def one_line(exc: BaseException) -> str:
    """``"TypeError: first line of the message"`` (the type alone for an empty message)."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def warning_text(w: warnings.WarningMessage) -> str:
    """A warning's category and first sentence."""
    first = str(w.message).strip().split(". ")[0].splitlines()[0]
    return f"{w.category.__name__}: {first}"


def raised_in_tensorbridge(exc: BaseException) -> bool:
    """True when the innermost frame of the traceback is tensorbridge code (not the doctor's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    path = Path(frames[-1].filename)
    if not path.is_absolute() and "tensorbridge" in path.parts:
        # A compiled module's frames name its source as the build saw it
        # ("src/tensorbridge/_dlpack_export.py"): the file of that name in the package.
        parts = path.parts
        last = len(parts) - 1 - parts[::-1].index("tensorbridge")
        path = Path(PACKAGE_DIR, *parts[last + 1 :])
    filename = str(path.resolve())
    return filename.startswith(PACKAGE_DIR) and not filename.startswith(_OWN)
