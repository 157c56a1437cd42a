"""Run a StagePlan as a real pipeline: torchrun, one process per rank, gloo on CPU (NCCL on GPU).

``launch()`` (the CLI's ``split --run``) writes the run's settings to a JSON file and starts
``torchrun --nproc_per_node P -m layerscope.torchrun FILE``. Every rank builds the model from
the same spec and seed, computes the same plan, builds its own stage (export path when torch.export
traces the model, module ownership otherwise), trains ``steps`` steps with the schedule and writes
its measured step time, peak memory (the stage's parameters and buffers plus the CPU allocator's
events from the first step on, peak taken in the last step; CUDA: max_memory_allocated in the last
step) and, on the last rank, the losses.
The launcher trains the same model in one process with the same micro-batches (gradient
accumulation) and compares the losses.

``layerscope.pipeline.stages.pipeline_stage(plan, model, rank, args, kwargs)`` gives a user the
PipelineStage for their rank, for their own training loop. This module sits above the api (it builds
models from specs and plans them with ``partition()``), outside ``pipeline/``, which the api uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from .errors import InputError
from .pipeline.schedule import ZERO_BUBBLE
from .pipeline.stages import flat_inputs, main_tensor, pipeline_stage

__all__ = ["launch", "RunResult", "reference_losses"]


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # the mean squared error, written out: F.mse_loss's scalar result shares the storage of an
    # output-sized buffer (torch 2.13, CPU), so every loss the schedule keeps until the step ends
    # would hold a copy of the stage's output alive
    return (out.float() - target.float()).pow(2).mean()


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.rsplit(".", 1)[-1])


def _setup(cfg: dict):
    """What every rank and the single-process reference build alike: the model (same seed), the
    whole batch (the command line's inputs at ``batch_size``, fresh values in every row), one
    micro-batch of it, the target and the plan."""
    from .api import partition
    from .capture.inputs import map_tensors
    from .capture.prepare import micro_batch, rebatch
    from .specs import build_model, command_inputs

    torch.manual_seed(cfg["seed"])
    built = build_model(cfg["spec"], "cpu", cfg.get("overrides") or {}, cfg.get("head"),   # real weights
                        allow_pickle=cfg.get("allow_pickle", False), dtype=cfg.get("model_dtype"))
    model = built.model
    dtypes = [_dtype(d) for d in cfg["dtypes"]] if cfg.get("dtypes") else None
    sizes = [tuple(x) for x in cfg["input_size"]] if cfg.get("input_size") else None
    args, kwargs = command_inputs(cfg["spec"], model, built.default_inputs, torch.device("cpu"), sizes, dtypes,
                                  cfg.get("input_ids"))
    args, kwargs = rebatch(args, kwargs, 0, cfg["batch_size"])
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)

    def fresh(t: torch.Tensor) -> torch.Tensor:   # distinct samples in every row of the batch
        if t.is_floating_point():
            return torch.randn(t.shape, dtype=t.dtype)
        return torch.randint(0, int(vocab or (int(t.max()) + 1)), t.shape, dtype=t.dtype)

    args, kwargs = map_tensors(args, fresh), map_tensors(kwargs, fresh)
    model.train() if cfg.get("train_mode", True) else model.eval()
    mb_args, mb_kwargs, _ = micro_batch(args, kwargs, cfg["microbatches"])
    rng = torch.get_rng_state()
    with torch.no_grad():
        out = main_tensor(model(*mb_args, **mb_kwargs))
    torch.set_rng_state(rng)
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    target = torch.randn((out.shape[0] * cfg["microbatches"],) + tuple(out.shape[1:]), generator=g)
    del out
    device = cfg.get("device") or "cpu"
    # the loss's working memory is planned with a stand-in target (a view of the output: no
    # allocation, as the run's target, which exists before the step); the plan counts what the
    # ranks hand to schedule.step(): the batch on rank 0, the targets on the last rank, and with
    # return_outputs (torch's default) the outputs the last stage keeps
    plan = partition(model, *args, stages=cfg["stages"], by=cfg["by"], schedule=cfg["schedule"],
                     microbatches=cfg["microbatches"], optimizer=cfg["optimizer"],
                     stages_per_rank=cfg.get("stages_per_rank", 2), memory_limit=cfg.get("memory_limit"),
                     device=None if torch.device(device).type == "cpu" else device,
                     loss_fn=lambda o: _loss(main_tensor(o), main_tensor(o).detach()),
                     return_outputs=cfg.get("return_outputs", True), count_inputs=True,
                     target_bytes=target.numel() * target.element_size(),
                     **(cfg.get("partition_options") or {}), **kwargs)
    return model, args, kwargs, mb_args, mb_kwargs, plan, target


def _optimizer(name: str, params):
    from .options import optimizer_factory
    return optimizer_factory(name)(params)


def reference_losses(cfg: dict):
    """Single-process training with the same micro-batches, loss and optimizer: (losses, plan)."""
    losses, _, plan = reference_run(cfg)
    return losses, plan


def reference_run(cfg: dict):
    """Single-process training with the same micro-batches, loss and optimizer (gradient
    accumulation): (losses per step, {parameter name: gradient of the first step}, plan). Tied
    parameters appear under every name. The first step's gradients are of the same weights on every
    side; later steps' weights differ by the rounding of the earlier steps."""
    model, args, kwargs, _, _, plan, target = _setup(cfg)
    tensors, rebuild = flat_inputs(args, kwargs)
    m = cfg["microbatches"]
    chunks = list(zip(*[t.tensor_split(m) for t in tensors]))
    targets = target.tensor_split(m)
    opt = _optimizer(cfg["optimizer"], [p for p in model.parameters() if p.requires_grad])
    losses = []
    grads: dict = {}
    for step in range(cfg["steps"]):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for c, t in zip(chunks, targets):
            a, k = rebuild(c)
            loss = _loss(main_tensor(model(*a, **k)), t)
            (loss / m).backward()
            total += loss.item()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)
                     if p.grad is not None}
        opt.step()
        losses.append(total / m)
    return losses, grads, plan


