"""from_pointer: tensors over raw memory owned by the caller (ctypes here, as a C library would do)."""

from __future__ import annotations

import ctypes
import gc
import weakref

import pytest

import tensorbridge as tb

FAKE_CUDA_PTR = 0x7F00_0000_0000


class Block:
    """Memory owned by a Python object, as a C library wrapper would own it."""

    def __init__(self, n: int, ctype: type = ctypes.c_int32):
        self.array = (ctype * n)(*range(n))
        self.ptr = ctypes.addressof(self.array)
        self.nbytes = ctypes.sizeof(self.array)


def test_contiguous_view_shares_memory():
    """A C-contiguous tensor over the block: same address, values, writes both ways."""
    block = Block(6)
    t = tb.from_pointer(block.ptr, (2, 3), tb.int32, owner=block, nbytes=block.nbytes)
    assert t.data_ptr() == block.ptr
    assert t.stride() == (3, 1)
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    t[1, 1] = -4
    assert block.array[4] == -4
    block.array[0] = 11
    assert t[0, 0].item() == 11


def test_owner_lives_as_long_as_any_view():
    """The owner is kept alive by every view and released after the last one dies."""
    block = Block(4)
    ref = weakref.ref(block)
    view = tb.from_pointer(block.ptr, 4, "int32", owner=block)[2:]
    del block
    gc.collect()
    assert ref() is not None
    assert view.tolist() == [2, 3]
    del view
    gc.collect()
    assert ref() is None


def test_negative_strides_count_elements_backwards():
    """Strides count elements; a negative one reads backwards from the pointer (rows reversed here)."""
    block = Block(6)
    t = tb.from_pointer(block.ptr + 4 * 4, (3, 2), tb.int32, strides=(-2, 1), owner=block)
    assert t.tolist() == [[4, 5], [2, 3], [0, 1]]
    assert t._storage.ptr == block.ptr  # the storage spans exactly the bytes the layout reaches
    assert t._storage.nbytes == block.nbytes


def test_nbytes_bounds_are_checked():
    """With nbytes, a layout reaching outside the memory is a ValueError."""
    block = Block(4)
    with pytest.raises(ValueError, match="outside the 16 bytes"):
        tb.from_pointer(block.ptr, 5, tb.int32, owner=block, nbytes=block.nbytes)
    with pytest.raises(ValueError, match=r"bytes \[-8, 4\) from the pointer, outside the 12 bytes"):
        tb.from_pointer(block.ptr + 4, (2,), tb.int32, strides=(-2,), owner=block, nbytes=12)


def test_nbytes_also_bounds_later_views():
    """as_strided on the result is checked against nbytes, not just the first layout."""
    block = Block(4)
    t = tb.from_pointer(block.ptr, 2, tb.int32, owner=block, nbytes=block.nbytes)
    assert t.as_strided((4,), (1,)).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="outside the storage"):
        t.as_strided((5,), (1,))


def test_readonly():
    """readonly=True makes writes raise and leaves the memory untouched."""
    block = Block(2)
    t = tb.from_pointer(block.ptr, 2, tb.int32, owner=block, readonly=True)
    assert t.is_readonly
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 5
    assert list(block.array) == [0, 1]


def test_null_pointer():
    """NULL with elements is refused; NULL with zero elements is an empty tensor."""
    with pytest.raises(ValueError, match="NULL"):
        tb.from_pointer(0, (2,), tb.float32)
    t = tb.from_pointer(0, (0, 5), tb.float32)
    assert tuple(t.shape) == (0, 5)
    assert t.tolist() == []


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"ptr": 1.5}, TypeError, "ptr must be an int"),
        ({"ptr": True}, TypeError, "ptr must be an int"),
        ({"ptr": -16}, ValueError, "non-negative address"),
        ({"shape": (2, -1)}, ValueError, "negative dimension"),
        ({"shape": "ab"}, TypeError, "size must be an int"),
        ({"dtype": "complex7"}, TypeError, "dtype"),
        ({"strides": (1,)}, ValueError, "1 strides for 2 dimensions"),
        ({"strides": (1.0, 1)}, TypeError, "stride"),
        ({"strides": 3}, TypeError, "strides must be a sequence"),
        ({"nbytes": -1}, ValueError, "nbytes must be non-negative"),
        ({"nbytes": 2.0}, TypeError, "nbytes"),
        ({"device": 1.5}, TypeError, "device"),
        ({"shape": (2**40, 2**40)}, ValueError, "more than a process can address"),
        ({"ptr": 2**64 - 8}, ValueError, "address space"),
        ({"strides": (2**62, 1)}, ValueError, "address space"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    """Each malformed argument is refused with the right exception and a message naming it."""
    args = {"ptr": 4096, "shape": (2, 2), "dtype": tb.int32, **kwargs}
    with pytest.raises(exc, match=match):
        tb.from_pointer(args.pop("ptr"), args.pop("shape"), args.pop("dtype"), **args)


def test_device_memory_is_carried_not_read():
    """A device pointer makes a tensor on that device; host access raises instead of reading."""
    t = tb.from_pointer(FAKE_CUDA_PTR, (2, 2), tb.float32, device="cuda:1")
    assert t.device == tb.device("cuda:1")
    assert t.data_ptr() == FAKE_CUDA_PTR
    with pytest.raises(BufferError, match="cannot be read"):
        t.tolist()


def test_device_pointer_access_in_subprocess(subprocess_run):
    """Host access to a bogus device pointer raises in every path; the interpreter survives."""
    proc = subprocess_run(f"""
        import tensorbridge as tb
        t = tb.from_pointer({FAKE_CUDA_PTR}, (3,), tb.int64, device="cuda")
        for op in (t.tolist, t.clone, repr, lambda: t.fill_(0), lambda: t.numpy()):
            try:
                op() if op is not repr else op(t)
            except (BufferError, TypeError, ImportError):  # ImportError: numpy() without NumPy
                print("refused")
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split().count("refused") >= 4


def test_owner_none_is_allowed_for_static_memory():
    """owner=None is allowed for memory valid for the whole process (here: a module-level block)."""
    t = tb.from_pointer(_STATIC.ptr, 3, tb.int32)
    assert t._storage.owner is None
    assert t.tolist() == [0, 1, 2]


_STATIC = Block(3)


def test_dtype_given_by_name_and_float_memory():
    """dtype may be a name; float memory reads as floats."""
    block = Block(3, ctypes.c_double)
    t = tb.from_pointer(block.ptr, 3, "float64", owner=block)
    assert t.tolist() == [0.0, 1.0, 2.0]


def test_round_trip_through_numpy():
    """A from_pointer tensor is a first-class tensor: NumPy sees the same memory."""
    np = pytest.importorskip("numpy")
    block = Block(4)
    t = tb.from_pointer(block.ptr, (2, 2), tb.int32, owner=block, nbytes=block.nbytes)
    assert np.from_dlpack(t).ctypes.data == block.ptr
    a = np.asarray(t)  # writable on every NumPy (from_dlpack is read-only before NumPy 2.1)
    assert a.ctypes.data == block.ptr
    a[1, 1] = 30
    assert block.array[3] == 30


def test_docstring_example():
    """The documented example prints as documented."""
    buf = (ctypes.c_int32 * 4)(1, 2, 3, 4)
    t = tb.from_pointer(
        ctypes.addressof(buf), (2, 2), "int32", owner=buf, nbytes=ctypes.sizeof(buf)
    )
    assert repr(t) == "tensor([[1, 2],\n        [3, 4]], dtype=tensorbridge.int32)"
