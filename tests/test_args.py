"""Argument parsing: the one int, bool and copy-flag rule every entry point shares."""

from __future__ import annotations

import re

import pytest

import tensorbridge as tb
from tensorbridge import _args


class _Index:
    """An int-like object: PyTorch's parser takes anything with ``__index__``."""

    def __index__(self) -> int:
        return 7


def test_as_int_takes_ints_and_index_objects_and_refuses_bool_and_float() -> None:
    """as_int accepts int and __index__ objects; bool and float raise TypeError in both wordings."""
    assert _args.as_int(3, "f", "dim") == 3
    assert _args.as_int(_Index(), "f", "dim") == 7
    with pytest.raises(TypeError, match=re.escape("f(): dim must be an int; got True (bool).")):
        _args.as_int(True, "f", "dim")
    with pytest.raises(
        TypeError, match=re.escape("f(): argument 'count' must be int, not float; got 1.5.")
    ):
        _args.as_int(1.5, "f", "count", argument=True)


def test_as_bool_takes_exactly_true_or_false() -> None:
    """as_bool accepts only the two bools; 1 raises PyTorch's parser TypeError."""
    assert _args.as_bool(True, "f", "flag") is True
    assert _args.as_bool(False, "f", "flag") is False
    with pytest.raises(TypeError, match=re.escape("f(): argument 'flag' must be bool, not int")):
        _args.as_bool(1, "f", "flag")


def test_one_copy_flag_rule_for_from_dlpack_and_asarray() -> None:
    """from_dlpack and asarray refuse the same non-bool copy value with the same message."""
    t = tb.zeros(2)
    for api, call in (("from_dlpack", tb.from_dlpack), ("asarray", tb.asarray)):
        with pytest.raises(
            TypeError, match=re.escape(f"{api}(): copy must be None, True or False; got 1 (int).")
        ):
            call(t, copy=1)  # type: ignore[arg-type]
    assert _args.as_copy(None, "f") is None
