"""Element codec: one encoder/decoder per dtype between native bytes and Python values.

Everything that reads or writes elements (item, tolist, repr, fill_, __setitem__, copies between
dtypes) goes through `unpack`, `pack`, `convert` and `check_scalar`, so a value converts the same
way wherever it is written. Pure Python: `array`, `memoryview.cast` and `struct` for the formats
Python knows; bfloat16 by 16-bit shifts of float32 patterns; 8-bit floats through 256-entry decode
tables and 65536-entry encode tables (indexed by float32 patterns), each built once, on first use.

Cast rules (PyTorch 2.13 on the CPU, checked in tests/test_codec.py against torch and in
tests/test_codec_exact.py against exact rational references):

* Decoding: bool -> bool (any non-zero byte is True), integers -> int, real floats -> float,
  complex32/64/128 -> complex. ``float4_e2m1fn_x2`` decodes to the raw byte (an int in [0, 255]):
  PyTorch's ``tolist()``/``item()`` refuse that dtype and its repr prints the byte value.
* To float64: exact for floats; ints round to nearest even.
* To float32: round to nearest even, overflow -> inf. Ints round once (2**60 + 2**36 + 1 ->
  2**60 + 2**37, as C's int64 -> float; not via float64).
* To float16, bfloat16 and the 8-bit floats PyTorch has (float8_e4m3fn, float8_e4m3fnuz,
  float8_e5m2, float8_e5m2fnuz, float8_e8m0fnu): the value is first rounded to float32 (nearest
  even; an int is rounded once, to 24 bits), then to the target (nearest even). This double
  rounding is PyTorch's (c10's constructors take a float) and tensorbridge follows it. It
  differs from rounding the value once exactly when the value is not a float32 but rounds to a
  float32 on which the target's rounding changes: a tie between two neighbouring target values,
  or the overflow threshold (for float8_e8m0fnu, 1.5 * 2**e and 2**-127). The second rounding
  then breaks the tie (to even, or to overflow) instead of rounding towards the side the value
  lies on; e.g. the float64 1.0625 * (1 + 2**-30) gives float8_e4m3fn 1.0 where rounding once
  gives 1.125, and (1 + 2**-11) * (1 + 2**-30) gives float16 1.0, not 1 + 2**-10. Values float32
  holds exactly (float32, float16, bfloat16 and 8-bit inputs, ints up to 2**24) round once.
  Overflow: float16, bfloat16, float8_e5m2 -> inf; float8_e4m3fn saturates to +-448 (inf too);
  float8_e4m3fnuz/e5m2fnuz -> NaN (0x80), and -0.0 -> +0. NaN is written canonically, keeping
  its sign except in bfloat16 (0x7FC0) and the fnuz formats (0x80): what PyTorch writes for a
  float64 nan (its NaN payloads vary with the kernel path; payloads are not preserved).
  float8_e8m0fnu ignores the sign, maps 0 to 2**-127 and rounds like c10: half-way mantissas
  round up for float32 normals, down for float32 subnormals; inf, NaN and overflow -> NaN (0xFF).
* To float8_e3m4, float8_e4m3 and float8_e4m3b11fnuz (PyTorch lacks them): the exact value
  (a float64, or an int as it is) is rounded once to the nearest representable value, ties to
  even. float8_e3m4 and float8_e4m3 overflow to inf from their thresholds 15.75 and 248 on;
  float8_e4m3b11fnuz takes overflow (from 31 on) and inf to NaN (0x80), and -0.0 to +0. NaN is
  written as 0x78 (float8_e3m4) or 0x7C (float8_e4m3) with its sign, 0x80 for
  float8_e4m3b11fnuz. The overflow and NaN encodings are ml_dtypes'; so is single rounding from
  float64 as of ml_dtypes 0.7 (earlier releases rounded through float32).
* To integers: ints wrap modulo 2**bits. Floats truncate toward zero; where the result does not
  fit, C++ leaves the conversion undefined and PyTorch's results depend on the build, so this
  codec chooses one rule: truncate, then wrap modulo 2**bits; NaN and +-inf give 0. (It agrees with
  PyTorch on x86-64 wherever PyTorch wraps, e.g. 300.7 -> int8 44, -1.5 -> uint8 255.)
* To bool: ``value != 0``; NaN is True; a complex value is True when either part is non-zero.
* Complex -> real keeps the real part. PyTorch warns here; this codec does not.
* Real -> complex: imaginary part 0. complex32 is a pair of float16 (each part via float32), and
  complex64 a pair of float32.
* ``float4_e2m1fn_x2`` takes raw byte values (ints wrap modulo 256); floats and complex raise
  `NotImplementedError`, as PyTorch has no conversion to that dtype.

Writing a Python scalar (fill_, full, ``t[i] = v``) first calls `check_scalar`, which raises what
PyTorch raises for values the target cannot hold.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, Final, NamedTuple, SupportsComplex, SupportsFloat, SupportsIndex

from . import _dtype
from ._dtype import BYTE_ORDER, DType

__all__ = ["check_scalar", "convert", "pack", "unpack"]

Number = bool | int | float | complex
_Buffer = bytes | bytearray | memoryview

_INF: Final = math.inf
_NAN: Final = math.nan
# Ints up to this magnitude convert to float64 exactly, so a float32 made from the float64 is
# rounded once.
_EXACT_INT: Final = 1 << 53
_REALS: Final = frozenset((float, int, bool))
_NUMBERS: Final = frozenset((float, int, bool, complex))
_real_part: Final = attrgetter("real")
_imag_part: Final = attrgetter("imag")


# --------------------------------------------------------------------------------------------
# Scalar helpers
# --------------------------------------------------------------------------------------------


_NUMPY_BOOL_NAMES: Final = frozenset({"bool_", "bool"})


def _as_number(value: object) -> Number:
    """A built-in number for `value`: itself, or its ``__index__``/``__float__``/``__complex__``."""
    if isinstance(value, (int, float, complex)):  # bool is an int
        return value
    # NumPy registers its scalars with the numbers ABCs, which tell a complex scalar (that also
    # has a lossy __float__) from a real one; the protocols catch other number-like objects
    # (str has no __float__, so strings are refused).
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, numbers.Complex):
        return complex(value)
    if type(value).__name__ in _NUMPY_BOOL_NAMES and type(value).__module__ == "numpy":
        # NumPy's bool scalar is no numbers.Integral, and its __index__ warns (NumPy 1.x) or
        # raises (NumPy 2): it is a bool.
        return bool(value)
    converters: tuple[tuple[type, Callable[[Any], Number]], ...] = (
        (SupportsIndex, operator.index),
        (SupportsFloat, float),
        (SupportsComplex, complex),
    )
    for protocol, converter in converters:
        if isinstance(value, protocol):
            with contextlib.suppress(TypeError):  # numpy.bool_ has an __index__ that raises
                return converter(value)
    msg = (
        f"tensorbridge: expected a Python number (bool, int, float or complex); got "
        f"{value!r} of type {type(value).__name__}. Convert the value to a number first."
    )
    raise TypeError(msg)


def _values_list(values: Sequence[Any]) -> list[Any] | tuple[Any, ...]:
    """`values` itself if a list or tuple (the codecs read it several times), else a list."""
    return values if isinstance(values, (list, tuple)) else list(values)


def _int_to_float(value: int, digits: int) -> float:
    """`value` rounded to `digits` significant bits, nearest even, as a float (inf past float64)."""
    magnitude = abs(value)
    shift = magnitude.bit_length() - digits
    if shift > 0:
        kept, rest = magnitude >> shift, magnitude & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rest > half or (rest == half and kept & 1):
            kept += 1
        magnitude = kept << shift
    try:
        result = float(magnitude)
    except OverflowError:
        result = _INF
    return -result if value < 0 else result


def _to_float64(value: object) -> float:
    """The float64 PyTorch stores for `value` (complex keeps the real part)."""
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        return _int_to_float(value, 53)
    if isinstance(value, complex):
        return value.real
    return _to_float64(_as_number(value))


def _to_float32(value: object) -> float:
    """A float whose C cast to float gives PyTorch's float32 for `value`.

    Floats pass through (the cast rounds them); ints are pre-rounded to 24 bits, because the cast
    of an int via float64 would round twice.
    """
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        return float(value) if -_EXACT_INT <= value <= _EXACT_INT else _int_to_float(value, 24)
    if isinstance(value, complex):
        return value.real
    return _to_float32(_as_number(value))


def _to_int(value: object) -> int:
    """Truncate toward zero; NaN and +-inf give 0 (the documented out-of-range rule)."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else 0
    if isinstance(value, complex):
        return _to_int(value.real)
    return _to_int(_as_number(value))


