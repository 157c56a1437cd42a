"""``partition()``: a model split into pipeline stages (moved here verbatim from the old api.py; the
planning slice rewrites its signature)."""

from __future__ import annotations

from typing import Any

import torch

from ..capture import iter_tensors, model_device
from ..capture.guard import exclusive, gc_paused
from ..capture.notes import Note
from ..capture.prepare import check_model, example_inputs, is_fake_model, micro_batch
from ..errors import InputError
from ..options import MemoryOptions, entry_options
from ..planning.config import LAUNCHER_FIELDS, PartitionOptions
from ..planning.split.units import units_from_memory, with_latencies, with_weight_shares, with_work
from ..reports.summary import Report
from ..analyses.memory_step import memory_step
from ..reports.memory import MemoryReport

__all__ = ["partition"]


@exclusive
def partition(model_or_report, *args: Any, stages: int | None = None, by=None, schedule: str | None = None,
              microbatches: int | None = None, memory_limit=None, optimizer=None,
              options: PartitionOptions | None = None, forward_kwargs: dict | None = None, **kwargs: Any):
    """Split a model into ``stages`` pipeline stages, each fitting ``memory_limit`` (bytes or "16GiB";
    a list gives one limit per stage). Returns a StagePlan.

    The options most calls use are keywords here; every other one (``stages_per_rank``,
    ``batch_dim``, ``input_size``, ``dtypes``, ``autocast_dtype``, ``device``, ``latency_repeats``,
    ``loss_fn``, ``measure_working``, ``objective``, ``roofline``, ``link_bandwidth``,
    ``optimizer_bandwidth``, ``cuts``, ``return_outputs``, ``count_inputs``, ``target_bytes``) is a
    field of ``options`` (a PartitionOptions holding all of them) or a keyword of the same name; an
    option given both ways is an error. Other keywords are the forward's inputs (``forward_kwargs``
    for one named like an option).

    ``objective``: "step_time" — the smallest predicted time of one training step under
    ``schedule``, simulated from each stage's forward and backward time per micro-batch, the sends
    across cuts (``link_bandwidth``, bytes/s) and each rank's optimizer step
    (``optimizer_bandwidth``, bytes/s); the default when the costs are times (``by="latency"`` or
    ``"roofline"``). "bottleneck" — the smallest largest stage cost; the default otherwise.
    "uniform" — equal numbers of the repeated blocks per stage (torchtitan's default split), for
    comparison. ``cuts``: take this split instead (where stages 1 .. K-1 begin: unit indices or
    split point names, as ``plan.split_points`` gives them). With times, the plan states the
    predicted step time, bubble and per-rank busy time and draws the step (``plan.timeline``).

    ``model_or_report``: a model with its example inputs (the whole batch; it is cut into
    ``microbatches`` chunks along ``batch_dim`` as the schedule will), a MemoryReport (of one
    micro-batch) or a Report (costs and parameters only: no activation memory). ``by``: "flops"
    (forward + backward), "macs", "params", "memory", "latency" (forward and backward times measured
    here on the real model), "roofline" (times predicted from each unit's FLOPs and bytes moved under
    ``roofline``: a device name from the built-in table such as "H100", ``(peak_flops,
    peak_bytes_per_s)``, or "measure"/"auto": measured on this machine) or a callable Unit -> cost. ``schedule``: "gpipe", "1f1b", "interleaved" (``stages_per_rank`` stages
    on each rank), "zb" (torch's ScheduleInterleavedZeroBubble, placed as interleaved) or "zbv"
    (ScheduleZBVZeroBubble: two stages per rank in a V). ``optimizer`` (class, factory, instance or name) sets the optimizer state counted
    in each stage's memory; the training step is simulated on fake tensors, so a model on the meta
    device plans without memory. ``loss_fn(output) -> scalar`` (default: the output's ``loss`` or
    its sum, ``memory(loss="sum")``'s, not memory()'s language-model loss) sets the loss's working memory, which the last stage holds.
    ``measure_working`` (default: when the model has real weights and is planned for its own device
    without autocast) runs one real training step of a micro-batch to measure each unit's working
    memory there (kernel scratch buffers that simulation cannot see); a unit's working memory is the
    larger of simulated and measured.

    What the caller of ``schedule.step()`` keeps alive, by default as torch's defaults keep it:
    ``return_outputs=True`` (``step()``'s own default) plans for the last stage keeping every
    micro-batch's output and their concatenation (False: the setting that saves that memory, when
    the loop calls ``step(..., return_outputs=False)``); ``count_inputs`` (default: when a model and
    its inputs are given) counts the whole batch's inputs on the first stage; ``target_bytes`` the
    whole batch's targets on the last.
    """
    opts, kwargs = entry_options(PartitionOptions, options, kwargs, forward_kwargs, keep=LAUNCHER_FIELDS,
                                 stages=stages, by=by, schedule=schedule, microbatches=microbatches,
                                 memory_limit=memory_limit, optimizer=optimizer)
    from ..reports.memory import MemoryReport
    from ..reports.plan_build import build_plan

    notes: list[Note] = []
    recorded = {"optimizer": None, "autocast": None}
    if not isinstance(opts.microbatches, int) or opts.microbatches < 1:      # before micro_batch() divides by it
        raise InputError(f"microbatches must be a positive integer, got {opts.microbatches!r}")
    # the collector paused for the whole call, not only the step's runs: its passes over the heap the
    # simulation leaves (records, fake tensors) cost 0.5 s of CPU on the 1,000-block MLP, an eighth of
    # the call, in the units and the plan built after the runs (capture/guard.py: single-threaded only)
    with gc_paused():
        if isinstance(model_or_report, (Report, MemoryReport)):
            units = _units_of_report(model_or_report, notes, recorded)
        else:
            units, args, kwargs = _units_of_model(model_or_report, args, kwargs, opts, notes, recorded)
        units = _with_kept(units, opts, isinstance(model_or_report, (Report, MemoryReport)), args, kwargs,
                           recorded)
        if opts.by == "roofline":
            units = _roofline_units(units, opts, notes, recorded)
        return build_plan(units, opts, notes=notes, recorded=recorded)


