"""torchscan 0.2: crawler (being written)."""

__all__: list[str] = []
