"""torchscan 0.2's compare_reports (to be written)."""

__all__: list[str] = []
