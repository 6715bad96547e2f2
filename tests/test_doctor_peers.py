"""The doctor proves every installed peer in a process of its own: ``--peers`` takes each peer's
name, ``--json`` reports each peer cell by cell, a peer that kills its process is reported with the
signal while the doctor goes on, and no check names a library that is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tensorbridge as tb
from tensorbridge import cli
from tensorbridge.cli import environment, registry

pytestmark = pytest.mark.subprocess

_SRC = str(Path(tb.__file__).resolve().parents[1])
# The module each peer's side imports (whether the peer is installed here).
_MODULES = {
    "numpy": "numpy",
    "torch": "torch",
    "jax": "jax",
    "pyarrow": "pyarrow",
    "cupy": "cupy",
    "tensorflow": "tensorflow",
    "paddle": "paddle",
    "onnxruntime": "onnxruntime",
    "mlx": "mlx",
    "warp": "warp",
    "array_api_strict": "array_api_strict",
    "tvm_ffi": "tvm_ffi",
    "cuda_core": "cuda",
    "polars": "polars",
    "pandas": "pandas",
    "nanoarrow": "nanoarrow",
    "xarray": "xarray",
    "dask_array": "dask",
}
_PEER_KEYS = {
    "key",
    "name",
    "version",
    "status",
    "verdict",
    "shares_memory",
    "error",
    "crashes",
    "seconds",
    "to_tensorbridge",
    "from_tensorbridge",
    "cells",
    "defects",
}
_PEER_CELL_KEYS = {
    "producer",
    "consumer",
    "route",
    "device",
    "dtype",
    "outcome",
    "proof",
    "verdict",
    "reason",
}


def _doctor(*args: str, fake: Path | None = None) -> subprocess.CompletedProcess[str]:
    paths = [str(fake)] if fake is not None else []
    paths += [_SRC, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    env["PYTHONIOENCODING"] = "utf-8"  # the summary's check marks, whatever the locale
    return subprocess.run(
        [sys.executable, "-m", "tensorbridge", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        env=env,
    )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def test_every_peer_has_a_module_to_look_for():
    """The test knows every peer the doctor proves."""
    assert set(_MODULES) == set(registry.PEERS)


@pytest.mark.parametrize(
    ("typed", "key"),
    [
        ("tensorflow", "tensorflow"),
        ("TensorFlow", "tensorflow"),
        ("paddlepaddle", "paddle"),
        ("array-api-strict", "array_api_strict"),
        ("array_api_strict", "array_api_strict"),
        ("tvm-ffi", "tvm_ffi"),
        ("cuda.core", "cuda_core"),
        ("dask.array", "dask_array"),
        ("warp-lang", "warp"),
        ("ml_dtypes", "numpy"),
    ],
)
def test_peer_names_take_their_usual_spellings(typed, key):
    """--peers takes a peer's key, its distribution name and its import name."""
    assert cli.peer_list(typed) == (key,)


def test_peer_list_keeps_each_peer_once():
    """Two spellings of one peer select it once."""
    assert cli.peer_list("array-api-strict,array_api_strict,numpy") == ("array_api_strict", "numpy")


def test_every_peer_is_known_to_the_environment():
    """Each peer --peers takes is looked for among the installed distributions."""
    keys = {lib.key for lib in environment.find_libraries()}
    assert set(registry.PEERS) <= keys


@pytest.mark.parametrize("key", registry.PEERS)
def test_peers_option_proves_the_named_peer(key):
    """--peers KEY proves that peer alone, in its own process; it shares memory with tensorbridge
    (or says why it could not be used), and the doctor exits 0."""
    if not _installed(_MODULES[key]):
        pytest.skip(f"{key} is not installed")
    proc = _doctor("--json", "--no-child", "--peers", key)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (peer,) = report["peers"]
    assert peer["key"] == key
    if peer["status"] != "used":  # installed but unusable here (no GPU, a missing library)
        assert peer["error"], peer
        return
    assert peer["verdict"] == "proved", peer
    if key != "dask_array":  # dask.array computes each result: it has no memory to share
        assert peer["shares_memory"], peer
        assert peer["to_tensorbridge"].get("shared") or peer["from_tensorbridge"].get("shared")
    assert all(c["producer"] == key or c["consumer"] == key for c in peer["cells"])


