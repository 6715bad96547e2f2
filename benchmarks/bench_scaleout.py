"""Across processes: ``ray.get`` from Ray's object store, and a Dask round trip.

Rows:
  * ray.get -- at 64 MiB and 1 GiB, ``ray.get`` of a stored tensorbridge tensor (a read-only view of
    the store's memory) next to a NumPy array (read-only, zero-copy), a PyTorch tensor pickled the
    default way (a copy on every get) and a PyTorch tensor stored with Ray's zero-copy opt-in
    (``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1``: a writable tensor over the shared store).
  * dask round trip -- a tensor sent to a worker of ``LocalCluster(processes=True)`` and back
    (``client.submit(...).result()``, at the sizes up to 1 MiB), next to NumPy and PyTorch.
  * dask result, dask gather, dask gather direct -- a 16 MiB float32 and a 16 MiB bfloat16
    tensor made on a worker, fetched by ``future.result()`` and ``client.gather([future])`` (both
    through the scheduler) and ``client.gather([future], direct=True)`` (from the worker), next to
    a 16 MiB float32 NumPy array and PyTorch tensor fetched the same way; target: within 1.3x of
    NumPy. Every fetch moves the bytes between processes, so these rows are timed although they
    copy.

Starting Ray or a Dask cluster takes seconds, so these rows are left out of ``--quick`` runs
(a budget under 0.1 s per call) unless this script is named with ``--only``. Each peer is
optional: its rows are left out when it is not installed, or not selected with ``--peers``
(``ray`` and ``dask`` name the transports there).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import tensorbridge as tb
from tensorbridge.testing import local_ray

if __package__:
    from ._harness import Call, Case, Context, GiB, MiB, script_main
else:  # run as a file: python benchmarks/bench_scaleout.py
    from _harness import Call, Case, Context, GiB, MiB, script_main

RAY_SIZES = (64 * MiB, GiB)
DASK_FETCH_SIZE = 16 * MiB
DASK_FETCH_TARGET = 1.3  # tensorbridge / NumPy, per fetch
_QUICK_BUDGET = 0.1  # seconds per call: below this the run is --quick


def _wanted(ctx: Context, transport: str) -> bool:
    settings = ctx.settings
    if settings.peers is not None and transport not in settings.peers:
        return False
    named = __name__.rpartition(".")[2] in settings.only
    return settings.budget >= _QUICK_BUDGET or named


def _import(name: str) -> Any:
    try:
        return __import__(name, fromlist=["_"])
    except ImportError:
        return None


# --------------------------------------------------------------------------------------------------
# Ray


@contextlib.contextmanager
def _local_ray() -> Iterator[Any]:
    """`tensorbridge.testing.local_ray`, or None without Ray."""
    if _import("ray") is None:
        yield None
        return
    with local_ray() as ray:
        yield ray


def _put_torch_zero_copy(ray: Any, x: Any) -> Any:
    """``ray.put`` with Ray's zero-copy opt-in for torch, which RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1
    enables when Ray starts: the same reducer, registered for this one put (None if unavailable)."""
    try:
        import torch
        from ray._private import tensor_serialization_utils as tsu
        from ray._private.worker import global_worker

        context = global_worker.get_serialization_context()
        context._register_cloudpickle_reducer(torch.Tensor, tsu.zero_copy_tensors_reducer)
    except (ImportError, AttributeError):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # it warns that writes reach the shared store
            return ray.put(x)
    finally:
        context._unregister_cloudpickle_reducer(torch.Tensor)


def _ray_get(ctx: Context) -> Iterator[Case]:
    if not _wanted(ctx, "ray") or _import("ray") is None:
        return
    with _local_ray() as ray:
        for size in RAY_SIZES:
            x_in = ctx.inputs(size)
            refs: dict[str, Any] = {"t": ray.put(x_in.tb)}
            if x_in.ndarray is not None:
                refs["a"] = ray.put(x_in.ndarray)
            if x_in.torch is not None:
                refs["pt"] = ray.put(x_in.torch)
                refs["pt_zc"] = _put_torch_zero_copy(ray, x_in.torch)
            yield from ctx.case(
                "ray.get",
                size,
                ctx.call(
                    "ray.get({x})", "ref", shown="ray.get(ref of a tb tensor)", x=refs["t"], ray=ray
                ),
                ctx.call(
                    "ray.get({x})",
                    shown="ray.get(ref of an ndarray)",
                    target=3.0,
                    x=refs.get("a"),
                    ray=ray,
                ),
                ctx.call(
                    "ray.get({x})",
                    shown="ray.get(ref of a torch tensor)",
                    x=refs.get("pt"),
                    ray=ray,
                ),
                ctx.call(
                    "ray.get({x})",
                    shown="ray.get(ref of a torch tensor, ZERO_COPY_TORCH)",
                    x=refs.get("pt_zc"),
                    ray=ray,
                ),
            )
            del refs  # frees the store before the next size


# --------------------------------------------------------------------------------------------------
# Dask

# A view of the same object on the worker, importable there by reference (tb, NumPy and PyTorch).
_SAME = operator.methodcaller("reshape", -1)


@contextlib.contextmanager
def _local_dask() -> Iterator[Any]:
    distributed = _import("distributed")
    if distributed is None:
        yield None
        return
    cluster = distributed.LocalCluster(
        processes=True,
        n_workers=1,
        threads_per_worker=1,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    try:
        with distributed.Client(cluster) as client:
            yield client
    finally:
        cluster.close()


def _dask_round_trip(ctx: Context) -> Iterator[Case]:
    sizes = ctx.sizes(max_size=MiB)
    if not sizes or not _wanted(ctx, "dask") or _import("distributed") is None:
        return
    stmt = "client.submit(same, {x}, pure=False).result()"
    with _local_dask() as client:
        for size in sizes:
            x_in = ctx.inputs(size)
            env = {"client": client, "same": _SAME}
            yield from ctx.case(
                "dask round trip",
                size,
                ctx.call(stmt, "t", x=x_in.tb, **env),
                ctx.call(stmt, "a", x=x_in.ndarray, **env),
                ctx.call(stmt, "pt", x=x_in.torch, **env),
            )


# How each row fetches a future that lives on the worker ({x}: the future).
_FETCHES = (
    ("dask result", "{x}.result()"),
    ("dask gather", "client.gather([{x}])"),
    ("dask gather direct", "client.gather([{x}], direct=True)"),
)
_FETCHED = (("tb float32", "float32"), ("tb bfloat16", "bfloat16"))


def _on_worker(client: Any, ctx: Context) -> dict[str, Any]:
    """Futures of 16 MiB of ones made on the worker, by what they hold: tb float32 and bfloat16,
    NumPy and PyTorch float32 (where installed). The makers are imported there by reference."""
    futures = {}
    for label, name in _FETCHED:
        dtype = getattr(tb, name)
        futures[label] = client.submit(
            tb.ones, DASK_FETCH_SIZE // dtype.itemsize, dtype=dtype, pure=False
        )
    n = DASK_FETCH_SIZE // 4
    if ctx.np is not None:
        futures["ndarray float32"] = client.submit(ctx.np.ones, n, dtype=ctx.np.float32, pure=False)
    if ctx.torch is not None:
        futures["torch float32"] = client.submit(
            ctx.torch.ones, n, dtype=ctx.torch.float32, pure=False
        )
    _import("distributed").wait(list(futures.values()))
    return futures


def _dask_fetches(ctx: Context) -> Iterator[Case]:
    if not _wanted(ctx, "dask") or _import("distributed") is None:
        return
    with _local_dask() as client:
        futures = _on_worker(client, ctx)

        def fetch(template: str, held: str, target: float | None = None) -> Call | None:
            return ctx.call(
                template,
                "f",
                shown=f"{template}, f: {held}",
                target=target,
                x=futures.get(held),
                client=client,
            )

        for group, template in _FETCHES:
            for label, _ in _FETCHED:
                yield from ctx.case(
                    group,
                    DASK_FETCH_SIZE,
                    fetch(template, label),
                    fetch(template, "ndarray float32", DASK_FETCH_TARGET),
                    fetch(template, "torch float32"),
                    transfer=True,
                )


def cases(ctx: Context) -> Iterator[Case]:
    """``ray.get`` at 64 MiB and 1 GiB, a Dask round trip up to 1 MiB, and Dask results and
    gathers of 16 MiB, where installed."""
    yield from _ray_get(ctx)
    yield from _dask_round_trip(ctx)
    yield from _dask_fetches(ctx)


if __name__ == "__main__":
    sys.exit(script_main(__name__))
