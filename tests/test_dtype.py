"""dtypes: one interned object per element type, with PyTorch's names, sizes, flags and DLPack codes."""

from __future__ import annotations

import copy
import ctypes
import pickle
import struct
from typing import Any

import pytest

import tensorbridge as tb
from tensorbridge import _dtype
from tensorbridge._dtype import (
    ALL_DTYPES,
    BY_DLPACK,
    BY_NAME,
    BY_TYPESTR,
    DType,
    as_dtype,
    from_format,
)


@pytest.fixture(scope="module")
def torch():
    """PyTorch, the reference for names and flags."""
    return pytest.importorskip("torch")


# The DLPack (code, bits, lanes) PyTorch 2.13 writes into a capsule for each dtype.
_COMPAT_TRIPLES = {
    "bool": (6, 8, 1),
    "uint8": (1, 8, 1),
    "uint16": (1, 16, 1),
    "uint32": (1, 32, 1),
    "uint64": (1, 64, 1),
    "int8": (0, 8, 1),
    "int16": (0, 16, 1),
    "int32": (0, 32, 1),
    "int64": (0, 64, 1),
    "float16": (2, 16, 1),
    "float32": (2, 32, 1),
    "float64": (2, 64, 1),
    "bfloat16": (4, 16, 1),
    "complex32": (5, 32, 1),
    "complex64": (5, 64, 1),
    "complex128": (5, 128, 1),
    "float8_e4m3fn": (10, 8, 1),
    "float8_e4m3fnuz": (11, 8, 1),
    "float8_e5m2": (12, 8, 1),
    "float8_e5m2fnuz": (13, 8, 1),
    "float8_e8m0fnu": (14, 8, 1),
    "float4_e2m1fn_x2": (17, 4, 2),
}
# dlpack.h v1.3 codes of the float8 types PyTorch lacks.
_DLPACK_ONLY = {"float8_e3m4": (7, 8, 1), "float8_e4m3": (8, 8, 1), "float8_e4m3b11fnuz": (9, 8, 1)}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_dlpack_triples_follow_the_table(dtype):
    """Every dtype's DLPack (code, bits, lanes) is PyTorch's (dlpack.h's where torch lacks it)."""
    assert dtype.dlpack == {**_COMPAT_TRIPLES, **_DLPACK_ONLY}[dtype.name]
    assert BY_DLPACK[dtype.dlpack] is dtype


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_flags_and_sizes_equal_torch(torch, dtype):
    """itemsize, is_floating_point, is_complex and is_signed equal torch's for every dtype it has."""
    theirs = getattr(torch, dtype.name, None)
    if theirs is None:
        pytest.skip(f"torch has no {dtype.name}")
    assert (dtype.itemsize, dtype.is_floating_point, dtype.is_complex, dtype.is_signed) == (
        theirs.itemsize,
        theirs.is_floating_point,
        theirs.is_complex,
        theirs.is_signed,
    )


def _torch_capsule_dtype(torch, theirs) -> tuple[int, int, int]:
    """The DLDataType torch writes into a legacy capsule for a tensor of ``theirs``."""
    from tensorbridge import _capi
    from tensorbridge._dlpack_abi import DLTENSOR, DLManagedTensor

    capsule = torch.utils.dlpack.to_dlpack(torch.zeros(16, dtype=torch.uint8).view(theirs))
    managed = DLManagedTensor.from_address(_capi.PyCapsule_GetPointer(capsule, DLTENSOR))
    dt = managed.dl_tensor.dtype
    return dt.code, dt.bits, dt.lanes


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_dlpack_triples_equal_what_torch_exports(torch, dtype):
    """The triple is the one torch.utils.dlpack.to_dlpack writes for the same dtype."""
    theirs = getattr(torch, dtype.name, None)
    if theirs is None:
        pytest.skip(f"torch has no {dtype.name}")
    assert _torch_capsule_dtype(torch, theirs) == dtype.dlpack


def test_torch_aliases():
    """PyTorch's aliases are the same objects: half, float, double, short, int, long, chalf, cfloat, cdouble."""
    aliases = {
        "half": tb.float16,
        "float": tb.float32,
        "double": tb.float64,
        "short": tb.int16,
        "int": tb.int32,
        "long": tb.int64,
        "chalf": tb.complex32,
        "cfloat": tb.complex64,
        "cdouble": tb.complex128,
    }
    for alias, dtype in aliases.items():
        assert getattr(tb, alias) is dtype
        assert BY_NAME[alias] is dtype