def test_json_reports_each_peer_cell_by_cell():
    """--json has a peers list; each peer has its verdict, both directions and every cell."""
    pytest.importorskip("numpy")
    proc = _doctor("--json", "--no-child", "--peers", "numpy")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (peer,) = report["peers"]
    assert set(peer) == _PEER_KEYS
    assert peer["cells"]
    for cell in peer["cells"]:
        assert set(cell) == _PEER_CELL_KEYS
        assert cell["verdict"] in ("proved", "failed")
    assert "int32" in peer["to_tensorbridge"]["shared"]
    assert "int32" in peer["from_tensorbridge"]["shared"]
    directions = [c for c in peer["cells"] if c["route"] == "tensorbridge"]
    assert {(c["producer"], c["consumer"]) for c in directions} >= {
        ("numpy", "tensorbridge"),
        ("tensorbridge", "numpy"),
    }


def _fake_tvm_ffi(tmp_path: Path, body: str) -> Path:
    """A ``tvm_ffi`` module that does ``body`` where the real one would import a tensor."""
    (tmp_path / "tvm_ffi.py").write_text(textwrap.dedent(body))
    return tmp_path


def test_a_peer_that_segfaults_is_reported_and_survived(tmp_path):
    """A peer whose import call segfaults kills its own process, not the doctor: each such cell
    is reported crashed with the signal, the proof goes on after it, and the exit status stays 0."""
    pytest.importorskip("numpy")  # the tvm-ffi side makes its arrays with NumPy
    fake = _fake_tvm_ffi(
        tmp_path,
        """
        import ctypes

        def from_dlpack(obj):
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        """,
    )
    proc = _doctor("--json", "--no-child", "--peers", "tvm_ffi", fake=fake)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (peer,) = report["peers"]
    assert peer["verdict"] in ("failed", "crashed")
    assert peer["crashes"]
    assert all("SIGSEGV" in c for c in peer["crashes"])
    crashed = [c for c in report["matrix"] + report["dtypes"] if c["outcome"] == "crashed"]
    assert crashed
    assert all("SIGSEGV" in c["reason"] and c["blame"] == "tvm_ffi" for c in crashed)
    assert report["ok"] is True  # a peer's crash is not a broken guarantee of tensorbridge
    assert {c["producer"] for c in report["matrix"]} >= {"bytes", "tensorbridge"}


def test_a_peer_that_aborts_on_import_is_reported_and_survived(tmp_path):
    """A peer whose import aborts the process is reported crashed, naming SIGABRT."""
    pytest.importorskip("numpy")  # the tvm-ffi side makes its arrays with NumPy
    fake = _fake_tvm_ffi(tmp_path, "import os\nos.abort()\n")
    proc = _doctor("--json", "--no-child", "--peers", "tvm_ffi", fake=fake)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    lib = next(lib for lib in report["libraries"] if lib["key"] == "tvm_ffi")
    assert lib["status"] == "crashed"
    assert "SIGABRT" in lib["error"]
    assert "importing" in lib["error"]
    proc = _doctor("--no-child", "--peers", "tvm_ffi", fake=fake)  # the text says so too
    assert proc.returncode == 0
    row = _summary_row(proc.stdout, "TVM FFI")
    assert "\u2717" in row and "crashed" in row and "SIGABRT (signal 6)" in row, row
    assert proc.stdout.splitlines()[2].startswith("OK: ")  # a peer's crash breaks no guarantee


def _summary_row(text: str, name: str) -> str:
    """The summary's line for library ``name`` (the summary ends with the "More" line)."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("More: --verbose"))
    assert end < 25, text
    (row,) = [line for line in lines[:end] if line.startswith(f"  {name}  ")]
    return row


def test_the_summary_says_which_peer_crashed_and_how(tmp_path):
    """A peer whose process segfaults has a summary line with a cross, "crashed" and the signal."""
    pytest.importorskip("numpy")  # the tvm-ffi side makes its arrays with NumPy
    fake = _fake_tvm_ffi(
        tmp_path,
        """
        import ctypes

        def from_dlpack(obj):
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        """,
    )
    proc = _doctor("--no-child", "--peers", "tvm_ffi", fake=fake)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = _summary_row(proc.stdout, "TVM FFI")
    assert "\u2717" in row and "crashed" in row and "SIGSEGV (signal 11)" in row, row


def test_no_headline_names_a_library_that_is_not_used():
    """With no peer, no check's name mentions PyTorch or NumPy."""
    proc = _doctor("--json", "--no-child", "--peers", "none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for check in report["checks"]:
        assert "PyTorch" not in check["name"], check
        assert "NumPy" not in check["name"], check


def test_no_headline_names_pytorch_without_pytorch():
    """With NumPy and not PyTorch, the read-only check names NumPy and not PyTorch."""
    pytest.importorskip("numpy")
    proc = _doctor("--json", "--no-child", "--peers", "numpy")
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = [c["name"] for c in json.loads(proc.stdout)["checks"]]
    assert "read-only tensors refuse writes in tensorbridge and NumPy" in names
    assert not [n for n in names if "PyTorch" in n]
