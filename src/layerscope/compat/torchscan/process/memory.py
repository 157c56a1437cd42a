"""torchscan 0.2's measure_peak_memory (to be written)."""

__all__: list[str] = []
