"""Per-call cost of tensorbridge in a CPython 3.14 subinterpreter, next to the main interpreter.

A subinterpreter with its own GIL runs tensorbridge's ``.py`` files (the compiled modules load in
the main interpreter only), so a compiled install pays the pure-Python cost there. This measures the
same calls in both interpreters of one process, as nanoseconds per call (the best of five rounds)
and as the subinterpreter's ratio to the main one. NumPy and PyTorch cannot be imported in a
subinterpreter, so the calls are tensorbridge's own:

    python benchmarks/interpreters.py [--calls N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

CALLS = """
import time
import tensorbridge as tb

def per_call(fn, calls):
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e9

t, data = tb.zeros(256), bytearray(1024)
shared = tb.to_shareable(t)
results = {
    "from_dlpack(tensor)": per_call(lambda: tb.from_dlpack(t), CALLS),
    "asarray(bytearray)": per_call(lambda: tb.asarray(data), CALLS),
    "frombuffer(bytearray)": per_call(lambda: tb.frombuffer(data, dtype=tb.uint8), CALLS),
    "to_shareable(tensor)": per_call(lambda: tb.to_shareable(t), CALLS),
    "from_shareable(tuple)": per_call(lambda: tb.from_shareable(shared), CALLS),
}
build = tb.build_info().kind
"""


def measure(calls: int) -> dict[str, Any]:
    """Run `CALLS` in this interpreter and in a new own-GIL one; both results and their builds."""
    try:
        from concurrent import interpreters
    except ImportError:
        sys.exit(f"needs CPython 3.14's concurrent.interpreters; this is Python {sys.version}")
    here: dict[str, object] = {"CALLS": calls}
    exec(CALLS, here)  # the fixed source above
    interp = interpreters.create()
    try:
        queue = interpreters.create_queue()
        interp.prepare_main(queue=queue, CALLS=calls)
        interp.exec(CALLS + "\nimport json\nqueue.put(json.dumps([results, build]))")
        there, there_build = json.loads(queue.get())
    finally:
        interp.close()
    return {
        "main": {"build": here["build"], "ns": here["results"]},
        "subinterpreter": {"build": there_build, "ns": there},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per round (default 20000)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    result = measure(args.calls)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    main_side, sub_side = result["main"], result["subinterpreter"]
    print(f"{'call':<24}{'main':>16}{'subinterpreter':>22}{'ratio':>8}")
    print(f"{'':<24}{main_side['build']:>16}{sub_side['build']:>22}")
    for name, ns in main_side["ns"].items():
        there = sub_side["ns"][name]
        print(f"{name:<24}{ns:>13.0f} ns{there:>19.0f} ns{there / ns:>7.2f}x")


if __name__ == "__main__":
    main()
