"""Which build of tensorbridge runs: the compiled modules (Cython) or the pure-Python package.

A non-editable install compiles the hot modules from the same ``.py`` files, which ship beside the
extension modules (see setup.py). Setting ``TENSORBRIDGE_NO_EXTENSIONS`` (to anything but ``0``)
before ``import tensorbridge`` runs the ``.py`` files instead: `route_to_source` makes the package's
submodule imports skip the extension modules. A subinterpreter is routed so on its own
(`source_reason`): the compiled modules keep process-wide state, so CPython refuses them in an
interpreter with its own GIL and Cython in any second interpreter; each interpreter has its own
import system, so the main one keeps the compiled build. This module is never compiled and
imports nothing of tensorbridge, so the package can import it before any other submodule.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    FileFinder,
    SourceFileLoader,
    SourcelessFileLoader,
)
from importlib.util import find_spec
from pathlib import Path
from typing import Final

__all__ = [
    "DISABLE_VARIABLE",
    "BuildInfo",
    "build_info",
    "disabled",
    "in_subinterpreter",
    "route_to_source",
    "source_reason",
]

DISABLE_VARIABLE: Final = "TENSORBRIDGE_NO_EXTENSIONS"
_PACKAGE: Final = __name__.rpartition(".")[0]
_RECORD: Final = Path(__file__).with_name("_build_record.json")
_routed: list[str] = []  # the package directories route_to_source has routed
_SUBINTERPRETER_REASON: Final = (
    "a subinterpreter (the compiled modules load in the main interpreter only)"
)


@dataclass(frozen=True)
class BuildInfo:
    """The build that runs, as `tensorbridge.build_info()` reports it.

    Attributes:
        kind: ``"compiled"`` when at least one compiled module is loaded, else ``"pure-python"``.
        modules: the package's modules that run compiled (``"_dlpack"``, ...), sorted.
        cython: the Cython version the compiled modules were built with, or None.
        reason: why the build is pure Python (or which modules did not compile), or None.
    """

    kind: str
    modules: tuple[str, ...]
    cython: str | None
    reason: str | None

    def __str__(self) -> str:
        if self.kind == "compiled":
            text = f"compiled (Cython {self.cython}; {len(self.modules)} modules)"
        else:
            text = "pure-python"
        return f"{text}: {self.reason}" if self.reason else text


def disabled() -> bool:
    """Whether ``TENSORBRIDGE_NO_EXTENSIONS`` asks for the pure-Python modules."""
    return os.environ.get(DISABLE_VARIABLE, "") not in ("", "0")


def in_subinterpreter() -> bool:
    """Whether this interpreter is not the process's main interpreter (CPython's `_interpreters`,
    3.13 and later, or `_xxsubinterpreters` before; False where neither exists)."""
    for name in ("_interpreters", "_xxsubinterpreters"):
        try:
            interpreters = importlib.import_module(name)
        except ImportError:
            continue
        current, main = interpreters.get_current(), interpreters.get_main()
        # 3.13+: (id, whence) pairs; 3.12: interpreter ids, which convert to int.
        if isinstance(current, tuple):
            current, main = current[0], main[0]
        return bool(int(current) != int(main))
    return False


def source_reason() -> str | None:
    """Why this interpreter must run the ``.py`` files (`TENSORBRIDGE_NO_EXTENSIONS`, or being a
    subinterpreter), or None when the compiled modules may load."""
    if disabled():
        return f"{DISABLE_VARIABLE} is set"
    if in_subinterpreter():
        return _SUBINTERPRETER_REASON
    return None


def route_to_source(package_path: list[str]) -> None:
    """Make imports of the package's submodules load ``.py`` (or ``.pyc``) files, never extensions.

    Python prefers an extension module over a ``.py`` file of the same name, so a finder with only
    the source and bytecode loaders replaces the cached finder of each package directory. It must
    run before any compiled submodule is imported.
    """
    loaders = [(SourceFileLoader, SOURCE_SUFFIXES), (SourcelessFileLoader, BYTECODE_SUFFIXES)]
    for entry in package_path:
        sys.path_importer_cache[entry] = FileFinder(entry, *loaders)
        _routed.append(entry)


def _read_record() -> dict[str, object]:
    try:
        record = json.loads(_RECORD.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _is_extension(origin: str | None) -> bool:
    return origin is not None and origin.endswith(tuple(EXTENSION_SUFFIXES))


def build_info() -> BuildInfo:
    """Which build of tensorbridge runs in this interpreter: compiled or pure Python, and why.

    The modules are those whose import resolves to an extension module now (a module not imported
    yet is looked up, not imported).

    Returns:
        A `BuildInfo`; ``str()`` of it is the line ``doctor`` and ``bench`` print.
    """
    record = _read_record()
    built = record.get("compiled")
    names = [str(n) for n in built] if isinstance(built, list) else []
    modules = []
    for name in names:
        try:
            spec = find_spec(f"{_PACKAGE}.{name}")
        except (ImportError, ValueError):
            continue
        if spec is not None and _is_extension(spec.origin):
            modules.append(name)
    failed = record.get("failed")
    if modules:
        reason = None
        if isinstance(failed, dict) and failed:
            names = sorted(map(str, failed))  # a few names: the line stays short
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            reason = f"not compiled: {shown}"
        cython = record.get("cython")
        return BuildInfo("compiled", tuple(sorted(modules)), str(cython), reason)
    if names and _routed:
        reason = source_reason() or "routed to the .py files"
    elif names:
        reason = "the compiled modules did not load"
    elif record:
        reason = str(record.get("reason") or "no module compiled")
    else:
        reason = "not built (a source checkout or an editable install)"
    return BuildInfo("pure-python", (), None, reason)