def _units_of_report(rep, notes: list, recorded: dict):
    """The units of a Report (costs and parameters only) or of a MemoryReport (one micro-batch's step)."""
    from ..planning.split.units import split_units

    if isinstance(rep, Report):
        units = split_units(rep.trace, model=rep._model() if rep._model else None)
        notes.append(Note("partition-from-report", {}))
        return units
    units = units_from_memory(rep, rep._model() if rep._model else None)
    recorded.update(optimizer=rep.options.get("optimizer"), autocast=rep.options.get("autocast"))
    return units


def _units_of_model(model_or_report, args: tuple, kwargs: dict, o: PartitionOptions, notes: list, recorded: dict):
    """The units of a model and its inputs: one simulated step of a micro-batch, with the working memory
    measured by a real step and the times measured (``by="latency"``) where asked. Returns the units and
    the example inputs."""
    from ..formats.exported import refuse_exported
    refuse_exported(model_or_report, "partition")   # issue 22
    model = check_model(model_or_report)
    args = example_inputs(args, kwargs, o.input_size, o.dtypes, None, model_device(model), "partition")
    mb_args, mb_kwargs, mb = micro_batch(args, kwargs, o.microbatches, o.batch_dim)
    # one simulated step: the units take the last pass's trace, per-layer memory and the
    # optimizer's state, which its first step() creates; a second step only adds that state as a
    # constant under every live-bytes difference the units keep (checked equal, tests/pipeline)
    # the loss: loss_fn, else the sum of the output, as the units' timings and `split --run`'s stages
    # take it (memory()'s default, a language model's own loss, is not planned per stage yet)
    # memory()'s step below the entry point (no entry point calls another; partition holds the model
    # exclusively, as memory() would)
    rep = MemoryReport(**memory_step(model, tuple(mb_args), dict(mb_kwargs), MemoryOptions(
        optimizer=o.optimizer, autocast_dtype=o.autocast_dtype, device=o.device, steps=1, batch_dim=o.batch_dim,
        loss_fn=o.loss_fn, loss="auto" if o.loss_fn else "sum")))
    no_data = model_device(model).type == "meta" or is_fake_model(model)
    if o.by == "latency" and no_data:
        raise InputError("by='latency' times the units on the real model; this one has no data "
                         "(meta or fake tensors)")
    units = units_from_memory(rep, model, micro=mb)
    if o.measure_working and no_data:
        raise InputError("measure_working=True runs a real step; this model has no data (meta or "
                         "fake tensors)")
    # the real step runs as the model is: not for another device or under autocast
    here = (o.device is None or torch.device(o.device).type == model_device(model).type) and \
        o.autocast_dtype is None
    if o.measure_working and not here:
        raise InputError("measure_working=True measures on the model's own device without "
                         "autocast; leave device= and autocast_dtype= unset for it")
    if o.measure_working or (o.measure_working is None and not no_data and here
                             and rep.totals.get("gradient_bytes")):
        from ..planning.steptime.unit_timing import unit_work_bytes
        with gc_paused():
            work = unit_work_bytes(model, units, mb_args, mb_kwargs, loss_fn=o.loss_fn)
        units = with_work(units, work)
        notes.append(Note("partition-working-measured", {"device": str(model_device(model))}))
    if o.by == "latency":
        units = _timed_units(model, units, (mb_args, mb_kwargs), o, notes)
    recorded.update(optimizer=rep.options.get("optimizer"), autocast=rep.options.get("autocast"),
                    device=rep.options.get("device"))
    return units, args, kwargs


