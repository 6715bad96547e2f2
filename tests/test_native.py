"""The native layer: its two twins hold the same names, signatures and behaviour, and DLPack's C layout
is declared once per build, from the header.

`_native` chooses `_native_c` (compiled) or `_native_py` (ctypes and `struct`). Each test of
behaviour here runs over every twin that can run in this interpreter (both on a compiled install,
the pure one otherwise); the byte-for-byte tests of the DLPack structs live in test_dlpack.py and
the buffer readers' in test_asarray.py, over the same twins.

The layout tests compile a small C program against include/dlpack/dlpack.h (the header the
compiled build declares its structs from) and read every size and offset back; the ctypes
declaration in `_dlpack_abi`, the formats derived from it, and the independent oracle in
`testing` must agree with it, and, where PyTorch is installed, with the upstream header PyTorch
ships. They need a C compiler, and skip without one.
"""

from __future__ import annotations

import ctypes
import inspect
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tensorbridge import _capi, _dlpack_abi, _native, _native_py, testing

from .conftest import native_twins

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "include" / "dlpack" / "dlpack.h"
TWINS = native_twins()
_ids = [twin.__name__.rpartition(".")[2] for twin in TWINS]

# The types of what two compiled functions return, public in `_native_c` only: the held view
# `acquire_buffer` returns (the pure twin's is a ctypes `_capi.Py_buffer`) and the block
# `new_managed` returns (the pure twin's is a ctypes char array).
_RESULT_TYPES = {"BufferView", "ManagedBlock"}


# ---------------------------------------------------------------------------------- one choice
def test_the_layer_is_chosen_once_and_binds_its_twins_names():
    assert set(_native.NAMES) == set(_native_py.__all__)
    for name in _native.NAMES:
        assert getattr(_native, name) is getattr(_native.twin, name), name
    assert _native.COMPILED is (_native.twin is not _native_py)


def test_no_module_but_native_imports_a_twin():
    """Every other module reaches the native layer through `_native` (tests aside)."""
    package = ROOT / "src" / "tensorbridge"
    for path in sorted(package.rglob("*.py")) + sorted(package.glob("*.pxd")):
        if path.stem in ("_native", "_native_py"):
            continue
        text = path.read_text(encoding="utf-8")
        for twin in ("_native_py", "_native_c"):
            assert f"import {twin}" not in text and f".{twin} import" not in text, (path, twin)
            assert f"{twin}." not in text.replace(f"`{twin}.", ""), (path, twin)


@pytest.mark.skipif(len(TWINS) < 2, reason="the compiled twin is not installed here")
def test_both_twins_offer_the_same_names_and_signatures():
    pure, compiled = TWINS
    public = {
        name
        for name, value in vars(compiled).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == compiled.__name__
    }
    assert public - _RESULT_TYPES == set(_native.NAMES)
    for name in _native.NAMES:
        ours, theirs = getattr(pure, name), getattr(compiled, name)
        assert callable(ours) and callable(theirs), name
        if inspect.isclass(ours) or inspect.isclass(theirs):
            continue  # classes: their calls are compared by behaviour below
        got = [(p.name, p.kind, p.default) for p in inspect.signature(theirs).parameters.values()]
        if inspect.isbuiltin(ours):
            # A built-in bound as it is (``object.__new__``: the fastest allocation Python has)
            # takes ``(*args, **kwargs)``; its calls are compared by behaviour
            # (tests/test_construct.py).
            continue
        if isinstance(ours, ctypes._CFuncPtr):
            # A C-API function bound through ctypes has no parameter names, only its C
            # arguments: the compiled twin takes as many, each positional, with no default.
            assert len(got) == len(ours.argtypes), name
            assert {kind for _, kind, _ in got} <= {inspect.Parameter.POSITIONAL_OR_KEYWORD}, name
            assert {default for _, _, default in got} <= {inspect.Parameter.empty}, name
            continue
        expected = [
            (p.name, p.kind, p.default) for p in inspect.signature(ours).parameters.values()
        ]
        assert got == expected, name


