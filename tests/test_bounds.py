"""The one bounds check every import path shares (`_storage.locate`)."""

from __future__ import annotations

import pytest

import tensorbridge as tb


def test_from_pointer_refuses_a_layout_that_reaches_address_zero():
    """A negative stride from pointer 8 that reaches byte 0 is refused: address 0 is never memory."""
    with pytest.raises(ValueError, match="outside the address space"):
        tb.from_pointer(8, (2,), tb.uint8, strides=(-8,), owner=None)


def test_from_pointer_accepts_a_negative_stride_that_stays_above_zero():
    """The same layout one byte higher (lowest byte at address 1) is accepted, and never read."""
    t = tb.from_pointer(9, (2,), tb.uint8, strides=(-8,), device="cuda")
    assert t.data_ptr() == 9
    assert t.stride() == (-8,)