class _Busy:
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


def _corun(model, mb_args, mb_kwargs, rank: int, world: int, repeats: int = 5) -> tuple[float, float]:
    """How much slower this rank computes while every rank computes at once than alone: ranks that
    share one machine (CPU processes) share its cores, caches and memory bandwidth. Measured on the
    work of the run, one micro-batch's forward and backward of the whole model, ``repeats`` times
    alone (the ranks take turns, the others wait at a barrier) and ``repeats`` times all at once;
    the ratio of the medians, and the median alone (seconds: the machine's speed at the run, for
    ``RunResult.speed``). The model's gradients are cleared after and the RNG restored, so the
    training steps that follow are those of a run without it."""
    import torch.distributed as dist

    def once() -> float:
        t0 = time.perf_counter()
        main_tensor(model(*mb_args, **mb_kwargs)).float().pow(2).mean().backward()
        return time.perf_counter() - t0

    rng = torch.get_rng_state()
    try:
        once()                              # warm-up: first-call allocations and kernel choice
        alone, together = [], []
        for r in range(world):
            dist.barrier()
            if r == rank:
                alone = [once() for _ in range(repeats)]
        dist.barrier()
        together = [once() for _ in range(repeats)]
        dist.barrier()
    finally:
        torch.set_rng_state(rng)
        for p in model.parameters():
            p.grad = None
    alone_s = sorted(alone)[repeats // 2]
    return sorted(together)[repeats // 2] / alone_s, alone_s


def _weights(plan) -> list[float] | None:
    """Zero bubble: each stage's W seconds, from the plan."""
    if plan.schedule not in ZERO_BUBBLE:
        return None
    return [s.weight_time or 0.0 for s in plan.stages]


def _local_stages(plan, rank: int) -> list[int]:
    return [s.index for s in plan.stages if s.rank == rank]


def worker(cfg_path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)

    from .capture.measure import measure_cpu, state_bytes

    with open(cfg_path) as f:
        cfg = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and torch.device(cfg.get("device") or "cpu").type == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        model, args, kwargs, mb_args, mb_kwargs, plan, target = _setup(cfg)
        ranks = max(s.rank for s in plan.stages) + 1
        if ranks != world:
            raise InputError(f"the plan puts its {plan.num_stages} stages on {ranks} ranks, not {world}")
        mine = _local_stages(plan, rank)
        # ranks on one machine's CPU slow each other down when they compute at once: measured here,
        # before the stages exist (they hook the model) and the steps, for the prediction (GPUs:
        # one per rank, nothing shared)
        corun, alone_s = _corun(model, mb_args, mb_kwargs, rank, world) if device.type == "cpu" and world > 1 \
            else (1.0, None)
        stages, sync, path = pipeline_stage(plan, model, rank, mb_args, mb_kwargs, device=device,
                                            path=cfg.get("path", "auto"), all_local=True)
        busy = _Busy(stages)
        params = [p for st in stages for p in st.submod.parameters() if p.requires_grad]
        opt = _optimizer(cfg["optimizer"], params)
        loss_fn = busy.loss(_loss)
        m = cfg["microbatches"]
        multi = {"interleaved": ScheduleInterleaved1F1B, "zb": ScheduleInterleavedZeroBubble,
                 "zbv": ScheduleZBVZeroBubble}
        if cfg["schedule"] in multi:
            sched = multi[cfg["schedule"]](stages, n_microbatches=m, loss_fn=loss_fn)
        else:
            sched = (ScheduleGPipe if cfg["schedule"] == "gpipe" else Schedule1F1B)(
                stages[0], n_microbatches=m, loss_fn=loss_fn)
        tensors, _ = flat_inputs(args, kwargs)
        tensors = [t.to(device) for t in tensors]
        target = target.to(device)
        first, last = 0 in mine, plan.num_stages - 1 in mine
        keep = bool(cfg.get("return_outputs", True))
        times, losses, busy_s, blocks = [], [], [], []
        busy_stage: dict[int, list] = {i: [] for i in mine}

        def one_step():
            opt.zero_grad(set_to_none=True)
            b0, s0 = busy.seconds, dict(busy.per_stage)
            t0 = time.perf_counter()
            busy.start, busy.blocks = t0, []
            mb_losses: list = []
            out = sched.step(*(tensors if first else ()), target=target if last else None,
                             losses=mb_losses if last else None, return_outputs=keep)
            del out     # the merged outputs (return_outputs=True) are the caller's: dropped here
            sync()
            opt.step()
            times.append(time.perf_counter() - t0)
            blocks.append(busy.blocks)
            busy_s.append(busy.seconds - b0)
            for i in mine:
                busy_stage[i].append(busy.per_stage[i] - s0[i])
            if mb_losses:
                losses.append(sum(x.item() for x in mb_losses) / len(mb_losses))

        steps = cfg["steps"]
        # live tensor bytes of this rank from here on: what exists before the step and that the
        # plan counts (the stages' parameters and buffers; the batch handed to step() on the first
        # stage's rank, the targets on the last's) plus every allocation from the first step on
        # (optimizer state, the schedule's receive buffers, gradients, activations, kept outputs);
        # the peak is taken in the last step (steady state)
        held = [t for st in stages for t in (*st.submod.parameters(), *st.submod.buffers())]
        before = state_bytes(held + (list(tensors) if first else []) + ([target] if last else []))

        first_grads: dict = {}

        def all_steps(on_step):
            for i in range(steps):
                on_step(i, "begin")
                one_step()
                on_step(i, "end")
                if i == 0 and cfg.get("grads"):   # outside the measured step: not in its peak
                    for st in stages:
                        for n, p in st.submod.named_parameters():
                            if p.grad is not None:
                                first_grads[_model_name(n)] = p.grad.detach().cpu().clone()

        if device.type == "cpu":
            measured = measure_cpu(all_steps, before, steps)
            peak, step_peaks = measured.step_peaks[-1], list(measured.step_peaks)
            # the times: the profiler above records every allocation, and its growing buffers slow
            # the later steps down (1F1B on GPT-2: 430 ms steps became 830 ms by the fifth), so
            # ``steps`` more steps are timed without it (all in steady state: after the first)
            n_losses = len(losses)
            times.clear()
            busy_s.clear()
            blocks.clear()
            for i in mine:
                busy_stage[i].clear()
            for _ in range(steps):
                one_step()
            del losses[n_losses:]
        else:
            step_peaks = []

            def on_step(i, when):
                torch.cuda.synchronize(device)
                if when == "begin":
                    torch.cuda.reset_peak_memory_stats(device)
                else:
                    step_peaks.append(torch.cuda.max_memory_allocated(device))
            all_steps(on_step)
            peak = step_peaks[-1]
        own = [plan.stages[s].memory for s in mine]
        if len(mine) == 1:
            predicted = own[0]["total"]
        else:
            # several stages: their memory over the order this rank's schedule runs them in
            from .pipeline.partition import rank_memory
            kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
            order = [(a.stage_index, kinds[a.computation_type.name]) for a in sched.pipeline_order[rank]
                     if a is not None and a.computation_type.name in kinds]
            predicted = rank_memory(plan.units, [plan.stages[s] for s in mine], plan.num_stages, order, m)
        out = {"rank": rank, "stages": mine, "path": path, "times": times, "busy": busy_s,
               "steady": device.type == "cpu",      # the times are of steps after the measured ones
               "busy_per_stage": {str(k): v for k, v in busy_stage.items()}, "losses": losses,
               "blocks": blocks, "corun": corun, "alone_s": alone_s,
               "peak_bytes": peak, "step_peaks": step_peaks, "before_bytes": before,
               "predicted_bytes": int(predicted), "predicted_parts": own,
               "inputs": [list(t.shape) for t in tensors] if first else [],
               "params": sum(p.numel() for st in stages for p in st.submod.parameters())}
        if cfg.get("grads"):
            torch.save(first_grads, os.path.join(cfg["out"], f"grads{rank}.pt"))
        with open(os.path.join(cfg["out"], f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


def _model_name(name: str) -> str:
    """A stage parameter's name in the model: both paths wrap the model as ``model``."""
    return name[len("model."):] if name.startswith("model.") else name


@dataclass(frozen=True)
class RunResult:
    plan: object
    ranks: tuple[dict, ...]        # per rank: its stages; seconds of every step ("times"), busy in it
    #                                ("busy"; "busy_per_stage": stage -> seconds per step, forward and
    #                                backward without the loss); peak bytes measured and predicted
    #                                (and the stages' parts), losses
    reference: tuple[float, ...]
    losses: tuple[float, ...]
    path: str
    grad_rel_diff: float | None = None   # first step: max over parameters of |g - g_ref| / |g_ref| (2-norms)
    return_outputs: bool = True

    @property
    def loss_rel_diff(self) -> float:
        return max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(self.losses, self.reference))

    @property
    def step_time(self) -> float:
        """Measured seconds of one step: per step the slowest rank's, the median over the steps
        after the first (the first alone with one step)."""
        steps = min(len(r["times"]) for r in self.ranks)
        return self.steady([max(r["times"][i] for r in self.ranks) for i in range(steps)])

    @property
    def corun(self) -> float:
        """How much slower a rank computed while every rank computed at once than alone, measured
        in the run before its steps (the median over the ranks; 1.0 on GPUs, one per rank)."""
        xs = sorted(float(r.get("corun", 1.0)) for r in self.ranks)
        return xs[len(xs) // 2]

    @property
    def timeline(self):
        """The plan's simulated step with the co-run slowdown measured in the run (None: the plan
        has no unit times)."""
        return self.predict(self.plan)

    def speed(self, plan) -> float | None:
        """How much slower this machine computed the whole model's micro-batch (forward and backward,
        alone, measured by each rank before its steps: the median over the ranks) than ``plan``'s
        unit times add up to: the machine's drift between timing the units and the run (a shared or
        virtual machine's speed moves by tens of percent over minutes). None: not measured (GPUs),
        or the plan has no unit times."""
        xs = sorted(float(r["alone_s"]) for r in self.ranks if r.get("alone_s"))
        units = plan.units.units if getattr(plan, "units", None) is not None else ()
        if not xs or not units or any(u.forward_time is None for u in units):
            return None
        total = sum(u.forward_time + u.backward_time for u in units)
        return xs[len(xs) // 2] / total if total > 0 else None

    def predict(self, plan, at_run_speed: bool = False):
        """``plan``'s simulated step (a plan of these cuts with unit times, e.g. made before the
        run) with the co-run slowdown measured in this run; None where the plan has no times.
        ``at_run_speed``: its compute times also scaled by ``speed(plan)`` (the machine's speed
        when the run began, against when the units were timed)."""
        if getattr(plan, "timeline", None) is None:
            return None
        from .pipeline.schedule import simulate
        st = plan.stages
        k = (self.speed(plan) or 1.0) if at_run_speed else 1.0
        w = _weights(plan)
        return simulate(plan.schedule, [k * s.forward_time for s in st], [k * s.backward_time for s in st],
                        plan.microbatches, send=[s.send_time for s in st[:-1]],
                        optimizer=[k * s.optimizer_time if s.optimizer_time else s.optimizer_time for s in st],
                        stages_per_rank=plan.stages_per_rank, corun=self.corun,
                        weight=[k * x for x in w] if w else w)

    def replay(self) -> tuple[float, float] | None:
        """A check of the schedule model alone: the plan's schedule simulated with the durations the
        run itself measured for its actions (per stage and kind, the mean over the micro-batches of
        the median step), against that step's end of the last action. Returns (simulated, measured)
        seconds; None without per-action times."""
        if not all(r.get("blocks") for r in self.ranks):
            return None
        from .pipeline.schedule import simulate
        steps = min(len(r["blocks"]) for r in self.ranks)
        per_step = [max(r["times"][i] for r in self.ranks) for i in range(steps)]
        pool = list(range(steps)) if self.warm or steps == 1 else list(range(1, steps))
        i = sorted(pool, key=lambda j: per_step[j])[len(pool) // 2]
        durs: dict = {}
        for r in self.ranks:
            for st, kind, _, a, b in r["blocks"][i]:
                durs.setdefault((st, kind), []).append(b - a)
        k = self.plan.num_stages

        def mean(s, kind):
            v = durs.get((s, kind))
            return sum(v) / len(v) if v else 0.0
        f = [mean(s, "F") for s in range(k)]
        w = [mean(s, "W") for s in range(k)]                 # zero bubble: backward = I + W
        b = [mean(s, "B") + mean(s, "I") + w[s] for s in range(k)]
        tl = simulate(self.plan.schedule, f, b, self.plan.microbatches, stages_per_rank=self.plan.stages_per_rank,
                      weight=w if any(w) else None)
        return tl.pipeline_time, max(b for r in self.ranks for *_, b in r["blocks"][i])

    @property
    def warm(self) -> bool:
        """Whether every timed step came after others (CPU: timed after the memory-measured steps)."""
        return all(r.get("steady") for r in self.ranks)

    def steady(self, values: list) -> float:
        """The median of the timed steps in steady state: all of them when they came after the
        memory-measured steps, else those after the first (the first alone with one step)."""
        xs = sorted(values if self.warm else (values[1:] or values))
        return xs[len(xs) // 2]

    def table(self) -> str:
        from .render.text import text_table
        from .render.units import iec
        one = all(len(r["times"]) == 1 for r in self.ranks) and not self.warm
        when = "first step" if one else "median"
        tl = self.timeline
        header = ["Rank", "Stages", f"Step time ({when})", f"Busy ({when})"] + \
            (["Busy predicted"] if tl is not None else []) + ["Peak measured", "Peak predicted", "Error"]
        body = []
        for r in self.ranks:
            err = (r["predicted_bytes"] - r["peak_bytes"]) / r["peak_bytes"] if r["peak_bytes"] else 0.0
            body.append([str(r["rank"]), ", ".join(str(s) for s in r.get("stages", [r["rank"]])),
                         f"{self.steady(r['times']) * 1e3:.1f} ms",
                         f"{self.steady(r['busy']) * 1e3:.1f} ms" if r.get("busy") else "--"] +
                        ([f"{tl.busy[r['rank']] * 1e3:.1f} ms"] if tl is not None else []) +
                        [iec(r["peak_bytes"]), iec(r["predicted_bytes"]), f"{100 * err:+.1f}%"])
        footer = [("Stages built by", "torch.export + pipeline()" if self.path == "export"
                   else "module ownership (zbv runs no other way here)" if self.plan.schedule == "zbv"
                   else "module ownership (torch.export could not trace the model)"),
                  ("Step time", "the first step only (--steps 1): not steady state, it includes "
                                "warm-up (allocations, first sends)" if one else
                   (lambda n: f"median of {n} step{'s' if n > 1 else ''} timed after as many memory-measured "
                    "ones (steady state, without the profiler)")(len(self.ranks[0]["times"])) if self.warm else
                   "median of the steps after the first (the first is warm-up)"),
                  ("Step time predicted", f"{tl.step_time * 1e3:.1f} ms (the plan's simulation"
                   + (f", {self.plan.timeline.step_time * 1e3:.1f} ms with ranks that do not slow each other"
                      if self.corun != 1.0 else "")
                   + f"), measured {self.step_time * 1e3:.1f} ms (the slowest rank): predicted / measured "
                   f"{tl.step_time / self.step_time:.2f}" if tl is not None else
                   "-- (the plan has no unit times: --by latency measures them, --by roofline predicts them)"),
                  ("Outputs", "step(return_outputs=True) (torch's default): the last stage keeps every "
                              "micro-batch's output" if self.return_outputs else
                   "step(return_outputs=False): the last stage keeps no outputs"),
                  ("Loss per step", ", ".join(f"{x:.6g}" for x in self.losses)),
                  ("Single process", ", ".join(f"{x:.6g}" for x in self.reference)),
                  ("Max relative diff", f"{self.loss_rel_diff:.2e}")]
        check = self.replay()
        if check is not None:
            footer.insert(3, ("Schedule model", f"{check[0] * 1e3:.1f} ms simulated from the run's own action times, "
                              f"against {check[1] * 1e3:.1f} ms to the end of the last action "
                              f"({check[0] / check[1]:.2f}): what the prediction misses beyond this is in the "
                              "predicted action times, not the schedule"))
        speed = self.speed(self.plan) if tl is not None else None
        if speed is not None:
            at = self.predict(self.plan, at_run_speed=True).step_time
            footer.insert(3, ("Machine speed", f"x{speed:.2f}: the whole model's micro-batch took that much longer "
                              "alone, before the steps, than the plan's unit times add up to (a shared or virtual "
                              f"machine's speed moves); predicted at that speed {at * 1e3:.1f} ms "
                              f"({at / self.step_time:.2f} of measured)"))
        if self.corun != 1.0:
            footer.insert(3, ("Co-run slowdown", f"x{self.corun:.2f}: a rank computed that much slower while every "
                              "rank computed at once than alone (measured before the steps: the ranks share "
                              "this machine's cores); the prediction slows ranks that compute together by it"))
        if self.grad_rel_diff is not None:
            footer.append(("Gradients", f"max relative diff {self.grad_rel_diff:.2e} against one process"))
        return text_table(header, body, footer)


def launch(spec: str, *, overrides: dict | None = None, stages: int, by: str = "flops", schedule: str = "1f1b",
           microbatches: int = 4, batch_size: int = 8, steps: int = 3, optimizer: str = "sgd", seed: int = 0,
           path: str = "auto", device: str = "cpu", timeout: float = 600.0, head: str | None = None,
           input_size=None, dtypes=None, input_ids=None, model_dtype: str | None = None,
           memory_limit=None, stages_per_rank: int = 2, return_outputs: bool = True,
           allow_pickle: bool = False, partition_options: dict | None = None,
           compare_grads: bool = False) -> RunResult:
    """Train ``steps`` steps of the split model under torchrun and compare with one process.

    Every rank builds the model from ``spec`` (``overrides``, ``head``, ``model_dtype``) and the
    inputs the command line would (``input_size`` with ``dtypes``, ``input_ids``, else the spec's
    defaults) at ``batch_size``, and plans it with ``partition()`` (``by``, ``schedule``,
    ``microbatches``, ``optimizer``, ``memory_limit``, ``stages_per_rank``, and ``partition_options``:
    more keyword arguments, JSON values). The interleaved and zb schedules put ``stages_per_rank``
    stages on each of stages / stages_per_rank ranks, zbv two. ``return_outputs`` is passed to ``schedule.step()``
    (True is torch's default) and to the plan. ``compare_grads``: also compare every parameter's
    gradient of the first step with one process (``RunResult.grad_rel_diff``)."""
    if schedule == "interleaved":
        if stages_per_rank < 2 or stages % stages_per_rank:
            raise InputError(f"the interleaved schedule puts {stages_per_rank} stages on each rank: "
                             f"--stages ({stages}) must be a multiple of it (at least 2)")
        procs = stages // stages_per_rank
        rounds = max(1, microbatches // procs)
        if microbatches % rounds:
            # torch's ScheduleInterleaved1F1B runs the micro-batches in rounds of pp_size
            raise InputError(f"torch's interleaved 1F1B needs the micro-batches ({microbatches}) to be a "
                             f"multiple of its rounds ({rounds} = max(1, micro-batches // {procs} ranks))")
    elif schedule in ZERO_BUBBLE:
        # the plan checks the stage counts and torch's rules (partition() runs first, below)
        procs = stages // (2 if schedule == "zbv" else max(1, stages_per_rank))
        if schedule == "zbv":
            # torch's traced stages (pipeline(), build_stage) under ScheduleZBVZeroBubble's V placement
            # failed to connect here (gloo: "Pair is not connected", torch 2.13); ownership stages run
            if path == "export":
                raise InputError("--schedule zbv runs with module-ownership stages: torch.export stages "
                                 "fail to connect under its V placement (torch 2.13, gloo)")
            path = "ownership"
    else:
        procs = stages
    if microbatches > batch_size:
        raise InputError(f"{microbatches} micro-batches need a batch of at least {microbatches} "
                         f"(--batch-size {batch_size})")
    with tempfile.TemporaryDirectory(prefix="layerscope-run-") as tmp:
        cfg = {"spec": spec, "overrides": overrides or {}, "stages": stages, "by": by, "schedule": schedule,
               "microbatches": microbatches, "batch_size": batch_size, "steps": steps,
               "optimizer": optimizer, "seed": seed, "out": tmp, "path": path, "device": device,
               "head": head, "input_size": [list(x) for x in input_size] if input_size else None,
               "dtypes": [str(d) for d in dtypes] if dtypes else None,
               "input_ids": list(input_ids) if input_ids else None, "model_dtype": model_dtype,
               "memory_limit": memory_limit, "stages_per_rank": stages_per_rank,
               "return_outputs": bool(return_outputs), "allow_pickle": bool(allow_pickle),
               "partition_options": dict(partition_options or {}), "grads": bool(compare_grads)}
        cfg_path = os.path.join(tmp, "run.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)     # refuses what JSON cannot carry (partition_options must be JSON)
        # the single process first: it plans exactly as every rank will, so a plan that cannot be
        # made (a memory limit no split fits, inputs the model refuses) fails here, in one line. It
        # runs with the threads each rank will have, so that times measured for the plan
        # (by="latency") are those of the run; the ranks then take this plan's cuts, not their own
        # measurements (which differ from rank to rank)
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // procs))
        try:
            ref, ref_grads, plan = reference_run(cfg)
        finally:
            torch.set_num_threads(threads)
        if plan.num_stages > 1 and "cuts" not in cfg["partition_options"]:
            cfg["partition_options"]["cuts"] = list(plan.split_points)
            cfg["by"] = "flops" if cfg["by"] in ("latency", "roofline") else cfg["by"]   # nothing to time
            with open(cfg_path, "w") as f:
                json.dump(cfg, f)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
               "--master_port", str(_free_port()), "-m", "layerscope.torchrun", cfg_path]
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // procs)))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise InputError(f"the pipeline run failed (torchrun exit {proc.returncode}):\n"
                             + _worker_error(proc.stderr or proc.stdout or ""))
        ranks = []
        for r in range(procs):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
        diff = None
        if compare_grads:
            diff = 0.0
            seen = set()
            for r in range(procs):
                for name, g in torch.load(os.path.join(tmp, f"grads{r}.pt")).items():
                    if name not in ref_grads:
                        raise InputError(f"rank {r} has a gradient for {name}, which the model lacks")
                    want = ref_grads[name].double()
                    scale = float(want.norm()) or 1.0
                    diff = max(diff, float((g.double() - want).norm()) / scale)
                    seen.add(name)
            missing = {n for n in ref_grads} - seen
            # a tied parameter has several names in the model; one stage's name covers it
            if any(not any(ref_grads[n] is ref_grads[s] or torch.equal(ref_grads[n], ref_grads[s])
                           for s in seen) for n in missing):
                raise InputError(f"no rank returned the gradients of {sorted(missing)[:5]}")
    holder = next(r for r in ranks if plan.num_stages - 1 in r["stages"])    # zbv: rank 0
    return RunResult(plan=plan, ranks=tuple(ranks), reference=tuple(ref), losses=tuple(holder["losses"]),
                     path=ranks[0]["path"], grad_rel_diff=diff, return_outputs=bool(return_outputs))


def _worker_error(text: str) -> str:
    """The workers' own exceptions (torchrun's summary at the end of stderr says only 'exit 1')."""
    import re
    errs = []
    for line in text.splitlines():
        m = re.match(r"\[rank(\d+)\]: ([\w.]*(?:Error|Exception)\b.*)", line)
        if m and "Connection closed by peer" not in m.group(2):
            errs.append(f"rank {m.group(1)}: {m.group(2)}")
    return "\n".join(dict.fromkeys(errs)) if errs else "\n".join(text.strip().splitlines()[-15:])


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    worker(sys.argv[1])
