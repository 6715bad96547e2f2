"""Which array libraries are installed, found from their distribution metadata without importing
any of them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from typing import Final

__all__ = ["Library", "find_libraries", "install_spec"]


@dataclass(frozen=True)
class _Spec:
    key: str
    name: str
    module: str
    dists: tuple[str, ...]


_SPECS: Final = (
    _Spec("numpy", "NumPy", "numpy", ("numpy",)),
    _Spec("torch", "PyTorch", "torch", ("torch",)),
    _Spec("jax", "JAX", "jax", ("jax",)),
    _Spec(
        "cupy",
        "CuPy",
        "cupy",
        ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy-rocm-6-0"),
    ),
    _Spec("tensorflow", "TensorFlow", "tensorflow", ("tensorflow", "tensorflow-cpu", "tf-nightly")),
    _Spec("pyarrow", "pyarrow", "pyarrow", ("pyarrow",)),
    _Spec("array_api_strict", "array-api-strict", "array_api_strict", ("array-api-strict",)),
    _Spec("mlx", "MLX", "mlx", ("mlx",)),
    _Spec("paddle", "PaddlePaddle", "paddle", ("paddlepaddle", "paddlepaddle-gpu")),
    _Spec("onnxruntime", "ONNX Runtime", "onnxruntime", ("onnxruntime", "onnxruntime-gpu")),
    _Spec("warp", "Warp", "warp", ("warp-lang",)),
    _Spec("cuda_core", "cuda.core", "cuda.core", ("cuda-core", "cuda_core")),
    _Spec("polars", "polars", "polars", ("polars", "polars-lts-cpu", "polars-u64-idx")),
    _Spec("pandas", "pandas", "pandas", ("pandas",)),
    _Spec("nanoarrow", "nanoarrow", "nanoarrow", ("nanoarrow",)),
    _Spec("xarray", "xarray", "xarray", ("xarray",)),
    _Spec("dask_array", "dask.array", "dask.array", ("dask",)),
    _Spec("numba", "Numba", "numba", ("numba",)),
    _Spec("ml_dtypes", "ml_dtypes", "ml_dtypes", ("ml_dtypes",)),
    _Spec("tvm_ffi", "TVM FFI", "tvm_ffi", ("apache-tvm-ffi",)),
    _Spec("pydlpack", "pydlpack", "dlpack", ("pydlpack",)),
    _Spec("ctypes_dlpack", "ctypes-dlpack", "ctypes_dlpack", ("ctypes-dlpack",)),
    # Transports between processes, checked by `scaleout` rather than exchanged with.
    _Spec("ray", "Ray", "ray", ("ray",)),
    _Spec("dask", "Dask distributed", "distributed", ("distributed",)),
)


# What ``pip install`` takes for a library, where it is not the first distribution name: PyTorch
# at the version tensorbridge's PyTorch behaviour is pinned to (the test extra pins it).
_INSTALL: Final = {"torch": "torch==2.13.0"}


def install_spec(key: str) -> str:
    """The ``pip install`` argument for library ``key`` (``"torch==2.13.0"``, ``"warp-lang"``).

    Raises:
        KeyError: a key the doctor does not know.
    """
    if key in _INSTALL:
        return _INSTALL[key]
    spec = next((s for s in _SPECS if s.key == key), None)
    if spec is None:
        raise KeyError(key)
    return spec.dists[0]


@dataclass
class Library:
    """One array library as the doctor found it.

    Attributes:
        key: short name used by ``--peers`` (``"torch"``).
        name: display name (``"PyTorch"``).
        module: import name.
        distribution: the installed distribution, or None.
        version: its version from the metadata, or None when not installed.
        status: ``"not installed"``, ``"installed"`` (found, not used), ``"listed"`` (found; the
            doctor has no side for it), ``"not selected"``, ``"used"``, ``"import failed"``,
            ``"crashed"`` (its process died; ``error`` says how) or ``"timed out"``.
        devices: devices seen after importing it (only for the libraries used).
        error: why the import failed, or why it is not used.
    """

    key: str
    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    status: str = "not installed"
    devices: list[str] = field(default_factory=list)
    error: str | None = None


def _version(spec: _Spec) -> tuple[str | None, str | None]:
    for dist in spec.dists:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    if "." in spec.module:  # finding "cuda.core" would import the package "cuda"
        return None, None
    try:  # installed without metadata (a source tree on sys.path) or under another name
        found = importlib.util.find_spec(spec.module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return None, None
    dists = importlib.metadata.packages_distributions().get(spec.module, [])
    for dist in dists:
        return dist, importlib.metadata.version(dist)
    return None, "unknown"


def find_libraries() -> list[Library]:
    """Every library the doctor knows, with its installed version; imports nothing."""
    found = []
    for spec in _SPECS:
        dist, version = _version(spec)
        lib = Library(spec.key, spec.name, spec.module, dist, version)
        if version is not None:
            lib.status = "installed"
        found.append(lib)
    return found
