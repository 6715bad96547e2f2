"""Tensors across CPython 3.14's subinterpreters (``concurrent.interpreters``, PEP 734).

Each case runs in a child process (an interpreter that misbehaves must fail the test, not the run):
``import tensorbridge`` in an interpreter with its own GIL, in both builds (a compiled install runs
its ``.py`` files there and says so in ``build_info()``); tensors through ``Queue.put``/``get`` and
``InterpreterPoolExecutor`` (pickled: a copy that keeps dtype, shape, strides and read-only-ness);
``to_shareable``/``from_shareable`` (the same memory: writes seen both ways, read-only kept); the
memory's lifetime when the sending interpreter is closed first, and its release in the interpreter
that owns it; two threads, each with its own interpreter, under garbage collection.
"""

from __future__ import annotations

import json
import os
import pathlib
import textwrap
from typing import Any

import pytest

pytest.importorskip("concurrent.interpreters", reason="CPython 3.14's concurrent.interpreters")

PRELUDE = """
import gc, json, sys, textwrap, threading, time
from concurrent import interpreters
import tensorbridge as tb

def result(value):
    print("RESULT " + json.dumps(value), flush=True)

def describe(t):
    return [t.dtype.name, list(t.shape), list(t.stride()), t.is_readonly, t.requires_grad]

def run_in(interp, code):
    interp.exec(textwrap.dedent(code))
"""


@pytest.fixture
def run(subprocess_run):
    """Run PRELUDE + ``code`` in a fresh process; the JSON of its last ``RESULT`` line."""

    def run(code: str, env: dict[str, str] | None = None) -> Any:
        proc = subprocess_run(PRELUDE + textwrap.dedent(code), timeout=180, env=env)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        return json.loads(lines[-1][len("RESULT ") :])

    return run


def test_import_in_an_own_gil_interpreter_and_build_info_there(run):
    got = run(
        """
        interp = interpreters.create()  # the "isolated" config: its own GIL and allocator
        q = interpreters.create_queue()
        interp.prepare_main(q=q)
        run_in(interp, '''
            import json, tensorbridge as tb, tensorbridge._tensor as m
            i = tb.build_info()
            q.put(json.dumps([i.kind, i.reason, m.__file__.endswith(".py"), tb.arange(3).tolist()]))
        ''')
        sub = json.loads(q.get())
        interp.close()
        import tensorbridge._tensor as m
        info = tb.build_info()
        result({"main": [info.kind, info.reason, m.__file__.endswith(".py")], "sub": sub})
        """
    )
    sub_kind, sub_reason, sub_source, values = got["sub"]
    main_kind, _, main_source = got["main"]
    assert sub_kind == "pure-python" and sub_source and values == [0, 1, 2]
    if main_kind == "compiled":  # a compiled install: the main interpreter keeps it
        assert not main_source
        assert "subinterpreter" in sub_reason


def test_queue_put_and_get_keep_dtype_layout_and_read_only_both_ways(run):
    """A tensor on a queue is pickled: a copy, with dtype, shape, strides, read-only-ness and
    requires_grad kept (a view with gaps arrives as a contiguous copy of its values)."""
    got = run(
        """
        CASES = '''
        def cases():
            return [
                tb.arange(6, dtype=tb.float32).to(tb.bfloat16).reshape(2, 3).T,
                tb.arange(4, dtype=tb.float32).to(tb.float8_e4m3fn),
                tb.frombuffer(b"abcdefgh", dtype=tb.int16),
                tb.arange(12, dtype=tb.int32).reshape(3, 4)[::2, 1::2],
                tb.ones(3).requires_grad_(),
            ]
        '''
        exec(textwrap.dedent(CASES))
        interp = interpreters.create()
        to_sub, to_main = interpreters.create_queue(), interpreters.create_queue()
        interp.prepare_main(to_sub=to_sub, to_main=to_main)
        interp.exec(PRELUDE_SUB)
        run_in(interp, CASES)
        sent = cases()
        for t in sent:
            to_sub.put(t)
        run_in(interp, '''
            for _ in range(5):
                u = to_sub.get()
                to_main.put(json.dumps([describe(u), u.to(tb.float32).tolist(), u.data_ptr()]))
            for t in cases():
                to_main.put(t)
        ''')
        into_sub = [json.loads(to_main.get()) for _ in sent]
        into_main = [to_main.get() for _ in sent]
        interp.close()
        result({
            "sent": [[describe(t), t.to(tb.float32).tolist(), t.data_ptr()] for t in sent],
            "into_sub": into_sub,
            "into_main": [[describe(u), u.to(tb.float32).tolist()] for u in into_main],
        })
        """.replace("PRELUDE_SUB", repr(PRELUDE))
    )
    for (layout, values, ptr), (layout_sub, values_sub, ptr_sub), (layout_main, values_main) in zip(
        got["sent"], got["into_sub"], got["into_main"], strict=True
    ):
        assert values == values_sub == values_main
        assert ptr_sub != ptr  # pickled: a copy
        gapped = layout[0] == "int32"  # the stepped view: packed into a contiguous copy
        expected = [layout[0], layout[1], [2, 1], *layout[3:]] if gapped else layout
        assert layout_sub == expected == layout_main


