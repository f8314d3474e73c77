"""uform: a training engine for multimodal transformer encoders on a Mojo kernel core."""

from . import kernels
from .engine import ENGINE_VARIANT, Buffer, Device, gpu_count

__all__ = ["Buffer", "Device", "ENGINE_VARIANT", "gpu_count", "kernels"]
