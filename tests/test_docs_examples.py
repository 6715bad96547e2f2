"""Every Python example of README.md and docs/ runs, as written, and says what the code does.

The collector reads each ```` ```python ```` block of ``README.md`` and ``docs/**/*.md``. A block in
doctest form (its first line starts with ``>>>``) runs as a doctest, with ``ELLIPSIS`` and
``NORMALIZE_WHITESPACE``; any other block is executed and must not raise. Each runs in a fresh
temporary directory (the current directory while it runs), so examples may write files there.

HTML comments on the lines just above a block (blank lines between are allowed) tell the collector
how to run it; they are invisible on GitHub and in the MkDocs site:

- ``<!-- requires: numpy torch -->``: the modules the block imports beyond tensorbridge; the block
  is skipped when one of them cannot be imported (an interpreter without a PyTorch wheel).
- ``<!-- run: script -->``: the block is a program (``if __name__ == "__main__":``, worker
  processes, Ray, Dask): it is written to ``example.py`` and run as ``python example.py`` in a child
  interpreter, which must exit 0. Its assertions are the checks.
- ``<!-- continue -->``: the block goes on from the previous Python block of the same page, in the
  same namespace and directory (one test runs them in order). A page that needs a file, such as a
  safetensors checkpoint, makes it in a block of its own that the next ones continue.

A block that reads ``__name__ == "__main__"`` must say ``run: script``: run in this process, its
body would be skipped silently.
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_DIRECTIVE = re.compile(r"^\s*<!--\s*(?P<key>[a-z]+)\s*(?::\s*(?P<value>.*?))?\s*-->\s*$")
_KEYS = frozenset({"requires", "run", "continue"})
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclasses.dataclass
class Block:
    """One ```python block: where it is, its source and the directives above it."""

    page: pathlib.Path
    line: int  # 1-based line of the block's first source line
    source: str
    directives: dict[str, str]

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def requires(self) -> list[str]:
        return self.directives.get("requires", "").split()

    @property
    def is_script(self) -> bool:
        return self.directives.get("run") == "script"


def parse_blocks(page: pathlib.Path) -> list[Block]:
    """The ```python blocks of one Markdown page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = match["indent"], match["fence"], match["info"]
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if info in {"python", "py", "pycon"}:
            body = [
                line[len(indent) :] if line.startswith(indent) else line
                for line in lines[i + 1 : end]
            ]
            blocks.append(Block(page, i + 2, "\n".join(body) + "\n", _directives(lines, i, page)))
        i = end + 1
    return blocks


def _directives(lines: list[str], fence_index: int, page: pathlib.Path) -> dict[str, str]:
    """The ``<!-- key: value -->`` comments just above the fence at ``fence_index``."""
    found: dict[str, str] = {}
    j = fence_index - 1
    while j >= 0 and (not lines[j].strip() or _DIRECTIVE.match(lines[j])):
        match = _DIRECTIVE.match(lines[j])
        if match:
            key = match["key"]
            if key not in _KEYS:
                msg = f"{page.name}:{j + 1}: unknown example directive {key!r}; known: {sorted(_KEYS)}"
                raise ValueError(msg)
            found.setdefault(key, match["value"] or "")
        j -= 1
    return found


def chains() -> list[list[Block]]:
    """Every example as a list of blocks run in order: a block, and the blocks that continue it."""
    out: list[list[Block]] = []
    for page in PAGES:
        for block in parse_blocks(page):
            if "continue" in block.directives:
                assert out and out[-1][0].page == page, f"{block.name}: nothing to continue"
                assert not block.is_script, f"{block.name}: a script cannot continue a block"
                out[-1].append(block)
            else:
                out.append([block])
    return out


CHAINS = chains()


def _missing(modules: list[str]) -> list[str]:
    return [name for name in modules if importlib.util.find_spec(name) is None]


def _marks(chain: list[Block]) -> list[Any]:
    needs = {name for block in chain for name in block.requires}
    marks = [getattr(pytest.mark, name) for name in ("ray", "dask") if name in needs]
    if any(block.is_script for block in chain):
        marks.append(pytest.mark.subprocess)
    return marks


def _run_doctest(block: Block, namespace: dict[str, Any]) -> None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.source, namespace, block.name, str(block.page), block.line - 1)
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    report: list[str] = []
    runner.run(test, out=report.append, clear_globs=False)
    namespace.update(
        test.globs
    )  # DocTest runs on a copy: what it defined goes on to the next block
    assert not report, "".join(report)


def _run_script(block: Block, directory: pathlib.Path) -> None:
    script = directory / "example.py"
    script.write_text(block.source, encoding="utf-8")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, script.name],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert result.returncode == 0, (
        f"{block.name} exited with {result.returncode}\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


@pytest.mark.parametrize("chain", [pytest.param(c, id=c[0].name, marks=_marks(c)) for c in CHAINS])
def test_example(
    chain: list[Block], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python example of the README or the docs runs as written and shows what the code does."""
    for block in chain:
        if "__main__" in block.source and not block.is_script:
            pytest.fail(f"{block.name}: a block with a __main__ guard needs <!-- run: script -->")
    missing = _missing(sorted({name for block in chain for name in block.requires}))
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__docs_example__"}
    for block in chain:
        if block.is_script:
            _run_script(block, tmp_path)
        elif block.source.lstrip().startswith(">>>"):
            _run_doctest(block, namespace)
        else:
            exec(compile(block.source, block.name, "exec"), namespace)


def test_examples_were_found() -> None:
    """The collector finds the README's examples and the docs' (a parsing slip would find none)."""
    pages = {chain[0].page.name for chain in CHAINS}
    assert "README.md" in pages
    assert len(CHAINS) >= 10, [c[0].name for c in CHAINS]


def test_readme_holds_the_ci_test_command() -> None:
    """README.md holds, on a line of its own, the test command that .ci/run runs verbatim."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    match = re.search(r"^readme_command='(?P<command>[^']+)'$", ci, re.MULTILINE)
    assert match, "no readme_command in .ci/run"
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert match["command"] in lines
    assert "python -m pip install . && python -m tensorbridge doctor" in lines


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: pathlib.Path) -> None:
    """Every relative link of a page names a file of the repository (anchors aside)."""
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # code is not links
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"
