"""Data types: one interned `DType` per element type, every foreign encoding derived from one list.

Each dtype carries what the protocols and peers need to name it: the buffer-protocol format (and
the raw-bits format of dtypes without one), the ``__array_interface__`` typestr (and the unsigned
typestr of the same size), the DLPack ``(code, bits, lanes)`` triple, the Arrow format, PyTorch's
ScalarType name, the ml_dtypes name and the C++ type PyTorch's limits messages print. Every lookup
table in this module, and PyTorch's type promotion, is derived from the single list `_SPECS`, so
adding a dtype is one line.

Every ``dtype=`` argument is read by `as_dtype`, which also takes the dtypes of NumPy, ml_dtypes,
JAX, PyTorch, TensorFlow, PaddlePaddle and array-api-strict (`DType` lists the forms); NumPy reads
a `DType` back through its dtype protocol.
"""

from __future__ import annotations

import builtins
import importlib
import re
import sys
from typing import Any, Final, NoReturn

__all__ = [
    "DType",
    "bfloat16",
    "bool",
    "cdouble",
    "cfloat",
    "chalf",
    "complex32",
    "complex64",
    "complex128",
    "double",
    "float",
    "float4_e2m1fn_x2",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float16",
    "float32",
    "float64",
    "half",
    "int",
    "int8",
    "int16",
    "int32",
    "int64",
    "long",
    "short",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
]

# The host's byte order, in its two spellings: ``int.to_bytes``'s and struct's/typestr's.
BYTE_ORDER: Final = sys.byteorder
BYTE_ORDER_CHAR: Final = "<" if BYTE_ORDER == "little" else ">"

# DLDataTypeCode values (dlpack.h v1.3); the C spellings live in _dlpack_abi, these are the numbers.
_INT, _UINT, _FLOAT, _BFLOAT, _COMPLEX, _BOOL = 0, 1, 2, 4, 5, 6


