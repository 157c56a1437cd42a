"""Issue 59, item 1: one step engine. A frozen StepSpec says what one step is; run_steps(spec, watch) runs it
and run_step(spec, watch) is the one step function the entry points call (composed from five blocks where
it can be, else the whole model, each attempt under a fresh watch)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from layerscope.capture.composed import run_step
from layerscope.capture.spec import StepSpec, StepWatch
from layerscope.capture.step import run_steps
from layerscope.capture.storage import StorageTracker


def _spec(**kw) -> StepSpec:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return StepSpec(model, (torch.randn(2, 8),), {}, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), **kw)


def test_the_spec_is_frozen():
    spec = _spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.steps = 3


def test_run_steps_runs_steps_times_accumulation_passes():
    # 2 steps of 3 micro-batches: 6 recorded passes, one optimizer phase a step
    spec = _spec(steps=2, accumulation=3)
    run = run_steps(spec, StepWatch(tracker=StorageTracker()))
    assert [(p.step, p.micro) for p in run.passes] == [(s, m) for s in range(2) for m in range(3)]
    assert sum(1 for _, phase, _, _ in run.phase_ranges if phase == "optimizer") == 2
    # an inference spec runs one forward whatever steps and accumulation say
    run = run_steps(dataclasses.replace(spec, training=False, optimizer=None), StepWatch(tracker=StorageTracker()))
    assert len(run.passes) == 1


def test_run_step_without_blocks_runs_the_whole_model_and_closes_each_watch():
    spec = _spec(compose=True)
    made, closed, steps = [], [], []

    def watch():
        made.append(1)
        return StepWatch(tracker=StorageTracker(), on_step=lambda s, w: steps.append((s, w)),
                         close=lambda: closed.append(1))
    run, ran = run_step(spec, watch)
    # the composed attempt finds no run of blocks (its watch closed), then the whole model runs
    assert len(made) == len(closed) == 2 and ran.tracker is run.tracker
    assert steps == [(0, "begin"), (0, "end")] and len(run.passes) == 1


def test_the_model_is_unchanged_by_a_real_tracked_step():
    spec = _spec(simulate=False)
    before = {k: v.clone() for k, v in spec.model.state_dict().items()}
    run = run_steps(spec, StepWatch(tracker=StorageTracker()))
    assert run.passes and all(torch.equal(before[k], v) for k, v in spec.model.state_dict().items())


def test_a_callers_hooks_on_the_engine():
    # StepWatch.modules: a context around the steps with the modules that run (partition's unit
    # marks); on_grads(step): after each step's backward, before its optimizer step; micro_inputs:
    # each accumulation pass of a measured run on its own micro-batch, in turn
    spec = _spec(steps=2, accumulation=2, simulate=False)
    x = spec.args[0]
    seen, grads, inputs = [], [], []

    class Hooked:
        def __init__(self, named):
            seen.append([n for n, _ in named])

        def __enter__(self):
            seen.append("enter")

        def __exit__(self, *exc):
            seen.append("exit")

    def on_grads(step):
        grads.append((step, all(p.grad is not None for p in spec.model.parameters())))
    micro = (((x[:1],), {}), ((x[1:],), {}))
    spec = dataclasses.replace(spec, micro_inputs=micro,
                               loss_fn=lambda out: inputs.append(out.shape[0]) or out.sum())
    run_steps(spec, StepWatch(modules=Hooked, on_grads=on_grads))
    assert seen == [["", "0", "1", "2"], "enter", "exit"]
    assert grads == [(0, True), (1, True)]
    assert inputs == [1, 1, 1, 1] and all(p.grad is None for p in spec.model.parameters())
    with pytest.raises(Exception, match="micro_inputs"):
        run_steps(dataclasses.replace(spec, simulate=True), StepWatch())
