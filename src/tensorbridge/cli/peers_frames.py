"""Column and labelled-array libraries as `Side`s: polars, pandas and nanoarrow (through the Arrow
C data and stream interfaces, both ways), xarray and dask.array (NumPy-based: through
``__array__`` and NumPy's dtype protocol). Their arrays are made from a private NumPy copy."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final

from tensorbridge.testing import buffer_address

from .errors import Unavailable
from .peers import NumpySide
from .sides import Side

__all__ = ["DaskArraySide", "NanoarrowSide", "PandasSide", "PolarsSide", "XarraySide"]

# The Arrow primitive types these libraries hold without a copy, by tensorbridge dtype name.
_ARROW_TYPES: Final = (
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)


class _HostBacked(Side):
    """Made from a NumPy array of the doctor's; read, written and located through NumPy."""

    def __init__(self) -> None:
        self._numpy = NumpySide()
        self.np = self._numpy.np

    def _host(self, dtype: str, raw: bytes, device: str) -> Any:
        if dtype not in self.dtypes() or device != "cpu":
            msg = f"{self.label} makes no {dtype} on {device} here"
            raise Unavailable(msg)
        return self._numpy.make(dtype, raw, "cpu")

    def view(self, x: Any) -> Any:
        """A NumPy view of ``x``'s memory."""
        raise NotImplementedError

    def read(self, x: Any) -> bytes:
        return bytes(self.view(x).tobytes())

    def poke(self, x: Any) -> bool:
        return self._numpy.poke(self.view(x))

    def address(self, x: Any) -> int:
        return self._numpy.address(self.view(x))

    def dtype_of(self, x: Any) -> str | None:
        return str(self.view(x).dtype.name)

    def readonly(self, x: Any) -> bool | None:
        return not self.view(x).flags.writeable


class PolarsSide(_HostBacked):
    key = label = "polars"
    protocol = "arrow"

    def __init__(self) -> None:
        super().__init__()
        self.pl = importlib.import_module("polars")

    def dtypes(self) -> tuple[str, ...]:
        return tuple(d for d in _ARROW_TYPES if d != "float16")

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        return self.pl.Series("x", self._host(dtype, raw, device))

    def view(self, x: Any) -> Any:
        return x.to_numpy(allow_copy=False)

    def read(self, x: Any) -> bytes:
        return bytes(x.to_numpy().tobytes())

    def address(self, x: Any) -> int:
        try:
            return super().address(x)
        except RuntimeError:  # "copy not allowed": polars holds it in another form (bits)
            return 0

    def dtype_of(self, x: Any) -> str | None:
        return str(x.to_numpy().dtype.name)

    def poke(self, x: Any) -> bool:
        return False  # polars Series are immutable; the proof is the address

    def readonly(self, x: Any) -> bool | None:
        return True

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        if not hasattr(obj, "__arrow_c_array__") and not hasattr(obj, "__arrow_c_stream__"):
            msg = "polars imports Arrow arrays and streams (PyCapsule interface) here"
            raise Unavailable(msg)
        return [("pl.Series", lambda: self.pl.Series(obj))]


class PandasSide(_HostBacked):
    key = label = "pandas"
    protocol = "array"

    def __init__(self) -> None:
        super().__init__()
        self.pd = importlib.import_module("pandas")

    def dtypes(self) -> tuple[str, ...]:
        return tuple(d for d in self._numpy.dtypes() if self.np.dtype(d).kind in "biufc")

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        return self.pd.Series(self._host(dtype, raw, device), copy=False)

    def view(self, x: Any) -> Any:
        return x.to_numpy(copy=False)

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        found: list[tuple[str, Callable[[], Any]]] = [("pd.Series", lambda: self._series(obj))]
        if hasattr(obj, "__arrow_c_stream__") and hasattr(self.pd.Series, "from_arrow"):
            found.append(("pd.Series.from_arrow", lambda: self.pd.Series.from_arrow(obj)))
        return found

    def _series(self, obj: Any) -> Any:
        y = self.pd.Series(obj, copy=False)
        if y.dtype == object:
            msg = f"pd.Series made an object column of {type(obj).__name__}"
            raise Unavailable(msg)
        return y


