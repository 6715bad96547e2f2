"""The command line under hostile conditions: peers that exit or stall, closed pipes, bad options.

Each command runs in a child interpreter; fake peers are modules in a temporary directory put first
on its ``PYTHONPATH`` under the import name of a peer that is not installed here (``cupy``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import types
from pathlib import Path

import pytest

import tensorbridge as tb
from tensorbridge import cli
from tensorbridge.cli import checks, environment, exchange, peers, registry, render, sides

pytestmark = pytest.mark.subprocess

_SRC = str(Path(tb.__file__).resolve().parents[1])
_NOISE = ("Traceback", "BrokenPipeError", "Exception ignored")


def _env(fake: Path | None = None) -> dict[str, str]:
    paths = [str(fake)] if fake is not None else []
    paths += [_SRC, os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def _script(args: list[str], code: str = "") -> str:
    return textwrap.dedent(code) + (
        f"\nfrom tensorbridge.cli import main\nraise SystemExit(main({args!r}))\n"
    )


def _run(
    *args: str, fake: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorbridge", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**_env(fake), **(env or {})},
    )


def _run_closed(
    args: list[str], *, close: str, code: str = "", fake: Path | None = None
) -> tuple[int, str]:
    """Run ``main(args)`` with its stdout or stderr closed by the reader at once (``| true``).

    Returns the exit status and what the other stream received.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", _script(args, code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(fake),
    )
    assert proc.stdout is not None and proc.stderr is not None
    closed, kept = (proc.stdout, proc.stderr) if close == "stdout" else (proc.stderr, proc.stdout)
    closed.close()
    try:
        out = kept.read()
        status = proc.wait(timeout=180)
    finally:
        proc.kill()
        kept.close()
    return status, out


@pytest.fixture
def fake_peer(tmp_path):
    """Write a fake ``cupy`` module with the given body; returns its directory."""

    def write(body: str) -> Path:
        (tmp_path / "cupy.py").write_text(textwrap.dedent(body))
        return tmp_path

    return write


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
        ("raise SystemExit('no device here')\n", "SystemExit: no device here"),
        ("class Stop(BaseException):\n    pass\nraise Stop('giving up')\n", "Stop: giving up"),
    ],
)
def test_peer_that_exits_on_import_is_a_failed_import(fake_peer, body, error):
    """A peer whose import calls sys.exit() or raises BaseException is reported; the run goes on."""
    proc = _run("doctor", "--json", "--peers", "cupy", "--no-child", fake=fake_peer(body))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    cupy = next(lib for lib in report["libraries"] if lib["key"] == "cupy")
    assert cupy["status"] == "import failed"
    assert cupy["error"] == error
    assert report["ok"] is True
    assert report["matrix"]


def test_progress_names_a_slow_import(fake_peer):
    """--progress names the library being imported while its import is still running."""
    fake = fake_peer("import time\ntime.sleep(2.5)\n")
    proc = _run("doctor", "--progress", "--json", "--peers", "cupy", "--no-child", fake=fake)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "importing CuPy" in proc.stderr
    json.loads(proc.stdout)


@pytest.mark.parametrize(
    "args",
    [
        ["doctor", "--json", "--peers", "none"],
        ["doctor", "--peers", "none"],
        [
            "bench",
            "--json",
            "--sizes",
            "1KiB",
            "--budget",
            "0.0005",
            "--repeat",
            "1",
            "--only",
            "frombuffer",
        ],
        ["--help"],
    ],
    ids=["doctor-json", "doctor-text", "bench", "help"],
)
def test_closed_stdout_ends_quietly_with_the_status(args):
    """A reader that closes stdout early (| head, | true) gets no traceback and status 0 here."""
    status, err = _run_closed(args, close="stdout")
    assert status == 0, err[-2000:]
    assert not any(noise in err for noise in _NOISE), err[-2000:]


def test_closed_stdout_keeps_the_broken_verdict():
    """With stdout closed, a doctor that found a broken guarantee still exits 1, quietly."""
    code = """
    import tensorbridge as tb
    tb.Tensor.is_readonly = property(lambda self: False)
    """
    status, err = _run_closed(["doctor", "--peers", "none"], close="stdout", code=code)
    assert status == 1
    assert not any(noise in err for noise in _NOISE), err[-2000:]


def test_closed_stderr_does_not_stop_the_doctor(fake_peer):
    """--progress into a closed stderr stops the progress display, not the run."""
    fake = fake_peer("import time\ntime.sleep(1.5)\n")
    args = ["doctor", "--progress", "--json", "--peers", "cupy", "--no-child"]
    status, out = _run_closed(args, close="stderr", fake=fake)
    assert status == 0
    assert json.loads(out)["ok"] is True


@pytest.mark.parametrize("where", ["option", "environment"])
def test_unknown_peer_is_an_error_naming_the_known_ones(where):
    """--peers bogus (or TB_DOCTOR_PEERS=bogus) exits 2 naming the peers the doctor knows."""
    if where == "option":
        proc = _run("doctor", "--peers", "numpy,bogus")
    else:
        proc = _run("doctor", env={"TB_DOCTOR_PEERS": "bogus"})
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "unknown peer 'bogus'" in proc.stderr
    assert ", ".join(registry.PEERS) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_command_is_an_invalid_choice():
    """An unknown subcommand gets argparse's 'invalid choice' and exit status 2."""
    proc = _run("bogus")
    assert proc.returncode == 2
    assert "invalid choice: 'bogus'" in proc.stderr
    assert "doctor" in proc.stderr and "bench" in proc.stderr


def test_doctor_without_peers_says_how_to_prove_the_libraries():
    """A run that used no array library says how to prove the ones installed here."""
    proc = _run("doctor", "--peers", "none")
    assert proc.returncode == 0, proc.stdout[-2000:]
    text = " ".join(proc.stdout.split())
    assert "No array library was used" in text
    assert "run without --peers" in text or "install one or more of them" in text


