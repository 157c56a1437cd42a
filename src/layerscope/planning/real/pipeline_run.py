"""One pipeline run under torchrun, below the launcher: what every rank does (its stages trained
under torch.distributed.pipelining's schedule, its times and peak memory measured) and the same
training in one process to compare with. The launcher (``layerscope.torchrun``) builds the model and
plan from the spec and hands them here through a ``Setup`` factory and the PartitionOptions."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, NamedTuple

import torch

from ...errors import InputError
from ...options import optimizer_factory
from ..config import PartitionOptions, schedule_of
from ..split.stage_memory import rank_memory
from ..steptime.rank_timing import Busy, corun_slowdown
from ..split.runnable import flat_inputs, main_tensor, pipeline_stage

__all__ = ["Setup", "pipeline_loss", "reference_run", "run_rank"]


class Setup(NamedTuple):
    """What every rank and the single-process reference build alike: the model (same seed), the
    whole batch, one micro-batch of it, the plan and the whole batch's target."""

    model: torch.nn.Module
    args: tuple
    kwargs: dict
    mb_args: tuple
    mb_kwargs: dict
    plan: Any                 # the plan of the split (split/plan.py PlanResult's fields: the StagePlan users see)
    target: torch.Tensor


def pipeline_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # the mean squared error, written out: F.mse_loss's scalar result shares the storage of an
    # output-sized buffer (torch 2.13, CPU), so every loss the schedule keeps until the step ends
    # would hold a copy of the stage's output alive
    return (out.float() - target.float()).pow(2).mean()


def reference_run(setup: Setup, options: PartitionOptions):
    """Single-process training with the same micro-batches, loss and optimizer (gradient
    accumulation): (losses per step, {parameter name: gradient of the first step}, plan). Tied
    parameters appear under every name. The first step's gradients are of the same weights on every
    side; later steps' weights differ by the rounding of the earlier steps."""
    from ...capture.spec import StepSpec, StepWatch
    from ...capture.step import run_steps

    model, args, kwargs, _, _, plan, target = setup
    tensors, rebuild = flat_inputs(args, kwargs)
    m = options.microbatches
    micro = tuple(rebuild(c) for c in zip(*[t.tensor_split(m) for t in tensors]))
    targets = target.tensor_split(m)
    # each pass's loss as it ran (its ``item()``), the micro-batches of a step in turn
    seen: list[float] = []
    grads: dict = {}

    def loss_fn(out) -> torch.Tensor:
        loss = pipeline_loss(main_tensor(out), targets[len(seen) % m])
        seen.append(loss.item())
        return loss / m

    def on_grads(step: int) -> None:
        if step == 0:
            grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)
                          if p.grad is not None})

    spec = StepSpec(model, *micro[0], loss_fn=loss_fn, steps=options.steps, accumulation=m, simulate=False,
                    device=target.device, micro_inputs=micro,
                    optimizer=lambda params: optimizer_factory(options.optimizer)([p for p in params if p.requires_grad]))
    run_steps(spec, StepWatch(on_grads=on_grads))
    losses = []
    for step in range(options.steps):
        total = 0.0
        for x in seen[step * m:(step + 1) * m]:
            total += x
        losses.append(total / m)
    return losses, grads, plan


def run_rank(setup: Callable[[], Setup], options: PartitionOptions, out_dir: str) -> None:
    """What one rank of a torchrun run does: ``setup()`` (the model, inputs and plan every rank
    builds alike), its stages trained ``options.steps`` steps under the schedule, its step times,
    busy seconds and peak memory measured, written to ``out_dir``/rank<R>.json (and its first
    step's gradients to grads<R>.pt with ``options.compare_grads``)."""
    import torch.distributed as dist

    from ...capture.measure import state_bytes

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and torch.device(options.device or "cpu").type == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        model, args, kwargs, mb_args, mb_kwargs, plan, target = setup()
        mine = _my_stages(plan, rank, world)
        # ranks on one machine's CPU slow each other down when they compute at once: measured here,
        # before the stages exist (they hook the model) and the steps, for the prediction (GPUs:
        # one per rank, nothing shared)
        corun, alone_s = corun_slowdown(model, mb_args, mb_kwargs, rank, world) if device.type == "cpu" and world > 1 \
            else (1.0, None)
        stages, sync, path = pipeline_stage(plan, model, rank, mb_args, mb_kwargs, device=device,
                                            path=options.path, all_local=True)
        busy, opt, sched = _schedule(stages, options)
        tensors, _ = flat_inputs(args, kwargs)
        tensors = [t.to(device) for t in tensors]
        target = target.to(device)
        first, last = 0 in mine, plan.num_stages - 1 in mine
        keep = bool(options.return_outputs)
        rec = _Record(mine)

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
            rec.times.append(time.perf_counter() - t0)
            rec.blocks.append(busy.blocks)
            rec.busy_s.append(busy.seconds - b0)
            for i in mine:
                rec.busy_stage[i].append(busy.per_stage[i] - s0[i])
            if mb_losses:
                rec.losses.append(sum(x.item() for x in mb_losses) / len(mb_losses))

        steps = options.steps
        # live tensor bytes of this rank from here on: what exists before the step and that the
        # plan counts (the stages' parameters and buffers; the batch handed to step() on the first
        # stage's rank, the targets on the last's) plus every allocation from the first step on
        # (optimizer state, the schedule's receive buffers, gradients, activations, kept outputs);
        # the peak is taken in the last step (steady state)
        held = [t for st in stages for t in (*st.submod.parameters(), *st.submod.buffers())]
        before = state_bytes(held + (list(tensors) if first else []) + ([target] if last else []))

        first_grads: dict = {}
        all_steps = _all_steps(one_step, steps, stages, first_grads if options.compare_grads else None)
        peak, step_peaks = _measure(all_steps, one_step, rec, before, steps, device)
        own, predicted = _predicted(plan, mine, sched, rank, options.microbatches)
        out = {"rank": rank, "stages": mine, "path": path, "times": rec.times, "busy": rec.busy_s,
               "steady": device.type == "cpu",      # the times are of steps after the measured ones
               "busy_per_stage": {str(k): v for k, v in rec.busy_stage.items()}, "losses": rec.losses,
               "blocks": rec.blocks, "corun": corun, "alone_s": alone_s,
               "peak_bytes": peak, "step_peaks": step_peaks, "before_bytes": before,
               "predicted_bytes": int(predicted), "predicted_parts": own,
               "inputs": [list(t.shape) for t in tensors] if first else [],
               "params": sum(p.numel() for st in stages for p in st.submod.parameters())}
        _write(out_dir, rank, out, first_grads if options.compare_grads else None)
    finally:
        dist.destroy_process_group()


