"""Printing: repr(t) is PyTorch's text for the same tensor; print options behave as PyTorch's.

The corpus is generated: every dtype, shapes from 0-d to 4-d, empty shapes, values chosen to drive
each formatter mode (integer widths, the ``1.`` form, fixed and scientific notation, nan/inf,
complex parts) and tensors past the summarisation threshold. Each case is compared string for
string with PyTorch's own printing code, run on the same values with the dtype named
``tensorbridge.<name>`` (so the suffix wrapping counts the real length of that name).
"""

from __future__ import annotations

import builtins
import contextlib
import math
import random
import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

import tensorbridge as tb
from tensorbridge import _format

torch = pytest.importorskip("torch")

# ------------------------------------------------------------------------------------------------
# The oracle: torch's printing code, with the dtype (and device) named as tensorbridge names them.


@contextlib.contextmanager
def _renamed(dtype_name: str, device: str | None) -> Iterator[None]:
    """Make torch/_tensor_str.py name the dtype ``tensorbridge.<dtype_name>`` (and the device).

    _str_intern spells the dtype and the device with ``str(...)``; a module global named ``str``
    shadows the builtin for that module only.
    """

    def renamed_str(obj: object = "") -> str:
        if isinstance(obj, torch.dtype):
            return f"tensorbridge.{dtype_name}"
        if device is not None and isinstance(obj, torch.device):
            return device
        return builtins.str(obj)

    module = torch._tensor_str
    module.str = renamed_str
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "ComplexHalf support is experimental"
            yield
    finally:
        del module.str


def _torch_repr(x: Any, dtype_name: str, device: str | None = None) -> str:
    with _renamed(dtype_name, device):
        return repr(x)


# ------------------------------------------------------------------------------------------------
# The corpus

_TORCH_REAL_FLOATS = ("float16", "bfloat16", "float32", "float64")
_TORCH_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
# float8 formats PyTorch lacks: printed as PyTorch prints its float8 types, from the exact values,
# which float64 holds; so the oracle is a float64 tensor named after them.
_ML_ONLY_FLOAT8 = ("float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz")
_INTS = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
_COMPLEX = ("complex32", "complex64", "complex128")
_ALL_DTYPES = (
    "bool",
    *_INTS,
    *_TORCH_REAL_FLOATS,
    *_TORCH_FLOAT8,
    "float8_e8m0fnu",
    *_ML_ONLY_FLOAT8,
    *_COMPLEX,
    "float4_e2m1fn_x2",
)

_SMALL_SHAPES = ((), (1,), (4,), (27,), (3, 4), (2, 3, 4), (2, 1, 3, 2), (6, 7))
_BIG_SHAPES = ((1001,), (2000,), (33, 31), (3, 400), (11, 10, 10), (5, 5, 5, 9))
_EMPTY_SHAPES = ((0,), (0, 3), (2, 0, 3), (1, 0))

_NAN, _INF = math.nan, math.inf


def _float_values(family: str, n: int, rng: random.Random) -> list[float]:
    """n floats that put PyTorch's _Formatter in one of its modes."""
    uniform, randint = rng.uniform, rng.randint
    draw = {
        "int_small": lambda: float(randint(-10, 10)),  # the 1. form
        "int_big": lambda: float(randint(-(10**9), 10**9)),  # integral, scientific (> 1e8)
        "fixed": lambda: uniform(-10, 10),
        "positive": lambda: uniform(0, 500),
        "wide": lambda: uniform(-1, 1) * 10.0 ** randint(-5, 5),  # ratio > 1000: scientific
        "tiny": lambda: uniform(-1e-5, 1e-5),  # below 1e-4: scientific
        "huge": lambda: uniform(-1, 1) * 1e12,  # above 1e8: scientific
        "special": lambda: rng.choice(
            [_NAN, _INF, -_INF, 0.0, -0.0, uniform(-3, 3), float(randint(-5, 5))]
        ),
        "nonfinite": lambda: rng.choice([_NAN, _INF, -_INF, 0.0, -0.0]),
        "int_special": lambda: rng.choice([_NAN, _INF, -_INF, 0.0, -0.0, float(randint(-99, 99))]),
    }[family]
    return [draw() for _ in range(n)]