class DType:
    """An element type, as PyTorch names it (``tensorbridge.float32``).

    Instances are interned: there is exactly one object per dtype, compared by identity, and
    pickling returns that same object.

    ``tensorbridge.dtype(x)`` returns the dtype that ``x`` stands for, and every ``dtype=``
    argument takes the same forms:

    - a tensorbridge dtype, or its name as PyTorch spells it, optionally prefixed with
      ``tensorbridge.`` or ``torch.`` (``"float32"``, ``"torch.half"``, ``"float"`` is float32);
    - a NumPy typestr in native byte order: an optional ``<``, ``>``, ``=`` or ``|``, the kind
      ``b``, ``i``, ``u``, ``f`` or ``c`` and the size in bytes (``"<f4"``, ``"i8"``, ``"c8"``);
      NumPy's one-letter codes (``"f"``, ``"d"``) are not taken: struct and NumPy read some of
      them differently;
    - a NumPy dtype or scalar type (``np.dtype("<f4")``, ``np.float32``), ml_dtypes' types
      (``ml_dtypes.bfloat16``, the float8 family) and JAX's (``jnp.float32``, ``jnp.bfloat16``),
      read from NumPy's dtype;
    - a ``torch.dtype``, a TensorFlow ``tf.DType`` and a PaddlePaddle dtype (``paddle.float32``,
      ``paddle.base.core.VarDesc.VarType.FP32``) and an array-api-strict dtype (``xp.float32``),
      read by the name they give it.

    Nothing is imported to recognise them: a foreign dtype's type names its library. A dtype of
    those libraries that tensorbridge lacks (``int4``, ``torch.qint8``, strings, objects, records,
    dates, a non-native byte order) is refused with a TypeError that names it. NumPy reads a
    dtype back: ``np.dtype(tensorbridge.float32)`` is float32, and bfloat16, complex32 and the
    float8 types are ml_dtypes' NumPy dtypes (ml_dtypes must be installed).

    Attributes:
        name: PyTorch's name without the module (``"float32"``).
        itemsize: bytes per element (a packed ``float4_e2m1fn_x2`` element holds two values in one byte).
        kind: ``"b"`` bool, ``"u"`` unsigned, ``"i"`` signed integer, ``"f"`` real floating, ``"c"`` complex.
        format: the buffer-protocol (struct) format character, or None where Python has none.
        typestr: the ``__array_interface__`` typestr in native byte order, or None where NumPy has none.
        dlpack: the DLPack ``(code, bits, lanes)`` triple.
        buffer_format: the format a memoryview of this dtype carries, as bytes: `format` encoded, or
            for dtypes without one the unsigned integer format of the same size (the raw bits).
        raw_typestr: the native ``__array_interface__`` typestr of the unsigned integer of the same
            size (the raw bits), or None where NumPy has none (16 bytes).
        arrow: the Arrow C data interface format string of the fixed-width primitive type, or None.
        torch_name: PyTorch's ScalarType name as its alias errors print it (``"Long"``); None for
            the float8 and float4 types, whose messages print the tensorbridge name instead.
        ml_dtypes: the ml_dtypes type name for dtypes NumPy lacks, or None.
        c_type: the C++ type PyTorch's scalar-range messages name (``"int64_t"``), or None.
    """

    __slots__ = (
        "arrow",
        "buffer_format",
        "c_type",
        "dlpack",
        "format",
        "itemsize",
        "kind",
        "ml_dtypes",
        "name",
        "raw_typestr",
        "torch_name",
        "typestr",
    )

    _interned: Final[dict[str, DType]] = {}

    name: str
    itemsize: builtins.int
    kind: str
    format: str | None
    typestr: str | None
    dlpack: tuple[builtins.int, builtins.int, builtins.int]
    buffer_format: bytes
    raw_typestr: str | None
    arrow: bytes | None
    torch_name: str | None
    ml_dtypes: str | None
    c_type: str | None

    def __new__(cls, value: object) -> DType:
        return as_dtype(value, "tensorbridge.dtype", "value")

    @classmethod
    def _define(
        cls,
        name: str,
        itemsize: builtins.int,
        kind: str,
        fmt: str | None,
        typestr: str | None,
        dlpack: tuple[builtins.int, builtins.int, builtins.int],
        **foreign: Any,
    ) -> DType:
        """The interned dtype ``name``, made with these encodings if it does not exist yet."""
        if name in cls._interned:
            return cls._interned[name]
        self = object.__new__(cls)
        for attr, value in (
            ("name", name),
            ("itemsize", itemsize),
            ("kind", kind),
            ("format", fmt),
            ("typestr", typestr),
            ("dlpack", dlpack),
            *foreign.items(),
        ):
            object.__setattr__(self, attr, value)
        cls._interned[name] = self
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        msg = f"DType is immutable; cannot set {name!r}"
        raise AttributeError(msg)

    def __reduce__(self) -> str:
        # Pickle by reference to the module-level constant, so unpickling returns the singleton.
        return self.name

    def __copy__(self) -> DType:
        return self

    def __deepcopy__(self, memo: Any) -> DType:
        return self

    def __repr__(self) -> str:
        return f"tensorbridge.{self.name}"

    @property
    def __numpy_dtype__(self) -> Any:
        """NumPy's dtype for this one: what ``numpy.dtype(tensorbridge.float32)`` reads (NumPy 2.4+)."""
        return to_numpy(self)

    @property
    def dtype(self) -> Any:
        """NumPy's dtype for this one, where the loaded NumPy predates ``__numpy_dtype__``.

        NumPy before 2.4 reads an object's ``dtype`` instead. Other libraries read ``dtype`` to
        tell arrays and scalars (``tensorbridge.tensor(x)`` does), so it exists only there.
        """
        numpy = sys.modules.get("numpy")
        version = "" if numpy is None else numpy.__version__
        if numpy is None or tuple(map(builtins.int, version.split(".")[:2])) >= (2, 4):
            msg = "'DType' object has no attribute 'dtype'"
            raise AttributeError(msg)
        return to_numpy(self)

    @property
    def is_floating_point(self) -> builtins.bool:
        """True for real floating types (float16/32/64, bfloat16, float8, float4)."""
        return self.kind == "f"

    @property
    def is_complex(self) -> builtins.bool:
        """True for complex32/64/128."""
        return self.kind == "c"

    @property
    def is_signed(self) -> builtins.bool:
        """PyTorch's ``is_signed``: False for bool, unsigned integers and float8_e8m0fnu."""
        return self.kind in "ifc" and self.name != "float8_e8m0fnu"

    @property
    def bits(self) -> builtins.int:
        """Bits per element (8 * itemsize)."""
        return 8 * self.itemsize


