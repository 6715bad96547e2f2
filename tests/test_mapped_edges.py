"""The edges of mapped and in-memory loading: one buffer export from check to use, bytes-like data
only, sizes within int64, and what a map promises when its file is truncated (SIGBUS, shown in a
child process) next to the copying loads that survive it.
"""

from __future__ import annotations

import array
import ctypes
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import warnings

import pytest

import tensorbridge as tb
from tensorbridge import safetensors as tst

np = pytest.importorskip("numpy")

# A safetensors file of one 65,536-byte tensor whose header ends at byte 72: shrinking the buffer to
# 72 bytes leaves a valid-looking header over no data at all.
_TEXT = json.dumps(
    {"x": {"dtype": "U8", "shape": [65536], "data_offsets": [0, 65536]}}, separators=(",", ":")
).encode()
_TEXT += b" " * (64 - len(_TEXT))
HEADER_END = 8 + len(_TEXT)
BLOB = struct.pack("<Q", len(_TEXT)) + _TEXT + bytes(i % 251 for i in range(65536))
assert HEADER_END == 72


def _address(buffer) -> int:
    """Address of byte 0 of a writable buffer (the export dies with the statement)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def _load_shrinking(make, shrink, after: int):
    """``load(data)`` under a profile hook that, from the ``after``-th event on, tries to shrink
    ``data`` to its header at every event until it succeeds (it fails while an export is held).
    Returns (data, tensors or None for a ValueError, events seen, whether the shrink happened)."""
    data = make()
    state = {"events": 0, "shrunk": False}

    def hook(frame, event, arg):
        state["events"] += 1
        if not state["shrunk"] and state["events"] > after:
            try:
                shrink(data)
            except BufferError:
                return  # an export is held: try again at the next event
            state["shrunk"] = True

    sys.setprofile(hook)
    try:
        out = tst.load(data)
    except ValueError:
        out = None
    finally:
        sys.setprofile(None)
    return data, out, state["events"], state["shrunk"]


def _shrink_bytearray(data):
    del data[HEADER_END:]


def _shrink_mmap(data):
    data.resize(HEADER_END)


def _make_mmap():
    m = mmap.mmap(-1, len(BLOB))
    m[:] = BLOB
    return m


SHRINKERS = {
    "bytearray": (lambda: bytearray(BLOB), _shrink_bytearray),
    "mmap": (_make_mmap, _shrink_mmap),
}


@pytest.mark.parametrize("kind", sorted(SHRINKERS))
def test_load_checks_and_views_one_export_while_the_buffer_shrinks(kind):
    """Whatever step of load() a shrink of the buffer lands on, load() either refuses the file
    (the shrink came first) or returns tensors inside the buffer it now has, with the right
    values; and while the tensors live the buffer cannot be resized (the export is held)."""
    make, shrink = SHRINKERS[kind]
    *_, total, _ = _load_shrinking(make, shrink, after=1 << 30)  # how many events a load makes
    assert total > 10
    loaded = refused = 0
    for after in range(total + 1):
        data, out, _, shrunk = _load_shrinking(make, shrink, after)
        if out is None:
            assert shrunk and len(data) == HEADER_END, after
            refused += 1
            continue
        assert not shrunk, f"event {after}: the buffer shrank under the tensors"
        start = _address(data)
        t = out["x"]
        assert start <= t.data_ptr() and t.data_ptr() + t.nbytes <= start + len(data), after
        assert bytes(t.numpy()) == BLOB[HEADER_END:], after
        with pytest.raises(BufferError):
            shrink(data)
        del out, t
        shrink(data)  # the export is released with the last tensor
        loaded += 1
    assert loaded and refused  # both outcomes were reached


# Buffers load() takes (bytes-like: C-contiguous, 1-d, single bytes), and whether the tensors are
# writable views of them.
BYTES_LIKE = {
    "bytes": (lambda b: b, False),
    "bytearray": (bytearray, True),
    "memoryview": (memoryview, False),
    "memoryview cast b": (lambda b: memoryview(bytearray(b)).cast("b"), True),
    "array B": (lambda b: array.array("B", b), True),
    "array b": (lambda b: array.array("b", b), True),
    "numpy uint8": (lambda b: np.frombuffer(bytearray(b), np.uint8), True),
    "numpy int8 readonly": (lambda b: np.frombuffer(b, np.int8), False),
    "ctypes c_char": (lambda b: (ctypes.c_char * len(b)).from_buffer_copy(b), True),
    "ctypes c_ubyte": (lambda b: (ctypes.c_ubyte * len(b)).from_buffer_copy(b), True),
    "mmap": (lambda b: _mmap_of(b), True),
}


def _mmap_of(b: bytes) -> mmap.mmap:
    m = mmap.mmap(-1, len(b))
    m[:] = b
    return m


@pytest.mark.parametrize("kind", sorted(BYTES_LIKE))
def test_load_takes_bytes_like_buffers(kind):
    """Every C-contiguous 1-d buffer of single bytes loads as views of its memory."""
    make, writable = BYTES_LIKE[kind]
    data = make(tst.save({"x": tb.arange(6, dtype=tb.int16)}))
    t = tst.load(data)["x"]
    assert t.tolist() == list(range(6))
    assert t.is_readonly is not writable


# Buffers that are not bytes-like: (maker, what the message names). The four contiguous ones load
# through the fix the message gives, memoryview(x).cast("B").
NOT_BYTES = {
    "array f": (lambda b: array.array("f", b), "format 'f'"),
    "memoryview cast i": (lambda b: memoryview(b).cast("i"), "format 'i'"),
    "numpy (n, 1) uint8": (lambda b: np.frombuffer(b, np.uint8).reshape(-1, 1), "2-d"),
    "numpy float32": (lambda b: np.frombuffer(b, np.float32), "format 'f'"),
    "numpy 0-d uint8": (lambda b: np.array(b[0], np.uint8), "0-d"),
    "strided memoryview": (lambda b: memoryview(b + b)[::2], "C-contiguous"),
}


@pytest.mark.parametrize("kind", sorted(NOT_BYTES))
def test_load_refuses_buffers_that_are_not_bytes(kind):
    """A buffer of other items, of more or fewer dimensions, or strided is a TypeError naming
    load(), what it got and the fix, never a struct.error or a reinterpretation; the package's
    load() refuses all of them too (it takes bytes)."""
    make, named = NOT_BYTES[kind]
    blob = tst.save({"x": tb.arange(6, dtype=tb.int16)})
    data = make(blob)
    with pytest.raises(TypeError, match=r"load\(\): data must be bytes-like") as info:
        tst.load(data)
    text = str(info.value)
    assert named in text and type(data).__name__ in text and "bytes(data)" in text
    if kind not in ("numpy 0-d uint8", "strided memoryview"):
        assert tst.load(memoryview(data).cast("B"))["x"].tolist() == list(range(6))
    pytest.importorskip("safetensors")
    pytest.importorskip("torch")
    from safetensors.torch import load

    with pytest.raises(TypeError, match="not an instance of 'bytes'"):
        load(data)


def test_load_refuses_non_buffers():
    """An object without a buffer is the TypeError it always was."""
    for data in (3, "text", [1, 2]):
        with pytest.raises(TypeError, match=r"load\(\): data must be bytes or another object"):
            tst.load(data)


# Headers the safetensors package refuses and tensorbridge must too: lone surrogates (JSON escapes
# Python decodes but serde_json does not), in a key, a metadata key or value, and a reversed pair.
def _surrogate_file(raw: bytes) -> bytes:
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


SURROGATES = {
    "key high": b'{"\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    "key low": b'{"\\udc00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    "key reversed pair": b'{"a\\ude00\\ud83d":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    "metadata key": b'{"__metadata__":{"\\ud800":"v"},'
    b'"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    "metadata value": b'{"__metadata__":{"k":"\\udfff"},'
    b'"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    "dtype value": b'{"x":{"dtype":"U8\\ud800","shape":[1],"data_offsets":[0,1]}}',
}


@pytest.mark.parametrize("case", sorted(SURROGATES))
def test_lone_surrogates_are_refused_as_the_package_refuses_them(case, tmp_path):
    """A header string escaping a lone surrogate is a ValueError saying so, from load(),
    load_file() and safe_open(); safetensors.deserialize and safe_open refuse the same bytes."""
    data = _surrogate_file(SURROGATES[case]) + b"a"
    path = tmp_path / "s.safetensors"
    path.write_bytes(data)
    for door in (tst.load, lambda _: tst.load_file(path), lambda _: tst.safe_open(path)):
        with pytest.raises(ValueError, match="lone UTF-16 surrogate"):
            door(data)
    safetensors = pytest.importorskip("safetensors")
    with pytest.raises(Exception, match="invalid JSON"):
        safetensors.deserialize(data)
    with pytest.raises(Exception, match="invalid JSON"):
        safetensors.safe_open(str(path), "np")


def test_escaped_surrogate_pairs_still_load():
    """A correctly escaped pair (an astral character) is a valid name, as in the package."""
    raw = b'{"\\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    assert list(tst.load(_surrogate_file(raw) + b"a")) == ["\U0001f600"]


def _st(shape: list[int], offsets: list[int], dtype: str = "U8") -> bytes:
    text = json.dumps({"x": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}).encode()
    return struct.pack("<Q", len(text)) + text


# Sizes past int64 in a safetensors header: (file, what the message says).
ST_SIZES = {
    "size 2**64-1 beside 0": (_st([0, 2**64 - 1], [0, 0]), r"2\*\*63 - 1"),
    "size 2**63 beside 0": (_st([0, 2**63], [0, 0]), r"2\*\*63 - 1"),
    "size 2**63": (_st([2**63], [0, 0]), r"2\*\*63 - 1"),
    "count 2**64": (_st([2**32, 2**32], [0, 0]), r"2\*\*63 - 1"),
    "count 2**63 beside 0": (_st([2**31, 0, 2**32], [0, 0]), r"2\*\*63 - 1"),
    "offset 2**63": (_st([0], [0, 2**63]), "fit int64"),
    "offsets 2**64-1": (_st([0], [2**64 - 1, 2**64 - 1]), "fit int64"),
}

# PyTorch makes a tensor of these (its numel is 0); the one rule (check_sizes, as NumPy's) leaves
# zeros out of the count, so tensorbridge refuses them.
PACKAGE_TAKES = {"count 2**63 beside 0"}


@pytest.mark.parametrize("case", sorted(ST_SIZES))
def test_safetensors_sizes_past_int64_are_refused(case, tmp_path):
    """A header size, element count (zeros aside) or offset past int64 is a ValueError naming the
    file and the tensor, from load() and load_file(); the package (with PyTorch) refuses it."""
    data, match = ST_SIZES[case]
    with pytest.raises(ValueError, match=match) as info:
        tst.load(data)
    assert "tensor 'x'" in str(info.value)
    path = tmp_path / "big.safetensors"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=match) as info:
        tst.load_file(path)
    assert str(path) in str(info.value)
    if case in PACKAGE_TAKES:
        return
    safetensors = pytest.importorskip("safetensors")
    pytest.importorskip("torch")
    from safetensors.torch import load

    # The package refuses a bad offset or count itself, and PyTorch a size it cannot unpack.
    with pytest.raises((safetensors.SafetensorError, TypeError)):
        load(data)


def _npy(shape: tuple[int, ...], descr: str = "|u1") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode() + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


NPY_SIZES = {
    "size 2**70 beside 0": _npy((0, 2**70)),
    "size 2**63 beside 0": _npy((0, 2**63)),
    "size 2**63": _npy((2**63,)),
    "count 2**64": _npy((2**32, 2**32)),
    "count 2**64 beside 0": _npy((2**32, 0, 2**32), "<f8"),
}


@pytest.mark.parametrize("case", sorted(NPY_SIZES))
def test_npy_sizes_past_int64_are_refused(case, tmp_path):
    """An .npy shape past int64 is a ValueError naming the file, mapped or read; np.load refuses
    it too."""
    path = tmp_path / "big.npy"
    path.write_bytes(NPY_SIZES[case])
    for mode in ("r", "c", None):
        with pytest.raises(ValueError, match=r"2\*\*63 - 1") as info:
            tb.load_npy(path, mode=mode)
        assert str(path) in str(info.value)
    with warnings.catch_warnings():  # NumPy warns on the way to some of its refusals
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises((ValueError, OverflowError)):
            np.load(path)


def _write_files(directory) -> dict[str, str]:
    """One int64 tensor (two pages of it) as a safetensors, an .npy and a raw file."""
    directory.mkdir(exist_ok=True)
    values = tb.arange(1024, dtype=tb.int64)
    st = directory / "t.safetensors"
    tst.save_file({"x": values}, st)
    npy = directory / "t.npy"
    tb.save_npy(npy, values)
    raw = directory / "t.bin"
    raw.write_bytes(bytes(values.as_memoryview().cast("B")))
    return {"safetensors": str(st), "npy": str(npy), "raw": str(raw)}


@pytest.fixture
def files(tmp_path):
    return _write_files(tmp_path / "files")


MAPPED = {
    "load_file": "tst.load_file(paths['safetensors'])['x']",
    "safe_open": "tst.safe_open(paths['safetensors']).get_tensor('x')",
    "from_file": "tb.from_file(paths['raw'], size=1024, dtype=tb.int64, mode='r')",
    "load_npy": "tb.load_npy(paths['npy'])",
}
COPIED = {
    "load_file": "tst.load_file(paths['safetensors'], copy=True)['x']",
    "load_file c": "tst.load_file(paths['safetensors'], mode='c', copy=True)['x']",
    "safe_open": "tst.safe_open(paths['safetensors'], copy=True).get_tensor('x')",
    "from_file": "tb.from_file(paths['raw'], size=1024, dtype=tb.int64, copy=True)",
    "load_npy": "tb.load_npy(paths['npy'], mode=None)",
}
# Each child loads its tensors, truncates the files under them, then reads (no core file is
# written for the SIGBUS).
_CHILD = """
import os
import resource
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
import tensorbridge as tb
from tensorbridge import safetensors as tst
paths = {paths!r}
got = {{{loads}}}
for path in paths.values():
    os.truncate(path, 0)
