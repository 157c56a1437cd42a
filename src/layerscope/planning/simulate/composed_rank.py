"""One rank of a sharded step (FSDP2, HSDP, DTensor TP, EP, CP; no pipeline) composed from five of its
blocks, as memory() composes a single device's step (capture/compose.py, capture/composed.py): the rank's
model runs the first three blocks of its run of identical ones and the last two, and each pass, and the
optimizer's step, is widened to the whole model's. A 70B rank costs five blocks instead of 80.

What must happen before ``fully_shard`` and what after. FSDP2, DTensor's ``parallelize_module`` and the
checkpoint wrapper change the blocks: each gets hooks, a class of its own (``FSDP<Block>``), DTensor
parameters and, checkpointed, a wrapper in the list. So:
- before them, on the rank's meta copy: which blocks are identical (capture/blocks.py ``find_run``: it
  refuses modules with hooks, and compares plain parameters), and the check of the loop around them
  (capture/composed.py: the plain model's forward composed from five blocks, then the whole loop once
  more with a stand-in at every place: the code around the blocks treats every place alike). That is a
  property of the model's Python code, which parallelizing does not change outside the blocks (it adds
  hooks on the root and on modules of the blocks, which run once, or inside a block's region);
- then the whole model is parallelized as for the whole simulation, all ``n`` blocks: FSDP2's root state
  finds every group at its lazy init (``root_module.modules()`` of the whole model: the shorter model is a
  shallow copy of the root whose hook dictionaries are the root's, so calling it fires the root's hooks
  on the root's state), every block's sharded parameters exist as the whole simulation's (the tracker
  marks them all; the optimizer is built over all and the copies' parameters are taken out of it, the
  composer widening t2's state to them), and the per-block choices ``parallelize`` makes by position
  (checkpointing every K-th block, a block resharded otherwise) are checked after it: every block of the
  run but the first and the last must have the same parallel signature (``_wrap_signature``: classes,
  hooks, the checkpoint's function and options, FSDP2's settings, each parameter's placements, global
  and local shape), else the rank is simulated whole;
- after it, the shorter model is cut from the parallelized one (the blocks themselves, which FSDP2 knows
  by identity; no copy of an FSDP module may be made with ``copy.copy``: ``FSDPModule.__new__`` would call
  the block's ``__init__`` without arguments, capture/blocks.py ``_clone``). FSDP2's order of groups is
  the order they ran in (``_post_forward_indices`` and the backward prefetch of the previous group to
  run): in the shorter model blocks 2 and n-2 are neighbours, as 2 + k and 3 + k are in the whole one,
  and the composer's pattern check (t1, t2, t3 must leave the same record relative to their neighbours,
  no pointer two blocks away) shows that what FSDP2 does around a block (its all-gather in the block's
  pre-forward, the previous block's reduce-scatter waited on in the next one's post-backward, the
  prefetched all-gather of the previous block in the backward) is the same at every middle block.
  Groups that never run (blocks 3..n-3) are taken out of the root's list of states once its lazy init
  has viewed their shards (``_skip_left_out``): its post-backward callback would run their
  post-backward, which the whole simulation runs in each block's own backward (widened from t2's).
- the regions of the edge blocks reach over FSDP2's post-hooks (capture/regions.py ``Regions._edges``),
  and an op's producers outside the blocks are not compared (``Truncated.loose_producers``: the lazy
  init's views; no figure of a rank reads producers).
Why every block is still parallelized and materialised (a third of a 70B candidate's CPU; not yet done):
a left-out block that FSDP2 never saw would change the record three ways. FSDP2's root lazy init runs
``reset_sharded_param`` on every group's parameters: one ``view`` each (the step-time model's host issues
every op, a view too: 9 x 75 views of a 70B rank), and where a shard is uneven a padded copy that replaces
the parameter's storage (the "sharded parameters" bytes); the root's ``fully_shard`` takes into its own
group every parameter no block's group holds (so left-out blocks would have to leave the tree while it
runs); and the run marks every parameter, builds the optimizer over all of them (the composer takes t2's
state to the copies') and lists their layouts (the ranks' roles). Composing the lazy init's ops and the
parameters from t2's, as the passes are, is what would let the 75 blocks go unparallelized.
Not composed (NotComposable, before anything runs): context parallel (RankTracker keeps the ring's
collectives by op clock, which the widening does not carry to the copies) and CPU offload (not shown
equal). Expert parallel is refused by the composition itself: its all-to-alls rest on the routing the
simulation assumes.
Anything that differs raises NotComposable; ``simulate_rank_composed`` then simulates the rank whole and
says why in its notes (``world-composed-refused``); a composed rank says so (``world-composed``).
"""