def _native(typestr: str, itemsize: builtins.int) -> str:
    """A typestr in native byte order (``|`` for single bytes, which have none)."""
    return ("|" if itemsize == 1 else BYTE_ORDER_CHAR) + typestr


def _spec(
    name: str,
    itemsize: builtins.int,
    kind: str,
    fmt: str | None,
    typestr: str | None,
    code: builtins.int,
    *,
    arrow: str | None = None,
    torch: str | None = None,
    ml_dtypes: builtins.bool = False,
    c_type: str | None = None,
    bits: builtins.int | None = None,
    lanes: builtins.int = 1,
) -> DType:
    return DType._define(
        name,
        itemsize,
        kind,
        fmt,
        None if typestr is None else _native(typestr, itemsize),
        (code, 8 * itemsize if bits is None else bits, lanes),
        arrow=None if arrow is None else arrow.encode(),
        torch_name=torch,
        ml_dtypes=name if ml_dtypes else None,
        c_type=c_type,
    )


# The one list. Order is PyTorch's promotion-free listing order; nothing depends on it.
_SPECS: Final[tuple[DType, ...]] = (
    # Arrow formats: the C data interface's fixed-width primitives. Arrow's bool ("b") is
    # bit-packed, not one byte per value, so bool has none here.
    _spec("bool", 1, "b", "?", "b1", _BOOL, torch="Bool"),
    _spec("uint8", 1, "u", "B", "u1", _UINT, arrow="C", torch="Byte", c_type="uint8_t"),
    _spec("uint16", 2, "u", "H", "u2", _UINT, arrow="S", torch="UInt16", c_type="uint16_t"),
    _spec("uint32", 4, "u", "I", "u4", _UINT, arrow="I", torch="UInt32", c_type="uint32_t"),
    _spec("uint64", 8, "u", "Q", "u8", _UINT, arrow="L", torch="UInt64", c_type="uint64_t"),
    _spec("int8", 1, "i", "b", "i1", _INT, arrow="c", torch="Char", c_type="int8_t"),
    _spec("int16", 2, "i", "h", "i2", _INT, arrow="s", torch="Short", c_type="int16_t"),
    _spec("int32", 4, "i", "i", "i4", _INT, arrow="i", torch="Int", c_type="int"),
    _spec("int64", 8, "i", "q", "i8", _INT, arrow="l", torch="Long", c_type="int64_t"),
    _spec("float16", 2, "f", "e", "f2", _FLOAT, arrow="e", torch="Half", c_type="c10::Half"),
    _spec(
        "bfloat16",
        2,
        "f",
        None,
        None,
        _BFLOAT,
        torch="BFloat16",
        ml_dtypes=True,
        c_type="c10::BFloat16",
    ),
    _spec("float32", 4, "f", "f", "f4", _FLOAT, arrow="f", torch="Float", c_type="float"),
    _spec("float64", 8, "f", "d", "f8", _FLOAT, arrow="g", torch="Double", c_type="double"),
    _spec(
        "complex32",
        4,
        "c",
        None,
        None,
        _COMPLEX,
        torch="ComplexHalf",
        ml_dtypes=True,
        c_type="c10::complex<c10::Half>",
    ),
    _spec(
        "complex64",
        8,
        "c",
        "Zf",
        "c8",
        _COMPLEX,
        torch="ComplexFloat",
        c_type="c10::complex<float>",
    ),
    _spec(
        "complex128",
        16,
        "c",
        "Zd",
        "c16",
        _COMPLEX,
        torch="ComplexDouble",
        c_type="c10::complex<double>",
    ),
    # The float8 formats PyTorch lacks name the ml_dtypes type whose limits apply as their C type.
    _spec("float8_e3m4", 1, "f", None, None, 7, ml_dtypes=True, c_type="ml_dtypes.float8_e3m4"),
    _spec("float8_e4m3", 1, "f", None, None, 8, ml_dtypes=True, c_type="ml_dtypes.float8_e4m3"),
    _spec(
        "float8_e4m3b11fnuz",
        1,
        "f",
        None,
        None,
        9,
        ml_dtypes=True,
        c_type="ml_dtypes.float8_e4m3b11fnuz",
    ),
    _spec("float8_e4m3fn", 1, "f", None, None, 10, ml_dtypes=True, c_type="c10::Float8_e4m3fn"),
    _spec("float8_e4m3fnuz", 1, "f", None, None, 11, ml_dtypes=True, c_type="c10::Float8_e4m3fnuz"),
    _spec("float8_e5m2", 1, "f", None, None, 12, ml_dtypes=True, c_type="c10::Float8_e5m2"),
    _spec("float8_e5m2fnuz", 1, "f", None, None, 13, ml_dtypes=True, c_type="c10::Float8_e5m2fnuz"),
    _spec("float8_e8m0fnu", 1, "f", None, None, 14, ml_dtypes=True, c_type="c10::Float8_e8m0fnu"),
    # PyTorch's packed pair of FP4 values: one byte, exported as (kDLFloat4_e2m1fn, 4, 2).
    _spec("float4_e2m1fn_x2", 1, "f", None, None, 17, bits=4, lanes=2),
)


