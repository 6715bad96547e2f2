"""The float codecs against exact references (tests/exact_float.py), not against a peer's version.

Every bit pattern of every narrow float format decodes to the exact value its specification gives.
Encoding is checked on exact values, ties, the float64 neighbours of ties, values that float32
rounds onto a tie (where rounding once and rounding through float32 differ), the largest finite
value, the overflow threshold, subnormals, underflow, signed zeros, NaN and inf:

* float8_e3m4, float8_e4m3, float8_e4m3b11fnuz (PyTorch lacks them) round once, to nearest even,
  from the exact input value;
* float16, bfloat16 and the float8 formats PyTorch has round to float32 first, then to the target,
  as PyTorch 2.13 does (c10 converts from float);
* float8_e8m0fnu follows c10's rounding of the float32 value.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import struct
import sys
from fractions import Fraction
from typing import Any

import pytest
from tests import exact_float as X

import tensorbridge as tb
from tensorbridge import _codec
from tensorbridge import _dtype as tbd

INF, NAN = math.inf, math.nan
ROUND_ONCE = ["float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz"]
THROUGH_FLOAT32 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                   "float16", "bfloat16"]  # fmt: skip
REFERENCED = [*ROUND_ONCE, *THROUGH_FLOAT32]


# ------------------------------------------------------------------------------------------------
# Helpers


def _patterns(fmt: X.Format) -> range:
    return range(1 << fmt.width)


def _codes(name: str, values: list[Any]) -> list[int]:
    """The codec's bit patterns for `values`, as ints."""
    dtype = getattr(tbd, name)
    raw = _codec.pack(dtype, values)
    size = dtype.itemsize
    return [int.from_bytes(raw[i : i + size], sys.byteorder) for i in range(0, len(raw), size)]


def _decoded(name: str) -> list[Any]:
    """The codec's values for every bit pattern of `name`."""
    dtype = getattr(tbd, name)
    width = 8 * dtype.itemsize
    raw = b"".join(code.to_bytes(dtype.itemsize, sys.byteorder) for code in range(1 << width))
    return _codec.unpack(dtype, raw)


@functools.cache
def _finite_magnitudes(fmt: X.Format) -> list[Fraction]:
    """The format's non-negative finite values, ascending."""
    values = {abs(X.decode(fmt, code)) for code in _patterns(fmt)}
    return sorted(v for v in values if isinstance(v, Fraction))


def _gaps(fmt: X.Format) -> list[tuple[Fraction, Fraction]]:
    """Pairs of consecutive magnitudes, and the gap past the largest finite value.

    8-bit formats: every gap. 16-bit ones: the subnormals, the gaps around the smallest normal,
    the top of the range, and a fixed random sample of the rest (all 32768 would take minutes
    in rational arithmetic).
    """
    mags = _finite_magnitudes(fmt)
    gaps = list(itertools.pairwise(mags))
    gaps.append((mags[-1], 2 * mags[-1] - mags[-2]))
    if fmt.width <= 8:
        return gaps
    first_normal = 1 << fmt.mantissa
    chosen = {
        *range(64),
        *range(first_normal - 8, first_normal + 8),
        *range(len(gaps) - 64, len(gaps)),
    }
    chosen |= set(random.Random(fmt.name).sample(range(len(gaps)), 200))
    return [gaps[i] for i in sorted(chosen)]