def _to_bool(value: object) -> bool:
    return bool(_as_number(value))  # a number's truth is value != 0 (NaN is true)


def _lanes(value: int, count: int, width: int = 4) -> int:
    """A big int holding `count` native-order lanes of `width` bytes, each equal to `value`."""
    return int.from_bytes(value.to_bytes(width, BYTE_ORDER) * count, BYTE_ORDER)


def _high_halves(lanes: bytes) -> memoryview:
    """The upper 16 bits of each native uint32 in `lanes`, as a strided 'H' view."""
    halves = memoryview(lanes).cast("H")
    return halves[1::2] if BYTE_ORDER == "little" else halves[0::2]


# --------------------------------------------------------------------------------------------
# Codecs
# --------------------------------------------------------------------------------------------


class _Codec:
    """Bytes <-> Python values for one dtype.

    `decode` receives a 1-D 'B' memoryview of exactly ``n * itemsize`` bytes, possibly unaligned;
    `encode` a list or tuple of arbitrary numbers.
    """

    __slots__ = ()

    def decode(self, data: memoryview) -> list[Any]:
        raise NotImplementedError

    def encode(self, values: list[Any] | tuple[Any, ...]) -> bytes:
        raise NotImplementedError


class _BoolCodec(_Codec):
    __slots__ = ()

    def decode(self, data: memoryview) -> list[Any]:
        return list(map(bool, data))

    def encode(self, values: list[Any] | tuple[Any, ...]) -> bytes:
        if set(map(type, values)) <= _NUMBERS:
            return bytes(map(bool, values))
        return bytes(map(_to_bool, values))


