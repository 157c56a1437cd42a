"""torchscan 0.2's per-module functions with layerscope's counts."""
