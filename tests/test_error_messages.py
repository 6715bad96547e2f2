"""Refusals in the caller's words: the function called, the value, the fix, on one line; PyTorch's
type and text where PyTorch defines them. Also `from_numpy`, and what ``help()`` shows."""

from __future__ import annotations

import enum
import inspect
import pydoc
import re

import pytest

import tensorbridge as tb


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def _released() -> memoryview:
    m = memoryview(b"ab")
    m.release()
    return m


# ---------------------------------------------------------------------------------------------- asarray


def test_asarray_released_memoryview():
    """asarray of a released memoryview is PyTorch's RuntimeError, naming asarray and the fix."""
    with pytest.raises(RuntimeError, match="could not retrieve buffer from object") as info:
        tb.asarray(_released())
    text = _one_line(info.value)
    assert text.startswith("asarray(): ")
    assert "released memory" in text  # the value
    assert "memoryview was released" in text
    assert "still open" in text


def test_frombuffer_released_memoryview_does_not_blame_contiguity():
    """frombuffer of a released memoryview says it was released, not that it is not contiguous."""
    with pytest.raises(RuntimeError, match="could not retrieve buffer from object") as info:
        tb.frombuffer(_released(), dtype=tb.uint8)
    text = _one_line(info.value)
    assert text.startswith("frombuffer(): ")
    assert "C-contiguous" not in text
    assert "memoryview was released" in text


def test_asarray_requires_grad_torch_tensor():
    """A torch tensor that requires grad: PyTorch's BufferError and text, naming asarray and
    the fix (.detach())."""
    torch = pytest.importorskip("torch")
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(BufferError) as info:
        tb.asarray(x)
    text = _one_line(info.value)
    assert text.startswith("asarray(): ")
    assert "Can't export tensors that require gradient, use tensor.detach()" in text
    assert "requires_grad=True" in text  # the value, as torch prints it
    assert "x.detach()" in text
    assert tb.asarray(x.detach()).data_ptr() == x.data_ptr()  # the fix works


_FROM_DLPACK = "from_dlpack"

_NOT_NUMBERS = [
    ("str", lambda np: np.array(["a", "b"]), "'<U1'", "astype"),
    ("bytes", lambda np: np.array([b"a"]), "'|S1'", "view(numpy.uint8)"),
    ("object", lambda np: np.array([object()]), "'|O'", "astype"),
    ("datetime", lambda np: np.zeros(2, "datetime64[s]"), "'<M8[s]'", "view(numpy.int64)"),
    ("timedelta", lambda np: np.zeros(2, "timedelta64[s]"), "'<m8[s]'", "view(numpy.int64)"),
    ("structured", lambda np: np.zeros(2, [("a", "<i4")]), "'|V4'", "x['a']"),
]


@pytest.mark.parametrize(
    ("make", "dtype", "fix"), [case[1:] for case in _NOT_NUMBERS], ids=[c[0] for c in _NOT_NUMBERS]
)
@pytest.mark.parametrize("api", ["asarray", _FROM_DLPACK])
def test_numpy_dtype_without_numbers(make, dtype, fix, api):
    """A NumPy dtype that holds no numbers: NumPy's BufferError and text, naming the function,
    the dtype, what tensorbridge holds and the conversion."""
    np = pytest.importorskip("numpy")
    with pytest.raises(BufferError, match="DLPack only supports") as info:
        getattr(tb, api)(make(np))
    text = _one_line(info.value)
    assert text.startswith(f"{api}(): ")
    assert dtype in text
    assert "numbers or bools" in text
    assert fix in text


@pytest.mark.parametrize("api", ["asarray", _FROM_DLPACK])
def test_numpy_big_endian(api):
    """A big-endian array: NumPy's BufferError, naming the function, the dtype and the fix."""
    np = pytest.importorskip("numpy")
    a = np.arange(3, dtype=">f4")
    with pytest.raises(BufferError, match="DLPack only supports native byte order") as info:
        getattr(tb, api)(a)
    text = _one_line(info.value)
    assert text.startswith(f"{api}(): ")
    assert "'>f4'" in text
    assert "astype('<f4')" in text
    assert "byteswap().view(x.dtype.newbyteorder())" in text
    assert tb.asarray(a.astype("<f4")).tolist() == [0.0, 1.0, 2.0]  # the fix works


def test_asarray_device_names_asarray():
    """A device tensorbridge cannot move to: the refusal names asarray, not to()."""
    np = pytest.importorskip("numpy")
    for obj in (np.ones(3), tb.ones(3), [1.0]):
        with pytest.raises(BufferError) as info:
            tb.asarray(obj, device="cuda:0")
        text = _one_line(info.value)
        assert text.startswith("asarray(): ")
        assert "to()" not in text
        assert "cuda" in text
        assert "__dlpack__(dl_device=...)" in text


