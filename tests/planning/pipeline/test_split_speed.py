"""partition()'s speed work (issue 61, item 4) keeps every answer: the split solved from each row's own
reach equals the banded programme's, and the split of a model whose step is composed from five blocks
equals the split of the whole model simulated block by block."""

from __future__ import annotations

import dataclasses
import random

import pytest

from layerscope.planning.split import SplitUnits
from layerscope.planning.split import partition as partition_mod

from .test_pipeline import _random_units


def _instances(count: int, seed: int):
    """Random units long enough for several of the banded programme's 64-row blocks, with the
    schedules, micro-batch counts and memory limits the planner passes."""
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.choice([30, 90, 200])
        units = _random_units(n, rng)
        if rng.random() < 0.4:       # runs of equal costs: ties between splits
            units = SplitUnits("m", tuple(dataclasses.replace(u, forward=dataclasses.replace(u.forward, flops=100))
                                          for u in units.units), units.ties, loss_bytes=units.loss_bytes)
        sched = rng.choice(["gpipe", "1f1b", "interleaved"])   # (zbv: its order imports torch's pipelining, 2 s)
        k = rng.randint(1, 24)
        if sched == "interleaved":
            k = max(2, k - k % 2)
        limits = [float(rng.choice([200, 600, 2000, 10**6]))] * k if rng.random() < 0.5 else None
        yield units, k, rng.choice(["flops", "params"]), limits, sched, rng.choice([1, 2, 4])


def test_split_from_each_rows_reach_is_the_banded_programmes(monkeypatch):
    # the reference: solve() with the banded programme alone (every row searching its block's band,
    # as before the speed work); compared on the whole answer, bounds and bottleneck, or None
    seen = {"shown": 0, "fell back": 0}
    in_reach = partition_mod._solve_in_reach

    def counted(*a, **k):
        out = in_reach(*a, **k)
        seen["shown" if out is not None else "fell back"] += 1
        return out
    for units, k, by, limits, sched, m in _instances(24, 0):
        monkeypatch.setattr(partition_mod, "_solve_in_reach", counted)
        fast = partition_mod.solve(units, k, by, limits, sched, m)
        monkeypatch.setattr(partition_mod, "_solve_in_reach", lambda *a, **kw: None)
        assert fast == partition_mod.solve(units, k, by, limits, sched, m), (len(units.units), k, sched, m, limits)
    # both ways were taken: the answer shown equal, and the banded programme where it could not be
    assert seen["shown"] >= 8 and seen["fell back"] >= 4, seen


def _plans(monkeypatch, model, args: tuple, kwargs: dict, **opts):
    """partition()'s plan as it runs (its step composed from five blocks where it can be) and with the
    whole model simulated block by block (memory()'s compose=False, forced on partition's step), as
    to_dict(), and how many passes were composed."""
    import layerscope as ls
    from layerscope.api import _partition
    from layerscope.capture import compose as compose_mod

    widened = []
    widen = compose_mod.Composer.widen

    def counted(self, *a, **k):
        widened.append(1)
        return widen(self, *a, **k)
    monkeypatch.setattr(compose_mod.Composer, "widen", counted)
    composed = ls.partition(model, *args, **kwargs, **opts).to_dict()
    step = _partition.memory_step
    monkeypatch.setattr(_partition, "memory_step",
                        lambda m, a, k, o: step(m, a, k, dataclasses.replace(o, compose=False)))
    passes = len(widened)
    whole = ls.partition(model, *args, **kwargs, **opts).to_dict()
    assert len(widened) == passes          # the whole model's step composed nothing
    return composed, whole, passes


def test_composed_split_of_a_deep_mlp_is_the_whole_models(monkeypatch):
    import torch
    from torch import nn
    torch.manual_seed(0)
    mlp = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(12)])
    # on CPU with real weights partition() also measures each unit's working memory in a real step:
    # the same on both sides (the model's own step), so the plans differ only if the composed
    # simulation does
    composed, whole, passes = _plans(monkeypatch, mlp, (torch.randn(4, 64),), {}, stages=4, microbatches=2,
                                     optimizer="adamw")
    assert passes >= 1 and composed == whole
    # 12 blocks of Linear(64, 64): (64 * 64 + 64) * 4 bytes of parameters each, 3 blocks a stage
    # (the units are the 24 Linear and ReLU modules; equal FLOPs per block)
    assert [s["params"] for s in composed["stages"]] == [3 * (64 * 64 + 64)] * 4


def test_composed_split_of_a_transformer_is_the_whole_models(monkeypatch):
    import torch
    tf = pytest.importorskip("transformers")
    cfg = tf.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg).to("meta")     # meta: the step simulated only, nothing measured
    ids = torch.zeros(4, 8, dtype=torch.long, device="meta")
    composed, whole, passes = _plans(monkeypatch, model, (), {"input_ids": ids}, stages=3, microbatches=2)
    assert passes >= 1 and composed == whole
