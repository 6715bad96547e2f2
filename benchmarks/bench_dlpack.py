"""DLPack: import from each producer, export to each consumer, and the capsule calls themselves.

Rows, for each input size:
  * import   -- ``tb.from_dlpack(x)`` next to ``torch.from_dlpack(x)``, ``np.from_dlpack(x)``,
    ``jnp.from_dlpack(x)`` and ctypes-dlpack's import, for x an ndarray, a torch or jax array;
  * export   -- ``np/torch/jnp.from_dlpack(tb tensor)`` next to the same call on peers' arrays;
  * relay    -- re-export an ndarray through tensorbridge, torch, ctypes-dlpack and pydlpack;
  * capsule  -- ``to_dlpack`` and ``__dlpack__`` next to torch's, NumPy's and JAX's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

if __package__:
    from ._harness import Case, Context, Target, script_main
else:  # run as a file: python benchmarks/bench_dlpack.py
    from _harness import Case, Context, Target, script_main

# ctypes-dlpack's import: a DLManagedTensorVersioned* wrapped in an object that re-exports it
# (the label leaves out max_version=(1, 0)).
_CD = "DLPackArray(array_as_dlpack({x}, max_version=(1, 0)))"
_CD_SHOWN = "DLPackArray(array_as_dlpack({x}))"

# tensorbridge / peer ratios to aim at (reported, never asserted); pure-Python packages: 3x slower.
_IMPORT_TARGETS = {("ndarray", "torch"): Target(1.0, 1.5), ("torch", "torch"): Target(0.5, 1.0)}
_PURE_PYTHON = 1 / 3


def _import(ctx: Context, size: int) -> Iterator[Case]:
    x_in = ctx.inputs(size)
    for kind in ("ndarray", "torch", "jax"):
        x = getattr(x_in, kind)
        peers = [
            ctx.call(
                f"{lib}.from_dlpack({{x}})",
                kind,
                needs=(key,),
                x=x,
                target=_IMPORT_TARGETS.get((kind, key)),
            )
            for lib, key in (("torch", "torch"), ("np", "numpy"), ("jnp", "jax"))
        ]
        peers.append(
            ctx.call(_CD, kind, needs=("ctypes_dlpack",), shown=_CD_SHOWN, x=x, target=_PURE_PYTHON)
        )
        yield from ctx.case(
            "import: from_dlpack(x)", size, ctx.call("tb.from_dlpack({x})", kind, x=x), *peers
        )


def _export(ctx: Context, size: int) -> Iterator[Case]:
    x_in = ctx.inputs(size)
    targets: dict[tuple[str, str], float | Target] = {
        ("np", "torch"): Target(1.0, 2.0),
        ("torch", "jax"): 1.0,
    }
    for lib, key in (("np", "numpy"), ("torch", "torch"), ("jnp", "jax")):
        peers = [
            ctx.call(
                f"{lib}.from_dlpack({{x}})",
                kind,
                needs=(key,),
                x=getattr(x_in, kind),
                target=targets.get((lib, kind)),
            )
            for kind in ("torch", "ndarray", "jax")
        ]
        yield from ctx.case(
            "export: consumer.from_dlpack(x)",
            size,
            ctx.call(f"{lib}.from_dlpack({{x}})", "tb", needs=(key,), x=x_in.tb),
            *peers,
        )


def _relay(ctx: Context, size: int) -> Iterator[Case]:
    a = ctx.inputs(size).ndarray
    for lib, key in (("np", "numpy"), ("torch", "torch")):
        wrap = f"{lib}.from_dlpack({{w}})"
        yield from ctx.case(
            "relay: consumer.from_dlpack(wrapper(ndarray))",
            size,
            ctx.call(wrap.format(w="tb.from_dlpack({x})"), "ndarray", needs=(key, "numpy"), x=a),
            ctx.call(wrap.format(w="torch.from_dlpack({x})"), "ndarray", needs=(key, "torch"), x=a),
            ctx.call(
                wrap.format(w=_CD),
                "ndarray",
                needs=(key, "ctypes_dlpack"),
                shown=wrap.format(w=_CD_SHOWN),
                x=a,
                target=_PURE_PYTHON,
            ),
            ctx.call(
                wrap.format(w="pydlpack.asdlpack({x})"),
                "ndarray",
                needs=(key, "pydlpack"),
                x=a,
                target=_PURE_PYTHON,
            ),
        )


def _capsule(ctx: Context, size: int) -> Iterator[Case]:
    x_in = ctx.inputs(size)
    yield from ctx.case(
        "capsule: to_dlpack / __dlpack__",
        size,
        ctx.call("tb.utils.dlpack.to_dlpack({x})", "t", x=x_in.tb),
        ctx.call(
            "torch.utils.dlpack.to_dlpack({x})",
            "pt",
            needs=("torch",),
            x=x_in.torch,
            target=Target(2.0, 4.0),
        ),
    )
    peers = [
        ctx.call("{x}.__dlpack__(max_version=(1, 0))", kind, needs=(key,), x=getattr(x_in, attr))
        for kind, key, attr in (
            ("pt", "torch", "torch"),
            ("a", "numpy", "ndarray"),
            ("ja", "jax", "jax"),
        )
    ]
    yield from ctx.case(
        "capsule: to_dlpack / __dlpack__",
        size,
        ctx.call("{x}.__dlpack__(max_version=(1, 0))", "t", x=x_in.tb),
        *peers,
    )


def cases(ctx: Context) -> Iterator[Case]:
    """Every DLPack case at every size."""
    for part in (_import, _export, _relay, _capsule):
        for size in ctx.sizes():
            yield from part(ctx, size)


if __name__ == "__main__":
    sys.exit(script_main(__name__))
