"""Build script for tensorbridge: the pure-Python package, plus an optional compiled build.

Everything about the project (name, version, dependencies, extras, console script) is declared in
pyproject.toml; this script adds only what setuptools cannot declare there:

* **The compiled build.** A non-editable install (``pip install .``, a wheel) compiles the modules
  in ``COMPILED`` with Cython in pure-Python mode, from the same ``.py`` files that ship beside the
  extension modules. A ``.pxd`` beside a module holds C declarations for its compiled build only
  (extension types, C functions); the ``.py`` stays the one source. Compiling is optional: with no
  Cython, no C compiler or Python headers, on an interpreter other than CPython, with
  ``TENSORBRIDGE_NO_EXTENSIONS`` set (to anything but ``0``), or when one module fails to compile,
  the build warns and ships that module (or every module) as pure Python, together with every
  module whose ``.pxd`` cimports it. It never fails because of the compiled build.
* **Editable installs stay pure Python.** ``pip install -e .`` compiles nothing, so no extension
  module can shadow a ``.py`` file that a developer edits.
* **What was built** is recorded in ``tensorbridge/_build_record.json`` (read by
  ``tensorbridge.build_info()``).
* **The benchmark scripts** in ``benchmarks/`` ship inside the wheel as ``tensorbridge/_benchmarks``
  (``python -m tensorbridge bench`` runs them; from a checkout it finds ``benchmarks/`` directly).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
import threading
import time
import tomllib
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

PACKAGE = "tensorbridge"
SOURCE = Path("src") / PACKAGE
RECORD = "_build_record.json"
DISABLE_VARIABLE = "TENSORBRIDGE_NO_EXTENSIONS"

# The compiled modules: those on the per-call paths (`from_dlpack`, `asarray`, `frombuffer`,
# `__dlpack__`, `to_dlpack`, a tensor's construction and death), where compiling pays; every other
# module ships as Python. Measured with callgrind (instructions per call, every module compiled
# against these only; docs/guide/compiled.md): the other modules saved nothing measurable on those
# calls while costing about two thirds of the C compiler's time. A module with a `.pxd` must be here
# together with every module its `.pxd` cimports. Never compiled: `__init__` and `_build` (they
# route imports to the .py files when TENSORBRIDGE_NO_EXTENSIONS is set, before any compiled module
# loads) and `_native_py` (the native layer's pure-Python twin).
COMPILED = sorted(
    {
        "_args",
        "_buffer",
        "_cache",
        "_convert",
        "_device",
        "_dlpack",
        "_dlpack_c",
        "_dlpack_export",
        "_dtype",
        "_errors",
        "_exports",
        "_fields",
        "_layout",
        "_native",
        "_storage",
        "_tensor",
    }
)
# The native layer's compiled twin, `_native_c.pyx` (`_native` chooses it over `_native_py`): the
# only module that exists only compiled. It declares DLPack's structs from include/dlpack/dlpack.h.
# Every other compiled module is built over it, so none ships compiled without it (the pure twin
# allocates a tensor as `object.__new__` does, which a compiled `TensorFields` refuses).
NATIVE = "_native_c"
INCLUDE = ["include"]


def _cimports(name: str) -> set[str]:
    """The modules whose extension types ``name``'s ``.pxd`` cimports. Compiled, ``name`` fetches
    those types when it is imported, so it can ship compiled only if they do."""
    pxd = SOURCE / f"{name}.pxd"
    text = pxd.read_text(encoding="utf-8") if pxd.exists() else ""
    return set(re.findall(rf"^from {PACKAGE}\.(\w+) cimport ", text, flags=re.MULTILINE))


CIMPORTS = {name: _cimports(name) for name in COMPILED}

# Cython directives for every compiled module (the one place they are set):
#   annotation_typing=False: annotations are documentation, never run-time type checks; Cython
#       would otherwise reject, for example, PyTorch's metaclass instances where `type` is annotated.
#   binding=True: functions keep signatures and attributes (inspect.signature works on them).
#   language_level=3: Python 3 semantics (the source's own).
#   infer_types=False: every local stays a Python object; with inference, `b = bytearray(n)` makes
#       `b[0::2] = some_bytes` raise TypeError and `l = [...]` rejects `l[0::2] = map(...)`.
#   nonecheck=True: a typed local or argument that holds None raises AttributeError (as the .py
#       does) instead of reading through NULL, so no value Python code can hand in or leave behind
#       (a tensor whose private `_storage` was cleared) makes compiled code crash; one compare per
#       typed access.
#   binding=True, embedsignature=False: compiled functions are Cython's function objects, which
#       carry their signature (`inspect.signature`, `help()`) as Python functions do; an embedded
#       signature line would make `help()` show it twice.
#   freethreading_compatible=True: on free-threaded CPython each module declares that it runs
#       without the GIL (Py_mod_gil), so importing tensorbridge does not turn the GIL back on. It is
#       true of every module: their shared tables are dictionaries and lists (each operation atomic
#       on either interpreter) or take a lock (`_exports`' reap, `_shared`'s segments); the C
#       globals of `_native_c` are written once, while the module is imported; and a tensor's fields
#       are written only while it is built (the tests under tests/test_free_threading.py run many
#       threads over each of them). It has no effect on an interpreter with a GIL.
DIRECTIVES = {
    "language_level": 3,
    "infer_types": False,
    "annotation_typing": False,
    "binding": True,
    "embedsignature": False,
    "nonecheck": True,
    "freethreading_compatible": True,
}
# C compiler flags after the interpreter's own (the later flag wins), for gcc and clang: no
# debugging information (Python's flags ask for it; it was a fifth of the compiler's time) and -O2
# (a third less compile time than -O3, the same instructions per call on the hot paths).
UNIX_FLAGS = ["-g0", "-O2"]
# Per-module additions to DIRECTIVES (none needed so far).
MODULE_DIRECTIVES: dict[str, dict[str, object]] = {}


def _version(text: str) -> tuple[int, ...]:
    """The release numbers of a version string: "3.3.1" and "3.3.1rc2" give (3, 3, 1)."""
    match = re.match(r"\d+(\.\d+)*", text.strip())
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def _cython_range() -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """The Cython versions the compiled build is made with: the ``Cython>=LOW,<HIGH`` of
    pyproject.toml's ``[build-system] requires``, as (the spec, LOW, HIGH). pip enforces it in an
    isolated build; a build without isolation (``pip install --no-build-isolation .``) takes
    whatever Cython is installed, so `BuildExt` checks it too: Cython 3.3.0 was seen to build
    modules that crash on the first view of a tensor (Python 3.12)."""
    with (Path(__file__).resolve().parent / "pyproject.toml").open("rb") as f:
        requires = tomllib.load(f)["build-system"]["requires"]
    [spec] = [r for r in requires if re.match(r"cython\b", r, re.IGNORECASE)]
    low = re.search(r">=\s*([\w.]+)", spec)
    high = re.search(r"<\s*([\w.]+)", spec)
    if low is None or high is None:
        msg = f"pyproject.toml: the Cython requirement {spec!r} needs a >= and a < bound"
        raise ValueError(msg)
    return spec, _version(low.group(1)), _version(high.group(1))


def _unsupported_cython(version: str) -> str | None:
    """Why the installed Cython ``version`` may not build the compiled modules, or None."""
    spec, low, high = _cython_range()
    if low <= _version(version) < high:
        return None
    return (
        f"Cython {version} is installed, and the compiled build needs {spec} (pyproject.toml): "
        f"install such a Cython, or build with pip's default build isolation"
    )


def _disabled_reason(editable: bool) -> str | None:
    """Why this build compiles nothing, or None when it compiles."""
    if editable:
        return "editable install (the .py files are run, so edits take effect)"
    if os.environ.get(DISABLE_VARIABLE, "") not in ("", "0"):
        return f"{DISABLE_VARIABLE} was set when the package was built"
    if platform.python_implementation() != "CPython":
        return f"{platform.python_implementation()} is not CPython"
    return None


def _warn(message: str) -> None:
    print(f"WARNING: tensorbridge: {message}", file=sys.stderr, flush=True)


class BuildPy(build_py):
    """Ships ``benchmarks/`` as ``tensorbridge/_benchmarks`` in a wheel."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # the checkout's benchmarks/ is found directly
            return
        target = Path(self.build_lib) / PACKAGE / "_benchmarks"
        target.mkdir(parents=True, exist_ok=True)
        for script in sorted(Path("benchmarks").glob("*.py")):
            shutil.copyfile(script, target / script.name)
        reason = _disabled_reason(editable=False)
        if reason is not None:  # no extension declared (a pure wheel): build_ext does not run
            _warn(f"building pure Python only: {reason}")
            _write_record(
                self.build_lib, {"compiled": [], "cython": None, "failed": {}, "reason": reason}
            )


