"""torchscan 0.2: flops (being written)."""

__all__: list[str] = []