def _derive_raw_encodings() -> None:
    """Give each dtype the encodings of its raw bits: those of the unsigned integer of its size."""
    unsigned = {d.itemsize: d for d in _SPECS if d.kind == "u"}
    for d in _SPECS:
        raw = unsigned.get(d.itemsize)
        fmt = d.format if d.format is not None else raw.format if raw is not None else None
        if fmt is None:  # no dtype of the list lacks both
            msg = f"dtype {d.name} has no buffer format and no unsigned integer of its size"
            raise AssertionError(msg)
        object.__setattr__(d, "buffer_format", fmt.encode())
        object.__setattr__(d, "raw_typestr", None if raw is None else raw.typestr)


_derive_raw_encodings()

bool: Final = DType._interned["bool"]
uint8: Final = DType._interned["uint8"]
uint16: Final = DType._interned["uint16"]
uint32: Final = DType._interned["uint32"]
uint64: Final = DType._interned["uint64"]
int8: Final = DType._interned["int8"]
int16: Final = DType._interned["int16"]
int32: Final = DType._interned["int32"]
int64: Final = DType._interned["int64"]
float16: Final = DType._interned["float16"]
bfloat16: Final = DType._interned["bfloat16"]
float32: Final = DType._interned["float32"]
float64: Final = DType._interned["float64"]
complex32: Final = DType._interned["complex32"]
complex64: Final = DType._interned["complex64"]
complex128: Final = DType._interned["complex128"]
float8_e3m4: Final = DType._interned["float8_e3m4"]
float8_e4m3: Final = DType._interned["float8_e4m3"]
float8_e4m3b11fnuz: Final = DType._interned["float8_e4m3b11fnuz"]
float8_e4m3fn: Final = DType._interned["float8_e4m3fn"]
float8_e4m3fnuz: Final = DType._interned["float8_e4m3fnuz"]
float8_e5m2: Final = DType._interned["float8_e5m2"]
float8_e5m2fnuz: Final = DType._interned["float8_e5m2fnuz"]
float8_e8m0fnu: Final = DType._interned["float8_e8m0fnu"]
float4_e2m1fn_x2: Final = DType._interned["float4_e2m1fn_x2"]

# PyTorch's aliases.
half: Final = float16
float: Final = float32
double: Final = float64
short: Final = int16
int: Final = int32
long: Final = int64
chalf: Final = complex32
cfloat: Final = complex64
cdouble: Final = complex128

ALL_DTYPES: Final[tuple[DType, ...]] = _SPECS
BY_NAME: Final[dict[str, DType]] = {
    **{d.name: d for d in _SPECS},
    "half": half,
    "float": float,
    "double": double,
    "short": short,
    "int": int,
    "long": long,
    "chalf": chalf,
    "cfloat": cfloat,
    "cdouble": cdouble,
}
BY_DLPACK: Final[dict[tuple[builtins.int, builtins.int, builtins.int], DType]] = {
    d.dlpack: d for d in _SPECS
}
BY_TYPESTR: Final[dict[str, DType]] = {d.typestr[1:]: d for d in _SPECS if d.typestr is not None}
BY_ARROW_FORMAT: Final[dict[bytes, DType]] = {d.arrow: d for d in _SPECS if d.arrow is not None}


