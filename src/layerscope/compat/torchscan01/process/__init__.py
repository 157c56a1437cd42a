"""torchscan 0.1's process helpers."""

from .memory import get_process_gpu_ram

__all__ = ["get_process_gpu_ram"]
