"""A schedule is one entry of the table (planning/config.py SCHEDULES): an entry registered under a name of
its own, a copy of an existing one, runs through the step-time model, the stage memory and the split, the
search's space and a simulated pipeline rank with the same figures as the schedule it copies (the code
reads the entry's fields, never its name)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from layerscope.errors import PlanError
from layerscope.planning.config import SCHEDULES, ParallelConfig, PartitionOptions
from layerscope.planning.search.candidates import space
from layerscope.planning.split.planner import plan_split
from layerscope.planning.split.stage_memory import held_microbatches, stage_memory
from layerscope.planning.split.units import SplitUnits, Unit
from layerscope.planning.steptime.schedule import rank_orders, simulate, stage_ranks
from layerscope.trace import Costs

NAMES = tuple(SCHEDULES)     # every schedule of the table, as the suite starts


@pytest.fixture
def copy_of(monkeypatch):
    """Registers a copy of a schedule's entry under a new name (removed again after the test)."""
    def register(name: str) -> str:
        entry = dataclasses.replace(SCHEDULES[name], name=f"copy-of-{name}", label=f"a copy of {name}")
        monkeypatch.setitem(SCHEDULES, entry.name, entry)
        return entry.name
    return register


def _unit(i, rng):
    return Unit(index=i, name=f"u{i}", paths=(f"u{i}",), type="X", params=0, param_bytes=rng.randint(0, 100),
                grad_bytes=rng.randint(0, 60), optimizer_bytes=0, saved_bytes=rng.randint(0, 50),
                input_bytes=rng.randint(1, 20), output_bytes=rng.randint(1, 20),
                forward=Costs(flops=rng.randint(1, 1000)), backward=Costs(), work_bytes=rng.randint(0, 80),
                deferred_bytes=rng.randint(0, 10), forward_time=rng.uniform(1e-3, 5e-3),
                backward_time=rng.uniform(2e-3, 9e-3), weight_flops=rng.randint(0, 500))


@pytest.mark.parametrize("name", NAMES)
def test_a_copied_entry_gets_the_same_step_time(name, copy_of):
    copy = copy_of(name)
    assert copy not in NAMES
    stages, m, spr = 4, 4, 2
    assert stage_ranks(copy, stages, spr) == stage_ranks(name, stages, spr)
    assert rank_orders(copy, stages, m, spr) == rank_orders(name, stages, m, spr)
    rng = random.Random(0)
    f = [rng.uniform(1, 3) for _ in range(stages)]
    b = [x * rng.uniform(1.5, 2.5) for x in f]
    w = [x * 0.4 for x in b] if SCHEDULES[name].zero_bubble else None
    kw = dict(send=[0.1] * (stages - 1), optimizer=[0.3] * stages, stages_per_rank=spr, weight=w)
    for corun in (1.0, 1.5):
        got, want = simulate(copy, f, b, m, corun=corun, **kw), simulate(name, f, b, m, corun=corun, **kw)
        assert got.to_dict() == want.to_dict()


@pytest.mark.parametrize("name", NAMES)
def test_a_copied_entry_gets_the_same_stage_memory_and_split(name, copy_of):
    copy = copy_of(name)
    rng = random.Random(1)
    stages, m = 4, 4
    units = SplitUnits("m", tuple(_unit(i, rng) for i in range(8)), loss_bytes=30, loss_saved_bytes=7,
                       kept_outputs=True, input_batch_bytes=12, target_bytes=5)
    for s in range(stages):
        assert held_microbatches(copy, stages, m, s) == held_microbatches(name, stages, m, s)
        assert stage_memory(units, 2 * s, 2 * s + 2, s, stages, copy, m) == \
            stage_memory(units, 2 * s, 2 * s + 2, s, stages, name, m)
    for objective, limit in (("bottleneck", None), ("step_time", None), ("bottleneck", 700)):
        got, want = (_split(units, PartitionOptions(stages=stages, schedule=n, microbatches=m, objective=objective,
                                                    memory_limit=limit, link_bandwidth=1e3))
                     for n in (copy, name))
        if isinstance(want, str):        # infeasible: the same message
            assert got == want
            continue
        assert got.schedule == copy
        assert dataclasses.replace(got, schedule=name) == want


def _split(units, options):
    try:
        return plan_split(units, options)
    except PlanError as e:
        return str(e).replace("copy-of-", "")


@pytest.mark.parametrize("name", NAMES)
def test_a_copied_entry_is_configured_and_searched_alike(name, copy_of):
    copy = copy_of(name)
    a, b = (ParallelConfig(gpus=8, pp=2, schedule=n, microbatches=4, reshard_after_forward=False) for n in (copy, name))
    assert (a.stages, a.world, a.fsdp) == (b.stages, b.world, b.fsdp)
    by_schedule = {}
    for c in (c for c in space(8, 8, 16) if c.pp > 1):
        by_schedule.setdefault(c.schedule, []).append(dataclasses.replace(c, schedule=name) if c.schedule == copy else c)
    # the search tries the schedules whose entry says so, the copy as the schedule it copies
    assert by_schedule.get(copy, []) == by_schedule.get(name, [])
    assert bool(by_schedule.get(copy)) == SCHEDULES[name].searched


def test_a_copied_entry_simulates_a_pipeline_rank_alike(copy_of):
    # GPipe holds all 4 micro-batches on stage 0 and keeps the input gradients the last stage sends to the
    # step's end, 1F1B 2 of them and each sent gradient until the next backward: the copies as their originals
    from layerscope.planning.simulate.pipeline_rank import simulate_stage_rank
    from layerscope.planning.simulate.sharded_rank import RankStep

    from .sharded.test_stages import Net

    def figures(schedule, rank):
        torch.manual_seed(0)
        m, x = Net(), torch.randn(64, 32)
        cfg = ParallelConfig(gpus=2, pp=2, schedule=schedule, microbatches=4, mixed_precision="off")
        rr = simulate_stage_rank(m, (x,), {}, cfg, rank, RankStep(optimizer=None, steps=1, loss_fn=None))
        return rr.p2p, sorted((rr.part(b), b.nbytes, b.alloc, b.free) for b in rr.tracker.blocks)

    for name, rank in (("gpipe", 1), ("1f1b", 0), ("1f1b", 1)):
        assert figures(copy_of(name), rank) == figures(name, rank)