def _format_table() -> dict[str, DType]:
    """Buffer-protocol format characters (native sizes) -> dtype, including C aliases like 'l'."""
    import struct

    table: dict[str, DType] = {d.format: d for d in _SPECS if d.format is not None}
    for char, kind in (("c", "u"), ("l", "i"), ("L", "u"), ("n", "i"), ("N", "u"), ("P", "u")):
        size = struct.calcsize(char)
        table[char] = next(d for d in _SPECS if d.kind == kind and d.itemsize == size)
    return table


BY_FORMAT: Final[dict[str, DType]] = _format_table()


def from_format(fmt: str) -> DType | None:
    """The dtype of a buffer-protocol format string, or None if it has none.

    Accepts native-order formats with an optional ``@``, ``=`` or the native ``<``/``>`` prefix;
    a non-native byte order returns None (the caller reports it).
    """
    if fmt and fmt[0] in "@=<>!":
        prefix, fmt = fmt[0], fmt[1:]
        if prefix in "<>!" and (prefix == "!" or prefix != BYTE_ORDER_CHAR):
            return None
        if prefix in "=<>" and fmt in ("l", "L") and BY_FORMAT[fmt].itemsize != 4:
            return int32 if fmt == "l" else uint32  # standard sizes: 'l' is 4 bytes
    return BY_FORMAT.get(fmt)


def result_kind_order(dtype: DType) -> builtins.int:
    """Rank of the dtype's category for PyTorch's type promotion: bool < int < float < complex."""
    return "buifc".index(dtype.kind) if dtype.kind != "u" else 1


# PyTorch promotes these only with themselves and with floating types (c10/core/ScalarType.cpp).
_BARELY_PROMOTED: Final = frozenset({uint16, uint32, uint64})
_COMPLEX_OF: Final = {float16: complex32, float32: complex64, float64: complex128}
_REAL_OF: Final = {c: f for f, c in _COMPLEX_OF.items()}


def _is_float8(dtype: DType) -> builtins.bool:
    return dtype.kind == "f" and dtype.itemsize == 1 and dtype is not float4_e2m1fn_x2


def promote_types(a: DType, b: DType, api: str) -> DType:
    """PyTorch's ``promote_types`` (c10/core/ScalarType.cpp ``promoteTypes``), with its refusals."""
    if a is b:
        return a
    refused = None
    if _is_float8(a) or _is_float8(b):
        refused = "Float8 Types"
    elif a in _BARELY_PROMOTED or b in _BARELY_PROMOTED:
        if a.kind == "f" or b.kind == "f":  # the one promotion PyTorch defines for them
            return a if a.kind == "f" else b
        refused = "uint16, uint32, uint64 types"
    elif float4_e2m1fn_x2 in (a, b):
        refused = "Float4 types"
    if refused is not None:
        msg = (
            f"{api}(): Promotion for {refused} is not supported, attempted to promote {a} and {b}. "
            f"Pass dtype= explicitly."
        )
        raise TypeError(msg)
    if a.kind == "b" or b.kind == "b":
        return b if a.kind == "b" else a
    category = {"i": 0, "u": 0, "f": 1, "c": 2}
    lo, hi = sorted((a, b), key=lambda d: (category[d.kind], d.itemsize))
    if hi.kind == "c":
        # The complex result must hold the real operand's precision: complex64 + float64 -> complex128.
        real = promote_types(lo, _REAL_OF[hi], api) if lo.kind in "fc" else _REAL_OF[hi]
        return _COMPLEX_OF[_REAL_OF.get(real, real)]
    if hi.kind == "f":
        return (
            float32 if lo.kind == "f" and lo.itemsize == hi.itemsize else hi
        )  # float16 + bfloat16
    if uint8 not in (a, b):  # two signed ints
        return hi
    signed = b if a is uint8 else a
    return signed if signed.itemsize > 1 else int16  # uint8 + int8 -> int16