def _timed_units(model, units, micro: tuple, o: PartitionOptions, notes: list):
    """The units with their measured forward and backward times (and, for a zero-bubble schedule, each
    backward's weight-gradient share)."""
    from ..planning.steptime.schedule import ZERO_BUBBLE
    from ..planning.steptime.unit_timing import unit_latencies, unit_weight_shares

    mb_args, mb_kwargs = micro
    with gc_paused():
        lat = unit_latencies(model, units, mb_args, mb_kwargs, repeats=o.latency_repeats, loss_fn=o.loss_fn)
    units = with_latencies(units, lat)
    if o.schedule in ZERO_BUBBLE:
        with gc_paused():
            shares = unit_weight_shares(model, units, mb_args, mb_kwargs, repeats=o.latency_repeats,
                                        loss_fn=o.loss_fn)
        units = with_weight_shares(units, shares)
        notes.append(Note("partition-weight-shares", {}))
    return units


def _with_kept(units, o: PartitionOptions, from_report: bool, args: tuple, kwargs: dict, recorded: dict):
    """The units with what the caller of ``schedule.step()`` keeps alive: the outputs returned, the
    whole batch's inputs (``count_inputs``) and targets."""
    count_inputs = o.count_inputs
    if count_inputs and from_report:
        raise InputError("count_inputs=True counts the whole batch's inputs: pass the model and its inputs")
    if count_inputs is None:
        count_inputs = not from_report
    if o.return_outputs or count_inputs or o.target_bytes:
        import dataclasses
        seen: dict[int, int] = {}
        if count_inputs:
            for t in iter_tensors((args, kwargs)):
                seen[id(t)] = t.numel() * t.element_size()
        units = dataclasses.replace(units, kept_outputs=bool(o.return_outputs),
                                    input_batch_bytes=sum(seen.values()), target_bytes=int(o.target_bytes))
        recorded.update(return_outputs=bool(o.return_outputs))
    return units


def _roofline_units(units, o: PartitionOptions, notes: list, recorded: dict):
    """``by="roofline"``: the units with times predicted from their FLOPs and bytes under the roofline."""
    from ..analyses.roofline import roofline_for
    from ..planning.split.units import roofline_times
    where = torch.device(recorded.get("device") or "cpu")
    if o.roofline is None and where.type == "cuda" and not torch.cuda.is_available():
        raise InputError("by='roofline' for a GPU that is not here needs its peaks: roofline='H100' (or "
                         "another name of the built-in table) or (peak_flops, peak_bytes_per_s)")
    roof = roofline_for(o.roofline or "auto", where, _plan_dtype(units))
    units = with_latencies(units, roofline_times(units, roof))
    notes.append(Note("partition-roofline", {"name": roof.name, "peak_flops": roof.peak_flops,
                                             "peak_bandwidth": roof.peak_bandwidth, "source": roof.source}))
    recorded["roofline"] = roof.to_dict()
    return units


def _plan_dtype(units) -> torch.dtype:
    """The floating dtype most of the units' parameters are in (for a roofline's peak)."""
    by = {}
    for u in units.units:
        if u.params:
            by[u.param_bytes // u.params] = by.get(u.param_bytes // u.params, 0) + u.params
    size = max(by, key=by.get) if by else 4
    return {2: torch.bfloat16, 8: torch.float64}.get(size, torch.float32)
