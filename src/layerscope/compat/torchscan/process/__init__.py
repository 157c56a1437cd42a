"""torchscan 0.2's ``process``: ``measure_peak_memory``."""

from .memory import *  # noqa: F401,F403