# ------------------------------------------------------------------------------ same behaviour
@pytest.mark.parametrize("twin", TWINS, ids=_ids)
def test_capsule_calls(twin):
    store = ctypes.c_int64(7)
    address = ctypes.addressof(store)
    capsule = twin.capsule_new(address, b"tb_test", None)
    assert type(capsule) is _capi.CapsuleType
    assert twin.capsule_is_valid(capsule, b"tb_test") == 1
    assert twin.capsule_is_valid(capsule, b"other") == 0
    assert twin.capsule_is_valid(object(), b"tb_test") == 0
    assert twin.capsule_pointer(capsule, b"tb_test") == address
    with pytest.raises(ValueError):
        twin.capsule_pointer(capsule, b"other")
    assert twin.capsule_set_name(capsule, b"tb_used") == 0
    assert twin.capsule_pointer(capsule, b"tb_used") == address
    with pytest.raises(ValueError):
        twin.capsule_new(0, b"tb_test", None)  # a capsule never holds NULL


@pytest.mark.parametrize("twin", TWINS, ids=_ids)
def test_calls_into_c_refuse_a_null_function(twin):
    for cls in (twin.VoidFunction, twin.ManagedFromPy):
        with pytest.raises(ValueError, match="NULL"):
            cls(0)


@pytest.mark.parametrize("twin", TWINS, ids=_ids)
def test_a_void_function_calls_the_c_function_at_its_address(twin):
    seen = []
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda p: seen.append(p))
    function = twin.VoidFunction(ctypes.cast(callback, ctypes.c_void_p).value)
    function(0xABC)
    function(0)
    assert seen == [0xABC, None]


@pytest.mark.parametrize("twin", TWINS, ids=_ids)
def test_a_void_callback_runs_its_function_with_the_pointer(twin):
    # The compiled twin has four slots for the life of the process, and the package takes three:
    # this test makes one callback in each twin, never more.
    seen = []
    address = twin.void_callback(seen.append)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)(0x1234)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)(None)
    assert seen == [0x1234, 0]


@pytest.mark.parametrize("twin", TWINS, ids=_ids)
def test_only_c_writes_destructors_that_keep_a_pending_exception(twin):
    compiled = twin is not _native_py
    assert (twin.guarded_destructor_address() is not None) is compiled
    if not compiled:  # the compiled one holds the package's release: it is not replaced here
        assert twin.dlpack_capsule_destructor(print) is None


@pytest.mark.parametrize("twin", TWINS, ids=_ids)
def test_readers_leave_addresses_outside_memory_to_the_caller(twin):
    assert twin.read_versioned(0, 64) is None
    assert twin.read_versioned(2**64 - 8, 64) is None
    # a readable array beside one outside: None, whichever of the two it is
    readable = ctypes.c_int64(5)
    inside = ctypes.addressof(readable)
    assert twin.read_dims(0, 0, 1) is None
    assert twin.read_dims(inside, 2**64 - 8, 1) is None
    assert twin.read_dims(2**64 - 8, inside, 1) is None
    assert twin.read_dims(inside, inside, 2**62) is None
    assert twin.read_dims(inside, inside, 1) == ((5,), (5,))
    assert twin.read_dims(0, 0, 0) == ((), ())  # nothing to read: no address is touched
    with pytest.raises(ValueError, match="non-negative"):
        twin.read_dims(8, 8, -1)


@pytest.mark.parametrize("twin", TWINS, ids=_ids)
def test_a_managed_struct_needs_as_many_strides_as_dimensions(twin):
    fields = (True, (1, 3), 0, 0, 0, (1, 0), (2, 32, 1), 0)
    with pytest.raises(ValueError, match="2 dimensions but 1 strides"):
        twin.new_managed(*fields, (2, 3), (1,))
    address, block = twin.new_managed(*fields, (2, 3), (3, 1))
    assert address and block is not None