def _libraries(**statuses: str) -> list[environment.Library]:
    found = []
    for key, status in statuses.items():
        lib = environment.Library(key, key.capitalize(), key)
        if status != "not installed":
            lib.version, lib.status = "1.0", status
        found.append(lib)
    return found


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ({"numpy": "not selected", "torch": "not installed"}, "run without --peers"),
        ({"numpy": "import failed", "torch": "not installed"}, "Numpy failed to import"),
        ({"numpy": "not installed", "torch": "not installed"}, "install one or more of"),
        ({"numpy": "used"}, None),
    ],
)
def test_no_library_hint_matches_why_none_was_used(statuses, expected):
    """The hint names the cause: peers deselected, failed imports, or none installed."""
    hint = render.no_library_hint(_libraries(**statuses))
    if expected is None:
        assert hint is None
    else:
        assert hint is not None and expected in hint


def test_peer_list_rejects_unknown_names():
    """peer_list raises argparse's type error for a name the doctor does not exchange with."""
    with pytest.raises(Exception, match="unknown peer 'tensorflowx'"):
        cli.peer_list("numpy,tensorflowx")


# --------------------------------------------------------------------------------------------------
# The exchange itself, in process: NumPy and the standard library only, nothing crash-prone.


class _InterfaceOnly:
    """Exports its memory through ``__array_interface__`` only, as pyarrow 14 arrays do."""

    def __init__(self, array) -> None:
        self._array = array
        self.__array_interface__ = dict(array.__array_interface__)


class _InterfaceSide(sides.Side):
    key = label = "interface"

    def __init__(self, np) -> None:
        self.np = np

    def make(self, dtype, raw, device):
        return _InterfaceOnly(self.np.frombuffer(bytearray(raw), dtype=self.np.int32))

    def read(self, x):
        return x._array.tobytes()

    def poke(self, x):
        x._array.view(self.np.uint8)[0] ^= 1
        return True

    def address(self, x):
        return x.__array_interface__["data"][0]

    def readonly(self, x):
        return False


def test_numpy_consumer_tries_asarray():
    """NumPy reads an object with only __array_interface__ through np.asarray, sharing it."""
    np = pytest.importorskip("numpy")
    ex = exchange.Exchange(sides.TensorbridgeSide())
    cell = ex.run(_InterfaceSide(np), peers.NumpySide(), "cpu", "direct", "int32")
    assert cell.outcome == "shared", cell
    assert cell.calls == "np.asarray"


def test_numpy_consumer_entry_points_in_order():
    """NumPy's entry points are tried as its users call them: from_dlpack, frombuffer, asarray."""
    pytest.importorskip("numpy")
    side = peers.NumpySide()
    names = [name for name, _ in side.entry_points(bytearray(8))]
    assert names == ["np.frombuffer", "np.asarray"]
    names = [name for name, _ in side.entry_points(side.np.zeros(2))]
    assert names == ["np.from_dlpack", "np.frombuffer", "np.asarray"]


_MIMALLOC = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


@pytest.mark.parametrize("aligned", [True, False])
def test_doctor_allocates_at_the_alignment_it_asks_for(aligned):
    """Producer memory is 64-byte aligned (or, asked, not); only always-aligned sides refuse."""
    producers = [*sides.stdlib_producers(), sides.TensorbridgeSide()]
    with contextlib.suppress(ImportError):
        producers.append(peers.NumpySide())
    ex = exchange.Exchange(sides.TensorbridgeSide())
    for side in producers:
        dtype = side.dtypes()[0] if isinstance(side, sides.Stdlib) else "int32"
        raw = sides.pattern(getattr(tb, dtype))
        for _ in range(5):
            x = ex._make(side, dtype, raw, "cpu", aligned)
            if x is None and aligned and _MIMALLOC and not side.fixed_alignment:
                # Free-threaded CPython allocates with mimalloc, whose size classes put every small
                # object of one size at one offset from 64 bytes: the doctor then says so.
                break
            if x is None:  # only producers whose memory is always aligned refuse to misalign
                assert not aligned and side.fixed_alignment % 64 == 0, side.key
                break
            assert (side.address(x) % 64 == 0) == aligned, side.key
            assert side.read(x) == raw, side.key
            side.release(x)


def _old_numpy(np):
    """A stand-in for NumPy 1.26's DLPack: no max_version, and no read-only export at all."""

    class Old(np.ndarray):
        def __dlpack__(self, stream=None):
            if not self.flags.writeable:
                raise BufferError(
                    "Cannot export readonly array since signalling readonly is unsupported "
                    "by DLPack."
                )
            return np.asarray(self).__dlpack__()

    def from_dlpack(x):
        x.__dlpack__()  # NumPy before 2.1 asks every producer for a legacy capsule first
        return np.from_dlpack(x)

    return types.SimpleNamespace(
        arange=lambda *a, **k: np.arange(*a, **k).view(Old),
        from_dlpack=from_dlpack,
        asarray=np.asarray,
        int32=np.int32,
        __version__="1.26.4",
    )


def test_numpy_readonly_check_passes_on_old_numpy_dlpack():
    """NumPy's own refusal to export read-only arrays by DLPack is reported, not failed."""
    np = pytest.importorskip("numpy")
    side = types.SimpleNamespace(np=_old_numpy(np))
    check = checks.run_check(
        "NumPy read-only arrays import read-only", checks.check_numpy_readonly, {"numpy": side}
    )
    assert check.ok is True, check.detail
    assert "NumPy 1.26.4 refuses to export it by DLPack" in check.detail
    assert "refused as documented" in check.detail
