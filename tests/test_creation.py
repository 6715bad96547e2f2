"""Creation functions: tensor() infers PyTorch's dtype, arange() follows PyTorch's length rule.

tensor() is compared with torch.tensor() on random nested data (bools, ints, floats, complex numbers,
tensors and NumPy scalars as leaves); arange() with torch.arange() on random float and integer
ranges; zeros/ones/empty/full and their ``*_like`` forms on shapes, dtypes and fill values.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from tests import strategies as S

import tensorbridge as tb
from tensorbridge import _dtype


@pytest.fixture(scope="module")
def torch():
    """PyTorch, the reference for inference and lengths."""
    return pytest.importorskip("torch")


# ----------------------------------------------------------------------------- tensor()
_PY_LEAVES = st.one_of(
    st.booleans(),
    st.integers(-1000, 1000),
    st.floats(-1e6, 1e6, allow_nan=False).filter(lambda f: f == 0 or abs(f) > 1e-30),
    st.builds(complex, st.integers(-100, 100), st.integers(-100, 100)),
)
# Leaf tensors of dtypes PyTorch promotes with Python scalars.
_LEAF_DTYPES = [
    tb.bool,
    tb.uint8,
    tb.int8,
    tb.int16,
    tb.int32,
    tb.int64,
    tb.float16,
    tb.bfloat16,
    tb.float32,
    tb.float64,
    tb.complex64,
    tb.complex128,
]


@st.composite
def nested_data(draw: st.DrawFn, tensors: bool = True) -> tuple[Any, Any]:
    """(tensorbridge data, PyTorch data): a rectangular nest of the same leaves for both libraries."""
    shape = draw(S.shapes(max_dims=3, max_side=3))
    n = math.prod(shape)
    leaves_tb: list[Any] = []
    leaves_torch: list[Any] = []
    for _ in range(n):
        value = draw(_PY_LEAVES)
        if tensors and draw(st.integers(0, 5)) == 0:
            dtype = draw(st.sampled_from(_LEAF_DTYPES))
            small = int(value.real) % 100 if not isinstance(value, bool) else value
            leaves_tb.append(("tensor", dtype, small))
            leaves_torch.append(("tensor", dtype, small))
        else:
            leaves_tb.append(value)
            leaves_torch.append(value)
    return _nest_leaves(leaves_tb, shape), _nest_leaves(leaves_torch, shape)


def _nest_leaves(leaves: list[Any], shape: tuple[int, ...]) -> Any:
    if not shape:
        return leaves[0]
    return S.nest_any(leaves, shape) if math.prod(shape) else S.nest_any([], shape)


def _materialise(data: Any, lib: Any) -> Any:
    """Turn ("tensor", dtype, value) leaves into 0-d tensors of ``lib``."""
    if isinstance(data, list):
        return [_materialise(d, lib) for d in data]
    if isinstance(data, tuple):
        return lib.tensor(data[2], dtype=getattr(lib, data[1].name))
    return data


def _quiet(fn: Any) -> Any:
    """Run a PyTorch call with its UserWarnings silenced (copy-constructing from a tensor warns)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn()


@given(data=nested_data())
def test_tensor_infers_torch_dtype_shape_and_values(torch, data):
    """tensor(nested data) has torch.tensor's dtype, shape and values, leaf tensors included."""
    ours_in, theirs_in = _materialise(data[0], tb), _materialise(data[1], torch)
    try:
        want = _quiet(lambda: torch.tensor(theirs_in))
    except (TypeError, RuntimeError, ValueError):
        with pytest.raises((TypeError, ValueError)):
            tb.tensor(ours_in)
        return
    got = tb.tensor(ours_in)
    assert got.dtype.name == str(want.dtype).removeprefix("torch.")
    assert tuple(got.shape) == tuple(want.shape)
    assert got.tolist() == want.tolist()


