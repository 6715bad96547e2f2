"""Buffer protocol import and export (placeholder: replaced by the buffer implementation)."""

from __future__ import annotations

from typing import Any

from ._tensor import Tensor


def frombuffer(buffer: Any, *, dtype: Any, count: int = -1, offset: int = 0, requires_grad: bool = False) -> Tensor:
    raise NotImplementedError


def buffer_export(t: Tensor, flags: int) -> memoryview:
    raise NotImplementedError


def array_interface(t: Tensor) -> dict[str, Any]:
    raise AttributeError("__array_interface__")


def reduce_tensor(t: Tensor, protocol: Any) -> Any:
    raise NotImplementedError


def share_memory(t: Tensor) -> Tensor:
    raise NotImplementedError
