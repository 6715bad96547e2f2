"""Exact reference encoders and decoders for binary floating-point formats, in rational arithmetic.

Each format is described by its field widths, its exponent bias and the rules its family applies
to the top of the exponent range; values are `fractions.Fraction` (or the floats inf and NaN), so
rounding is done once, on the exact value, with no intermediate format. Nothing here imports
tensorbridge, NumPy or PyTorch: the reference is the format's specification, not a peer's code.

Families:

* ``"ieee"``: IEEE 754 style. The all-ones exponent holds +-inf (mantissa 0) and NaN; -0 exists.
  Rounding is to nearest, ties to even, with an unbounded exponent; a result past the largest
  finite value is inf.
* ``"fn"``: finite plus NaN (float8_e4m3fn, float4_e2m1fn): no inf. In float8_e4m3fn only
  S.1111.111 is NaN, so the all-ones exponent also holds finite values; float4_e2m1fn has no NaN.
  Overflow and inf saturate to the largest finite value (PyTorch 2.13's float8_e4m3fn cast;
  the OCP MX conversion rule for float4_e2m1fn).
* ``"fnuz"``: finite, NaN, unsigned zero: 0x80 is the only NaN, there is no -0 and no inf.
  Overflow and inf give NaN; a negative value that rounds to zero gives +0.
* ``"e8m0"``: float8_e8m0fnu, 2**(code - 127) for codes 0..254 and NaN at 0xFF; no sign, no zero.
  Encoding follows c10's ``fp8e8m0fnu_from_fp32_value`` applied to a float32 value (see
  `encode_e8m0`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

INF, NAN = math.inf, math.nan

Value = Fraction | float  # a Fraction, or the floats +-inf and NaN


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: 1 sign bit, `exponent` bits, `mantissa` bits.

    Attributes:
        name: the dtype name.
        exponent: exponent field width.
        mantissa: stored mantissa (trailing significand) width.
        bias: exponent bias; a normal value is ``2**(field - bias) * (1 + fraction / 2**mantissa)``.
        family: ``"ieee"``, ``"fn"`` or ``"fnuz"`` (module docstring).
        nan: the pattern a NaN encodes to, without the sign bit.
        nan_keeps_sign: whether a negative NaN sets the sign bit of `nan`.
        has_nan: False for float4_e2m1fn (every pattern is finite).
    """

    name: str
    exponent: int
    mantissa: int
    bias: int
    family: str
    nan: int
    nan_keeps_sign: bool = True
    has_nan: bool = True

    @property
    def width(self) -> int:
        """Bits per value."""
        return 1 + self.exponent + self.mantissa

    @property
    def sign_bit(self) -> int:
        """The sign bit's mask."""
        return 1 << (self.width - 1)

    @property
    def max_code(self) -> int:
        """The pattern of the largest finite value."""
        if self.family == "ieee":
            return (((1 << self.exponent) - 1) << self.mantissa) - 1
        if self.family == "fn" and self.has_nan:
            return self.sign_bit - 2  # S.1111.110: only S.1111.111 is NaN
        return self.sign_bit - 1

    @property
    def min_normal_exponent(self) -> int:
        """The unbiased exponent of the smallest normal value (subnormals share its last place)."""
        return 1 - self.bias


def decode(fmt: Format, code: int) -> Value:
    """The exact value of the pattern `code` (a Fraction), or +-inf / NaN.

    Signed zero: the negative zero pattern decodes to ``Fraction(0)``; use `is_negative_zero`.
    """
    sign, magnitude = code & fmt.sign_bit, code & (fmt.sign_bit - 1)
    if fmt.family == "fnuz" and code == fmt.sign_bit:
        return NAN
    if magnitude > fmt.max_code:
        if fmt.family == "ieee" and magnitude == fmt.max_code + 1:
            return -INF if sign else INF
        return NAN
    field, fraction = magnitude >> fmt.mantissa, magnitude & ((1 << fmt.mantissa) - 1)
    if field:
        value = Fraction((1 << fmt.mantissa) | fraction) * Fraction(2) ** (
            field - fmt.bias - fmt.mantissa
        )
    else:
        value = Fraction(fraction) * Fraction(2) ** (fmt.min_normal_exponent - fmt.mantissa)
    return -value if sign else value


def is_negative_zero(fmt: Format, code: int) -> bool:
    """Whether `code` is the format's -0 pattern (only ieee and fn formats have one)."""
    return fmt.family != "fnuz" and code == fmt.sign_bit


def _nan_code(fmt: Format, negative: bool) -> int:
    if fmt.family == "fnuz":
        return fmt.sign_bit
    return fmt.nan | (fmt.sign_bit if negative and fmt.nan_keeps_sign else 0)


def _overflow_code(fmt: Format, negative: bool) -> int:
    if fmt.family == "fnuz":
        return fmt.sign_bit  # NaN
    sign = fmt.sign_bit if negative else 0
    if fmt.family == "ieee":
        return sign | (fmt.max_code + 1)  # inf
    return sign | fmt.max_code  # fn: saturate


