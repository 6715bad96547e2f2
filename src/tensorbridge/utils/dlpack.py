"""``torch.utils.dlpack`` under tensorbridge's names: the same functions, nothing else."""

from .._device import DLDeviceType
from .._dlpack import from_dlpack, to_dlpack

__all__ = ["DLDeviceType", "from_dlpack", "to_dlpack"]
