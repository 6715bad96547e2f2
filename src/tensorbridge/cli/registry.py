"""The peers the doctor proves, by the name ``--peers`` takes, and where each one's `Side` lives.

Nothing here imports a peer: `load_side` imports the module of one side (and so its library) in the
process that proves it, which is never the doctor's own (see `families`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .sides import Side

__all__ = ["ALIASES", "PEERS", "canonical", "load_side"]

# Each peer: the cli module that holds its side, and the class. Display order.
_WHERE: Final = {
    "numpy": ("peers", "NumpySide"),
    "torch": ("peers", "TorchSide"),
    "jax": ("peers", "JaxSide"),
    "pyarrow": ("peers", "PyArrowSide"),
    "cupy": ("peers", "CupySide"),
    "tensorflow": ("peers_ml", "TensorFlowSide"),
    "paddle": ("peers_ml", "PaddleSide"),
    "onnxruntime": ("peers_ml", "OnnxRuntimeSide"),
    "mlx": ("peers_ml", "MlxSide"),
    "warp": ("peers_dlpack", "WarpSide"),
    "array_api_strict": ("peers_dlpack", "ArrayApiStrictSide"),
    "tvm_ffi": ("peers_dlpack", "TvmFfiSide"),
    "cuda_core": ("peers_dlpack", "CudaCoreSide"),
    "polars": ("peers_frames", "PolarsSide"),
    "pandas": ("peers_frames", "PandasSide"),
    "nanoarrow": ("peers_frames", "NanoarrowSide"),
    "xarray": ("peers_frames", "XarraySide"),
    "dask_array": ("peers_frames", "DaskArraySide"),
}
PEERS: Final = tuple(_WHERE)  # the names ``--peers`` accepts (and `ALIASES`)
# Other spellings users type: distribution names, import names, short names.
ALIASES: Final = {
    "array-api-strict": "array_api_strict",
    "tvm-ffi": "tvm_ffi",
    "apache-tvm-ffi": "tvm_ffi",
    "cuda.core": "cuda_core",
    "cuda-core": "cuda_core",
    "dask.array": "dask_array",
    "dask-array": "dask_array",
    "paddlepaddle": "paddle",
    "tf": "tensorflow",
    "ort": "onnxruntime",
    "warp-lang": "warp",
    "ml_dtypes": "numpy",  # NumPy's extended dtypes: proved with NumPy
    "ml-dtypes": "numpy",
}


def canonical(name: str) -> str | None:
    """The peer key for a name the user typed (any case, ``-`` or ``_``); None when unknown."""
    name = name.strip().lower()
    if name in _WHERE:
        return name
    return (
        ALIASES.get(name)
        or ALIASES.get(name.replace("_", "-"))
        or (name.replace("-", "_") if name.replace("-", "_") in _WHERE else None)
    )


def load_side(key: str) -> Side:
    """Import peer ``key``'s side and make it (this imports the library itself).

    Raises:
        KeyError: ``key`` is not a peer the doctor knows.
        Exception: whatever the library's import raises.
    """
    module, cls = _WHERE[key]
    side: Side = getattr(importlib.import_module(f"{__package__}.{module}"), cls)()
    return side
