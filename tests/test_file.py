"""from_file: PyTorch 2.13's semantics plus os.PathLike names, ``offset=``, a true
read-only mapping (``mode="r"``), byte counts in errors, O(1) mapping of huge sparse files, and the
mapping held open while any view lives.
"""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import re
import struct
import sys
import weakref

import pytest

import tensorbridge as tb

VALUES = [1.5, -2.0, 3.25, 4.0, 5.5, -6.0, 7.0, 8.0, 9.5, 10.0]


@pytest.fixture
def data_file(tmp_path):
    """A file holding VALUES as float32."""
    path = tmp_path / "values.f32"
    path.write_bytes(struct.pack(f"={len(VALUES)}f", *VALUES))
    return path


def test_reads_elements(data_file):
    """size counts elements; float32 by default; the values are the file's."""
    t = tb.from_file(str(data_file), size=4)
    assert t.dtype is tb.float32
    assert tuple(t.shape) == (4,)
    assert t.tolist() == VALUES[:4]


@pytest.mark.parametrize(
    "convert", [str, os.fsencode, lambda p: p], ids=["str", "bytes", "pathlike"]
)
def test_file_names(data_file, convert):
    """str, bytes and os.PathLike names all work (PyTorch refuses PathLike)."""
    assert tb.from_file(convert(data_file), size=2).tolist() == VALUES[:2]


def test_dtype_and_positional_shared(data_file):
    """dtype is keyword-only; shared and size may be positional, as in PyTorch."""
    t = tb.from_file(data_file, False, 3, dtype=tb.int32)
    assert t.tolist() == list(struct.unpack("=3i", data_file.read_bytes()[:12]))


@pytest.mark.parametrize("offset", [0, 4, 1, 6, 4096 + 8])
def test_offset_in_bytes(tmp_path, offset):
    """offset skips bytes, aligned or not, including past the first page."""
    path = tmp_path / "big.bin"
    raw = bytes(i % 256 for i in range(8192 + 64))
    path.write_bytes(raw)
    t = tb.from_file(path, size=5, dtype=tb.int16, offset=offset)
    assert t.tolist() == list(struct.unpack("=5h", raw[offset : offset + 10]))


def test_size_zero_is_empty_and_touches_nothing(tmp_path):
    """size=0 gives an empty tensor without opening (or creating) the file, as in PyTorch."""
    path = tmp_path / "missing.bin"
    for shared in (None, False, True):
        t = tb.from_file(path, shared=shared, size=0)
        assert tuple(t.shape) == (0,)
        assert t.dtype is tb.float32
    assert not path.exists()
    assert tb.from_file(path, size=0, mode="r").is_readonly


def test_private_mapping_is_copy_on_write(data_file):
    """shared=False/None: writes are seen by the tensor but never reach the file."""
    before = data_file.read_bytes()
    for shared in (None, False):
        t = tb.from_file(data_file, shared=shared, size=4)
        assert not t.is_readonly
        t[0] = 100.0
        assert t[0].item() == 100.0
        del t
        gc.collect()
    assert data_file.read_bytes() == before


def test_shared_mapping_writes_reach_the_file(data_file):
    """shared=True: writes reach the file."""
    t = tb.from_file(data_file, shared=True, size=4)
    t[1] = 42.0
    assert struct.unpack_from("=f", data_file.read_bytes(), 4)[0] == 42.0


def test_shared_mapping_creates_and_grows(tmp_path):
    """shared=True creates a missing file and grows a short one to offset + size * itemsize."""
    path = tmp_path / "new.bin"
    t = tb.from_file(path, shared=True, size=3)
    assert path.stat().st_size == 12
    assert t.tolist() == [0.0, 0.0, 0.0]
    short = tmp_path / "short.bin"
    short.write_bytes(b"\x01" * 40)
    grown = tb.from_file(short, shared=True, size=12, offset=2)
    assert short.stat().st_size == 50
    assert grown.numel() == 12


def test_readonly_mode(data_file):
    """mode='r' gives a read-only tensor: every write raises, the file is unchanged."""
    before = data_file.read_bytes()
    t = tb.from_file(data_file, size=4, mode="r")
    assert t.is_readonly
    assert t.tolist() == VALUES[:4]
    source = t[:3].clone()
    for write in (lambda: t.__setitem__(0, 1.0), lambda: t.fill_(0), lambda: t[1:].copy_(source)):
        with pytest.raises(ValueError, match="read-only"):
            write()
    assert t.as_memoryview().readonly
    assert data_file.read_bytes() == before


def test_readonly_mode_maps_prot_read(data_file, subprocess_run):
    """mode='r' maps with PROT_READ: even a raw write through the pointer faults (in a child)."""
    if sys.platform == "win32":
        pytest.skip("POSIX signals")
    result = subprocess_run(f"""
        import ctypes
        import tensorbridge as tb
        t = tb.from_file({str(data_file)!r}, size=4, mode="r")
        print("mapped", flush=True)
        ctypes.memset(t.data_ptr(), 0, 4)
        print("wrote", flush=True)
    """)
    assert result.stdout.split() == ["mapped"]
    assert result.returncode != 0


