"""Models with uneven layers for the split benchmark (bench/bench_split.py), built by spec
``bench/pipeline_models.py:NAME`` on every torchrun rank."""

import time

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


@torch.library.custom_op("layerscope_bench::wait", mutates_args=())
def wait(x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
    """A calibrated wait in place of compute: ``forward_s`` in the forward, ``backward_s`` in the backward
    (time.sleep: the rank holds no core while it waits, so two ranks on two cores never contend). An
    operator of its own, so that torch.export keeps it in a pipeline stage's graph (a Python call in a
    module's forward would be traced away)."""
    time.sleep(forward_s)
    return x.clone()


@wait.register_fake
def _(x, forward_s, backward_s):
    return torch.empty_like(x)


def _wait_context(ctx, inputs, output):
    ctx.backward_s = inputs[2]


def _wait_backward(ctx, grad):
    return wait(grad, ctx.backward_s, 0.0), None, None


wait.register_autograd(_wait_backward, setup_context=_wait_context)


class WaitBlock(nn.Module):
    """One unit of the calibrated-wait model: a per-feature scale (a parameter the optimizer steps, and a
    gradient to compute) around a wait of ``forward_ms`` / ``backward_ms``."""

    def __init__(self, width: int, forward_ms: float, backward_ms: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.forward_s, self.backward_s = forward_ms / 1e3, backward_ms / 1e3

    def forward(self, x):
        return wait(x * self.scale, self.forward_s, self.backward_s)


# uneven units (ms forward; the backward twice that): a split by block count is not the fastest
WAIT_FORWARD_MS = (6, 6, 6, 6, 12, 12, 3, 3)


def wait_chain(width: int = 65536) -> nn.Module:
    """Issue 37 item 5a's model: eight ``WaitBlock`` units of ``WAIT_FORWARD_MS`` (backward 2x), on
    activations of ``width`` float32 features a row (a micro-batch of 4 rows sends 1 MiB across a cut)."""
    return nn.Sequential(*[WaitBlock(width, f, 2 * f) for f in WAIT_FORWARD_MS])


wait_chain.input_size = (1, 65536)  # type: ignore[attr-defined]


def wait_chain_wide() -> nn.Module:
    """``wait_chain`` on 262,144 features: 4 MiB a micro-batch across a cut (gloo's send/recv coupling)."""
    return wait_chain(width=262144)


wait_chain_wide.input_size = (1, 262144)  # type: ignore[attr-defined]