def _float32_neighbours(value: float) -> list[float]:
    """The float32 values either side of a float32 `value` (as floats)."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    return [struct.unpack("<f", struct.pack("<I", b))[0] for b in (bits - 1, bits + 1)]


def _probes(fmt: X.Format) -> list[float]:
    """float64 inputs around every representable magnitude of `fmt`, both signs.

    For each gap between consecutive magnitudes (and the one past the largest finite value, whose
    midpoint is the overflow threshold): both ends, the midpoint (a tie), its float64 neighbours,
    its float32 neighbours, and the midpoint times 1 +- 2**-30 and 1 +- 2**-40, which float32
    rounds onto the midpoint itself (the double-rounding cases).
    """
    out: list[float] = []
    for low, high in _gaps(fmt):
        mid = float((low + high) / 2)  # exact: a tie needs one bit more than the format
        out += [float(low), float(high), mid, math.nextafter(mid, 0.0), math.nextafter(mid, INF)]
        out += _float32_neighbours(mid)
        out += [mid * (1 + 2.0**-30), mid * (1 - 2.0**-30), mid * (1 + 2.0**-40)]
        out += [mid * (1 - 2.0**-40)]
    smallest = float(_finite_magnitudes(fmt)[1])  # the smallest subnormal
    out += [smallest / 4, smallest / 2 * (1 - 2.0**-52), 2.0**-149, 2.0**-150, 5e-324, 1e-300]
    return out + [-v for v in out]


# fmt: off
SPECIALS = [
    0.0, -0.0, INF, -INF, NAN, -NAN, 1e300, -1e300, sys.float_info.max, 3.4028235e38,
    2.0**128 - 2.0**104, 2.0**128 - 2.0**103, 2.0**-126, 2.0**-127, 1.0, -1.0,
]
# fmt: on


def _inputs(fmt: X.Format, seed: int) -> list[float]:
    rng = random.Random(seed)
    top = float(_finite_magnitudes(fmt)[-1])
    wide = [rng.choice((1, -1)) * rng.random() * 2.0 ** rng.uniform(-40, 40) for _ in range(1500)]
    near = [rng.uniform(-2 * top, 2 * top) for _ in range(1500)]
    return SPECIALS + _probes(fmt) + wide + near


def _ints(fmt: X.Format) -> list[int]:
    """Ints around the format's integers, its overflow threshold, and far past it."""
    mags = _finite_magnitudes(fmt)
    threshold = math.floor(mags[-1] + (mags[-1] - mags[-2]) / 2)
    near = [*range(-40, 41), *range(threshold - 3, threshold + 4)]
    near += [-n for n in near]
    return [*near, 2**24 + 1, 2**53 + 1, 2**63 - 1, -(2**63), 2**70 + 1, -(10**30)]


def _mismatches(inputs: list[Any], got: list[int], expected: list[int]) -> list[Any]:
    bad = [(x, hex(g), hex(e)) for x, g, e in zip(inputs, got, expected, strict=True) if g != e]
    return bad[:5] + ([f"... {len(bad)} in all"] if len(bad) > 5 else [])


# ------------------------------------------------------------------------------------------------
# The reference itself


# (name, largest finite, smallest normal, smallest subnormal, has inf, NaN patterns)
_SPEC_CONSTANTS = [
    ("float8_e4m3fn", 448, Fraction(1, 2**6), Fraction(1, 2**9), False, 2),
    ("float8_e5m2", 57344, Fraction(1, 2**14), Fraction(1, 2**16), True, 6),
    ("float8_e4m3fnuz", 240, Fraction(1, 2**7), Fraction(1, 2**10), False, 1),
    ("float8_e5m2fnuz", 57344, Fraction(1, 2**15), Fraction(1, 2**17), False, 1),
    ("float8_e3m4", Fraction(31, 2), Fraction(1, 4), Fraction(1, 2**6), True, 30),
    ("float8_e4m3", 240, Fraction(1, 2**6), Fraction(1, 2**9), True, 14),
    ("float8_e4m3b11fnuz", 30, Fraction(1, 2**10), Fraction(1, 2**13), False, 1),
    ("float4_e2m1fn", 6, 1, Fraction(1, 2), False, 0),
    ("float16", 65504, Fraction(1, 2**14), Fraction(1, 2**24), True, 2 * 1023),
    ("bfloat16", (2 - Fraction(1, 2**7)) * 2**127, Fraction(1, 2**126), Fraction(1, 2**133), True,
     2 * 127),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "largest", "normal", "subnormal", "has_inf", "nans"),
    _SPEC_CONSTANTS,
    ids=[c[0] for c in _SPEC_CONSTANTS],
)
def test_reference_formats_have_their_specified_limits(
    name, largest, normal, subnormal, has_inf, nans
):
    """Each reference format has its spec's largest finite, smallest normal and subnormal values."""
    fmt = X.FORMATS[name]
    values = [X.decode(fmt, code) for code in _patterns(fmt)]
    finite = [v for v in values if isinstance(v, Fraction)]
    assert max(finite) == largest and min(finite) == -largest
    assert X.decode(fmt, 1 << fmt.mantissa) == normal
    assert min(v for v in finite if v > 0) == subnormal
    assert (INF in values and -INF in values) == has_inf
    assert sum(1 for v in values if isinstance(v, float) and math.isnan(v)) == nans


