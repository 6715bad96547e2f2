"""Which build runs: `tb.build_info()`, the import switch ``TENSORBRIDGE_NO_EXTENSIONS`` and the
record the build writes. The same tests pass on a source checkout, an editable install (pure
Python) and a compiled install: each compares what the report says with what is really loaded."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import tomllib
from pathlib import Path

import pytest

import tensorbridge as tb
from tensorbridge import _build, _storage

from .conftest import run_in_subprocess

_EXT = tuple(importlib.machinery.EXTENSION_SUFFIXES)

# Imports the package and every private module, then prints the build and each module's file.
_REPORT = """
import importlib, json, os, pkgutil, sys
import tensorbridge as tb
from tensorbridge import _native
names = [m.name for m in pkgutil.iter_modules(tb.__path__) if m.name.startswith("_")]
for name in names:
    # The module that exists only compiled (_native_c) has no .py file to fall back to.
    if name != "__main__" and os.path.exists(os.path.join(tb.__path__[0], name + ".py")):
        importlib.import_module("tensorbridge." + name)
info = tb.build_info()
files = {n.rpartition(".")[2]: m.__file__ for n, m in sys.modules.items()
         if n.startswith("tensorbridge.") and getattr(m, "__file__", None)}
print("RESULT " + json.dumps({"kind": info.kind, "modules": list(info.modules),
                              "cython": info.cython, "reason": info.reason, "files": files,
                              "native_compiled": _native.COMPILED}))
"""


def _child_report(env: dict[str, str] | None = None) -> dict:
    proc = run_in_subprocess(_REPORT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _recorded() -> list[str]:
    record = _build._read_record()
    return list(record.get("compiled") or [])


def test_build_info_names_exactly_the_loaded_extension_modules():
    """build_info() lists the modules whose loaded file is an extension module, and no other."""
    report = _child_report({_build.DISABLE_VARIABLE: ""})
    compiled = sorted(n for n, f in report["files"].items() if f.endswith(_EXT))
    assert report["modules"] == compiled
    assert report["kind"] == ("compiled" if compiled else "pure-python")
    assert (report["cython"] is not None) == bool(compiled)
    assert set(compiled) == set(_recorded())  # every module the build compiled is the one loaded
    assert report["native_compiled"] == ("_native_c" in compiled)  # the native layer's twin


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: set on classes made by a class statement, not on C types


def test_a_compiled_storage_module_read_its_declarations():
    """Compiled, `_storage` is built with its .pxd: the storages are C types (their fields in C),
    and the .pxd ships beside the module; from source they are Python classes."""
    classes = (_storage.Storage, _storage.BufferStorage, _storage.DLPackStorage)
    heap = [bool(cls.__flags__ & _HEAP_TYPE) for cls in classes]
    if "_storage" in tb.build_info().modules:
        assert heap == [False, False, False]
        assert Path(_storage.__file__).with_name("_storage.pxd").is_file()
    else:
        assert heap == [True, True, True]


def test_tensor_fields_are_a_c_type_exactly_when_compiled():
    """Compiled, a tensor's fields are C struct members of `TensorFields`; `Tensor` stays a Python
    class on top of it in both builds (it gets every special method a Python class gets)."""
    from tensorbridge._fields import TensorFields
    from tensorbridge._tensor import Tensor

    compiled = "_fields" in tb.build_info().modules
    assert bool(TensorFields.__flags__ & _HEAP_TYPE) is not compiled
    assert Tensor.__flags__ & _HEAP_TYPE


def test_a_compiled_module_runs_with_every_module_it_cimports_compiled():
    """A module whose .pxd cimports another fetches that module's C types when it is imported: the
    build ships it compiled only if the other is compiled too."""
    package = Path(tb.__file__).parent
    compiled = set(tb.build_info().modules)
    assert not compiled or "_native_c" in compiled  # every compiled module is built over it
    for name in compiled:
        pxd = package / f"{name}.pxd"
        if not pxd.is_file():
            continue
        for line in pxd.read_text(encoding="utf-8").splitlines():
            if line.startswith("from tensorbridge.") and " cimport " in line:
                needed = line.split()[1].rpartition(".")[2]
                assert needed in compiled, (name, needed)


@pytest.mark.parametrize("value", ["1", "yes"])
def test_no_extensions_variable_runs_every_module_from_source(value):
    """TENSORBRIDGE_NO_EXTENSIONS set at import time loads only .py files and says so."""
    report = _child_report({_build.DISABLE_VARIABLE: value})
    assert report["kind"] == "pure-python"
    assert report["modules"] == []
    assert report["cython"] is None
    assert all(f.endswith((".py", ".pyc")) for f in report["files"].values()), report["files"]
    assert not report["native_compiled"]  # the native layer is `_native_py`: ctypes and struct
    if _recorded():
        assert report["reason"] == "TENSORBRIDGE_NO_EXTENSIONS is set"


def test_no_extensions_variable_zero_keeps_the_compiled_modules():
    """TENSORBRIDGE_NO_EXTENSIONS=0 does not switch the compiled modules off."""
    report = _child_report({_build.DISABLE_VARIABLE: "0"})
    assert report["modules"] == sorted(_recorded())


def test_the_main_interpreter_is_not_routed():
    """Only TENSORBRIDGE_NO_EXTENSIONS or a subinterpreter (tests/test_interpreters.py) routes an
    interpreter to the .py files; this one is the main interpreter."""
    assert _build.in_subinterpreter() is False
    assert _build.source_reason() == (
        "TENSORBRIDGE_NO_EXTENSIONS is set" if _build.disabled() else None
    )


def test_this_process_runs_the_build_it_reports():
    """In this process too, each listed module's file is an extension module."""
    info = tb.build_info()
    for name in info.modules:
        module = importlib.import_module(f"tensorbridge.{name}")
        assert module.__file__.endswith(_EXT)
    assert info.kind == ("compiled" if info.modules else "pure-python")


