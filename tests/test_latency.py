"""Latency profiler: per-call structure, self/inclusive sums, costs per call, state left alone."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.analyses.latency import time_calls
from layerscope.cli import main
from layerscope.examples import small_cnn

from .helpers import assert_unchanged, snapshot


class Twice(nn.Module):
    """One Linear called twice: two calls, two records."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.out = nn.Linear(16, 10)

    def forward(self, x):
        return self.out(torch.relu(self.fc(torch.relu(self.fc(x)))))


def test_calls_self_times_and_costs():
    torch.manual_seed(0)
    m, x = Twice(), torch.randn(8, 16)
    before, rng = snapshot(m), torch.get_rng_state()
    rep = ls.profile(m, x, warmup=1, repeats=3, backward=True)
    assert_unchanged(before, m)
    assert torch.equal(rng, torch.get_rng_state()) and all(p.grad is None for p in m.parameters())
    assert [(r.path, r.call_index) for r in rep.layers] == [("", 0), ("fc", 0), ("fc", 1), ("out", 0)]
    out = rep.layers[3]
    # Linear(16, 10) on 8 rows: 8 x 16 x 10 = 1280 MACs -> 2560 FLOPs + 8 x 10 bias adds = 2640
    assert out.flops == 2640 and out.flops_per_second == pytest.approx(2640 / out.forward.median)
    assert all(r.forward.min >= 0 and r.backward.min >= 0 for r in rep.layers)
    assert rep.totals["forward_plain"] > 0 and rep.totals["backward_plain"] > 0
    assert rep.top(1, depth=1)[0].depth == 1


def test_self_times_add_up_to_the_root_in_every_repeat():
    m, x = small_cnn(), torch.randn(2, 3, 32, 32)
    calls, plain_f, plain_b = time_calls(m, lambda: m(x), lambda o: o.sum().backward(),
                                         device=torch.device("cpu"), warmup=1, repeats=4)
    assert len(plain_f) == len(plain_b) == 4
    for r in range(4):
        for phase in ("forward", "backward"):
            self_sum = sum(getattr(c, phase)[r] - sum(getattr(calls[k], phase)[r] for k in c.children)
                           for c in calls)
            assert self_sum == pytest.approx(getattr(calls[0], phase)[r], rel=1e-9)
            # a parent's span holds its children's
            for c in calls:
                assert getattr(c, phase)[r] >= max((getattr(calls[k], phase)[r] for k in c.children),
                                                   default=0.0)
    for p in m.parameters():
        p.grad = None


def test_profile_refuses_what_it_cannot_time():
    with pytest.raises(ls.InputError, match="no data"):
        ls.profile(nn.Linear(4, 4, device="meta"), torch.randn(2, 4, device="meta"))
    with pytest.raises(ls.InputError, match="repeats"):
        ls.profile(nn.Linear(4, 4), torch.randn(2, 4), repeats=0)


def test_cli_profile_json(capsys):
    assert main(["profile", "layerscope.examples:small_cnn", "--repeats", "2", "--warmup", "0",
                 "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "latency" and d["layers"][0]["type"] == "SmallCNN"
    assert d["totals"]["forward_plain"] > 0
