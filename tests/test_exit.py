"""Interpreter exit with tensorbridge memory still alive, in every direction with NumPy and PyTorch.

Each scenario is a small program that leaves tensors, capsules (consumed or not), exported memory,
reference cycles and busy daemon threads behind as module globals. The interpreter must exit with
status 0 and print nothing at all: no traceback, no "Exception ignored in", no resource warning.
Each scenario runs alone, and all of them run together in one process, in both orders (module
globals are torn down in order, so the order changes who dies first), also under ``-X dev``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

_ROOT = Path(__file__).resolve().parents[1]

# name -> (peers it needs, program fragment). Fragments share one namespace when combined, so each
# uses its own prefix for globals.
SCENARIOS: dict[str, tuple[tuple[str, ...], str]] = {
    "tb capsules unconsumed": (
        (),
        """
        cu_t = tb.arange(10)
        cu_legacy = tb.to_dlpack(cu_t)
        cu_versioned = cu_t[2:].__dlpack__(max_version=(1, 3))
        cu_readonly = tb.frombuffer(b"abcdefgh", dtype=tb.uint8).__dlpack__(max_version=(1, 0))
    """,
    ),
    "tb capsule consumed by tb": (
        (),
        """
        cc_capsule = tb.to_dlpack(tb.arange(3))
        cc_t = tb.from_dlpack(cc_capsule)
    """,
    ),
    "held buffer exports": (
        (),
        """
        import mmap
        hb_bytes = bytearray(64)
        hb_t = tb.frombuffer(hb_bytes, dtype=tb.int32)
        hb_map = mmap.mmap(-1, 4096)
        hb_u = tb.frombuffer(hb_map, dtype=tb.uint8)[::3]
        hb_view = hb_t.as_memoryview()
        hb_pickled = pickle.PickleBuffer(hb_t.as_memoryview())
        hb_read_only = tb.asarray(memoryview(b"0123"))
    """,
    ),
    "mapped file": (
        (),
        """
        import os, tempfile
        mf_fd, mf_path = tempfile.mkstemp()
        os.write(mf_fd, bytes(4096)); os.close(mf_fd)
        mf_private = tb.from_file(mf_path, size=1024, dtype=tb.int32)
        mf_shared = tb.from_file(mf_path, shared=True, size=512, dtype=tb.int32)
        mf_read = tb.from_file(mf_path, size=16, dtype=tb.uint8, mode="r")
        os.unlink(mf_path)  # the mappings outlive the name
    """,
    ),
    "shared memory": (
        (),
        """
        sm_t = tb.arange(100).share_memory_()
        sm_view = sm_t[10:]
    """,
    ),
    "shared memory exported to a module torn down late": (
        (),
        """
        import builtins
        sl_t = tb.arange(10).share_memory_()
        builtins.tb_shared_late = [sl_t.as_memoryview(), sl_t.as_memoryview()[1:], sl_t[2:]]
        del sl_t
    """,
    ),
    "crafted producer": (
        (),
        """
        import ctypes
        from tensorbridge.testing import CraftedDLPack
        cp_block = (ctypes.c_float * 4)(1, 2, 3, 4)
        cp_at = ctypes.addressof(cp_block)
        cp_unconsumed = CraftedDLPack((), data=cp_at, shape=(4,), strides=(1,),
                                      keep=cp_block).take()
        cp_t = tb.from_dlpack(CraftedDLPack((), data=cp_at, shape=(2, 2), strides=(2, 1),
                                            keep=cp_block).take())
        cp_legacy = tb.from_dlpack(CraftedDLPack((), data=cp_at, shape=(4,), versioned=False,
                                                 keep=cp_block).take())
    """,
    ),
    "cycles": (
        (),
        """
        class CyBox:
            pass
        cy_box = CyBox()
        cy_box.me = cy_box
        cy_box.t = tb.arange(5)
        cy_box.capsule = tb.to_dlpack(cy_box.t)
        cy_box.view = tb.from_dlpack(cy_box.t.__dlpack__(max_version=(1, 0)))
        cy_list = [tb.frombuffer(bytearray(8), dtype=tb.int8)]
        cy_list.append(cy_list)
        del cy_box, cy_list  # only the garbage collector can free them now
    """,
    ),
    "daemon thread": (
        (),
        """
        import threading
        def dt_loop():
            base = tb.arange(64)
            while True:
                tb.from_dlpack(base[::2].__dlpack__(max_version=(1, 3)))
                tb.to_dlpack(base[1:])
        threading.Thread(target=dt_loop, daemon=True).start()
    """,
    ),
    "numpy holds tb": (
        ("numpy",),
        """
        import numpy as np
        nh_a = np.from_dlpack(tb.arange(10))
        nh_b = np.asarray(tb.arange(4.0)[::-1])
        nh_c = np.from_dlpack(tb.frombuffer(bytearray(16), dtype=tb.float32))
        nh_shared = tb.arange(10).share_memory_()
        nh_d = np.frombuffer(nh_shared.as_memoryview(), dtype=np.int64)
        del nh_shared
    """,
    ),
    "tb holds numpy": (
        ("numpy",),
        """
        import numpy as np
        th_t = tb.from_dlpack(np.arange(10))
        th_u = tb.asarray(np.arange(3.0))
        th_v = tb.frombuffer(np.zeros(8, dtype=np.uint8), dtype=tb.uint8)
    """,
    ),
    "numpy capsules": (
        ("numpy",),
        """
        import numpy as np
        nc_unconsumed = np.arange(3).__dlpack__()
        nc_versioned = np.arange(3).__dlpack__(max_version=(1, 0))
        nc_t = tb.from_dlpack(np.arange(4).__dlpack__(max_version=(1, 0)))
    """,
    ),
    "numpy cycles": (
        ("numpy",),
        """
        import numpy as np
        class NcBox:
            pass
        ncy = NcBox()
        ncy.me = ncy
        ncy.a = np.from_dlpack(tb.arange(3))
        ncy.t = tb.from_dlpack(ncy.a)
        ncy.b = np.from_dlpack(ncy.t[1:])
        del ncy
    """,
    ),
    "held by modules torn down late": (
        ("numpy",),
        """
        # Modules are cleared after __main__, in reverse order of import: pickle (imported before
        # tensorbridge) and builtins lose these only after tensorbridge's own modules are gone.
        import builtins
        import numpy as np
        pickle.tb_late = [np.from_dlpack(tb.arange(4)), tb.to_dlpack(tb.arange(2)),
                          tb.from_dlpack(np.arange(3)), tb.frombuffer(bytearray(8), dtype=tb.int8)]
        builtins.tb_late = [np.from_dlpack(tb.arange(5)[1:]), tb.to_dlpack(tb.arange(3))]
    """,
    ),
    "numpy daemon threads": (
        ("numpy",),
        """
        import threading
        import numpy as np
        def nd_loop():
            base = np.arange(64)
            while True:
                np.from_dlpack(tb.from_dlpack(base)[::2])
        for _ in range(2):
            threading.Thread(target=nd_loop, daemon=True).start()
    """,
    ),
    "torch": (
        ("torch",),
        """
        import torch
        from torch.utils import dlpack as torch_dlpack
        to_x = torch.from_dlpack(tb.arange(5))
        to_t = tb.from_dlpack(torch.arange(5.0))
        to_torch_capsule = torch_dlpack.to_dlpack(torch.ones(3))
        to_tb_capsule = tb.to_dlpack(tb.ones(3))
        to_imported = tb.from_dlpack(torch_dlpack.to_dlpack(torch.zeros(2)))
        to_chain = torch.from_dlpack(tb.from_dlpack(torch.arange(4)))
    """,
    ),
    "torch cycles and threads": (
        ("torch", "numpy"),
        """
        import threading
        import numpy as np
        import torch
        class TcBox:
            pass
        tc = TcBox()
        tc.me = tc
        tc.x = torch.from_dlpack(tb.from_dlpack(np.arange(6.0)))
        tc.t = tb.from_dlpack(tc.x)
        del tc
        # The thread holds tensors but is parked at exit: a daemon thread that is running PyTorch
        # code when the interpreter exits aborts the process ("terminate called without an
        # active exception"), with PyTorch alone too.
        tc_ready, tc_never = threading.Event(), threading.Event()
        def tc_hold():
            base = tb.arange(32)
            held = [tb.from_dlpack(torch.from_dlpack(base[1:])), torch.from_dlpack(base),
                    tb.from_dlpack(torch.arange(3))]
            tc_ready.set()
            tc_never.wait()
        threading.Thread(target=tc_hold, daemon=True).start()
        tc_ready.wait()
    """,
    ),
}

# A child that has not exited after this many seconds prints every thread's stack and exits 1, so a
# hang fails with the evidence. Under CPU starvation an exit is slow, not stuck: all scenarios
# together take 6-9 s on an idle 2-core machine and 20-30 s with both cores busy elsewhere, most
# of it importing the peers and, after the atexit hooks, the peers' own C-level finalization.
_DEADLINE = 240
_PRELUDE = (
    "import faulthandler, pickle, time\n"
    f"faulthandler.dump_traceback_later({_DEADLINE}, exit=True)\n"
    "import tensorbridge as tb\n"
)
# Give daemon threads time to be mid-conversion when the main thread ends.
_EPILOGUE = "time.sleep(0.05)\n"


def _program(names: list[str]) -> str:
    return _PRELUDE + "".join(textwrap.dedent(SCENARIOS[name][1]) for name in names) + _EPILOGUE


def _run(program: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *options, "-c", program],
        capture_output=True,
        text=True,
        cwd=_ROOT,
        timeout=_DEADLINE + 60,
        check=False,
    )


def _skip_without(peers: tuple[str, ...]) -> None:
    for peer in peers:
        pytest.importorskip(peer)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_exit_is_silent(name: str) -> None:
    """The interpreter exits 0 and prints nothing with this kind of tensorbridge memory still
    alive."""
    _skip_without(SCENARIOS[name][0])
    proc = _run(_program([name]))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


@pytest.mark.parametrize("order", ["forward", "reversed"])
def test_exit_is_silent_with_everything_alive(order: str) -> None:
    """All scenarios at once, in -X dev mode (resource warnings shown), exit 0 and print nothing."""
    names = [
        name for name, (peers, _) in SCENARIOS.items() if all(_importable(peer) for peer in peers)
    ]
    if order == "reversed":
        names.reverse()
    # Busy daemon threads start last: started earlier, they would starve the main thread of the GIL
    # while it imports PyTorch (seconds, not milliseconds).
    names.sort(key=lambda name: "thread" in name)
    proc = _run(_program(names), "-X", "dev")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
