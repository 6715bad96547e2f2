"""NumPy, PyTorch, JAX, pyarrow and CuPy, each as a `Side` (the other peers are in `peers_ml`,
`peers_dlpack` and `peers_frames`; `registry` names them all). A side imports its library when it
is made, never before, and only in the peer's own process (`child`)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any, Final

import tensorbridge as tb
from tensorbridge.testing import DTYPES

from .errors import Unavailable
from .sides import ALIGN, Side, format_dtype, is_buffer, skip

__all__ = ["CupySide", "JaxSide", "NumpySide", "PyArrowSide", "TorchSide"]


class NumpySide(Side):
    key, label, protocol = "numpy", "numpy", "both"

    def __init__(self) -> None:
        np = importlib.import_module("numpy")
        self.np = np
        self._dtypes: dict[str, Any] = {}
        for d in DTYPES:
            try:
                self._dtypes[d.name] = np.dtype(d.name)
            except TypeError:
                continue
        try:  # ml_dtypes registers bfloat16 and the float8 family with NumPy
            ml_dtypes = importlib.import_module("ml_dtypes")
        except ImportError:
            return
        for d in DTYPES:
            if d.name not in self._dtypes and hasattr(ml_dtypes, d.name):
                self._dtypes[d.name] = np.dtype(getattr(ml_dtypes, d.name))

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype not in self._dtypes or device != "cpu":
            return super().make(dtype, raw, device)
        return self.np.frombuffer(raw, dtype=self._dtypes[dtype]).copy()

    def place(self, dtype: str, raw: bytes, aligned: bool) -> Any:
        if dtype not in self._dtypes:
            return None
        np = self.np
        block = np.zeros(len(raw) + 2 * ALIGN, dtype=np.uint8)
        start = skip(int(block.ctypes.data), aligned)
        block[start : start + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        return block[start : start + len(raw)].view(self._dtypes[dtype])

    def read(self, x: Any) -> bytes:
        return bytes(x.tobytes())

    def poke(self, x: Any) -> bool:
        if not x.flags.writeable:
            return False
        b = x.reshape(-1).view(self.np.uint8)
        b[0] ^= 1
        return True

    def address(self, x: Any) -> int:
        return int(x.__array_interface__["data"][0])

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype.name)

    def readonly(self, x: Any) -> bool | None:
        return not x.flags.writeable

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        np = self.np
        found: list[tuple[str, Callable[[], Any]]] = []
        if hasattr(obj, "__dlpack__"):
            found.append(("np.from_dlpack", lambda: np.from_dlpack(obj)))
        if is_buffer(obj):
            found.append(
                (
                    "np.frombuffer",
                    lambda: np.frombuffer(obj, dtype=self._dtypes[format_dtype(obj)]),
                )
            )
        found.append(("np.asarray", lambda: self._asarray(obj)))
        return found

    def _asarray(self, obj: Any) -> Any:
        y = self.np.asarray(obj)
        if y.dtype == object:  # NumPy wraps what it cannot read in an object array
            msg = f"np.asarray made an object array of {type(obj).__name__}"
            raise Unavailable(msg)
        return y


class TorchSide(Side):
    key, label, protocol, has_readonly = "torch", "torch", "both", False

    def __init__(self) -> None:
        torch = importlib.import_module("torch")
        self.torch = torch
        self._dtypes = {
            d.name: getattr(torch, d.name)
            for d in DTYPES
            if isinstance(getattr(torch, d.name, None), torch.dtype)
        }

    def devices(self) -> tuple[str, ...]:
        found = ["cpu"]
        if self.torch.cuda.is_available():
            found += [f"cuda:{i}" for i in range(self.torch.cuda.device_count())]
        return tuple(found)

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype not in self._dtypes:
            return super().make(dtype, raw, device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex32 is "experimental"
            x = self.torch.frombuffer(bytearray(raw), dtype=self._dtypes[dtype]).clone()
        return x if device == "cpu" else x.to(device)

    def read(self, x: Any) -> bytes:
        return bytes(x.detach().cpu().contiguous().view(self.torch.uint8).reshape(-1).tolist())

    def poke(self, x: Any) -> bool:
        b = x.detach().view(self.torch.uint8).reshape(-1)
        b[0] = int(b[0]) ^ 1
        return True

    def address(self, x: Any) -> int:
        return int(x.data_ptr())

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype).removeprefix("torch.")

    def readonly(self, x: Any) -> bool | None:
        return None

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        torch = self.torch
        if hasattr(obj, "__dlpack__"):
            return [("torch.from_dlpack", lambda: torch.from_dlpack(obj))]
        if not is_buffer(obj):
            msg = f"torch takes no {type(obj).__name__}"
            raise Unavailable(msg)
        dtype = self._dtypes[format_dtype(obj)]
        return [("torch.frombuffer", lambda: torch.frombuffer(obj, dtype=dtype))]


class JaxSide(Side):
    key, label, protocol = "jax", "jax", "dlpack"
    needs_alignment = 64  # XLA on CPU copies memory that is not 64-byte aligned

    def __init__(self) -> None:
        self.jax = importlib.import_module("jax")
        self.jnp = importlib.import_module("jax.numpy")
        self.np = importlib.import_module("numpy")
        self._numpy = NumpySide()

    def devices(self) -> tuple[str, ...]:
        names = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "rocm": "rocm"}
        return tuple(
            "cpu" if d.platform == "cpu" else f"{names.get(d.platform, d.platform)}:{d.id}"
            for d in self.jax.devices()
        )

    def dtypes(self) -> tuple[str, ...]:
        return self._numpy.dtypes()

    def _device(self, device: str) -> Any:
        platform_ = "gpu" if device.startswith("cuda") else device.split(":", maxsplit=1)[0]
        try:
            return self.jax.devices(platform_)[0]
        except RuntimeError as exc:
            raise Unavailable(str(exc)) from None

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        host = self._numpy.make(dtype, raw, "cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = self.jax.device_put(host, self._device(device))
        if x.dtype != host.dtype:
            msg = f"jax made {x.dtype} for {dtype} (64-bit types need jax_enable_x64)"
            raise Unavailable(msg)
        return x

    def read(self, x: Any) -> bytes:
        return bytes(self.np.asarray(x).tobytes())

    def poke(self, x: Any) -> bool:
        return False  # jax arrays are immutable

    def address(self, x: Any) -> int:
        return int(x.unsafe_buffer_pointer())

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype.name)

    def readonly(self, x: Any) -> bool | None:
        return True

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        if not hasattr(obj, "__dlpack__"):
            msg = "jax imports DLPack producers only"
            raise Unavailable(msg)
        return [("jnp.from_dlpack", lambda: self.jnp.from_dlpack(obj))]

    def copy_note(self, address: int) -> str | None:
        if address % self.needs_alignment:
            return f"jax copies memory that is not {self.needs_alignment}-byte aligned"
        return None


class PyArrowSide(Side):
    # It consumes the Arrow C data interface (``pa.array``), else the buffer protocol.
    key, label, protocol = "pyarrow", "pyarrow", "arrow"
    _TYPES: Final = {
        "int8": "int8",
        "int16": "int16",
        "int32": "int32",
        "int64": "int64",
        "uint8": "uint8",
        "uint16": "uint16",
        "uint32": "uint32",
        "uint64": "uint64",
        "float16": "halffloat",
        "float32": "float",
        "float64": "double",
    }

    def __init__(self) -> None:
        self.pa = importlib.import_module("pyarrow")
        self._names = {v: k for k, v in self._TYPES.items()}

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._TYPES)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype not in self._TYPES or device != "cpu":
            return super().make(dtype, raw, device)
        typ = getattr(
            self.pa,
            {"halffloat": "float16", "float": "float32", "double": "float64"}.get(
                self._TYPES[dtype], self._TYPES[dtype]
            ),
        )()
        n = len(raw) // getattr(tb, dtype).itemsize
        return self.pa.Array.from_buffers(typ, n, [None, self.pa.py_buffer(bytes(raw))])

    def _span(self, x: Any) -> tuple[Any, int, int]:
        if isinstance(x, self.pa.Buffer):
            return x, 0, x.size
        width = max(x.type.bit_width // 8, 1)
        return x.buffers()[1], x.offset * width, len(x) * width

    def read(self, x: Any) -> bytes:
        if not isinstance(x, self.pa.Buffer) and x.type == self.pa.bool_():
            # bit-packed: one byte per value, as a tensor holds them
            return bytes(bytearray(int(v) for v in x.to_pylist()))
        buf, start, size = self._span(x)
        return bytes(buf.to_pybytes()[start : start + size])

    def poke(self, x: Any) -> bool:
        return False  # Arrow arrays are immutable

    def address(self, x: Any) -> int:
        buf, start, _ = self._span(x)
        return int(buf.address) + start

    def dtype_of(self, x: Any) -> str | None:
        return None if isinstance(x, self.pa.Buffer) else self._names.get(str(x.type))

    def readonly(self, x: Any) -> bool | None:
        return not x.is_mutable if isinstance(x, self.pa.Buffer) else True

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        found: list[tuple[str, Callable[[], Any]]] = []
        if hasattr(obj, "__arrow_c_array__"):  # pyarrow 14 and later import it as an array
            found.append(("pa.array", lambda: self.pa.array(obj)))
        if is_buffer(obj):
            found.append(("pa.py_buffer", lambda: self.pa.py_buffer(obj)))
        if not found:
            msg = "pyarrow imports Arrow arrays and buffers, not DLPack"
            raise Unavailable(msg)
        return found


class CupySide(Side):
    key, label, protocol = "cupy", "cupy", "dlpack"

    def __init__(self) -> None:
        self.cupy = importlib.import_module("cupy")
        self._numpy = NumpySide()

    def devices(self) -> tuple[str, ...]:
        try:
            count = self.cupy.cuda.runtime.getDeviceCount()
        except Exception:
            count = 0
        return tuple(f"cuda:{i}" for i in range(count))

    def dtypes(self) -> tuple[str, ...]:
        return self._numpy.dtypes()

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if not device.startswith("cuda"):
            return super().make(dtype, raw, device)
        with self.cupy.cuda.Device(int(device.partition(":")[2] or 0)):
            return self.cupy.asarray(self._numpy.make(dtype, raw, "cpu"))

    def read(self, x: Any) -> bytes:
        return bytes(self.cupy.asnumpy(x).tobytes())

    def poke(self, x: Any) -> bool:
        b = x.reshape(-1).view(self.cupy.uint8)
        b[0] ^= 1
        return True

    def address(self, x: Any) -> int:
        return int(x.data.ptr)

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype.name)

    def readonly(self, x: Any) -> bool | None:
        return None

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        if not hasattr(obj, "__dlpack__"):
            msg = "cupy imports DLPack producers only"
            raise Unavailable(msg)
        return [("cupy.from_dlpack", lambda: self.cupy.from_dlpack(obj))]
