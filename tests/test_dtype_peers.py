"""Dtypes from other libraries: every form a peer names a dtype by, through every ``dtype=`` door."""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any

import pytest

import tensorbridge as tb
from tensorbridge._dtype import ALL_DTYPES, DType, as_dtype, to_numpy

BY_NAME = {d.name: d for d in ALL_DTYPES}

# The dtypes of tensorbridge's list each peer names, as its documentation lists them.
NUMPY_NAMES = (
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
ML_DTYPES_NAMES = (
    "bfloat16",
    "complex32",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
)
# NumPy has no dtype for the packed pair of FP4 values; ml_dtypes' float4_e2m1fn holds one.
NEITHER = ("float4_e2m1fn_x2",)
TORCH_NAMES = tuple(
    n for n in BY_NAME if n not in ("float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz")
)
JAX_NAMES = NUMPY_NAMES + tuple(n for n in ML_DTYPES_NAMES if n != "complex32")
TENSORFLOW_NAMES = (
    *NUMPY_NAMES,
    "bfloat16",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
)
PADDLE_NAMES = (*NUMPY_NAMES, "bfloat16", "float8_e4m3fn", "float8_e5m2")


def _through_doors(form: object, dtype: DType) -> None:
    """Every door that takes a dtype reads ``form`` as ``dtype``."""
    t = tb.zeros(2, dtype=dtype)
    made = {
        "tensorbridge.dtype": tb.dtype(form),
        "frombuffer": tb.frombuffer(bytes(2 * dtype.itemsize), dtype=form).dtype,
        "zeros": tb.zeros(2, dtype=form).dtype,
        "asarray": tb.asarray(t, dtype=form).dtype,
        "to": t.to(dtype=form).dtype,
    }
    assert made == dict.fromkeys(made, dtype), form


def _peer_names(module: Any, kind: type, names: tuple[str, ...]) -> set[str]:
    return {n for n in names if isinstance(getattr(module, n, None), kind)}


def test_the_peers_cover_the_list():
    """Each dtype of the list is NumPy's, ml_dtypes' or neither's, and every peer list is in it."""
    assert set(NUMPY_NAMES) | set(ML_DTYPES_NAMES) | set(NEITHER) == set(BY_NAME)
    assert not set(NUMPY_NAMES) & set(ML_DTYPES_NAMES)
    for names in (TORCH_NAMES, JAX_NAMES, TENSORFLOW_NAMES, PADDLE_NAMES):
        assert set(names) <= set(BY_NAME)
    assert {d.name for d in ALL_DTYPES if d.ml_dtypes} == set(ML_DTYPES_NAMES)


def test_dtype_converts_and_interns():
    """tensorbridge.dtype(x) returns the interned dtype x stands for, and names itself on refusal."""
    assert tb.dtype("float32") is tb.float32
    assert tb.dtype(tb.float32) is tb.float32
    assert tb.dtype("torch.half") is tb.float16
    assert isinstance(tb.float32, tb.dtype)
    with pytest.raises(TypeError, match=r"^tensorbridge\.dtype\(\): argument 'value' must be"):
        tb.dtype([1])
    with pytest.raises(TypeError, match=r"tensorbridge\.dtype\(\): .* got 'float33'"):
        tb.dtype("float33")


@pytest.mark.parametrize("name", NUMPY_NAMES)
def test_numpy_forms(name):
    """A NumPy dtype, its scalar type and its typestr (any native order mark) are the same dtype."""
    np = pytest.importorskip("numpy")
    dtype = BY_NAME[name]
    assert np.dtype(name).name == name
    assert dtype.typestr is not None
    code = dtype.typestr[1:]
    forms = [np.dtype(name), np.dtype(name).type, np.dtype(dtype.typestr), dtype.typestr, code]
    forms += ["=" + code, "|" + code] if dtype.itemsize > 1 else ["<" + code, ">" + code]
    for form in forms:
        _through_doors(form, dtype)


@pytest.mark.parametrize("name", ML_DTYPES_NAMES + NEITHER)
def test_numpy_lacks_the_rest(name):
    """NumPy by itself names none of the other dtypes."""
    np = pytest.importorskip("numpy")
    if name in ML_DTYPES_NAMES and "ml_dtypes" in sys.modules:
        pytest.skip("ml_dtypes gives NumPy these names once imported")
    with pytest.raises(TypeError):
        np.dtype(name)


@pytest.mark.parametrize("name", ML_DTYPES_NAMES)
def test_ml_dtypes_forms(name):
    """An ml_dtypes scalar type and its NumPy dtype are the dtype of the same name."""
    np = pytest.importorskip("numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    scalar = getattr(ml_dtypes, name)
    for form in (scalar, np.dtype(scalar)):
        _through_doors(form, BY_NAME[name])


def test_ml_dtypes_names_only_listed_dtypes():
    """Every dtype name ml_dtypes shares with the list is one the list marks as ml_dtypes'."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert _peer_names(ml_dtypes, type, tuple(BY_NAME)) <= set(ML_DTYPES_NAMES)


@pytest.mark.parametrize(
    "name", ["int4", "uint4", "int2", "float4_e2m1fn", "float6_e2m3fn", "bcomplex32"]
)
def test_ml_dtypes_without_equivalent_refused(name):
    """ml_dtypes' types the list lacks are refused by name, not taken for their raw bits."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    with pytest.raises(
        TypeError, match=rf"zeros\(\): argument 'dtype' has no tensorbridge .*{name}"
    ):
        tb.zeros(2, dtype=getattr(ml_dtypes, name))


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_torch_forms(name):
    """A torch.dtype is the tensorbridge dtype of the same name."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, name):
        pytest.skip(f"torch {torch.__version__} has no {name}")
    _through_doors(getattr(torch, name), BY_NAME[name])


def test_torch_aliases_and_refusals():
    """torch's aliases map as tensorbridge's do; its dtypes the list lacks are refused by name."""
    torch = pytest.importorskip("torch")
    assert _peer_names(torch, torch.dtype, tuple(BY_NAME)) <= set(TORCH_NAMES)
    for alias in ("half", "float", "double", "short", "int", "long", "cfloat", "cdouble"):
        assert tb.dtype(getattr(torch, alias)) is getattr(tb, alias)
    for name in ("qint8", "quint8", "bits8", "int4", "uint3"):
        if hasattr(torch, name):
            with pytest.raises(
                TypeError, match=rf"has no tensorbridge equivalent; got torch\.{name}"
            ):
                tb.frombuffer(b"\0\0", dtype=getattr(torch, name))


@pytest.mark.parametrize("name", JAX_NAMES)
def test_jax_forms(name):
    """JAX's scalar types (jnp.float32, jnp.bfloat16) and jnp.dtype are the dtype of their name."""
    jnp = pytest.importorskip("jax.numpy")
    if not hasattr(jnp, name):
        pytest.skip(f"jax has no {name}")
    for form in (getattr(jnp, name), jnp.dtype(name)):
        _through_doors(form, BY_NAME[name])


def test_jax_names_only_listed_dtypes():
    """The dtypes jax.numpy names among the list's names are the documented ones."""
    jnp = pytest.importorskip("jax.numpy")
    assert {n for n in BY_NAME if hasattr(jnp, n)} <= set(JAX_NAMES)
    with pytest.raises(TypeError, match="has no tensorbridge equivalent"):
        tb.dtype(jnp.int4)


@pytest.mark.parametrize("api", ["view", "to"])
def test_positional_foreign_dtype(api):
    """view(dtype) and to(dtype) take a foreign dtype given by position, as dtype= takes it."""
    np = pytest.importorskip("numpy")
    t = tb.zeros(2, dtype=tb.int32)
    for form in (np.float32, np.dtype("<f4"), "float32"):
        if api == "to" and isinstance(form, str):
            continue  # a string given by position to to() is a device
        assert getattr(t, api)(form).dtype is tb.float32


def _child_result(subprocess_run: Any, code: str) -> Any:
    result = subprocess_run(code)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


# What a child importing TensorFlow or Paddle (never both: Paddle after TensorFlow crashes) reports:
# for each dtype the peer has, the dtype every door made of each of its forms; the refusals; and
# the modules that reading a foreign dtype imported.
_CHILD_DOORS = """
import json, sys
import tensorbridge as tb
from tensorbridge._dtype import ALL_DTYPES

def doors(form, dtype):
    t = tb.zeros(2, dtype=dtype)
    made = {tb.dtype(form), tb.frombuffer(bytes(2 * dtype.itemsize), dtype=form).dtype,
            tb.zeros(2, dtype=form).dtype, tb.asarray(t, dtype=form).dtype, t.to(dtype=form).dtype}
    return sorted(d.name for d in made)

def refusal(form):
    try:
        tb.zeros(2, dtype=form)
    except TypeError as e:
        return str(e)
    return None
"""


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:  # not imported here: see _CHILD_DOORS
        pytest.skip(f"{module} is not installed")


def test_tensorflow_forms(subprocess_run):
    """A tf.DType is the dtype of its name; TensorFlow's other dtypes are refused by name."""
    _needs("tensorflow")
    out = _child_result(
        subprocess_run,
        _CHILD_DOORS
        + """
import tensorflow as tf
made, names = {}, []
for d in ALL_DTYPES:
    try:
        form = tf.as_dtype(d.name)
    except TypeError:
        continue
    names.append(d.name)
    made[d.name] = doors(form, d)
before = set(sys.modules)
aliases = {a: tb.dtype(getattr(tf, a)).name for a in ("half", "double")}
refused = {n: refusal(getattr(tf, n)) for n in ("string", "qint8", "resource", "variant")}
print("RESULT " + json.dumps(
    {"names": names, "made": made, "aliases": aliases, "refused": refused,
     "imported": sorted(set(sys.modules) - before)}))
""",
    )
    assert set(out["names"]) == set(TENSORFLOW_NAMES)
    assert out["made"] == {n: [n] for n in out["names"]}
    assert out["aliases"] == {"half": "float16", "double": "float64"}
    for name, message in out["refused"].items():
        assert message.startswith("zeros(): argument 'dtype' has no tensorbridge equivalent; got")
        assert name in message
    assert out["imported"] == []


def test_paddle_forms(subprocess_run):
    """Paddle's DataType and VarType dtypes are read by their enum names, uint16 as uint16."""
    _needs("paddle")
    out = _child_result(
        subprocess_run,
        _CHILD_DOORS
        + """
import paddle
from paddle.base import core
var = core.VarDesc.VarType
made = {}
for d in ALL_DTYPES:
    form = getattr(paddle, d.name, None)
    if type(form).__name__ in ("dtype", "DataType"):
        made[d.name] = doors(form, d)
before = set(sys.modules)
var_names = {n: tb.dtype(getattr(var, n)).name
             for n in ("FP16", "FP32", "FP64", "BF16", "UINT8", "UINT16", "INT64", "BOOL",
                       "COMPLEX64", "FP8_E4M3FN", "FP8_E5M2")}
# Paddle prints its uint16 as bfloat16 (str(paddle.uint16) == 'paddle.bfloat16').
uint16 = [tb.dtype(paddle.uint16).name, str(paddle.uint16)]
refused = {n: refusal(form) for n, form in
           (("pstring", paddle.pstring), ("raw", paddle.raw), ("DENSE_TENSOR", var.DENSE_TENSOR))}
print("RESULT " + json.dumps(
    {"made": made, "var": var_names, "uint16": uint16, "refused": refused,
     "imported": sorted(set(sys.modules) - before)}))
""",
    )
    assert set(out["made"]) == set(PADDLE_NAMES)
    assert out["made"] == {n: [n] for n in PADDLE_NAMES}
    assert out["var"] == {
        "FP16": "float16",
        "FP32": "float32",
        "FP64": "float64",
        "BF16": "bfloat16",
        "UINT8": "uint8",
        "UINT16": "uint16",
        "INT64": "int64",
        "BOOL": "bool",
        "COMPLEX64": "complex64",
        "FP8_E4M3FN": "float8_e4m3fn",
        "FP8_E5M2": "float8_e5m2",
    }
    assert out["uint16"][0] == "uint16"
    for message in out["refused"].values():
        assert message.startswith("zeros(): argument 'dtype' has no tensorbridge equivalent; got")
    assert out["imported"] == []


def test_reading_a_foreign_dtype_imports_nothing(subprocess_run):
    """as_dtype recognises every library's dtype without importing a module, NumPy included."""
    peers = [m for m in ("numpy", "ml_dtypes", "torch", "jax") if importlib.util.find_spec(m)]
    out = _child_result(
        subprocess_run,
        f"""
import json, sys
import tensorbridge as tb
from tensorbridge._dtype import as_dtype
before = set(sys.modules)
bare = [as_dtype(f, "x").name for f in ("<f4", "float32", "torch.half")]
try:
    as_dtype(object(), "x")
except TypeError:
    pass
bare_imported = sorted(set(sys.modules) - before)
peers = {peers!r}
forms = []
if "numpy" in peers:
    import numpy
    forms += [numpy.float32, numpy.dtype("<i8")]
if "ml_dtypes" in peers:
    import ml_dtypes
    forms += [ml_dtypes.bfloat16, numpy.dtype(ml_dtypes.float8_e5m2)]
if "torch" in peers:
    import torch
    forms += [torch.float32, torch.bfloat16]
if "jax" in peers:
    import jax.numpy as jnp
    forms += [jnp.float32, jnp.bfloat16]
before = set(sys.modules)
names = [as_dtype(f, "x").name for f in forms]
print("RESULT " + json.dumps(
    {{"bare": bare, "bare_imported": bare_imported, "names": names,
      "imported": sorted(set(sys.modules) - before)}}))
""",
    )
    assert out["bare"] == ["float32", "float32", "float16"]
    assert out["bare_imported"] == []
    assert out["imported"] == []
    assert len(out["names"]) == 2 * len(peers)


# --- NumPy reads a tensorbridge dtype -------------------------------------------------------------


@pytest.mark.parametrize("name", NUMPY_NAMES + ML_DTYPES_NAMES)
def test_numpy_reads_a_dtype(name):
    """np.dtype(tensorbridge dtype) is NumPy's dtype (ml_dtypes' for the dtypes NumPy lacks)."""
    np = pytest.importorskip("numpy")
    dtype = BY_NAME[name]
    if name in ML_DTYPES_NAMES:
        ml_dtypes = pytest.importorskip("ml_dtypes")
        if not hasattr(ml_dtypes, name):
            pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
        expected = np.dtype(getattr(ml_dtypes, name))
    else:
        expected = np.dtype(name)
    assert np.dtype(dtype) == expected
    assert np.dtype(tb.zeros(1, dtype=dtype).dtype) == expected
    assert np.zeros(2, dtype=dtype).dtype == expected
    assert tb.dtype(np.dtype(dtype)) is dtype


def test_numpy_reads_the_protocol_its_version_reads():
    """NumPy 2.4+ reads __numpy_dtype__ and DType has no .dtype; older NumPy reads .dtype."""
    np = pytest.importorskip("numpy")
    assert tb.float32.__numpy_dtype__ == np.float32
    if np.lib.NumpyVersion(np.__version__) >= "2.4.0":
        assert not hasattr(tb.float32, "dtype")
    else:
        assert tb.float32.dtype == np.float32


def test_numpy_refuses_a_dtype_it_lacks():
    """float4_e2m1fn_x2 (two values a byte) has no NumPy dtype, and the error says what to do."""
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"NumPy has no dtype for tensorbridge\.float4_e2m1fn_x2"):
        to_numpy(tb.float4_e2m1fn_x2)
    with pytest.raises(TypeError):
        np.dtype(tb.float4_e2m1fn_x2)


