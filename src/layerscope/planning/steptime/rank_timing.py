"""What a rank of a pipeline run measures of its own time: the seconds its stages compute (each
action's block on the step's timeline) and how much slower it computes while every rank does."""

from __future__ import annotations

import time

import torch

from ...capture.state import model_device
from ..split.runnable import main_tensor

__all__ = ["Busy", "corun_slowdown"]


class Busy:
    """Seconds a rank spends computing: its stages' forward and backward of each micro-batch
    (``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``) and the loss,
    timed around the stage's own methods; the schedule's sends, receives and waits are outside."""

    def __init__(self, stages) -> None:
        self.seconds = 0.0
        self.per_stage = {s.stage_index: 0.0 for s in stages}
        # this step's actions: [stage, "F"/"B"/"W", micro-batch, start, end], seconds from ``start``
        self.blocks: list[list] = []
        self.start = 0.0
        kinds = {"forward_one_chunk": "F", "backward_one_chunk": "B", "backward_weight_one_chunk": "W"}
        for st in stages:
            for name, kind in kinds.items():
                setattr(st, name, self._timed(getattr(st, name), st.stage_index, kind))

    def _clocked(self, fn, done):
        """``fn`` timed: ``done(t0, t1, args, kwargs)`` after each call (also when it raises)."""
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                t1 = time.perf_counter()
                self.seconds += t1 - t0
                done(t0, t1, a, k)
        return run

    def _timed(self, fn, index, kind):
        def done(t0, t1, a, k):
            self.per_stage[index] += t1 - t0
            mb = a[0] if a else k.get("fwd_chunk_id", k.get("bwd_chunk_id", -1))
            # zero bubble's I: the backward for the input alone (its W follows as its own call)
            what = "I" if kind == "B" and k.get("full_backward", True) is False else kind
            self.blocks.append([index, what, mb, t0 - self.start, t1 - self.start])
        return self._clocked(fn, done)

    def loss(self, fn):
        def done(t0, t1, a, k):
            if self.blocks and self.blocks[-1][1] == "F":   # the loss follows the last stage's
                self.blocks[-1][4] = t1 - self.start           # forward: part of its block, as planned
        return self._clocked(fn, done)


def corun_slowdown(model, mb_args, mb_kwargs, rank: int, world: int, repeats: int = 5) -> tuple[float, float]:
    """How much slower this rank computes while every rank computes at once than alone: ranks that
    share one machine (CPU processes) share its cores, caches and memory bandwidth. Measured on the
    work of the run, one micro-batch's forward and backward of the whole model, ``repeats`` times
    alone (the ranks take turns, the others wait at a barrier) and ``repeats`` times all at once;
    the ratio of the medians, and the median alone (seconds: the machine's speed at the run, for
    ``RunResult.speed``). Each pass runs on capture's step engine (which gives the model its modes
    and state back). The model's gradients are cleared after and the RNG restored, so the training
    steps that follow are those of a run without it."""
    import torch.distributed as dist

    from ...capture.spec import StepSpec, StepWatch
    from ...capture.step import run_steps

    def timed(n: int) -> list[float]:
        """``n`` steps on capture's step engine (measured, no optimizer, the output let go once the
        loss is computed), each one's seconds from its start to its end."""
        seconds: list[float] = []

        def on_step(step: int, when: str) -> None:
            if when == "begin":
                seconds.append(-time.perf_counter())
            else:
                seconds[-1] += time.perf_counter()
        spec = StepSpec(model, tuple(mb_args), mb_kwargs, loss_fn=lambda out: main_tensor(out).float().pow(2).mean(),
                        steps=n, keep_output=False, simulate=False, device=model_device(model))
        run_steps(spec, StepWatch(on_step=on_step))
        return seconds

    rng = torch.get_rng_state()
    try:
        timed(1)                            # warm-up: first-call allocations and kernel choice
        alone, together = [], []
        for r in range(world):
            dist.barrier()
            if r == rank:
                alone = timed(repeats)
        dist.barrier()
        together = timed(repeats)
        dist.barrier()
    finally:
        torch.set_rng_state(rng)
        for p in model.parameters():
            p.grad = None
    alone_s = sorted(alone)[repeats // 2]
    return sorted(together)[repeats // 2] / alone_s, alone_s
