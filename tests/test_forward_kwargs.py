"""Issue 20: a forward argument named like an analysis option reaches the forward through
``forward_kwargs``, in every entry point; ``analyze(model, x, mask=m)`` keeps working."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope as ls


class Named(nn.Module):
    """A forward whose keywords collide with layerscope's options; it records what it was given."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.seen: list[tuple] = []

    def forward(self, x, mode="plain", device=None, steps=1, mask=None):
        self.seen.append((mode, device, steps, mask is not None))
        y = self.fc(x) * steps
        return y if mode == "plain" else torch.relu(y)


X = torch.randn(2, 4)
FWD = {"mode": "relu", "device": "gpu-0", "steps": 3}


def test_analyze():
    m = Named()
    rep = ls.analyze(m, X, mask=torch.ones(2), forward_kwargs=FWD)
    assert m.seen[-1] == ("relu", "gpu-0", 3, True)
    assert any(r.type == "Linear" for r in rep.layers)
    # plain: linear 2*(2*4*4) + bias 8 + "* steps" 8 = 80 FLOPs; mode="relu" adds the relu's 8 elements
    plain = ls.analyze(Named(), X)
    assert (plain.totals.flops, rep.totals.flops) == (80, 88)
    assert ls.analyze(Named(), X, mode="eval").totals.flops == plain.totals.flops


def test_memory_max_batch_profile_partition_activations():
    m = Named()
    ls.memory(m, X, optimizer="sgd", forward_kwargs=FWD)
    assert m.seen[-1][:3] == ("relu", "gpu-0", 3)
    m.seen.clear()
    fit = ls.max_batch_size(m, X, limit="1MiB", forward_kwargs=FWD)
    assert fit.batch_size >= 1 and m.seen and all(s[:3] == ("relu", "gpu-0", 3) for s in m.seen)
    m.seen.clear()
    ls.profile(m, X, repeats=1, warmup=0, forward_kwargs=FWD)
    assert m.seen and all(s[:3] == ("relu", "gpu-0", 3) for s in m.seen)
    m.seen.clear()
    ls.partition(m, X, stages=1, forward_kwargs=FWD)
    assert m.seen and all(s[:3] == ("relu", "gpu-0", 3) for s in m.seen)
    m.seen.clear()
    out = ls.activations(m, X, select=[nn.Linear], forward_kwargs=FWD)
    assert m.seen[-1][:3] == ("relu", "gpu-0", 3) and set(out) == {"fc"}


def test_a_name_given_twice_is_refused():
    with pytest.raises(ls.InputError, match="mask given both as a keyword and in forward_kwargs"):
        ls.analyze(Named(), X, mask=torch.ones(2), forward_kwargs={"mask": torch.ones(2)})
    with pytest.raises(ls.InputError, match="forward_kwargs must be a dict"):
        ls.analyze(Named(), X, forward_kwargs=[("mode", "relu")])
