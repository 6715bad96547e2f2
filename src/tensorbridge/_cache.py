"""Bounded lookup tables for the per-type and per-address decisions the hot paths remember.

`from_dlpack` remembers each producer type and deleter address, `asarray` the protocol of each
type. What those tables are keyed by comes from outside (a producer may make types or deleters on
the fly), so each table is bounded: emptied when full, then refilled by the calls that follow.
"""

from __future__ import annotations

from typing import Final, TypeVar

__all__ = ["remember"]

_K = TypeVar("_K")
_V = TypeVar("_V")

REMEMBER_MAX: Final = 256  # entries per table


def remember(table: dict[_K, _V], key: _K, value: _V) -> _V:
    """Store ``value`` in a bounded lookup table (emptied when full) and return it."""
    if len(table) >= REMEMBER_MAX:
        table.clear()
    table[key] = value
    return value
