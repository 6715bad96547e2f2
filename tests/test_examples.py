"""The examples of PyTorch's documentation (``torch.utils.dlpack``, ``torch.frombuffer``), run verbatim with tensorbridge for torch.

Each example is the doctest session of the documentation, with ``torch`` replaced by
``tensorbridge`` (imported as ``tb``); the expected output is what torch 2.13.0 prints, module name
aside. The capsule's address is matched with an ellipsis, as the documentation writes it.
"""

from __future__ import annotations

import doctest

import pytest

import tensorbridge as tb

FROM_DLPACK_TO_DLPACK = """
>>> import tensorbridge as tb
>>> t = tb.arange(4)
>>> t2 = tb.from_dlpack(t)          # directly from an object with __dlpack__
>>> t2[:2] = -1                     # memory is shared
>>> t2
tensor([-1, -1,  2,  3])
>>> t
tensor([-1, -1,  2,  3])
>>> capsule = tb.utils.dlpack.to_dlpack(t)    # the legacy route, through a capsule
>>> capsule
<capsule object "dltensor" at 0x...>
>>> t3 = tb.from_dlpack(capsule)
>>> t3
tensor([-1, -1,  2,  3])
>>> t3[0] = -9                      # now three tensors share memory
>>> t3
tensor([-9, -1,  2,  3])
>>> t2
tensor([-9, -1,  2,  3])
>>> t
tensor([-9, -1,  2,  3])
"""

FROMBUFFER = """
>>> import array
>>> a = array.array('i', [1, 2, 3])
>>> t = tb.frombuffer(a, dtype=tb.int32)
>>> t
tensor([1, 2, 3], dtype=tensorbridge.int32)
>>> t[0] = -1
>>> a
array('i', [-1, 2, 3])

>>> # signed-char bytes read as 32-bit integers: 4 bytes make one element
>>> a = array.array('b', [-1, 0, 0, 0])
>>> tb.frombuffer(a, dtype=tb.int32)
tensor([255], dtype=tensorbridge.int32)
"""

# The second use of a consumed capsule: undefined in PyTorch's documentation, a defined error here.
CAPSULE_REUSE = """
>>> import tensorbridge as tb
>>> capsule = tb.utils.dlpack.to_dlpack(tb.arange(3))
>>> tb.from_dlpack(capsule)
tensor([0, 1, 2])
>>> tb.from_dlpack(capsule)
Traceback (most recent call last):
    ...
RuntimeError: from_dlpack received an invalid capsule. Note that DLTensor capsules can be ...
"""


def run_session(source: str, name: str) -> doctest.TestResults:
    """Run a doctest session in a fresh namespace and return (failed, attempted)."""
    parser = doctest.DocTestParser()
    test = parser.get_doctest(source, {"tb": tb}, name, None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    runner.run(test, out=report.append)
    assert not report, "".join(report)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("from_dlpack/to_dlpack", FROM_DLPACK_TO_DLPACK),
        ("frombuffer", FROMBUFFER),
        ("capsule reuse", CAPSULE_REUSE),
    ],
)
def test_documented_example(name, source):
    """The documented session prints exactly what PyTorch's documentation shows."""
    results = run_session(source, name)
    assert results.failed == 0
    assert results.attempted >= 4


def test_examples_match_torch_output_with_torch_names():
    """With tensorbridge replaced back by torch, the same session prints the same text in torch."""
    torch = pytest.importorskip("torch")
    source = FROM_DLPACK_TO_DLPACK.replace(
        "import tensorbridge as tb", "import torch as tb"
    ).replace("tensorbridge", "torch")
    parser = doctest.DocTestParser()
    test = parser.get_doctest(source, {"tb": torch}, "torch", None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    runner.run(test, out=report.append)
    assert not report, "".join(report)