def test_reference_float4_e2m1fn_values():
    """OCP MX FP4 E2M1 holds +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating past 6."""
    fmt = X.FORMATS["float4_e2m1fn"]
    positive = [X.decode(fmt, code) for code in range(8)]
    assert positive == [0, Fraction(1, 2), 1, Fraction(3, 2), 2, 3, 4, 6]
    assert [X.decode(fmt, code) for code in range(8, 16)] == [-v for v in positive]
    assert X.encode(fmt, 5.0) == 6 and X.encode(fmt, 5.5) == 7 and X.encode(fmt, 1e9) == 7
    assert X.encode(fmt, 2.5) == 4 and X.encode(fmt, 0.25) == 0 and X.encode(fmt, -0.0) == 8


def test_reference_e8m0_values():
    """float8_e8m0fnu codes are 2**(code - 127), with NaN at 0xFF and no zero or sign."""
    assert X.decode_e8m0(0) == Fraction(1, 2**127)
    assert X.decode_e8m0(127) == 1 and X.decode_e8m0(254) == 2**127
    assert math.isnan(X.decode_e8m0(255))


def test_reference_rounds_ties_to_even_and_overflows_by_family():
    """The reference encoder: ties to even, overflow to inf / saturation / NaN per family."""
    e3m4, e4m3fn, fnuz = (
        X.FORMATS["float8_e3m4"],
        X.FORMATS["float8_e4m3fn"],
        X.FORMATS["float8_e4m3fnuz"],
    )
    assert X.encode(e3m4, Fraction(33, 32)) == 0x30  # 1 + 1/32: tie between 1 and 17/16 -> 1
    assert X.encode(e3m4, Fraction(35, 32)) == 0x32  # tie between 17/16 and 18/16 -> 18/16
    assert X.encode(e3m4, Fraction(63, 4)) == 0x70  # 15.75: overflow tie -> inf
    assert X.encode(e3m4, Fraction(63, 4) - Fraction(1, 2**60)) == 0x6F  # just below: 15.5
    assert X.encode(e4m3fn, 1e9) == 0x7E and X.encode(e4m3fn, -INF) == 0xFE  # saturates
    assert X.encode(fnuz, 1e9) == 0x80 and X.encode(fnuz, -1e-30) == 0  # NaN; no -0
    assert X.encode(e3m4, -0.0) == 0x80 and X.encode(e3m4, -NAN) == 0xF8


# ------------------------------------------------------------------------------------------------
# Decoding


@pytest.mark.parametrize("name", REFERENCED)
def test_decode_every_pattern_exactly(name):
    """Every bit pattern decodes to the exact value its format defines, -0 and NaN included."""
    fmt = X.FORMATS[name]
    for code, got in zip(_patterns(fmt), _decoded(name), strict=True):
        expected = X.decode(fmt, code)
        if isinstance(expected, Fraction):
            assert isinstance(got, float) and Fraction(got) == expected, (hex(code), got)
            assert (math.copysign(1.0, got) < 0) == (
                expected < 0 or X.is_negative_zero(fmt, code)
            ), hex(code)
        elif math.isnan(expected):
            assert math.isnan(got), (hex(code), got)
        else:
            assert got == expected, (hex(code), got)


def test_decode_e8m0_every_pattern_exactly():
    """float8_e8m0fnu decodes every code to 2**(code - 127), 0xFF to NaN."""
    for code, got in enumerate(_decoded("float8_e8m0fnu")):
        expected = X.decode_e8m0(code)
        if isinstance(expected, Fraction):
            assert Fraction(got) == expected, (code, got)
        else:
            assert math.isnan(got), (code, got)


# ------------------------------------------------------------------------------------------------
# Encoding


@pytest.mark.parametrize("name", ROUND_ONCE)
def test_encode_rounds_once_from_the_exact_value(name):
    """Formats PyTorch lacks: one rounding to nearest even from the float64 input itself."""
    fmt = X.FORMATS[name]
    inputs = _inputs(fmt, seed=len(name))
    expected = [X.encode(fmt, x) for x in inputs]
    assert not _mismatches(inputs, _codes(name, inputs), expected)