@given(data=nested_data(tensors=False), dtype=st.sampled_from(_LEAF_DTYPES))
def test_tensor_with_dtype_matches_torch(torch, data, dtype):
    """tensor(data, dtype=d) stores torch's values, or fails where torch fails."""
    try:
        want = torch.tensor(data[1], dtype=getattr(torch, dtype.name))
    except (TypeError, RuntimeError, ValueError, OverflowError):
        with pytest.raises((TypeError, ValueError, RuntimeError)):
            tb.tensor(data[0], dtype=dtype)
        return
    got = tb.tensor(data[0], dtype=dtype)
    assert got.dtype is dtype
    assert tuple(got.shape) == tuple(want.shape)
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize(
    ("data", "dtype", "shape"),
    [
        ([], tb.float32, (0,)),
        ([[], []], tb.float32, (2, 0)),
        ([[[]]], tb.float32, (1, 1, 0)),
        ((1, 2.0), tb.float32, (2,)),
        (range(3), tb.int64, (3,)),
        ([(1, 2), [3, 4]], tb.int64, (2, 2)),
        ([True, 1], tb.int64, (2,)),
        ([True, 1.0], tb.float32, (2,)),
        ([1, 1j], tb.complex64, (2,)),
        (7, tb.int64, ()),
        (True, tb.bool, ()),
        (2.5, tb.float32, ()),
    ],
)
def test_tensor_inference_table(data, dtype, shape):
    """tensor() infers bool < int64 < float32 < complex64, and shapes from any nesting of sequences."""
    t = tb.tensor(data)
    assert t.dtype is dtype
    assert tuple(t.shape) == shape


def test_tensor_keeps_and_promotes_leaf_tensor_dtypes():
    """Tensors inside the data keep their dtype and promote as torch.promote_types does."""
    i32, i16 = tb.tensor(1, dtype=tb.int32), tb.tensor(2, dtype=tb.int16)
    assert tb.tensor([i32, i32]).dtype is tb.int32
    assert tb.tensor([i32, i16]).dtype is tb.int32
    assert tb.tensor([i32, 2]).dtype is tb.int64
    assert tb.tensor([tb.tensor(1.0, dtype=tb.float64), 1j]).dtype is tb.complex128
    assert tb.tensor([tb.tensor([1, 2], dtype=tb.uint8)] * 2).dtype is tb.uint8
    assert tb.tensor(tb.arange(4).reshape(2, 2)).tolist() == [[0, 1], [2, 3]]
    with pytest.raises(
        TypeError, match="Promotion for uint16, uint32, uint64 types is not supported"
    ):
        tb.tensor([tb.tensor(1, dtype=tb.uint16), 1])
    with pytest.raises(TypeError, match="Promotion for Float8 Types is not supported"):
        tb.tensor([tb.tensor(1.0, dtype=tb.float8_e4m3fn), 1.0])


def test_tensor_copies_its_input():
    """tensor(t) is a new tensor: writes to it do not reach t."""
    t = tb.arange(3)
    c = tb.tensor(t)
    c[0] = 9
    assert t.tolist() == [0, 1, 2] and c._storage is not t._storage


def test_tensor_of_numpy_scalars_keeps_their_dtype():
    """NumPy scalars count with their own dtype, as in PyTorch."""
    np = pytest.importorskip("numpy")
    assert tb.tensor(np.float64(1.5)).dtype is tb.float64
    assert tb.tensor([np.float64(1.5), 1]).dtype is tb.float64
    assert tb.tensor([np.int32(3), 1]).dtype is tb.int64
    assert tb.tensor([np.float32(3), 1]).dtype is tb.float32
    assert tb.tensor([np.bool_(True)]).dtype is tb.bool