for door, t in got.items():
    assert t.tolist() == list(range(1024)), door
print("survived")
"""


@pytest.mark.skipif(not hasattr(signal, "SIGBUS"), reason="needs POSIX signals")
def test_truncated_file_is_sigbus_when_mapped_and_harmless_when_copied(tmp_path):
    """What mapping promises, shown in child processes (each over files of its own): a tensor
    mapped from a file that is then truncated kills its process with SIGBUS when read, as with any
    mmap (the documented limit); every copying load (copy=True; load_npy's mode=None) reads the
    right values after the same truncation."""
    doors = {f"mapped {door}": {door: expr} for door, expr in MAPPED.items()}
    doors["copied"] = COPIED
    children = {}
    try:
        for name, loads in doors.items():
            paths = _write_files(tmp_path / name.replace(" ", "_"))
            code = _CHILD.format(
                paths=paths, loads=", ".join(f"{d!r}: {e}" for d, e in loads.items())
            )
            children[name] = subprocess.Popen(
                [sys.executable, "-c", code],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        results = {name: (proc, *proc.communicate(timeout=120)) for name, proc in children.items()}
    finally:
        for proc in children.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for name, (proc, out, err) in results.items():
        if name == "copied":
            assert proc.returncode == 0 and "survived" in out, err[-3000:]
        else:
            assert proc.returncode == -signal.SIGBUS, (name, proc.returncode, err[-2000:])
            assert "survived" not in out


def test_copy_is_private_memory_not_a_map(files):
    """copy=True reads the file: no map of it stays, the tensors do not see the file rewritten in
    place (a mapped load does), and writes (mode='c') do not reach it."""
    st, raw = files["safetensors"], files["raw"]
    mapped = tst.load_file(st)["x"]
    copied = tst.load_file(st, copy=True)["x"]
    writable = tst.load_file(st, mode="c", copy=True)["x"]
    opened = tst.safe_open(st, copy=True).get_tensor("x")
    from_raw = tb.from_file(raw, size=1024, dtype=tb.int64, copy=True)
    assert from_raw.data_ptr() % 64 == 0
    if os.path.exists("/proc/self/maps"):
        with open("/proc/self/maps") as f:
            maps = f.read()
        assert maps.count(os.path.realpath(st)) == 1  # the mapped load's alone
        assert os.path.realpath(raw) not in maps
    writable[0] = 99
    with open(st, "r+b") as f:  # rewrite the data in place, same length
        f.seek(-8192, os.SEEK_END)
        f.write(bytes(8192))
    assert mapped.tolist() == [0] * 1024
    assert copied.tolist() == opened.tolist() == from_raw.tolist() == list(range(1024))
    assert writable.tolist()[:2] == [99, 1]
    assert copied.is_readonly and not from_raw.is_readonly


def test_copy_argument_errors(files, tmp_path):
    """copy must be a bool; it cannot honour mode='r+' or shared=True (writes would have to reach
    the file); a short or missing file is refused as when mapping, and nothing is created."""
    st, raw = files["safetensors"], files["raw"]
    with pytest.raises(TypeError, match="copy must be True"):
        tst.load_file(st, copy="yes")  # type: ignore[arg-type]
    for door in (tst.load_file, tst.safe_open):
        with pytest.raises(ValueError, match="mode='r\\+'"):
            door(st, mode="r+", copy=True)
    with pytest.raises(ValueError, match="shared=True"):
        tb.from_file(raw, True, 4, copy=True)
    with pytest.raises(TypeError, match="'copy' must be bool"):
        tb.from_file(raw, size=4, copy=1)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="smaller than the required read size"):
        tb.from_file(raw, size=2000, dtype=tb.int64, copy=True)
    missing = tmp_path / "missing.bin"
    with pytest.raises(RuntimeError, match="unable to open"):
        tb.from_file(missing, size=4, copy=True)
    with pytest.raises(FileNotFoundError, match="cannot read file"):
        tst.load_file(missing, copy=True)
    with pytest.raises(IsADirectoryError, match="cannot read file"):
        tst.load_file(tmp_path, copy=True)
    assert not missing.exists()