@pytest.mark.parametrize("value", [3.0, 7, True, 1j])
def test_asarray_scalar_copy_false(value):
    """copy=False of a Python scalar: PyTorch's ValueError and text, saying a scalar has no memory
    and that copy=None gives a tensor."""
    with pytest.raises(ValueError, match="can't alias arbitrary sequence into a tensor") as info:
        tb.asarray(value, copy=False)
    text = _one_line(info.value)
    assert text.startswith("asarray(): ")
    assert repr(value) in text
    assert "Python scalar" in text
    assert "no memory" in text
    assert "copy=None" in text
    assert tb.asarray(value, copy=None).item() == value


def test_asarray_sequence_copy_false_names_value():
    """copy=False of a list names the list and says it holds Python objects, not memory."""
    with pytest.raises(ValueError, match="can't alias arbitrary sequence into a tensor") as info:
        tb.asarray([1, 2], copy=False)
    text = _one_line(info.value)
    assert "[1, 2]" in text
    assert "copy=None" in text


# ---------------------------------------------------------------------------------------------- export


def _readonly() -> tb.Tensor:
    return tb.frombuffer(b"abcd", dtype=tb.uint8)


def test_jax_from_dlpack_of_readonly_tensor_says_t_jax():
    """A JAX that asks a read-only tensor for a legacy capsule (JAX 0.10 does) is refused with a
    message that says t.jax(); a JAX that asks for a versioned capsule (JAX 0.12 does) gets one
    flagged read-only, which its immutable arrays may hold."""
    jnp = pytest.importorskip("jax.numpy")
    t = _readonly()
    try:
        imported = jnp.from_dlpack(t)
    except BufferError as exc:
        text = _one_line(exc)
        assert "read-only" in text
        assert text.startswith("__dlpack__(): ")
        assert "t.jax()" in text
        assert "max_version" not in text
    else:
        assert imported.tolist() == [97, 98, 99, 100]
        assert t.is_readonly
    assert t.jax().tolist() == [97, 98, 99, 100]  # the fix works
    assert t.tolist() == [97, 98, 99, 100]


def test_direct_legacy_export_of_readonly_tensor_lists_the_ways_out():
    """A legacy __dlpack__() call from an unknown consumer lists every way out, guessing none."""
    with pytest.raises(BufferError, match="read-only") as info:
        _readonly().__dlpack__()
    text = _one_line(info.value)
    for way in ("t.numpy()", "np.from_dlpack(t)", "t.jax()", "copy=True", "max_version=(1, 0)"):
        assert way in text


def test_to_dlpack_of_readonly_tensor_says_clone():
    """to_dlpack makes legacy capsules only: its refusal says clone()."""
    with pytest.raises(BufferError, match="read-only") as info:
        tb.to_dlpack(_readonly())
    text = _one_line(info.value)
    assert text.startswith("to_dlpack(): ")
    assert "clone()" in text
    assert "t.jax()" not in text


# ---------------------------------------------------------------------------------------------- from_numpy


def test_from_numpy_shares_memory_both_ways():
    """from_numpy is zero-copy: a write through either is seen by the other."""
    np = pytest.importorskip("numpy")
    a = np.arange(4.0)
    t = tb.from_numpy(a)
    assert t.data_ptr() == a.ctypes.data
    assert t.dtype is tb.float64
    t[0] = 7.0
    assert a[0] == 7.0
    a[1] = -1.0
    assert t[1].item() == -1.0


def test_from_numpy_keeps_the_array_alive():
    """The tensor holds the array's memory after the caller's last reference is gone."""
    np = pytest.importorskip("numpy")
    a = np.arange(3)
    t = tb.from_numpy(a)
    del a
    assert t.tolist() == [0, 1, 2]


def test_from_numpy_readonly_array_gives_readonly_tensor():
    """A read-only array gives a read-only tensor, whose writes raise."""
    np = pytest.importorskip("numpy")
    a = np.arange(3)
    a.setflags(write=False)
    t = tb.from_numpy(a)
    assert t.is_readonly
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 1


