"""One limit on sizes: int64, where any size enters.

DLPack, PyTorch and NumPy hold sizes, strides and element counts in int64. A size past it cannot be
exported and is no real tensor, so every door refuses it: constructors and views (PyTorch's types:
TypeError for a value it cannot unpack, RuntimeError for sizes that multiply past int64), imported
layouts, and a size-0 tensor's other sizes too. The headers, pickles and Dask's header are tested
beside their formats.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import tensorbridge as tb

BIG = 2**63  # the first value past int64
HALF = 2**62

# (call, PyTorch's call, the exception type, a substring of PyTorch's message)
CASES = [
    ("zeros(2**63)", lambda m: m.zeros(BIG), TypeError, "Overflow when unpacking long long"),
    ("zeros(0, 2**64 - 1)", lambda m: m.zeros(0, 2**64 - 1), TypeError, "Overflow when unpacking"),
    ("empty((2**70,))", lambda m: m.empty((2**70,)), TypeError, "Overflow when unpacking"),
    ("ones(2**62, 4)", lambda m: m.ones(HALF, 4), RuntimeError, None),
    (
        "full((0, 2**64), 1.0)",
        lambda m: m.full((0, 2**64), 1.0),
        TypeError,
        "Overflow when unpacking",
    ),
    (
        "as_strided size",
        lambda m: m.zeros(1).as_strided((BIG,), (0,)),
        TypeError,
        "Overflow when unpacking long long",
    ),
    (
        "as_strided stride",
        lambda m: m.zeros(1).as_strided((1,), (2**70,)),
        TypeError,
        "Overflow when unpacking long long",
    ),
    (
        "view(2**64)",
        lambda m: m.zeros(1).view(2**64),
        TypeError,
        "Overflow when unpacking long long",
    ),
    ("reshape(-1, 2**63)", lambda m: m.zeros(0).reshape(-1, BIG), TypeError, "Overflow"),
    (
        "expand(2**62, 4)",
        lambda m: m.zeros(1, 1).expand(HALF, 4),
        RuntimeError,
        "numel: integer multiplication overflow",
    ),
]


@pytest.mark.parametrize(("name", "call", "exc", "text"), CASES, ids=[c[0] for c in CASES])
def test_constructors_and_views_refuse_sizes_past_int64(name, call, exc, text):
    with pytest.raises(exc, match="int64") as info:
        call(tb)
    if text is not None:
        assert text in str(info.value)


@pytest.mark.parametrize(("name", "call", "exc", "text"), CASES, ids=[c[0] for c in CASES])
def test_pytorch_refuses_the_same_sizes_with_the_same_type(name, call, exc, text):
    """The expected types and texts are PyTorch's own: each case checked against it."""
    torch = pytest.importorskip("torch")
    with pytest.raises(exc) as info:
        call(torch)
    if text is not None:
        assert text in str(info.value)


def test_sizes_inside_int64_are_taken():
    assert tb.zeros(0, 2**63 - 1).shape == (0, 2**63 - 1)
    assert tb.zeros(1).as_strided((2**63 - 1,), (0,)).shape == (2**63 - 1,)
    assert tb.zeros(1).as_strided((1,), (-(2**63),)).stride() == (-(2**63),)


def test_an_offset_past_int64_is_refused():
    with pytest.raises(ValueError, match="storage offset"):
        tb.zeros(1).as_strided((0,), (1,), 2**64)


class _Interface:
    def __init__(self, shape, strides=None):
        self.__array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (0, False),
            "strides": strides,
            "version": 3,
        }


@pytest.mark.parametrize(
    ("shape", "strides"),
    [((0, 2**64), None), ((2**70,), None), ((0, HALF, HALF), None), ((0, 1), (4, 2**70))],
)
def test_an_array_interface_past_int64_is_refused(shape, strides):
    with pytest.raises((ValueError, TypeError), match="int64") as info:
        tb.asarray(_Interface(shape, strides))
    assert "asarray()" in str(info.value)


def test_tolist_of_a_huge_empty_tensor_fails_at_once():
    """``(2**62, 0)``: the outer list cannot be made, a MemoryError as PyTorch's ``tolist`` raises;
    building 2**62 empty lists one by one ran the machine out of memory. Run with an address-space
    limit in a child, so that a regression fails the test rather than the machine."""
    code = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        import tensorbridge as tb
        t = tb.zeros(1).as_strided((2**62, 0), (0, 1))
        try:
            t.tolist()
        except MemoryError:
            print("MemoryError")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "MemoryError"
    assert tb.zeros(3, 0).tolist() == [[], [], []]
    assert tb.zeros(2, 2, 0).tolist() == [[[], []], [[], []]]