def test_torch_names_all_exist(torch):
    """Every dtype name PyTorch shares with DLPack exists in tensorbridge under the same name."""
    for name in _COMPAT_TRIPLES:
        assert isinstance(getattr(torch, name), torch.dtype)
        assert isinstance(getattr(tb, name), DType)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_interned_immutable_and_pickled_to_itself(dtype):
    """One object per dtype: copies and pickles give the same object; attributes cannot change."""
    assert DType(dtype.name) is dtype and DType(dtype) is dtype
    assert copy.copy(dtype) is dtype and copy.deepcopy(dtype) is dtype
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(dtype, protocol)) is dtype
    with pytest.raises(AttributeError, match="DType is immutable"):
        dtype.itemsize = 3
    assert repr(dtype) == f"tensorbridge.{dtype.name}"
    assert getattr(tb, dtype.name) is dtype
    assert tb.dtype is DType


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_typestr_and_format_agree_with_struct(dtype):
    """typestr and the buffer format describe the same bytes (native order; None where none exists)."""
    native = "<" if struct.pack("=H", 1) == b"\x01\x00" else ">"
    if dtype.typestr is not None:
        order = "|" if dtype.itemsize == 1 else native
        assert dtype.typestr[0] == order
        assert int(dtype.typestr[2:]) == dtype.itemsize
        assert BY_TYPESTR[dtype.typestr[1:]] is dtype
    if dtype.format is not None:
        assert (
            struct.calcsize(dtype.format.removeprefix("Z") * (2 if dtype.kind == "c" else 1))
            == dtype.itemsize
        )
        assert from_format(dtype.format) is dtype
    assert dtype.bits == 8 * dtype.itemsize


def test_typestrs_match_numpy():
    """Each typestr is NumPy's dtype.str for the same type."""
    np = pytest.importorskip("numpy")
    for dtype in ALL_DTYPES:
        if dtype.typestr is not None:
            assert np.dtype(dtype.typestr).str == dtype.typestr
            assert np.dtype(dtype.typestr).itemsize == dtype.itemsize
            assert np.dtype(dtype.typestr).kind == dtype.kind


@pytest.mark.parametrize(
    ("fmt", "want"),
    [
        ("f", tb.float32),
        ("@f", tb.float32),
        ("=d", tb.float64),
        ("?", tb.bool),
        ("B", tb.uint8),
        ("c", tb.uint8),
        ("l", BY_NAME[{4: "int32", 8: "int64"}[ctypes.sizeof(ctypes.c_long)]]),
        ("=l", tb.int32),
        ("=L", tb.uint32),
        ("q", tb.int64),
        ("Zd", tb.complex128),
        ("e", tb.float16),
        ("P", BY_NAME[f"uint{8 * ctypes.sizeof(ctypes.c_void_p)}"]),
    ],
)
def test_from_format(fmt, want):
    """Buffer formats map to dtypes, with C aliases and standard sizes."""
    assert from_format(fmt) is want


@pytest.mark.parametrize(
    "fmt", ["!f", ">f" if struct.pack("=H", 1)[0] == 1 else "<f", "x", "3f", "T{f:x:}", ""]
)
def test_from_format_refuses_foreign_layouts(fmt):
    """Non-native byte order, padding, counts and structs have no dtype (None: the caller reports it)."""
    assert from_format(fmt) is None


def test_as_dtype():
    """as_dtype takes a dtype or its name (optionally prefixed), and names the argument when it fails."""
    assert as_dtype(tb.int8, "f") is tb.int8
    assert as_dtype("float32", "f") is tb.float32
    assert as_dtype("torch.half", "f") is tb.float16
    assert as_dtype("tensorbridge.long", "f") is tb.int64
    with pytest.raises(
        TypeError, match=r"f\(\): argument 'dtype' must be tensorbridge.dtype, not str; got 'f33'"
    ):
        as_dtype("f33", "f")
    with pytest.raises(
        TypeError, match=r"g\(\): argument 'out' must be tensorbridge.dtype, not type; got <class"
    ):
        as_dtype(float, "g", "out")


