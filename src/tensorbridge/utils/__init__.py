"""PyTorch-compatible aliases (``tensorbridge.utils.dlpack``)."""

from . import dlpack

__all__ = ["dlpack"]
