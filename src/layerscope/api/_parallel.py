"""parallel(): the per-rank memory of a sharded-training configuration (FSDP2, HSDP, tensor parallel,
checkpointing, mixed precision), simulated with torch's own distributed code on a fake process group
(planning/simulate/sharded_rank.py)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn

from ..capture.attention import resolve_gpu, router_for
from ..capture.loss import choose_loss, given_note
from ..capture.notes import Note
from ..capture.prepare import check_model, example_inputs, materialize_lazy
from ..capture.inputs import iter_tensors
from ..errors import InputError
from ..formats.exported import refuse_exported
from ..options import MemoryOptions, ParallelOptions, check_loss, echo, entry_options, optimizer_factory
from ..planning.config import ParallelConfig
from ..planning.simulate.results import ESTIMATES, ParallelPlan, RankMemory, mesh_coords
from ..planning.apply import checkpoint_blocks
from ..planning.tensor_parallel import tp_plan_label
from ..planning.expert_parallel import ep_notes
from ..planning.blocks import no_kv_cache
from ..planning.simulate.sharded_rank import meta_copy
from ..planning.simulate.uniform_stages import model_name
from ..planning.steptime.sharded_time import fractions, step_time
from ..planning.simulate.world import WorldRun, global_tokens, plan_of, simulate_world
from ._search import search_report
from ..options import parse_bytes
from ..reports.memory import MemoryReport
from ..reports.parallel import ParallelReport
from ..analyses.memory_step import memory_step

__all__ = ["parallel"]



def _local_batch(args: tuple, kwargs: dict) -> int | None:
    first = next(iter(iter_tensors((args, kwargs))), None)
    return int(first.shape[0]) if first is not None and first.dim() else None


# the run options the body reads by name (those the signature does not name): derived from ParallelOptions
_RUN_OPTIONS = tuple(f.name for f in dataclasses.fields(ParallelOptions)
                     if f.name not in ("optimizer", "gpu", "memory_limit", "config"))
_BACKENDS = {"cuda": ("nccl", "fake"), "cpu": ("gloo", "fake")}


def parallel(model: nn.Module, *args: Any, gpus: int = 1, fsdp: int | None = None, tp: int | None = None,
             pp: int | None = None, ac: str | None = None, optimizer="adamw", config: ParallelConfig | None = None,
             options: ParallelOptions | None = None, forward_kwargs: dict | None = None,
             **kwargs: Any) -> ParallelReport:
    """What each of ``gpus`` ranks holds when they train ``model`` sharded: its peak, when, and by part
    (parameter shards, gathered parameters, gradients, optimizer state, activations, recompute,
    communication buffers, temporaries, and estimates of what a CPU cannot show), and the bytes of
    each collective. ``args``/``kwargs``: one data-parallel rank's local batch (``input_ids`` of
    [B, S] is B samples per rank and step).

    The configuration: ``config=ParallelConfig(...)``, or its fields as keywords: ``fsdp`` (default:
    the ranks the other degrees leave), ``replicate`` (HSDP), ``tp``, ``pp``, ``ac``,
    ``mixed_precision`` ("bf16", the default: fp32 master weights and optimizer state, bf16 compute,
    gradients reduced in ``reduce_dtype``; "off": all in ``model_dtype``), ``reshard_after_forward``,
    ``accumulation``, ``global_batch``, ``gpus_per_node``; with ``pp`` > 1, ``schedule`` ("gpipe" or
    "1f1b") and ``microbatches`` (default ``pp``): each pipeline stage (the uniform split of the
    model's blocks, planning/simulate/pipeline_rank.py) is simulated on its first rank, its micro-batches in the
    schedule's order, as torch's PipelineStage runs them. The run: ``steps`` (2), ``loss`` (as
    memory()'s: "auto", the default, is a language model's own loss, its forward given labels (a copy
    of the token ids) where it takes them; with ``pp`` > 1 the last stage takes the same fp32 next-token
    cross-entropy of each micro-batch's logits; the notes say which), ``loss_fn`` (instead of ``loss``:
    ``loss_fn(output)``; with ``pp`` > 1 the output of one micro-batch), ``target`` (a tensor of the
    local batch: then ``loss_fn(output, target)``, split into micro-batches with the inputs as torch's
    schedule splits it), ``input_size``/``dtypes`` (example inputs built as analyze() does), ``device`` (the ranks' device:
    "cuda", the default, rounds to 512-byte allocator blocks, holds cuBLAS's two workspaces and adds
    the estimate of NCCL's buffers; "cpu": gloo ranks, as on this machine), ``backend`` (default nccl
    for cuda, gloo for cpu: gloo's all-gathers copy through a flat buffer of their own; "fake": no
    backend buffers, to compare with a real step on torch's fake backend), ``progress``. ``gpu`` names the GPU
    (its memory is the limit unless ``memory_limit`` is given). Other keywords go to the forward (a
    forward argument named like an option: ``forward_kwargs={...}``). Every rank lets go of the model's
    output once the loss is computed, as torchtitan's train step does. With every degree 1 nothing is
    wrapped, and the figures are ``memory(..., keep_output=False)``'s for the same model, dtypes and
    options.

    On CUDA ranks the plan also has the predicted step time, tokens/s per GPU and MFU (planning/steptime/sharded_time.py;
    ``fractions={"matmul": 0.6, ...}`` replaces the model's achievable fractions). ``search=True`` searches
    the fastest configuration that fits instead (planning/search/space.py): the degrees and options given as
    keywords are held, ``global_batch`` (default: the input's batch x ``gpus``) is what every candidate
    trains per step, ``search_limit`` (default 40; None: no limit) is the simulation work after which it
    simulates no new candidate, in passes of a micro-batch through a pipeline stage (a candidate without a
    pipeline takes 1, 2 with accumulation; a pipeline, stages x micro-batches; a copy made for the lower
    bounds, 1): nothing it decides depends on the machine's speed; ``jobs`` (default: the cores this process
    may use) worker processes simulate candidates at once, the answer the same whatever their number
    (planning/search/pool.py; 1: none). The report shows the chosen plan, says whether it is proven best, and has every
    candidate in ``report.search``.

    Every run option (all but the configuration's degrees) can also come as one object:
    ``options=ParallelOptions(...)`` (``config``: a ParallelConfig, or with ``search=True`` a dict of
    the fields held fixed, ``gpus`` among them); an option given both there and as a keyword is an
    InputError, as for memory().
    """
    conf, kwargs = _configure(gpus, {"fsdp": fsdp, "tp": tp, "pp": pp, "ac": ac}, optimizer, config, options,
                              forward_kwargs, kwargs)
    opts, run = conf.opts, {k: getattr(conf.opts, k) for k in _RUN_OPTIONS}
    fracs = fractions(run["fractions"])
    loss, loss_fn, backend = _checked_run(model, run, conf.config, opts.gpu)
    args = example_inputs(args, kwargs, run["input_size"], run["dtypes"], None, torch.device("meta"), "parallel")
    materialize_lazy(model, args, kwargs)
    local = _local_batch(args, kwargs)
    step_loss = _step_loss(model, args, kwargs, loss_fn, loss, run["loss_fn"])
    config = conf.config
    if config is not None and local is not None and config.local_batch is None:
        config = dataclasses.replace(config, local_batch=local)
    ranks = _ranks_of(opts, run["device"] == "cuda", backend, fracs)
    if run["search"]:
        return _searched(model, args, kwargs, conf, ranks, run, step_loss)
    plan, notes = _planned(model, args, kwargs, config, ranks, run, step_loss, opts.gpu)
    if ranks.limit is not None:
        over = max(0, plan.peak_bytes - ranks.limit)
        plan = dataclasses.replace(plan, limit_bytes=ranks.limit, fits=over == 0, over_bytes=over)
    # ep and its routing echoed where ep > 1 only (a report without experts keeps its JSON as it was)
    moe = config is not None and config.ep > 1
    echoed = {**ranks.echo, **({"ep": config.ep, "routing": config.routing} if moe else {})}
    return ParallelReport(model_name=type(model).__name__, options=echoed, plans=(plan,), notes=tuple(notes))


@dataclasses.dataclass(frozen=True)
class _Configured:
    """parallel()'s call resolved: its options, the configuration (None for a search) and, for a search,
    the ranks and the configuration's fields held fixed (``held``: the degrees named in the signature)."""
    opts: ParallelOptions
    config: ParallelConfig | None
    gpus: int
    held: dict
    given: dict


def _configure(gpus: int, degrees: dict, optimizer, config, options, forward_kwargs, kwargs: dict):
    """The options and the configuration from ``config=``, ``options=`` or the keywords (its fields popped
    from ``kwargs``), and the forward's keywords left."""
    fields = {f.name for f in dataclasses.fields(ParallelConfig)} - {"local_batch"}
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in fields}
    # the signature's optimizer default is the field's: a keyword counts as given only where it differs
    # (gpu=, memory_limit= and every other run option: keywords taken by entry_options from ParallelOptions' fields)
    named = {"config": config,
             **({} if isinstance(optimizer, str) and optimizer == "adamw" else {"optimizer": optimizer})}
    opts, kwargs = entry_options(ParallelOptions, options, kwargs, forward_kwargs, **named)
    if optimizer is None and options is None:     # None: no optimizer step (entry_options reads None as not given)
        opts = dataclasses.replace(opts, optimizer=None)
    config = opts.config
    if isinstance(config, dict):                  # options= for a search: the configuration's fields held fixed
        held_given = dict(config)
        gpus, config = held_given.pop("gpus", gpus), None
        given = {**held_given, **given}
    held = {k: v for k, v in degrees.items() if v is not None}
    if opts.search:
        if config is not None:
            raise InputError("search=True searches the configuration: give the degrees to hold fixed as keywords "
                             "(tp=, pp=, ac=, ...), not config=")
    elif config is None:
        config = ParallelConfig(gpus=gpus, **{"tp": 1, "pp": 1, "ac": "none", **held}, **given)
    elif given or gpus != 1 or held:
        raise InputError("give the configuration either as config= or as keywords, not both")
    return _Configured(opts, config, gpus, held, given), kwargs


def _checked_run(model: nn.Module, run: dict, config: ParallelConfig | None, gpu):
    """The loss, the loss_fn (with ``target=`` bound where there is no pipeline) and the backend, once the
    loss options, the model, the device and the backend are checked (in that order: the first error wins)."""
    loss_fn, device, backend, target = run["loss_fn"], run["device"], run["backend"], run["target"]
    loss = check_loss(run["loss"])
    if loss_fn is not None and loss != "auto":
        raise InputError(f"give loss_fn= or loss= ({loss!r}), not both: a loss_fn is the loss")
    if run["search"] and target is not None:
        raise InputError("target= is a tensor of one local batch, which the search changes: give loss_fn alone")
    if target is not None:
        if loss_fn is None or not isinstance(target, torch.Tensor):
            raise InputError("target= is a tensor of the local batch for a loss_fn(output, target)")
        if config.pp == 1:
            loss_fn = functools.partial(_with_target, loss_fn, target)
    check_model(model)
    refuse_exported(model, "parallel")
    if device not in ("cuda", "cpu"):
        raise InputError(f"device is the ranks' device, cuda or cpu, got {device!r}")
    backend = backend or _BACKENDS.get(device, ("",))[0]
    if backend not in _BACKENDS.get(device, ()):
        raise InputError(f"backend for {device} ranks is {' or '.join(_BACKENDS.get(device, ()))}, got {backend!r}")
    if gpu is not None and device != "cuda":
        raise InputError("gpu= names a CUDA GPU: leave device at 'cuda'")
    return loss, loss_fn, backend


@dataclasses.dataclass(frozen=True)
class _StepLoss:
    """The step's loss: ``given`` (the caller's loss_fn, None: none), ``fn`` (what the ranks call),
    ``loss`` (the loss= option) and ``note`` (what the notes say of it)."""
    given: Any
    fn: Any
    loss: str
    note: Any


def _step_loss(model: nn.Module, args: tuple, kwargs: dict, loss_fn, loss: str, caller_fn) -> _StepLoss:
    """The step's loss (capture/loss.py): a language model's own by default; simulate_world gives the
    forward its labels where there is no pipeline."""
    choice = choose_loss(model, args, kwargs, loss) if loss_fn is None else None
    note = choice.describe if choice is not None else lambda: given_note(caller_fn)
    return _StepLoss(loss_fn, loss_fn or choice, loss, note)


@dataclasses.dataclass(frozen=True)
class _Ranks:
    """What the simulated ranks run with, resolved once from the options: the optimizer factory, CUDA or
    not, the backend, the GPU named (None: none), the memory limit, the achievable fractions, a new
    attention router per rank, and the options as the report echoes them."""
    factory: Any
    cuda: bool
    backend: str
    named: Any
    limit: int | None
    fracs: Any
    new_router: Any
    echo: dict


def _ranks_of(opts: ParallelOptions, cuda: bool, backend: str, fracs) -> _Ranks:
    factory = optimizer_factory(opts.optimizer)
    named = resolve_gpu(opts.gpu) if opts.gpu is not None else None

    def new_router():      # one per simulated rank: each counts its own SDPA calls
        # the ranks run on fake CPU tensors here, also where CUDA is at hand: CUDA ranks are always routed
        return router_for(named or resolve_gpu(None) if cuda else None, "auto", simulated=True, cuda_target=cuda,
                          autocast_device="cpu")
    limit = (parse_bytes(opts.memory_limit) if opts.memory_limit is not None
             else (named.memory if named is not None else None))
    echoed = {**echo(opts, backend=backend, gpu=named.name if named is not None else None, optimizer=factory),
              "allocation_block": 512 if cuda else 1}
    return _Ranks(factory, cuda, backend, named, limit, fracs, new_router, echoed)


def _searched(model: nn.Module, args: tuple, kwargs: dict, conf: _Configured, ranks: _Ranks, run: dict,
              step_loss: _StepLoss):
    """search=True: the fastest configuration that fits (planning/search/space.py), its report."""
    if not ranks.cuda:
        raise InputError("the search ranks configurations by their predicted step time on GPUs: leave device at "
                         "'cuda' and name the GPU (gpu='H100')")
    if ranks.limit is None:
        raise InputError("the search needs the memory a GPU has: name the GPU (gpu='H100') or give memory_limit=")

    world = WorldRun(ranks.factory, run["steps"], step_loss.fn, ranks.cuda, ranks.backend, ranks.new_router)

    def simulate(m, a, k, c):
        return simulate_world(m, a, k, c, world)
    # a candidate without a pipeline: its ranks composed from five blocks, or NotComposable (copies.py)
    composed = dataclasses.replace(world, compose="only", checks={})     # one loop check per input shape
    simulate.composed = lambda m, a, k, c: simulate_world(m, a, k, c, composed)
    # a stand-in simulated for its blocks' figures (copies.py _proxy): rank 0 alone
    first = dataclasses.replace(world, first_only=True)
    simulate.first = lambda m, a, k, c: simulate_world(m, a, k, c, first)
    rep = search_report(model, args, kwargs, gpus=conf.gpus, held={**conf.held, **conf.given},
                        gpu=ranks.named or resolve_gpu(None), limit=ranks.limit, simulate=simulate, fracs=ranks.fracs,
                        options=ranks.echo, run=run)
    rep.add_notes(step_loss.note())
    return rep


def _planned(model: nn.Module, args: tuple, kwargs: dict, config: ParallelConfig, ranks: _Ranks, run: dict,
             step_loss: _StepLoss, gpu):
    """One configuration's plan and notes: memory()'s step where every degree is 1, else the simulated
    world (with its predicted step time on CUDA ranks)."""
    if config.trivial:
        return _one_device(model, args, kwargs, config, ranks.factory, run["steps"], step_loss.given, step_loss.loss,
                           ranks.cuda, gpu)
    world = WorldRun(ranks.factory, run["steps"], step_loss.fn, ranks.cuda, ranks.backend, ranks.new_router,
                     run["progress"], run["target"])
    rank_runs, rr, roles_of, router, runs = simulate_world(model, args, kwargs, config, world)
    plan = plan_of(config, rank_runs)
    notes: list = [step_loss.note()]
    if config.tp > 1:     # which TP plan ran: derived from the config's base_model_tp_plan, or a hand-written one
        notes.append(Note("world-tp-plan", {"plan": tp_plan_label(model, config.ep)}))
    if ranks.cuda:
        plan, more = _timed(plan, runs, config, ranks.named or resolve_gpu(None), global_tokens(args, kwargs, config),
                            ranks.fracs)
        notes += more
    notes += _world_notes(config, plan, rr, roles_of, router, ranks.cuda, gpu)
    return plan, notes


def _world_notes(config: ParallelConfig, plan: ParallelPlan, rr, roles_of, router, cuda: bool, gpu) -> list[Note]:
    """What a simulated world's notes say (records; reports/notes.py words them): the roles simulated,
    what rank 0's simulation made up or knew, how attention was priced, and the estimates beside the peak."""
    notes: list[Note] = []
    if len(roles_of) == 1:
        notes.append(Note("world-one-role", {"world": config.world}))
    else:
        notes.append(Note("world-roles", {"roles": tuple(roles_of), "pp": config.pp, "cp": config.cp}))
    if rr.ring is not None:
        notes.append(Note("world-context-parallel", {"cp": config.cp, "seq": rr.ring.shapes[0][0][2],
                                                     "calls": rr.ring.forward // max(1, len(rr.run.passes))}))
    if rr.run.log is not None:
        log = rr.run.log
        if config.pp > 1:     # a stage's modules sit in its wrapper ("model.", "0.model."): the model's paths
            log = dataclasses.replace(log, events=[(k, w, model_name(p)) for k, w, p in log.events])
        notes += log.records(remedy="--run trains it for real")
    if rr.run.known is not None:
        notes += rr.run.known.notes()
    notes += ep_notes(config)
    if router is not None:
        notes += router.notes(passes=len(rr.run.passes) or 1)
    if cuda and gpu is None:
        notes.append(Note("world-no-gpu-named", {"gpu": router.gpu.name}))
    if cuda:
        notes.append(Note("world-cuda-allocator", {}))
    if config.offload:
        notes.append(Note("world-offload", {"cuda": cuda, "host_bytes": max(r.host_bytes for r in plan.ranks)}))
    late = max(r.breakdown.get(ESTIMATES[1], 0) for r in plan.ranks)
    if late:
        notes.append(Note("world-gloo-late", {"bytes": late}))
    return notes


def _with_target(loss_fn, target, output):
    return loss_fn(output, target)


def _timed(plan: ParallelPlan, runs: dict, config: ParallelConfig, gpu, tokens: int | None, fracs):
    """The plan with its predicted step time (planning/steptime/sharded_time.py), and what the prediction notes."""
    st = step_time(runs, config, gpu, tokens=tokens, f=fracs)
    plan = dataclasses.replace(plan, step_time=st.step_time,
                               tokens_per_s=st.tokens_per_s / config.world if st.tokens_per_s else None,
                               mfu=st.mfu, timing=st.to_dict())
    notes = []
    if st.uncounted_ops:
        notes.append(Note("world-uncounted-ops", {"ops": st.uncounted_ops, "launch_us": st.fractions["launch_s"] * 1e6}))
    return plan, notes


def _one_device(model, args, kwargs, config: ParallelConfig, factory, steps, loss_fn, loss, cuda: bool, gpu):
    """Every degree 1: no wrapping at all; memory()'s step of the model in the configuration's dtypes
    (mixed precision bf16 there is autocast over fp32 weights, as one device trains)."""
    dtype = torch.float32 if config.mixed_precision == "bf16" else config.model_dtype
    copy = meta_copy(model, dtype)
    no_kv_cache(copy)
    checkpoint_blocks(copy, config)
    opts = MemoryOptions(optimizer=factory, autocast_dtype=torch.bfloat16 if config.mixed_precision == "bf16" else None,
                         device="cuda" if cuda else "cpu", steps=steps, accumulation=config.accumulation,
                         loss_fn=loss_fn, loss=loss, gpu=gpu, keep_output=False)
    rep = MemoryReport(**memory_step(copy, args, kwargs, opts))
    step = rep.peak_step
    parts = {"sharded parameters": step.breakdown["parameter"], "gathered parameters": 0,
             "gradients": step.breakdown["gradient"], "optimizer state": step.breakdown["optimizer_state"],
             "activations": step.breakdown["activation"], "recompute": 0, "communication buffers": 0,
             "inputs, outputs and buffers": step.breakdown["input"] + step.breakdown["output"]
             + step.breakdown["buffer"], "workspaces": step.breakdown["workspace"],
             "temporary": step.breakdown["temporary"], **dict.fromkeys(ESTIMATES, 0)}
    r = RankMemory(rank=0, coords=mesh_coords(config, 0), simulated_as=0,
                   peak_bytes=rep.peak_bytes, simulated_peak_bytes=rep.peak_bytes, peak_step=step.step + 1,
                   peak_phase=step.peak_phase, peak_layer=step.peak_layer, breakdown=parts)
    notes = [Note("world-one-device", {"ac": config.ac, "bf16": config.mixed_precision == "bf16"})]
    return plan_of(config, (r,)), notes + list(rep.note_items)
