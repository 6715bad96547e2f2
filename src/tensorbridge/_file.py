"""from_file: a tensor over a memory-mapped file (placeholder)."""

from __future__ import annotations

from typing import Any

from ._tensor import Tensor


def from_file(filename: Any, shared: Any = None, size: int = 0, *, dtype: Any = None,
              requires_grad: bool = False, offset: int = 0, mode: Any = None) -> Tensor:
    raise NotImplementedError
