"""``tensorbridge.safetensors.load_file`` and ``tb.load_npy`` next to the safetensors package and
``np.load(mmap_mode="r")``.

The safetensors file holds 1,000 float32 tensors sharing the size under test (1 GiB: 1,000 x
1 MiB); the size column shows the size of one tensor, so that the harness times every call (it
refuses to time a call that takes over 20 ms at a large size). ``--quick`` uses a 1 MiB file.
The files are sparse (``truncate``): no disk and no page cache. ``framework="numpy"`` copies every
tensor, so it costs time in proportion to the file.

Resident memory growth: ``python -m benchmarks.bench_safetensors --rss [SIZE]`` loads a
1,000-tensor file with each loader in a fresh process and prints how much the resident set grew.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

if __package__:
    from ._harness import BIG, Case, Context, GiB, MiB, parse_size, script_main
else:  # run as a file: python benchmarks/bench_safetensors.py
    from _harness import BIG, Case, Context, GiB, MiB, parse_size, script_main

TENSORS = 1000


def write_safetensors(path: str, size: int, count: int = TENSORS) -> str:
    """A sparse safetensors file of ``count`` float32 tensors of ``size // count`` bytes each."""
    each = max(4, size // count // 4 * 4)
    header = {
        f"layer{i:04d}": {
            "dtype": "F32",
            "shape": [each // 4],
            "data_offsets": [i * each, (i + 1) * each],
        }
        for i in range(count)
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + count * each)
    return path


def write_npy(path: str, size: int) -> str:
    """A sparse ``.npy`` file of ``size // 4`` float32 zeros, its header as numpy.save writes it."""
    shape = (size // 4,)
    head = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape!r}, }}"
    head += " " * (21 - len(repr(shape[0])))
    pad = 64 - ((10 + len(head) + 1) % 64)
    raw = (
        b"\x93NUMPY\x01\x00"
        + struct.pack("<H", len(head) + 1 + pad)
        + head.encode()
        + b" " * pad
        + b"\n"
    )
    with open(path, "wb") as f:
        f.write(raw)
        f.truncate(len(raw) + shape[0] * 4)
    return path


def _safetensors_module(name: str) -> object | None:
    try:
        return __import__(f"safetensors.{name}", fromlist=["load_file"])
    except ImportError:
        return None


def cases(ctx: Context) -> Iterator[Case]:
    """load_file of 1,000 tensors, and one .npy file, at each size (1 MiB when quick)."""
    from tensorbridge import safetensors as tst

    quick = ctx.settings.budget < 0.1
    sizes = sorted({min(s, MiB) if quick else max(s, TENSORS * 4) for s in ctx.sizes()})
    st_pt, st_np = _safetensors_module("torch"), _safetensors_module("numpy")
    for size in sizes:
        path = write_safetensors(str(Path(ctx.tmpdir, f"bench-{size}.safetensors")), size)
        yield from ctx.case(
            f"load_file x{TENSORS}",
            size // TENSORS,
            ctx.call("tst.load_file({x})", "path", x=path, tst=tst),
            ctx.call("st.load_file({x})", "path", shown="safetensors pt", x=path, st=st_pt),
            ctx.call(
                "st.load_file({x})",
                "path",
                shown="safetensors numpy",
                x=path,
                st=st_np if size < BIG or not quick else None,
            ),
        )
        npy = write_npy(str(Path(ctx.tmpdir, f"bench-{size}.npy")), size)
        yield from ctx.case(
            "load_npy",
            size,
            ctx.call("tb.load_npy({x})", "path", x=npy),
            ctx.call("np.load({x}, mmap_mode='r')", "path", needs=("numpy",), x=npy),
        )


_RSS_CHILD = """
import importlib, mmap, sys
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE
which, path = sys.argv[1], sys.argv[2]
if which == 'tensorbridge':
    load = importlib.import_module('tensorbridge.safetensors').load_file
elif which == 'npy':
    load = importlib.import_module('tensorbridge').load_npy
else:
    load = importlib.import_module('safetensors.' + which).load_file
before = rss()
out = load(path)
print(rss() - before)
"""


def rss_growth(size: int = GiB) -> dict[str, float]:
    """MiB the resident set grows by when each loader loads a 1,000-tensor file of ``size``
    (``"npy"``: `tb.load_npy` of one ``.npy`` file of that size), each in a fresh process."""
    import tempfile

    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        st_path = write_safetensors(str(Path(tmp, "a.safetensors")), size)
        npy_path = write_npy(str(Path(tmp, "a.npy")), size)
        for which, path in (
            ("tensorbridge", st_path),
            ("torch", st_path),
            ("numpy", st_path),
            ("npy", npy_path),
        ):
            proc = subprocess.run(
                [sys.executable, "-c", _RSS_CHILD, which, path],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode == 0:
                results[which] = int(proc.stdout.split()[-1]) / MiB
    return results


if __name__ == "__main__":
    if "--rss" in sys.argv:
        args = [a for a in sys.argv[1:] if a != "--rss"]
        growth = rss_growth(parse_size(args[0]) if args else GiB)
        for name, mib in growth.items():
            print(f"{name:>14}: resident memory grew by {mib:.1f} MiB")
        sys.exit(0)
    sys.exit(script_main(__name__))
