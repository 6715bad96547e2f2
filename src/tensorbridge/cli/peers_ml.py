"""Machine-learning frameworks as `Side`s: TensorFlow, PaddlePaddle, ONNX Runtime and MLX, each
exchanging through DLPack. A side imports its library when it is made, only in the peer's own
process (`child`); each one also measures the library's own defects (`Side.defects`)."""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Final

import tensorbridge as tb
from tensorbridge.testing import DTYPES

from .errors import Unavailable, one_line
from .peers import NumpySide
from .sides import Defect, DLPackSide

__all__ = ["MlxSide", "OnnxRuntimeSide", "PaddleSide", "TensorFlowSide"]


def _needs_dlpack(obj: Any, who: str) -> None:
    if not hasattr(obj, "__dlpack__"):
        msg = f"{who} imports DLPack producers only"
        raise Unavailable(msg)


class _FrameworkSide(DLPackSide):
    """A framework whose arrays are made from NumPy's (a copy into the framework's memory)."""

    def __init__(self) -> None:
        super().__init__()
        self._numpy = NumpySide()

    def _host(self, dtype: str, raw: bytes) -> Any:
        if dtype not in self.dtypes():
            msg = f"{self.label} has no {dtype}"
            raise Unavailable(msg)
        return self._numpy.make(dtype, raw, "cpu")


class TensorFlowSide(_FrameworkSide):
    key = label = "tensorflow"
    immutable = True  # eager tensors are never written in place

    def __init__(self) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        super().__init__()
        self.tf = importlib.import_module("tensorflow")
        self.dlpack = self.tf.experimental.dlpack
        self._dtypes = {
            d.name: getattr(self.tf, d.name)
            for d in DTYPES
            if isinstance(getattr(self.tf, d.name, None), self.tf.DType)
        }

    def devices(self) -> tuple[str, ...]:
        gpus = self.tf.config.list_physical_devices("GPU")
        return ("cpu", *(f"cuda:{i}" for i in range(len(gpus))))

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        host = self._host(dtype, raw)
        where = "/CPU:0" if device == "cpu" else f"/GPU:{device.partition(':')[2] or 0}"
        with self.tf.device(where):
            return self.tf.identity(self.tf.constant(host, dtype=self._dtypes[dtype]))

    def read(self, x: Any) -> bytes:
        return bytes(x.numpy().tobytes())

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype.name)

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        _needs_dlpack(obj, "tensorflow")
        # TensorFlow takes a capsule, not an object: its users call __dlpack__ themselves.
        return [
            (
                "tf.experimental.dlpack.from_dlpack",
                lambda: self.dlpack.from_dlpack(obj.__dlpack__()),
            )
        ]

    def defects(self) -> list[Defect]:
        found = []
        strided = tb.arange(8, dtype=tb.float32)[::2]
        try:
            self.dlpack.from_dlpack(strided.__dlpack__())
        except Exception as exc:
            found.append(
                Defect(
                    self.key,
                    f"tf.experimental.dlpack.from_dlpack refuses a tensor whose strides are not "
                    f"contiguous ({one_line(exc)})",
                    "hand it a contiguous copy: from_dlpack(t.contiguous().__dlpack__())",
                )
            )
        low = tb.zeros(4, dtype=tb.float8_e4m3fn)
        try:
            self.dlpack.from_dlpack(low.__dlpack__())
        except Exception as exc:
            found.append(
                Defect(
                    self.key,
                    f"tf.experimental.dlpack.from_dlpack refuses float8 tensors, which "
                    f"TensorFlow itself has ({one_line(exc)})",
                    "pass float8 values through NumPy with ml_dtypes: "
                    "tf.constant(np.asarray(t)) (a copy)",
                )
            )
        found.append(
            Defect(
                self.key,
                "exporting a string tensor by DLPack aborts the process, whoever the consumer is",
                "never hand a tf.string tensor to DLPack; convert it with t.numpy() first",
                seen=False,
            )
        )
        return found