@pytest.mark.parametrize(
    ("data", "kwargs", "exc", "text"),
    [
        ([[1, 2], [3]], {}, ValueError, "expected sequence of length 2 at dim 1 (got 1)"),
        (
            [[[1, 2], [3, 4]], [[5, 6], [7]]],
            {},
            ValueError,
            "expected sequence of length 2 at dim 2 (got 1)",
        ),
        ([[1, 2], 3], {}, ValueError, "expected sequence of length 2 at dim 1 (got 0)"),
        ([1, [2]], {}, ValueError, "Nested sequences must be rectangular"),
        ([[], [1]], {}, ValueError, "expected sequence of length 0 at dim 1 (got 1)"),
        (None, {}, TypeError, "tensor(): Could not infer dtype of NoneType"),
        (["a"], {}, TypeError, "Could not infer dtype of str"),
        ({1: 2}, {}, TypeError, "Could not infer dtype of dict"),
        ([1 + 2j], {"dtype": tb.float32}, TypeError, "must be real number, not complex"),
        ([2**63], {}, ValueError, "Overflow when unpacking long long"),
        ([-(2**63) - 1], {}, ValueError, "Overflow when unpacking long long"),
        (
            [300],
            {"dtype": tb.uint8},
            RuntimeError,
            "value cannot be converted to type uint8 without overflow",
        ),
        ([-256], {"dtype": tb.uint8}, RuntimeError, "type uint8 without overflow; got -256"),
        (
            [128.0],
            {"dtype": tb.int8},
            RuntimeError,
            "value cannot be converted to type int8 without overflow",
        ),
        (
            [1],
            {"dtype": "float33"},
            TypeError,
            "tensor(): argument 'dtype' must be tensorbridge.dtype",
        ),
        ([1], {"dtype": 5}, TypeError, "got 5"),
        ([1], {"device": "gpu"}, ValueError, "device type at start of device string: gpu"),
        ([1], {"device": "cuda"}, BufferError, "tensorbridge creates tensors in host memory only"),
        (
            [1],
            {"requires_grad": True},
            RuntimeError,
            "Only Tensors of floating point and complex dtype can require gradients",
        ),
        (
            [
                [
                    [
                        [
                            [
                                [
                                    [
                                        [
                                            [
                                                [
                                                    [
                                                        [
                                                            [
                                                                [
                                                                    [
                                                                        [
                                                                            [
                                                                                [
                                                                                    [
                                                                                        [
                                                                                            [
                                                                                                [
                                                                                                    [
                                                                                                        [
                                                                                                            [
                                                                                                                [
                                                                                                                    [
                                                                                                                        [
                                                                                                                            [
                                                                                                                                [
                                                                                                                                    [
                                                                                                                                        [
                                                                                                                                            [
                                                                                                                                                [
                                                                                                                                                    [
                                                                                                                                                        [
                                                                                                                                                            [
                                                                                                                                                                [
                                                                                                                                                                    [
                                                                                                                                                                        [
                                                                                                                                                                            [
                                                                                                                                                                                [
                                                                                                                                                                                    [
                                                                                                                                                                                        [
                                                                                                                                                                                            [
                                                                                                                                                                                                [
                                                                                                                                                                                                    [
                                                                                                                                                                                                        [
                                                                                                                                                                                                            [
                                                                                                                                                                                                                [
                                                                                                                                                                                                                    [
                                                                                                                                                                                                                        [
                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                                1
                                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                ]
                                                                                                                                                                                                            ]
                                                                                                                                                                                                        ]
                                                                                                                                                                                                    ]
                                                                                                                                                                                                ]
                                                                                                                                                                                            ]
                                                                                                                                                                                        ]
                                                                                                                                                                                    ]
                                                                                                                                                                                ]
                                                                                                                                                                            ]
                                                                                                                                                                        ]
                                                                                                                                                                    ]
                                                                                                                                                                ]
                                                                                                                                                            ]
                                                                                                                                                        ]
                                                                                                                                                    ]
                                                                                                                                                ]
                                                                                                                                            ]
                                                                                                                                        ]
                                                                                                                                    ]
                                                                                                                                ]
                                                                                                                            ]
                                                                                                                        ]
                                                                                                                    ]
                                                                                                                ]
                                                                                                            ]
                                                                                                        ]
                                                                                                    ]
                                                                                                ]
                                                                                            ]
                                                                                        ]
                                                                                    ]
                                                                                ]
                                                                            ]
                                                                        ]
                                                                    ]
                                                                ]
                                                            ]
                                                        ]
                                                    ]
                                                ]
                                            ]
                                        ]
                                    ]
                                ]
                            ]
                        ]
                    ]
                ]
            ],
            {},
            ValueError,
            "at most 64 dimensions",
        ),
    ],
)
def test_tensor_errors(data, kwargs, exc, text):
    """Bad data, dtypes and devices raise clear errors naming tensor() and carrying PyTorch's text."""
    with pytest.raises(exc) as info:
        tb.tensor(data, **kwargs)
    assert text in str(info.value)


def test_tensor_accepts_dtype_names_and_devices():
    """dtype= takes a dtype or its name; device= takes 'cpu', a device, or host-accessible devices."""
    assert tb.tensor([1], dtype="float64").dtype is tb.float64
    assert tb.tensor([1], dtype="torch.int8").dtype is tb.int8
    assert tb.tensor([1], device="cpu").device == tb.device("cpu")
    assert tb.tensor([1.0], requires_grad=True).requires_grad


# ----------------------------------------------------------------------------- arange()
_STEPS = st.sampled_from([0.1, 0.2, 0.3, 0.25, 0.7, 1.5, 2, 3, 1, -0.1, -0.3, -1, -2.5, 1e-3])
_ENDS = st.one_of(
    st.integers(-20, 20), st.integers(-200, 200).map(lambda i: i / 10), st.floats(-20, 20)
)
_ARANGE_DTYPES = st.sampled_from(
    [None, tb.float32, tb.float64, tb.float16, tb.int64, tb.int32, tb.int16]
)


def _eps(dtype: tb.dtype) -> float:
    return {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23}.get(dtype.name, 2.0**-52)


@given(start=_ENDS, end=_ENDS, step=_STEPS, dtype=_ARANGE_DTYPES)
def test_arange_matches_torch(torch, start, end, step, dtype):
    """arange has torch.arange's dtype and length exactly, and its values (within float rounding)."""
    tdtype = None if dtype is None else getattr(torch, dtype.name)
    try:
        want = torch.arange(start, end, step, dtype=tdtype)
    except (RuntimeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            tb.arange(start, end, step, dtype=dtype)
        return
    assume(want.numel() < 5000)
    got = tb.arange(start, end, step, dtype=dtype)
    assert got.dtype.name == str(want.dtype).removeprefix("torch.")
    assert tuple(got.shape) == tuple(want.shape)
    if got.dtype.kind == "f":
        # PyTorch's vectorised kernel adds steps to a per-chunk base, so the last bit may differ.
        tol = 4 * _eps(got.dtype) * max(abs(start), abs(end), abs(step), 1)
        assert all(abs(a - b) <= tol for a, b in zip(got.tolist(), want.tolist(), strict=True))
    else:
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize(
    ("args", "length"),
    [
        ((0, 1, 0.1), 10),
        ((1, 2, 0.1), 10),
        ((0, 0.3, 0.1), 3),
        ((0, -1, -0.1), 10),
        ((1.0, 1.0), 0),
        ((10,), 10),
        ((0, 10, 3), 4),
        ((0.5, 5), 5),
        ((5, 0.5, -1.5), 3),
        ((-1, 1, 0.1), 20),
    ],
)
def test_arange_lengths(args, length):
    """Lengths follow ceil((end - start) / step) in double precision, as PyTorch computes them."""
    assert tb.arange(*args).numel() == length


def test_arange_integer_dtypes_truncate_float_arguments():
    """With an integer dtype, float arguments truncate as in PyTorch (int64 also truncates the length)."""
    assert tb.arange(0, 5, 1.5, dtype=tb.int64).tolist() == [0, 1, 2, 3, 4]
    assert tb.arange(0, 5, 1.5, dtype=tb.int32).tolist() == [0, 1, 2, 3]
    assert tb.arange(0.5, 3.7, 0.9, dtype=tb.int32).tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="step must be nonzero"):
        tb.arange(0.5, 3.7, 0.9, dtype=tb.int64)


def test_arange_argument_forms():
    """arange(end), arange(start, end), tensors as bounds, dtype names and requires_grad."""
    assert tb.arange(3).tolist() == [0, 1, 2] and tb.arange(3).dtype is tb.int64
    assert tb.arange(1, 3).tolist() == [1, 2]
    assert tb.arange(tb.tensor(3)).tolist() == [0, 1, 2]
    assert tb.arange(3, dtype="float64").dtype is tb.float64
    assert tb.arange(3.0).dtype is tb.float32
    assert tb.arange(3, dtype=tb.float32, requires_grad=True).requires_grad


@pytest.mark.parametrize(
    ("args", "exc", "text"),
    [
        ((0, 1, 0), RuntimeError, "step must be nonzero"),
        ((0, 1, -1), RuntimeError, "upper bound and lower bound inconsistent with step sign"),
        ((1, 0), RuntimeError, "upper bound and lower bound inconsistent with step sign"),
        ((0, float("inf")), RuntimeError, "unsupported range: 0 -> inf"),
        ((0, float("nan")), RuntimeError, "unsupported range: 0 -> nan"),
        ((0, 1j), TypeError, "arange(): argument 'end' must be a real number; got 1j (complex)"),
        (("3",), TypeError, "argument 'end' must be a real number; got '3' (str)"),
    ],
)
def test_arange_errors(args, exc, text):
    """Bad ranges are RuntimeError with PyTorch's text, as in PyTorch; non-numbers are TypeError."""
    with pytest.raises(exc) as info:
        tb.arange(*args)
    assert text in str(info.value)


# ----------------------------------------------------------------------------- zeros, ones, full, *_like
@pytest.mark.parametrize("fn", [tb.zeros, tb.ones, tb.empty])
@pytest.mark.parametrize("dtype", [None, *S.CODEC_DTYPES], ids=str)
def test_zeros_ones_empty(fn, dtype):
    """zeros/ones/empty: any shape spelling, float32 by default, compact, 64-byte aligned."""
    if fn is tb.ones and dtype is tb.float4_e2m1fn_x2:
        with pytest.raises(NotImplementedError, match="not implemented for 'Float4_e2m1fn_x2'"):
            fn(2, 3, dtype=dtype)  # as torch.ones: packed FP4 cannot be filled
        return
    for size in ((2, 3), ((2, 3),), ([2, 3],), (tb.Size([2, 3]),)):
        t = fn(*size, dtype=dtype)
        assert tuple(t.shape) == (2, 3) and t.dtype is (dtype or tb.float32) and t.is_contiguous()
        assert t.data_ptr() % 64 == 0
        if fn is tb.ones:
            assert t.tolist() == [[t.dtype.kind == "b" or 1] * 3] * 2
        else:  # all-zero bytes, as PyTorch's memset (zero in every dtype; 2**-127 for float8_e8m0fnu)
            assert bytes(t._bytes("test")) == bytes(t.nbytes)
    assert tuple(fn((), dtype=dtype).shape) == ()
    assert tuple(fn(0, dtype=dtype).shape) == (0,)


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(1, tb.int64), (1.5, tb.float32), (True, tb.bool), (1j, tb.complex64), (-0.0, tb.float32)],
)
def test_full_infers_dtype_from_the_fill_value(torch, value, dtype):
    """full() infers its dtype from the fill value as torch.full does, and stores it (-0.0 too)."""
    t = tb.full((2, 2), value)
    want = torch.full((2, 2), value)
    assert t.dtype is dtype and str(want.dtype) == f"torch.{dtype.name}"
    assert t.tolist() == want.tolist()
    if value == 0:
        assert math.copysign(1, t[0, 0].item()) == -1.0


