"""Bounded lookup tables for the per-type and per-address decisions the hot paths remember.

`from_dlpack` remembers each producer type and deleter address, `asarray` the protocol of each
type. What those tables are keyed by comes from outside (a producer may make types or deleters on
the fly), so each table is bounded: emptied when full, then refilled by the calls that follow.

A per-type table keeps no type alive (`TypeTable`): a class (a heap type, made by a class
statement, ``type()`` or a binding generator) is keyed by its ``id``, and a weak reference to it
removes the entry when it dies, before its ``id`` can be reused. A class made on the fly, and
whatever its methods reach (a tensor over a bytearray, which then cannot be resized), goes as soon
as nothing else holds it, whatever the table holds. A static type (a C type such as
``numpy.ndarray``, ``bytes`` or a Cython extension type) is never freed, so it is its own key:
looked up by identity, with no ``id`` int made and compared by value on every call.
"""

from __future__ import annotations

import functools
import weakref
from typing import Final, Generic, TypeVar

__all__ = ["TypeTable", "remember", "remember_type", "type_key"]

_K = TypeVar("_K")
_V = TypeVar("_V")

REMEMBER_MAX: Final = 256  # entries per table


def remember(table: dict[_K, _V], key: _K, value: _V) -> _V:
    """Store ``value`` in a bounded lookup table (emptied when full) and return it."""
    if len(table) >= REMEMBER_MAX:
        table.clear()
    table[key] = value
    return value


_HEAP_TYPE: Final = 1 << 9  # Py_TPFLAGS_HEAPTYPE


def type_key(cls: type) -> type | int:
    """The key of ``cls`` in a `TypeTable`: the type itself when it is static (never freed), else
    its ``id``."""
    return id(cls) if cls.__flags__ & _HEAP_TYPE else cls


class TypeTable(dict[type | int, _V], Generic[_V]):
    """A bounded table of per-type values, keyed by `type_key`, that holds no class.

    Look a type up with ``get(cls) or get(id(cls))`` (``get`` bound once: a dict's own, no Python
    call on the hot path; the first finds a static type, the second a class); store with
    `remember_type`. The caller holds an instance of ``cls`` while it looks up, so ``cls`` is alive,
    and an entry under its ``id`` can only be its own: a dead class's entry is removed by its weak
    reference's callback, which runs before the class's memory is freed.
    """

    __slots__ = ("seeds", "watches")

    def __init__(self, seed: dict[type, _V] | None = None) -> None:
        """A table; ``seed`` holds types that live as long as the interpreter (built-ins), whose
        entries need no watch and survive every `clear`."""
        self.seeds: dict[type | int, _V] = {
            type_key(cls): value for cls, value in (seed or {}).items()
        }
        super().__init__(self.seeds)
        self.watches: dict[int, weakref.ref[type]] = {}

    def forget(self, key: int, watch: weakref.ref[type]) -> None:
        """A watched type died: drop its entry (unless a newer watch under ``key`` replaced it)."""
        if self.watches.get(key) is watch:
            self.watches.pop(key, None)  # pop: a `clear` on another thread may have emptied both
            self.pop(key, None)

    def clear(self) -> None:
        """Empty the table of all but its seeds, and its watches with it (a dropped watch never
        calls back)."""
        super().clear()
        self.watches.clear()
        self.update(self.seeds)


def remember_type(table: TypeTable[_V], cls: type, value: _V) -> _V:
    """Store ``value`` for ``cls`` in a bounded `TypeTable` (emptied when full) and return it."""
    if len(table) >= REMEMBER_MAX + len(table.seeds):
        table.clear()
    key = type_key(cls)
    if type(key) is int:  # a class: watched, so that its entry goes with it
        table.watches[key] = weakref.ref(cls, functools.partial(table.forget, key))
    table[key] = value
    return value
