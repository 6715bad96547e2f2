"""The command line: ``python -m tensorbridge doctor`` and ``bench``, run in child interpreters."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tensorbridge as tb
from tensorbridge import cli
from tensorbridge.cli import files, progress, render, sides
from tensorbridge.cli.errors import Unavailable

pytestmark = pytest.mark.subprocess

_PEERS = (
    "numpy",
    "torch",
    "jax",
    "jaxlib",
    "pyarrow",
    "ml_dtypes",
    "cupy",
    "matplotlib",
    "safetensors",
    "tensorflow",
    "paddle",
    "onnxruntime",
    "mlx",
    "warp",
    "array_api_strict",
    "tvm_ffi",
    "cuda",
    "polars",
    "pandas",
    "nanoarrow",
    "xarray",
)
# A meta path finder that makes every peer unimportable, as if none were installed; as a
# sitecustomize module (`_hidden`), in the peers' own processes too.
_BLOCK_PEERS = f"""
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in {_PEERS!r}:
            raise ImportError("blocked for the test: " + name)
        return None
sys.meta_path.insert(0, _Block())
"""
_JSON_KEYS = {
    "doctor",
    "tensorbridge",
    "python",
    "implementation",
    "platform",
    "machine",
    "libraries",
    "devices",
    "matrix",
    "dtypes",
    "checks",
    "peers",
    "broken",
    "ok",
    "elapsed_s",
}
_CELL_KEYS = {
    "producer",
    "consumer",
    "device",
    "route",
    "dtype",
    "outcome",
    "proof",
    "blame",
    "reason",
    "calls",
    "notes",
    "unaligned",
}
_OUTCOMES = {"shared", "copied", "refused", "broken", "crashed", "n/a"}
# A bench run that takes a moment: one size, a tiny time budget, one repeat, one group of calls.
_TINY_BENCH = ("--sizes", "1KiB", "--budget", "0.0005", "--repeat", "1", "--only", "frombuffer")


def _run(
    *args: str, code: str = "", env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``python -m tensorbridge ARGS``, or ``python -c CODE`` followed by ``main(ARGS)``."""
    script = textwrap.dedent(code) + (
        f"\nfrom tensorbridge.cli import main\nraise SystemExit(main({list(args)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def _hidden(tmp_path) -> dict[str, str]:
    """The environment of a run (and of its child processes) with every peer unimportable."""
    (tmp_path / "sitecustomize.py").write_text(_BLOCK_PEERS)
    src = str(Path(tb.__file__).resolve().parents[1])
    paths = [str(tmp_path), src, os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(filter(None, paths))}


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One doctor run with every peer installed here: exit status, text, JSON and stderr.

    The text and the JSON come from the same run (the doctor takes seconds with PyTorch and JAX).
    """
    out = tmp_path_factory.mktemp("doctor")
    code = f"""
    import json, sys
    from tensorbridge.cli import doctor, render
    report = doctor.run(doctor.Options())
    open({str(out / "report.txt")!r}, "w").write(render.render(report))
    open({str(out / "verbose.txt")!r}, "w").write(render.render(report, verbose=True))
    json.dump(report.to_json(), open({str(out / "report.json")!r}, "w"))
    sys.exit(0 if report.ok else 1)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.stdout == "", proc.stdout[-2000:]
    text = (out / "report.txt").read_text()
    report = json.loads((out / "report.json").read_text())
    return proc.returncode, text, report, proc.stderr, (out / "verbose.txt").read_text()


@pytest.fixture
def doctor_json(full_run):
    """The full run's exit status and JSON report."""
    return full_run[0], full_run[2]


@pytest.mark.skipif(
    sys.version_info < (3, 12), reason="memoryview(t) calls Tensor.__buffer__ from Python 3.12"
)
def test_buffer_probes_take_a_refused_request_for_no_buffer():
    t = tb.zeros(4, dtype=tb.bfloat16)  # its __buffer__ refuses memoryview's format request
    assert sides.is_buffer(t) is False
    with pytest.raises(Unavailable, match="gives memoryview no buffer"):
        sides.MemoryviewSide().entry_points(t)
    assert sides.is_buffer(tb.zeros(4, dtype=tb.float32)) is True


def test_doctor_exits_zero_with_the_peers_installed(doctor_json):
    """With whatever peers are installed, the doctor finds no broken guarantee and exits 0."""
    returncode, report = doctor_json
    assert returncode == 0, report["broken"]
    assert report["ok"] is True
    assert report["broken"] == []


def test_doctor_json_has_the_documented_keys(doctor_json):
    """--json prints one object with the documented keys; cells and checks have theirs."""
    _, report = doctor_json
    assert set(report) == _JSON_KEYS
    assert report["matrix"]
    assert report["checks"]
    for cell in report["matrix"] + report["dtypes"]:
        assert set(cell) == _CELL_KEYS
        assert cell["outcome"] in _OUTCOMES
    for check in report["checks"]:
        assert set(check) == {"name", "ok", "detail"}
    assert {lib["key"] for lib in report["libraries"]} >= {"numpy", "torch", "jax"}


def test_doctor_proves_the_standard_library_cells(doctor_json):
    """Every standard-library exporter is shared with tensorbridge, proved by a write or address."""
    _, report = doctor_json
    stdlib = {"bytes", "bytearray", "memoryview", "array", "mmap", "ctypes", "shared_memory"}
    cells = [
        c for c in report["matrix"] if c["producer"] in stdlib and c["consumer"] == "tensorbridge"
    ]
    assert {c["producer"] for c in cells} == stdlib
    for cell in cells:
        assert cell["outcome"] == "shared", cell
        assert cell["proof"] == ("address" if cell["producer"] == "bytes" else "write")


def test_doctor_uses_the_installed_peers(doctor_json):
    """Installed peers are imported, report their devices, and appear in the matrix."""
    _, report = doctor_json
    used = {lib["key"]: lib for lib in report["libraries"] if lib["status"] == "used"}
    for name in ("numpy", "torch", "jax"):
        if not _installed(name):
            continue
        assert "cpu" in used[name]["devices"]
        assert any(
            c["producer"] == name and c["consumer"] == "tensorbridge" and c["outcome"] == "shared"
            for c in report["matrix"]
        )


def test_doctor_shows_jax_alignment_both_ways(doctor_json):
    """JAX cells are proved over 64-byte-aligned memory, and again over unaligned memory."""
    # XLA on CPU shares host memory only at a 64-byte boundary and copies the rest: a matrix over
    # memory wherever the allocator put it changed between identical runs.
    pytest.importorskip("jax")
    _, report = doctor_json
    cells = [c for c in report["matrix"] if c["consumer"] == "jax" and c["outcome"] != "n/a"]
    assert cells
    placeable = {
        "bytearray",
        "memoryview",
        "ctypes",
        "numpy",
    }  # any address, or placed by the doctor
    for cell in cells:
        if cell["producer"] in placeable:
            assert cell["outcome"] == "shared", cell
            assert cell["unaligned"] in {"shared", "copied"}, cell
        if cell["producer"] in {"mmap", "shared_memory", "tensorbridge"}:
            assert cell["unaligned"] is None, cell  # always aligned: nothing else to test


_FILES = {"safetensors file": "tb.safetensors.load_file", "npy file": "tb.load_npy"}


def test_doctor_proves_the_file_producers_are_mapped(doctor_json):
    """A safetensors and an .npy file load as views of the file: a write to the file is seen."""
    _, report = doctor_json
    for producer, loader in _FILES.items():
        cells = [c for c in report["matrix"] if c["producer"] == producer]
        assert {c["route"] for c in cells} == {"tensorbridge"}  # no peer loads them directly
        consumers = {c["consumer"]: c for c in cells}
        assert {"tensorbridge", "memoryview"} <= set(consumers)
        for name in ("tensorbridge", "memoryview", "numpy", "torch", "pyarrow"):
            if name not in consumers:
                assert not _installed(name)
                continue
            cell = consumers[name]
            assert (cell["outcome"], cell["proof"]) == ("shared", "write"), cell
            assert cell["calls"].startswith(loader), cell


def test_doctor_file_dtype_coverage(doctor_json):
    """Every dtype the two formats name loads as a mapped view; the others are marked absent."""
    _, report = doctor_json
    cells = {
        (c["producer"], c["dtype"]): c
        for c in report["dtypes"]
        if c["producer"] in _FILES and c["consumer"] == "tensorbridge"
    }
    for dtype in ("bool", "uint8", "int64", "float16", "float64", "complex64"):
        for producer in _FILES:
            assert cells[producer, dtype]["outcome"] == "shared", cells[producer, dtype]
    for dtype in ("bfloat16", "float8_e4m3fn", "float8_e8m0fnu"):
        assert cells["safetensors file", dtype]["outcome"] == "shared"
        assert cells["npy file", dtype]["outcome"] == "n/a"  # .npy has no name for it
    assert cells["npy file", "complex128"]["outcome"] == "shared"
    assert cells["safetensors file", "complex128"]["outcome"] == "n/a"  # no C128 in the format


def test_doctor_pyarrow_consumes_tensors_through_the_arrow_export(doctor_json):
    """pyarrow takes a tensor with pa.array (no copy), 1-d and as a fixed_shape_tensor."""
    pytest.importorskip("pyarrow")
    _, report = doctor_json
    cells = [
        c
        for c in report["matrix"]
        if c["consumer"] == "pyarrow" and c["route"] == "tensorbridge" and c["device"] == "cpu"
    ]
    assert {c["producer"] for c in cells} >= {"bytearray", "numpy", "tensorbridge", *_FILES}
    for cell in cells:
        if cell["producer"] == "jax":
            continue  # JAX's memory is read-only for tensorbridge too: proved by address
        assert cell["outcome"] == "shared", cell
        assert cell["calls"].endswith("pa.array"), cell
    check = next(c for c in report["checks"] if c["name"].startswith("pyarrow imports"))
    assert check["ok"] is True, check
    assert "arrow.fixed_shape_tensor over the same memory" in check["detail"]


def test_doctor_file_rows_need_no_peer(tmp_path):
    """With every peer unimportable (safetensors and NumPy too) both files are still proved."""
    proc = _run("doctor", "--json", "--no-child", env=_hidden(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    for producer in _FILES:
        cells = [c for c in report["matrix"] if c["producer"] == producer]
        assert {c["consumer"] for c in cells} == {"tensorbridge", "memoryview"}
        assert all(c["outcome"] == "shared" and c["proof"] == "write" for c in cells), cells


_COPYING_LOADERS = """
import tensorbridge as tb, tensorbridge.safetensors as tbst
_npy, _st = tb.load_npy, tbst.load_file
tb.load_npy = lambda *a, **k: _npy(*a, **k).clone()
tbst.load_file = lambda *a, **k: {n: t.clone() for n, t in _st(*a, **k).items()}
"""


def test_doctor_reports_a_copying_file_load_as_broken():
    """A loader that copies the file instead of mapping it is a broken cell and exit status 1."""
    proc = _run("doctor", "--peers", "none", "--json", code=_COPYING_LOADERS)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    for producer in _FILES:
        broken = [c for c in report["matrix"] if c["producer"] == producer]
        assert broken
        for cell in broken:
            assert cell["outcome"] == "broken" and cell["blame"] == "tensorbridge", cell
            assert f"copied the {producer} on load" in cell["reason"]


def test_doctor_reports_a_writable_file_load_as_broken():
    """A loader that hands out a writable view of the read-only file is a broken guarantee."""
    code = """
    import tensorbridge as tb
    _npy = tb.load_npy
    tb.load_npy = lambda path, **k: _npy(path, mode="c")
    """
    proc = _run("doctor", "--peers", "none", "--json", code=code)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    cells = [c for c in report["matrix"] if c["producer"] == "npy file"]
    assert cells
    assert all("writable tensor over read-only npy file" in c["reason"] for c in cells), cells


def test_doctor_files_follow_the_formats(tmp_path):
    """The files the doctor writes load in the formats' own readers with the given bytes."""
    raw = bytes(range(1, 33))  # eight int32
    expected = [int.from_bytes(raw[i : i + 4], "little") for i in range(0, 32, 4)]
    st, npy = files.SafetensorsFile(), files.NpyFile()
    st_file, npy_file = st.make("int32", raw, "cpu"), npy.make("int32", raw, "cpu")
    for side, stored in ((st, st_file), (npy, npy_file)):
        assert stored.start % 64 == 0  # 64-byte-aligned data, as the doctor claims
        assert side.read(stored) == raw
        with open(stored.path, "rb") as f:
            assert f.read()[stored.start :] == raw
        t, _ = side.load(stored)
        assert t.tolist() == expected and t.is_readonly
    if _installed("numpy"):
        import numpy as np

        assert np.load(npy_file.path).tolist() == expected
    if _installed("safetensors") and _installed("numpy"):
        from safetensors.numpy import load_file

        assert load_file(st_file.path)["x"].tolist() == expected
    with pytest.raises(Unavailable):
        npy.make("bfloat16", bytes(16), "cpu")  # .npy has no name NumPy's loader understands


def test_pyarrow_consumer_takes_arrow_producers_first():
    """pyarrow's entry points: pa.array for Arrow exporters, then pa.py_buffer for buffers."""
    pytest.importorskip("pyarrow")
    import tensorbridge as tb
    from tensorbridge.cli.peers import PyArrowSide

    side = PyArrowSide()
    t = tb.arange(4, dtype=tb.int32)
    names = [name for name, _ in side.entry_points(t)]
    assert names[0] == "pa.array"
    assert set(names) <= {"pa.array", "pa.py_buffer"}
    assert [name for name, _ in side.entry_points(b"abcd")] == ["pa.py_buffer"]
    with pytest.raises(Unavailable):
        side.entry_points(tb.utils.dlpack.to_dlpack(t))  # a capsule: neither interface


def test_doctor_text_fits_100_columns(full_run):
    """Every line of the text report, with --verbose or without, is at most 100 columns wide."""
    for text in (full_run[1], full_run[4]):
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= 100
        assert lines[0].startswith("tensorbridge ")
    assert any(line.startswith("Safety checks") for line in full_run[4].splitlines())
    assert not any(line.startswith("Safety checks") for line in full_run[1].splitlines())


def test_doctor_without_progress_writes_nothing_to_stderr():
    """Progress goes to stderr only on a terminal or with --progress: a pipe gets nothing."""
    proc = _run("doctor", "--peers", "none")
    assert proc.returncode == 0
    assert proc.stderr == ""


_READONLY_CHECK = (
    "read-only tensors refuse writes in tensorbridge and NumPy; PyTorch imports them writable"
)


def _readonly_check(*peers: str) -> dict:
    proc = _run("doctor", "--peers", ",".join(peers) or "none", "--json")  # no Ray, no Dask
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = json.loads(proc.stdout)["checks"]
    (check,) = [c for c in found if c["name"].startswith("read-only tensors refuse writes")]
    return check


def test_doctor_shows_what_read_only_protects_without_peers():
    """With no peer, the check proves tensorbridge's refusal and says nothing about PyTorch."""
    check = _readonly_check()
    assert check["ok"] is True
    assert check["detail"] == "t[0] = 99 raises ValueError"


@pytest.mark.skipif(
    not (_installed("numpy") and _installed("torch")), reason="needs NumPy and PyTorch"
)
def test_doctor_shows_what_read_only_protects():
    """NumPy's views of a read-only tensor refuse writes; PyTorch's imports of it are reported as
    they are, measured (here too: a write through torch.from_dlpack lands in the read-only memory,
    as PyTorch ignores DLPack's READ_ONLY flag), and the check still passes."""
    import torch

    import tensorbridge as tb

    check = _readonly_check("numpy", "torch")
    assert check["ok"] is True
    detail = check["detail"]
    assert detail.startswith("t[0] = 99 raises ValueError; np.asarray(t)")
    assert "are read-only and refuse writes" in detail
    memory = bytearray(8)
    for i, convert in enumerate((torch.from_dlpack, torch.asarray)):
        y = convert(tb.frombuffer(memoryview(memory).toreadonly(), dtype=tb.uint8))
        y[i] = 1
        if memory[i] == 1:
            said = (
                f"torch.{convert.__name__}(t) is writable over the same memory (a write reached it)"
            )
            assert said in detail
    if memory != bytearray(8):
        assert "PyTorch has no read-only tensors (documented, not a failure)" in detail
        assert detail.endswith("to write, copy first (t.clone())")


def test_doctor_exits_zero_with_the_peers_hidden(tmp_path):
    """With every peer unimportable, the doctor reports them and still exits 0."""
    proc = _run("doctor", "--json", env=_hidden(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    statuses = {lib["key"]: lib["status"] for lib in report["libraries"]}
    assert "used" not in {statuses[name] for name in ("numpy", "torch", "jax")}
    if _installed("numpy"):
        assert statuses["numpy"] == "import failed"
    assert {c["producer"] for c in report["matrix"]} >= {"bytes", "mmap", "tensorbridge"}


def test_doctor_peers_none_from_the_environment():
    """TB_DOCTOR_PEERS=none keeps the doctor to the standard library and tensorbridge."""
    proc = _run("--json", env={"TB_DOCTOR_PEERS": "none"})
    assert proc.returncode == 0, proc.stdout[-2000:]
    report = json.loads(proc.stdout)
    assert not [lib for lib in report["libraries"] if lib["status"] == "used"]
    assert {c["consumer"] for c in report["matrix"]} == {"tensorbridge", "memoryview"}


def test_doctor_exits_nonzero_when_a_guarantee_breaks():
    """A tensorbridge that loses the read-only flag makes the doctor fail, naming the guarantee."""
    code = """
    import tensorbridge as tb
    tb.Tensor.is_readonly = property(lambda self: False)
    """
    proc = _run("doctor", "--peers", "none", code=code)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[2].startswith("BROKEN: tensorbridge broke ")
    assert "  - check: read-only buffers give read-only tensors: " in proc.stdout
    assert max(len(line) for line in lines) <= 100
    proc = _run("doctor", "--peers", "none", "--verbose", code=code)
    assert proc.returncode == 1
    assert "FAIL  read-only buffers give read-only tensors" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100


def test_doctor_reports_a_copying_import_as_broken():
    """An import that copies instead of sharing is a broken cell, and fails the exit status."""
    code = """
    import tensorbridge as tb
    _original = tb.asarray
    tb.asarray = lambda obj, **kw: _original(obj, **kw).clone()
    """
    proc = _run("doctor", "--peers", "none", "--json", code=code)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    broken = [c for c in report["matrix"] if c["outcome"] == "broken"]
    assert any(c["producer"] == "bytearray" and "copied" in c["reason"] for c in broken)


def test_doctor_reports_a_placeholder_as_broken_without_crashing():
    """A tensorbridge entry point that raises NotImplementedError is a broken cell, not a crash."""
    code = """
    import tensorbridge as tb
    def _missing(*args, **kwargs):
        raise NotImplementedError
    tb.asarray = _missing
    """
    proc = _run("doctor", "--peers", "none", "--json", code=code)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    reasons = [c["reason"] for c in report["matrix"] if c["outcome"] == "broken"]
    assert reasons
    assert all("NotImplementedError" in r for r in reasons)


def test_progress_appears_only_after_a_second():
    """The progress line is written only once the run has taken more than a second."""
    stream = io.StringIO()
    line = progress.Progress(True, stream, ticking=False)
    line("early")
    assert stream.getvalue() == ""
    line.start -= 2.0
    line.last -= 2.0
    line("importing JAX")
    assert "importing JAX" in stream.getvalue()
    assert stream.getvalue().endswith("\n")  # not a terminal: one line per update


def test_table_splits_columns_that_do_not_fit():
    """A table wider than the limit is split into blocks that repeat the first column."""
    rows = [["row", *("x" * 20 for _ in range(6))]]
    lines = render.table(["name", *(f"col{i}" for i in range(6))], rows, width=60)
    assert max(len(line) for line in lines) <= 60
    assert sum(line.strip().startswith("name") for line in lines) >= 2


def test_peer_list_parsing():
    """--peers accepts a comma list; 'none' (or 'stdlib') means no peer at all."""
    assert cli.peer_list("numpy, torch") == ("numpy", "torch")
    assert cli.peer_list("none") == ()
    assert cli.peer_list("stdlib") == ()


def test_bench_quick_json_reports_ratios(tmp_path):
    """bench --quick --json runs every script on a tiny budget and reports tb/peer ratios."""
    proc = _run(
        "bench", "--quick", "--json", "--sizes", "1KiB", "--budget", "0.0005", "--repeat", "1"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert {"bench", "command", "machine", "settings", "results", "targets"} <= set(report)
    groups = {r["group"] for r in report["results"]}
    assert {"frombuffer", "from_file", "asarray"} <= groups
    assert ("arrow" in groups) == _installed("pyarrow")
    assert all(r["tb"]["error"] is None and r["tb"]["us"] > 0 for r in report["results"])
    if _installed("torch"):
        ratios = [p["ratio"] for r in report["results"] for p in r["peers"]]
        assert any(isinstance(x, float) and x > 0 for x in ratios)
        assert any(t["peer"].startswith("torch.frombuffer") for t in report["targets"])


def test_bench_times_pa_array_of_a_tensor_next_to_an_ndarray():
    """bench's arrow line times pa.array(tb tensor) with pa.array(ndarray) as the ratio's peer."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("numpy")
    from tensorbridge.cli.bench import _benchmarks

    assert "bench_arrow" in _benchmarks().SCRIPTS
    proc = _run(
        "bench",
        "--only",
        "arrow",
        "--json",
        "--sizes",
        "1KiB,1GiB",
        "--budget",
        "0.0005",
        "--repeat",
        "1",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout)["results"]
    assert [(r["group"], r["size"]) for r in results] == [("arrow", 1024), ("arrow", 1 << 30)]
    for r in results:
        assert r["tb"]["label"] == "pa.array(tb)" and r["tb"]["error"] is None
        (peer,) = r["peers"]
        assert peer["label"] == "pa.array(ndarray)" and peer["error"] is None
        assert peer["ratio"] > 0


def test_bench_runs_with_the_peers_hidden():
    """Without any peer, bench still times tensorbridge's own calls."""
    proc = _run(
        "bench",
        *_TINY_BENCH,
        code=_BLOCK_PEERS,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tb.frombuffer(bytearray, dtype=tb.float32)" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100


def test_bench_plot_without_matplotlib_says_so(tmp_path):
    """--plot without matplotlib prints a clear message and still prints the table."""
    target = tmp_path / "ratios.png"
    proc = _run(
        "bench",
        *_TINY_BENCH,
        "--plot",
        str(target),
        code=_BLOCK_PEERS,
    )
    assert proc.returncode == 0
    assert "needs matplotlib" in proc.stderr
    assert not target.exists()


def test_bench_plot_writes_a_png(tmp_path):
    """--plot FILE.png writes a bar chart of the ratios when matplotlib is installed."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("torch")
    target = tmp_path / "ratios.png"
    proc = _run(
        "bench",
        *_TINY_BENCH,
        "--peers",
        "torch",
        "--plot",
        str(target),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert target.read_bytes().startswith(b"\x89PNG")


def test_bench_help_lists_its_options():
    """bench --help documents --quick, --json and --plot."""
    proc = _run("bench", "--help")
    assert proc.returncode == 0
    for option in ("--quick", "--json", "--plot", "--budget"):
        assert option in proc.stdout


def test_module_entry_point_runs_the_doctor():
    """python -m tensorbridge (no command) is the doctor."""
    proc = subprocess.run(
        [sys.executable, "-m", "tensorbridge", "--peers", "none"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert proc.stdout.startswith("tensorbridge ")


# --------------------------------------------------------------------------------------------------
# The summary: what a new user reads first.

_CHECK, _CROSS = "\u2713", "\u2717"
# How pip spells each library the doctor would use (PyTorch at the version tensorbridge is
# pinned to); the install line names exactly the missing ones.
_PIP = {
    "numpy": "numpy",
    "torch": "torch==2.13.0",
    "jax": "jax",
    "cupy": "cupy",
    "tensorflow": "tensorflow",
    "pyarrow": "pyarrow",
    "array_api_strict": "array-api-strict",
    "mlx": "mlx",
    "paddle": "paddlepaddle",
    "onnxruntime": "onnxruntime",
    "warp": "warp-lang",
    "cuda_core": "cuda-core",
    "polars": "polars",
    "pandas": "pandas",
    "nanoarrow": "nanoarrow",
    "xarray": "xarray",
    "dask_array": "dask",
    "ml_dtypes": "ml_dtypes",
    "tvm_ffi": "apache-tvm-ffi",
    "ray": "ray",
    "dask": "distributed",
}
# A sitecustomize module that makes the named distributions look not installed: their modules
# do not import and their metadata is not found (in the peers' own processes too).
_UNINSTALL = """
import importlib.abc, importlib.metadata as md, sys
_HIDDEN = {hidden!r}
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in _HIDDEN:
            raise ImportError("hidden for the test: " + name)
        return None
sys.meta_path.insert(0, _Block())
_version = md.version
def _hidden_version(name):
    if name.lower() in _HIDDEN:
        raise md.PackageNotFoundError(name)
    return _version(name)
md.version = _hidden_version
"""


def _summary(text: str) -> list[str]:
    """The summary's lines: from the first line to the one that says where the details are."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("More: --verbose"))
    return lines[: end + 1]


def _rows(summary: list[str]) -> dict[str, list[str]]:
    """The summary's library rows by library name: the name, four marks and any note."""
    rows: dict[str, list[str]] = {}
    header = next((i for i, line in enumerate(summary) if line.startswith("  library ")), None)
    if header is None:
        return rows
    for line in summary[header + 1 :]:
        if not re.match(r"  \S", line):
            break
        cols = [c.strip() for c in line.strip().split("  ") if c.strip()]
        rows[cols[0]] = cols
    return rows


def _install_words(text: str) -> list[str]:
    """The libraries the install line names (after ``pip install``, over its continuations)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "pip install" in line), None)
    if start is None:
        return []
    joined = []
    for line in lines[start:]:
        joined.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            break
    return " ".join(joined).partition("pip install ")[2].split()


def test_doctor_summary_comes_first(full_run):
    """The report opens with a summary of at most 25 lines: the platform, the build, the verdict,
    one line per peer, what to install; --verbose prints the same summary, then the details."""
    _, text, report, _, verbose = full_run
    summary = _summary(text)
    assert len(summary) <= render.SUMMARY_LINES
    assert text.splitlines() == summary  # nothing broke: the summary is the whole default report
    assert summary[0].startswith(f"tensorbridge {tb.__version__} doctor, Python ")
    assert summary[1].startswith(("build: pure-Python", "build: compiled"))
    assert summary[2].startswith("OK: tensorbridge kept every guarantee it checked")
    crossed = f"subinterpreters: {_CHECK} tensors cross without a copy; pure-Python there"
    has_interpreters = importlib.util.find_spec("concurrent.interpreters") is not None
    assert (summary[3] == crossed) == has_interpreters  # CPython 3.14 and later
    assert summary[-1].startswith("More: --verbose (every exchange, dtype and check")
    assert not summary[-1].endswith("...")
    assert verbose.startswith("\n".join(summary) + "\n\n")
    rows = _rows(summary)
    peers = {p["name"]: p for p in report["peers"]}
    assert set(rows) == set(peers)  # one line per peer proved, none for the others
    for name, peer in peers.items():
        row = rows[name]
        if peer["status"] != "used":
            assert row[1:3] == [_CROSS, _CROSS], row
            continue
        into, out, zero_copy, readonly = row[1:5]
        assert into == (_CHECK if {"shared", "copied"} & set(peer["to_tensorbridge"]) else _CROSS)
        assert out == (_CHECK if {"shared", "copied"} & set(peer["from_tensorbridge"]) else _CROSS)
        assert zero_copy in (_CHECK, _CROSS) or "/" in zero_copy
        assert readonly in (_CHECK, _CROSS)
    if "PyTorch" in rows and peers["PyTorch"]["status"] == "used":
        assert rows["PyTorch"][4:] == [_CROSS, "has no read-only arrays"]  # documented, measured
    missing = [lib["key"] for lib in report["libraries"] if lib["version"] is None]
    assert _install_words(text) == [_PIP[key] for key in missing if key in _PIP]


def test_doctor_summary_names_what_to_install(tmp_path):
    """With PyTorch and JAX not installed, the install line names them (PyTorch at its pinned
    version) and every other library the doctor would use that is missing, nothing installed."""
    hidden = {"torch", "jax", "jaxlib"}
    (tmp_path / "sitecustomize.py").write_text(_UNINSTALL.format(hidden=hidden))
    src = str(Path(tb.__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), src]))}
    env["PYTHONIOENCODING"] = "utf-8"
    code = """
    import json
    from tensorbridge.cli import doctor, render
    report = doctor.run(doctor.Options(peers=(), child_checks=False))
    missing = [lib.key for lib in report.libraries if lib.version is None]
    print(json.dumps({"text": render.render(report), "missing": missing}))
    raise SystemExit(0)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout)
    assert {"torch", "jax"} <= set(found["missing"])
    words = _install_words(found["text"])
    assert words == [_PIP[key] for key in found["missing"] if key in _PIP]
    assert {"torch==2.13.0", "jax"} <= set(words)  # numpy leads where it is missing too
    if _installed("numpy"):
        assert "numpy" not in words
    assert len(_summary(found["text"])) <= render.SUMMARY_LINES


def test_doctor_summary_without_peers():
    """With no peer, the summary says why and what to do, and still has the build and verdict."""
    proc = _run("doctor", "--peers", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = _summary(proc.stdout)
    assert proc.stdout.splitlines() == summary
    assert len(summary) <= render.SUMMARY_LINES
    assert summary[1].startswith("build: ")
    assert summary[2].startswith("OK: ")
    assert "No array library was used" in proc.stdout
    assert not _rows(summary)


def test_doctor_summary_with_the_peers_hidden(tmp_path):
    """With every peer unimportable, each installed one has a line that says its import failed."""
    proc = _run("doctor", "--no-child", env={**_hidden(tmp_path), "PYTHONIOENCODING": "utf-8"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = _summary(proc.stdout)
    assert len(summary) <= render.SUMMARY_LINES
    assert summary[2].startswith("OK: ")
    rows = _rows(summary)
    for name, row in rows.items():
        assert row[1:3] == [_CROSS, _CROSS], (name, row)
    if _installed("numpy"):  # its own line, or one line for all that could not be used
        said = " ".join(rows["NumPy"]) if "NumPy" in rows else proc.stdout
        assert "import failed" in said


def test_doctor_summary_falls_back_to_ascii():
    """Where stdout's encoding cannot print check marks, the summary says yes and no."""
    pytest.importorskip("numpy")
    proc = _run("doctor", "--peers", "numpy", "--no-child", env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.isascii()
    row = _rows(_summary(proc.stdout))["NumPy"]
    assert row[1:5] == ["yes", "yes", "yes", "yes"], row
    assert render.can_print_marks(io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    assert not render.can_print_marks(io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    assert not render.can_print_marks(io.TextIOWrapper(io.BytesIO(), encoding="latin-1"))


# --------------------------------------------------------------------------------------------------
# The legend and the footnotes say what the doctor measured.


def _matrix_block(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    block = []
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            break
        block.append(line)
    return block


def _footnotes(block: list[str]) -> dict[str, str]:
    notes: dict[str, str] = {}
    current = None
    for line in block:
        if line.startswith("  ["):
            current, _, rest = line.strip()[1:].partition("] ")
            notes[current] = rest
        elif current is not None and line.startswith("      "):
            notes[current] += " " + line.strip()
        else:
            current = None
    return notes


def _row_notes(block: list[str], producer: str) -> list[str]:
    notes = _footnotes(block)
    refs = [
        ref
        for line in block
        if line.startswith(f"  {producer} ")
        for ref in re.findall(r"\[(\d+)\]", line)
    ]
    return [notes[ref] for ref in refs]


def _legend(text: str) -> str:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("shared: "))
    end = lines.index("", start)
    return " ".join(lines[start:end])


def test_doctor_legend_and_jax_footnotes_agree(full_run):
    """JAX rows are proved by the address (shared*); the legend says that proves no view's
    writability, and a footnote says tensorbridge's view is writable exactly when it is."""
    jnp = pytest.importorskip("jax.numpy")
    verbose = full_run[4]
    legend = _legend(verbose)
    assert "neither side may be written" not in legend
    assert "shared*: the doctor could not write through the producer" in legend
    assert "says nothing about whether either view may be written" in legend
    writable = not tb.from_dlpack(jnp.arange(4, dtype=jnp.int32)).is_readonly
    block = _matrix_block(verbose, "Exchange through tensorbridge, cpu")
    row = next(line for line in block if line.startswith("  jax "))
    assert "shared*" in row
    said = [n for n in _row_notes(block, "jax") if "tensorbridge's view of them is writable" in n]
    assert bool(said) == writable, said
    readonly = _rows(_summary(full_run[1]))["JAX"][4]
    assert readonly == (_CROSS if writable else _CHECK)


def _jax_report(note: str) -> tuple[object, list[object]]:
    """A report of JAX exchanges as the doctor records them, with ``note`` on JAX's export."""
    from tensorbridge.cli.doctor import Report
    from tensorbridge.cli.environment import Library
    from tensorbridge.cli.exchange import Cell
    from tensorbridge.cli.families import PeerResult

    lib = Library("jax", "JAX", "jax", "jax", "0.0", "used", ["cpu"])
    into = Cell("jax", "tensorbridge", "cpu", "tensorbridge", "int32", "shared", "address")
    into.notes = [note] if note else []
    out = Cell("tensorbridge", "jax", "cpu", "tensorbridge", "int32", "shared", "write")
    back = Cell("jax", "jax", "cpu", "tensorbridge", "int32", "refused", blame="tensorbridge")
    back.reason = "BufferError: cannot export a read-only tensor as an unversioned capsule"
    result = PeerResult(lib, {0: ("matrix", into), 1: ("dtypes", into), 2: ("dtypes", out)})
    result.cells[3] = ("dtypes", back)
    report = Report([lib], ["cpu"], [into], [into, out, back], [], [result])
    return report, [into, out, back]


def test_footnote_on_a_writable_jax_view_agrees_with_the_legend():
    """Where JAX exports read-only arrays without a read-only mark, the footnote on its shared*
    row says tensorbridge's view is writable, the legend does not contradict it, and the summary
    marks JAX's read-only column."""
    from tensorbridge.cli import exchange

    note = exchange._EXPORTS_WRITABLE.format(p="jax")
    report, (into, _, _) = _jax_report(note)
    assert exchange.writable_sides(into) == {"jax"}
    text = render.render(report, verbose=True)
    block = _matrix_block(text, "Exchange through tensorbridge, cpu")
    row = next(line for line in block if line.startswith("  jax "))
    assert "shared* [1]" in row
    (footnote,) = _row_notes(block, "jax")
    assert "tensorbridge's view of them is writable" in footnote
    assert "neither side may be written" not in _legend(text)
    jax = _rows(_summary(text))["JAX"]
    assert jax[1:5] == [_CHECK, _CHECK, _CHECK, _CROSS]
    assert jax[5] == "exports its read-only arrays writable"
    clean, _ = _jax_report("")
    assert _rows(_summary(render.render(clean)))["JAX"][4] == _CHECK


def test_dtype_rows_keep_a_round_trip_apart_from_an_import():
    """jax>tb (JAX's arrays into tensorbridge) and jax>tb>jax (there and back) are two rows."""
    report, _ = _jax_report("")
    text = render.render(report, verbose=True)
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if ">" in line:
            rows.setdefault(line.split()[0], line.split()[1:])  # the first block: bool, u8...
    assert rows["jax>tb"][:1] == ["="]
    assert rows["jax>tb>jax"][:1] == ["r"]
    assert rows["tb>jax"][:1] == ["="]