def as_dtype(value: object, api: str, argname: str = "dtype") -> DType:
    """Validate a ``dtype=`` argument: a `DType`, or any form `DType` lists.

    Raises:
        TypeError: ``value`` is not a dtype, or names one tensorbridge does not have.
    """
    if isinstance(value, DType):
        return value
    dtype = foreign_dtype(value, api, argname)
    if dtype is None:
        msg = (
            f"{api}(): argument '{argname}' must be tensorbridge.dtype, not {type(value).__name__}; "
            f"got {value!r}. Pass one of tensorbridge.float32, tensorbridge.int64, ..., its name, "
            f"or a NumPy, ml_dtypes, JAX, PyTorch, TensorFlow, PaddlePaddle or array-api-strict dtype."
        )
        raise TypeError(msg)
    return dtype


# The dtypes by their own names (no aliases): how the libraries below name them too.
_CANONICAL: Final[dict[str, DType]] = {d.name: d for d in _SPECS}
BY_ML_DTYPES: Final[dict[str, DType]] = {d.ml_dtypes: d for d in _SPECS if d.ml_dtypes is not None}

# A NumPy typestr: byte order, kind, size in bytes, and a datetime unit.
_TYPESTR: Final = re.compile(r"([<>=|]?)([a-zA-Z])(\d*)(\[\w+\])?")

# The NumPy kinds that hold no numbers, as a refusal describes them.
_NOT_NUMBERS: Final = {
    "U": "a unicode string dtype",
    "S": "a bytes dtype",
    "a": "a bytes dtype",
    "O": "an object dtype",
    "V": "a structured or void dtype",
    "M": "a datetime dtype",
    "m": "a timedelta dtype",
}


def _torch_name(value: Any) -> str | None:
    return str(value).removeprefix("torch.") if type(value).__name__ == "dtype" else None


def _tensorflow_name(value: Any) -> str | None:
    return str(value.name) if type(value).__name__ == "DType" else None


def _paddle_name(value: Any) -> str | None:
    # Paddle 3's dtypes are the DataType enum (FLOAT32, BFLOAT16); the VarType enum spells them
    # FP32, BF16. Their str() is not the dtype: str(paddle.uint16) is 'paddle.bfloat16'.
    if type(value).__name__ not in ("dtype", "DataType", "VarType"):
        return None
    name: str = value.name.lower()
    return "bfloat16" if name == "bf16" else "float" + name[2:] if name.startswith("fp") else name


def _array_api_strict_name(value: Any) -> str | None:
    # Its DType has no public name attribute; its repr is the namespace's name for it.
    name = repr(value)
    return name.removeprefix("array_api_strict.") if type(value).__name__ == "DType" else None


# The libraries whose dtypes are read by name, by the top-level module their dtype type is in.
_NAME_READERS: Final = {
    "torch": _torch_name,
    "tensorflow": _tensorflow_name,
    "paddle": _paddle_name,
    "array_api_strict": _array_api_strict_name,
}


def foreign_dtype(value: Any, api: str, argname: str = "dtype") -> DType | None:
    """The dtype a string or another library's dtype stands for (`DType` lists the forms).

    Returns None for a value that is no dtype, so that a caller reading positional arguments
    (``view(dtype)``, ``to(dtype)``) can try it; raises TypeError for a dtype tensorbridge lacks.
    Imports nothing: NumPy's types are looked for only when NumPy is loaded, and the others are
    known by the module of their type.
    """
    if isinstance(value, str):
        name = value.removeprefix("tensorbridge.").removeprefix("torch.")
        if name in BY_NAME:
            return BY_NAME[name]
        match = _TYPESTR.fullmatch(value)
        if match is None:
            return None
        order, kind, size, _ = match.groups()
        return _from_typestr(order, kind, size, value, api, argname)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        described = value
        if isinstance(value, type):  # a scalar type: NumPy's, ml_dtypes', JAX's (jnp.float32)
            generic = issubclass(value, numpy.generic)
            described = numpy.dtype(value) if generic else getattr(value, "dtype", None)
        if isinstance(described, numpy.dtype):
            if described.type.__module__ == "ml_dtypes":
                dtype = BY_ML_DTYPES.get(described.name)
            else:
                order, kind, size = described.byteorder, described.kind, described.itemsize
                dtype = _from_typestr(order, kind, size, described, api, argname)
            return dtype if dtype is not None else _no_equivalent(described, api, argname)
    read = _NAME_READERS.get(type(value).__module__.partition(".")[0])
    found = None if read is None else read(value)
    if found is None:
        return None
    return _CANONICAL[found] if found in _CANONICAL else _no_equivalent(value, api, argname)


