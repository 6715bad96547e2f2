"""Soak-specific tools for the safety tests (soak, threads, hostile, faults).

* `ExportCounter` counts tensorbridge's own capsule exports and releases, on whatever thread they
  happen.
* `isolated` runs a test in a forked child, so that a crash fails that test alone.

The crafted DLPack producer and fenced memory these tests feed tensorbridge are in
`tensorbridge.testing` (`CraftedDLPack`, `Fenced`, `stats`). Nothing here imports NumPy or PyTorch,
nor pytest outside `isolated`: child interpreters import this module by name.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import pickle
import signal
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from tensorbridge import _capi, _dlpack_export, _exports, _native
from tensorbridge._dlpack_abi import DLPackDeleter

__all__ = ["ExportCounter", "isolated"]


class ExportCounter:
    """Counts tensorbridge's capsule exports and releases from now on, on whatever thread they
    happen.

    Exports: the registry calls ``_dlpack_export`` makes for each export (``hold_managed`` and
    ``hold_capsule``, module globals it looks up at each call) are wrapped. Releases: the reaper calls the module's
    ``_exports.forget_managed``, which is wrapped; in the compiled build the capsule destructor,
    which releases untaken capsules through ``_exports.forget_unwatched``, is given a counting
    wrapper of that; the deleter that consumers call through the
    managed struct's C function pointer binds the unwrapped one, so exports made from now on get a
    counting trampoline as their ``deleter`` (``_dlpack_export._DELETER_ADDRESS`` is swapped)
    that counts the call (``deleter``, and ``releases``) and forwards it to the deleter that was
    set before. Nothing inside the module is rebound, so this counts the same whether
    ``_dlpack_export`` is compiled or not. ``itertools.count`` makes each count one atomic C call.
    """

    def __init__(self) -> None:
        self._exports, self._releases, self._deleter = (
            itertools.count(),
            itertools.count(),
            itertools.count(),
        )
        hold_managed, hold_capsule = _dlpack_export.hold_managed, _dlpack_export.hold_capsule
        release, forget_unwatched = _exports.forget_managed, _exports.forget_unwatched
        exports, releases, deleter_calls = self._exports, self._releases, self._deleter
        forward = DLPackDeleter(_dlpack_export._DELETER_ADDRESS)

        def counted_hold_managed(*args: Any) -> None:
            next(exports)
            hold_managed(*args)

        def counted_hold_capsule(*args: Any) -> None:
            next(exports)
            hold_capsule(*args)

        def counted_release(address: int, *args: Any) -> object:
            next(releases)
            return release(address, *args)

        def counted_unwatched_release(address: int, default: object) -> object:
            next(releases)
            return forget_unwatched(address, default)

        @DLPackDeleter
        def counted_deleter(address: int | None) -> None:
            next(deleter_calls)
            next(releases)
            forward(address)

        # Consumers may call the trampoline after this counter is gone, up to interpreter exit.
        _capi.keep_forever(counted_deleter)
        _dlpack_export.hold_managed = counted_hold_managed
        _dlpack_export.hold_capsule = counted_hold_capsule
        _exports.forget_managed = counted_release
        if _dlpack_export._CAPSULE_DESTRUCTOR is not None:
            # Compiled: the capsules' C destructor releases through the callable it was given.
            _native.dlpack_capsule_destructor(counted_unwatched_release)
        _dlpack_export._DELETER_ADDRESS = ctypes.cast(counted_deleter, ctypes.c_void_p).value

    @staticmethod
    def _value(counter: itertools.count[int]) -> int:
        return int(repr(counter)[len("count(") : -1])

    def counts(self) -> dict[str, int]:
        """``exports``, ``releases`` (deleter + reaper) and ``deleter`` calls so far."""
        return {
            "exports": self._value(self._exports),
            "releases": self._value(self._releases),
            "deleter": self._value(self._deleter),
        }

    @staticmethod
    def registry() -> int:
        """Exports tensorbridge still holds (not yet released)."""
        return len(_exports._MANAGED) + len(_exports._PENDING)


def isolated(test: Callable[..., None]) -> Callable[..., None]:
    """Run the test ``test`` in a forked child; report its failure, skip or crash in the parent.

    A test whose subject may crash the interpreter then fails alone, naming the signal, instead of
    killing the whole run. Objects left alive by the test are never finalised (the child leaves with
    ``os._exit``). Imports pytest lazily, so child interpreters can use this module without it.
    """
    import pytest

    if not hasattr(os, "fork"):
        return test

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        read, write = os.pipe()
        with warnings.catch_warnings():
            # 3.12+ warns about forking a multi-threaded process, and JAX's at-fork hook warns
            # (RuntimeWarning) once JAX is imported; the child runs only tensorbridge code.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            pid = os.fork()
        if pid == 0:  # the child: run the test, send the outcome, leave without any cleanup
            os.close(read)
            try:
                test(*args, **kwargs)
                outcome: tuple[str, str] = ("passed", "")
            except pytest.skip.Exception as exc:
                outcome = ("skipped", str(exc))
            except BaseException:  # any failure is reported to the parent
                outcome = ("failed", traceback.format_exc())
            with os.fdopen(write, "wb") as pipe:
                pipe.write(pickle.dumps(outcome))
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            pytest.fail(f"crashed: {signal.Signals(os.WTERMSIG(status)).name}", pytrace=False)
        kind, text = pickle.loads(data)
        if kind == "skipped":
            pytest.skip(text)
        if kind == "failed":
            pytest.fail(text, pytrace=False)

    return run
