"""Models with uneven layers for the split benchmark (bench/bench_split.py), built by spec
``bench/pipeline_models.py:NAME`` on every torchrun rank."""

import torch
from torch import nn


def stem_cnn() -> nn.Module:
    """A CNN whose stem runs at full resolution with many channels (most of the FLOPs), then eight
    cheap residual-free blocks at a quarter of the resolution, then a classifier."""
    layers = [nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()),
              nn.Sequential(nn.MaxPool2d(4), nn.Conv2d(64, 32, 1), nn.ReLU())]
    layers += [nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()) for _ in range(8)]
    layers += [nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))]
    return nn.Sequential(*layers)


stem_cnn.input_size = (1, 3, 64, 64)  # type: ignore[attr-defined]


def deep_mlp(blocks: int = 1000) -> nn.Module:
    """Issue 36 item 4's model: ``blocks`` blocks of ``Sequential(Linear(64, 64), ReLU())`` (input 1 x 64)."""
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(blocks)])