class _IntCodec(_Codec):
    """Fixed-width integers through `array`; out-of-range ints wrap modulo 2**bits."""

    __slots__ = ("_fmt", "_mask", "_offset")

    def __init__(self, dtype: DType) -> None:
        fmt = dtype.format
        if fmt is None or array(fmt).itemsize != dtype.itemsize:  # no CPython platform does this
            msg = f"tensorbridge: this platform's array({fmt!r}) does not match {dtype!r}"
            raise RuntimeError(msg)
        self._fmt = fmt
        self._mask = (1 << dtype.bits) - 1
        self._offset = 1 << (dtype.bits - 1) if dtype.kind == "i" else 0

    def decode(self, data: memoryview) -> list[Any]:
        return data.cast(self._fmt).tolist()  # type: ignore[call-overload]

    def encode(self, values: list[Any] | tuple[Any, ...]) -> bytes:
        try:
            # Exact when every value is an int in range; floats and overflow raise. NumPy 1.x's
            # bool scalars warn as they are read as indices: with warnings as errors, they take
            # the slow path too.
            return array(self._fmt, values).tobytes()
        except (TypeError, OverflowError, DeprecationWarning):
            return array(self._fmt, map(self._wrap, values)).tobytes()

    def _wrap(self, value: object) -> int:
        return ((_to_int(value) + self._offset) & self._mask) - self._offset


class _RawByteCodec(_IntCodec):
    """float4_e2m1fn_x2: PyTorch neither converts to nor decodes it, so bytes stay bytes."""

    __slots__ = ()

    def _wrap(self, value: object) -> int:
        number = _as_number(value)
        if isinstance(number, (float, complex)):
            msg = (
                f"tensorbridge: cannot convert {number!r} to tensorbridge.float4_e2m1fn_x2 "
                "(PyTorch: \"copy_kernel\" not implemented for 'Float4_e2m1fn_x2'). "
                "Pass the packed byte values as ints in [0, 255]."
            )
            raise NotImplementedError(msg)
        return super()._wrap(number)


class _Float64Codec(_Codec):
    __slots__ = ()

    def decode(self, data: memoryview) -> list[Any]:
        return data.cast("d").tolist()

    def encode(self, values: list[Any] | tuple[Any, ...]) -> bytes:
        if set(map(type, values)) <= _REALS:
            try:
                return array("d", values).tobytes()  # int -> float64 rounds correctly
            except OverflowError:
                pass  # an int past float64: inf, below
        return array("d", map(_to_float64, values)).tobytes()


class _Float32Codec(_Codec):
    __slots__ = ()

    def decode(self, data: memoryview) -> list[Any]:
        return data.cast("f").tolist()

    def encode(self, values: list[Any] | tuple[Any, ...]) -> bytes:
        # array('f') applies C's (float) cast: nearest even, inf past the range.
        types = set(map(type, values))
        if types <= _REALS and (int not in types or _small_ints(values, types)):
            return array("f", values).tobytes()
        return array("f", map(_to_float32, values)).tobytes()


def _small_ints(values: list[Any] | tuple[Any, ...], types: set[type]) -> bool:
    """True when `values` are ints (or bools) that float64 holds exactly."""
    return types <= {int, bool} and min(values) >= -_EXACT_INT and max(values) <= _EXACT_INT


_FLOAT32: Final = _Float32Codec()


class _NarrowFloatCodec(_Codec):
    """A float narrower than float32: encodes from float32 patterns, as c10 does."""

    __slots__ = ()

    def encode(self, values: list[Any] | tuple[Any, ...]) -> bytes:
        return self.encode_float32(_FLOAT32.encode(values))

    def encode_float32(self, data: bytes) -> bytes:
        raise NotImplementedError


class _Float16Codec(_NarrowFloatCodec):
    __slots__ = ()

    def decode(self, data: memoryview) -> list[Any]:
        return list(struct.unpack(f"{len(data) // 2}e", data))

    def encode_float32(self, data: bytes) -> bytes:
        floats = memoryview(data).cast("f").tolist()
        fmt = f"{len(floats)}e"
        try:
            packed = struct.pack(fmt, *floats)  # rounds once from a float32 value: nearest even
        except OverflowError:  # struct refuses finite values that round past 65504
            packed = struct.pack(fmt, *map(_saturate_half, floats))
        return _canonical_half_nans(packed)