def test_route_to_source_prefers_the_py_file_over_an_extension(tmp_path):
    """route_to_source makes a package import its .py file where an extension file sits beside it."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("WHERE = 'source'\n")
    # Not a loadable library: importing it as an extension fails, so a passing import proves
    # that the source loader was chosen.
    (package / f"mod{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"not a library")
    code = f"""
    import sys
    sys.path.insert(0, {str(tmp_path)!r})
    import pkg
    try:
        import pkg.mod
    except ImportError:
        print("EXTENSION CHOSEN")
    else:
        raise SystemExit("the extension file was not preferred: the test proves nothing")
    sys.modules.pop("pkg.mod", None)
    from tensorbridge import _build
    _build.route_to_source(pkg.__path__)
    import pkg.mod
    print(pkg.mod.WHERE, pkg.mod.__file__.endswith(".py"))
    """
    proc = run_in_subprocess(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["EXTENSION", "CHOSEN", "source", "True"]


def test_build_info_without_a_record_says_not_built(monkeypatch, tmp_path):
    """With no build record (a checkout or an editable install) the build is pure Python, not built."""
    monkeypatch.setattr(_build, "_RECORD", tmp_path / "missing.json")
    info = _build.build_info()
    assert info == _build.BuildInfo(
        "pure-python", (), None, "not built (a source checkout or an editable install)"
    )
    assert str(info) == "pure-python: not built (a source checkout or an editable install)"


def test_build_info_reports_the_reason_the_build_recorded(monkeypatch, tmp_path):
    """A build that compiled nothing reports the reason it recorded."""
    record = tmp_path / "record.json"
    reason = "TENSORBRIDGE_NO_EXTENSIONS was set when the package was built"
    record.write_text(json.dumps({"compiled": [], "cython": None, "failed": {}, "reason": reason}))
    monkeypatch.setattr(_build, "_RECORD", record)
    assert _build.build_info() == _build.BuildInfo("pure-python", (), None, reason)


def test_build_info_when_recorded_modules_do_not_load(monkeypatch, tmp_path):
    """A record that lists modules without their extension files reports that they did not load."""
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"compiled": ["_no_such_module"], "cython": "3.3.1"}))
    monkeypatch.setattr(_build, "_RECORD", record)
    monkeypatch.setattr(_build, "_routed", [])
    info = _build.build_info()
    assert info == _build.BuildInfo("pure-python", (), None, "the compiled modules did not load")


def test_build_info_str_of_a_compiled_build():
    """str() of a compiled build names Cython's version, the module count and what failed."""
    info = _build.BuildInfo("compiled", ("_dlpack", "_tensor"), "3.3.1", "not compiled: _format")
    assert str(info) == "compiled (Cython 3.3.1; 2 modules): not compiled: _format"


def test_build_info_is_public():
    """tb.build_info is exported and returns a frozen BuildInfo."""
    assert "build_info" in tb.__all__
    info = tb.build_info()
    assert isinstance(info, _build.BuildInfo)
    with pytest.raises(AttributeError):
        info.kind = "compiled"  # type: ignore[misc]


