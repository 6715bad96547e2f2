"""The one constructor, `Tensor._new`, and the allocation helpers it uses, in either build.

Compiled, a tensor's fields are C struct members of `TensorFields` (an extension type), written
directly, and the native layer's `new_object` / `tuple_maker` allocate through C slots: the
references they take and drop are checked here by counting them, in both twins.
"""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

import tensorbridge as tb
from tensorbridge._fields import TensorFields
from tensorbridge._layout import Size
from tensorbridge._storage import allocate
from tensorbridge._tensor import Tensor

from .conftest import native_twins


def test_direct_construction_is_refused_with_any_arguments():
    for args, kwargs in [((), {}), ((1, 2), {}), ((), {"data": [1]})]:
        with pytest.raises(TypeError, match=r"Tensor\(\) cannot be constructed directly"):
            Tensor(*args, **kwargs)


def test_new_sets_every_field_and_returns_a_tensor():
    storage = allocate(24)
    t = Tensor._new(storage, 1, [2, 2], (2, 1), tb.int32)
    assert type(t) is Tensor and isinstance(t, TensorFields)
    assert t._storage is storage and t._offset == 1 and t._dtype is tb.int32
    assert type(t.shape) is Size and t.shape == (2, 2)
    assert type(t.stride()) is tuple and t.stride() == (2, 1)
    assert t.requires_grad is False
    with pytest.raises(ValueError, match="out of bounds"):  # an unchecked layout is checked
        Tensor._new(storage, 4, (2, 2), (2, 1), tb.int32)


def test_new_builds_instances_of_a_python_subclass():
    class Sub(Tensor):
        __slots__ = ()

        def twice(self) -> int:
            return 2 * self.numel()

    t = Sub._new(allocate(8), 0, (2,), (1,), tb.float32)
    assert type(t) is Sub and t.twice() == 4 and t.tolist() == [0.0, 0.0]


def test_a_tensor_holds_its_fields_exactly_while_it_lives():
    storage = allocate(16)
    shape, strides = (4,), (1,)
    counts = [sys.getrefcount(x) for x in (storage, shape, strides, tb.float32)]
    tensors = [Tensor._new(storage, 0, shape, strides, tb.float32) for _ in range(100)]
    probe = weakref.ref(tensors[0])
    del tensors
    gc.collect()
    assert probe() is None
    assert [sys.getrefcount(x) for x in (storage, shape, strides, tb.float32)] == counts


@pytest.mark.parametrize("twin", native_twins(), ids=lambda m: m.__name__.rpartition(".")[2])
def test_tuple_maker_makes_tuple_new_of_the_subclass(twin):
    make = twin.tuple_maker(Size)
    items = (object(), [3], 2**70)  # no cached or interned object: their counts are ours
    before = [sys.getrefcount(x) for x in items]
    made = [make(items) for _ in range(50)]
    assert all(type(m) is Size and m == items and m is not items for m in made)
    assert [sys.getrefcount(x) for x in items] == [b + 50 for b in before]
    del made
    assert [sys.getrefcount(x) for x in items] == before
    assert make(()) == () and type(make(())) is Size
    assert repr(make((2, 3))) == "tensorbridge.Size([2, 3])"


class _OwnNew(tuple):
    __slots__ = ()

    def __new__(cls, items):  # a class of its own construction: not one tuple_maker may bypass
        return super().__new__(cls, items)


@pytest.mark.parametrize("twin", native_twins(), ids=lambda m: m.__name__.rpartition(".")[2])
@pytest.mark.parametrize("cls", [list, _OwnNew])
def test_tuple_maker_refuses_a_class_that_is_not_a_plain_tuple(twin, cls):
    with pytest.raises(TypeError, match="tuple_maker"):
        twin.tuple_maker(cls)


@pytest.mark.parametrize("twin", native_twins(), ids=lambda m: m.__name__.rpartition(".")[2])
def test_new_object_runs_no_init(twin):
    class Noisy:
        def __init__(self) -> None:
            raise AssertionError("__init__ ran")

    assert type(twin.new_object(Noisy)) is Noisy
    # `_native_py`'s allocator is object's, which makes a Tensor only where `TensorFields` is a
    # Python class: the build never pairs it with a compiled `_fields` (setup.py).
    if twin.__name__.endswith("_native_c") or "_fields" not in tb.build_info().modules:
        assert type(twin.new_object(Tensor)) is Tensor  # Tensor's __init__ refuses; not run
