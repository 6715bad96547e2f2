"""Warnings tensorbridge issues name the user's line, whichever build runs (compiled or source).

A compiled function has no frame, so a fixed ``stacklevel`` names a different line in each build:
the warnings are attributed to the first caller outside the package instead.
"""

from __future__ import annotations

import _thread
import importlib.machinery
import os
import pathlib
import re
import select
import subprocess
import sys
import time
import warnings
import zipfile
from typing import Any

import pytest

import tensorbridge as tb
from tensorbridge._errors import warn_user

UINT8_TEXT = (
    "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead"
)


def _line() -> int:
    """The line of this function's caller."""
    return sys._getframe(1).f_lineno


@pytest.mark.parametrize("name", ["T", "mT"])
def test_zero_d_transpose_warning_names_the_line_that_read_it(name):
    """The 0-d ``T``/``mT`` deprecation warning names this file and the line reading the attribute."""
    s = tb.tensor(5)
    with pytest.warns(UserWarning, match=rf"Tensor\.{name} is deprecated on 0-D tensors") as rec:
        line, _ = _line(), getattr(s, name)
    assert [(w.filename, w.lineno) for w in rec] == [(__file__, line)]


def test_uint8_mask_warning_names_the_indexing_line():
    """PyTorch's uint8-mask warning names the line that indexes or assigns, for reads and writes."""
    x = tb.arange(6).reshape(2, 3)
    mask = tb.tensor([1, 0], dtype=tb.uint8)
    with pytest.warns(UserWarning, match=UINT8_TEXT) as rec:
        line, _ = _line(), x[mask]
    assert [(w.filename, w.lineno) for w in rec] == [(__file__, line)]
    with pytest.warns(UserWarning, match=UINT8_TEXT) as rec:
        x[mask], line = tb.tensor([7, 8, 9]), _line()
    assert [(w.filename, w.lineno) for w in rec] == [(__file__, line)]
    assert x.tolist() == [[7, 8, 9], [3, 4, 5]]


def test_warning_follows_the_filters_and_the_callers_registry():
    """The "default" action shows a warning once per calling line (the caller module's
    ``__warningregistry__``), and "error" raises it, as for ``warnings.warn``."""
    s = tb.tensor(5)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        for _ in range(3):
            _ = s.T
    assert len(rec) == 1 and rec[0].category is UserWarning
    assert rec[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match=r"Tensor\.mT is deprecated"):
            _ = s.mT


def test_warn_user_skips_only_package_frames():
    """Called directly from outside the package, the warning names the calling line itself."""
    with pytest.warns(DeprecationWarning, match="just so") as rec:
        line, _ = _line(), warn_user("just so", DeprecationWarning)
    assert [(w.filename, w.lineno, w.category) for w in rec] == [
        (__file__, line, DeprecationWarning)
    ]


# ---------------------------------------------------------------------------------------------- where the caller's code lives
# One line per kind of warning site: a property (T, mT: `_warn_zero_d`), an indexing read and an
# indexing write (the uint8 mask). Line numbers are 1-based lines of this script.
SITES_SCRIPT = """\
import tensorbridge as tb
s = tb.tensor(5)
x, m = tb.arange(6).reshape(2, 3), tb.tensor([1, 0], dtype=tb.uint8)
s.T
s.mT
x[m]
x[m] = tb.tensor([7, 8, 9])
print("survived", x.tolist())
"""
ZERO_D_T = "Tensor.T is deprecated on 0-D tensors. This function is the identity in these cases."
ZERO_D_MT = "Tensor.mT is deprecated on 0-D tensors. This function is the identity in these cases."
# (line, text) of each site in SITES_SCRIPT, in order.
SITE_LINES = [(4, ZERO_D_T), (5, ZERO_D_MT), (6, UINT8_TEXT + "."), (7, UINT8_TEXT + ".")]
SURVIVED = "survived [[7, 8, 9], [3, 4, 5]]"
# The interactive prompt runs each statement as line 1 of a pseudo-file: "<stdin>", or from Python
# 3.13 one per input ("<stdin>-N" read from a pipe, "<python-input-N>" typed on a terminal; 3.14's
# basic prompt, on a pipe or a terminal without the capabilities the new one needs, "<stdin-N>").
PROMPT_FILE = r"<stdin>(?:-\d+)?|<stdin-\d+>|<python-input-\d+>"
# Typed first at the prompt: every warning shown, however the prompt's own code resets the
# "default" action's registry (Python 3.13's terminal prompt does, between inputs).
SHOW_ALL = "import warnings\nwarnings.simplefilter('always')\n"
CHILD_TIMEOUT = 120.0


