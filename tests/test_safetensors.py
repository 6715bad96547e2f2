"""tensorbridge.safetensors: the format both ways with the real package, modes, lifetime, hostile files."""

from __future__ import annotations

import gc
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorbridge as tb
from tensorbridge import safetensors as tst

# The format's dtype names and the tensorbridge dtype each loads as (F6 kinds have none).
FORMAT_DTYPES = {
    "BOOL": tb.bool,
    "U8": tb.uint8,
    "I8": tb.int8,
    "U16": tb.uint16,
    "I16": tb.int16,
    "U32": tb.uint32,
    "I32": tb.int32,
    "U64": tb.uint64,
    "I64": tb.int64,
    "F16": tb.float16,
    "BF16": tb.bfloat16,
    "F32": tb.float32,
    "F64": tb.float64,
    "C64": tb.complex64,
    "F8_E4M3": tb.float8_e4m3fn,
    "F8_E5M2": tb.float8_e5m2,
    "F8_E8M0": tb.float8_e8m0fnu,
    "F8_E4M3FNUZ": tb.float8_e4m3fnuz,
    "F8_E5M2FNUZ": tb.float8_e5m2fnuz,
    "F4": tb.float4_e2m1fn_x2,
}


def _file(header: object, data: bytes = b"", *, raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _raw_bytes(t: tb.Tensor) -> bytes:
    """The tensor's bytes in C order."""
    if t.numel() == 0:
        return b""
    return bytes(t.contiguous().as_memoryview().cast("B"))


def _patterned(dtype: tb.dtype, shape: tuple[int, ...]) -> tb.Tensor:
    """A tensor of ``dtype`` whose bytes count up from 0 (every byte pattern is a value)."""
    n = 1
    for s in shape:
        n *= s
    if not n:
        return tb.empty(shape, dtype=dtype)
    raw = bytearray(i % 256 for i in range(n * dtype.itemsize))
    return tb.frombuffer(raw, dtype=dtype).reshape(shape)


def _torch_tensors():
    torch = pytest.importorskip("torch")
    out = {}
    for code, dtype in FORMAT_DTYPES.items():
        out[code] = torch.from_dlpack(_patterned(dtype if code != "BOOL" else tb.uint8, (2, 3)))
        if code == "BOOL":
            out[code] = out[code] % 2 == 1
    out["zero_d"] = torch.tensor(2.5, dtype=torch.float64)
    out["empty"] = torch.zeros(0, 3, dtype=torch.bfloat16)
    return out


def test_package_files_load_identically(tmp_path):
    """Every dtype, 0-d and empty tensors written by the safetensors package load with the same
    dtype, shape and bytes."""
    pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")  # safetensors.torch imports it
    from safetensors.torch import save_file

    ref = _torch_tensors()
    path = tmp_path / "a.safetensors"
    save_file(ref, str(path), metadata={"format": "pt"})
    out = tst.load_file(path)
    assert set(out) == set(ref)
    for name, t in out.items():
        mine = t.torch(force=True)
        assert mine.dtype == ref[name].dtype and tuple(mine.shape) == tuple(ref[name].shape), name
        assert bytes(mine.contiguous().view(-1).view(torch.uint8).numpy()) == bytes(
            ref[name].contiguous().view(-1).view(torch.uint8).numpy()
        ), name
    with tst.safe_open(path) as f:
        assert f.metadata() == {"format": "pt"}


def test_written_bytes_equal_package(tmp_path):
    """save() writes the same bytes as safetensors.torch.save for every dtype (order, padding,
    metadata), and save_file() the same file."""
    pytest.importorskip("safetensors")
    pytest.importorskip("torch")  # safetensors.torch imports it
    from safetensors.torch import save as ref_save

    ref = _torch_tensors()
    mine = {k: tb.from_dlpack(v) for k, v in ref.items()}
    expected = ref_save(ref, metadata={"k": "v"})
    assert tst.save(mine, metadata={"k": "v"}) == expected
    tst.save_file(mine, tmp_path / "b.safetensors", metadata={"k": "v"})
    assert (tmp_path / "b.safetensors").read_bytes() == expected


def test_files_written_here_load_in_package(tmp_path):
    """A file written here loads in the safetensors package with the same values (NumPy dtypes)."""
    pytest.importorskip("safetensors")
    np = pytest.importorskip("numpy")
    from safetensors.numpy import load_file

    tensors = {
        "a": tb.arange(12, dtype=tb.float32).reshape(3, 4).t(),  # non-contiguous: written C order
        "b": tb.tensor(7, dtype=tb.int64),
        "c": tb.zeros(0, dtype=tb.uint16),
        "d": tb.tensor([True, False]),
    }
    tst.save_file(tensors, tmp_path / "c.safetensors")
    out = load_file(str(tmp_path / "c.safetensors"))
    for name, t in tensors.items():
        np.testing.assert_array_equal(out[name], t.numpy())
        assert out[name].dtype == t.numpy().dtype


@pytest.mark.parametrize("code", sorted(FORMAT_DTYPES))
def test_each_dtype_round_trips(code):
    """Each format dtype saves and loads back with its dtype, shape and bytes; 0-d and empty too."""
    dtype = FORMAT_DTYPES[code]
    shapes = [(2, 4), (0, 2)] + ([] if code == "F4" else [()])
    for shape in shapes:
        t = _patterned(dtype, shape)
        data = tst.save({"x": t})
        header = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
        assert header["x"]["dtype"] == code
        back = tst.load(data)["x"]
        assert back.dtype is dtype and back.shape == t.shape and _raw_bytes(back) == _raw_bytes(t)


def test_f4_shape_counts_values():
    """F4 is stored with its last dimension doubled (4-bit values) and loads as packed pairs."""
    t = _patterned(tb.float4_e2m1fn_x2, (3, 2))
    data = tst.save({"x": t})
    assert b'"shape":[3,4]' in data
    assert tst.load(data)["x"].shape == (3, 2)
    with pytest.raises(ValueError, match="0-d float4_e2m1fn_x2"):
        tst.save({"x": tb.zeros((), dtype=tb.float4_e2m1fn_x2)})
    odd = _file({"x": {"dtype": "F4", "shape": [2, 3], "data_offsets": [0, 3]}}, b"abc")
    with pytest.raises(ValueError, match="last dimension is not even"):
        tst.load(odd)


def test_unsupported_dtypes_are_clear_errors():
    """F6 kinds (no tensorbridge dtype) and dtypes the format lacks are ValueErrors naming them."""
    f6 = _file({"x": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}, b"abc")
    with pytest.raises(ValueError, match="F6_E2M3"):
        tst.load(f6)
    for dtype in (tb.complex128, tb.complex32, tb.float8_e4m3, tb.float8_e3m4):
        with pytest.raises(ValueError, match=dtype.name):
            tst.save({"x": tb.zeros(2, dtype=dtype)})


def test_modes(tmp_path):
    """'r' is read-only, 'c' writes stay private, 'r+' writes reach the file; bad modes refused."""
    path = tmp_path / "m.safetensors"
    tst.save_file({"x": tb.arange(4, dtype=tb.int32)}, path)
    t = tst.load_file(path)["x"]
    assert t.is_readonly
    with pytest.raises((ValueError, RuntimeError, BufferError)):
        t[0] = 9
    c = tst.load_file(path, mode="c")["x"]
    c[0] = 9
    assert tst.load_file(path)["x"].tolist() == [0, 1, 2, 3]
    w = tst.load_file(path, mode="r+")["x"]
    w[0] = 9
    del w
    gc.collect()
    assert tst.load_file(path)["x"].tolist() == [9, 1, 2, 3]
    with pytest.raises(ValueError, match="mode must be"):
        tst.load_file(path, mode="w")
    with pytest.raises(ValueError, match="device must be 'cpu'"):
        tst.load_file(path, device="cuda")


def test_tensors_share_one_map_at_their_offsets(tmp_path):
    """Each tensor points into the file's one map at its data offset, misaligned offsets included."""
    path = tmp_path / "o.safetensors"
    tst.save_file({"a": tb.arange(3, dtype=tb.uint8), "b": tb.arange(2, dtype=tb.int32)}, path)
    out = tst.load_file(path)
    # I32 sorts first: b at data offset 0, a at 8; one map, so the pointers differ by 8.
    assert out["a"].data_ptr() - out["b"].data_ptr() == 8
    raw = _file(
        {
            "u": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
            "f": {"dtype": "F32", "shape": [1], "data_offsets": [1, 5]},
        },
        b"\x07" + struct.pack("<f", 1.5),
    )
    path.write_bytes(raw)
    out = tst.load_file(path)
    assert out["f"].data_ptr() - out["u"].data_ptr() == 1  # a float32 at an odd byte, no copy
    assert out["f"].tolist() == [1.5]


def test_map_outlives_file_handle_and_rewrite(tmp_path):
    """Tensors keep their data after safe_open closes and after save_file replaces the file."""
    path = tmp_path / "l.safetensors"
    tst.save_file({"x": tb.arange(4, dtype=tb.int64)}, path)
    with tst.safe_open(path) as f:
        t = f.get_tensor("x")
    with pytest.raises(ValueError, match="closed"):
        f.get_tensor("x")
    tst.save_file({"x": tb.zeros(1000, dtype=tb.int64)}, path)
    assert t.tolist() == [0, 1, 2, 3]


def test_lifetime_in_child(subprocess_run, tmp_path):
    """A view used after every other reference to the map is gone reads the right values."""
    path = tmp_path / "k.safetensors"
    tst.save_file({"x": tb.arange(1 << 16, dtype=tb.int32)}, path)
    code = f"""
        import gc
        from tensorbridge import safetensors as tst
        t = tst.load_file({str(path)!r})["x"][-3:]
        gc.collect()
        assert t.tolist() == [65533, 65534, 65535], t.tolist()
        f = tst.safe_open({str(path)!r}); s = f.get_slice("x"); del f; gc.collect()
        assert s[5:7].tolist() == [5, 6]
        print("ok")
    """
    proc = subprocess_run(code)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_safe_open_api(tmp_path):
    """keys() sorted, offset_keys() in file order, metadata(), get_slice shape/dtype/indexing."""
    path = tmp_path / "s.safetensors"
    tst.save_file(
        {"z": tb.arange(12, dtype=tb.float32).reshape(3, 4), "a": tb.arange(2, dtype=tb.int8)},
        path,
    )
    with tst.safe_open(path, framework="tb") as f:
        assert f.keys() == ["a", "z"]
        assert f.offset_keys() == ["z", "a"]
        assert f.metadata() is None
        s = f.get_slice("z")
        assert s.get_shape() == [3, 4] and s.get_dtype() == "F32"
        assert s[1:, ::2].tolist() == [[4.0, 6.0], [8.0, 10.0]]
        with pytest.raises(KeyError, match="no tensor named 'nope'"):
            f.get_tensor("nope")
    with pytest.raises(ValueError, match="framework must be"):
        tst.safe_open(path, framework="tf")


def test_zero_copy_to_numpy_torch_jax(tmp_path):
    """Loaded tensors go to NumPy (ml_dtypes for bfloat16), PyTorch and JAX sharing memory."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("ml_dtypes")
    path = tmp_path / "z.safetensors"
    # A 56-byte header puts the data at byte 64 of the page-aligned map: 64-byte aligned for JAX.
    tensors = {"w": tb.arange(16, dtype=tb.float32), "h": tb.ones(4, dtype=tb.bfloat16)}
    tst.save_file(tensors, path)
    out = tst.load_file(path, mode="c")
    a = out["w"].numpy()
    assert a.ctypes.data == out["w"].data_ptr() and not a.flags.owndata
    b = out["h"].numpy()
    assert str(b.dtype) == "bfloat16" and b.ctypes.data == out["h"].data_ptr()
    torch = pytest.importorskip("torch")
    assert out["w"].torch().data_ptr() == out["w"].data_ptr()
    with tst.safe_open(path, framework="pt") as f:
        w = f.get_tensor("w")
        assert isinstance(w, torch.Tensor) and w.tolist() == list(range(16))
    with tst.safe_open(path, framework="np") as f:
        assert np.shares_memory(f.get_tensor("w"), f.get_tensor("w"))
    jax = pytest.importorskip("jax")
    header_len = struct.unpack("<Q", path.read_bytes()[:8])[0]
    x = out["w"]
    j = x.jax()
    if (8 + header_len) % 64 == 0:
        assert j.unsafe_buffer_pointer() == x.data_ptr()
    assert jax.numpy.array_equal(j, jax.numpy.arange(16, dtype="float32"))


def test_load_bytes_views_the_buffer():
    """load() of bytes gives read-only views of those bytes; of a bytearray, writable ones."""
    data = tst.save({"x": tb.arange(3, dtype=tb.int16)})
    t = tst.load(data)["x"]
    assert t.is_readonly and t.tolist() == [0, 1, 2]
    buf = bytearray(data)
    w = tst.load(buf)["x"]
    w[0] = 5
    assert tst.load(bytes(buf))["x"].tolist() == [5, 1, 2]
    with pytest.raises(TypeError, match="must be bytes"):
        tst.load(3)


def test_save_argument_errors():
    """Non-dict tensors, non-str names, '__metadata__' as a name and bad metadata are refused."""
    with pytest.raises(TypeError):
        tst.save([tb.zeros(1)])
    with pytest.raises(TypeError):
        tst.save({1: tb.zeros(1)})
    with pytest.raises(ValueError, match="__metadata__"):
        tst.save({"__metadata__": tb.zeros(1)})
    with pytest.raises(TypeError, match="metadata"):
        tst.save({"a": tb.zeros(1)}, metadata={"a": 1})


def _one(dtype="U8", shape=(2,), offsets=(0, 2)):
    return {"x": {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}}


HOSTILE = {
    "short file": (b"\x01\x02", "shorter than the 8-byte"),
    "header past end": (struct.pack("<Q", 50) + b"{}", "past the end"),
    "absurd header": (struct.pack("<Q", 2**64 - 1) + b"{}", "over 100000000"),
    "not utf8": (_file(None, raw=b"\xff\xfe  "), "not UTF-8"),
    "not json": (_file(None, raw=b"{nope}  "), "not JSON"),
    "nan": (_file(None, raw=b'{"a":NaN}'), "not JSON"),
    "not object": (_file([1, 2]), "not a JSON object"),
    "entry not object": (_file({"x": 3}), "not a JSON object"),
    "missing field": (_file({"x": {"dtype": "U8", "shape": [1]}}, b"a"), "no 'data_offsets'"),
    "unknown dtype": (_file(_one(dtype="C128"), b"ab"), "unknown dtype"),
    "negative shape": (_file(_one(shape=(-2,)), b"ab"), "non-negative"),
    "float shape": (_file(_one(shape=(2.0,)), b"ab"), "non-negative"),
    "bool shape": (_file(_one(shape=(True, 2)), b"ab"), "non-negative"),
    "huge shape": (_file(_one(shape=(2**64,)), b"ab"), "below 2\\*\\*64"),
    "overflow": (_file(_one(shape=(2**40, 2**40, 0), offsets=(0, 0))), r"2\*\*63 - 1"),
    "bytes overflow": (_file(_one(dtype="U64", shape=(2**62,), offsets=(0, 0))), "overflows"),
    "size mismatch": (_file(_one(offsets=(0, 1)), b"a"), "needs 2"),
    "reversed": (_file(_one(offsets=(2, 0)), b"ab"), "reversed"),
    "out of range": (_file(_one(offsets=(0, 2)), b"a"), "cover the file"),
    "gap": (_file(_one(offsets=(1, 3)), b"abc"), "a gap"),
    "trailing": (_file(_one(), b"abc"), "cover the file"),
    "three offsets": (_file(_one(offsets=(0, 1, 2)), b"ab"), "two non-negative"),
    "metadata not str": (_file({"__metadata__": {"a": 1}}), "map str to str"),
    "duplicate": (
        _file(
            None,
            raw=b'{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
            b'"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
        )
        + b"a",
        "names a key twice",
    ),
    "overlap": (
        _file(
            {
                "x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "y": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
            },
            b"abc",
        ),
        "overlaps",
    ),
    "too many dims": (_file(_one(shape=(1,) * 65, offsets=(0, 1)), b"a"), "at most 64"),
    "deep nesting": (_file(None, raw=b"[" * 100000), "not JSON"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_files_are_value_errors(case, tmp_path):
    """Each malformed header or layout is a ValueError naming the file (and tensor, where one is
    at fault), from both load() and load_file()."""
    data, match = HOSTILE[case]
    with pytest.raises(ValueError, match=match):
        tst.load(data)
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=match) as info:
        tst.load_file(path)
    assert str(path) in str(info.value)


def test_hostile_errors_name_the_tensor():
    """A tensor-level fault names the tensor."""
    with pytest.raises(ValueError, match="tensor 'x'"):
        tst.load(_file(_one(offsets=(0, 1)), b"a"))


def test_package_refuses_what_we_refuse():
    """The safetensors package also refuses gaps, trailing bytes and offset mismatches."""
    safetensors = pytest.importorskip("safetensors")
    for case in ("gap", "trailing", "size mismatch", "reversed", "overlap", "out of range"):
        with pytest.raises(Exception, match=r"offset|covered|invalid"):
            safetensors.deserialize(HOSTILE[case][0])


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_entries = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([*FORMAT_DTYPES, "F6_E3M2", "X"]) | _json_values,
        "shape": st.lists(st.integers(-2, 5), max_size=3) | _json_values,
        "data_offsets": st.lists(st.integers(-1, 40), min_size=2, max_size=2) | _json_values,
    }
)


@settings(max_examples=200, deadline=None)
@given(
    header=st.dictionaries(st.text(max_size=4), _entries | _json_values, max_size=4),
    data=st.binary(max_size=40),
    extra=st.integers(-3, 3),
)
def test_fuzzed_headers_load_or_raise_value_error(header, data, extra):
    """Any JSON header over any data either loads or raises ValueError, and what loads stays in
    bounds (every tensor's bytes lie in the data)."""
    text = json.dumps(header).encode()
    blob = struct.pack("<Q", max(len(text) + extra, 0)) + text + data
    try:
        out = tst.load(blob)
    except ValueError:
        return
    for t in out.values():
        assert t.numel() * t.itemsize <= len(data)
        _raw_bytes(t)  # reads every byte: in bounds or the test process would fault