class PaddleSide(_FrameworkSide):
    key = label = "paddle"

    def __init__(self) -> None:
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.paddle = importlib.import_module("paddle")
        self._dtypes = {
            d.name: getattr(self.paddle, d.name)
            for d in DTYPES
            if isinstance(getattr(self.paddle, d.name, None), self.paddle.dtype)
        }

    def devices(self) -> tuple[str, ...]:
        count = self.paddle.device.cuda.device_count() if self.paddle.is_compiled_with_cuda() else 0
        return ("cpu", *(f"cuda:{i}" for i in range(count)))

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        host = self._host(dtype, raw)
        place = (
            self.paddle.CPUPlace()
            if device == "cpu"
            else self.paddle.CUDAPlace(int(device.partition(":")[2] or 0))
        )
        x = self.paddle.to_tensor(host, place=place)
        if str(x.dtype).removeprefix("paddle.") != dtype:
            msg = f"paddle.to_tensor made {x.dtype} of NumPy's {host.dtype}"
            raise Unavailable(msg)
        return x

    def read(self, x: Any) -> bytes:
        return bytes(x.numpy().tobytes())

    def address(self, x: Any) -> int:
        return int(x.data_ptr())

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype).removeprefix("paddle.")

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        _needs_dlpack(obj, "paddle")
        dlpack = self.paddle.utils.dlpack
        return [
            ("paddle.from_dlpack", lambda: self.paddle.from_dlpack(obj)),
            ("paddle.utils.dlpack.from_dlpack", lambda: dlpack.from_dlpack(obj.__dlpack__())),
        ]

    def defects(self) -> list[Defect]:
        found = []
        y = self.paddle.from_dlpack(tb.arange(4, dtype=tb.uint16))
        if self.dtype_of(y) != "uint16":
            found.append(
                Defect(
                    self.key,
                    f"paddle.from_dlpack labels a uint16 tensor {self.dtype_of(y)} (it stores "
                    f"bfloat16 as uint16)",
                    "keep the memory, fix the label: tb.from_dlpack(y).view(tb.uint16) reads "
                    "the same bytes as uint16 again",
                )
            )
        return found


class OnnxRuntimeSide(_FrameworkSide):
    key = label = "onnxruntime"
    _TYPES: Final = {
        "bool": "tensor(bool)",
        "int8": "tensor(int8)",
        "int16": "tensor(int16)",
        "int32": "tensor(int32)",
        "int64": "tensor(int64)",
        "uint8": "tensor(uint8)",
        "uint16": "tensor(uint16)",
        "uint32": "tensor(uint32)",
        "uint64": "tensor(uint64)",
        "float16": "tensor(float16)",
        "float32": "tensor(float)",
        "float64": "tensor(double)",
    }

    def __init__(self) -> None:
        super().__init__()
        self.ort = importlib.import_module("onnxruntime")
        self._names = {v: k for k, v in self._TYPES.items()}
        self._hosts: dict[int, Any] = {}  # the NumPy array each OrtValue made here wraps

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._TYPES)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if device != "cpu":
            return super().make(dtype, raw, device)
        host = self._host(dtype, raw)
        x = self.ort.OrtValue.ortvalue_from_numpy(host)
        self._hosts[id(x)] = host  # an OrtValue over NumPy memory shares it: keep it alive
        return x

    def release(self, x: Any) -> None:
        self._hosts.pop(id(x), None)

    def read(self, x: Any) -> bytes:
        try:
            return bytes(x.numpy().tobytes())
        except RuntimeError:  # no NumPy type for it (bfloat16): the bytes where they lie
            if not x.is_tensor() or x.device_name().lower() != "cpu":
                raise
            return ctypes.string_at(x.data_ptr(), x.tensor_size_in_bytes())

    def poke(self, x: Any) -> bool:
        host = self._hosts.get(id(x))
        if host is None:
            return super().poke(x)
        host.reshape(-1).view("uint8")[0] ^= 1
        return True

    def address(self, x: Any) -> int:
        return int(x.data_ptr())

    def dtype_of(self, x: Any) -> str | None:
        return self._names.get(x.data_type())

    def readonly(self, x: Any) -> bool | None:
        return False

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        _needs_dlpack(obj, "onnxruntime")
        if not hasattr(self.ort.OrtValue, "from_dlpack"):
            msg = f"onnxruntime {self.ort.__version__} has no OrtValue.from_dlpack"
            raise Unavailable(msg)
        return [("OrtValue.from_dlpack", lambda: self.ort.OrtValue.from_dlpack(obj))]

    def defects(self) -> list[Defect]:
        found = []
        native = self.ort.OrtValue.ortvalue_from_numpy(self.np.arange(4, dtype="int32"))._ortvalue
        if not (hasattr(native, "to_dlpack") or hasattr(native, "__dlpack__")):
            found.append(
                Defect(
                    self.key,
                    f"onnxruntime {self.ort.__version__} (this build) has OrtValue.from_dlpack "
                    f"but no to_dlpack: its outputs cannot leave by DLPack",
                    "read an output with ortvalue.numpy() and hand that to tensorbridge "
                    "(tb.asarray), or bind outputs to memory you allocated (io_binding)",
                )
            )
            return found
        array = self.np.arange(4, dtype="int32")
        alive = weakref.ref(array)
        native = self.ort.OrtValue.ortvalue_from_numpy(array)._ortvalue
        capsule = native.__dlpack__() if hasattr(native, "__dlpack__") else native.to_dlpack()
        del array, native
        gc.collect()
        if alive() is None:
            found.append(
                Defect(
                    self.key,
                    "the DLPack capsule of an OrtValue made by ortvalue_from_numpy(a) keeps no "
                    "reference to a: once a is gone, the capsule (and any tensor imported from "
                    "it) points to freed memory",
                    "keep the NumPy array alive as long as anything imported from the OrtValue, "
                    "or import from the OrtValue wrapper (it holds the array)",
                )
            )
        del capsule
        return found