from __future__ import annotations

import torch
from torch import nn

from ... import _compat
from ...capture.blocks import BlockRun, KEPT, find_run, module_state, restore_module_state, truncated
from ...capture.composed import composed_steps
from ...capture.notes import Note
from ...capture.regions import NotComposable
from ...capture.simulation import eager_paths
from ...capture.spec import StepSpec, StepWatch
from ...capture.step import run_steps
from ...capture.storage import StorageTracker
from ...costs import CostOptions
from ..apply import build_mesh, loss_context, parallelize
from ..blocks import no_kv_cache
from ..config import ParallelConfig
from ..context_parallel import RingCount, check_context_parallel, check_ring, ring_attention, shard_sequence
from .sharded_rank import (RankRun, RankStep, RankTracker, cost_registry, fake_world, meta_copy, param_layouts,
                           prepare_offload, simulate_rank, simulation_warnings, watch_checkpoint_rng, watch_fsdp)

__all__ = ["simulate_rank_composed", "composed_rank"]


def simulate_rank_composed(model: nn.Module, args: tuple, kwargs: dict, config: ParallelConfig, rank: int,
                           step: RankStep) -> RankRun:
    """``simulate_rank``'s rank composed from five blocks where it can be (``composed_rank``), else
    simulated whole; either way its notes say which (and why not)."""
    why = None
    if config.pp == 1:
        try:
            rr = composed_rank(model, args, kwargs, config, rank, step)
        except NotComposable as e:
            why = str(e)
        else:
            return rr
    else:
        why = "a pipeline stage"
    rr = simulate_rank(model, args, kwargs, config, rank, step)
    rr.notes = (*rr.notes, Note("world-composed-refused", {"rank": rank, "why": why}))
    return rr


def _check_key(model: nn.Module, dtype, args: tuple, kwargs: dict) -> tuple:
    """What the plain check's answer depends on: the model, the dtype of its copy, the inputs' specs."""
    def spec(t):
        return (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else repr(t)
    return (id(model), dtype, tuple(spec(a) for a in args), tuple((k, spec(v)) for k, v in sorted(kwargs.items())))


def _plain_check(private: nn.Module, args: tuple, kwargs: dict, checks: dict | None = None, key=None) -> BlockRun:
    """The loop check on the plain (not yet parallelized) meta copy: one no-grad forward composed from
    five blocks, then the loop with stand-ins (capture/composed.py). Its run of identical blocks.
    ``checks``: answers already found for the same model and inputs (``_check_key``; a search's
    candidates share them: the check depends on neither the configuration nor the rank)."""
    run = find_run(private)
    if run is None:
        raise NotComposable("the model has no run of six or more identical blocks")
    if checks is not None and key in checks:
        if checks[key] is not None:
            raise NotComposable(checks[key])
        return run
    try:
        _loop_check(private, args, kwargs)
    except NotComposable as e:
        if checks is not None:
            checks[key] = str(e)
        raise
    if checks is not None:
        checks[key] = None
    return run


def _loop_check(private: nn.Module, args: tuple, kwargs: dict) -> None:
    """capture/composed.py's checks on the plain copy (NotComposable where it cannot be composed)."""
    spec = StepSpec(private, args, kwargs, training=False, probe_kernels=False)
    try:
        done = composed_steps(spec, StepWatch(tracker=StorageTracker()))
    except NotComposable:
        raise
    except Exception as e:     # noqa: BLE001 - the plain forward's own failure: the whole simulation reports it
        raise NotComposable(f"the loop check failed: {type(e).__name__}") from e
    if done is None:
        raise NotComposable("the model has no run of identical blocks")


def _describe(v):
    if callable(v) and hasattr(v, "__qualname__"):
        return ("fn", getattr(v, "__module__", None), v.__qualname__)
    func = getattr(v, "func", None)        # functools.partial (the checkpoint wrapper's checkpoint_fn)
    if func is not None and hasattr(v, "keywords"):
        return ("partial", _describe(func), tuple(sorted((k, _describe(x)) for k, x in v.keywords.items())))
    if isinstance(v, (int, float, str, bool, type(None), torch.dtype)):
        return v
    return (type(v).__module__, type(v).__qualname__)


def _fsdp_settings(m: nn.Module):
    getter = getattr(m, "_get_fsdp_state", None)
    if getter is None:
        return None
    group = getattr(getter(), "_fsdp_param_group", None)
    if group is None:
        return ("state",)
    return (group.post_forward_mesh_info is None, repr(getattr(group, "mp_policy", None)),
            type(getattr(group, "offload_policy", None)).__name__, len(group.fsdp_params),
            tuple(tuple(fp.sharded_size) for fp in group.fsdp_params))


def _wrap_signature(block: nn.Module) -> tuple:
    """What parallelizing made of one block (see the module's docstring)."""
    out = []
    for rel, sub in block.named_modules(remove_duplicate=False):
        hooks = tuple((h, tuple(_describe(f) for f in (getattr(sub, h, None) or {}).values()))
                      for h in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))
        params = []
        for n, p in sub._parameters.items():
            if p is None:
                params.append((n, None))
                continue
            place = tuple(repr(x) for x in getattr(p, "placements", ()))
            local = getattr(p, "_local_tensor", p)
            params.append((n, type(p).__name__, tuple(p.shape), p.dtype, p.requires_grad, place, tuple(local.shape)))
        out.append((rel, type(sub).__qualname__, hooks, tuple(params), _fsdp_settings(sub),
                    _describe(getattr(sub, "checkpoint_fn", None))))
    return tuple(out)