def encode(fmt: Format, value: Value | int, *, negative_zero: bool = False) -> int:
    """The pattern of `value` rounded once to nearest, ties to even, with the family's rules.

    Args:
        fmt: the format.
        value: an exact value (int, Fraction, or a float, which is exact too), inf or NaN.
        negative_zero: the sign of a zero `value` (a Fraction has none); a float -0.0 sets it too.

    Returns:
        The bit pattern as an int in ``[0, 2**fmt.width)``.
    """
    if isinstance(value, float):
        if math.isnan(value):
            return _nan_code(fmt, math.copysign(1.0, value) < 0)
        if math.isinf(value):
            return _overflow_code(fmt, value < 0)
        negative_zero = negative_zero or math.copysign(1.0, value) < 0
    exact = Fraction(value)
    negative = exact < 0 or (exact == 0 and negative_zero)
    sign = fmt.sign_bit if negative else 0
    magnitude = abs(exact)
    if magnitude == 0:
        return 0 if fmt.family == "fnuz" else sign
    # The exponent of the last place: that of the value's binade, but not below the subnormals'.
    top = _floor_log2(magnitude)
    last_place = max(top, fmt.min_normal_exponent) - fmt.mantissa
    units = magnitude / Fraction(2) ** last_place  # the value in units of the last place
    kept = _round_half_even(units)
    # `kept` counts last places from zero: within a binade the pattern increases by one per
    # place, and a carry into the next binade (kept == 2**(mantissa + 1)) lands on its first
    # pattern, so the pattern is the binade's offset plus `kept`.
    binade = max(top, fmt.min_normal_exponent) - fmt.min_normal_exponent
    code = (binade << fmt.mantissa) + kept
    if code > fmt.max_code:
        return _overflow_code(fmt, negative)
    if code == 0 and fmt.family == "fnuz":
        return 0  # no -0: a negative value that rounds to zero is +0
    return sign | code


def _floor_log2(value: Fraction) -> int:
    """floor(log2(value)) for a positive Fraction, exactly."""
    guess = value.numerator.bit_length() - value.denominator.bit_length()
    while Fraction(2) ** guess > value:
        guess -= 1
    while Fraction(2) ** (guess + 1) <= value:
        guess += 1
    return guess


def _round_half_even(value: Fraction) -> int:
    floor = math.floor(value)
    rest = value - floor
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2 == 1):
        return floor + 1
    return floor


def to_value(fmt: Format, value: Value | int) -> Value:
    """`value` rounded to `fmt` (encode then decode); zeros and NaN are floats keeping the sign."""
    code = encode(fmt, value)
    result = decode(fmt, code)
    if isinstance(result, float) and math.isnan(result):
        return math.copysign(NAN, -1.0 if code & fmt.sign_bit else 1.0)
    if result == 0:
        return -0.0 if is_negative_zero(fmt, code) else 0.0
    return result


# ------------------------------------------------------------------------------------------------
# float8_e8m0fnu


E8M0_NAN = 0xFF


def decode_e8m0(code: int) -> Value:
    """float8_e8m0fnu: ``2**(code - 127)``, and NaN for 0xFF."""
    return NAN if code == E8M0_NAN else Fraction(2) ** (code - 127)


def encode_e8m0(value: Value | int) -> int:
    """float8_e8m0fnu from a value that float32 holds exactly, with c10's rounding.

    c10 keeps the float32 exponent field and adds one when the mantissa's top bit is set and
    (any lower mantissa bit is set or the value is normal). In exact terms, for ``m = |value|``
    (the sign is ignored):

    * ``m >= 2**-126`` (float32 normal), ``2**e <= m < 2**(e+1)``: ``2**(e+1)`` when
      ``m >= 1.5 * 2**e`` (half-way rounds up), else ``2**e``;
    * ``m < 2**-126`` (float32 subnormal or zero): ``2**-126`` when ``m > 2**-127``, else
      ``2**-127`` (half-way rounds down; zero gives the smallest value);
    * an exponent past 2**127, inf and NaN: NaN (0xFF).
    """
    if isinstance(value, float) and not math.isfinite(value):
        return E8M0_NAN
    magnitude = abs(Fraction(value))
    if magnitude < Fraction(2) ** -126:
        return 1 if magnitude > Fraction(2) ** -127 else 0
    top = _floor_log2(magnitude)
    if magnitude >= Fraction(3, 2) * Fraction(2) ** top:
        top += 1
    code = top + 127
    return code if code < E8M0_NAN else E8M0_NAN


# ------------------------------------------------------------------------------------------------
# The formats

FORMATS: dict[str, Format] = {
    fmt.name: fmt
    for fmt in (
        # OCP 8-bit floating point (OFP8) and PyTorch's c10 types.
        Format("float8_e4m3fn", 4, 3, 7, "fn", 0x7F),
        Format("float8_e5m2", 5, 2, 15, "ieee", 0x7F),
        # Graphcore/AMD "fnuz" variants (bias one more than OFP8's).
        Format("float8_e4m3fnuz", 4, 3, 8, "fnuz", 0x80),
        Format("float8_e5m2fnuz", 5, 2, 16, "fnuz", 0x80),
        # IEEE-style formats PyTorch lacks (ml_dtypes names); the NaN written is the quiet bit.
        Format("float8_e3m4", 3, 4, 3, "ieee", 0x78),
        Format("float8_e4m3", 4, 3, 7, "ieee", 0x7C),
        Format("float8_e4m3b11fnuz", 4, 3, 11, "fnuz", 0x80),
        # OCP MX FP4: every pattern finite.
        Format("float4_e2m1fn", 2, 1, 1, "fn", 0, has_nan=False),
        # 16- and 32-bit IEEE formats; bfloat16's NaN drops the sign (c10 writes 0x7FC0).
        Format("float16", 5, 10, 15, "ieee", 0x7E00),
        Format("bfloat16", 8, 7, 127, "ieee", 0x7FC0, nan_keeps_sign=False),
        Format("float32", 8, 23, 127, "ieee", 0x7FC00000),
    )
}


def round_to_float32(value: float | int) -> Value:
    """`value` rounded once to float32 (nearest even; past the range, inf), exactly."""
    return to_value(FORMATS["float32"], value)