def test_numpy_without_ml_dtypes(subprocess_run):
    """Without ml_dtypes, NumPy reading bfloat16 is a TypeError that says to install it."""
    pytest.importorskip("numpy")
    out = _child_result(
        subprocess_run,
        """
import json, sys
sys.modules["ml_dtypes"] = None  # blocked: its import raises ImportError
import numpy as np
import tensorbridge as tb
from tensorbridge._dtype import to_numpy
messages = []
for call in (lambda: to_numpy(tb.bfloat16), lambda: np.dtype(tb.bfloat16)):
    try:
        call()
    except TypeError as e:
        messages.append(str(e))
print("RESULT " + json.dumps({"messages": messages, "float32": str(np.dtype(tb.float32)),
                              "numpy": np.__version__}))
""",
    )
    assert out["float32"] == "float32"
    assert len(out["messages"]) == 2
    assert "NumPy has no bfloat16 dtype; install ml_dtypes" in out["messages"][0]
    if tuple(int(p) for p in out["numpy"].split(".")[:2]) >= (2, 4):  # older NumPy says its own
        assert out["messages"][1] == out["messages"][0]


def test_ml_dtypes_imported_only_when_numpy_asks(subprocess_run):
    """Reading float32 imports no ml_dtypes; NumPy asking for bfloat16 imports it then."""
    pytest.importorskip("numpy")
    pytest.importorskip("ml_dtypes")
    out = _child_result(
        subprocess_run,
        """
import json, sys
import numpy as np
import tensorbridge as tb
steps = ["ml_dtypes" in sys.modules]
np.dtype(tb.float32)
steps.append("ml_dtypes" in sys.modules)
np.dtype(tb.bfloat16)
steps.append("ml_dtypes" in sys.modules)
print("RESULT " + json.dumps(steps))
""",
    )
    assert out == [False, False, True]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: tb.tensor(tb.float32), id="tensor"),
        pytest.param(lambda: tb.asarray(tb.float32), id="asarray"),
        pytest.param(lambda: tb.as_tensor(tb.float32), id="as_tensor"),
        pytest.param(lambda: tb.tensor([tb.float32, tb.int8]), id="tensor-list"),
        pytest.param(lambda: tb.full((2,), tb.float32), id="full"),
    ],
)
def test_a_dtype_is_no_array(make):
    """A dtype read by NumPy is still no data: making a tensor of one is a TypeError naming it."""
    pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="DType"):
        make()