class MlxSide(_FrameworkSide):
    key = label = "mlx"

    def __init__(self) -> None:
        super().__init__()
        self.mx = importlib.import_module("mlx.core")
        self._dtypes = {
            d.name: getattr(self.mx, d.name)
            for d in DTYPES
            if isinstance(getattr(self.mx, d.name, None), self.mx.Dtype)
        }

    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._dtypes)

    def make(self, dtype: str, raw: bytes, device: str) -> Any:
        if device != "cpu":
            return super().make(dtype, raw, device)
        # the dtype stated: mx.array of a NumPy float64 array makes float32 unless told
        x = self.mx.array(self._host(dtype, raw), dtype=self._dtypes[dtype])
        self.mx.eval(x)
        return x

    def dtype_of(self, x: Any) -> str | None:
        return str(x.dtype).removeprefix("mlx.core.")

    def entry_points(self, obj: Any) -> list[tuple[str, Callable[[], Any]]]:
        found: list[tuple[str, Callable[[], Any]]] = []
        if hasattr(self.mx, "from_dlpack") and hasattr(obj, "__dlpack__"):
            found.append(("mx.from_dlpack", lambda: self.mx.from_dlpack(obj)))
        if not _has_byte_order_format(obj):  # MLX's own crash (see `defects`): not tried
            found.append(("mx.array", lambda: self.mx.array(obj)))
        return found

    def copy_note(self, address: int) -> str | None:
        return "MLX copies what it imports (mx.array, and mx.from_dlpack where it has one)"

    def defects(self) -> list[Defect]:
        found = [
            Defect(
                self.key,
                "mx.array of a buffer whose format has a byte-order character ('<i', as ctypes "
                "arrays export) kills the process with SIGSEGV",
                "hand MLX such memory through tensorbridge: mx.array(tb.asarray(x))",
                seen=False,
            )
        ]
        if not hasattr(self.mx, "from_dlpack"):
            return found
        t = tb.arange(4, dtype=tb.int32)
        y = self.mx.from_dlpack(t)
        if self.address(y) != t.data_ptr():
            found.append(
                Defect(
                    self.key,
                    "mx.from_dlpack copies: the array does not share the tensor's memory",
                    "expect a copy; write results back explicitly, or keep the data in MLX",
                )
            )
        return found


def _has_byte_order_format(obj: Any) -> bool:
    """Whether ``obj`` exports a buffer whose format starts with a byte-order character."""
    try:
        with memoryview(obj) as view:
            return view.format[:1] in ("<", ">", "=", "!", "@")
    except (TypeError, ValueError, BufferError):  # no buffer, or one memoryview cannot take
        return False
