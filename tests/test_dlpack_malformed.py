"""Malformed DLPack capsules: every field of the managed structs set to a bad value raises cleanly.

Each case crafts a capsule with ctypes, imports it, and checks the exception, that the capsule
was left unconsumed, and that the producer's deleter then runs exactly once (through the capsule's
destructor). The cases run in-process (for the assertions) and once more in a child interpreter, so
that a crash in any of them fails a test instead of killing the run.
"""

from __future__ import annotations

import ctypes
import gc
import json
import pathlib

import pytest

import tensorbridge as tb
from tensorbridge._dtype import BY_DLPACK

U64 = 2**64
BAD_ADDRESS = U64 - 2**16  # above every user-space address


def _set(field, value, where="dl_tensor"):
    def mutate(producer):
        target = producer.managed.dl_tensor if where == "dl_tensor" else producer.managed
        setattr(target, field, value)

    return mutate


# (id, CraftedDLPack keyword arguments, mutation or None, exception, message fragment)
CASES = [
    ("major_0", {"version": (0, 9)}, None, BufferError, "major version"),
    ("major_2", {"version": (2, 0)}, None, BufferError, "major version"),
    ("major_max", {"version": (2**32 - 1, 0)}, None, BufferError, "major version"),
    ("ndim_negative", {}, _set("ndim", -1), BufferError, "ndim=-1"),
    ("ndim_65", {"shape": (1,) * 65}, None, BufferError, "ndim=65"),
    ("ndim_huge", {}, _set("ndim", 2**31 - 1), BufferError, "ndim=2147483647"),
    ("shape_null", {"null_shape": True}, None, BufferError, "shape NULL"),
    ("shape_negative", {"shape": (2, -2)}, None, BufferError, "negative size"),
    (
        "shape_pointer_outside",
        {},
        _set("shape", BAD_ADDRESS),
        BufferError,
        "outside the address space",
    ),
    (
        "strides_pointer_outside",
        {"strides": (1, 1, 1, 1)},
        _set("strides", BAD_ADDRESS),
        BufferError,
        "outside the address space",
    ),
    ("data_null", {"data": 0}, None, BufferError, "data is NULL"),
    ("data_wraps", {}, _set("data", U64 - 8), BufferError, "outside the address space"),
    (
        "byte_offset_huge",
        {},
        _set("byte_offset", U64 - 1),
        BufferError,
        "outside the address space",
    ),
    (
        "extent_overflows",
        {"shape": (2**62, 2**62), "strides": (2**62, 1)},
        None,
        BufferError,
        "outside the address space",
    ),
    (
        "numel_overflows",
        {"shape": (2**40, 2**40, 2**40)},
        None,
        BufferError,
        "outside the address space",
    ),
    (
        "stride_huge_positive",
        {"shape": (2, 2), "strides": (2**61, 1)},
        None,
        BufferError,
        "outside the address space",
    ),
    (
        "stride_huge_negative",
        {"shape": (2, 2), "strides": (-(2**61), 1)},
        None,
        BufferError,
        "outside the address space",
    ),
    (
        "stride_reaches_below_zero",
        {"shape": (4,), "strides": (-4,)},
        _set("data", 8),
        BufferError,
        "outside the address space",
    ),
    ("device_type_0", {"device": (0, 0)}, None, BufferError, "Unsupported device_type: 0"),
    ("device_type_5", {"device": (5, 0)}, None, BufferError, "Unsupported device_type: 5"),
    ("device_type_6", {"device": (6, 0)}, None, BufferError, "Unsupported device_type: 6"),
    ("device_type_19", {"device": (19, 0)}, None, BufferError, "Unsupported device_type: 19"),
    ("device_type_negative", {"device": (-1, 0)}, None, BufferError, "Unsupported device_type: -1"),
    ("dtype_code", {"dtype": (200, 32, 1)}, None, BufferError, "code=200"),
    ("dtype_bits", {"dtype": (2, 33, 1)}, None, BufferError, "bits=33"),
    ("dtype_lanes", {"dtype": (2, 32, 2)}, None, BufferError, "lanes=2"),
    ("dtype_lanes_zero", {"dtype": (2, 32, 0)}, None, BufferError, "lanes=0"),
    ("dtype_fp4_bits", {"dtype": (17, 8, 1)}, None, BufferError, "code=17, bits=8"),
    ("dtype_fp6_bits", {"dtype": (15, 8, 1)}, None, BufferError, "code=15, bits=8"),
    ("dtype_opaque", {"dtype": (3, 64, 1)}, None, BufferError, "code=3"),
    ("dtype_bool_bits", {"dtype": (6, 1, 1)}, None, BufferError, "code=6, bits=1"),
    (
        "capsule_used",
        {"name": b"used_dltensor_versioned"},
        None,
        RuntimeError,
        "consumed only once",
    ),
    ("capsule_foreign", {"name": b"numpy_dltensor"}, None, TypeError, "numpy_dltensor"),
]

