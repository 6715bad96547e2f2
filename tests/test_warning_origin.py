"""Warnings tensorbridge issues name the user's line, whichever build runs (compiled or source).

A compiled function has no frame, so a fixed ``stacklevel`` names a different line in each build:
the warnings are attributed to the first caller outside the package instead.
"""

from __future__ import annotations

import sys
import warnings

import pytest

import tensorbridge as tb
from tensorbridge._errors import warn_user

UINT8_TEXT = (
    "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead"
)


def _line() -> int:
    """The line of this function's caller."""
    return sys._getframe(1).f_lineno


@pytest.mark.parametrize("name", ["T", "mT"])
def test_zero_d_transpose_warning_names_the_line_that_read_it(name):
    """The 0-d ``T``/``mT`` deprecation warning names this file and the line reading the attribute."""
    s = tb.tensor(5)
    with pytest.warns(UserWarning, match=rf"Tensor\.{name} is deprecated on 0-D tensors") as rec:
        line, _ = _line(), getattr(s, name)
    assert [(w.filename, w.lineno) for w in rec] == [(__file__, line)]


def test_uint8_mask_warning_names_the_indexing_line():
    """PyTorch's uint8-mask warning names the line that indexes or assigns, for reads and writes."""
    x = tb.arange(6).reshape(2, 3)
    mask = tb.tensor([1, 0], dtype=tb.uint8)
    with pytest.warns(UserWarning, match=UINT8_TEXT) as rec:
        line, _ = _line(), x[mask]
    assert [(w.filename, w.lineno) for w in rec] == [(__file__, line)]
    with pytest.warns(UserWarning, match=UINT8_TEXT) as rec:
        x[mask], line = tb.tensor([7, 8, 9]), _line()
    assert [(w.filename, w.lineno) for w in rec] == [(__file__, line)]
    assert x.tolist() == [[7, 8, 9], [3, 4, 5]]


def test_warning_follows_the_filters_and_the_callers_registry():
    """The "default" action shows a warning once per calling line (the caller module's
    ``__warningregistry__``), and "error" raises it, as for ``warnings.warn``."""
    s = tb.tensor(5)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        for _ in range(3):
            _ = s.T
    assert len(rec) == 1 and rec[0].category is UserWarning
    assert rec[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match=r"Tensor\.mT is deprecated"):
            _ = s.mT


def test_warn_user_skips_only_package_frames():
    """Called directly from outside the package, the warning names the calling line itself."""
    with pytest.warns(DeprecationWarning, match="just so") as rec:
        line, _ = _line(), warn_user("just so", DeprecationWarning)
    assert [(w.filename, w.lineno, w.category) for w in rec] == [
        (__file__, line, DeprecationWarning)
    ]