@pytest.mark.parametrize("name", ROUND_ONCE)
def test_encode_ints_round_once_exactly(name):
    """Ints round once from their exact value; past the range they overflow like floats."""
    fmt = X.FORMATS[name]
    ints = _ints(fmt)
    expected = [X.encode(fmt, n) for n in ints]
    assert not _mismatches(ints, _codes(name, ints), expected)


@pytest.mark.parametrize("name", ROUND_ONCE)
def test_encode_number_objects_round_once(name):
    """Complex (real part), bool and number-like inputs round once too, mixed with floats."""
    fmt = X.FORMATS[name]
    tie = float((_finite_magnitudes(fmt)[1]) / 2)  # half the smallest subnormal
    above = math.nextafter(tie, INF)
    pytest.importorskip("numpy")
    import numpy as np

    inputs: list[Any] = [complex(above, 5.0), np.float64(above), True, above, -above, 0.5]
    expected = [X.encode(fmt, v) for v in (above, above, 1, above, -above, 0.5)]
    assert _codes(name, inputs) == expected
    assert expected[0] == 1  # the smallest subnormal, where float32 rounding would give 0


@pytest.mark.parametrize("name", THROUGH_FLOAT32)
def test_encode_rounds_through_float32_like_pytorch(name):
    """PyTorch's formats: rounded to float32 (nearest even), then to the target (nearest even)."""
    fmt = X.FORMATS[name]
    inputs = _inputs(fmt, seed=len(name))
    expected = [X.encode(fmt, X.round_to_float32(x)) for x in inputs]
    assert not _mismatches(inputs, _codes(name, inputs), expected)


@pytest.mark.parametrize("name", THROUGH_FLOAT32)
def test_encode_ints_round_once_to_float32_then_to_the_format(name):
    """PyTorch's formats take an int through float32 (rounded once from the int), as torch does."""
    fmt = X.FORMATS[name]
    ints = [*_ints(fmt), 2**60 + 2**36 + 1, 2**24 + 3, -(2**25) - 3]
    expected = [X.encode(fmt, X.round_to_float32(n)) for n in ints]
    assert not _mismatches(ints, _codes(name, ints), expected)


def test_encode_e8m0_follows_c10_from_float32():
    """float8_e8m0fnu: c10's rounding of the float32 value; sign ignored; inf, NaN, overflow NaN."""
    rng = random.Random(8)
    powers = [2.0**e for e in range(-140, 130)]
    inputs = [*SPECIALS, *powers, *(1.5 * p for p in powers), *(-1.5 * p for p in powers)]
    inputs += [math.nextafter(1.5 * p, 0.0) for p in powers]
    inputs += [1.5 * p * (1 - 2.0**-30) for p in powers]  # float32 rounds these onto 1.5 * p
    inputs += [2.0**-127 * (1 + 2.0**-30), 2.0**-127 * (1 + 2.0**-20), 2.0**-200, -(2.0**-127)]
    inputs += [rng.random() * 2.0 ** rng.uniform(-150, 150) for _ in range(2000)]
    expected = [X.encode_e8m0(X.round_to_float32(x)) for x in inputs]
    assert not _mismatches(inputs, _codes("float8_e8m0fnu", inputs), expected)


@pytest.mark.parametrize("name", REFERENCED)
def test_reencode_every_pattern_exactly(name):
    """Every non-NaN pattern re-encodes to itself; NaN to the format's NaN, sign as it keeps it."""
    fmt = X.FORMATS[name]
    values = _decoded(name)
    expected = [
        X.encode(fmt, value) if math.isnan(value) else code
        for code, value in zip(_patterns(fmt), values, strict=True)
    ]
    assert not _mismatches(values, _codes(name, values), expected)