def _setup_script() -> dict:
    """The definitions of the checkout's setup.py, without running `setup()`, read from its own
    directory (SOURCE is relative to it); skipped where the tests run without the checkout."""
    script = Path(__file__).resolve().parents[1] / "setup.py"
    if not script.is_file():
        pytest.skip("setup.py is not beside the tests")
    pytest.importorskip("setuptools")  # a fresh virtual environment of Python 3.12+ has none
    source = script.read_text(encoding="utf-8")
    namespace: dict = {"__name__": "tensorbridge_setup", "__file__": str(script)}
    cwd = Path.cwd()
    try:
        os.chdir(script.parent)
        exec(compile(source[: source.rindex("\nsetup(")], str(script), "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace


def test_the_build_takes_only_the_cython_versions_pyproject_asks_for():
    """A build without isolation takes whatever Cython is installed: the build checks the version
    against pyproject.toml's own requirement and ships pure Python outside it (Cython 3.3.0 was
    seen to build modules that crash on a tensor's first view)."""
    setup = _setup_script()
    pyproject = tomllib.loads(
        (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    )
    [spec] = [r for r in pyproject["build-system"]["requires"] if r.lower().startswith("cython")]
    assert setup["_cython_range"]()[0] == spec
    low, high = setup["_cython_range"]()[1:]
    assert low <= (3, 3, 1) < high  # the version the compiled build is measured and tested with
    for version in ("3.3.0", "3.2.4", "0.29.37", "3.4.0", "4.0.0a1"):
        reason = setup["_unsupported_cython"](version)
        assert reason is not None and f"Cython {version} is installed" in reason, version
        assert spec in reason and "build isolation" in reason
    for version in ("3.3.1", "3.3.2rc1"):
        assert setup["_unsupported_cython"](version) is None, version
    assert setup["_version"]("3.3.1rc2") == (3, 3, 1)


def test_the_build_reads_each_modules_cimports_from_its_pxd():
    setup = _setup_script()
    assert setup["CIMPORTS"]["_tensor"] == {"_fields"}
    assert setup["CIMPORTS"]["_dlpack_export"] == {"_fields", "_storage"}
    assert setup["CIMPORTS"]["_dlpack"] == {"_fields", "_storage", "_tensor"}
    assert setup["CIMPORTS"]["_storage"] == {"_layout"}
    assert setup["CIMPORTS"]["_fields"] == set()


def test_the_build_ships_as_py_every_module_that_cimports_one_shipped_as_py(tmp_path):
    """`_fields` failing to compile takes `_tensor` and `_dlpack_export` (which cimport it) with
    it; `_layout` failing takes `_storage`, and with it `_dlpack_export`; a module that nothing
    cimports takes nothing with it."""
    setup = _setup_script()

    class Ext:
        def __init__(self, name: str) -> None:
            self.name = f"tensorbridge.{name}"

    names = ["_fields", "_storage", "_tensor", "_dlpack_export", "_layout"]
    for failing, dropped in [
        ("_fields", {"_tensor", "_dlpack_export"}),
        ("_storage", {"_dlpack_export"}),
        ("_layout", {"_storage", "_dlpack_export"}),
        ("_dlpack_export", set()),
    ]:
        build = setup["BuildExt"].__new__(setup["BuildExt"])
        build.extensions = [Ext(n) for n in names]
        build.untranslated = {}
        build.failed = {f"tensorbridge.{failing}": "the C compiler failed"}
        for n in names:  # each compiled output exists until it is dropped
            (tmp_path / f"{n}.so").write_bytes(b"")
        build.get_ext_fullpath = lambda full, d=tmp_path: str(d / f"{full.rpartition('.')[2]}.so")
        build._drop_dependents()
        got = {k.rpartition(".")[2] for k in build.failed} - {failing}
        assert got == dropped, failing
        assert {p.stem for p in tmp_path.glob("*.so")} == set(names) - dropped
        for name in dropped:
            assert "cimports" in build.failed[f"tensorbridge.{name}"]


def test_a_module_cython_fails_on_ships_no_extension_an_earlier_build_left(tmp_path):
    """A Cython failure ships the module as .py: an extension module of it that an earlier build
    left in build/ must not be installed in its place (it would be stale code)."""
    setup = _setup_script()

    class Ext:
        def __init__(self, name: str) -> None:
            self.name = f"tensorbridge.{name}"
            self.sources = [f"{name}.py"]

    def cythonize(extensions, **_options):
        if extensions[0].name.endswith("_broken"):
            raise RuntimeError("Cython failed")
        return extensions

    build = setup["BuildExt"].__new__(setup["BuildExt"])
    build.extensions = [Ext("_broken"), Ext("_fine")]
    build.build_temp = str(tmp_path / "temp")
    build.get_ext_fullpath = lambda full, d=tmp_path: str(d / f"{full.rpartition('.')[2]}.so")
    for name in ("_broken", "_fine"):
        (tmp_path / f"{name}.so").write_bytes(b"an earlier build")
    translated = build._cythonize(cythonize)
    assert [ext.name for ext in translated] == ["tensorbridge._fine"]
    assert set(build.untranslated) == {"_broken"}
    assert not (tmp_path / "_broken.so").exists()
    assert (tmp_path / "_fine.so").exists()