def _saturate_half(value: float) -> float:
    return math.copysign(_INF, value) if abs(value) >= 65520.0 else value


def _canonical_half_nans(packed: bytes) -> bytes:
    """Every float16 NaN in ``packed`` as c10 writes one: 0x7E00, its sign kept. struct's ``e``
    gives that before Python 3.14 and keeps (the top bits of) a NaN's payload from 3.14 on."""
    count = len(packed) // 2
    bits = int.from_bytes(packed, BYTE_ORDER)
    # Lane-wise magnitude > 0x7C00 (NaN) sets bit 15; no lane can carry into the next.
    nan = ((bits & _lanes(0x7FFF, count, 2)) + _lanes(0x03FF, count, 2)) & _lanes(0x8000, count, 2)
    if not nan:
        return packed
    whole = (nan >> 15) * 0xFFFF
    canonical = (bits & _lanes(0x8000, count, 2)) | _lanes(0x7E00, count, 2)
    return ((bits & ~whole) | (canonical & whole)).to_bytes(len(packed), BYTE_ORDER)


class _BFloat16Codec(_NarrowFloatCodec):
    """bfloat16 is the upper half of a float32; lanes of one big int round all values at once."""

    __slots__ = ()

    def decode(self, data: memoryview) -> list[Any]:
        raw = bytes(data)
        wide = bytearray(2 * len(raw))
        high = 2 if BYTE_ORDER == "little" else 0
        wide[high::4] = raw[0::2]
        wide[high + 1 :: 4] = raw[1::2]
        return memoryview(wide).cast("f").tolist()

    def encode_float32(self, data: bytes) -> bytes:
        count = len(data) // 4
        bits = int.from_bytes(data, BYTE_ORDER)
        magnitude = bits & _lanes(0x7FFFFFFF, count)
        # Lane-wise magnitude > 0x7F800000 (NaN) sets bit 31; no lane can carry into the next.
        nan = (magnitude + _lanes(0x007FFFFF, count)) & _lanes(0x80000000, count)
        if nan:
            # c10 maps every NaN to 0x7FC0 (sign dropped); rewriting NaN lanes first also keeps
            # the rounding add below from carrying out of a lane.
            whole = (nan >> 31) * 0xFFFFFFFF
            bits = (bits & ~whole) | (_lanes(0x7FC00000, count) & whole)
        odd = (bits >> 16) & _lanes(1, count)
        rounded = bits + _lanes(0x7FFF, count) + odd  # nearest even on the low 16 bits
        return _high_halves(rounded.to_bytes(4 * count, BYTE_ORDER)).tobytes()


