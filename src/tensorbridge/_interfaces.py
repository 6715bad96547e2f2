"""__cuda_array_interface__, __array_interface__ import, Arrow (placeholder)."""

from __future__ import annotations

from typing import Any

from ._tensor import Tensor


def cuda_array_interface(t: Tensor) -> dict[str, Any]:
    raise AttributeError("__cuda_array_interface__")


def to_numpy(t: Tensor, force: bool = False) -> Any:
    raise NotImplementedError


def to_torch(t: Tensor) -> Any:
    raise NotImplementedError


def to_jax(t: Tensor) -> Any:
    raise NotImplementedError