# Values on the edges of the mode choice (ratio exactly 1000, the 1e-4 and 1e8 limits, -0.0).
_EDGE_VALUES = {
    "ratio_1000": [1.0, 1000.0, 500.0],
    "ratio_above_1000": [1.0, 1000.5],
    "min_1e-4": [1e-4, 0.05],
    "below_1e-4": [9.5e-5, 0.05],
    "max_1e8": [1e8, 2e7],
    "above_1e8": [1.5e8, 1e6],
    "negative_zero": [-0.0, 1.5, 0.0],
    "all_zero": [0.0, 0.0, -0.0],
    "all_nan": [_NAN, _NAN],
    "one_half_and_inf": [0.5, -_INF, _NAN],
}


def _int_values(dtype: Any, family: str, n: int, rng: random.Random) -> list[int]:
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**63)), min(info.max, 2**64 - 1)
    draw = {
        "small": lambda: rng.randint(max(low, 0), 9),
        "mixed": lambda: rng.randint(max(low, -300), min(high, 300)),
        "extreme": lambda: rng.choice([low, high, 0, 1, rng.randint(low, high)]),
    }[family]
    return [draw() for _ in range(n)]


class Case(NamedTuple):
    """A torch tensor holding the values to print, and the tensorbridge dtype to print them as."""

    id: str
    x: Any
    dtype_name: str
    requires_grad: bool = False


def _real_tensor(values: list[float], shape: tuple[int, ...], dtype_name: str) -> Any:
    x = torch.tensor(values, dtype=torch.float64).reshape(shape)
    if dtype_name in _ML_ONLY_FLOAT8:
        ml_dtypes = pytest.importorskip("ml_dtypes")
        np = pytest.importorskip("numpy")
        rounded = x.numpy().astype(getattr(ml_dtypes, dtype_name)).astype(np.float64)
        return torch.from_numpy(rounded)
    return x.to(getattr(torch, dtype_name))


def _cases_real(dtype_name: str) -> Iterator[Case]:
    families = (
        "int_small",
        "int_big",
        "fixed",
        "positive",
        "wide",
        "tiny",
        "huge",
        "special",
        "nonfinite",
        "int_special",
    )
    for k, family in enumerate(families):
        for shape in (_SMALL_SHAPES[k % 8], _SMALL_SHAPES[(k + 3) % 8]):
            rng = random.Random(f"{dtype_name}-{family}-{shape}")
            values = _float_values(family, math.prod(shape), rng)
            yield Case(
                f"{dtype_name}-{family}-{shape}",
                _real_tensor(values, shape, dtype_name),
                dtype_name,
            )
    for name, values in _EDGE_VALUES.items():
        yield Case(
            f"{dtype_name}-{name}", _real_tensor(values, (len(values),), dtype_name), dtype_name
        )
    for k, shape in enumerate(_BIG_SHAPES[: 3 if dtype_name in _TORCH_REAL_FLOATS else 2]):
        family = families[(k * 3 + len(dtype_name)) % len(families)]
        rng = random.Random(f"{dtype_name}-{family}-{shape}")
        values = _float_values(family, math.prod(shape), rng)
        yield Case(
            f"{dtype_name}-{family}-{shape}", _real_tensor(values, shape, dtype_name), dtype_name
        )


