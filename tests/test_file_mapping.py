"""The file-mapping rules `from_file` and the safetensors/``.npy`` loaders share: which files may be
mapped, how a bad name or an impossible size fails, and how long a map (and its descriptor) lives.
Each rule is checked through both doors: `from_file` words failures as PyTorch does
(``RuntimeError``), the loaders as the OS error (``OSError``).
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import re
import struct
import weakref

import pytest

import tensorbridge as tb
from tensorbridge import safetensors as tst

np = pytest.importorskip("numpy")

VALUES = [3, -1, 4, 1, -5, 9]


@pytest.fixture
def files(tmp_path):
    """The same int32 values as a raw file, a safetensors file and an .npy file."""
    raw = tmp_path / "values.bin"
    raw.write_bytes(struct.pack(f"={len(VALUES)}i", *VALUES))
    st = tmp_path / "values.safetensors"
    tst.save_file({"x": tb.tensor(VALUES, dtype=tb.int32)}, st)
    npy = tmp_path / "values.npy"
    np.save(npy, np.array(VALUES, dtype=np.int32))
    return {"raw": raw, "safetensors": st, "npy": npy}


# Each door, in each of its mapping modes: (name, file kind, loader of a tensor from a path).
DOORS = [
    ("from_file", "raw", lambda p: tb.from_file(p, size=len(VALUES), dtype=tb.int32)),
    ("from_file shared", "raw", lambda p: tb.from_file(p, True, len(VALUES), dtype=tb.int32)),
    ("from_file r", "raw", lambda p: tb.from_file(p, size=len(VALUES), dtype=tb.int32, mode="r")),
    ("load_file r", "safetensors", lambda p: tst.load_file(p)["x"]),
    ("load_file c", "safetensors", lambda p: tst.load_file(p, mode="c")["x"]),
    ("load_file r+", "safetensors", lambda p: tst.load_file(p, mode="r+")["x"]),
    ("safe_open", "safetensors", lambda p: tst.safe_open(p).get_tensor("x")),
    ("load_npy r", "npy", lambda p: tb.load_npy(p)),
    ("load_npy c", "npy", lambda p: tb.load_npy(p, mode="c")),
    ("load_npy r+", "npy", lambda p: tb.load_npy(p, mode="r+")),
]


def _maps_of(path) -> tuple[int, int]:
    """How many of this process's memory maps, and open descriptors, refer to ``path``."""
    target = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        maps = sum(line.rstrip("\n").endswith(" " + target) for line in f)
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself used, closed since
            fds += os.readlink(f"/proc/self/fd/{fd}") == target
    return maps, fds


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
@pytest.mark.parametrize(("door", "kind", "load"), DOORS, ids=[d[0] for d in DOORS])
def test_map_lives_while_an_exported_view_does_then_closes(files, door, kind, load):
    """The map (and its descriptor) outlive the tensor while a NumPy view of it lives, and are
    unmapped and closed once that view dies too."""
    path = files[kind]
    t = load(path)
    gone = weakref.ref(t._storage.owner.obj)
    assert _maps_of(path) == (1, 1)  # one map, one descriptor (the map's own)
    exported = t[1:].numpy()
    del t
    gc.collect()
    assert gone() is not None
    assert _maps_of(path) == (1, 1)
    assert exported.tolist() == VALUES[1:]
    del exported
    gc.collect()
    assert gone() is None
    assert _maps_of(path) == (0, 0)


def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path, subprocess_run):
    """A FIFO is not a regular file: every door refuses it at once instead of blocking in open()
    until a writer comes (in a child, so a hang fails the test by its timeout)."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("POSIX FIFOs")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = subprocess_run(
        f"""
        import tensorbridge as tb
        from tensorbridge import safetensors as tst
        path = {str(fifo)!r}
        calls = [
            lambda: tb.from_file(path, size=2),
            lambda: tb.from_file(path, shared=True, size=2),
            lambda: tb.from_file(path, size=2, mode="r"),
            lambda: tst.load_file(path),
            lambda: tst.load_file(path, mode="r+"),
            lambda: tb.load_npy(path, mode="c"),
        ]
        for call in calls:
            try:
                call()
            except (RuntimeError, OSError) as exc:
                print(type(exc).__name__, exc)
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 6, result.stdout
    for line in lines[:3]:
        assert line == (
            f"RuntimeError from_file(): unable to mmap 8 bytes from file <{fifo}>: not a regular "
            f"file; got a FIFO. Pass the path of a regular file."
        )
    for line, api in zip(lines[3:], ["load_file", "load_file", "load_npy"]):
        assert line.startswith("OSError ") and line.endswith(
            f"{api}(): cannot map file <{fifo}>: not a regular file; got a FIFO. Pass the path "
            f"of a regular file."
        )


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_character_device_is_refused_by_every_door():
    """/dev/zero (length 0, yet mappable) is not a regular file: refused before any size check or
    attempt to grow it, by both doors."""
    for kwargs in ({}, {"shared": True}, {"mode": "r"}):
        with pytest.raises(RuntimeError) as info:
            tb.from_file("/dev/zero", size=2, **kwargs)
        assert str(info.value) == (
            "from_file(): unable to mmap 8 bytes from file </dev/zero>: not a regular file; got "
            "a character device. Pass the path of a regular file."
        )
    for load, api in [(tst.load_file, "load_file"), (tb.load_npy, "load_npy")]:
        for mode in ("r", "c"):
            with pytest.raises(OSError, match=re.escape(f"{api}(): cannot map file </dev/zero>")):
                load("/dev/zero", mode=mode)


