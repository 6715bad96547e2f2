"""The per-type tables keep no type alive.

`from_dlpack` remembers what it learnt of each producer type (and of its C exchange API), `asarray`
the protocol each type takes. A class made on the fly, and whatever its methods reach, must go as
soon as nothing else holds it: a class whose ``__dlpack__`` exports a tensor over a bytearray held
that bytearray locked (not resizable) for as long as the table held the class.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from tests.conftest import needs_mortal_classes

import tensorbridge as tb
from tensorbridge import _cache, _convert, _dlpack, _dlpack_c


def _producer_class_over(buf: bytearray) -> type:
    """A class made on the fly whose methods reach a tensor over ``buf``."""
    t = tb.frombuffer(buf, dtype=tb.uint8)

    class Made:
        def __dlpack__(self, **kwargs):
            return t.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return t.__dlpack_device__()

    return Made


def _resizable(buf: bytearray) -> bool:
    try:
        buf.append(0)
    except BufferError:
        return False
    buf.pop()
    return True


@needs_mortal_classes
@pytest.mark.parametrize("door", ["from_dlpack", "asarray", "utils.dlpack.from_dlpack"])
def test_a_producer_class_made_on_the_fly_is_not_kept(door):
    convert = {
        "from_dlpack": tb.from_dlpack,
        "asarray": tb.asarray,
        "utils.dlpack.from_dlpack": tb.utils.dlpack.from_dlpack,
    }[door]
    locked = 0
    for _ in range(50):
        buf = bytearray(range(8))
        cls = _producer_class_over(buf)
        assert convert(cls()).tolist() == list(range(8))
        alive = weakref.ref(cls)
        del cls
        gc.collect()
        locked += alive() is not None or not _resizable(buf)
    assert locked == 0


@needs_mortal_classes
def test_each_table_forgets_a_dead_type_and_keeps_a_live_one():
    """The entry goes with its type; one for a type still alive stays (the decision is reused)."""
    buf = bytearray(4)
    cls = _producer_class_over(buf)
    tb.from_dlpack(cls())
    tb.asarray(cls())
    key = id(cls)
    for table in (_dlpack._PRODUCERS, _dlpack_c._EXCHANGE_APIS, _convert._PATHS_BY_TYPE):
        assert key in table
    del cls
    gc.collect()
    for table in (_dlpack._PRODUCERS, _dlpack_c._EXCHANGE_APIS, _convert._PATHS_BY_TYPE):
        assert key not in table
        assert key not in table.watches


@needs_mortal_classes
def test_a_table_emptied_when_full_still_forgets_its_types():
    """Emptying drops the watches too; a type remembered again after that is watched again."""
    table: _cache.TypeTable[int] = _cache.TypeTable()
    keep = [type(f"T{i}", (), {}) for i in range(_cache.REMEMBER_MAX)]
    for i, cls in enumerate(keep):
        _cache.remember_type(table, cls, i)
    assert len(table) == _cache.REMEMBER_MAX
    late = type("Late", (), {})
    _cache.remember_type(table, late, -1)
    assert dict(table) == {id(late): -1} and set(table.watches) == {id(late)}
    _cache.remember_type(table, keep[0], 0)
    del late
    gc.collect()
    assert dict(table) == {id(keep[0]): 0}
    del keep
    gc.collect()
    assert dict(table) == {} and table.watches == {}


def test_seeded_builtin_types_answer_without_a_watch():
    assert _convert._PATHS_BY_TYPE.get(list) == ("sequence", None)
    assert list not in _convert._PATHS_BY_TYPE.watches


def test_a_static_type_is_its_own_key_and_a_class_its_id():
    """A C type is never freed, so it is looked up by identity and needs no watch; a class is
    keyed by its id and watched."""
    np = pytest.importorskip("numpy")
    assert _cache.type_key(np.ndarray) is np.ndarray and _cache.type_key(bytes) is bytes
    made = type("Made", (), {})
    assert _cache.type_key(made) == id(made)
    table: _cache.TypeTable[str] = _cache.TypeTable()
    _cache.remember_type(table, np.ndarray, "static")
    _cache.remember_type(table, made, "class")
    assert table.get(np.ndarray) == "static" and table.get(id(made)) == "class"
    assert set(table.watches) == {id(made)}


def test_seeds_survive_a_table_emptied_when_full():
    """A table filled by live types is emptied; its seeded built-ins stay, unwatched."""
    table: _cache.TypeTable[str] = _cache.TypeTable({list: "seeded", tuple: "seeded"})
    keep = [type(f"T{i}", (), {}) for i in range(_cache.REMEMBER_MAX + 1)]
    for cls in keep:
        _cache.remember_type(table, cls, "learnt")
    assert table[list] == table[tuple] == "seeded"
    assert len(table) == 3 and set(table.watches) == {id(keep[-1])}
    table.clear()
    assert dict(table) == {list: "seeded", tuple: "seeded"} and table.watches == {}