# ------------------------------------------------------------------------- the C layout, once
# Every struct and field of the header, as (struct, field path) pairs the C program prints.
_FIELDS = {
    "DLPackVersion": ["major", "minor"],
    "DLDevice": ["device_type", "device_id"],
    "DLDataType": ["code", "bits", "lanes"],
    "DLTensor": ["data", "device", "ndim", "dtype", "shape", "strides", "byte_offset"],
    "DLManagedTensor": ["dl_tensor", "manager_ctx", "deleter"],
    "DLManagedTensorVersioned": ["version", "manager_ctx", "deleter", "flags", "dl_tensor"],
    "DLPackExchangeAPIHeader": ["version", "prev_api"],
    "DLPackExchangeAPI": [
        "header",
        "managed_tensor_allocator",
        "managed_tensor_from_py_object_no_sync",
        "managed_tensor_to_py_object_no_sync",
        "dltensor_from_py_object_no_sync",
        "current_work_stream",
    ],
}


def _header_layout(include: Path, tmp_path: Path, compiler: str) -> dict[str, tuple[int, dict]]:
    """Each struct's size and its fields' offsets, as the C compiler lays them out from the
    header ``include/dlpack/dlpack.h``, plus the two version macros."""
    lines = []
    for name, fields in _FIELDS.items():
        lines.append(f'  printf("{name} size %zu\\n", sizeof({name}));')
        lines += [f'  printf("{name} {f} %zu\\n", offsetof({name}, {f}));' for f in fields]
    source = tmp_path / ("layout.cc" if compiler.endswith("++") else "layout.c")
    source.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <dlpack/dlpack.h>\n"
        "int main(void) {\n"
        '  printf("version %d %d\\n", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);\n'
        + "\n".join(lines)
        + "\n  return 0;\n}\n",
        encoding="utf-8",
    )
    program = tmp_path / "layout"
    subprocess.run(
        [compiler, f"-I{include}", str(source), "-o", str(program)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    out = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout
    layout: dict[str, tuple[int, dict]] = {}
    for line in out.splitlines():
        name, key, value = line.split()
        if name == "version":
            layout["version"] = (int(key), {"minor": int(value)})
            continue
        size, offsets = layout.get(name, (0, {}))
        if key == "size":
            size = int(value)
        else:
            offsets[key] = int(value)
        layout[name] = (size, offsets)
    return layout


def _compiler() -> str:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler")
    return compiler


def _ctypes_layout() -> dict[str, tuple[int, dict]]:
    return {
        name: (
            ctypes.sizeof(getattr(_dlpack_abi, name)),
            {f: getattr(getattr(_dlpack_abi, name), f).offset for f in fields},
        )
        for name, fields in _FIELDS.items()
    }


@pytest.mark.skipif(sys.platform == "win32", reason="the layout program is built with a POSIX cc")
def test_the_ctypes_declaration_is_the_headers_layout(tmp_path):
    header = _header_layout(HEADER.parent.parent, tmp_path, _compiler())
    assert header.pop("version") == (1, {"minor": _dlpack_abi.DLPACK_MINOR_VERSION})
    assert _dlpack_abi.DLPACK_VERSION == (1, 3)
    assert _ctypes_layout() == header


@pytest.mark.skipif(sys.platform == "win32", reason="the layout program is built with a POSIX cc")
def test_the_header_is_the_upstream_headers_layout(tmp_path):
    """PyTorch ships DLPack's own header (torch/include/ATen/dlpack.h): where it is installed,
    the repository's header lays out every struct as upstream does."""
    torch = pytest.importorskip("torch")
    upstream = Path(torch.__file__).parent / "include" / "ATen" / "dlpack.h"
    if not upstream.is_file():
        pytest.skip("this PyTorch ships no ATen/dlpack.h")
    include = tmp_path / "upstream"
    (include / "dlpack").mkdir(parents=True)
    shutil.copyfile(upstream, include / "dlpack" / "dlpack.h")
    compiler = _compiler()
    try:
        theirs = _header_layout(include, tmp_path, compiler)
    except subprocess.CalledProcessError:  # a header only a C++ compiler takes
        compiler = shutil.which("c++") or shutil.which("g++")
        if compiler is None:
            pytest.skip("the upstream header needs a C++ compiler, and there is none")
        theirs = _header_layout(include, tmp_path, compiler)
    ours = _header_layout(HEADER.parent.parent, tmp_path, compiler)
    assert theirs.pop("version")[0] == ours.pop("version")[0] == 1
    assert ours == theirs


def test_the_derived_formats_have_the_declarations_offsets():
    """Each `struct` format `_dlpack_abi` derives puts every field at its ctypes offset."""
    cases = [
        (_dlpack_abi.VERSIONED_WRITE, _dlpack_abi.DLManagedTensorVersioned),
        (_dlpack_abi.LEGACY_WRITE, _dlpack_abi.DLManagedTensor),
        (_dlpack_abi.VERSIONED_READ, _dlpack_abi.DLManagedTensorVersioned),
        (_dlpack_abi.LEGACY_READ, _dlpack_abi.DLManagedTensor),
        (_dlpack_abi.EXCHANGE_HEADER, _dlpack_abi.DLPackExchangeAPIHeader),
        (_dlpack_abi.EXCHANGE_API, _dlpack_abi.DLPackExchangeAPI),
    ]
    for fmt, declared in cases:
        assert fmt.size == ctypes.sizeof(declared), declared.__name__
    # Written: the versioned struct's fields in order, each a distinct value, read back by ctypes.
    values = (1, 3, 0x10, 0x20, 0x30, 0x40, 2, 5, 3, 4, 16, 1, 0x50, 0x60, 0x70)
    raw = bytearray(_dlpack_abi.VERSIONED_WRITE.pack(*values))
    m = _dlpack_abi.DLManagedTensorVersioned.from_buffer(raw)
    dl = m.dl_tensor
    assert (m.version.major, m.version.minor, m.manager_ctx, m.flags) == (1, 3, 0x10, 0x30)
    assert ctypes.cast(m.deleter, ctypes.c_void_p).value == 0x20
    assert (dl.data, dl.device.device_type, dl.device.device_id, dl.ndim) == (0x40, 2, 5, 3)
    assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes, dl.byte_offset) == (4, 16, 1, 0x70)
    assert ctypes.cast(dl.shape, ctypes.c_void_p).value == 0x50
    assert ctypes.cast(dl.strides, ctypes.c_void_p).value == 0x60
    del m, dl
    # Read: the dtype comes back as one word, its bytes those of the three fields.
    read = _dlpack_abi.VERSIONED_READ.unpack(bytes(raw))
    assert read[9] == struct.unpack("@I", struct.pack("@BBH", 4, 16, 1))[0]
    assert read[:9] + read[10:] == values[:9] + values[12:]


def test_struct_format_refuses_a_field_type_it_does_not_know():
    class Odd(ctypes.Structure):
        _fields_ = (("x", ctypes.c_double),)

    with pytest.raises(TypeError, match="c_double"):
        _dlpack_abi.struct_format(Odd)


def test_the_testing_oracle_agrees_with_the_declaration():
    """`testing` declares the structs again, flattened, independently: a test oracle."""
    assert ctypes.sizeof(testing._Versioned) == ctypes.sizeof(_dlpack_abi.DLManagedTensorVersioned)
    assert ctypes.sizeof(testing._Legacy) == ctypes.sizeof(_dlpack_abi.DLManagedTensor)
    assert ctypes.sizeof(testing._DLTensor) == ctypes.sizeof(_dlpack_abi.DLTensor)
    t, o = _dlpack_abi.DLTensor, testing._DLTensor
    assert o.data.offset == t.data.offset and o.ndim.offset == t.ndim.offset
    assert o.device_type.offset == t.device.offset and o.code.offset == t.dtype.offset
    assert (o.shape.offset, o.strides.offset, o.byte_offset.offset) == (
        t.shape.offset,
        t.strides.offset,
        t.byte_offset.offset,
    )
    v, ov = _dlpack_abi.DLManagedTensorVersioned, testing._Versioned
    assert (ov.manager_ctx.offset, ov.deleter.offset, ov.flags.offset, ov.dl_tensor.offset) == (
        v.manager_ctx.offset,
        v.deleter.offset,
        v.flags.offset,
        v.dl_tensor.offset,
    )
