"""The element codec decodes, encodes, casts and checks scalars as PyTorch 2.13 does on the CPU.

Formats PyTorch lacks (float8_e3m4, float8_e4m3, float8_e4m3b11fnuz) are checked against exact
references in tests/test_codec_exact.py; here only their NaN patterns and overflow results, which
ml_dtypes defines, are compared with ml_dtypes (any release from 0.5 on).
Bit patterns are compared as bytes, so NaN encodings and signed zeros count; decoded values are
compared with NaN equal to NaN.
"""

from __future__ import annotations

import array
import ctypes
import itertools
import math
import random
import struct
import sys
from fractions import Fraction
from typing import Any

import pytest

from tensorbridge import _codec
from tensorbridge import _dtype as tbd

INF, NAN = math.inf, math.nan
TORCH_FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                "float8_e8m0fnu"]  # fmt: skip
ML_FLOAT8 = ["float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz"]
# Every dtype PyTorch can cast between (float4_e2m1fn_x2 has no conversions in torch).
TORCH_DTYPES = [d.name for d in tbd.ALL_DTYPES if d.name not in [*ML_FLOAT8, "float4_e2m1fn_x2"]]

ignore_torch_warnings = pytest.mark.filterwarnings(
    # complex32 is "experimental" and complex -> real casts warn; neither concerns the codec.
    "ignore::UserWarning"
)


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ml() -> Any:
    np = pytest.importorskip("numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return np, ml_dtypes


# ------------------------------------------------------------------------------------------------
# Helpers


def _same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN, and the sign of a real zero counted."""
    if isinstance(a, complex) or isinstance(b, complex):
        a, b = complex(a), complex(b)
        return _same(a.real, b.real) and _same(a.imag, b.imag)
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return type(a) is type(b) and a == b


def _assert_same_values(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    bad = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if not _same(g, e)]
    shown = [(i, got[i], expected[i]) for i in bad[:5]]
    assert not bad, f"{len(bad)} mismatches, first (index, got, expected): {shown}"


def _assert_same_bytes(got: bytes, expected: bytes, dtype: Any, inputs: list[Any]) -> None:
    """Element-wise equal bit patterns, except that any NaN matches any NaN.

    torch's NaN payloads depend on the kernel path (bfloat16 NaN is 0x7FC0 from its scalar loop but
    0xFFFF from its vectorised one; float8 -> float32 NaNs carry format-specific payloads), so only
    the NaN-ness of those elements is compared; `test_reencode_every_pattern_like_torch` pins the
    codec's own NaN encodings.
    """
    size = dtype.itemsize
    assert len(got) == len(expected) == len(inputs) * size
    if got == expected:
        return
    ours, theirs = _codec.unpack(dtype, got), _codec.unpack(dtype, expected)
    bad = [
        i
        for i in range(len(inputs))
        if got[i * size : (i + 1) * size] != expected[i * size : (i + 1) * size]
        and not _both_nan(ours[i], theirs[i])
    ]
    shown = [
        (inputs[i], got[i * size : (i + 1) * size].hex(), expected[i * size : (i + 1) * size].hex())
        for i in bad[:5]
    ]
    assert not bad, f"{len(bad)} of {len(inputs)} differ, first (input, got, reference): {shown}"


def _both_nan(a: Any, b: Any) -> bool:
    if isinstance(a, complex):
        return all(
            _same(x, y) or (math.isnan(x) and math.isnan(y))
            for x, y in ((a.real, b.real), (a.imag, b.imag))
        )
    return isinstance(a, float) and math.isnan(a) and math.isnan(b)


def _torch_bytes(torch: Any, t: Any) -> bytes:
    return bytes(t.contiguous().view(torch.uint8).tolist())


def _all_patterns(itemsize: int) -> bytes:
    return bytes(range(256)) if itemsize == 1 else array.array("H", range(1 << 16)).tobytes()


def _from_patterns(torch: Any, name: str) -> Any:
    """A torch tensor of every bit pattern of dtype `name` (1 or 2 bytes)."""
    dtype = getattr(tbd, name)
    raw = torch.frombuffer(bytearray(_all_patterns(dtype.itemsize)), dtype=torch.uint8)
    return raw.view(getattr(torch, name))


def _probes(positive: list[float]) -> list[float]:
    """Values around every gap between consecutive representable magnitudes, both signs.

    Each gap contributes its ends, its midpoint (a tie), the float64 neighbours of the midpoint,
    its float32 neighbours, and points 2**-30 away, which float32 rounds onto the midpoint (so a
    single rounding from float64 would differ from PyTorch's double rounding).
    """
    mags = sorted({0.0, *positive})
    gaps = list(itertools.pairwise(mags))
    gaps.append((mags[-1], 2 * mags[-1] - mags[-2]))  # past the largest finite value
    out: list[float] = []
    for low, high in gaps:
        mid = (low + high) / 2
        out += [
            low,
            mid,
            math.nextafter(mid, 0.0),
            math.nextafter(mid, INF),
            high,
            mid * (1 - 2.0**-24),
            mid * (1 + 2.0**-24),
            mid * (1 - 2.0**-30),
            mid * (1 + 2.0**-30),
        ]
    return out + [-v for v in out]


FLT_MAX = struct.unpack("f", struct.pack("I", 0x7F7FFFFF))[0]
# fmt: off
SPECIALS = [
    0.0, -0.0, INF, -INF, NAN, -NAN, 5e-324, 1e-300, 1e-40, 1e300, sys.float_info.max,
    FLT_MAX, FLT_MAX * (1 + 2.0**-25),  # rounds down to FLT_MAX
    2.0**128 - 2.0**104, 2.0**128 - 2.0**104 - 2.0**75, 2.0**128,  # float32's overflow tie
    2.0**-149, 2.0**-150, 2.0**-150 * (1 + 2.0**-20), 3 * 2.0**-151,  # float32's underflow tie
    2.0**-126, 2.0**-127, 2.0**-127 * 1.5, 2.0**127 * 1.5, 2.0**127 * 1.4999999,  # e8m0 rounding
]
# fmt: on


def _random_values(seed: int, count: int, top: float) -> list[float]:
    """Values spread over float32's whole exponent range and beyond, and uniform in +-2*top."""
    rng = random.Random(seed)
    wide = [
        rng.choice((1, -1)) * rng.random() * 2.0 ** rng.uniform(-160, 160) for _ in range(count)
    ]
    near = [rng.uniform(-2 * top, 2 * top) for _ in range(count)]
    return wide + near


def _encode_inputs(decoded: list[float], seed: int) -> list[float]:
    """Special values, the probes around every gap of the format, and random values."""
    finite = [v for v in decoded if math.isfinite(v) and v > 0]
    return SPECIALS + _probes(finite) + _random_values(seed, 3000, max(finite))


# ------------------------------------------------------------------------------------------------
# Decoding every bit pattern


@pytest.mark.parametrize("name", [*TORCH_FLOAT8, "float16", "bfloat16"])
def test_decode_every_pattern_like_torch(torch, name):
    """Every bit pattern of a PyTorch 8/16-bit float decodes to the value torch gives."""
    dtype = getattr(tbd, name)
    expected = _from_patterns(torch, name).to(torch.float64).tolist()
    _assert_same_values(_codec.unpack(dtype, _all_patterns(dtype.itemsize)), expected)


def _expected_reencoding(
    patterns: bytes, size: int, values: list[Any], nan_codes: list[bytes]
) -> bytes:
    """Each pattern itself, except NaNs: the reference's encoding of NaN with the pattern's sign."""
    sign_byte = size - 1 if sys.byteorder == "little" else 0
    out = bytearray()
    for i, value in enumerate(values):
        pattern = patterns[i * size : (i + 1) * size]
        out += nan_codes[pattern[sign_byte] >> 7] if math.isnan(value) else pattern
    return bytes(out)


@pytest.mark.parametrize("name", [*TORCH_FLOAT8, "float16", "bfloat16"])
def test_reencode_every_pattern_like_torch(torch, name):
    """pack(unpack(p)) is p for every non-NaN pattern, and torch's encoding of +-nan for NaN ones.

    NOTE: torch's NaN bits depend on the kernel path (its vectorised float32 -> float16 cast keeps
    payloads, a float32 -nan becomes bfloat16 0xFFFF); the codec always writes the canonical NaN
    that torch gives a float64 nan.
    """
    dtype = getattr(tbd, name)
    patterns = _all_patterns(dtype.itemsize)
    values = _codec.unpack(dtype, patterns)
    nan_codes = [
        _torch_bytes(
            torch,
            torch.tensor([math.copysign(NAN, sign)], dtype=torch.float64).to(getattr(torch, name)),
        )
        for sign in (1.0, -1.0)
    ]
    expected = _expected_reencoding(patterns, dtype.itemsize, values, nan_codes)
    assert _codec.pack(dtype, values) == expected


# ------------------------------------------------------------------------------------------------
# Encoding floats


@pytest.mark.parametrize("name", [*TORCH_FLOAT8, "float16", "bfloat16", "float32"])
def test_encode_float64_like_torch(torch, name):
    """Rounding, ties, subnormals, overflow, inf and NaN from float64 match torch's .to(dtype)."""
    dtype = getattr(tbd, name)
    if dtype.itemsize <= 2:
        decoded = _codec.unpack(dtype, _all_patterns(dtype.itemsize))
    else:  # float32: its extremes (every gap would be 2**32 probes)
        decoded = [2.0**-149, 2.0**-148, 2.0**-126, 1.0, math.nextafter(FLT_MAX, 0.0), FLT_MAX]
    inputs = _encode_inputs(decoded, seed=len(name))
    expected = torch.tensor(inputs, dtype=torch.float64).to(getattr(torch, name))
    _assert_same_bytes(_codec.pack(dtype, inputs), _torch_bytes(torch, expected), dtype, inputs)


@pytest.mark.parametrize("name", ML_FLOAT8)
def test_nan_inf_and_overflow_like_ml_dtypes(ml, name):
    """Formats PyTorch lacks write ml_dtypes' NaN patterns and overflow results.

    ml_dtypes defines these formats' NaN encodings and their non-saturating overflow; the inputs
    are ones every ml_dtypes release from 0.5 on encodes alike (rounding is tested exactly in
    tests/test_codec_exact.py: before 0.7 ml_dtypes rounded float64 through float32).
    """
    np, ml_dtypes = ml
    dtype = getattr(tbd, name)
    finite = [v for v in _codec.unpack(dtype, bytes(range(256))) if math.isfinite(v)]
    top = max(finite)
    inputs = [NAN, -NAN, INF, -INF, 1e300, -1e300, 2 * top, -2 * top, 0.0, -0.0, *finite]
    with np.errstate(all="ignore"):
        expected = np.array(inputs, dtype=np.float64).astype(getattr(ml_dtypes, name))
    assert _codec.pack(dtype, inputs) == expected.view(np.uint8).tobytes()


@pytest.mark.parametrize(
    "name",
    [
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "float8_e4m3fn",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    ],
)
def test_encode_large_ints_like_torch(torch, name):
    """int64 -> float rounds the integer once to float32 (not via float64), as torch's casts do."""
    rng = random.Random(7)
    ints = [2**60 + 2**36 + 1, -(2**60 + 2**36 + 1), 2**63 - 1, -(2**63), 2**53 + 1, 2**24 + 1,
            2**54 + 2**30 + 1, 65519, 65520, 449, -449]  # fmt: skip
    ints += [rng.randrange(-(2**63), 2**63) >> rng.randrange(64) for _ in range(2000)]
    expected = _torch_bytes(torch, torch.tensor(ints, dtype=torch.int64).to(getattr(torch, name)))
    dtype = getattr(tbd, name)
    _assert_same_bytes(_codec.pack(dtype, ints), expected, dtype, ints)


# ------------------------------------------------------------------------------------------------
# Casts between every pair of PyTorch dtypes

# fmt: off
_INT_CANDIDATES = [
    0, 1, -1, 2, 7, 100, 127, 128, 255, 256, -128, -129, 1000, 32767, 32768, 65535, 65536,
    -32768, -32769, 2**31 - 1, 2**31, -(2**31), 2**32 - 1, 2**53 + 1, 2**60 + 2**36 + 1,
    2**63 - 1, -(2**63), 2**63 + 12345, 2**64 - 1,
]
_FLOAT_CANDIDATES = [
    0.0, -0.0, 0.5, -0.5, 1.0, -1.5, 2.5, 3.75, 100.3, -200.7, 255.9, -128.9, 1e-3, 1e-8, 1e-40,
    448.0, 449.0, 240.0, 57344.0, 65504.0, 65520.0, 1e6, 4e9, -3e9, 1e19, 3e38, 1e300, INF, -INF,
    NAN, 2.0**-127, 1.0625 + 2.0**-40,
]
# fmt: on


def _int_range(dtype: Any) -> tuple[int, int]:
    if dtype.kind == "u":
        return 0, 2**dtype.bits - 1
    return -(2 ** (dtype.bits - 1)), 2 ** (dtype.bits - 1) - 1


def _source_values(name: str) -> list[Any]:
    dtype = getattr(tbd, name)
    if dtype.kind == "b":
        return [False, True]
    if dtype.kind in "ui":
        low, high = _int_range(dtype)
        return [v for v in _INT_CANDIDATES if low <= v <= high]
    if dtype.kind == "c":
        reals = [*_FLOAT_CANDIDATES[:12], INF, NAN]
        return [complex(r, i) for r in reals for i in (0.0, -2.5, INF, NAN)]
    return _FLOAT_CANDIDATES


def _torch_tensor(torch: Any, name: str, values: list[Any]) -> Any:
    """A torch tensor of `values` in dtype `name`, rounded by torch itself.

    Ints go through their bytes: torch.tensor refuses ints past int64.
    """
    dtype = getattr(tbd, name)
    if dtype.kind in "ui":
        raw = bytearray(array.array(dtype.format, values).tobytes())
        return torch.frombuffer(raw, dtype=getattr(torch, name))
    base = torch.tensor(values, dtype=torch.complex128 if dtype.kind == "c" else torch.float64)
    return base.to(getattr(torch, name))


def _fits(value: Any, target: Any) -> bool:
    """Whether PyTorch's conversion of `value` to `target` is defined (not C++ UB)."""
    if target.kind not in "ui" or isinstance(value, (bool, int)):
        return True
    real = value.real
    if not math.isfinite(real):
        return False
    low, high = _int_range(target)
    return low <= math.trunc(real) <= high


@ignore_torch_warnings
@pytest.mark.parametrize("source", TORCH_DTYPES)
def test_casts_like_torch(torch, source):
    """Values of one dtype convert to every other dtype with torch's bits (defined cases only)."""
    src = getattr(tbd, source)
    t = _torch_tensor(torch, source, _source_values(source))
    values = _codec.unpack(src, _torch_bytes(torch, t))
    compared = 0
    for target_name in TORCH_DTYPES:
        target = getattr(tbd, target_name)
        keep = [i for i, v in enumerate(values) if _fits(v, target)]
        kept = [values[i] for i in keep]
        expected = _torch_bytes(torch, t[keep].to(getattr(torch, target_name)))
        _assert_same_bytes(_codec.pack(target, kept), expected, target, kept)
        compared += len(kept)
    assert compared > len(values) * len(TORCH_DTYPES) // 2


def test_float_to_int_out_of_range_rule():
    """Out-of-range floats truncate toward zero then wrap modulo 2**bits; NaN and +-inf give 0."""
    inputs = [300.7, -300.7, -1.5, 1e30, -1e30, 2.0**70 + 2.0**20, NAN, INF, -INF, 300.9 + 5j]
    for dtype in (tbd.int8, tbd.uint8, tbd.int16, tbd.uint32, tbd.int64, tbd.uint64):
        bits, signed = dtype.bits, dtype.kind == "i"
        expected = []
        for v in inputs:
            real = v.real
            n = math.trunc(real) % 2**bits if math.isfinite(real) else 0
            expected.append(n - 2**bits if signed and n >= 2 ** (bits - 1) else n)
        assert _codec.unpack(dtype, _codec.pack(dtype, inputs)) == expected
    assert _codec.unpack(tbd.int8, _codec.pack(tbd.int8, [300.7, -300.7, NAN])) == [44, -44, 0]
    assert _codec.unpack(tbd.uint8, _codec.pack(tbd.uint8, [-1.5, 256.0, -INF])) == [255, 0, 0]


def test_float_to_int_out_of_range_agrees_with_torch_where_it_wraps(torch):
    """For |x| < 2**31, torch's x86 results for 8/16-bit targets are exactly the wrap rule."""
    inputs = [300.7, -300.7, 70000.5, -70000.5, 2.0**31 - 1, -(2.0**31), 1234567.9]
    for name in ("int8", "uint8", "int16", "uint16"):
        dtype = getattr(tbd, name)
        expected = torch.tensor(inputs, dtype=torch.float64).to(getattr(torch, name))
        assert _codec.pack(dtype, inputs) == _torch_bytes(torch, expected)


def test_int_to_int_wraps():
    """Ints outside the target range wrap modulo 2**bits, whatever their size."""
    assert _codec.unpack(tbd.int8, _codec.pack(tbd.int8, [128, -129, 2**100 + 5])) == [-128, 127, 5]
    assert _codec.unpack(tbd.uint64, _codec.pack(tbd.uint64, [-1])) == [2**64 - 1]


def test_bool_target_is_nonzero_test():
    """bool is value != 0: NaN is True, a complex is True when either part is non-zero."""
    inputs = [0, 0.0, -0.0, NAN, 1e-300, 0j, 1j, complex(0, NAN), -3, True, False]
    got = _codec.unpack(tbd.bool, _codec.pack(tbd.bool, inputs))
    assert got == [False, False, False, True, True, False, True, True, True, True, False]


def test_bool_decodes_any_nonzero_byte_as_true(torch):
    """Bytes other than 0 and 1 in a bool buffer read as True, as torch reads them."""
    raw = bytes([0, 1, 2, 255])
    expected = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(torch.bool).tolist()
    assert _codec.unpack(tbd.bool, raw) == expected == [False, True, True, True]


def test_complex_to_real_keeps_real_part_without_warning():
    """Complex -> real drops the imaginary part silently (torch warns; the codec does not)."""
    assert _codec.unpack(tbd.float32, _codec.pack(tbd.float32, [complex(1.5, 2)])) == [1.5]
    assert _codec.convert(tbd.float8_e4m3fn, complex(1000, 1)) == 448.0


def test_real_to_complex32_rounds_each_part_as_float16():
    """complex32 stores each part as float16: 70000 -> inf, 1/3 -> float16(1/3)."""
    got = _codec.convert(tbd.complex32, complex(70000, 1 / 3))
    assert got == complex(INF, struct.unpack("e", struct.pack("e", 1 / 3))[0])


# ------------------------------------------------------------------------------------------------
# check_scalar

# fmt: off
_SCALARS: list[Any] = [
    True, False, 0, 1, -1, 255, 256, -255, -256, 300, 65504, 65505, -65505, 449, -449, 2**31,
    2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 0.0, -0.0, 0.5, 1.5, -1.0, 255.5,
    448.0, 449.0, 65504.0, 65519.0, 1e6, 3.5e38, 1e300, 2.0**63, 2.0**64, 2.0**-127, 2.0**-130,
    NAN, INF, -INF, 1 + 0j, 1 + 2j, 1e6 + 0j, 1e300j, complex(NAN, 0), complex(0, 7e4),
]
# fmt: on


def _torch_write(torch: Any, name: str, value: Any, api: str, numel: int) -> Any:
    """torch's outcome: the stored element's bytes, or (exception type, message)."""
    shape = () if numel == 0 else (numel,)  # numel 0 stands for a 0-d tensor here
    try:
        if api == "full":
            t = torch.full(shape, value, dtype=getattr(torch, name))
        else:
            t = torch.zeros(shape, dtype=getattr(torch, name))
            if api == "fill_":
                t.fill_(value)
            else:
                t[...] = value
    except (RuntimeError, ValueError, OverflowError, NotImplementedError) as exc:
        return type(exc), str(exc)
    return _torch_bytes(torch, t.reshape(-1)[:1])


@ignore_torch_warnings
@pytest.mark.parametrize(("api", "numel"), [("fill_", 2), ("full", 3), ("__setitem__", 2),
                                            ("fill_", 1), ("full", 0)])  # fmt: skip
@pytest.mark.parametrize("name", [*TORCH_DTYPES, "float4_e2m1fn_x2"])
def test_check_scalar_like_torch(torch, name, api, numel):
    """check_scalar raises torch's exception type and text; accepted scalars store torch's bits."""
    dtype = getattr(tbd, name)
    for value in _SCALARS:
        outcome = _torch_write(torch, name, value, api, numel)
        if isinstance(outcome, tuple):
            kind, text = outcome
            with pytest.raises(kind) as info:
                _codec.check_scalar(dtype, value, api, numel=max(numel, 1))
            assert str(info.value).startswith(f"{api}(): ")
            assert text in str(info.value), (value, text)
        else:
            _codec.check_scalar(dtype, value, api, numel=max(numel, 1))
            got = _codec.pack(dtype, [value])
            _assert_same_bytes(got, outcome, dtype, [value])


def test_check_scalar_messages():
    """Messages carry the api prefix, torch's text, the value and a remedy."""
    with pytest.raises(
        RuntimeError,
        match=r"^fill_\(\): value cannot be converted to type "
        r"uint8_t without overflow; got 300\. ",
    ):
        _codec.check_scalar(tbd.uint8, 300, "fill_")
    with pytest.raises(ValueError, match=r"^Tensor.__setitem__\(\): Overflow when unpacking long "):
        _codec.check_scalar(tbd.uint64, 2**63, "Tensor.__setitem__")
    with pytest.raises(OverflowError, match="int too big to convert"):
        _codec.check_scalar(tbd.bool, 2**64, "full")
    with pytest.raises(TypeError, match="expected a Python number"):
        _codec.check_scalar(tbd.float32, "1.5", "fill_")


def test_check_scalar_ml_dtypes_formats_use_their_limits():
    """Formats torch lacks: overflow past the format's max; inf only where the format has it."""
    _codec.check_scalar(tbd.float8_e3m4, 15.5, "fill_")
    _codec.check_scalar(tbd.float8_e3m4, INF, "fill_")
    with pytest.raises(RuntimeError, match=r"type ml_dtypes\.float8_e3m4 without overflow"):
        _codec.check_scalar(tbd.float8_e3m4, 16.0, "fill_")
    with pytest.raises(RuntimeError, match="float8_e4m3b11fnuz"):
        _codec.check_scalar(tbd.float8_e4m3b11fnuz, INF, "fill_")
    _codec.check_scalar(tbd.float8_e4m3b11fnuz, 1e6, "__setitem__")


# ------------------------------------------------------------------------------------------------
# Buffers, inputs and the raw float4 codec

_SAMPLES: dict[str, list[Any]] = {
    "b": [True, False, True],
    "u": [0, 1, 200],
    "i": [-5, 0, 100],
    "f": [1.5, -0.25, 3.0],
    "c": [1.5 - 2j, 0j, 3.0 + 0.5j],
}


@pytest.mark.parametrize("dtype", tbd.ALL_DTYPES, ids=lambda d: d.name)
def test_unpack_unaligned_and_foreign_memory(dtype):
    """Elements decode identically from an odd address, a ctypes buffer and a non-'B' memoryview."""
    values = _SAMPLES["u" if dtype is tbd.float4_e2m1fn_x2 else dtype.kind]
    raw = _codec.pack(dtype, values)
    expected = _codec.unpack(dtype, raw)
    shifted = bytearray(1) + raw
    assert _codec.unpack(dtype, memoryview(shifted)[1:]) == expected
    foreign = (ctypes.c_char * (len(raw) + 3)).from_buffer_copy(b"\0\0\0" + raw)
    assert _codec.unpack(dtype, memoryview(foreign).cast("B")[3:]) == expected
    assert (
        _codec.unpack(
            dtype,
            memoryview(bytearray(raw + b"\0" * 16))
            .cast("B")
            .cast("B", (len(raw) + 16,))[: len(raw)],
        )
        == expected
    )


def test_unpack_rejects_strided_views():
    """A non-contiguous view raises ValueError instead of decoding the wrong bytes."""
    with pytest.raises(ValueError, match="C-contiguous"):
        _codec.unpack(tbd.uint8, memoryview(b"abcdef")[::2])


def test_unpack_ignores_a_trailing_partial_element():
    """unpack decodes len(data) // itemsize elements."""
    assert _codec.unpack(tbd.int32, struct.pack("i", -7) + b"\x01\x02\x03") == [-7]
    assert _codec.unpack(tbd.complex64, b"\0" * 7) == []


def test_pack_accepts_mixed_numbers_and_any_sequence():
    """Mixed bool/int/float/complex and non-list sequences pack element by element."""
    mixed = [True, 2, 3.5, 2**60 + 2**36 + 1, 1 + 0j]
    for dtype in (tbd.float32, tbd.bfloat16, tbd.float8_e5m2, tbd.int16, tbd.complex64):
        one_by_one = b"".join(_codec.pack(dtype, [v]) for v in mixed)
        assert _codec.pack(dtype, mixed) == one_by_one
        assert _codec.pack(dtype, tuple(mixed)) == one_by_one
        assert _codec.pack(dtype, (v for v in mixed)) == one_by_one  # type: ignore[arg-type]


def test_pack_accepts_number_like_objects():
    """Objects with __index__ / __float__ (NumPy scalars, Fractions) pack like their values."""

    class Index:
        def __index__(self) -> int:
            return 300

    assert _codec.pack(tbd.uint8, [Index()]) == bytes([44])
    assert _codec.pack(tbd.float32, [Fraction(1, 4)]) == struct.pack("f", 0.25)
    assert _codec.convert(tbd.complex64, Fraction(3, 2)) == 1.5 + 0j


def test_pack_accepts_numpy_scalars():
    """NumPy scalars pack as the number they stand for (complex ones keep the imaginary part)."""
    np = pytest.importorskip("numpy")
    cases = [
        (tbd.complex64, np.complex64(1 + 2j), 1 + 2j),
        (tbd.bool, np.complex128(2j), True),
        (tbd.int8, np.bool_(True), 1),
        (tbd.float32, np.int64(2**60 + 2**36 + 1), float(2**60 + 2**37)),
        (tbd.uint8, np.float32(-1.5), 255),
        (tbd.float8_e4m3fn, np.float16(2.5), 2.5),
    ]
    for dtype, value, expected in cases:
        assert _same(_codec.convert(dtype, value), expected), (dtype, value)
    with pytest.raises(RuntimeError, match="c10::Float8_e8m0fnu"):
        _codec.check_scalar(tbd.float8_e8m0fnu, np.float64(-1.0), "fill_")


@pytest.mark.parametrize("dtype", [tbd.float32, tbd.int8, tbd.bool, tbd.complex128, tbd.bfloat16])
def test_pack_rejects_non_numbers(dtype):
    """Strings and None raise TypeError naming the value."""
    with pytest.raises(TypeError, match=r"got '1\.5'"):
        _codec.pack(dtype, [1.0, "1.5"])
    with pytest.raises(TypeError, match="got None"):
        _codec.pack(dtype, [None])


def test_huge_ints_to_floats_round_or_overflow():
    """Ints beyond float range become inf instead of raising."""
    huge = [10**400, -(10**400)]
    assert _codec.unpack(tbd.float64, _codec.pack(tbd.float64, huge)) == [INF, -INF]
    past = [2**128, 2**128 - 2**103]
    assert _codec.unpack(tbd.float32, _codec.pack(tbd.float32, past)) == [INF, INF]
    assert _codec.convert(tbd.float32, 2**128 - 2**104 - 1) == FLT_MAX


def test_float4_is_raw_bytes(torch):
    """float4_e2m1fn_x2 decodes to the byte (torch cannot decode it) and packs ints only."""
    raw = bytes([0x12, 0xFF, 0x07])
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    with pytest.raises(RuntimeError):
        t.tolist()
    assert _codec.unpack(tbd.float4_e2m1fn_x2, raw) == t.view(torch.uint8).tolist() == [18, 255, 7]
    assert _codec.pack(tbd.float4_e2m1fn_x2, [18, 255, 256, True]) == bytes([18, 255, 0, 1])
    with pytest.raises(NotImplementedError, match="Float4_e2m1fn_x2"):
        _codec.pack(tbd.float4_e2m1fn_x2, [1.5])


@pytest.mark.parametrize(
    ("dtype", "value", "expected"),
    [
        (tbd.float8_e4m3fn, 1000.0, 448.0),
        (tbd.float8_e4m3fn, -INF, -448.0),
        (tbd.float8_e5m2, 1e6, INF),
        (tbd.float8_e4m3fnuz, -1e-10, 0.0),
        (tbd.float8_e8m0fnu, 0, 2.0**-127),
        (tbd.float8_e8m0fnu, -3.0, 4.0),
        (tbd.float8_e8m0fnu, 1.4999999, 1.0),
        (tbd.bfloat16, 1.00390625, 1.0),
        (tbd.float16, 65519.0, 65504.0),
        (tbd.uint8, -1, 255),
        (tbd.int64, 2**63, -(2**63)),
        (tbd.bool, NAN, True),
    ],
)
def test_convert(dtype, value, expected):
    """convert gives the value an element holds after the write."""
    assert _same(_codec.convert(dtype, value), expected)