def test_directory_is_refused_by_every_door(tmp_path):
    """A directory: from_file's PyTorch message (EISDIR), the loaders' IsADirectoryError."""
    with pytest.raises(RuntimeError, match=re.escape("Is a directory (21)")):
        tb.from_file(tmp_path, size=2)
    for load in (tst.load_file, tb.load_npy):
        with pytest.raises(IsADirectoryError, match="cannot map file"):
            load(tmp_path)


def test_nul_byte_in_the_name_is_refused_and_nothing_is_created(tmp_path):
    """A name with a NUL byte is a ValueError naming the API; the shorter name the OS would see
    is never opened or created (torch.from_file creates it for shared=True)."""
    name = str(tmp_path / "a") + "\0b"
    cases = [
        (lambda n: tb.from_file(n, shared=True, size=2), "from_file"),
        (lambda n: tb.from_file(n, size=2), "from_file"),
        (lambda n: tst.load_file(n, mode="r+"), "load_file"),
        (lambda n: tb.load_npy(n), "load_npy"),
        (lambda n: tst.save_file({"x": tb.zeros(1)}, n), "save_file"),
    ]
    for call, api in cases:
        for n in (name, os.fsencode(name)):
            with pytest.raises(ValueError, match=re.escape(f"{api}(): filename must not contain")):
                call(n)
    assert os.listdir(tmp_path) == []


def test_loaders_never_create_or_grow(tmp_path):
    """Only from_file(shared=True) creates a missing file; the loaders' 'r+' refuses it."""
    missing = tmp_path / "missing"
    for load in (tst.load_file, tb.load_npy):
        with pytest.raises(FileNotFoundError, match="cannot map file"):
            load(missing, mode="r+")
    assert not missing.exists()


def test_from_file_cannot_grow_past_the_largest_offset(tmp_path):
    """Growing a shared file past what an off_t holds is PyTorch's RuntimeError, and the file is
    left as it was."""
    path = tmp_path / "short.bin"
    path.write_bytes(b"12345678")
    with pytest.raises(RuntimeError) as info:
        tb.from_file(path, shared=True, size=1 << 62, dtype=tb.int32)
    assert (
        f"from_file(): unable to resize file <{path}> to the right size: File too large (27)"
        in (str(info.value))
    )
    assert path.read_bytes() == b"12345678"


def test_from_file_maps_a_window_not_the_whole_file(tmp_path):
    """from_file maps from the page holding ``offset`` to the last element, not the whole file."""
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(range(256)) * 64)  # 16 KiB
    offset = 8192 + 3
    t = tb.from_file(path, size=4, dtype=tb.uint8, offset=offset)
    assert t.tolist() == [3, 4, 5, 6]
    start = offset - offset % mmap.ALLOCATIONGRANULARITY  # where an mmap may start
    assert len(t._storage.owner.obj) == offset + 4 - start


@pytest.mark.skipif(not hasattr(os, "pipe"), reason="needs os.pipe")
def test_npy_file_object_over_a_pipe_is_refused():
    """An open file object over a pipe has a descriptor but is no regular file: load_npy's
    mapping modes refuse it naming the API, as for a FIFO path."""
    r, w = os.pipe()
    os.write(w, b"\x93NUMPY")
    os.close(w)
    with os.fdopen(r, "rb") as f:
        with pytest.raises(OSError, match=re.escape("load_npy(): cannot map file <")) as info:
            tb.load_npy(f, mode="r")
        assert "not a regular file; got a FIFO" in str(info.value)