def _from_typestr(
    order: str, kind: str, size: object, value: object, api: str, argname: str
) -> DType | None:
    """The dtype of a NumPy typestr's parts; None for a number type tensorbridge lacks."""
    if kind in _NOT_NUMBERS:
        hint = " (view the data as int64 first)" if kind in "Mm" else ""
        _refuse(
            api,
            argname,
            value,
            f"is {_NOT_NUMBERS[kind]}, and tensorbridge holds numbers and bools only",
            f"Pass a numeric dtype such as tensorbridge.float32 or tensorbridge.int64{hint}",
        )
    dtype = BY_TYPESTR.get(f"{kind}{size}")
    if (
        dtype is not None
        and dtype.itemsize > 1
        and order in ("<", ">")
        and order != BYTE_ORDER_CHAR
    ):
        native = dtype.typestr
        _refuse(
            api,
            argname,
            value,
            f"is {'big' if order == '>' else 'little'}-endian, and tensorbridge reads the native "
            f"byte order only",
            f"Pass {native!r} and byte-swap the data first "
            f"(NumPy: a.byteswap().view(a.dtype.newbyteorder()))",
        )
    return dtype


def _no_equivalent(value: object, api: str, argname: str) -> NoReturn:
    _refuse(
        api,
        argname,
        value,
        "has no tensorbridge equivalent",
        "Pass one of tensorbridge's dtypes, or an unsigned integer of the same size to carry the "
        "raw bits",
    )


def _refuse(api: str, argname: str, value: object, what: str, fix: str) -> NoReturn:
    msg = f"{api}(): argument '{argname}' {what}; got {value!r}. {fix}."
    raise TypeError(msg)


def to_numpy(dtype: DType) -> Any:
    """NumPy's dtype for ``dtype``: ml_dtypes' for bfloat16, complex32 and float8 (imported here).

    Raises:
        TypeError: NumPy has no such dtype: ml_dtypes is missing, too old, or (float4_e2m1fn_x2,
            two values in one byte) none exists.
    """
    import numpy

    if dtype.typestr is not None:
        return numpy.dtype(dtype.typestr)
    return numpy.dtype(ml_dtypes_type(dtype, f"numpy.dtype({dtype!r})", "tensorbridge.uint{bits}"))


def ml_dtypes_type(dtype: DType, api: str, raw: str) -> Any:
    """The ml_dtypes scalar type NumPy knows ``dtype`` by (bfloat16, complex32, float8, ...).

    ``api`` names the call in the refusal, and ``raw`` (formatted with ``bits``) is how to view
    the raw bits instead.

    Raises:
        TypeError: NumPy has no such dtype: ml_dtypes is missing, too old, or (float4_e2m1fn_x2,
            two values in one byte) none exists.
    """
    if dtype.ml_dtypes is None or dtype.raw_typestr is None:
        msg = (
            f"{api}: NumPy has no dtype for {dtype} (two 4-bit values per byte); view the raw "
            f"bytes with {raw.format(bits=8)}."
        )
        raise TypeError(msg)
    try:
        # Not an import statement: compiled, that returns the None with which sys.modules blocks
        # a module, where the import system raises ImportError (as it does for the source).
        ml_dtypes = importlib.import_module("ml_dtypes")
    except ImportError:
        msg = (
            f"{api}: NumPy has no {dtype.name} dtype; install ml_dtypes (pip install ml_dtypes), "
            f"which gives it one, or view the raw bits with {raw.format(bits=dtype.bits)}."
        )
        raise TypeError(msg) from None
    ml_type = getattr(ml_dtypes, dtype.ml_dtypes, None)
    if ml_type is None:  # older ml_dtypes lack the newer types (0.5 has no complex32)
        version = getattr(ml_dtypes, "__version__", "?")
        msg = (
            f"{api}: NumPy has no {dtype.name} dtype, and the installed ml_dtypes {version} has "
            f"none either; upgrade ml_dtypes (pip install -U ml_dtypes), or view the raw bits "
            f"with {raw.format(bits=dtype.bits)}."
        )
        raise TypeError(msg)
    return ml_type