# ------------------------------------------------------------------------------------------------
# The issue's cases and where PyTorch's rounding differs


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        # Just above half the smallest subnormal: float32 rounds it onto the tie, which goes to 0.
        ("float8_e3m4", 0.007812500000000002, 0.015625),
        ("float8_e4m3", math.nextafter(2.0**-10, 1.0), 2.0**-9),
        ("float8_e4m3b11fnuz", math.nextafter(2.0**-14, 1.0), 2.0**-13),
        # Ties between normal values, approached from either side.
        ("float8_e3m4", (1 + 1 / 32) * (1 + 2.0**-30), 1.0625),
        ("float8_e3m4", (1 + 3 / 32) * (1 - 2.0**-30), 1.0625),
        ("float8_e4m3", -(1 + 1 / 16) * (1 + 2.0**-40), -1.125),
        # Just below the overflow threshold (15.75, 248, 31): the largest finite, not inf / NaN.
        ("float8_e3m4", 15.75 * (1 - 2.0**-30), 15.5),
        ("float8_e4m3", 248.0 * (1 - 2.0**-30), 240.0),
        ("float8_e4m3b11fnuz", 31.0 * (1 - 2.0**-30), 30.0),
    ],
)
def test_round_once_issue_cases(name, value, expected):
    """tb.tensor(float64, dtype) for formats PyTorch lacks gives the nearest value, not 0 / even."""
    assert tb.tensor([value], dtype=getattr(tb, name)).tolist() == [expected]
    assert tb.tensor([-value], dtype=getattr(tb, name)).tolist() == [-expected]


# (name, a float64 value that float32 rounds onto a tie, PyTorch's result, the single rounding)
_PYTORCH_DOUBLE_ROUNDING = [
    ("float8_e4m3fn", (1 + 1 / 16) * (1 + 2.0**-30), 1.0, 1.125),
    ("float8_e4m3fnuz", 2.0**-11 * (1 + 2.0**-30), 0.0, 2.0**-10),
    ("float8_e5m2", (1 + 1 / 8) * (1 + 2.0**-30), 1.0, 1.25),
    ("float8_e5m2fnuz", 61440.0 * (1 - 2.0**-30), NAN, 57344.0),  # the overflow threshold
    ("float16", (1 + 2.0**-11) * (1 + 2.0**-30), 1.0, 1 + 2.0**-10),
    ("bfloat16", (1 + 2.0**-8) * (1 + 2.0**-30), 1.0, 1 + 2.0**-7),
    ("float8_e8m0fnu", 1.5 * (1 - 2.0**-30), 2.0, 1.0),
]


@pytest.mark.parametrize(
    ("name", "value", "pytorch", "single"),
    _PYTORCH_DOUBLE_ROUNDING,
    ids=[c[0] for c in _PYTORCH_DOUBLE_ROUNDING],
)
def test_pytorch_formats_keep_pytorchs_double_rounding(name, value, pytorch, single):
    """Where float32 rounds a value onto a tie, PyTorch's formats give PyTorch's result."""
    got = tb.tensor([value], dtype=getattr(tb, name)).tolist()[0]
    assert got == pytorch or (math.isnan(got) and math.isnan(pytorch))
    if name == "float8_e8m0fnu":
        assert X.decode_e8m0(X.encode_e8m0(value)) == single  # c10's rule on the exact value
    else:
        assert X.to_value(X.FORMATS[name], value) == single


@pytest.mark.parametrize(
    ("name", "value", "pytorch", "single"),
    _PYTORCH_DOUBLE_ROUNDING,
    ids=[c[0] for c in _PYTORCH_DOUBLE_ROUNDING],
)
def test_pytorch_double_rounding_cases_are_torchs(name, value, pytorch, single):
    """The PyTorch results in the table above are what torch 2.13's float64 casts give."""
    torch = pytest.importorskip("torch")
    got = torch.tensor([value], dtype=torch.float64).to(getattr(torch, name)).double().item()
    assert got == pytorch or (math.isnan(got) and math.isnan(pytorch))


@pytest.mark.parametrize("name", ROUND_ONCE)
def test_encode_exact_inputs_in_any_container(name):
    """All-exact lists, tuples and single writes agree; a moved value among them is re-rounded."""
    fmt = X.FORMATS[name]
    exact = [float(v) for v in _finite_magnitudes(fmt)] + [
        -float(v) for v in _finite_magnitudes(fmt)
    ]
    codes = [X.encode(fmt, v) for v in exact]
    assert _codes(name, exact) == codes
    dtype = getattr(tbd, name)
    assert list(_codec.pack(dtype, tuple(exact))) == codes
    assert [_codes(name, [v])[0] for v in exact] == codes
    moved = math.nextafter(float(_finite_magnitudes(fmt)[1]) / 2, 1.0)  # float32: the tie
    assert _codes(name, [*exact, moved, 0]) == [*codes, 1, 0]
