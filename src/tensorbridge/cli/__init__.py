"""The command line: ``python -m tensorbridge [doctor | bench] [options]`` (``doctor`` by default).

``doctor`` checks what this interpreter can exchange and exits 1 only when tensorbridge breaks one
of its own guarantees (2 for a usage error). ``bench`` runs the scripts in ``benchmarks/`` (shipped
in the wheel as ``tensorbridge/_benchmarks``): per-call overhead of tensorbridge next to its peers,
in one process.

A closed output (``doctor | head -3``) ends the command quietly, as other command-line tools do,
with the exit status the command had reached: the doctor's verdict, or 0 for ``bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main"]

_COMMANDS = ("doctor", "bench")


def peer_list(text: str) -> tuple[str, ...]:
    """``"numpy,torch"`` -> ("numpy", "torch"); ``"none"`` or ``""`` -> () (no peer). Other
    spellings of a peer's name (``array-api-strict``, ``paddlepaddle``) give its key.

    Raises:
        argparse.ArgumentTypeError: a name the doctor does not exchange with.
    """
    from .registry import PEERS, canonical

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if names in ((), ("none",), ("stdlib",)):
        return ()
    keys = [canonical(n) for n in names]
    unknown = [n for n, key in zip(names, keys) if key is None]
    if unknown:
        msg = (
            f"unknown peer {unknown[0]!r}; the doctor exchanges with "
            f"{', '.join(PEERS)}, or 'none' for the standard library only"
        )
        raise argparse.ArgumentTypeError(msg)
    return tuple(dict.fromkeys(k for k in keys if k is not None))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tensorbridge",
        description="tensorbridge: zero-copy tensor interchange. Without a command, runs 'doctor'.",
    )
    commands = parser.add_subparsers(dest="command", metavar="{doctor,bench}")
    doctor = commands.add_parser(
        "doctor",
        help="prove what this interpreter can exchange (the default)",
        description="Find the array libraries installed here and prove every exchange through "
        "tensorbridge and directly; exit 1 only if tensorbridge breaks a guarantee.",
    )
    doctor.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object instead of text, with the keys doctor (format version), "
        "tensorbridge, python, implementation, platform, machine, libraries, devices, matrix, "
        "dtypes, checks, peers, broken, ok and elapsed_s",
    )
    doctor.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="after the summary, print everything proved: the exchange matrices with their "
        "legend, the dtype coverage, each peer, their own defects and the safety checks",
    )
    doctor.add_argument(
        "--progress",
        action="store_true",
        help="show progress on stderr even when it is not a terminal",
    )
    doctor.add_argument(
        "--peers",
        type=peer_list,
        default=None,
        metavar="LIST",
        help="comma-separated libraries to prove (numpy, torch, jax, pyarrow, cupy, tensorflow, "
        "paddle, onnxruntime, mlx, warp, array_api_strict, tvm_ffi, cuda_core, polars, pandas, "
        "nanoarrow, xarray, dask_array), or 'none' for the standard library and tensorbridge "
        "only (default: all found; env TB_DOCTOR_PEERS)",
    )
    doctor.add_argument(
        "--no-child", action="store_true", help="skip the checks that run in a child interpreter"
    )
    commands.add_parser(
        "bench",
        help="per-call overhead next to NumPy, PyTorch and JAX",
        description="Run the benchmark scripts; 'bench --help' lists their options.",
        add_help=False,
    )
    return parser


def _doctor(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from . import doctor, render

    peers = args.peers
    if peers is None and os.environ.get("TB_DOCTOR_PEERS"):
        try:
            peers = peer_list(os.environ["TB_DOCTOR_PEERS"])
        except argparse.ArgumentTypeError as exc:
            parser.error(f"TB_DOCTOR_PEERS: {exc}")  # exits 2, as for a bad --peers
    options = doctor.Options(
        peers=peers, progress=args.progress or sys.stderr.isatty(), child_checks=not args.no_child
    )
    report = doctor.run(options)
    status = 0 if report.ok else 1
    if args.json:
        text = json.dumps(report.to_json(), indent=2) + "\n"
    else:
        ascii_only = not render.can_print_marks(sys.stdout)
        text = render.render(report, verbose=args.verbose, ascii_only=ascii_only)
    _emit(text)  # a closed output keeps the verdict: the status does not depend on the reader
    return status


def _silence_stdout() -> None:
    """Point stdout at the null device after its reader went away (`progress.silence`)."""
    from .progress import silence

    silence(sys.stdout)


def _emit(text: str) -> bool:
    """Write ``text`` to stdout and flush; False (and stdout silenced) when the reader is gone."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return False
    return True


def _run(argv: list[str]) -> int:
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, "doctor")  # no command, or the doctor's options: the default command
    if argv[0] == "bench":
        try:
            from . import bench

            return bench.run(argv[1:])
        except BrokenPipeError:  # bench has no verdict: the reader just stopped reading
            _silence_stdout()
            return 0
    parser = _parser()
    try:
        args = parser.parse_args(argv)  # an unknown command: argparse's "invalid choice", status 2
    except BrokenPipeError:  # --help written to a reader that stopped reading (Python 3.10)
        _silence_stdout()
        return 0
    return _doctor(parser, args)


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit status.

    0: done (for ``doctor``: tensorbridge kept every guarantee checked); 1: ``doctor`` found a
    broken guarantee; 2: a usage error. A reader that closes the output early changes none of
    these: the command stops writing and returns the status it had reached.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        status = _run(argv)
    finally:  # also for argparse's SystemExit (--help, usage errors)
        _emit("")
    return status
