"""``python -m tensorbridge bench``: the scripts in ``benchmarks/`` (shipped in the wheel as
``tensorbridge/_benchmarks``), timing tensorbridge's per-call overhead next to its peers."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["run"]


def _benchmarks() -> ModuleType:
    """The benchmarks: ``tensorbridge._benchmarks`` in a wheel, ``benchmarks/`` in a checkout."""
    name = f"{__name__.partition('.')[0]}._benchmarks"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
    root = Path(__file__).resolve().parents[3] / "benchmarks"
    init = root / "__init__.py"
    if not init.is_file():
        msg = (
            f"bench: the benchmark scripts are missing (looked for {name} and {root}); "
            f"reinstall tensorbridge from its wheel or run from a source checkout."
        )
        raise RuntimeError(msg)
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(root)]
    )
    if spec is None or spec.loader is None:
        msg = f"bench: cannot load the benchmark package at {root}"
        raise RuntimeError(msg)
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return package


def run(argv: list[str]) -> int:
    """Run the benchmark scripts with the command-line arguments ``argv``; the exit status."""
    package = _benchmarks()
    harness = importlib.import_module(f"{package.__name__}._harness")
    scripts = [importlib.import_module(f"{package.__name__}.{s}") for s in package.SCRIPTS]
    return int(harness.main(argv, scripts, prog="python -m tensorbridge bench"))