class _ByteFloatCodec(_NarrowFloatCodec):
    """An 8-bit float defined by two functions; tables are built from them on first use.

    Encoding looks up the float32 pattern's upper 16 bits with bit 16 replaced by "any of bits
    0-16 set". Every 8-bit format rounds at bit 18 of the float32 pattern or above (bit 22 for
    e8m0), so bit 16 only ever serves as a sticky bit and the lookup is exact for float32 values.

    With ``exact=True`` the result is the single rounding of each input's own value instead of
    the rounding of its float32 rounding. The two differ only where the float32 rounding lands
    exactly on a point where the 8-bit rounding changes (a tie, or the overflow threshold): the
    float32 pattern then has its low 17 bits clear, and the side of that point the input lies on
    picks the neighbouring key, odd key - 1 (just below) or key + 1 (just above).
    """

    __slots__ = (
        "_decode_one",
        "_decode_table",
        "_encode_bits",
        "_encode_table",
        "_exact",
        "_tie_table",
    )

    def __init__(
        self,
        decode_one: Callable[[int], float],
        encode_bits: Callable[[int], int],
        *,
        exact: bool = False,
    ) -> None:
        self._decode_one = decode_one
        self._encode_bits = encode_bits
        self._exact = exact
        self._decode_table: list[float] | None = None
        self._encode_table: bytes | None = None
        self._tie_table: array[int] | None = None

    def decode(self, data: memoryview) -> list[Any]:
        if self._decode_table is None:
            self._decode_table = [self._decode_one(code) for code in range(256)]
        return list(map(self._decode_table.__getitem__, data))

    def encode(self, values: list[Any] | tuple[Any, ...]) -> bytes:
        data = _FLOAT32.encode(values)
        keys, sticky_everywhere = self._keys(data)
        # Only a float32 value whose bits 0-16 are clear can be a point where the rounding
        # changes; most inputs have some of those bits set, which this test settles at once.
        if not self._exact or sticky_everywhere:
            return bytes(map(self._table().__getitem__, keys))
        # Inputs float32 holds exactly (small ints, k/2, 0.0) round once already. `==` between
        # Python numbers is exact, and the list comparison stops at the first difference.
        rounded = memoryview(data).cast("f").tolist()
        if rounded == (values if type(values) is list else list(values)):
            return bytes(map(self._table().__getitem__, keys))
        return self._round_once(values, rounded, keys)

    def encode_float32(self, data: bytes) -> bytes:
        keys, _ = self._keys(data)
        return bytes(map(self._table().__getitem__, keys))

    @staticmethod
    def _keys(data: bytes) -> tuple[memoryview, bool]:
        """The table keys of native float32 `data`, and whether each has one of bits 0-16 set."""
        count = len(data) // 4
        bits = int.from_bytes(data, BYTE_ORDER)
        low = _lanes(0xFFFF, count)
        bit16 = _lanes(0x10000, count)
        sticky = ((bits & low) + low) & bit16  # bit 16 := any of bits 0-16
        return _high_halves((bits | sticky).to_bytes(4 * count, BYTE_ORDER)), sticky == bit16

    def _round_once(
        self, values: list[Any] | tuple[Any, ...], rounded: list[Any], keys: memoryview
    ) -> bytes:
        """The codes of `values`, re-rounding those whose float32 rounding landed on a tie."""
        # One lookup gives each code (low byte) and whether its key is a tie (high byte).
        tagged = array("H", map(self._tagged_table().__getitem__, keys)).tobytes()
        first = 0 if BYTE_ORDER == "little" else 1
        codes, flags = tagged[first::2], tagged[1 - first :: 2]
        i = flags.find(1)
        if i < 0:
            return codes
        table = self._table()
        out = bytearray(codes)
        while i >= 0:
            exact = _exact_real(values[i])
            single = rounded[i]
            if exact != single:  # ints and floats compare exactly
                key = keys[i]
                out[i] = table[key + 1 if abs(exact) > abs(single) else key - 1]
            i = flags.find(1, i + 1)
        return bytes(out)

    def _table(self) -> bytes:
        if self._encode_table is None:
            self._encode_table = bytes(self._encode_bits(key << 16) for key in range(1 << 16))
        return self._encode_table

    def _tagged_table(self) -> array[int]:
        """The encode table with 0x100 added at the even keys whose neighbours encode differently.

        Those float32 values are where the rounding changes: ties, the overflow threshold, and
        inf (between the largest finite float32 and NaN; a finite input whose float32 is inf
        takes the lower neighbour, which overflows the same way). Keys 0 and 0x8000 (zeros)
        are left out: no input lies below zero in magnitude.
        """
        if self._tie_table is None:
            table = self._table()
            self._tie_table = array(
                "H",
                (
                    code | 0x100
                    if not key & 1 and key & 0x7FFF and table[key - 1] != table[key + 1]
                    else code
                    for key, code in enumerate(table)
                ),
            )
        return self._tie_table


def _exact_real(value: object) -> int | float:
    """The exact real number `value` stands for: the int or float itself, a complex's real part."""
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, complex):
        return value.real
    return _exact_real(_as_number(value))


class _ComplexCodec(_Codec):
    """Interleaved (real, imaginary) pairs of a real codec."""

    __slots__ = ("_part",)

    def __init__(self, part: _Codec) -> None:
        self._part = part

    def decode(self, data: memoryview) -> list[Any]:
        flat = self._part.decode(data)
        return list(map(complex, flat[0::2], flat[1::2]))

    def encode(self, values: list[Any] | tuple[Any, ...]) -> bytes:
        if not set(map(type, values)) <= _NUMBERS:
            values = [complex(_as_number(value)) for value in values]
        flat: list[Any] = [0.0] * (2 * len(values))
        flat[0::2] = map(_real_part, values)
        flat[1::2] = map(_imag_part, values)
        return self._part.encode(flat)


# --------------------------------------------------------------------------------------------
# 8-bit float formats
# --------------------------------------------------------------------------------------------