def _child_env(**extra: str) -> dict[str, str]:
    """This environment without the variables that change warnings or the prompt, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "PYTHONSTARTUP")}
    return {**env, **extra}


def _shown(output: str, file_pattern: str) -> list[tuple[int, str]]:
    """The (line, text) of every tensorbridge warning shown in ``output`` for a file matching
    ``file_pattern``, as the default ``showwarning`` writes them (``file:line: Category: text``)."""
    texts = "|".join(re.escape(text) for text in {text for _, text in SITE_LINES})
    pattern = rf"(?:{file_pattern}):(\d+): UserWarning: ({texts})"
    return [(int(line), text) for line, text in re.findall(pattern, output.replace("\r", ""))]


def _expected(sites: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """What the "default" action shows of ``sites`` in one file: each (text, line) once, in order."""
    return list(dict.fromkeys(sites))


# Every site typed at the prompt after SHOW_ALL: each statement is line 1 of its input.
AT_PROMPT = [(1, text) for _, text in SITE_LINES]


def _sites_module(directory: pathlib.Path) -> pathlib.Path:
    path = directory / "tb_sites.py"
    path.write_text(SITES_SCRIPT)
    return path


def _sites_zip(directory: pathlib.Path) -> pathlib.Path:
    """A zip archive holding the sites as module ``tb_sites`` (no ``__main__.py``)."""
    archive = directory / "sites.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("tb_sites.py", SITES_SCRIPT)
    return archive


def _place(name: str, directory: pathlib.Path) -> tuple[list[str], str | None, dict[str, str], str]:
    """How to run the sites from ``name``: argv, standard input, environment and the file pattern
    the warnings must name."""
    py = sys.executable
    if name == "-c":
        return [py, "-c", SITES_SCRIPT], None, _child_env(), re.escape("<string>")
    if name == "stdin":
        return [py, "-"], SITES_SCRIPT, _child_env(), re.escape("<stdin>")
    if name == "interactive, piped":
        return [py, "-i", "-q"], SHOW_ALL + SITES_SCRIPT, _child_env(), PROMPT_FILE
    if name == "-m":
        module = _sites_module(directory)
        return [py, "-m", "tb_sites"], None, _child_env(), re.escape(str(module))
    archive = _sites_zip(directory)
    env = _child_env(PYTHONPATH=os.pathsep.join([str(archive), os.environ.get("PYTHONPATH", "")]))
    file = re.escape(str(archive / "tb_sites.py"))
    if name == "zip, -m":
        return [py, "-m", "tb_sites"], None, env, file
    assert name == "zip, imported"
    return [py, "-c", "import tb_sites"], None, env, file


@pytest.mark.parametrize(
    "place", ["-c", "stdin", "interactive, piped", "-m", "zip, -m", "zip, imported"]
)
def test_every_site_warns_wherever_the_callers_code_lives(place, tmp_path):
    """Each kind of site warns, naming the caller's pseudo-file or file and line, from ``python -c``,
    standard input, the interactive interpreter reading a pipe, ``python -m`` (a file and a zip
    archive) and a module imported from a zip archive: never an error from the caller's loader
    (``'__main__' is not a built-in module``, ``loader for tb_sites cannot handle __main__``)."""
    argv, stdin, env, file_pattern = _place(place, tmp_path)
    result = subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    report = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0 and SURVIVED in result.stdout, report
    assert "Traceback" not in result.stderr, report
    expected = AT_PROMPT if file_pattern == PROMPT_FILE else _expected(SITE_LINES)
    assert _shown(result.stderr, file_pattern) == expected, report


def _read_until(master: int, output: bytearray, marker: bytes, count: int, deadline: float) -> None:
    """Read the terminal's output into ``output`` until ``marker`` occurs ``count`` times."""
    while output.count(marker) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"the interpreter did not answer in time: {bytes(output)[-2000:]!r}"
        ready, _, _ = select.select([master], [], [], left)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the interpreter closed the terminal
                chunk = b""
            assert chunk, f"the interpreter exited early: {bytes(output)[-2000:]!r}"
            output += chunk


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal (pty)")
def test_every_site_warns_at_a_real_interactive_prompt(tmp_path):
    """The interactive interpreter on a terminal (a pty, as a person types): each statement is
    typed after the prompt shows, and each site warns, naming the prompt's input and line 1."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-i", "-q"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=_child_env(),
        cwd=tmp_path,
        close_fds=True,
    )
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + CHILD_TIMEOUT
    try:
        statements = [*(SHOW_ALL + SITES_SCRIPT).splitlines(), 'print("typed" + "-all")']
        _read_until(master, output, b">>> ", 1, deadline)
        for n, statement in enumerate(statements, start=2):
            os.write(master, statement.encode() + b"\n")
            _read_until(master, output, b">>> ", n, deadline)
        _read_until(master, output, b"typed-all", 1, deadline)
        os.write(master, b"exit()\n")
        assert proc.wait(timeout=max(deadline - time.monotonic(), 1)) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = output.decode(errors="replace")
    assert SURVIVED in text and "Traceback" not in text, text[-3000:]
    assert _shown(text, PROMPT_FILE) == AT_PROMPT, text[-3000:]


def test_a_filter_applies_at_the_prompt(tmp_path):
    """``-W error`` turns the warning into its exception under ``python -c``, as for any warning."""
    result = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", SITES_SCRIPT],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=_child_env(),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.rstrip().endswith(f"UserWarning: {ZERO_D_T}"), result.stderr[-3000:]


class _RaisingLoader:
    """A loader that cannot give source: ``get_source`` raises something other than ImportError."""

    def get_source(self, name):
        raise RuntimeError(f"no source for {name}")


class _UnreadableLoader:
    """A loader whose every attribute lookup raises (``get_source`` cannot even be looked up)."""

    def __getattr__(self, name):
        raise RuntimeError(f"cannot read {name}")


# Globals that code run by exec, a notebook or an embedding application may have.
ODD_GLOBALS = {
    "the prompt's __main__": lambda: {
        "__name__": "__main__",
        "__loader__": importlib.machinery.BuiltinImporter,
        "__spec__": None,
    },
    "a loader that raises": lambda: {"__name__": "cell", "__loader__": _RaisingLoader()},
    "a loader that cannot be read": lambda: {"__name__": "cell", "__loader__": _UnreadableLoader()},
    "another module's loader": lambda: {
        "__name__": "__main__",
        "__loader__": importlib.machinery.SourceFileLoader("elsewhere", __file__),
        "__spec__": None,
    },
    "no __name__": lambda: {},
}


@pytest.mark.parametrize("filename", ["<exec>", "/nonexistent/ipykernel_0/cell_1.py"])
@pytest.mark.parametrize("kind", list(ODD_GLOBALS))
def test_every_site_warns_from_exec_with_any_globals(kind, filename):
    """Code run by ``exec`` (a string, a notebook cell) warns, naming its file and line, whatever
    its globals hold: no ``__name__``, ``__spec__`` None, a ``__loader__`` that raises or that is
    another module's; and the "default" action keeps its registry in those globals."""
    namespace = ODD_GLOBALS[kind]()
    code = compile(SITES_SCRIPT, filename, "exec")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        exec(code, namespace)
    assert [(w.filename, w.lineno, w.category, str(w.message)) for w in rec] == [
        (filename, line, UserWarning, text) for line, text in _expected(SITE_LINES)
    ]
    assert isinstance(namespace["__warningregistry__"], dict)
    assert namespace["x"].tolist() == [[7, 8, 9], [3, 4, 5]]


def test_a_thread_with_no_caller_outside_the_package_still_warns():
    """A thread that runs a tensorbridge function alone (no frame of the caller's, none at all in
    the compiled build) gets the warning, not an exception."""
    s = tb.tensor(5)
    unraisable: list[Any] = []
    old_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            before = _thread._count()
            # The property's getter called from C by the new thread: no Python frame of a caller.
            _thread.start_new_thread(type(s).T.fget, (s,))
            deadline = time.monotonic() + 30
            while not (rec or unraisable) or _thread._count() > before:
                assert time.monotonic() < deadline, "the thread did not finish"
                time.sleep(0.01)
    finally:
        sys.unraisablehook = old_hook
    assert not unraisable, [u.exc_value for u in unraisable]
    assert [(w.category, str(w.message)) for w in rec] == [(UserWarning, ZERO_D_T)]