def test_like_functions_follow_their_input():
    """*_like copy shape, dtype and device from the input unless told otherwise."""
    x = tb.arange(6, dtype=tb.int16).reshape(2, 3).T
    for fn, want in ((tb.zeros_like, 0), (tb.ones_like, 1), (tb.empty_like, 0)):
        t = fn(x)
        assert tuple(t.shape) == (3, 2) and t.dtype is tb.int16 and t.tolist() == [[want] * 2] * 3
        assert fn(x, dtype=tb.float64).dtype is tb.float64
    assert tb.full_like(x, 7).tolist() == [[7, 7]] * 3
    assert tb.full_like(x, 7.5, dtype=tb.float32).tolist() == [[7.5, 7.5]] * 3
    assert tb.zeros_like(tb.zeros(2), requires_grad=True).requires_grad
    with pytest.raises(
        TypeError, match=r"zeros_like\(\): expected a tensorbridge Tensor; got list"
    ):
        tb.zeros_like([1, 2])


@pytest.mark.parametrize(
    ("fn", "exc", "text"),
    [
        (
            lambda: tb.zeros(-1, 2),
            RuntimeError,
            "Trying to create tensor with negative dimension -1: [-1, 2]",
        ),
        (
            lambda: tb.ones(2.0),
            TypeError,
            "ones(): size must be a sequence of ints; got 2.0 (float)",
        ),
        (
            lambda: tb.full((-1,), 2),
            RuntimeError,
            "Trying to create tensor with negative dimension -1: [-1]",
        ),
        (lambda: tb.full((2,), "x"), TypeError, "full(): Could not infer dtype of str"),
        (
            lambda: tb.full((2,), 300, dtype=tb.uint8),
            RuntimeError,
            "value cannot be converted to type uint8",
        ),
        (
            lambda: tb.zeros(2, dtype=float),
            TypeError,
            "zeros(): argument 'dtype' must be tensorbridge.dtype",
        ),
        (
            lambda: tb.zeros(2, device="cuda:0"),
            BufferError,
            "zeros(): tensorbridge creates tensors in host memory",
        ),
        (
            lambda: tb.zeros(2, dtype=tb.int32, requires_grad=True),
            RuntimeError,
            "Only Tensors of floating point and complex dtype can require gradients",
        ),
    ],
)
def test_creation_errors(fn, exc, text):
    """Bad sizes, fill values, dtypes and devices raise clear errors naming the function."""
    with pytest.raises(exc) as info:
        fn()
    assert text in str(info.value)