def test_from_numpy_takes_what_torch_refuses_but_tensorbridge_holds():
    """bfloat16 (ml_dtypes), uint16 and negative strides are shared, zero-copy."""
    np = pytest.importorskip("numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    b = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    t = tb.from_numpy(b)
    assert t.dtype is tb.bfloat16
    assert t.data_ptr() == b.ctypes.data
    assert t.tolist() == [1.5, -2.0]
    assert tb.from_numpy(np.zeros(2, "u2")).dtype is tb.uint16
    r = np.arange(3)[::-1]
    assert tb.from_numpy(r).tolist() == [2, 1, 0]
    assert tb.from_numpy(r).stride() == (-1,)


@pytest.mark.parametrize("obj", [[1, 2], 3.0, b"ab", None], ids=["list", "float", "bytes", "None"])
def test_from_numpy_refuses_non_arrays(obj):
    """Anything but a numpy.ndarray: PyTorch's TypeError and text, naming the type and asarray."""
    with pytest.raises(TypeError, match=r"expected np\.ndarray \(got ") as info:
        tb.from_numpy(obj)
    text = _one_line(info.value)
    assert text.startswith("from_numpy(): ")
    assert f"(got {type(obj).__name__})" in text
    assert "asarray()" in text


def test_from_numpy_refuses_torch_tensor():
    """A torch tensor is not an ndarray, as torch.from_numpy says."""
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"expected np\.ndarray \(got Tensor\)"):
        tb.from_numpy(torch.ones(2))


@pytest.mark.parametrize(
    ("make", "dtype", "fix"), [case[1:] for case in _NOT_NUMBERS], ids=[c[0] for c in _NOT_NUMBERS]
)
def test_from_numpy_refuses_dtypes_without_numbers(make, dtype, fix):
    """A dtype without numbers: PyTorch's TypeError ("can't convert np.ndarray of type ..."),
    naming the dtype and the conversion."""
    np = pytest.importorskip("numpy")
    a = make(np)
    with pytest.raises(TypeError, match=r"can't convert np\.ndarray of type numpy\.") as info:
        tb.from_numpy(a)
    text = _one_line(info.value)
    assert text.startswith("from_numpy(): ")
    assert dtype in text
    assert fix in text


def test_from_numpy_refuses_big_endian():
    """Non-native byte order: PyTorch's ValueError and text, with the conversion."""
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match="byte order different from the native byte order") as info:
        tb.from_numpy(np.zeros(2, ">f4"))
    assert "astype('<f4')" in _one_line(info.value)


def test_from_numpy_is_public_and_not_in_utils():
    """from_numpy is a top-level name, as torch.from_numpy, and not in tensorbridge.utils."""
    assert "from_numpy" in tb.__all__
    assert not hasattr(tb.utils, "from_numpy")


# ---------------------------------------------------------------------------------------------- docs


def _public_params() -> list[object]:
    return [pytest.param(name, obj, id=name) for name, obj in _public_callables()]


def _public_callables() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for name in tb.__all__:
        obj = getattr(tb, name)
        if not callable(obj) or isinstance(obj, tb.dtype):
            continue
        if isinstance(obj, type) and issubclass(obj, (enum.Enum, BaseException)):
            continue  # Enum's functional API and exceptions have no keywords of their own
        found.append((name, obj))
    for name in sorted(vars(tb.Tensor)):
        attr = getattr(tb.Tensor, name)
        if not name.startswith("_") and callable(attr) and not isinstance(attr, type):
            found.append((f"Tensor.{name}", attr))
    return found


def _keywords(obj: object) -> list[str]:
    try:
        signature = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in signature.parameters.values()
        if p.kind is p.KEYWORD_ONLY
        or (p.default is not p.empty and p.kind is p.POSITIONAL_OR_KEYWORD)
    ]


@pytest.mark.parametrize(("name", "obj"), _public_params())
def test_every_keyword_is_documented(name, obj):
    """Each keyword parameter of a public callable has an entry in its docstring's Args (a class's
    own, or its constructor's: `Device` documents ``type`` and ``index`` on ``__new__``)."""
    doc = inspect.getdoc(obj) or ""
    if isinstance(obj, type):
        doc += "\n" + "\n".join(
            inspect.getdoc(getattr(obj, m)) or "" for m in ("__new__", "__init__")
        )
    missing = [k for k in _keywords(obj) if not re.search(rf"^\s+{k}( \([^)]*\))?:", doc, re.M)]
    assert not missing, f"{name}: no Args entry for {missing}"


@pytest.mark.parametrize(
    ("name", "obj"), [pytest.param(n, o, id=n) for n, o in _public_callables()]
)
def test_help_shows_the_signature_once(name, obj):
    """help() shows a callable's signature once: its docstring does not open with it again (as a
    first line repeating the signature, or a compiled build's embedded one, would)."""
    short = name.rpartition(".")[2]
    first = (inspect.getdoc(obj) or "").partition("\n")[0]
    assert not re.match(rf"{re.escape(short)}\(.*\)", first), first
    text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    assert text.count(str(inspect.signature(obj))) <= 1  # type: ignore[arg-type]
