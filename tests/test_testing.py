"""The public test tooling: `tensorbridge.testing`'s crafted producer, capsule helpers and the
import-time promise that neither it nor the command line is loaded by ``import tensorbridge``."""

from __future__ import annotations

import ast
import ctypes
import gc
import sys
import weakref
from pathlib import Path

import pytest

import tensorbridge as tb
from tensorbridge import testing


def test_import_tensorbridge_loads_neither_testing_nor_the_cli(subprocess_run):
    """``import tensorbridge`` imports no test tooling and no command-line module."""
    proc = subprocess_run(
        """
        import sys, tensorbridge
        print(sorted(m for m in sys.modules if m.startswith(("tensorbridge.cli", "tensorbridge.testing"))))
        """
    )
    assert (proc.returncode, proc.stdout) == (0, "[]\n"), proc.stderr


# A peer's own attributes the doctor must read: ONNX Runtime's C-level value (`OrtValue._ortvalue`)
# is the object its DLPack export lives on, and what users hand to DLPack consumers.
_PEER_ATTRIBUTES = {"_ortvalue"}


def _private_uses(path: Path) -> list[str]:
    """Imports of private tensorbridge modules or names, and private attributes read off anything
    but ``self``/``cls`` (a peer's listed in `_PEER_ATTRIBUTES` aside), in the file ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level != 1:  # level 1: a sibling module
            module = "." * node.level + (node.module or "")
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        found += [f"import {n}" for n in names if "._" in n or n.startswith("..")]
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in _PEER_ATTRIBUTES
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_the_cli_uses_only_the_public_api():
    """The command line imports no private tensorbridge module and reads no private attribute of
    another object: it stands on the public API and `tensorbridge.testing`."""
    root = Path(tb.__file__).resolve().parent / "cli"
    assert sorted(root.glob("*.py"))
    found = {path.name: _private_uses(path) for path in sorted(root.glob("*.py"))}
    assert found == {name: [] for name in found}


def test_unconsumed_capsule_is_released_once_by_its_destructor(crafted):
    """A capsule nobody consumed calls its deleter once when it dies, as NumPy's does."""
    producer = crafted((1.0, 2.0))
    before = testing.stats()
    del producer.capsule
    gc.collect()
    assert producer.deleter_calls == 1
    after = testing.stats()
    assert after["deleted"] - before["deleted"] == 1
    assert after["stray"] == before["stray"]


def test_consumed_capsule_is_released_by_the_consumer(crafted):
    """tensorbridge's import renames the capsule; the deleter runs once, after the last view."""
    producer = crafted((1.0, 2.0, 3.0))
    t = tb.from_dlpack(producer.capsule)
    assert producer.consumed
    assert t.tolist() == [1.0, 2.0, 3.0]
    assert producer.deleter_calls == 0
    del t
    gc.collect()
    assert producer.deleter_calls == 1


def test_foreign_named_capsule_is_left_alone(crafted):
    """The destructor calls the deleter only for the unused DLPack names."""
    producer = crafted(name=b"arrow_array")
    assert testing.capsule_name(producer.capsule) == b"arrow_array"
    del producer.capsule
    gc.collect()
    assert producer.deleter_calls == 0


def test_release_without_destructor(crafted):
    """``destructor=False`` leaves an unconsumed capsule to `release`, which calls the deleter once;
    a second `release` does nothing."""
    producer = crafted((5.0,), destructor=False)
    producer.release()
    producer.release()
    assert producer.deleter_calls == 1


def test_fields_are_written_as_given(crafted):
    """Data pointer, dtype, shape, strides, flags and version land in the struct as given."""
    block = (ctypes.c_int32 * 6)(1, 2, 3, 4, 5, 6)
    last = ctypes.addressof(block) + 20
    producer = crafted(
        (), data=last, dtype=tb.int32.dlpack, shape=(3,), strides=(-2,), keep=block, flags=1
    )
    assert testing.capsule_flags(producer.capsule) == testing.FLAG_READ_ONLY
    t = tb.from_dlpack(producer.take())
    assert (t.tolist(), t.stride(), t.is_readonly) == ([6, 4, 2], (-2,), True)


def test_consume_capsule_acts_like_a_c_consumer():
    """consume_capsule renames a tensorbridge capsule and calls its deleter: the tensor is freed."""
    t = tb.arange(3)
    alive = weakref.ref(t)
    capsule = t.__dlpack__(max_version=(1, 3))
    del t
    testing.consume_capsule(capsule)
    assert testing.capsule_name(capsule) == b"used_dltensor_versioned"
    with pytest.raises(ValueError, match="used_dltensor_versioned"):
        testing.consume_capsule(capsule)
    del capsule
    gc.collect()
    assert alive() is None


def test_capsule_flags_of_a_read_only_export():
    """A read-only tensor's versioned capsule carries READ_ONLY; a legacy capsule has no flags."""
    ro = tb.frombuffer(bytes(4), dtype=tb.uint8)
    assert testing.capsule_flags(ro.__dlpack__(max_version=(1, 3))) & testing.FLAG_READ_ONLY
    assert testing.capsule_flags(tb.to_dlpack(tb.arange(2))) == 0


def test_buffer_address_and_format():
    """buffer_address is the exporter's address; dtype_from_format reads native formats only."""
    block = (ctypes.c_int32 * 2)()
    assert testing.buffer_address(block) == ctypes.addressof(block)
    assert testing.dtype_from_format("<i" if sys.byteorder == "little" else ">i") is tb.int32
    assert testing.dtype_from_format(">i" if sys.byteorder == "little" else "<i") is None
    assert testing.DTYPES[0] is tb.bool and tb.float4_e2m1fn_x2 in testing.DTYPES


def test_fenced_memory_checks_its_range():
    """Fenced.write and read refuse a range outside the usable bytes."""
    block = testing.Fenced(8)
    block.write(b"abcdefgh")
    assert block.read(6) == b"gh"
    with pytest.raises(ValueError, match=r"Fenced\.write"):
        block.write(b"x", 8)
    with pytest.raises(ValueError, match=r"Fenced\.read"):
        block.read(4, 5)
