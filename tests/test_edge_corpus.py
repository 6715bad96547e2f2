"""The hostile corpus of the edges (`tests/edge_corpus.py`), each area in a child interpreter.

A crash kills the child and fails its area; a wrong result, an exception that is not a clean
refusal naming the function called, or anything left behind (a locked bytearray, an unlinked name
that was not ours, a class kept alive) fails it with the first inputs that did so. The inputs are
seeded: the same ones on every run, ``TB_EDGE_COUNT`` (default 150) per area; run ``pytest -s`` to
see the figures SECURITY.md quotes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.edge_corpus import AREAS

_ROOT = Path(__file__).resolve().parents[1]
COUNT = int(os.environ.get("TB_EDGE_COUNT", "150"))


@pytest.mark.parametrize("area", sorted(AREAS))
def test_edge_corpus_area(area):
    if area == "shared_names" and not sys.platform.startswith("linux"):
        pytest.skip("shared-memory names are files in /dev/shm on Linux only")
    out = subprocess.run(
        [sys.executable, "-m", "tests.edge_corpus", area, str(COUNT)],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, f"the {area} child died ({out.returncode}): {out.stderr[-2000:]}"
    report = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"\n{report['area']}: {report['tried']} inputs, {report['refused']} refused, "
        f"{report['taken']} taken, {report['wrong_count']} wrong, {report['leak_count']} leaks"
    )
    assert report["wrong_count"] == 0, report["wrong"]
    assert report["leak_count"] == 0, report["leaks"]
    assert report["tried"] >= COUNT
