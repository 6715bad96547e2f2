"""The benchmark harness: inputs of every size, timing, the table, JSON and the plot.

A script yields `Case` objects: one tensorbridge `Call` and the peers' `Call`s that do the same job.
Each call is timed as the median of ``repeat`` timeit loops (µs per call, garbage collection on),
the loops of tensorbridge and of its peers interleaved, and reported next to tensorbridge's figure
as the ratio tensorbridge / peer (below 1: tensorbridge is faster).

Inputs from 16 MiB on are views of an anonymous memory map or of a sparse file, so a 1 GiB input
costs no RAM: the large sizes show that every call is O(1). A call that turns out to copy at a
large size (its first run takes more than 20 ms) is reported as such and not timed.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import gc
import importlib
import importlib.metadata
import json
import mmap
import os
import platform
import statistics
import sys
import tempfile
import time
import timeit
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import tensorbridge as tb
from tensorbridge.cli.render import WIDTH, table

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BIG = 16 * MiB  # from here on, inputs are memory maps and copies are refused
DEFAULT_SIZES = (KiB, MiB, GiB)
QUICK_SIZES = (KiB, GiB)
_SLOW_FIRST_CALL = 0.02  # seconds: at a big size, a first call slower than this copies

# Optional peers: key -> import name. The pure-Python DLPack packages come last and pydlpack before
# ctypes-dlpack: both set process-wide prototypes on ctypes.pythonapi, and that order keeps both
# working.
PEERS = {
    "numpy": "numpy",
    "torch": "torch",
    "jax": "jax",
    "pyarrow": "pyarrow",
    "pydlpack": "dlpack",
    "ctypes_dlpack": "ctypes_dlpack",
}


def parse_size(text: str) -> int:
    """``"1KiB"``, ``"64MiB"``, ``"1GiB"`` or a byte count."""
    text = text.strip()
    for unit, factor in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def size_text(size: int) -> str:
    for unit, factor in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


@dataclass
class Settings:
    sizes: tuple[int, ...] = DEFAULT_SIZES
    budget: float = 0.25  # seconds per measured call, all repeats together
    repeat: int = 5
    only: tuple[str, ...] = ()
    peers: tuple[str, ...] | None = None


# --------------------------------------------------------------------------------------------------
# Inputs


class Inputs:
    """The objects a case needs, for one size in bytes (float32 elements), made on first use.

    Below `BIG` they are ordinary allocations; from `BIG` on, views of one anonymous memory map
    (the pages are never touched, so they cost no memory) and the kinds that would need real memory
    (``bytearray``, ``bytes``, ``array``, ``list``) are None.
    """

    def __init__(self, ctx: Context, size: int) -> None:
        self.ctx, self.size, self.n = ctx, size, size // 4
        self.big = size >= BIG
        self._cache: dict[str, Any] = {}

    def __getattr__(self, kind: str) -> Any:
        if kind.startswith("_"):
            raise AttributeError(kind)
        if kind not in self._cache:
            maker = getattr(self, f"_make_{kind}")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._cache[kind] = maker()
        return self._cache[kind]

    def _make_mmap(self) -> mmap.mmap:
        return mmap.mmap(-1, self.size)

    def _make_bytearray(self) -> bytearray | None:
        return None if self.big else bytearray(self.size)

    def _make_bytes(self) -> bytes | None:
        return None if self.big else bytes(self.size)

    def _make_array(self) -> array.array[float] | None:
        return None if self.big else array.array("f", bytes(self.size))

    def _make_list(self) -> list[float] | None:
        return None if self.size > 64 * KiB else [0.0] * self.n

    def _make_path(self) -> str:
        path = Path(self.ctx.tmpdir, f"bench-{self.size}.bin")
        with path.open("wb") as f:
            f.truncate(self.size)  # sparse: no disk blocks, no page cache
        return str(path)

    def _make_ndarray(self) -> Any:
        np = self.ctx.np
        if np is None:
            return None
        if self.big:
            return np.frombuffer(self.mmap, dtype=np.float32)
        return np.zeros(self.n, dtype=np.float32)

    def _make_torch(self) -> Any:
        torch = self.ctx.torch
        if torch is None:
            return None
        if self.big:
            return torch.frombuffer(self.mmap, dtype=torch.float32)
        return torch.zeros(self.n, dtype=torch.float32)

    def _make_tb(self) -> tb.Tensor:
        if self.big:
            return tb.frombuffer(self.mmap, dtype=tb.float32)
        return tb.zeros(self.n, dtype=tb.float32)

    def _make_jax(self) -> Any:
        jax, np = self.ctx.jax, self.ctx.np
        if jax is None or np is None:
            return None
        if not self.big:
            return jax.device_put(np.zeros(self.n, dtype=np.float32))
        # JAX aliases page-aligned memory on import; anything else would copy 1 GiB, so check first.
        host = self.ndarray
        if host.__array_interface__["data"][0] % 64:
            return None
        x = jax.dlpack.from_dlpack(host)
        return x if x.unsafe_buffer_pointer() == host.__array_interface__["data"][0] else None


# --------------------------------------------------------------------------------------------------
# Cases and calls


@dataclass(frozen=True)
class Target:
    """A per-call target for each build: the largest acceptable ratio tensorbridge / the peer's
    call when the compiled build runs, and when pure Python runs (each ctypes call into the C API
    costs it about 0.4 µs, which C peers do not pay)."""

    compiled: float
    pure: float

    def for_this_build(self) -> float:
        return self.compiled if tb.build_info().kind == "compiled" else self.pure


@dataclass
class Call:
    """One timed statement. ``label`` is what the table shows; ``target``: the largest acceptable
    ratio tensorbridge / this call (reported, never asserted)."""

    label: str
    stmt: str
    env: dict[str, Any]
    target: float | None = None


@dataclass
class Case:
    """``transfer``: the calls move the bytes between processes, so they copy by nature and are
    timed at any size (at `BIG` and above, a first call slower than 20 ms is otherwise refused)."""

    group: str
    size: int
    tb: Call
    peers: list[Call]
    transfer: bool = False


def _names(key: str, module: ModuleType) -> dict[str, Any]:
    """The names a statement uses for a peer (``np``, ``jnp``, ctypes-dlpack's two functions)."""
    if key == "numpy":
        return {"np": module}
    if key == "jax":
        return {"jax": module, "jnp": module.numpy}
    if key == "pyarrow":
        return {"pa": module}
    if key == "ctypes_dlpack":
        return {"DLPackArray": module.DLPackArray, "array_as_dlpack": module.array_as_dlpack}
    return {key: module}


class Context:
    """What scripts see: the settings, the peers (None when absent) and the inputs per size."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tb = tb
        self.modules: dict[str, ModuleType | None] = {}
        self._inputs: dict[int, Inputs] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="tensorbridge-bench-")
        self.tmpdir = self._tmp.name

    def peer(self, key: str) -> ModuleType | None:
        """The peer's module, imported on first use; None when missing or not selected."""
        if key not in self.modules:
            wanted = self.settings.peers
            module = None
            if key == "ctypes_dlpack":
                self.peer("pydlpack")  # pydlpack first: the other order breaks ctypes-dlpack
            if wanted is None or key in wanted:
                with contextlib.suppress(ImportError):
                    module = importlib.import_module(PEERS[key])
                if key == "jax" and module is not None:
                    pass
            self.modules[key] = module
        return self.modules[key]

    np = property(lambda self: self.peer("numpy"))
    torch = property(lambda self: self.peer("torch"))
    jax = property(lambda self: self.peer("jax"))

    @property
    def jnp(self) -> ModuleType | None:
        return None if self.jax is None else self.jax.numpy

    def sizes(self, max_size: int | None = None) -> list[int]:
        return [s for s in self.settings.sizes if max_size is None or s <= max_size]

    def inputs(self, size: int) -> Inputs:
        if size not in self._inputs:
            self._inputs[size] = Inputs(self, size)
        return self._inputs[size]

    def call(
        self,
        template: str,
        kind: str = "x",
        *,
        needs: Sequence[str] = (),
        target: float | Target | None = None,
        shown: str | None = None,
        **env: Any,
    ) -> Call | None:
        """A call, or None when a peer it needs is missing or an input is None.

        ``template`` names the input ``{x}``: the label shows ``kind`` there, the statement ``x``.
        ``shown`` replaces the template in the label (to leave out arguments that do not matter).
        The statement sees ``tb``, the names of the peers in ``needs`` and ``env``.
        """
        if any(value is None for value in env.values()):
            return None
        scope: dict[str, Any] = {"tb": tb, "gc": gc}
        for key in needs:
            module = self.peer(key)
            if module is None:
                return None
            scope.update(_names(key, module))
        scope.update(env)
        label = (shown or template).format(x=kind)
        if isinstance(target, Target):
            target = target.for_this_build()
        return Call(label, template.format(x="x"), scope, target)

    def case(
        self,
        group: str,
        size: int,
        tbcall: Call | None,
        *peers: Call | None,
        transfer: bool = False,
    ) -> Iterator[Case]:
        """Yields the case when tensorbridge's call exists (peers that are None are left out)."""
        if tbcall is not None:
            yield Case(group, size, tbcall, [p for p in peers if p is not None], transfer)

    def close(self) -> None:
        self._inputs.clear()
        gc.collect()
        with contextlib.suppress(OSError):
            self._tmp.cleanup()


# --------------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    label: str
    us: float | None = None
    error: str | None = None
    ratio: float | None = None  # tensorbridge / this call
    target: float | None = None
    met: bool | None = None


@dataclass
class Result:
    group: str
    size: int
    tb: Timing
    peers: list[Timing] = field(default_factory=list)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class _Timer:
    """One call's timer, calibrated so that a loop takes ``budget / repeat`` seconds."""

    def __init__(self, call: Call, settings: Settings, big: bool) -> None:
        self.timing = Timing(call.label, target=call.target)
        self.timer = timeit.Timer(call.stmt, setup="gc.enable()", globals=call.env)
        self.number = 0  # 0: not timed (see self.timing.error)
        self.loops: list[float] = []
        try:
            first = self.timer.timeit(1)
        except Exception as exc:  # a failing call is reported, not fatal
            self.timing.error = _first_line(exc)
            return
        if big and first > _SLOW_FIRST_CALL:
            self.timing.error = f"O(n): the first call took {first * 1e3:.0f} ms (it copies)"
            return
        per_loop = settings.budget / settings.repeat
        number = 1
        while True:
            elapsed = self.timer.timeit(number)
            if elapsed >= per_loop / 5 or number >= 10**7:
                break
            number *= 10
        self.number = max(1, round(number * per_loop / max(elapsed, 1e-9)))

    def loop(self) -> None:
        if self.number:
            self.loops.append(self.timer.timeit(self.number))

    def result(self) -> Timing:
        if self.loops:
            self.timing.us = statistics.median(self.loops) / self.number * 1e6
        return self.timing


def run_case(case: Case, settings: Settings) -> Result:
    """Time tensorbridge's call and the peers' calls, their loops interleaved.

    Interleaving (tb, peer 1, peer 2, tb, ...) exposes every call to the same load on a shared
    machine, so the ratios stay meaningful even when the absolute figures drift.
    """
    big = case.size >= BIG and not case.transfer
    timers = [_Timer(call, settings, big) for call in (case.tb, *case.peers)]
    for _ in range(settings.repeat):
        for timer in timers:
            timer.loop()
    tb_timing, *peers = (t.result() for t in timers)
    for timing in peers:
        if timing.us and tb_timing.us:
            timing.ratio = tb_timing.us / timing.us
            if timing.target is not None:
                timing.met = timing.ratio <= timing.target
    return Result(case.group, case.size, tb_timing, peers)


# --------------------------------------------------------------------------------------------------
# Reporting


def machine() -> dict[str, Any]:
    """Where the figures come from: interpreter, OS, CPU, memory and library versions."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        memory = f"{int(first.split()[1]) / (1 << 20):.0f} GiB"
    versions = {"tensorbridge": tb.__version__}
    for key, module in (
        ("numpy", "numpy"),
        ("torch", "torch"),
        ("jax", "jax"),
        ("pyarrow", "pyarrow"),
        ("pydlpack", "pydlpack"),
        ("ctypes_dlpack", "ctypes-dlpack"),
    ):
        with contextlib.suppress(Exception):
            versions[key] = importlib.metadata.version(module)
    return {
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "versions": versions,
        # which build ran: compiled modules (and which) or pure Python, and why
        "build": asdict(tb.build_info()),
    }


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3g}x"


def _verdict(t: Timing) -> str:
    if t.met is None or t.target is None:
        return ""
    return f"{'met' if t.met else 'MISSED'} <={t.target:.3g}x"


def _fit(label: str, width: int) -> str:
    return label if len(label) <= width else label[: width - 3] + "..."


_LABEL = 54  # label column: leaves room for size, µs, ratio and verdict within WIDTH


def render(results: Sequence[Result], info: dict[str, Any], command: str) -> str:
    """The table: tensorbridge's call, then each peer's call indented under it with the ratio."""
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    lines = [
        f"$ {command}",
        f"Python {info['python']} on {info['platform']}",
        f"{info['cpu']}, {info['cores']} cores, {info['memory']} RAM",
        versions,
        f"tensorbridge build: {tb.build_info()}",
        "µs per call: median of timeit loops. ratio: tensorbridge µs / peer µs (below 1: faster).",
        "",
    ]
    errors: dict[str, int] = {}

    def figure(t: Timing) -> str:
        if t.error is None:
            return _us(t.us)
        return f"[{errors.setdefault(t.error, len(errors) + 1)}]"

    for group in dict.fromkeys(r.group for r in results):
        rows = []
        for r in (r for r in results if r.group == group):
            rows.append([_fit(r.tb.label, _LABEL), size_text(r.size), figure(r.tb), "", ""])
            rows += [
                ["  " + _fit(p.label, _LABEL - 2), "", figure(p), _ratio_text(p.ratio), _verdict(p)]
                for p in r.peers
            ]
        lines += [group, *table(["call", "size", "µs", "ratio", ""], rows), ""]
    lines += [f"  [{n}] {text}"[:WIDTH] for text, n in errors.items()]
    return "\n".join(lines).rstrip() + "\n"


def targets(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Each target at the smallest size measured: the calls, the ratio and whether it was met."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in sorted(results, key=lambda r: r.size):
        for p in r.peers:
            if p.target is not None and (r.tb.label, p.label) not in seen:
                seen[r.tb.label, p.label] = {
                    "tensorbridge": r.tb.label,
                    "peer": p.label,
                    "size": r.size,
                    "ratio": p.ratio,
                    "target": p.target,
                    "met": p.met,
                }
    return list(seen.values())


def _target_lines(found: list[dict[str, Any]]) -> str:
    if not found:
        return ""
    lines = ["Targets: tensorbridge / peer at the smallest size (reported, never asserted)"]
    for t in found:
        verdict = {True: "met", False: "missed", None: "not measured"}[t["met"]]
        lines.append(_fit(f"  {t['tensorbridge']}  vs  {t['peer']}", WIDTH))
        lines.append(f"      {_ratio_text(t['ratio'])}, target <= {t['target']:.3g}x: {verdict}")
    return "\n".join(lines) + "\n"


def plot(results: Sequence[Result], path: str) -> str | None:
    """A bar chart of the ratios at the smallest size; None when matplotlib is missing."""
    try:
        import matplotlib as mpl

        mpl.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    bars = []
    smallest = min((r.size for r in results), default=0)
    for r in results:
        if r.size == smallest:
            bars += [(f"{r.tb.label}  vs  {p.label}", p.ratio) for p in r.peers if p.ratio]
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(bars) + 1.2))
    labels = [b[0] for b in bars]
    values = [b[1] for b in bars]
    ax.barh(
        range(len(bars)), values, color=["tab:green" if v <= 1 else "tab:orange" for v in values]
    )
    ax.set_yticks(range(len(bars)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"tensorbridge µs / peer µs per call, {size_text(smallest)} inputs")
    ax.set_title("Below 1 (green): tensorbridge is faster", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------
# Command line


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Per-call overhead of tensorbridge next to "
        "NumPy, PyTorch, JAX and the pure-Python DLPack packages, in one process.",
    )
    p.add_argument("--quick", action="store_true", help="sizes 1KiB,1GiB and a short budget")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--plot", metavar="FILE.png", help="save a bar chart of the ratios (needs matplotlib)"
    )
    p.add_argument(
        "--sizes", help="comma-separated sizes, e.g. 1KiB,1MiB,1GiB (default: all three)"
    )
    p.add_argument(
        "--budget", type=float, help="seconds per measured call (default 0.25; quick 0.03)"
    )
    p.add_argument(
        "--repeat", type=int, help="timeit loops per call; the median is kept (default 5)"
    )
    p.add_argument(
        "--only", help="comma-separated scripts or groups (e.g. bench_dlpack,frombuffer)"
    )
    p.add_argument(
        "--peers", help="comma-separated peers to compare with, or 'none' (default: all)"
    )
    p.add_argument(
        "--progress", action="store_true", help="progress on stderr even when not a terminal"
    )
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    s = Settings()
    if args.quick:
        s.sizes, s.budget, s.repeat = QUICK_SIZES, 0.03, 3
    if args.sizes:
        s.sizes = tuple(parse_size(x) for x in args.sizes.split(",") if x.strip())
    if args.budget is not None:
        s.budget = args.budget
    if args.repeat is not None:
        s.repeat = max(1, args.repeat)
    if args.only:
        s.only = tuple(x.strip() for x in args.only.split(",") if x.strip())
    if args.peers is not None:
        names = tuple(x.strip() for x in args.peers.split(",") if x.strip())
        s.peers = () if names in ((), ("none",)) else names
    return s


def _selected(script: ModuleType, case: Case, only: tuple[str, ...]) -> bool:
    name = script.__name__.rpartition(".")[2]
    return not only or name in only or case.group in only


def run(scripts: Iterable[ModuleType], settings: Settings, progress: bool) -> list[Result]:
    ctx = Context(settings)
    results = []
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.frombuffer(bytes) and friends warn once
            for script in scripts:
                for case in script.cases(ctx):
                    if not _selected(script, case, settings.only):
                        continue
                    if progress:
                        sys.stderr.write(
                            f"\rbench: {time.perf_counter() - start:5.1f}s "
                            f"{case.tb.label} {size_text(case.size)}"[: WIDTH - 1].ljust(WIDTH - 1)
                        )
                        sys.stderr.flush()
                    results.append(run_case(case, settings))
    finally:
        if progress:
            sys.stderr.write("\r" + " " * (WIDTH - 1) + "\r")
        ctx.close()
    return results


def main(argv: Sequence[str] | None, scripts: Sequence[ModuleType], prog: str = "bench") -> int:
    """Run ``scripts`` with the options in ``argv``; prints the table (or JSON); returns 0."""
    args = parser(prog).parse_args(list(sys.argv[1:] if argv is None else argv))
    settings = settings_from(args)
    results = run(scripts, settings, args.progress or sys.stderr.isatty())
    info = machine()
    command = " ".join([prog, *(sys.argv[1:] if argv is None else argv)])
    found = targets(results)
    plotted = None
    if args.plot:
        plotted = plot(results, args.plot)
        if plotted is None:
            print(
                "bench: --plot needs matplotlib (pip install 'tensorbridge[bench]'); "
                "no chart written",
                file=sys.stderr,
            )
    if args.json:
        out = {
            "bench": 1,
            "command": command,
            "machine": info,
            "settings": {**asdict(settings), "sizes": list(settings.sizes)},
            "results": [asdict(r) for r in results],
            "targets": found,
            "plot": plotted,
        }
        print(json.dumps(out, indent=2, default=str))
    else:
        sys.stdout.write(render(results, info, command))
        sys.stdout.write("\n" + _target_lines(found))
        if plotted:
            print(f"\nplot: {plotted}")
    return 0


def script_main(module_name: str) -> int:
    """Entry point for ``python -m benchmarks.bench_x`` / ``python benchmarks/bench_x.py``."""
    return main(
        None, [sys.modules[module_name]], prog=f"python -m benchmarks.{Path(sys.argv[0]).stem}"
    )
