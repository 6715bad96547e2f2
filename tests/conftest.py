"""Shared test configuration: hypothesis profiles, the layout matrix, and a subprocess runner."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import textwrap
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100)
settings.register_profile(
    "ci",
    max_examples=500,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# A free-threaded CPython (built without the GIL; PEP 703).
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
# Seconds a stress's collector thread waits between two collections: none with a GIL (the switch
# interval shares the time), a millisecond without one, where each collection stops every thread
# and collections back to back leave the workers almost no time to run.
COLLECT_PAUSE = 0.001 if FREE_THREADED else 0.0
# Free-threaded CPython 3.13 makes each class created after a second thread first started
# immortal (its free-threading HOWTO, "Immortalization"; 3.14 no longer does): such a class never
# dies, whatever holds it, so a test cannot watch one die there (pytest's workers start threads).
CLASSES_IMMORTAL = FREE_THREADED and sys.version_info < (3, 14)
needs_mortal_classes = pytest.mark.skipif(
    CLASSES_IMMORTAL,
    reason="free-threaded CPython 3.13 never frees a class made after a thread started",
)


def native_twins() -> list[Any]:
    """The twins of the native layer that can run here: `_native_py` always, and `_native_c`
    where the compiled build is installed and not switched off."""
    from tensorbridge import _native, _native_py

    return [_native_py] if _native.twin is _native_py else [_native_py, _native.twin]


def run_in_subprocess(
    code: str, timeout: float = 120.0, env: dict[str, str] | None = None, cwd: object = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, so that a crash fails the test instead of killing the run.

    ``env`` adds to (or overrides) this process's environment.
    """
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
        cwd=cwd,
        check=False,
    )


@pytest.fixture
def subprocess_run():
    """The `run_in_subprocess` helper as a fixture."""
    return run_in_subprocess


def run_script_for_result(
    code: str, directory: pathlib.Path, timeout: float = 300.0, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run ``code`` as a script in a fresh interpreter; the process and the JSON of its last
    ``RESULT `` line.

    The code runs from a file as ``__main__``, so that worker processes it starts (spawn,
    forkserver, Dask, Ray) can import it; the child must exit 0 and print a result.
    """
    script = directory / "child_checks.py"
    script.write_text(code)
    result = run_in_subprocess(
        f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
        timeout=timeout,
        env=env,
        cwd=directory,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads(lines[-1][len("RESULT ") :])


def _layout_cases():
    """(name, builder) pairs: each builder returns a tensorbridge tensor with a distinctive layout."""
    import tensorbridge as tb

    def base(n=24, dtype=None):
        return tb.arange(n, dtype=dtype or tb.int32)

    return {
        "c_order": lambda: base().reshape(2, 3, 4),
        "f_order": lambda: base().reshape(4, 3, 2).permute(2, 1, 0),
        "sliced": lambda: base().reshape(4, 6)[1:3, ::2],
        "negative_step": lambda: base().reshape(4, 6)[::-1, ::-2],
        "zero_d": lambda: base()[5],
        "empty": lambda: base().reshape(4, 6)[:, 6:],
        "size1_odd_stride": lambda: base().as_strided((3, 1), (2, 7)),
        "broadcast": lambda: base(4).reshape(1, 4).expand(3, 4),
        "offset": lambda: base()[7:],
    }


@pytest.fixture(
    params=[
        "c_order",
        "f_order",
        "sliced",
        "negative_step",
        "zero_d",
        "empty",
        "size1_odd_stride",
        "broadcast",
        "offset",
    ]
)
def layout(request):
    """A tensorbridge tensor of each layout in the matrix."""
    return request.param, _layout_cases()[request.param]()


# -------------------------------------------------------------------------------------------------
# DLPack: the crafted producer and the counting exporter of `tensorbridge.testing`.
# -------------------------------------------------------------------------------------------------


@pytest.fixture
def crafted():
    """The `CraftedDLPack` class: ctypes-built DLPack producers with counted deleter calls."""
    from tensorbridge.testing import CraftedDLPack

    stray = CraftedDLPack.stray
    yield CraftedDLPack
    found, CraftedDLPack.stray = CraftedDLPack.stray - stray, stray
    assert found == 0, f"{found} deleter call(s) for managed tensors already released"


@pytest.fixture
def counting_exporter():
    """The `CountingExporter` class: counts a consumer's calls of tensorbridge's deleter."""
    from tensorbridge.testing import CountingExporter

    yield CountingExporter
    stray, CountingExporter.stray_calls = CountingExporter.stray_calls, 0
    assert stray == 0, f"{stray} deleter call(s) for capsules already released"