def test_all_dtypes_are_exported():
    """tensorbridge exports every dtype of the table and its __all__ lists them."""
    for dtype in ALL_DTYPES:
        assert dtype.name in tb.__all__
    assert len({d.name for d in ALL_DTYPES}) == len(ALL_DTYPES)
    assert len(set(BY_DLPACK)) == len(ALL_DTYPES)
    assert (
        _dtype.result_kind_order(tb.bool)
        < _dtype.result_kind_order(tb.uint8)
        < _dtype.result_kind_order(tb.float16)
        < _dtype.result_kind_order(tb.complex64)
    )


def _arrow_format(arrow_type: object) -> bytes:
    """The format string pyarrow writes into the Arrow C schema it exports for ``arrow_type``."""
    from tensorbridge._interfaces import ArrowSchema

    capsule = arrow_type.__arrow_c_schema__()  # type: ignore[attr-defined]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    schema = ArrowSchema.from_address(get_pointer(capsule, b"arrow_schema"))
    fmt = bytes(schema.format)
    del capsule  # releases the schema, after its format was copied out
    return fmt


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_every_foreign_encoding_is_a_field_of_the_dtype_list() -> None:
    """Each dtype's Arrow, PyTorch, ml_dtypes, buffer and typestr encodings match the peers and invert."""
    np = pytest.importorskip("numpy")
    pa = pytest.importorskip("pyarrow")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    arrow_types = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16()]
    arrow_types += [pa.uint32(), pa.uint64(), pa.float16(), pa.float32(), pa.float64()]
    # Every fixed-width primitive Arrow type tensorbridge imports maps back to its own dtype.
    assert sorted(_arrow_format(a) for a in arrow_types) == sorted(_dtype.BY_ARROW_FORMAT)
    for dtype in ALL_DTYPES:
        if dtype.arrow is not None:
            assert _dtype.BY_ARROW_FORMAT[dtype.arrow] is dtype
            assert _arrow_format(pa.from_numpy_dtype(np.dtype(dtype.typestr))) == dtype.arrow
        if dtype.torch_name is not None:
            # PyTorch's legacy tensor type names are its ScalarType names: torch.LongTensor.
            legacy = torch.empty(0, dtype=getattr(torch, dtype.name)).type()
            assert legacy == f"torch.{dtype.torch_name}Tensor"
        # ml_dtypes names exactly the dtypes NumPy lacks but packed float4, with the same size.
        assert (dtype.ml_dtypes is not None) == (dtype.typestr is None and dtype.dlpack[2] == 1)
        if dtype.ml_dtypes is not None and hasattr(ml_dtypes, dtype.ml_dtypes):
            # (older ml_dtypes lack some: 0.5 has no complex32)
            assert np.dtype(getattr(ml_dtypes, dtype.ml_dtypes)).itemsize == dtype.itemsize
        # The raw-bits encodings are the unsigned integer of the same size (NumPy has no u16).
        if dtype.raw_typestr is not None:
            assert BY_TYPESTR[dtype.raw_typestr[1:]].kind == "u"
            assert np.dtype(dtype.raw_typestr) == np.dtype(f"u{dtype.itemsize}")
        else:
            assert dtype.itemsize == 16  # complex128: no unsigned integer of its size
        if dtype.format is None:
            raw = from_format(dtype.buffer_format.decode())
            assert raw is not None and raw.kind == "u" and raw.itemsize == dtype.itemsize
        else:
            assert dtype.buffer_format == dtype.format.encode()
        assert (dtype.c_type is None) == (dtype.kind == "b" or dtype is tb.float4_e2m1fn_x2)


def test_promote_types_equals_torch(torch: Any) -> None:
    """promote_types gives torch.promote_types' result for every pair PyTorch promotes."""
    shared = [d for d in ALL_DTYPES if hasattr(torch, d.name)]
    for a in shared:
        for b in shared:
            try:
                want = torch.promote_types(getattr(torch, a.name), getattr(torch, b.name))
            except RuntimeError:
                with pytest.raises(TypeError, match=r"Promotion for .* is not supported"):
                    _dtype.promote_types(a, b, "f")
            else:
                assert _dtype.promote_types(a, b, "f").name == str(want).removeprefix("torch.")