class _Float8Spec(NamedTuple):
    """An 8-bit float: sign, `exponent` bits with `bias`, `mantissa` bits.

    family: "ieee" (all-ones exponent is inf/NaN; overflow -> inf), "fn" (only S.1111.111 is NaN;
    overflow and inf saturate, as PyTorch's e4m3fn does), "fnuz" (0x80 is the only NaN, no -0 and
    no inf; overflow and inf -> NaN).
    """

    exponent: int
    mantissa: int
    bias: int
    family: str
    nan: int  # the pattern NaN encodes to (before the sign, where the format keeps it)

    @property
    def max_code(self) -> int:
        """The pattern of the largest finite value."""
        if self.family == "ieee":
            return (((1 << self.exponent) - 1) << self.mantissa) - 1
        return 0x7E if self.family == "fn" else 0x7F

    def decode(self, code: int) -> float:
        negative, magnitude = code & 0x80, code & 0x7F
        if self.family == "fnuz" and code == 0x80:
            return _NAN
        field, fraction = magnitude >> self.mantissa, magnitude & ((1 << self.mantissa) - 1)
        if magnitude > self.max_code:
            inf = self.family == "ieee" and fraction == 0
            return -_INF if negative and inf else _INF if inf else -_NAN if negative else _NAN
        if field:
            value = math.ldexp(fraction | (1 << self.mantissa), field - self.bias - self.mantissa)
        else:
            value = math.ldexp(fraction, 1 - self.bias - self.mantissa)
        return -value if negative else value

    def encode(self, bits: int) -> int:
        """The pattern for a float32 pattern: round to nearest even, then the family's rules."""
        sign, exponent, fraction = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
        if exponent == 0xFF:
            code = self._overflow() if fraction == 0 else self.nan
        else:
            code = self._round(exponent, fraction)
        if self.family == "fnuz":
            return code | 0x80 if sign and code not in (0, self.nan) else code
        return code | (sign << 7)

    def _round(self, exponent: int, fraction: int) -> int:
        significand = fraction | (0x800000 if exponent else 0)
        if significand == 0:
            return 0
        low = max(exponent, 1) - 150  # the float32 value is significand * 2**low
        top = low + significand.bit_length() - 1  # floor(log2(value))
        min_normal = 1 - self.bias
        scale = max(top, min_normal) - self.mantissa  # exponent of the target's last place
        shift = scale - low  # > 0: every 8-bit format is coarser than float32
        kept, rest = significand >> shift, significand & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rest > half or (rest == half and kept & 1):
            kept += 1
        # A normal kept value lies in [2**m, 2**(m+1)]: adding the biased exponent above the
        # minimum gives the pattern, including a carry into the next binade. Subnormals add 0.
        code = ((max(top, min_normal) - min_normal) << self.mantissa) + kept
        return code if code <= self.max_code else self._overflow()

    def _overflow(self) -> int:
        if self.family == "ieee":
            return self.max_code + 1  # inf
        return self.max_code if self.family == "fn" else self.nan


_ML_DTYPES_ONLY: Final = frozenset(("float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz"))
_FLOAT8: Final[dict[str, _Float8Spec]] = {
    # ml_dtypes (PyTorch has no such dtype): canonical NaN is the quiet bit alone.
    "float8_e3m4": _Float8Spec(3, 4, 3, "ieee", 0x78),
    "float8_e4m3": _Float8Spec(4, 3, 7, "ieee", 0x7C),
    "float8_e4m3b11fnuz": _Float8Spec(4, 3, 11, "fnuz", 0x80),
    # PyTorch (c10/util/Float8_*.h); e5m2's NaN is 0x7F there, not ml_dtypes' 0x7E.
    "float8_e4m3fn": _Float8Spec(4, 3, 7, "fn", 0x7F),
    "float8_e4m3fnuz": _Float8Spec(4, 3, 8, "fnuz", 0x80),
    "float8_e5m2": _Float8Spec(5, 2, 15, "ieee", 0x7F),
    "float8_e5m2fnuz": _Float8Spec(5, 2, 16, "fnuz", 0x80),
}


def _decode_e8m0(code: int) -> float:
    return _NAN if code == 0xFF else math.ldexp(1.0, code - 127)


def _encode_e8m0(bits: int) -> int:
    """c10's fp8e8m0fnu_from_fp32_value: the exponent, rounded on the guard/round/sticky bits.

    The sign is ignored. The implied bit counts as the last place, so a half-way mantissa rounds
    up for float32 normals and down for subnormals; inf, NaN and overflow give 0xFF (NaN).
    """
    exponent = (bits >> 23) & 0xFF
    if exponent == 0xFF:
        return 0xFF
    guard, round_, sticky = bits & 0x400000, bits & 0x200000, bits & 0x1FFFFF
    if guard and (round_ or sticky or exponent):
        exponent += 1
    return exponent


# --------------------------------------------------------------------------------------------
# The codec table
# --------------------------------------------------------------------------------------------


def _make_codec(dtype: DType) -> _Codec:
    if dtype.name in _FLOAT8:
        spec = _FLOAT8[dtype.name]
        # Formats PyTorch has round through float32, as c10 does; the others round once.
        exact = dtype.name in _ML_DTYPES_ONLY
        return _ByteFloatCodec(spec.decode, spec.encode, exact=exact)
    special: dict[str, Callable[[], _Codec]] = {
        "bool": _BoolCodec,
        "float64": _Float64Codec,
        "float32": lambda: _FLOAT32,
        "float16": _Float16Codec,
        "bfloat16": _BFloat16Codec,
        "float8_e8m0fnu": lambda: _ByteFloatCodec(_decode_e8m0, _encode_e8m0),
        "complex32": lambda: _ComplexCodec(_CODECS[_dtype.float16]),
        "complex64": lambda: _ComplexCodec(_FLOAT32),
        "complex128": lambda: _ComplexCodec(_CODECS[_dtype.float64]),
        "float4_e2m1fn_x2": lambda: _RawByteCodec(_dtype.uint8),
    }
    if dtype.name in special:
        return special[dtype.name]()
    return _IntCodec(dtype)


