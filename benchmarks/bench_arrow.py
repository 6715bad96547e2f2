"""Arrow export: ``pa.array(t)`` of a 1-d tensorbridge tensor, next to ``pa.array(ndarray)``.

Both import ``n`` float32 elements without a copy: pyarrow reads the tensor through the Arrow
PyCapsule interface (``__arrow_c_array__``) and the ndarray through NumPy's own conversion, each
as a primitive array over the same memory, so both calls are O(1) in the size. Without pyarrow
there is nothing to time: the line is left out.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

if __package__:
    from ._harness import Case, Context, script_main
else:  # run as a file: python benchmarks/bench_arrow.py
    from _harness import Case, Context, script_main


def cases(ctx: Context) -> Iterator[Case]:
    """pa.array of a tensor and of an ndarray of the same float32 data, at every size."""
    for size in ctx.sizes():
        x_in = ctx.inputs(size)
        yield from ctx.case(
            "arrow",
            size,
            ctx.call("pa.array({x})", "tb", needs=("pyarrow",), x=x_in.tb),
            ctx.call("pa.array({x})", "ndarray", needs=("pyarrow", "numpy"), x=x_in.ndarray),
        )


if __name__ == "__main__":
    sys.exit(script_main(__name__))
