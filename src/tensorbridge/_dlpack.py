"""DLPack import and export (placeholder: replaced by the DLPack implementation)."""

from __future__ import annotations

from typing import Any

from ._tensor import Tensor


def dlpack_export(t: Tensor, stream: Any, max_version: Any, dl_device: Any, copy: Any) -> Any:
    raise NotImplementedError


def from_dlpack(ext_tensor: Any, *, device: Any = None, copy: Any = None) -> Tensor:
    raise NotImplementedError


def to_dlpack(tensor: Tensor) -> Any:
    raise NotImplementedError