def test_readonly_mode_on_a_readonly_file(data_file):
    """mode='r' works on a file without write permission."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root ignores file permissions")
    data_file.chmod(0o444)
    assert tb.from_file(data_file, size=2, mode="r").tolist() == VALUES[:2]


def test_missing_file(tmp_path):
    """A missing file is PyTorch's RuntimeError ("read-only mode": private or read-only maps)."""
    path = tmp_path / "missing.bin"
    for kwargs in ({}, {"shared": False}, {"mode": "r"}, {"mode": "r", "shared": True}):
        with pytest.raises(
            RuntimeError,
            match=re.escape(
                f"unable to open file <{path}> in read-only mode: No such file or directory (2)"
            ),
        ):
            tb.from_file(path, size=2, **kwargs)
    assert not path.exists()


def test_short_file(data_file):
    """A file shorter than the mapping is PyTorch's RuntimeError, with the byte counts given."""
    size = len(VALUES) * 4
    text = (
        f"file <{data_file}> size <{size}> is smaller than the required mapping size <{size + 4}>"
    )
    with pytest.raises(RuntimeError, match=re.escape(text)):
        tb.from_file(data_file, size=len(VALUES) + 1)
    pattern = r"required mapping size <42> \(offset 2 bytes \+ 40 bytes"
    with pytest.raises(RuntimeError, match=pattern):
        tb.from_file(data_file, size=len(VALUES), offset=2, mode="r")


def test_negative_size(data_file):
    """size=-1 is PyTorch's RuntimeError text, with the reason added."""
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            f"unable to mmap -4 bytes from file <{data_file}>: Cannot allocate memory (12)"
        ),
    ):
        tb.from_file(data_file, size=-1)


def test_directory(tmp_path):
    """A directory cannot be mapped (private) or opened read-write (shared)."""
    with pytest.raises(RuntimeError, match="unable to mmap 8 bytes from file"):
        tb.from_file(tmp_path, size=2)
    text = f"unable to open file <{tmp_path}> in read-write mode"
    with pytest.raises(RuntimeError, match=re.escape(text)):
        tb.from_file(tmp_path, shared=True, size=2)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"filename": 3}, TypeError, "argument 'filename'"),
        (
            {"shared": "yes"},
            TypeError,
            re.escape("argument 'shared' (position 2) must be bool, not str"),
        ),
        (
            {"shared": 1},
            TypeError,
            re.escape("argument 'shared' (position 2) must be bool, not int"),
        ),
        (
            {"size": 2.0},
            TypeError,
            re.escape("from_file(): argument 'size' must be int, not float"),
        ),
        ({"offset": 1.5}, TypeError, "argument 'offset' must be int"),
        ({"dtype": 3}, TypeError, "argument 'dtype'"),
        ({"requires_grad": None}, TypeError, "argument 'requires_grad' must be bool"),
        ({"mode": "w"}, ValueError, "mode must be None"),
        ({"offset": -1}, ValueError, "offset must be a non-negative"),
        (
            {"dtype": tb.int32, "requires_grad": True},
            RuntimeError,
            "Only Tensors of floating point and complex dtype can require gradients",
        ),
    ],
)
def test_argument_errors(data_file, kwargs, error, pattern):
    """Wrong types are TypeErrors, bad values ValueErrors, integer gradients a RuntimeError."""
    kwargs = {"filename": data_file, "size": 2, **kwargs}
    with pytest.raises(error, match=pattern):
        tb.from_file(**kwargs)


def test_requires_grad(data_file):
    """requires_grad is carried for floating dtypes."""
    assert tb.from_file(data_file, size=2, requires_grad=True).requires_grad


def test_messages_match_torch(data_file, tmp_path):
    """torch.from_file's messages are substrings of ours: missing file, short file, size=-1."""
    torch = pytest.importorskip("torch")
    cases = [
        (str(tmp_path / "missing.bin"), {"size": 2}),
        (str(data_file), {"size": 11}),
        (str(data_file), {"size": -1}),
    ]
    for name, kwargs in cases:
        with pytest.raises(RuntimeError) as theirs:
            torch.from_file(name, **kwargs)
        with pytest.raises(RuntimeError) as ours:
            tb.from_file(name, **kwargs)
        assert str(theirs.value) in str(ours.value)


def test_mapping_stays_open_while_a_view_lives(data_file):
    """The mmap cannot be closed while any view lives, and is unmapped once the last one dies."""
    t = tb.from_file(data_file, size=4)
    mapping = t._storage.owner.obj
    assert isinstance(mapping, mmap.mmap)
    gone = weakref.ref(mapping)
    view = t[2:]
    del t
    gc.collect()
    with pytest.raises(BufferError):
        mapping.close()
    del mapping
    assert view.tolist() == VALUES[2:4]
    del view
    gc.collect()
    assert gone() is None


def test_sparse_4gib_file_maps_without_reading(tmp_path):
    """A 4 GiB sparse file maps at once; reading its last element touches only that page."""
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate(4 << 30)
    n = (4 << 30) // 4
    for kwargs in ({}, {"shared": True}, {"mode": "r"}):
        t = tb.from_file(path, size=n, **kwargs)
        assert t.numel() == n
        assert t[-1].item() == 0.0
    t = tb.from_file(path, size=n, shared=True)
    t[n - 1] = 1.0
    with open(path, "rb") as f:
        f.seek((4 << 30) - 4)
        assert struct.unpack("=f", f.read(4))[0] == 1.0


def test_pickle_copies_the_values(data_file):
    """Pickling a file-backed tensor carries its values, not the mapping."""
    t = tb.from_file(data_file, size=3, mode="r")
    u = pickle.loads(pickle.dumps(t))
    assert u.tolist() == VALUES[:3]
    assert u.is_readonly
