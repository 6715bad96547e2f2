"""``asarray`` per input kind, next to ``torch.asarray``, ``np.asarray`` and ``jnp.asarray``.

Zero-copy inputs (arrays, tensors, buffers) at every size; a Python list only at 1 KiB, since every
library copies it. A peer that copies at a large size is reported as such, not timed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

if __package__:
    from ._harness import BIG, Case, Context, KiB, Target, script_main
else:  # run as a file: python benchmarks/bench_asarray.py
    from _harness import BIG, Case, Context, KiB, Target, script_main

_KINDS = ("ndarray", "torch", "jax", "tb", "bytearray", "array", "list")
# jnp.asarray copies every input but a jax array; buffers and lists element by element (100 ms for
# a 1 MiB array.array), so those rows stop at 64 KiB.
_JAX_COPY_LIMIT = {"bytearray": 64 * KiB, "array": 64 * KiB}


# tensorbridge / torch.asarray ratios to aim at (reported, never asserted).
_TARGETS = {"ndarray": Target(1.0, 2.0), "bytearray": Target(1.0, 2.0)}


def _jax_ok(kind: str, size: int) -> bool:
    return size < BIG and size <= _JAX_COPY_LIMIT.get(kind, size)


def cases(ctx: Context) -> Iterator[Case]:
    """tb.asarray of each kind of input at every size."""
    for size in ctx.sizes():
        x_in = ctx.inputs(size)
        for kind in _KINDS:
            x = getattr(x_in, kind)
            yield from ctx.case(
                "asarray",
                size,
                ctx.call("tb.asarray({x})", kind, x=x),
                ctx.call(
                    "torch.asarray({x})",
                    kind,
                    needs=("torch",),
                    x=x,
                    target=_TARGETS.get(kind),
                ),
                ctx.call("np.asarray({x})", kind, needs=("numpy",), x=x),
                ctx.call("jnp.asarray({x})", kind, needs=("jax",), x=x)
                if _jax_ok(kind, size)
                else None,
            )


if __name__ == "__main__":
    sys.exit(script_main(__name__))