def test_as_tensor_shares_when_it_can():
    """as_tensor returns a tensor unchanged, converts its dtype on request, and builds from lists."""
    t = tb.arange(3)
    assert tb.as_tensor(t) is t
    assert tb.as_tensor(t, dtype=tb.float64).tolist() == [0.0, 1.0, 2.0]
    assert tb.as_tensor([1, 2]).tolist() == [1, 2]


def test_every_dtype_has_a_creation_round_trip():
    """Every dtype in the table can be created with zeros() and named by its string."""
    for dtype in _dtype.ALL_DTYPES:
        assert tb.zeros(1, dtype=dtype.name).dtype is dtype


# ----------------------------------------------------------------------------- PyTorch 2.13 rules
def test_tensor_checks_every_number_against_the_dtype():
    """tensor() refuses numbers the dtype cannot hold with PyTorch's type and text, NumPy scalars
    and objects with __index__ included."""
    np = pytest.importorskip("numpy")

    class Index:
        def __index__(self) -> int:
            return 300

    text = "value cannot be converted to type {} without overflow"
    for value, dtype in ((np.int64(300), tb.uint8), (Index(), tb.int8), (2**31, tb.int32)):
        with pytest.raises(RuntimeError, match=text.format(dtype.name)):
            tb.tensor(value, dtype=dtype)
        with pytest.raises(RuntimeError, match=text.format(dtype.name)):
            tb.tensor([1, value], dtype=dtype)
    with pytest.raises(ValueError, match="Overflow when unpacking long long"):
        tb.tensor(2**63, dtype=tb.int32)
    with pytest.raises(TypeError, match=r"'numpy\.float32' object cannot be interpreted"):
        tb.tensor(np.float32(1.0), dtype=tb.int32)
    assert tb.tensor(np.int8(-1), dtype=tb.uint8).item() == 255  # ints wrap down to -max
    assert tb.tensor([Index()], dtype=tb.int16).tolist() == [300]


def test_creation_size_errors_name_the_size():
    """Requests past the address space fail at once with a MemoryError naming the bytes and shape."""
    for call in (
        lambda: tb.ones(2**31, 2**31),
        lambda: tb.full((2**62,), 1),
        lambda: tb.arange(2**62),
        lambda: tb.zeros_like(tb.zeros(1).expand(2**62)),
    ):
        with pytest.raises(MemoryError, match=r"cannot allocate \d+ bytes for a tensor of shape"):
            call()


def test_creation_argument_errors_have_torch_types():
    """Negative sizes and bad ranges are RuntimeError, a missing size TypeError, as in PyTorch."""
    with pytest.raises(RuntimeError, match="negative dimension"):
        tb.empty(2, -1)
    with pytest.raises(TypeError, match="missing 1 required positional arguments"):
        tb.zeros()
    with pytest.raises(RuntimeError, match="upper bound and lower bound inconsistent"):
        tb.arange(0, 1, -1)