# The same field defects in a legacy DLManagedTensor (it has no version and no flags).
LEGACY_CASES = [
    (f"legacy_{c[0]}", {**c[1], "versioned": False}, *c[2:])
    for c in CASES
    if not c[0].startswith(("major", "capsule"))
]
LEGACY_CASES.append(
    (
        "legacy_used",
        {"versioned": False, "name": b"used_dltensor"},
        None,
        RuntimeError,
        "consumed only once",
    )
)

ALL_CASES = CASES + LEGACY_CASES


def _make(crafted, kwargs, mutate):
    producer = crafted(**kwargs)
    if mutate is not None:
        mutate(producer)
    return producer


@pytest.mark.parametrize(
    ("kwargs", "mutate", "error", "words"),
    [c[1:] for c in ALL_CASES],
    ids=[c[0] for c in ALL_CASES],
)
def test_malformed_capsule_raises_and_stays_unconsumed(crafted, kwargs, mutate, error, words):
    """A malformed capsule raises the documented exception, stays unconsumed, and is freed once."""
    producer = _make(crafted, kwargs, mutate)
    with pytest.raises(error, match=words):
        tb.from_dlpack(producer.capsule)
    assert not producer.consumed or producer.name.startswith(b"used_")
    producer.capsule = None
    gc.collect()
    expected = 0 if producer.name.startswith((b"used_", b"numpy")) else 1
    assert producer.deleter_calls == expected


@pytest.mark.parametrize("versioned", [True, False])
def test_malformed_through_a_producer_object(crafted, versioned):
    """The same validation applies to capsules returned by ``__dlpack__``."""
    producer = crafted(dtype=(2, 32, 3), versioned=versioned)
    with pytest.raises(BufferError, match="lanes=3"):
        tb.from_dlpack(producer)
    gc.collect()
    assert producer.deleter_calls == 1


def test_harmless_field_values_are_accepted(crafted):
    """Odd but legal values import: any minor, manager_ctx, unknown flag bits, NULL deleter."""
    producer = crafted((1.0, 2.0), version=(1, 2**32 - 1), flags=U64 - 1 - 1 - 2, deleter=False)
    producer.managed.manager_ctx = 12345
    t = tb.from_dlpack(producer.capsule)
    assert t.tolist() == [1.0, 2.0]
    assert not t.is_readonly
    del t
    gc.collect()
    assert producer.deleter_calls == 0  # NULL deleter: nothing to call


def test_negative_device_id_is_accepted(crafted):
    """A negative device id (an unnumbered device) imports with no index."""
    producer = crafted((), shape=(2,), data=0x10000, device=(2, -1))
    assert tb.from_dlpack(producer.capsule).device == tb.device("cuda")


def test_dtype_sweep_never_crashes(crafted):
    """Every (code, bits, lanes) maps to a tensorbridge dtype or is a BufferError."""
    for code in range(20):
        for bits in (0, 1, 4, 6, 8, 16, 24, 32, 64, 128, 255):
            for lanes in (0, 1, 2, 4):
                producer = crafted((0,) * 64, fmt="B", dtype=(code, bits, lanes), shape=(2,))
                if (code, bits, lanes) in BY_DLPACK:
                    assert tb.from_dlpack(producer.capsule).dtype.dlpack == (code, bits, lanes)
                else:
                    with pytest.raises(
                        BufferError, match=f"code={code}, bits={bits}, lanes={lanes}"
                    ):
                        tb.from_dlpack(producer.capsule)


def test_null_named_capsule(crafted):
    """A capsule with a NULL name is a foreign capsule: TypeError naming None."""
    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi)
    )
    producer = crafted()
    with pytest.raises(TypeError, match="named None"):
        tb.from_dlpack(new(producer.address, None, None))


@pytest.mark.subprocess
def test_malformed_cases_do_not_crash_the_interpreter(subprocess_run):
    """Every malformed case, run in a child interpreter, raises instead of crashing it."""
    here = pathlib.Path(__file__)
    code = f"""
        import json, sys
        sys.path.insert(0, {str(here.parent)!r})
        import importlib.util
        spec = importlib.util.spec_from_file_location("malformed", {str(here)!r})
        malformed = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(malformed)
        from tensorbridge.testing import CraftedDLPack
        import tensorbridge as tb
        results = {{}}
        for name, kwargs, mutate, error, words in malformed.ALL_CASES:
            producer = malformed._make(CraftedDLPack, kwargs, mutate)
            try:
                tb.from_dlpack(producer.capsule)
            except Exception as exc:
                results[name] = type(exc).__name__
            else:
                results[name] = "no error"
        print(json.dumps(results))
    """
    result = subprocess_run(code)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert results == {name: error.__name__ for name, _, _, error, _ in ALL_CASES}