def _cases_e8m0() -> Iterator[Case]:
    """float8_e8m0fnu: powers of two from 2**-127 to 2**127, and nan (no zero, no sign, no inf)."""
    name = "float8_e8m0fnu"
    bytes_sets = {
        "small_powers": [127, 128, 129, 130],
        "fractions": [120, 127, 125],
        "wide": [0, 1, 127, 128, 254, 255],
        "min_only": [0, 0],
        "min_and_nan": [0, 255],
        "min_and_one": [0, 127],
        "nan_only": [255],
        "huge": [200, 254],
        "scalar": [130],
    }
    for label, raw in bytes_sets.items():
        x = torch.tensor(raw, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        yield Case(f"{name}-{label}", x.reshape(()) if label == "scalar" else x, name)
    rng = random.Random(name)
    for shape in ((3, 5), (2, 2, 3), (1200,), (2, 3, 300)):
        raw = [rng.choice([*range(110, 145), 0, 255]) for _ in range(math.prod(shape))]
        x = torch.tensor(raw, dtype=torch.uint8).view(torch.float8_e8m0fnu).reshape(shape)
        yield Case(f"{name}-random-{shape}", x, name)


def _cases_int(dtype_name: str) -> Iterator[Case]:
    dtype = getattr(torch, dtype_name)
    for k, family in enumerate(("small", "mixed", "extreme")):
        for shape in (_SMALL_SHAPES[k], _SMALL_SHAPES[k + 3], _SMALL_SHAPES[k + 5]):
            rng = random.Random(f"{dtype_name}-{family}-{shape}")
            values = _int_values(dtype, family, math.prod(shape), rng)
            yield Case(
                f"{dtype_name}-{family}-{shape}",
                torch.tensor(values, dtype=dtype).reshape(shape),
                dtype_name,
            )
    for shape in _BIG_SHAPES[1:3]:
        rng = random.Random(f"{dtype_name}-{shape}")
        values = _int_values(dtype, "mixed", math.prod(shape), rng)
        yield Case(
            f"{dtype_name}-big-{shape}",
            torch.tensor(values, dtype=dtype).reshape(shape),
            dtype_name,
        )


def _cases_bool() -> Iterator[Case]:
    for shape in (*_SMALL_SHAPES, _BIG_SHAPES[0], _BIG_SHAPES[5]):
        rng = random.Random(f"bool-{shape}")
        values = [rng.random() < 0.5 for _ in range(math.prod(shape))]
        yield Case(f"bool-{shape}", torch.tensor(values, dtype=torch.bool).reshape(shape), "bool")
    yield Case("bool-all-true", torch.ones(5, dtype=torch.bool), "bool")


def _cases_complex(dtype_name: str) -> Iterator[Case]:
    pairs = (
        ("fixed", "int_small"),
        ("int_small", "int_small"),
        ("tiny", "fixed"),
        ("special", "fixed"),
        ("int_small", "special"),
        ("huge", "int_big"),
        ("nonfinite", "nonfinite"),
        ("wide", "tiny"),
    )
    for k, (real_family, imag_family) in enumerate(pairs):
        for shape in (
            _SMALL_SHAPES[k],
            _BIG_SHAPES[k % 3] if k in (1, 3) else _SMALL_SHAPES[(k + 4) % 8],
        ):
            rng = random.Random(f"{dtype_name}-{real_family}-{imag_family}-{shape}")
            n = math.prod(shape)
            real = torch.tensor(_float_values(real_family, n, rng), dtype=torch.float64)
            imag = torch.tensor(_float_values(imag_family, n, rng), dtype=torch.float64)
            with warnings.catch_warnings():
                warnings.simplefilter(
                    "ignore", UserWarning
                )  # "ComplexHalf support is experimental"
                x = torch.complex(real, imag).reshape(shape).to(getattr(torch, dtype_name))
            yield Case(f"{dtype_name}-{real_family}+{imag_family}j-{shape}", x, dtype_name)


def _cases_float4() -> Iterator[Case]:
    """float4_e2m1fn_x2: PyTorch prints the packed bytes as floats in the 1. form."""
    name = "float4_e2m1fn_x2"
    rng = random.Random(name)
    for shape in ((5,), (3, 4), (2, 2, 2), (1500,), (1,)):
        raw = [rng.randrange(256) for _ in range(math.prod(shape))]
        x = torch.tensor(raw, dtype=torch.uint8).reshape(shape).view(torch.float4_e2m1fn_x2)
        yield Case(f"{name}-{shape}", x, name)
    yield Case(
        f"{name}-zeros", torch.zeros(3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2), name
    )


def _cases_empty() -> Iterator[Case]:
    for dtype_name in _ALL_DTYPES:
        torch_dtype = torch.float64 if dtype_name in _ML_ONLY_FLOAT8 else getattr(torch, dtype_name)
        for shape in _EMPTY_SHAPES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                x = torch.empty(shape, dtype=torch_dtype)
            yield Case(f"{dtype_name}-empty-{shape}", x, dtype_name)


def _cases_requires_grad() -> Iterator[Case]:
    for dtype_name, shape in (
        ("float32", (3,)),
        ("float32", ()),
        ("float64", (2, 3)),
        ("float16", (30,)),
        ("bfloat16", (4, 5)),
        ("complex64", (2,)),
        ("complex128", (9,)),
        ("float32", (1100,)),
        ("float64", (0, 2)),
        ("float32", (0,)),
    ):
        rng = random.Random(f"grad-{dtype_name}-{shape}")
        x = _real_tensor(_float_values("fixed", math.prod(shape), rng), shape, "float64")
        x = x.to(getattr(torch, dtype_name)).requires_grad_(True)
        yield Case(f"{dtype_name}-grad-{shape}", x, dtype_name, requires_grad=True)


def _corpus() -> list[Case]:
    cases: list[Case] = [
        *_cases_bool(),
        *_cases_e8m0(),
        *_cases_float4(),
        *_cases_empty(),
        *_cases_requires_grad(),
    ]
    for name in _INTS:
        cases += _cases_int(name)
    for name in (*_TORCH_REAL_FLOATS, *_TORCH_FLOAT8, *_ML_ONLY_FLOAT8):
        cases += _cases_real(name)
    for name in _COMPLEX:
        cases += _cases_complex(name)
    return cases


CORPUS = _corpus()


def _to_tb(case: Case) -> tb.Tensor:
    """The tensorbridge tensor of the case's values (exact: every dtype round-trips tolist)."""
    x, dtype = case.x, getattr(tb, case.dtype_name)
    if case.dtype_name == "float4_e2m1fn_x2":  # made from its bytes, as it converts from nothing
        raw = x.view(torch.uint8)
        t = (
            tb.tensor(raw.tolist(), dtype=tb.uint8)
            if x.numel()
            else tb.zeros(x.shape, dtype=tb.uint8)
        )
        t = t.view(dtype)
    elif x.numel() == 0:
        t = tb.zeros(tuple(x.shape), dtype=dtype)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "ComplexHalf support is experimental"
            values = x.detach().tolist()
        t = tb.tensor(values, dtype=dtype)
    return t.requires_grad_(True) if case.requires_grad else t


@pytest.fixture
def default_printoptions() -> Iterator[None]:
    """Both libraries at their default print options before and after the test."""
    tb.set_printoptions(profile="default")
    torch.set_printoptions(profile="default")
    yield
    tb.set_printoptions(profile="default")
    torch.set_printoptions(profile="default")


@pytest.mark.usefixtures("default_printoptions")
def test_corpus_covers_every_dtype_and_mode():
    """The generated corpus is large and reaches every dtype, every rank and summarisation."""
    assert len(CORPUS) >= 300
    assert {case.dtype_name for case in CORPUS} == set(_ALL_DTYPES)
    assert {case.x.dim() for case in CORPUS} == {0, 1, 2, 3, 4}
    assert any(case.x.numel() > 1000 and case.x.dim() == 4 for case in CORPUS)
    modes = {
        (f.int_mode, f.sci_mode)
        for case in CORPUS
        if case.dtype_name == "float32"
        for f in [_format._Formatter(case.x.flatten().tolist(), floating=True)]
    }
    assert modes == {(True, True), (True, False), (False, True), (False, False)}


@pytest.mark.usefixtures("default_printoptions")
@pytest.mark.parametrize("case", CORPUS, ids=[case.id for case in CORPUS])
def test_repr_matches_torch(case: Case):
    """repr and str of a tensor are PyTorch's text for the same values, dtype tensorbridge.*."""
    t = _to_tb(case)
    expected = _torch_repr(case.x, case.dtype_name)
    assert repr(t) == expected
    assert str(t) == expected


@pytest.mark.usefixtures("default_printoptions")
@pytest.mark.parametrize(
    "make_view",
    [
        lambda t: t.T,
        lambda t: t[:, 1::2],
        lambda t: t[2],
        lambda t: t[:1].expand(5, 50),
        lambda t: t.permute(1, 0)[3:, :7],
    ],
    ids=["transpose", "strided-columns", "row", "expanded", "permuted-slice"],
)
@pytest.mark.parametrize("rows", [6, 40], ids=["small", "summarised"])
def test_views_print_like_torch(make_view, rows: int):
    """Strided views (transposed, stepped, expanded) print as the same view does in PyTorch."""
    x = torch.arange(rows * 50, dtype=torch.float64).reshape(rows, 50) / 8
    t = tb.tensor(x.tolist(), dtype=tb.float64)
    assert repr(make_view(t)) == _torch_repr(make_view(x), "float64")


# ------------------------------------------------------------------------------------------------
# Print options, against PyTorch's

_OPTION_SETTINGS = (
    {"precision": 2},
    {"precision": 0},
    {"precision": 7, "linewidth": 120},
    {"sci_mode": True},
    {"sci_mode": False},
    {"threshold": 5},
    {"threshold": 5, "edgeitems": 1},
    {"threshold": 20, "edgeitems": 0},
    {"edgeitems": 0},
    {"linewidth": 40},
    {"profile": "short"},
    {"profile": "full"},
    {"profile": "short", "precision": 6, "sci_mode": False},
)
# Every fourth case, and none of the 1000-element ones where the full profile would print them all.
_OPTION_CASES = [case for case in CORPUS[::4] if case.x.numel() <= 1000]


@pytest.mark.usefixtures("default_printoptions")
@pytest.mark.parametrize("options", _OPTION_SETTINGS, ids=repr)
def test_printoptions_match_torch(options: dict[str, Any]):
    """Under the same set_printoptions call, tensorbridge prints what PyTorch prints."""
    tb.set_printoptions(**options)
    torch.set_printoptions(**options)
    assert tb.get_printoptions() == torch._tensor_str.get_printoptions()
    mismatches = [
        case.id
        for case in _OPTION_CASES
        if repr(_to_tb(case)) != _torch_repr(case.x, case.dtype_name)
    ]
    assert mismatches == []


@pytest.mark.usefixtures("default_printoptions")
def test_get_printoptions_defaults():
    """get_printoptions() is PyTorch's dict of defaults, and a copy the caller may change."""
    options = tb.get_printoptions()
    assert options == {
        "precision": 4,
        "threshold": 1000,
        "edgeitems": 3,
        "linewidth": 80,
        "sci_mode": None,
    }
    assert options == torch._tensor_str.get_printoptions()
    options["precision"] = 9
    assert tb.get_printoptions()["precision"] == 4


@pytest.mark.usefixtures("default_printoptions")
def test_set_printoptions_resets_sci_mode_like_torch():
    """Every set_printoptions call sets sci_mode, so omitting it restores the automatic choice."""
    for module in (tb, torch):
        module.set_printoptions(sci_mode=True)
        module.set_printoptions(precision=3)
    assert tb.get_printoptions() == torch._tensor_str.get_printoptions()
    assert tb.get_printoptions()["sci_mode"] is None


@pytest.mark.usefixtures("default_printoptions")
def test_printoptions_context_restores_on_exit_and_error():
    """printoptions(...) applies its options in the block and restores all after, even on error."""
    tb.set_printoptions(sci_mode=False, linewidth=60)
    before = tb.get_printoptions()
    with tb.printoptions(precision=2):
        assert repr(tb.tensor([1.12345])) == "tensor([1.12])"
        assert (
            tb.get_printoptions()["sci_mode"] is None
        )  # as in PyTorch: set_printoptions(precision=2)
    assert tb.get_printoptions() == before
    with pytest.raises(KeyError), tb.printoptions(profile="full"):
        raise KeyError
    assert tb.get_printoptions() == before


@pytest.mark.usefixtures("default_printoptions")
@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"profile": "ful"}, ValueError),
        ({"precision": -1}, ValueError),
        ({"edgeitems": -2}, ValueError),
        ({"linewidth": 0}, ValueError),
        ({"precision": "3"}, TypeError),
        ({"precision": 2.0}, TypeError),
        ({"edgeitems": True}, TypeError),
        ({"threshold": "1000"}, TypeError),
        ({"sci_mode": 1}, TypeError),
    ],
    ids=repr,
)
def test_set_printoptions_rejects_bad_values_and_changes_nothing(
    kwargs: dict[str, Any], error: type
):
    """A value that would break every later repr is rejected when set, and no option changes."""
    before = tb.get_printoptions()
    with pytest.raises(error, match=r"set_printoptions\(\): "):
        tb.set_printoptions(
            precision=2, **kwargs
        ) if "precision" not in kwargs else tb.set_printoptions(**kwargs)
    assert tb.get_printoptions() == before


