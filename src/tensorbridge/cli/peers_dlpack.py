"""DLPack-only libraries as `Side`s: Warp, array-api-strict, tvm-ffi and cuda.core's
`StridedMemoryView`. Each makes its arrays from a private NumPy copy (the memory is then the
library's, or held by it) and imports through its own ``from_dlpack``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from tensorbridge.testing import DTYPES

from .errors import Unavailable
from .peers import NumpySide
from .sides import DLPackSide

__all__ = ["ArrayApiStrictSide", "CudaCoreSide", "TvmFfiSide", "WarpSide"]


def _needs_dlpack(obj: Any, who: str) -> None:
    if not hasattr(obj, "__dlpack__"):
        msg = f"{who} imports DLPack producers only"
        raise Unavailable(msg)


class _NumpyBacked(DLPackSide):
    """A library whose producer objects are made from a NumPy array of the doctor's."""

    def __init__(self) -> None:
        super().__init__()
        self._numpy = NumpySide()
        self._hosts: dict[int, Any] = {}

    def _host(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype not in self.dtypes() or device != "cpu":
            msg = f"{self.label} makes no {dtype} on {device} here"
            raise Unavailable(msg)
        return self._numpy.make(dtype, raw, "cpu")

    def release(self, x: Any) -> None:
        self._hosts.pop(id(x), None)


class WarpSide(_NumpyBacked):
    key = label = "warp"

    def __init__(self) -> None:
        super().__init__()
        wp = importlib.import_module("warp")
        wp.config.quiet = True  # no banner on stdout
        wp.init()
        self.wp = wp
        self._dtypes = {d.name: getattr(wp, d.name) for d in DTYPES if hasattr(wp, d.name)}
        self._names = {v: k for k, v in self._dtypes.items()}

    def devices(self) -> tuple[str, ...]:
        return tuple("cpu" if d.is_cpu else str(d) for d in self.wp.get_devices())

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        host = self._numpy.make(dtype, raw, "cpu")
        if dtype not in self._dtypes:
            return super().make(dtype, raw, device)
        return self.wp.array(host, dtype=self._dtypes[dtype], device=device, copy=True)

    def read(self, x: Any) -> bytes:
        return bytes(x.numpy().tobytes())

    def address(self, x: Any) -> int:
        return int(x.ptr)

    def dtype_of(self, x: Any) -> str | None:
        return self._names.get(x.dtype)

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        _needs_dlpack(obj, "warp")
        return [("wp.from_dlpack", lambda: self.wp.from_dlpack(obj))]


class ArrayApiStrictSide(_NumpyBacked):
    key, label = "array_api_strict", "array-api-strict"

    def __init__(self) -> None:
        super().__init__()
        self.xp = importlib.import_module("array_api_strict")
        self._dtypes = {
            d.name: getattr(self.xp, d.name) for d in DTYPES if hasattr(self.xp, d.name)
        }

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        return self.xp.asarray(self._host(dtype, raw, device), copy=True)

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype).removeprefix("array_api_strict.")

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        _needs_dlpack(obj, "array-api-strict")
        return [("xp.from_dlpack", lambda: self.xp.from_dlpack(obj))]


class TvmFfiSide(_NumpyBacked):
    key, label = "tvm_ffi", "tvm-ffi"

    def __init__(self) -> None:
        super().__init__()
        self.tvm_ffi = importlib.import_module("tvm_ffi")

    def dtypes(self) -> tuple[str, ...]:
        return self._numpy.dtypes()

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        host = self._host(dtype, raw, device)
        x = self.tvm_ffi.from_dlpack(host)  # a Tensor over the NumPy array, which it holds
        self._hosts[id(x)] = host
        return x

    def address(self, x: Any) -> int:
        return int(x.data_ptr())

    def dtype_of(self, x: Any) -> str | None:
        try:
            return str(x.dtype)
        except ValueError:  # a DLPack type code tvm-ffi cannot name (complex32)
            return None

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        _needs_dlpack(obj, "tvm-ffi")
        return [("tvm_ffi.from_dlpack", lambda: self.tvm_ffi.from_dlpack(obj))]


class CudaCoreSide(_NumpyBacked):
    """cuda.core's `StridedMemoryView`: a view of host memory works without a GPU."""

    key, label = "cuda_core", "cuda.core"

    def __init__(self) -> None:
        super().__init__()
        utils = importlib.import_module("cuda.core.utils")
        self.view = utils.StridedMemoryView

    def dtypes(self) -> tuple[str, ...]:
        return tuple(n for n in self._numpy.dtypes() if self.np.dtype(n).kind in "biufc")

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        host = self._host(dtype, raw, device)
        x = self.view.from_array_interface(host)
        self._hosts[id(x)] = host
        return x

    def read(self, x: Any) -> bytes:
        return bytes(self.np.from_dlpack(x).tobytes())

    def address(self, x: Any) -> int:
        return int(x.ptr)

    def dtype_of(self, x: Any) -> str | None:
        return None if x.dtype is None else str(x.dtype.name)

    def readonly(self, x: Any) -> bool | None:
        return bool(x.readonly)

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        found: list[tuple[str, Callable[[], Any]]] = []
        if hasattr(obj, "__dlpack__"):
            found.append(("StridedMemoryView.from_dlpack", lambda: self.view.from_dlpack(obj, -1)))
        if hasattr(obj, "__array_interface__"):
            found.append(
                (
                    "StridedMemoryView.from_array_interface",
                    lambda: self.view.from_array_interface(obj),
                )
            )
        if not found:
            msg = "cuda.core views DLPack and array-interface producers only"
            raise Unavailable(msg)
        return found
