"""torchscan 0.2: utils (being written)."""

__all__: list[str] = []
