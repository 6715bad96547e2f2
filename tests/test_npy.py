""".npy files: load_npy/save_npy against numpy.save/numpy.load, modes, versions, hostile headers."""

from __future__ import annotations

import gc
import io
import struct

import pytest

import tensorbridge as tb

np = pytest.importorskip("numpy")

DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
          "float16", "float32", "float64", "complex64", "complex128"]  # fmt: skip


def _sample(name, shape):
    n = int(np.prod(shape))
    return (np.arange(n) % 7 - 2).astype(name).reshape(shape)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3), (), (0, 4), (5,)])
def test_numpy_files_load_with_values_and_dtype(tmp_path, name, shape):
    """np.save output loads (mapped and read) with NumPy's dtype, shape and values."""
    a = _sample(name, shape)
    path = tmp_path / "a.npy"
    np.save(path, a)
    for mode in ("r", "c", "r+", None):
        t = tb.load_npy(path, mode=mode)
        n = t.numpy()
        assert n.dtype == a.dtype and n.shape == a.shape
        np.testing.assert_array_equal(n, a)


@pytest.mark.parametrize("name", DTYPES)
def test_saved_files_equal_numpy_save(tmp_path, name):
    """save_npy writes the bytes numpy.save writes, and numpy.load reads them back."""
    for shape in [(2, 3), (), (0,)]:
        a = _sample(name, shape)
        np.save(tmp_path / "ref.npy", a)
        tb.save_npy(tmp_path / "mine.npy", tb.asarray(a))
        assert (tmp_path / "mine.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
        np.testing.assert_array_equal(np.load(tmp_path / "mine.npy"), a)


def test_any_layout_written_c_contiguous(tmp_path):
    """A transposed, strided view is written in C order."""
    t = tb.arange(12, dtype=tb.int32).reshape(3, 4).t()[::2]
    tb.save_npy(tmp_path / "v.npy", t)
    back = np.load(tmp_path / "v.npy")
    assert back.flags.c_contiguous and back.tolist() == t.tolist()


def test_fortran_order_is_strides_without_copy(tmp_path):
    """A Fortran-order file loads as column-major strides over the mapped bytes."""
    a = np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))
    np.save(tmp_path / "f.npy", a)
    t = tb.load_npy(tmp_path / "f.npy")
    assert t.stride() == (1, 3) and t.tolist() == a.tolist()
    m = np.load(tmp_path / "f.npy", mmap_mode="r")
    raw = (tmp_path / "f.npy").read_bytes()
    assert len(raw) - t.numel() * 2 == m.offset


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_format_versions(tmp_path, version):
    """Files of each format version load."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    with open(tmp_path / "v.npy", "wb") as f:
        np.lib.format.write_array(f, a, version=version)
    assert tb.load_npy(tmp_path / "v.npy").tolist() == a.tolist()


def test_modes(tmp_path):
    """'r' is read-only, 'c' writes stay private, 'r+' writes reach the file, None copies."""
    path = tmp_path / "m.npy"
    np.save(path, np.arange(4, dtype=np.int64))
    t = tb.load_npy(path)
    assert t.is_readonly
    c = tb.load_npy(path, mode="c")
    c[0] = 7
    assert np.load(path)[0] == 0
    w = tb.load_npy(path, mode="r+")
    w[0] = 9
    del w
    gc.collect()
    assert np.load(path)[0] == 9
    p = tb.load_npy(path, mode=None)
    assert not p.is_readonly and p.tolist() == [9, 1, 2, 3]
    with pytest.raises(ValueError, match="mode must be"):
        tb.load_npy(path, mode="w")


def test_zero_copy_to_numpy_torch_jax(tmp_path):
    """A mapped tensor goes to NumPy, PyTorch and JAX sharing its memory."""
    path = tmp_path / "z.npy"
    np.save(path, np.arange(32, dtype=np.float32))
    t = tb.load_npy(path, mode="c")
    a = t.numpy()
    assert a.ctypes.data == t.data_ptr()
    assert np.shares_memory(a, t.numpy())
    torch = pytest.importorskip("torch")
    assert t.torch().data_ptr() == t.data_ptr()
    assert isinstance(t.torch(), torch.Tensor)
    jax = pytest.importorskip("jax")
    j = t.jax()  # the data starts at byte 128 of a page-aligned map: 64-byte aligned
    assert j.unsafe_buffer_pointer() == t.data_ptr()
    assert jax.numpy.array_equal(j, jax.numpy.arange(32, dtype="float32"))


def test_open_file_objects(tmp_path):
    """An open file is mapped from its position and left after the data; BytesIO needs mode=None."""
    path = tmp_path / "two.npy"
    with open(path, "wb") as f:
        np.save(f, np.arange(3, dtype=np.int8))
        np.save(f, np.arange(4, dtype=np.int16))
    with open(path, "rb") as f:
        assert tb.load_npy(f).tolist() == [0, 1, 2]
        assert tb.load_npy(f, mode=None).tolist() == [0, 1, 2, 3]
    buf = io.BytesIO()
    np.save(buf, np.eye(2))
    buf.seek(0)
    with pytest.raises(ValueError, match="mode=None"):
        tb.load_npy(buf)
    assert tb.load_npy(buf, mode=None).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    out = io.BytesIO()
    tb.save_npy(out, tb.arange(3))
    out.seek(0)
    assert np.load(out).tolist() == [0, 1, 2]


def test_big_endian_is_converted_copy(tmp_path):
    """Big-endian data loads as a native-order copy; mode='r+' refuses it."""
    path = tmp_path / "be.npy"
    a = np.arange(4, dtype=">i4")
    np.save(path, a)
    for mode in ("r", "c", None):
        t = tb.load_npy(path, mode=mode)
        assert t.dtype is tb.int32 and t.tolist() == [0, 1, 2, 3]
    assert tb.load_npy(path).is_readonly
    c = np.array([1 + 2j], dtype=">c8")
    np.save(path, c)
    assert tb.load_npy(path).tolist() == [1 + 2j]
    with pytest.raises(ValueError, match="big-endian"):
        tb.load_npy(path, mode="r+")


@pytest.mark.parametrize(
    "array",
    [
        np.array([b"ab"]),
        np.array(["x"]),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
        np.zeros(2, dtype="V4"),
    ],
)
def test_non_tensor_dtypes_refused(tmp_path, array):
    """String, structured, datetime and void arrays are a clear ValueError."""
    path = tmp_path / "s.npy"
    np.save(path, array)
    with pytest.raises(ValueError, match="descr"):
        tb.load_npy(path)
    with pytest.raises(ValueError, match="descr"):
        tb.load_npy(path, mode=None)


def test_object_array_refused(tmp_path):
    """An object (pickled) array is a clear ValueError, never unpickled."""
    path = tmp_path / "o.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="descr"):
        tb.load_npy(path)


@pytest.mark.parametrize(
    "dtype", [tb.bfloat16, tb.complex32, tb.float8_e4m3fn, tb.float4_e2m1fn_x2]
)
def test_unnameable_dtypes_refused_on_save(tmp_path, dtype):
    """dtypes the .npy format cannot name are a ValueError on save, suggesting a raw view."""
    with pytest.raises(ValueError, match="cannot name"):
        tb.save_npy(tmp_path / "x.npy", tb.zeros(2, dtype=dtype))


def _npy(header: bytes, data: bytes = b"", version: bytes = b"\x01\x00") -> bytes:
    fmt = "<H" if version == b"\x01\x00" else "<I"
    return b"\x93NUMPY" + version + struct.pack(fmt, len(header)) + header + data


HOSTILE = {
    "empty": (b"", "magic"),
    "bad magic": (b"\x93NUMPX\x01\x00\x00\x00", "magic"),
    "bad version": (b"\x93NUMPY\x09\x00\x00\x00", "version"),
    "header past end": (b"\x93NUMPY\x01\x00\xff\x00{}", "past the end"),
    "huge v2 header": (b"\x93NUMPY\x02\x00\xff\xff\xff\xff{}", "past the end|limit"),
    "not literal": (_npy(b"{'descr': __import__('os')}"), "not a Python literal"),
    "not dict": (_npy(b"[1, 2]"), "exactly the keys"),
    "wrong keys": (_npy(b"{'descr': '<f4', 'shape': ()}"), "exactly the keys"),
    "negative shape": (_npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}"), "shape"),
    "float shape": (_npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}"), "shape"),
    "bool shape": (_npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (True,)}"), "shape"),
    "list shape": (_npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}"), "shape"),
    "bad order": (_npy(b"{'descr': '<f4', 'fortran_order': 1, 'shape': ()}"), "fortran_order"),
    "long double": (_npy(b"{'descr': '<f16', 'fortran_order': False, 'shape': ()}"), "descr"),
    "short data": (
        _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", b"\0" * 8),
        "data needs 16 bytes after the header but the file has 8",
    ),
    "huge shape": (
        _npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': (%d, %d)}" % (2**62, 2**62)),
        r"2\*\*63 - 1",
    ),
    "too many dims": (
        _npy(b"{'descr': '<u1', 'fortran_order': False, 'shape': (" + b"1," * 65 + b")}", b"a"),
        "at most 64",
    ),
    "deep nesting": (_npy(b"(" * 5000 + b")" * 5000, version=b"\x02\x00"), "literal"),
    "over limit": (_npy(b" " * 10001 + b"{}", version=b"\x02\x00"), "10000"),
    "not utf8 v3": (_npy(b"\xff{}", version=b"\x03\x00"), "utf-8"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_are_value_errors(tmp_path, case):
    """Each malformed file is a ValueError naming the file, mapped or read."""
    data, match = HOSTILE[case]
    path = tmp_path / "bad.npy"
    path.write_bytes(data)
    for mode in ("r", None):
        with pytest.raises(ValueError, match=match) as info:
            tb.load_npy(path, mode=mode)
        assert str(path) in str(info.value)


def test_argument_errors(tmp_path):
    """A non-file, a non-tensor and a text-mode file are TypeErrors."""
    with pytest.raises(TypeError, match="path or an open binary file"):
        tb.load_npy(3)
    with pytest.raises(TypeError, match=r"tensorbridge\.Tensor"):
        tb.save_npy(tmp_path / "x.npy", [1, 2])
    (tmp_path / "t.npy").write_bytes(b"x")
    with open(tmp_path / "t.npy") as f, pytest.raises(TypeError, match="binary"):
        tb.load_npy(f, mode=None)
