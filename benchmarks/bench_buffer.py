"""The buffer protocol: ``frombuffer`` over each kind of buffer, and the buffer-side exports.

Rows, for each input size:
  * frombuffer -- ``tb.frombuffer(b, dtype=tb.float32)`` next to ``torch.frombuffer`` and
    ``np.frombuffer`` (and pydlpack's buffer export), for a bytearray, bytes and an mmap;
  * export     -- ``np.asarray`` of a tensor (through ``__array_interface__``) and the
    ``__array_interface__`` dictionary itself, next to NumPy's own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

if __package__:
    from ._harness import Case, Context, MiB, Target, script_main
else:  # run as a file: python benchmarks/bench_buffer.py
    from _harness import Case, Context, MiB, Target, script_main


def _frombuffer(ctx: Context, size: int) -> Iterator[Case]:
    x_in = ctx.inputs(size)
    for kind in ("bytearray", "bytes", "mmap"):
        b = getattr(x_in, kind)
        yield from ctx.case(
            "frombuffer",
            size,
            ctx.call("tb.frombuffer({x}, dtype=tb.float32)", kind, x=b),
            ctx.call(
                "torch.frombuffer({x}, dtype=torch.float32)",
                kind,
                needs=("torch",),
                x=b,
                target=Target(1.0, 2.0) if kind == "bytearray" else None,
            ),
            ctx.call("np.frombuffer({x}, dtype=np.float32)", kind, needs=("numpy",), x=b),
            ctx.call(
                "np.from_dlpack(pydlpack.asdlpack({x}))",
                kind,
                needs=("numpy", "pydlpack"),
                x=b,
                target=1 / 3,
            )
            if size <= MiB
            else None,
        )


def _export(ctx: Context, size: int) -> Iterator[Case]:
    x_in = ctx.inputs(size)
    yield from ctx.case(
        "buffer export",
        size,
        ctx.call("np.asarray({x})", "t", needs=("numpy",), x=x_in.tb),
        ctx.call("np.asarray({x})", "pt", needs=("numpy", "torch"), x=x_in.torch),
        ctx.call("np.asarray({x})", "a", needs=("numpy",), x=x_in.ndarray),
    )
    yield from ctx.case(
        "buffer export",
        size,
        ctx.call("{x}.__array_interface__", "t", x=x_in.tb),
        ctx.call("{x}.__array_interface__", "a", needs=("numpy",), x=x_in.ndarray),
    )


def cases(ctx: Context) -> Iterator[Case]:
    """Every buffer-protocol case at every size."""
    for part in (_frombuffer, _export):
        for size in ctx.sizes():
            yield from part(ctx, size)


if __name__ == "__main__":
    sys.exit(script_main(__name__))