def test_interpreter_pool_executor_arguments_and_results(run, tmp_path: pathlib.Path):
    """``submit(f, t)``: the tensor argument and result keep their description (pickled); a
    ``to_shareable`` tuple crosses as the same memory, both ways."""
    (tmp_path / "tb_interp_tasks.py").write_text(
        textwrap.dedent(
            """
            import tensorbridge as tb

            def describe(t):
                return (t.dtype.name, tuple(t.shape), t.stride(), t.is_readonly, t.to(tb.float32).tolist())

            def transposed_bf16(n):
                return tb.arange(n * 2, dtype=tb.float32).to(tb.bfloat16).reshape(2, n).T

            def fill_and_share(shared, value):
                t = tb.from_shareable(shared)
                t[:] = value
                out = tb.full((2,), value * 2)
                return tb.to_shareable(out), t.data_ptr()
            """
        )
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    got = run(
        """
        from concurrent.futures import InterpreterPoolExecutor
        import tb_interp_tasks as tasks

        t = tb.arange(6, dtype=tb.float32).to(tb.bfloat16).reshape(3, 2).T
        ro = tb.frombuffer(b"\\x01\\x00\\x02\\x00", dtype=tb.int16)
        z = tb.zeros(4)
        with InterpreterPoolExecutor(max_workers=2) as pool:
            argument = pool.submit(tasks.describe, t).result()
            argument_ro = pool.submit(tasks.describe, ro).result()
            back = pool.submit(tasks.transposed_bf16, 3).result()
            shared, ptr = pool.submit(tasks.fill_and_share, tb.to_shareable(z), 3.0).result()
            out = tb.from_shareable(shared)
            out_values = out.tolist()
        result({
            "argument": argument, "expected": tasks.describe(t),
            "argument_ro": argument_ro,
            "back": describe(back), "back_values": back.to(tb.float32).tolist(),
            "same_memory": ptr == z.data_ptr(), "z": z.tolist(), "out": out_values,
        })
        """,
        env={"PYTHONPATH": path},
    )
    assert got["argument"] == got["expected"]
    assert got["argument"][:3] == ["bfloat16", [2, 3], [1, 2]]
    assert got["argument_ro"][3] is True and got["argument_ro"][4] == [1.0, 2.0]
    assert got["back"] == ["bfloat16", [3, 2], [1, 3], False, False]
    assert got["back_values"] == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert got["same_memory"] and got["z"] == [3.0] * 4 and got["out"] == [6.0, 6.0]


def test_shareable_tensors_are_the_same_memory_both_ways(run):
    got = run(
        """
        interp = interpreters.create()
        q = interpreters.create_queue()
        interp.prepare_main(q=q)
        interp.exec("import tensorbridge as tb")
        t = tb.zeros(4)
        ro = tb.frombuffer(b"\\x01\\x02\\x03\\x04", dtype=tb.uint8)
        q.put(tb.to_shareable(t))
        q.put(tb.to_shareable(ro))
        run_in(interp, '''
            u = tb.from_shareable(q.get())
            r = tb.from_shareable(q.get())
            u[1] = 5.0
            try:
                r[0] = 9
                refused = False
            except Exception:
                refused = True
            mine = tb.arange(3, dtype=tb.float64)
            q.put((u.data_ptr(), r.data_ptr(), r.is_readonly, refused))
            q.put(tb.to_shareable(mine))
        ''')
        u_ptr, r_ptr, r_readonly, refused = q.get()
        mine = tb.from_shareable(q.get())
        t[2] = 7.0
        mine[0] = -1.0
        interp.exec("q.put((u.tolist(), mine.tolist()))")
        seen_in_sub, mine_in_sub = q.get()
        interp.close()
        result({
            "ptrs": [u_ptr == t.data_ptr(), r_ptr == ro.data_ptr()],
            "r": [r_readonly, refused, ro.tolist()],
            "t": t.tolist(), "seen_in_sub": seen_in_sub, "mine_in_sub": mine_in_sub,
        })
        """
    )
    assert got["ptrs"] == [True, True]
    assert got["r"] == [True, True, [1, 2, 3, 4]]
    assert got["t"] == [0.0, 5.0, 7.0, 0.0] == got["seen_in_sub"]
    assert got["mine_in_sub"] == [-1.0, 1.0, 2.0]


# What a subinterpreter sends (``t`` in it), and what the receiver builds from it.
SENDS = {
    "to_shareable": ("tb.to_shareable(t[::-1])", "tb.from_shareable"),
    "as_memoryview": ("t.as_memoryview()", "tb.asarray"),
    "memoryview": ("memoryview(t)", "tb.asarray"),
    "pickle5-buffer": (
        "[bufs := [], pickle.dumps(t, protocol=5, buffer_callback=bufs.append)][0][0].raw()",
        "(lambda raw: tb.frombuffer(raw, dtype=tb.float32))",
    ),
}


@pytest.mark.parametrize("how", SENDS)
def test_memory_lives_after_the_sending_interpreter_is_closed(run, how):
    """The receiver's tensor stays valid when the interpreter that made and sent the memory is
    closed first (CPython then cannot release the export, and the memory is kept, not freed),
    through every way a subinterpreter hands out a view of a tensor's memory."""
    send, receive = SENDS[how]
    got = run(
        f"""
        kept = []
        for round in range(10):
            interp = interpreters.create()
            q = interpreters.create_queue()
            interp.prepare_main(q=q, n=round)
            run_in(interp, '''
                import pickle
                import tensorbridge as tb
                t = tb.full((1 << 16,), float(n))
                q.put({send})
            ''')
            u = {receive}(q.get())
            interp.close()
            del interp, q
            gc.collect()
            churn = [tb.full((1 << 16,), -1.0) for _ in range(4)]  # reuse freed memory, if any
            kept.append(u)
        for u in kept:
            u[0] = u[0].item() + 0.5
        result([[u.shape[0], u[0].item(), u[1].item(), u[-1].item()] for u in kept])
        """
    )
    for n, (size, first, second, last) in enumerate(got):
        assert size == 1 << 16
        assert (first, second, last) == (n + 0.5, n, n)


def test_the_export_is_released_in_the_interpreter_that_owns_it(run):
    """A bytearray shared into another interpreter cannot be resized while a view there lives, and
    can be again once that view dies (del, or the interpreter closed)."""
    got = run(
        """
        def resizable(owner, deadline=5.0):
            end = time.monotonic() + deadline
            while True:  # the release is a pending call this interpreter runs soon after
                try:
                    owner.extend(b"!")
                    return True
                except BufferError:
                    if time.monotonic() > end:
                        return False
                    time.sleep(0.01)

        outcomes = []
        for close in (False, True):
            owner = bytearray(b"abcdefgh")
            interp = interpreters.create()
            q = interpreters.create_queue()
            interp.prepare_main(q=q)
            q.put(tb.to_shareable(tb.frombuffer(owner, dtype=tb.uint8)))
            gc.collect()
            interp.exec("import tensorbridge as tb; u = tb.from_shareable(q.get()); q.put(bytes(u.as_memoryview()))")
            seen = q.get()
            locked = not resizable(owner, 0.05)
            if close:
                interp.close()
            else:
                interp.exec("import gc; del u; gc.collect()")
            outcomes.append([seen.decode(), locked, resizable(owner)])
            if not close:
                interp.close()
        result(outcomes)
        """
    )
    assert got == [["abcdefgh", True, True], ["abcdefgh", True, True]]


def test_two_threads_each_with_its_own_interpreter_under_collections(run):
    got = run(
        """
        shared = tb.zeros((2, 200), dtype=tb.int64)
        errors = []

        def work(row):
            interp = interpreters.create()
            try:
                q = interpreters.create_queue()
                interp.prepare_main(q=q, row=row)
                q.put(tb.to_shareable(shared))
                run_in(interp, '''
                    import gc
                    import tensorbridge as tb
                    out = tb.from_shareable(q.get())
                    for i in range(200):
                        t = tb.arange(64, dtype=tb.float32).reshape(8, 8).T
                        u = tb.from_dlpack(t)
                        v = tb.from_shareable(tb.to_shareable(u[::2]))
                        assert v.tolist() == t[::2].tolist()
                        out[row, i] = i + 1
                        if i % 20 == 0:
                            gc.collect()
                ''')
            except BaseException as exc:
                errors.append(repr(exc))
            finally:
                interp.close()

        threads = [threading.Thread(target=work, args=(row,)) for row in range(2)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            gc.collect()
        result({"errors": errors, "rows": [row == list(range(1, 201)) for row in shared.tolist()]})
        """
    )
    assert got == {"errors": [], "rows": [True, True]}