_CODECS: Final[dict[DType, _Codec]] = {}
for _d in _dtype.ALL_DTYPES:  # complex codecs look up their parts, which come earlier
    _CODECS[_d] = _make_codec(_d)
del _d


# --------------------------------------------------------------------------------------------
# Public (package-internal) API
# --------------------------------------------------------------------------------------------


def unpack(dtype: DType, data: _Buffer) -> list[Any]:
    """Decode ``len(data) // dtype.itemsize`` contiguous native-order elements.

    Args:
        dtype: the element type.
        data: a C-contiguous bytes-like object, such as a memoryview over foreign memory;
            alignment does not matter. Trailing bytes that do not fill an element are ignored.

    Returns:
        A list of bool, int, float or complex (see the module docstring for each dtype).

    Raises:
        ValueError: `data` is not C-contiguous.

    Example:
        >>> unpack(_dtype.bfloat16, b"\\x80\\x3f\\xc0\\x7f")
        [1.0, nan]
    """
    view = memoryview(data)
    if not view.c_contiguous:
        msg = (
            f"unpack(): the buffer must be C-contiguous; got a view with strides {view.strides}. "
            "Pass the bytes of a contiguous region."
        )
        raise ValueError(msg)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    size = dtype.itemsize
    return _CODECS[dtype].decode(view[: len(view) // size * size])


def pack(dtype: DType, values: Sequence[Any]) -> bytes:
    """Encode numbers as contiguous native-order elements of `dtype`, with PyTorch's cast rules.

    Args:
        dtype: the element type.
        values: bool, int, float or complex values, mixed freely (objects with ``__index__``,
            ``__float__`` or ``__complex__`` are accepted too).

    Returns:
        ``len(values) * dtype.itemsize`` bytes.

    Raises:
        TypeError: a value is not a number.
        NotImplementedError: a float or complex value for float4_e2m1fn_x2.

    Example:
        >>> pack(_dtype.int8, [300, -1.5, float("nan")])
        b',\\xff\\x00'
    """
    return _CODECS[dtype].encode(_values_list(values))


def convert(dtype: DType, value: object) -> Any:
    """The Python value one element of `dtype` holds after `value` is written (pack + unpack).

    Example:
        >>> convert(_dtype.float8_e4m3fn, 1000.0)
        448.0
    """
    return unpack(dtype, pack(dtype, (value,)))[0]


# -- check_scalar ----------------------------------------------------------------------------


class _Limits(NamedTuple):
    """What PyTorch's ``c10::overflows<To, From>`` compares a scalar against."""

    ctype: str  # the C++ type named in "value cannot be converted to type ... without overflow"
    lowest: float  # bounds for a float scalar, compared in double
    highest: float
    int_lowest: float  # bounds for an integer scalar, compared exactly (unsigned targets let
    int_highest: float  # negative ints wrap while -value <= max)
    has_inf: bool
    has_nan: bool
    is_complex: bool


_INT64_MIN: Final = -(1 << 63)
_UINT64_END: Final = 1 << 64

_FLOAT_MAX: Final = {
    "float16": 65504.0,
    "bfloat16": float.fromhex("0x1.FEp127"),
    "float32": float.fromhex("0x1.FFFFFEp127"),
}


def _float_limits(dtype: DType, ctype: str, is_complex: bool = False) -> _Limits:
    name = dtype.name
    if name == "float8_e8m0fnu":
        # Unsigned in c10's numeric_limits: every int64 passes (the negative-wrap test casts the
        # 2**127 max to uint64), while floats must lie in [2**-127, 2**127].
        return _Limits(ctype, 2.0**-127, 2.0**127, -_INF, _INF, False, True, False)
    if name in _FLOAT8:
        spec = _FLOAT8[name]
        top = spec.decode(spec.max_code)
        has_inf = spec.family == "ieee"
    else:
        top = _FLOAT_MAX.get(name, sys.float_info.max)
        has_inf = True
    return _Limits(ctype, -top, top, -top, top, has_inf, True, is_complex)


def _limits(dtype: DType) -> _Limits | None:
    """PyTorch's limits for writing a scalar into `dtype`; None for bool (anything goes)."""
    if dtype.kind == "b":
        return None
    ctype = dtype.c_type
    assert ctype is not None  # every fillable dtype but bool names one
    if dtype.kind == "c":
        part = {"complex32": _dtype.float16, "complex64": _dtype.float32}.get(
            dtype.name, _dtype.float64
        )
        return _float_limits(part, ctype, is_complex=True)
    if dtype.kind == "f":
        return _float_limits(dtype, ctype)
    bits = dtype.bits
    if dtype.kind == "u":
        top = (1 << bits) - 1
        return _Limits(ctype, 0.0, float(top), -top, top, False, False, False)
    low, top = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return _Limits(ctype, float(low), float(top), low, top, False, False, False)


# fill_/full convert the scalar in a kernel typed by the target; complex32 goes through
# complex<float>. Indexing assignment (and fill_ of a one-element CPU tensor) first builds a scalar
# tensor, for which float16, bfloat16 and float8 targets use double. float4_e2m1fn_x2 cannot be
# filled at all (see check_scalar).
_FILLABLE: Final = tuple(d for d in _dtype.ALL_DTYPES if d is not _dtype.float4_e2m1fn_x2)
_KERNEL_LIMITS: Final = {
    d: _limits(_dtype.complex64 if d is _dtype.complex32 else d) for d in _FILLABLE
}
_SCALAR_LIMITS: Final = {
    d: _limits(_dtype.float64 if d.kind == "f" and d.itemsize < 4 else d) for d in _FILLABLE
}


def _overflows(limits: _Limits, value: Number) -> bool:
    if isinstance(value, complex):
        if not limits.is_complex and value.imag != 0:
            return True
        return _overflows(limits, value.real) or _overflows(limits, value.imag)
    if isinstance(value, int):
        return value < limits.int_lowest or value > limits.int_highest
    if math.isinf(value) and limits.has_inf:
        return False
    if math.isnan(value):
        return not limits.has_nan
    return value < limits.lowest or value > limits.highest


def check_scalar(dtype: DType, value: object, api: str, *, numel: int | None = None) -> None:
    """Raise what PyTorch raises when the Python scalar `value` is written into a `dtype` tensor.

    Mirrors torch 2.13 on the CPU: the argument parser's 64-bit range for ints, then
    ``c10::checked_convert`` (bool targets accept everything). Accepted values are then stored as
    `pack` converts them.

    Args:
        dtype: the tensor's dtype.
        value: the scalar (bool, int, float, complex, or an object with ``__index__``,
            ``__float__`` or ``__complex__``).
        api: the caller's name, used as the message prefix. ``"__setitem__"`` (or a name ending
            in ``".__setitem__"``) selects the rules of PyTorch's indexing assignment, which
            first builds a scalar tensor; anything else those of ``fill_``/``full``.
        numel: the number of elements written by fill_/full, when known. PyTorch fills a
            one-element (or 0-d) CPU tensor through the scalar-tensor path too, so ``numel=1``
            selects the indexing rules (``full((1,), 1e6, dtype=float16)`` gives inf where
            ``full((2,), ...)`` raises).

    Raises:
        TypeError: `value` is not a number.
        OverflowError: fill_/full with an int outside [-2**63, 2**64) (CPython's text, as torch).
        ValueError: indexing assignment with an int outside [-2**63, 2**63)
            ("Overflow when unpacking long long").
        RuntimeError: "value cannot be converted to type <C++ type> without overflow".
        NotImplementedError: any scalar into float4_e2m1fn_x2, which PyTorch cannot fill.
    """
    number = _as_number(value)
    indexing = api.rsplit(".", 1)[-1] == "__setitem__"
    scalar_path = indexing or numel == 1
    if isinstance(number, int) and not isinstance(number, bool):
        _check_int_range(number, indexing, api)
    if dtype is _dtype.float4_e2m1fn_x2:
        kernel = "fill_out" if scalar_path else "fill_cpu"
        msg = (
            f"{api}(): \"{kernel}\" not implemented for 'Float4_e2m1fn_x2'; got {value!r}. "
            "Write the packed bytes through a uint8 view instead."
        )
        raise NotImplementedError(msg)
    limits = (_SCALAR_LIMITS if scalar_path else _KERNEL_LIMITS)[dtype]
    if limits is None or isinstance(number, bool) or not _overflows(limits, number):
        return
    msg = (
        f"{api}(): value cannot be converted to type {limits.ctype} without overflow; "
        f"got {value!r}. Pass a value that {dtype!r} can hold, or convert the tensor first."
    )
    raise RuntimeError(msg)


def _check_int_range(value: int, indexing: bool, api: str) -> None:
    """The 64-bit limits of PyTorch's Python argument parsing, with its messages."""
    if indexing and not _INT64_MIN <= value < -_INT64_MIN:
        msg = (
            f"{api}(): Overflow when unpacking long long; got {value!r}. "
            "Indexing assignment takes ints in [-2**63, 2**63)."
        )
        raise ValueError(msg)
    if value >= _UINT64_END:
        msg = f"{api}(): int too big to convert; got {value!r}. Pass an int below 2**64."
        raise OverflowError(msg)
    if value < _INT64_MIN:
        msg = (
            f"{api}(): can't convert negative int to unsigned; got {value!r}. "
            "Pass an int of at least -2**63."
        )
        raise OverflowError(msg)