class BuildExt(build_ext):
    """Compiles what it can, ships pure Python for the rest, and records which is which."""

    def run(self) -> None:
        reason = _disabled_reason(self.editable_mode)
        cython_version = None
        if reason is None:
            try:
                import Cython
                from Cython.Build import cythonize
            except ImportError:
                reason = "Cython is not installed"
            else:
                reason = _unsupported_cython(Cython.__version__)
            if reason is None:
                cython_version = Cython.__version__
                self.progress = _Progress(len(self.extensions), _cores())
                self.progress.say(
                    f"compiling {len(self.extensions)} modules with Cython on "
                    f"{self.progress.cores} cores ({DISABLE_VARIABLE}=1 installs pure Python instead)"
                )
                self.extensions = self._cythonize(cythonize)
                # The largest first, on every core: the last to finish is a small one.
                self.extensions.sort(key=lambda e: -Path(e.sources[0]).stat().st_size)
                if self.parallel is None:
                    self.parallel = self.progress.cores
        if reason is not None:
            self.extensions = []
            if self.editable_mode:
                print(f"tensorbridge: pure Python: {reason}", file=sys.stderr)
            else:
                _warn(f"building pure Python only: {reason}")
        self.failed: dict[str, str] = {}
        if self.extensions:
            try:
                super().run()
            except Exception as exc:  # no compiler at all (DistutilsPlatformError and kin)
                self.failed.update({e.name: _one_line(exc) for e in self.extensions})
                reason = f"the C compiler could not run: {_one_line(exc)}"
            self._drop_dependents()
        if not self.editable_mode:
            self._record(reason, cython_version)

    def _cythonize(self, cythonize: object) -> list[Extension]:
        """The extensions whose module Cython translates; a failure leaves that module .py."""
        build_dir = str(Path(self.build_temp) / "cython")
        translated = []
        self.untranslated: dict[str, str] = {}
        for ext in self.extensions:  # finalized by setuptools: only the sources change
            name = ext.name.rpartition(".")[2]
            directives = {**DIRECTIVES, **MODULE_DIRECTIVES.get(name, {})}
            try:
                [result] = cythonize(  # type: ignore[operator]
                    [Extension(ext.name, list(ext.sources))],
                    compiler_directives=directives,
                    build_dir=build_dir,
                    quiet=True,
                )
            except Exception as exc:  # Cython's CompileError: ship this module as .py
                self.untranslated[name] = _one_line(exc)
                _warn(f"{name}.py is shipped uncompiled: Cython failed on it")
                # Nor does an extension module an earlier build left in build/ ship in its place.
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
                continue
            ext.sources = list(result.sources)
            translated.append(ext)
        return translated

    def build_extension(self, ext: Extension) -> None:
        if self.compiler.compiler_type == "unix":  # gcc or clang (MSVC takes other flags)
            ext.extra_compile_args = [*ext.extra_compile_args, *UNIX_FLAGS]
        try:
            super().build_extension(ext)
        except Exception as exc:  # a compiler error in one module: ship it as .py
            self.failed[ext.name] = _one_line(exc)
            _warn(f"{ext.name} is shipped uncompiled: the C compiler failed: {_one_line(exc)}")
            output = Path(self.get_ext_fullpath(ext.name))
            output.unlink(missing_ok=True)
        progress = getattr(self, "progress", None)
        if progress is not None:
            progress.done_one(ext.name.rpartition(".")[2])

    def _drop_dependents(self) -> None:
        """Ship as .py every compiled module that cimports one shipped as .py (transitively)."""
        uncompiled = set(getattr(self, "untranslated", {}))
        uncompiled.update(name.rpartition(".")[2] for name in self.failed)
        if NATIVE in uncompiled:  # nothing is built over a native layer that was not built
            for ext in self.extensions:
                name = ext.name.rpartition(".")[2]
                if name not in uncompiled:
                    self.failed[ext.name] = f"{NATIVE} is shipped uncompiled"
                    _warn(f"{ext.name} is shipped uncompiled: {self.failed[ext.name]}")
                    Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            return
        changed = True
        while changed:
            changed = False
            for ext in self.extensions:
                name = ext.name.rpartition(".")[2]
                missing = sorted(CIMPORTS.get(name, set()) & uncompiled)
                if name in uncompiled or not missing:
                    continue
                self.failed[ext.name] = f"cimports {', '.join(missing)}, which is shipped as .py"
                _warn(f"{ext.name} is shipped uncompiled: {self.failed[ext.name]}")
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
                uncompiled.add(name)
                changed = True

    def _record(self, reason: str | None, cython_version: str | None) -> None:
        """Write what was compiled into the package, for `tensorbridge.build_info()`."""
        failed = {**getattr(self, "untranslated", {})}
        failed.update({k.rpartition(".")[2]: v for k, v in getattr(self, "failed", {}).items()})
        compiled = [e.name.rpartition(".")[2] for e in self.extensions]
        compiled = [name for name in compiled if name not in failed]
        record = {
            "compiled": compiled,
            "cython": cython_version if compiled else None,
            "failed": failed,
            "reason": reason,
        }
        _write_record(self.build_lib, record)

    def get_outputs(self) -> list[str]:
        failed = {f"{PACKAGE}.{name}" for name in getattr(self, "failed", {})}
        return [self.get_ext_fullpath(e.name) for e in self.extensions if e.name not in failed]


