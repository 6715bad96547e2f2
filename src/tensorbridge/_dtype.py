"""Data types: one interned `DType` per element type, every foreign encoding derived from one list.

Each dtype carries what the protocols need to name it: the buffer-protocol format character, the
``__array_interface__`` typestr, and the DLPack ``(code, bits, lanes)`` triple. Every lookup table in
this module is derived from the single list `_SPECS`, so adding a dtype is one line.
"""

from __future__ import annotations

import builtins
import sys
from typing import Any, Final

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

_BYTE_ORDER: Final = "<" if sys.byteorder == "little" else ">"

# DLDataTypeCode values (dlpack.h v1.3); the C spellings live in _dlpack_abi, these are the numbers.
_INT, _UINT, _FLOAT, _BFLOAT, _COMPLEX, _BOOL = 0, 1, 2, 4, 5, 6


class DType:
    """An element type, as PyTorch names it (``tensorbridge.float32``).

    Instances are interned: there is exactly one object per dtype, compared by identity, and
    pickling returns that same object.

    Attributes:
        name: PyTorch's name without the module (``"float32"``).
        itemsize: bytes per element (a packed ``float4_e2m1fn_x2`` element holds two values in one byte).
        kind: ``"b"`` bool, ``"u"`` unsigned, ``"i"`` signed integer, ``"f"`` real floating, ``"c"`` complex.
        format: the buffer-protocol (struct) format character, or None where Python has none.
        typestr: the ``__array_interface__`` typestr in native byte order, or None where NumPy has none.
        dlpack: the DLPack ``(code, bits, lanes)`` triple.
    """

    __slots__ = ("dlpack", "format", "itemsize", "kind", "name", "typestr")

    _interned: Final[dict[str, DType]] = {}

    name: str
    itemsize: builtins.int
    kind: str
    format: str | None
    typestr: str | None
    dlpack: tuple[builtins.int, builtins.int, builtins.int]

    def __new__(
        cls,
        name: str,
        itemsize: builtins.int,
        kind: str,
        fmt: str | None,
        typestr: str | None,
        dlpack: tuple[builtins.int, builtins.int, builtins.int],
    ) -> DType:
        if name in cls._interned:
            return cls._interned[name]
        self = super().__new__(cls)
        for attr, value in (
            ("name", name),
            ("itemsize", itemsize),
            ("kind", kind),
            ("format", fmt),
            ("typestr", typestr),
            ("dlpack", dlpack),
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


def _spec(
    name: str,
    itemsize: builtins.int,
    kind: str,
    fmt: str | None,
    typestr: str | None,
    code: builtins.int,
    bits: builtins.int | None = None,
    lanes: builtins.int = 1,
) -> DType:
    if typestr is not None:
        typestr = ("|" if itemsize == 1 else _BYTE_ORDER) + typestr
    return DType(
        name, itemsize, kind, fmt, typestr, (code, 8 * itemsize if bits is None else bits, lanes)
    )


# The one list. Order is PyTorch's promotion-free listing order; nothing depends on it.
_SPECS: Final[tuple[DType, ...]] = (
    _spec("bool", 1, "b", "?", "b1", _BOOL),
    _spec("uint8", 1, "u", "B", "u1", _UINT),
    _spec("uint16", 2, "u", "H", "u2", _UINT),
    _spec("uint32", 4, "u", "I", "u4", _UINT),
    _spec("uint64", 8, "u", "Q", "u8", _UINT),
    _spec("int8", 1, "i", "b", "i1", _INT),
    _spec("int16", 2, "i", "h", "i2", _INT),
    _spec("int32", 4, "i", "i", "i4", _INT),
    _spec("int64", 8, "i", "q", "i8", _INT),
    _spec("float16", 2, "f", "e", "f2", _FLOAT),
    _spec("bfloat16", 2, "f", None, None, _BFLOAT),
    _spec("float32", 4, "f", "f", "f4", _FLOAT),
    _spec("float64", 8, "f", "d", "f8", _FLOAT),
    _spec("complex32", 4, "c", None, None, _COMPLEX),
    _spec("complex64", 8, "c", "Zf", "c8", _COMPLEX),
    _spec("complex128", 16, "c", "Zd", "c16", _COMPLEX),
    _spec("float8_e3m4", 1, "f", None, None, 7),
    _spec("float8_e4m3", 1, "f", None, None, 8),
    _spec("float8_e4m3b11fnuz", 1, "f", None, None, 9),
    _spec("float8_e4m3fn", 1, "f", None, None, 10),
    _spec("float8_e4m3fnuz", 1, "f", None, None, 11),
    _spec("float8_e5m2", 1, "f", None, None, 12),
    _spec("float8_e5m2fnuz", 1, "f", None, None, 13),
    _spec("float8_e8m0fnu", 1, "f", None, None, 14),
    # PyTorch's packed pair of FP4 values: one byte, exported as (kDLFloat4_e2m1fn, 4, 2).
    _spec("float4_e2m1fn_x2", 1, "f", None, None, 17, bits=4, lanes=2),
)

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
        if prefix in "<>!" and (prefix == "!" or prefix != _BYTE_ORDER):
            return None
        if prefix in "=<>" and fmt in ("l", "L") and BY_FORMAT[fmt].itemsize != 4:
            return int32 if fmt == "l" else uint32  # standard sizes: 'l' is 4 bytes
    return BY_FORMAT.get(fmt)


def result_kind_order(dtype: DType) -> builtins.int:
    """Rank of the dtype's category for PyTorch's type promotion: bool < int < float < complex."""
    return "buifc".index(dtype.kind) if dtype.kind != "u" else 1


def as_dtype(value: object, api: str, argname: str = "dtype") -> DType:
    """Validate a ``dtype=`` argument: a `DType`, or the name of one (``"float32"``)."""
    if isinstance(value, DType):
        return value
    if (
        isinstance(value, str)
        and value.removeprefix("tensorbridge.").removeprefix("torch.") in BY_NAME
    ):
        return BY_NAME[value.removeprefix("tensorbridge.").removeprefix("torch.")]
    msg = (
        f"{api}(): argument '{argname}' must be tensorbridge.dtype, not {type(value).__name__}; "
        f"got {value!r}. Pass one of tensorbridge.float32, tensorbridge.int64, ..."
    )
    raise TypeError(msg)