def test_a_dtype_is_no_array_for_peers():
    """PyTorch and JAX refuse a tensorbridge dtype as data."""
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises((RuntimeError, TypeError)):
        torch.tensor(tb.float32)
    with pytest.raises(TypeError):
        jnp.asarray(tb.float32)


def test_dask_takes_a_tensor():
    """dask.array.from_array reads a tensor's dtype through NumPy and computes its values."""
    np = pytest.importorskip("numpy")
    da = pytest.importorskip("dask.array")
    t = tb.arange(6, dtype=tb.float32).reshape(2, 3)
    array = da.from_array(t, chunks=1)
    assert np.dtype(array.dtype) == np.float32
    assert (array + 1).dtype == np.float32
    np.testing.assert_array_equal(np.asarray(array.compute()), np.arange(6.0).reshape(2, 3))
    assert float(array.sum().compute()) == 15.0


def test_xarray_takes_a_tensor():
    """xarray.DataArray holds a tensor's values with NumPy's dtype for it."""
    np = pytest.importorskip("numpy")
    xr = pytest.importorskip("xarray")
    t = tb.arange(6, dtype=tb.int16).reshape(2, 3)
    array = xr.DataArray(t)
    assert array.dtype == np.int16
    np.testing.assert_array_equal(array.values, np.arange(6).reshape(2, 3))