def _parallel_run(run: BlockRun, private: nn.Module) -> BlockRun:
    """The run of blocks as parallelizing left it: the same list and places, every block but the first
    and the last parallelized alike, and the attributes that differ named by their paths in the wrapped
    blocks."""
    container = private.get_submodule(run.path) if run.path else private
    if container is not run.container:
        raise NotComposable("parallelizing replaced the list of blocks")
    kids = list(container._modules.values())[run.start:run.start + run.count]
    sigs = [_wrap_signature(k) for k in kids]
    if any(s != sigs[1] for s in sigs[1:-1]):
        raise NotComposable("the blocks are parallelized differently at some places")
    differing = []
    for rel, attr in run.differing:
        # the same module object, under a wrapper now (a checkpointed block's ``_checkpoint_wrapped_module``)
        before = None
        for k in kids[:1]:
            inner = getattr(k, "_checkpoint_wrapped_module", k)
            before = inner.get_submodule(rel) if rel else inner
            paths = {id(m): p for p, m in k.named_modules()}
            if id(before) not in paths:
                raise NotComposable("a block's module moved when it was parallelized")
            differing.append((paths[id(before)], attr))
    return BlockRun(run.path, container, run.start, run.count, tuple(sorted(differing)))


def _skip_left_out(private: nn.Module, run: BlockRun) -> None:
    """FSDP2's root state keeps every group's state (its lazy init finds them all in the whole model: each
    block's shard is viewed there, as in the whole simulation), and its post-backward callback runs the
    post-backward of each group that has not run its own: the left-out blocks' (3..n-3) would run one
    there, which in the whole simulation each ran in its own backward (composed from t2's). So once the
    lazy init is done, their states are taken out of the root's list."""
    root = getattr(private, "_get_fsdp_state", None)
    if root is None:
        return
    state = root()
    kids = list(run.container._modules.values())[run.start:run.start + run.count]
    left_out = {id(k._get_fsdp_state()) for k in kids[KEPT - 2:-(KEPT - 3)] if hasattr(k, "_get_fsdp_state")}
    if not left_out:
        return
    init = state._lazy_init

    def lazy_init(*a, **kw):
        out = init(*a, **kw)
        ctx = state._state_ctx
        ctx.all_states = [s for s in ctx.all_states if id(s) not in left_out]
        return out
    state._lazy_init = lazy_init