@pytest.mark.usefixtures("default_printoptions")
def test_threshold_accepts_infinity():
    """threshold=math.inf never summarises, as profile='full' does."""
    tb.set_printoptions(threshold=math.inf)
    assert "..." not in repr(tb.zeros((1001,), dtype=tb.int64))


# ------------------------------------------------------------------------------------------------
# What is read: only the printed elements, and never device memory


class _Spy:
    """A tensor stand-in delegating to a real tensor and counting the elements tolist() reads."""

    def __init__(self, t: Any, reads: list[int], device: Any = None) -> None:
        self._t, self._reads = t, reads
        self.device = t.device if device is None else device

    shape = property(lambda self: self._t.shape)
    dtype = property(lambda self: self._t.dtype)
    requires_grad = property(lambda self: self._t.requires_grad)

    def numel(self) -> int:
        return self._t.numel()

    def dim(self) -> int:
        return self._t.dim()

    def tolist(self) -> Any:
        self._reads.append(self._t.numel())
        return self._t.tolist()

    def view(self, dtype: Any) -> _Spy:
        return _Spy(self._t.view(dtype), self._reads, self.device)

    def __getitem__(self, index: Any) -> _Spy:
        return _Spy(self._t[index], self._reads, self.device)


class _DeviceOnly:
    """A tensor in memory the host cannot read: any attempt to read an element fails the test."""

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: Any,
        device: str = "cuda:0",
        requires_grad: bool = False,
    ):
        self.shape, self.dtype, self.device = shape, dtype, tb.device(device)
        self.requires_grad = requires_grad

    def numel(self) -> int:
        return math.prod(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def _read(self, *args: Any) -> Any:
        pytest.fail("printing read the memory of a tensor that is not host-accessible")

    tolist = view = __getitem__ = _read


@pytest.mark.usefixtures("default_printoptions")
@pytest.mark.parametrize(
    ("shape", "printed"),
    [((100, 100, 100), 216), ((3, 100000), 18), ((5000,), 6), ((2, 2, 2, 2, 300), 96), ((10,), 10)],
)
def test_summarised_tensor_reads_only_printed_elements(shape: tuple[int, ...], printed: int):
    """A tensor past the threshold reads its edge rows only, and prints what PyTorch prints."""
    reads: list[int] = []
    spy = _Spy(tb.zeros(shape, dtype=tb.float32), reads)
    assert _format.format_tensor(spy) == repr(torch.zeros(shape))
    assert sum(reads) == printed


@pytest.mark.usefixtures("default_printoptions")
def test_summarised_edgeitems_zero_reads_nothing():
    """With edgeitems=0 a summarised tensor prints [...] and its size without reading an element."""
    tb.set_printoptions(edgeitems=0)
    torch.set_printoptions(edgeitems=0)
    reads: list[int] = []
    for shape in ((2000,), (40, 40)):
        spy = _Spy(tb.zeros(shape, dtype=tb.int32), reads)
        assert _format.format_tensor(spy) == _torch_repr(
            torch.zeros(shape, dtype=torch.int32), "int32"
        )
    assert reads == []


@pytest.mark.usefixtures("default_printoptions")
@pytest.mark.parametrize(
    ("shape", "dtype_name", "requires_grad", "expected"),
    [
        ((2, 3), "float32", False, "tensor(..., device='cuda:0', size=(2, 3))"),
        (
            (2, 3),
            "int64",
            False,
            "tensor(..., device='cuda:0', size=(2, 3), dtype=tensorbridge.int64)",
        ),
        pytest.param(
            (),
            "float16",
            True,
            "tensor(..., device='cuda:0', size=(), dtype=tensorbridge.float16,\n"
            "       requires_grad=True)",
            id="0-d-grad-wraps",
        ),
        (
            (4000, 4000),
            "bool",
            False,
            "tensor(..., device='cuda:0', size=(4000, 4000), dtype=tensorbridge.bool)",
        ),
        ((0,), "float32", False, "tensor([], device='cuda:0')"),
        ((0, 3), "float32", False, "tensor([], device='cuda:0', size=(0, 3))"),
        (
            (0,),
            "float64",
            True,
            "tensor([], device='cuda:0', dtype=tensorbridge.float64, requires_grad=True)",
        ),
        (
            (2, 0),
            "complex64",
            False,
            "tensor([], device='cuda:0', size=(2, 0), dtype=tensorbridge.complex64)",
        ),
    ],
    ids=lambda value: (
        None if isinstance(value, str) and value.startswith("tensor(") else str(value)
    ),
)
def test_device_tensor_prints_without_reading(shape, dtype_name, requires_grad, expected):
    """A tensor the host cannot read prints its device, size and dtype, its contents as '...'."""
    t = _DeviceOnly(shape, getattr(tb, dtype_name), requires_grad=requires_grad)
    assert _format.format_tensor(t) == expected


_NON_EMPTY_SAMPLE = [case for case in CORPUS[::9] if case.x.numel() > 0]


@pytest.mark.usefixtures("default_printoptions")
@pytest.mark.parametrize("case", _NON_EMPTY_SAMPLE, ids=[case.id for case in _NON_EMPTY_SAMPLE])
def test_device_tensor_prints_like_torch_meta(case: Case):
    """Non-empty device tensors print as PyTorch prints the same tensor on its 'meta' device."""
    meta = torch.empty(case.x.shape, dtype=case.x.dtype, device="meta").requires_grad_(
        case.requires_grad
    )
    t = _DeviceOnly(tuple(case.x.shape), getattr(tb, case.dtype_name), "cuda:1", case.requires_grad)
    expected = _torch_repr(meta, case.dtype_name, device="cuda:1")
    if case.dtype_name in _ML_ONLY_FLOAT8:  # the float64 stand-in is not the default dtype either
        assert "dtype=tensorbridge." in expected
    assert _format.format_tensor(t) == expected


@pytest.mark.subprocess
def test_real_device_tensor_repr_never_dereferences(subprocess_run):
    """repr of tensors over a device address (unmapped on the host) prints without touching it."""
    result = subprocess_run("""
        import tensorbridge as tb
        bogus = 0x1000  # a read through this address would crash the interpreter
        t = tb.from_pointer(bogus, (2, 3), tb.float32, device="cuda:0")
        print(repr(t))
        print(repr(t[1]))
        print(str(tb.from_pointer(bogus, (4000, 4000), tb.int32, device="cuda:1")))
        print(repr(tb.from_pointer(bogus, (0, 3), tb.bfloat16, device="cuda:0")))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "tensor(..., device='cuda:0', size=(2, 3))",
        "tensor(..., device='cuda:0', size=(3,))",
        "tensor(..., device='cuda:1', size=(4000, 4000), dtype=tensorbridge.int32)",
        "tensor([], device='cuda:0', size=(0, 3), dtype=tensorbridge.bfloat16)",
    ]


@pytest.mark.usefixtures("default_printoptions")
def test_host_accessible_device_tensor_prints_values_and_device():
    """Memory on a host-accessible device (CUDA host/managed) is printed, with its device named."""
    reads: list[int] = []
    spy = _Spy(
        tb.tensor([[1, 2], [3, 4]], dtype=tb.int32), reads, device=tb.device("cuda_managed:0")
    )
    assert _format.format_tensor(spy) == (
        "tensor([[1, 2],\n        [3, 4]], device='cuda_managed:0', dtype=tensorbridge.int32)"
    )
    assert sum(reads) == 4


# ------------------------------------------------------------------------------------------------
# Cases PyTorch cannot print, and reference strings


@pytest.mark.usefixtures("default_printoptions")
def test_float4_scalar_prints_its_byte():
    """A 0-d float4_e2m1fn_x2 tensor prints its byte value (PyTorch raises NotImplementedError)."""
    t = tb.tensor([0x35], dtype=tb.uint8).view(tb.float4_e2m1fn_x2)[0]
    assert repr(t) == "tensor(53., dtype=tensorbridge.float4_e2m1fn_x2)"


@pytest.mark.usefixtures("default_printoptions")
@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: tb.tensor([1.0, 2.5]), "tensor([1.0000, 2.5000])"),
        (lambda: tb.tensor([1.0, 2.0, -3.0]), "tensor([ 1.,  2., -3.])"),
        (lambda: tb.tensor([1e-5, 1.0]), "tensor([1.0000e-05, 1.0000e+00])"),
        (lambda: tb.tensor([math.nan, math.inf, 1.0]), "tensor([nan, inf, 1.])"),
        (lambda: tb.tensor([1, -20, 300]), "tensor([  1, -20, 300])"),
        (lambda: tb.tensor([True, False]), "tensor([ True, False])"),
        (lambda: tb.tensor(3.5, dtype=tb.float64), "tensor(3.5000, dtype=tensorbridge.float64)"),
        (lambda: tb.tensor([1 + 2j, -0.5j]), "tensor([1.+2.0000j, -0.-0.5000j])"),
        (lambda: tb.zeros((0, 3)), "tensor([], size=(0, 3))"),
        (lambda: tb.zeros((0,), dtype=tb.int32), "tensor([], dtype=tensorbridge.int32)"),
        (lambda: tb.zeros((0,), dtype=tb.int64), "tensor([], dtype=tensorbridge.int64)"),
    ],
)
def test_reference_strings(make, expected):
    """Hand-checked strings, one per formatter mode."""
    assert repr(make()) == expected