def _cores() -> int:
    """The cores this process may run on (a container's share, where the OS says it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Progress:
    """The compiled build's progress, where the user sees it. pip shows a build's own output only
    with ``-v`` or on failure, so each line also goes to the terminal pip runs in, when there is
    one (``/dev/tty``); with no terminal (CI, a redirected pip) the lines go to stderr only."""

    def __init__(self, total: int, cores: int) -> None:
        self.total = total
        self.cores = cores
        self.done = 0
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.tty = None
        if not sys.stderr.isatty():  # a terminal of its own would show stderr already
            try:
                self.tty = open("/dev/tty", "w", encoding="utf-8")  # noqa: SIM115 (kept open)
                self.tty.write("\n")  # off the line of pip's "Building wheel ... -"
            except OSError:  # no controlling terminal, or not a POSIX system
                self.tty = None

    def say(self, text: str) -> None:
        """One line, to stderr and to the terminal (each on a line of its own there: pip's spinner
        writes at the end of the line the cursor is on)."""
        line = f"tensorbridge: {text}"
        with self.lock:
            print(line, file=sys.stderr, flush=True)
            if self.tty is not None:
                try:
                    self.tty.write(f"\r{line}\x1b[K\n")
                    self.tty.flush()
                except OSError:
                    self.tty = None

    def done_one(self, name: str) -> None:
        with self.lock:
            self.done += 1
            done = self.done
        self.say(f"compiled {done}/{self.total}: {name} ({time.monotonic() - self.start:.0f} s)")


def _write_record(build_lib: str, record: dict[str, object]) -> None:
    target = Path(build_lib) / PACKAGE / RECORD
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


setup(
    # Placeholders: BuildExt replaces their sources with the Cython-translated modules. None where
    # the build is pure Python anyway, so that the wheel is tagged for any platform (py3-none-any).
    ext_modules=[]
    if _disabled_reason(editable=False) is not None
    else [Extension(f"{PACKAGE}.{name}", [str(SOURCE / f"{name}.py")]) for name in COMPILED]
    + [Extension(f"{PACKAGE}.{NATIVE}", [str(SOURCE / f"{NATIVE}.pyx")], include_dirs=INCLUDE)],
    cmdclass={"build_py": BuildPy, "build_ext": BuildExt},
)
