"""asarray: one dispatcher from anything with memory to a Tensor (placeholder)."""

from __future__ import annotations

from typing import Any

from ._tensor import Tensor


def is_protocol_object(obj: Any) -> bool:
    return hasattr(obj, "__dlpack__") or hasattr(obj, "__array_interface__")


def asarray(obj: Any, *, dtype: Any = None, device: Any = None, copy: Any = None,
            requires_grad: bool = False) -> Tensor:
    from ._creation import tensor

    if isinstance(obj, Tensor):
        return obj if dtype is None or dtype is obj.dtype else obj.to(dtype)
    return tensor(obj, dtype=dtype, device=device, requires_grad=requires_grad)


def from_pointer(ptr: int, shape: Any, dtype: Any, *, strides: Any = None, device: Any = "cpu",
                 owner: Any = None, readonly: bool = False, nbytes: Any = None) -> Tensor:
    raise NotImplementedError