def composed_rank(model: nn.Module, args: tuple, kwargs: dict, config: ParallelConfig, rank: int,
                  step: RankStep, checks: dict | None = None) -> RankRun:
    """``simulate_rank(model, args, kwargs, config, rank, step)`` composed from five blocks (see the
    module's docstring); NotComposable where it cannot stand for the whole simulation. ``checks``: the
    loop checks' answers kept across calls (``_plain_check``)."""
    if config.pp != 1:
        raise NotComposable("a pipeline stage")
    if config.cp > 1:
        # the rank's tracker keeps the ring's collectives by their op clocks (RankTracker.ring_ops), which the
        # widening does not carry to the copies: their bytes would go to the wrong group
        raise NotComposable("context parallel's ring collectives are not widened")
    if config.offload:
        raise NotComposable("CPU offload is not shown equal composed")
    import torch.distributed.fsdp  # noqa: F401  (registers FSDP2's ops before the registry is copied)
    check_context_parallel(model, args, kwargs, config, step.device_type if step.attention is not None else "cpu")
    dtype = torch.float32 if config.mixed_precision == "bf16" else config.model_dtype
    device = torch.device("cpu")
    host = config.offload and step.device_type != "cpu"
    private = meta_copy(model, dtype)
    no_kv_cache(private)
    blocks = _plain_check(private, args, kwargs, checks, _check_key(model, dtype, args, kwargs))
    if blocks.count < KEPT + 1:
        raise NotComposable("the run of identical blocks is too short")
    tracker = RankTracker(step.block_size, gloo=step.gloo, workspace=step.workspace, cuda=step.device_type == "cuda")
    with fake_world(rank, config.world), simulation_warnings():
        mesh = build_mesh(config, device.type)
        parallelize(private, config, mesh)
        blocks = _parallel_run(blocks, private)
        ring = RingCount(tracker)
        args, kwargs = shard_sequence(private, args, kwargs, mesh, config)
        if config.offload:
            prepare_offload(private, tracker, host=host)
        fake_mode = _compat.new_fake_mode(allow_non_fake_inputs=True)
        with fake_mode, eager_paths(fake_mode):
            private.to_empty(device=device)
            watch_fsdp(private, tracker, host=host)
            watch_checkpoint_rng(private, tracker, step.rng_state)
            tr = truncated(private, blocks)
            tr.edges = tr.loose_producers = True
            _skip_left_out(private, blocks)
            before = module_state([*private.modules(), *tr.copies])
            try:
                with ring_attention(mesh, config, ring, step.attention):
                    run = _train(private, args, kwargs, config, tracker, device, step, tr)
            finally:
                changed = restore_module_state(before)
            if changed:
                raise NotComposable(f"the forward wrote {changed[0]!r} in a module")
            layouts = param_layouts(private)
    check_ring(ring, config, step.attention)
    note = Note("world-composed", {"rank": rank, "blocks": blocks.count, "ran": KEPT})
    return RankRun(rank, run, tracker, layouts=layouts, offload=host, ring=ring if config.cp > 1 else None,
                   notes=(note,))


def _train(model, args, kwargs, config: ParallelConfig, tracker, device, step: RankStep, tr):
    """sharded_rank.train_fake's step, composed from ``tr``'s five blocks."""
    amp = config.param_dtype if config.mixed_precision == "bf16" and config.dp * config.cp == 1 else None
    spec = StepSpec(model, args, kwargs, optimizer=step.optimizer, autocast_dtype=amp, loss_fn=step.loss_fn,
                    steps=step.steps, accumulation=config.accumulation, keep_output=False, device=device,
                    foreach_default=step.foreach_default, probe_kernels=step.probe,
                    costs=CostOptions(registry=cost_registry()), placement=lambda: loss_context(config),
                    compose=True)
    try:
        return run_steps(spec, StepWatch(tracker=tracker, attention=step.attention, on_step=step.on_step),
                         compose=tr)
    except NotComposable:
        raise
    except Exception as e:     # noqa: BLE001 - the shorter model failed where the whole one may not: simulate it
        raise NotComposable(f"the composed step failed: {type(e).__name__}: {e}") from e
