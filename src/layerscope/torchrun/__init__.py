"""Run a StagePlan as a real pipeline: torchrun, one process per rank, gloo on CPU (NCCL on GPU).

``launch()`` (the CLI's ``split --run``) writes the run's options to a JSON file and starts
``torchrun --nproc_per_node P -m layerscope.torchrun FILE``. Every rank builds the model from
the same spec and seed and computes the same plan (``setup.py``: this package sits above the api and
specs, beside the CLI; ``worker.py`` is a rank's entry point) and hands them to ``pipeline.run.run_rank``, which builds its own stage
(export path when torch.export traces the model, module ownership otherwise), trains ``steps`` steps
with the schedule and writes its measured step time, peak memory (the stage's parameters and
buffers plus the CPU allocator's events from the first step on, peak taken in the last step; CUDA:
max_memory_allocated in the last step) and, on the last rank, the losses.
The launcher trains the same model in one process with the same micro-batches (gradient
accumulation, ``pipeline.run.reference_run``) and compares the losses.

``layerscope.planning.split.runnable.pipeline_stage(plan, model, rank, args, kwargs)`` gives a user the
PipelineStage for their rank, for their own training loop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import torch

from ..errors import InputError
from ..options import entry_options
from ..planning.config import PartitionOptions, schedule_of
from ..planning.split.partition import TIME_COSTS
from ..planning.real.pipeline_run import reference_run
from ..planning.simulate.results import ParallelRunResult
from .parallel import launch_parallel
from ..planning.real.procs import _free_port, _worker_error, run_torchrun
from ..reports.run import RunResult  # public: layerscope.torchrun.RunResult, what launch() returns
from .setup import build_setup
from .worker import worker

__all__ = ["launch", "launch_parallel", "ParallelRunResult", "RunResult", "reference_losses", "worker"]

# what a run takes unless told: four micro-batches of a batch of eight, SGD, on the CPU
_LAUNCH = PartitionOptions(microbatches=4, optimizer="sgd", device="cpu")


def reference_losses(spec: str, options: PartitionOptions):
    """Single-process training with the same micro-batches, loss and optimizer: (losses, plan)."""
    losses, _, plan = reference_run(build_setup(spec, options), options)
    return losses, plan


def _write_cfg(path: str, spec: str, out: str, opts: PartitionOptions) -> None:
    """The run's settings for every rank: the spec, where to write, the options that differ from
    their defaults (dtypes by name)."""
    given = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)
             if getattr(opts, f.name) != f.default}
    if given.get("dtypes"):
        given["dtypes"] = [str(d) for d in given["dtypes"]]
    with open(path, "w") as f:
        json.dump({"spec": spec, "out": out, "options": given}, f)


def _launch_options(options: PartitionOptions | None, keywords: dict) -> PartitionOptions:
    """The run's options from ``options=`` or the launcher's defaults, with the keywords taken in
    (``partition_options``: more of them, as a dict); an unknown keyword is an error."""
    more = keywords.pop("partition_options", None) or {}
    both = sorted(set(more) & {k for k, v in keywords.items() if v is not None})
    if both:
        raise InputError(f"{', '.join(both)} given both as a keyword and in partition_options")
    opts, unknown = entry_options(PartitionOptions, options, {**more, **{k: v for k, v in keywords.items() if v is not None}},
                                  base=_LAUNCH)
    if unknown:
        raise InputError(f"launch() got unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    if opts.optimizer is None:                    # a run trains: SGD unless told
        opts = dataclasses.replace(opts, optimizer="sgd")
    return opts


def launch(spec: str, *, stages: int | None = None, by=None, schedule: str | None = None,
           microbatches: int | None = None, steps: int | None = None, options: PartitionOptions | None = None,
           **kwargs) -> RunResult:
    """Train ``steps`` steps of the split model under torchrun and compare with one process.

    Every rank builds the model from ``spec`` (``overrides``, ``head``, ``model_dtype``) and the
    inputs the command line would (``input_size`` with ``dtypes``, ``input_ids``, else the spec's
    defaults) at ``batch_size``, and plans it with ``partition()`` (``by``, ``schedule``,
    ``microbatches``, ``optimizer``, ``memory_limit``, ``stages_per_rank``, and any other
    PartitionOptions field; ``partition_options``: more of them as a dict, JSON values). Every
    option is a field of ``options`` (a PartitionOptions) or a keyword of the same name, not both;
    without ``options`` a run takes 4 micro-batches, a batch of 8, 3 steps and SGD on the CPU. The
    interleaved and zb schedules put ``stages_per_rank`` stages on each of stages / stages_per_rank
    ranks, zbv two. ``return_outputs`` is passed to ``schedule.step()`` (True is torch's default)
    and to the plan. ``compare_grads``: also compare every parameter's gradient of the first step
    with one process (``RunResult.grad_rel_diff``)."""
    opts = _launch_options(options, {"stages": stages, "by": by, "schedule": schedule,
                                     "microbatches": microbatches, "steps": steps, **kwargs})
    opts, procs = _checked(opts)
    with tempfile.TemporaryDirectory(prefix="layerscope-run-") as tmp:
        cfg_path = os.path.join(tmp, "run.json")
        _write_cfg(cfg_path, spec, tmp, opts)     # refuses what JSON cannot carry (the options must be JSON)
        ref, ref_grads, plan = _reference(spec, opts, procs)
        if plan.num_stages > 1 and opts.cuts is None:
            by = "flops" if opts.by in TIME_COSTS else opts.by     # nothing to time
            _write_cfg(cfg_path, spec, tmp, dataclasses.replace(opts, cuts=list(plan.split_points), by=by))
        ranks = _run_ranks(cfg_path, tmp, opts, procs)
        diff = _grad_diff(tmp, procs, ref_grads) if opts.compare_grads else None
    holder = next(r for r in ranks if plan.num_stages - 1 in r["stages"])    # zbv: rank 0
    return RunResult(plan=plan, ranks=tuple(ranks), reference=tuple(ref), losses=tuple(holder["losses"]),
                     path=ranks[0]["path"], grad_rel_diff=diff, return_outputs=bool(opts.return_outputs))


def _checked(opts: PartitionOptions) -> tuple[PartitionOptions, int]:
    """(the options, with module-ownership stages where the schedule needs them, the number of
    ranks); what torch's runtime schedules cannot run -> InputError."""
    kind, stages, microbatches = schedule_of(opts.schedule), opts.stages, opts.microbatches
    if not isinstance(stages, int) or stages < 1:
        raise InputError(f"stages must be a positive integer, got {stages!r}")
    procs = stages
    if kind.multi:
        if kind.fixed_per_rank is None:
            kind.check_stages(stages, opts.stages_per_rank, flag="--stages", of="it")
        # the plan checks a fixed placement and torch's rules (partition() runs first, below)
        procs = kind.ranks(stages, opts.stages_per_rank)
    if kind.rounds:
        rounds = max(1, microbatches // procs)
        if microbatches % rounds:
            # torch's runtime schedules (ScheduleInterleaved1F1B, ...) run the micro-batches in rounds of pp_size
            raise InputError(f"torch's {kind.label} needs the micro-batches ({microbatches}) to be a "
                             f"multiple of its rounds ({rounds} = max(1, micro-batches // {procs} ranks))")
    if not kind.export_stages:
        # torch's traced stages (pipeline(), build_stage) under ScheduleZBVZeroBubble's V placement
        # failed to connect here (gloo: "Pair is not connected", torch 2.13); ownership stages run
        if opts.path == "export":
            raise InputError(f"--schedule {kind.name} runs with module-ownership stages: torch.export stages "
                             "fail to connect under its V placement (torch 2.13, gloo)")
        opts = dataclasses.replace(opts, path="ownership")
    if microbatches > opts.batch_size:
        raise InputError(f"{microbatches} micro-batches need a batch of at least {microbatches} "
                         f"(--batch-size {opts.batch_size})")
    return opts, procs


def _reference(spec: str, opts: PartitionOptions, procs: int):
    """The single process's (losses, first gradients, plan), run first: it plans exactly as every
    rank will, so a plan that cannot be made (a memory limit no split fits, inputs the model
    refuses) fails here, in one line. It runs with the threads each rank will have, so that times
    measured for the plan (by="latency") are those of the run; the ranks then take this plan's
    cuts, not their own measurements (which differ from rank to rank)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // procs))
    try:
        return reference_run(build_setup(spec, opts), opts)
    finally:
        torch.set_num_threads(threads)


def _run_ranks(cfg_path: str, tmp: str, opts: PartitionOptions, procs: int) -> list[dict]:
    """torchrun's ``procs`` ranks on ``cfg_path``: what each wrote; a failed run -> InputError."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
           "--master_port", str(_free_port()), "-m", "layerscope.torchrun", cfg_path]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // procs)))
    try:
        proc = run_torchrun(cmd, opts.timeout, env)
    except subprocess.TimeoutExpired:
        raise InputError(f"the pipeline run did not finish in {opts.timeout:g} s") from None
    if proc.returncode != 0:
        raise InputError(f"the pipeline run failed (torchrun exit {proc.returncode}):\n"
                         + _worker_error(proc.stderr or proc.stdout or ""))
    ranks = []
    for r in range(procs):
        with open(os.path.join(tmp, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def _grad_diff(tmp: str, procs: int, ref_grads: dict) -> float:
    """The largest relative difference of the ranks' first gradients from one process's; a
    gradient the model lacks, or one no rank returned -> InputError."""
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
    return diff