# --- Refusals -----------------------------------------------------------------------------------

_REFUSED = [
    (">f4", r"is big-endian, .*native byte order only; got '>f4'\. Pass '<f4' and byte-swap"),
    (">i8", r"is big-endian"),
    ("U3", r"is a unicode string dtype, and tensorbridge holds numbers and bools only; got 'U3'"),
    ("S3", r"is a bytes dtype"),
    ("O", r"is an object dtype"),
    ("V8", r"is a structured or void dtype"),
    ("M8[ns]", r"is a datetime dtype.*view the data as int64"),
    ("m8", r"is a timedelta dtype"),
]


@pytest.mark.skipif(sys.byteorder != "little", reason="the big-endian strings are native there")
@pytest.mark.parametrize(("form", "match"), _REFUSED, ids=[f for f, _ in _REFUSED])
@pytest.mark.parametrize("numpy_dtype", [False, True], ids=["str", "np.dtype"])
def test_refused_numpy_dtypes(form, match, numpy_dtype):
    """NumPy dtypes that hold no native numbers are refused with what they are and the fix."""
    if numpy_dtype:
        np = pytest.importorskip("numpy")
        form = np.dtype(form)
        match = match.replace("'", r"\W*").replace("got ", "got dtype")
    for api, call in (
        ("frombuffer", lambda: tb.frombuffer(b"\0" * 16, dtype=form)),
        ("zeros", lambda: tb.zeros(2, dtype=form)),
        ("asarray", lambda: tb.asarray([1, 2], dtype=form)),
    ):
        with pytest.raises(TypeError, match=rf"^{api}\(\): argument 'dtype' {match}"):
            call()
    with pytest.raises(TypeError, match=r"^tensorbridge\.dtype\(\): argument 'value' "):
        tb.dtype(form)


def test_refused_structured_and_wide_numpy_dtypes():
    """Records, subarrays and long double are refused, each named."""
    np = pytest.importorskip("numpy")
    for form in (np.dtype([("a", "<f4")]), np.dtype(("<f4", 3))):
        with pytest.raises(TypeError, match=r"zeros\(\): argument 'dtype' is a structured or void"):
            tb.zeros(2, dtype=form)
    if np.dtype(np.longdouble).itemsize > 8:
        with pytest.raises(TypeError, match="has no tensorbridge equivalent; got dtype"):
            tb.zeros(2, dtype=np.longdouble)


@pytest.mark.parametrize("form", ["f33", "float33", "d", "single", object(), 5, float])
def test_not_a_dtype_keeps_the_message(form):
    """What names no dtype at all keeps the one message: 'must be tensorbridge.dtype'."""
    with pytest.raises(TypeError, match=r"zeros\(\): argument 'dtype' must be tensorbridge\.dtype"):
        tb.zeros(2, dtype=form)
    assert as_dtype(tb.int8, "f") is tb.int8
