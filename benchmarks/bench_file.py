"""``from_file``: a tensor over a memory-mapped file, next to ``torch.from_file`` and ``np.memmap``.

All three map ``n`` float32 elements (the default dtype of tensorbridge and PyTorch). The file
is sparse (``truncate``), so even 1 GiB costs no disk and no page cache; each call maps it, which
is O(1) in the file size.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

if __package__:
    from ._harness import Case, Context, script_main
else:  # run as a file: python benchmarks/bench_file.py
    from _harness import Case, Context, script_main


def cases(ctx: Context) -> Iterator[Case]:
    """Private (copy-on-write) and shared maps at every size."""
    for shared, mode in ((False, "c"), (True, "r+")):
        for size in ctx.sizes():
            x_in = ctx.inputs(size)
            path, n = x_in.path, x_in.n
            yield from ctx.case(
                "from_file",
                size,
                ctx.call(f"tb.from_file({{x}}, shared={shared}, size=n)", "path", x=path, n=n),
                ctx.call(
                    f"torch.from_file({{x}}, shared={shared}, size=n)",
                    "path",
                    needs=("torch",),
                    x=path,
                    n=n,
                ),
                ctx.call(
                    f"np.memmap({{x}}, np.float32, {mode!r}, shape=(n,))",
                    "path",
                    needs=("numpy",),
                    x=path,
                    n=n,
                ),
            )


if __name__ == "__main__":
    sys.exit(script_main(__name__))