class NanoarrowSide(_HostBacked):
    key = label = "nanoarrow"
    protocol = "arrow"
    _FORMATS: Final = {
        "c": "int8",
        "s": "int16",
        "i": "int32",
        "l": "int64",
        "C": "uint8",
        "S": "uint16",
        "I": "uint32",
        "L": "uint64",
        "e": "float16",
        "f": "float32",
        "g": "float64",
    }

    def __init__(self) -> None:
        super().__init__()
        self.na = importlib.import_module("nanoarrow")

    def dtypes(self) -> tuple[str, ...]:
        return _ARROW_TYPES

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        host = self._host(dtype, raw, device)
        x = self.na.c_array(host)  # over the array's memory, which the Arrow array holds
        return x

    def _values(self, x: Any) -> Any:
        return x.view().buffer(1)

    def read(self, x: Any) -> bytes:
        if x.schema.format == "b":  # bit-packed booleans: one byte per value, as tensors hold them
            return bytes(bytearray(int(v) for v in self.na.Array(x).to_pylist()))
        return super().read(x)

    def view(self, x: Any) -> Any:
        dtype = self._FORMATS[x.schema.format]
        values = self.np.frombuffer(self._values(x), dtype=dtype)
        return values[x.offset : x.offset + x.length]

    def address(self, x: Any) -> int:
        if x.schema.format not in self._FORMATS:  # bit-packed booleans: not a tensor's memory
            return buffer_address(self._values(x))
        width = self.np.dtype(self._FORMATS[x.schema.format]).itemsize
        return buffer_address(self._values(x)) + x.offset * width

    def poke(self, x: Any) -> bool:
        return False  # Arrow arrays are immutable; the proof is the address

    def readonly(self, x: Any) -> bool | None:
        return True

    def dtype_of(self, x: Any) -> str | None:
        return self._FORMATS.get(x.schema.format)

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        found: list[tuple[str, Callable[[], Any]]] = []
        if hasattr(obj, "__arrow_c_array__"):
            found.append(("na.c_array", lambda: self.na.c_array(obj)))
        elif hasattr(obj, "__arrow_c_stream__"):
            found.append(("na.c_array_stream", lambda: self._from_stream(obj)))
        if not found:
            msg = "nanoarrow imports Arrow arrays and streams (PyCapsule interface) here"
            raise Unavailable(msg)
        return found

    def _from_stream(self, obj: Any) -> Any:
        stream = self.na.c_array_stream(obj)
        return next(iter(stream))


class XarraySide(_HostBacked):
    key = label = "xarray"
    protocol = "array"

    def __init__(self) -> None:
        super().__init__()
        self.xr = importlib.import_module("xarray")

    def dtypes(self) -> tuple[str, ...]:
        return self._numpy.dtypes()

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        return self.xr.DataArray(self._host(dtype, raw, device))

    def view(self, x: Any) -> Any:
        return x.values

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        return [("xr.DataArray", lambda: self._array(obj))]

    def _array(self, obj: Any) -> Any:
        y = self.xr.DataArray(obj)
        if y.dtype == object:
            msg = f"xr.DataArray made an object array of {type(obj).__name__}"
            raise Unavailable(msg)
        return y


class DaskArraySide(_HostBacked):
    key, label = "dask_array", "dask.array"
    protocol = "array"
    has_memory = False  # a result is computed anew each time

    def __init__(self) -> None:
        super().__init__()
        self.da = importlib.import_module("dask.array")

    def dtypes(self) -> tuple[str, ...]:
        return self._numpy.dtypes()

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        return self.da.from_array(self._host(dtype, raw, device), chunks=-1)

    def view(self, x: Any) -> Any:
        return self.np.asarray(x.compute(scheduler="synchronous"))

    def poke(self, x: Any) -> bool:
        return False  # computing gives a new array each time: the proof is the address

    def readonly(self, x: Any) -> bool | None:
        return None

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        return [("da.from_array", lambda: self.da.from_array(obj, chunks=-1))]

    def copy_note(self, address: int) -> str | None:
        return "dask.array computes a new array for each result (its graph, not the memory)"