class _Record:
    """What a rank's steps record: each step's seconds, busy seconds (all, per stage), busy blocks
    and mean micro-batch loss."""

    def __init__(self, mine: list[int]):
        self.times: list = []
        self.losses: list = []
        self.busy_s: list = []
        self.blocks: list = []
        self.busy_stage: dict[int, list] = {i: [] for i in mine}


def _my_stages(plan, rank: int, world: int) -> list[int]:
    """This rank's stage indices; a plan for another world size -> InputError."""
    ranks = max(s.rank for s in plan.stages) + 1
    if ranks != world:
        raise InputError(f"the plan puts its {plan.num_stages} stages on {ranks} ranks, not {world}")
    return [s.index for s in plan.stages if s.rank == rank]


def _schedule(stages: list, options: PartitionOptions):
    """(the busy-time recorder, the optimizer, torch's schedule) over this rank's stages."""
    busy = Busy(stages)
    params = [p for st in stages for p in st.submod.parameters() if p.requires_grad]
    opt = optimizer_factory(options.optimizer)(params)
    loss_fn = busy.loss(pipeline_loss)
    kind = schedule_of(options.schedule)
    # a runtime schedule takes the rank's stages, the others its one stage
    sched = kind.torch_schedule()(stages if kind.multi else stages[0], n_microbatches=options.microbatches,
                                  loss_fn=loss_fn)
    return busy, opt, sched


def _all_steps(one_step: Callable, steps: int, stages: list, first_grads: dict | None) -> Callable:
    """The measured run: ``steps`` steps, ``on_step(i, "begin"/"end")`` around each; the first
    step's gradients copied into ``first_grads`` (unless None) outside the step."""
    def all_steps(on_step):
        for i in range(steps):
            on_step(i, "begin")
            one_step()
            on_step(i, "end")
            if i == 0 and first_grads is not None:   # outside the measured step: not in its peak
                for st in stages:
                    for n, p in st.submod.named_parameters():
                        if p.grad is not None:
                            first_grads[_model_name(n)] = p.grad.detach().cpu().clone()
    return all_steps


def _write(out_dir: str, rank: int, out: dict, first_grads: dict | None) -> None:
    """rank<R>.json, and grads<R>.pt unless ``first_grads`` is None."""
    if first_grads is not None:
        torch.save(first_grads, os.path.join(out_dir, f"grads{rank}.pt"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def _measure(all_steps: Callable, one_step: Callable, rec: _Record, before: int, steps: int,
             device: torch.device):
    """(the last step's peak bytes, each step's) of ``all_steps``; on CPU the times recorded are
    of ``steps`` more steps run after the measured ones."""
    from ...capture.measure import measure_cpu

    if device.type == "cpu":
        measured = measure_cpu(all_steps, before, steps)
        peak, step_peaks = measured.step_peaks[-1], list(measured.step_peaks)
        # the times: the profiler above records every allocation, and its growing buffers slow
        # the later steps down (1F1B on GPT-2: 430 ms steps became 830 ms by the fifth), so
        # ``steps`` more steps are timed without it (all in steady state: after the first)
        n_losses = len(rec.losses)
        rec.times.clear()
        rec.busy_s.clear()
        rec.blocks.clear()
        for i in rec.busy_stage:
            rec.busy_stage[i].clear()
        for _ in range(steps):
            one_step()
        del rec.losses[n_losses:]
        return peak, step_peaks
    step_peaks = []

    def on_step(i, when):
        torch.cuda.synchronize(device)
        if when == "begin":
            torch.cuda.reset_peak_memory_stats(device)
        else:
            step_peaks.append(torch.cuda.max_memory_allocated(device))
    all_steps(on_step)
    return step_peaks[-1], step_peaks


def _predicted(plan, mine: list[int], sched, rank: int, microbatches: int):
    """(this rank's stages' planned memory, the rank's predicted bytes)."""
    own = [plan.stages[s].memory for s in mine]
    if len(mine) == 1:
        return own, own[0]["total"]
    # several stages: their memory over the order this rank's schedule runs them in
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    order = [(a.stage_index, kinds[a.computation_type.name]) for a in sched.pipeline_order[rank]
             if a is not None and a.computation_type.name in kinds]
    return own, rank_memory(plan.units, [plan.stages[s] for s in mine], plan.num_stages, order, microbatches)


def _model_name(name: str) -> str:
    """A stage parameter's name in the model: both paths wrap the model as ``model``."""
    return name[len("model."):] if name.startswith("model.") else name
