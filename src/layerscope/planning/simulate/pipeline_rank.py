"""One rank of a pipeline-parallel configuration (``pp`` > 1, alone or mixed with FSDP2 and TP),
simulated with torch's own code on fake tensors, as planning/simulate/sharded_rank.py does for one stage;
``layerscope.parallel`` runs it for each stage's first rank.

Checked against the CPU allocator (tests/planning/sharded/test_against_allocator.py, docs/benchmarks.md): the
same rank's stage run by torch's ``PipelineStage`` and schedule on the fake backend
(``real.measure_stage_rank``), a shrunk transformers Llama, GPipe and 1F1B, with FSDP, TP, autocast
and full checkpointing, and interleaved 1F1B: within -0.64% .. +0.41% over 30 stage ranks; on an H100 against
``torch.cuda.max_memory_allocated``, 16 stage ranks of a 0.16B Llama and a 0.15B GPT-2 within -1.99% ..
-0.32% (the caching allocator's blocks larger than the requests; docs/benchmarks.md); under torchrun
(gloo), every rank of 36 PP, FSDP x PP and TP x PP runs within 1.2% of the predicted band. The
recording forward runs under a simulated recorder that knows the micro-batch's values (transformers'
mask checks read them); a stage keeps each micro-batch's output until its backward, the last stage's
beside its loss, as torch's forward cache does.

The stages. The cuts are the uniform split of the model's repeated blocks (``apply.find_blocks``)
into ``pp`` contiguous groups, the first stages taking one more block where ``pp`` does not divide
their number (torchtitan's even split of the layers); the first stage also owns every module with
parameters registered before the block list (the embeddings), the last stage every one registered
after it (the final norm and the head) and the loss. Registration order stands for execution order,
as in transformers' models. (The cost-balanced ``pipeline.partition()`` split is not used: it needs
a captured trace of the whole model, the uniform split none.) A stage is a module-ownership stage
(planning/split/runnable.py ``build_stage_module``): the model's own forward, every module another stage
owns replaced by a stub; the stubs' zeros of the recorded shapes are simulated like any tensor.

The rank. Mesh ``[pp, dp_replicate, dp_shard, tp]``: the ranks on one ``pp`` coordinate own the same
stage. Its stage module is parallelized with ``apply.parallelize`` on the mesh without its ``pp``
dimension (a configuration whose ``pp`` is 1), materialised as fake tensors, then trained ``steps``
steps: each step runs the rank's actions of the schedule (``pipeline.schedule.rank_orders``: GPipe all
forwards then all backwards; 1F1B ``P - s`` warm-up forwards on stage s; interleaved 1F1B, where the
rank holds ``stages_per_rank`` stages of the ``pp x stages_per_rank`` (stage s on rank s % pp, each its
own module, parallelized on its own), torch's own order of (stage, micro-batch) actions), what torch's
``PipelineStage`` does for each:

* the forward of micro-batch m: on the first stage its slice of the local batch (split along dim 0
  into ``config.microbatches``, as torch's schedule splits it); on the others, the activation
  received into the stage's receive buffer of micro-batch m. Its output (the last stage: its loss,
  ``loss_fn(output)``, or ``loss_fn(output, target_m)`` with ``target``) and autograd graph stay
  alive until the micro-batch's backward;
* the backward: the last stage from its loss, the others from the gradient received into the grad
  receive buffer of micro-batch m (a fake gradient of the stage output's shape). The gradient of
  the received activation, sent back, accumulates on the receive buffer (torch's
  ``stage_backward``) and stays until the next step clears it (``clear_runtime_states``) under GPipe;
  under 1F1B until the next backward has run, as Schedule1F1B's send ops keep it (measured: its last
  stage's peak equal to the allocator's to the byte so, 16 KB over when kept to the step's end); under
  the interleaved schedule, and with TP, it is let go of once sent (torch's
  ``stage_backward`` sets the input's ``.grad`` to None; the gradient lives in the stage's ``bwd_cache``
  until its send: measured, the interleaved stages' peaks equal the allocator's to the byte so, and sat
  (2M - 3) gradients over it when they were kept);
* the last stage's loss of every micro-batch stays until the step ends (the schedule's
  ``_internal_losses``);
* with FSDP2, every backward runs with gradient sync and resharding off, and after the last one
  the gradients accumulated over the micro-batches are reduce-scattered and the parameters
  resharded (torch's ``perform_reduce_grad``); gradients are divided by the number of micro-batches
  (``scale_grads``); then the optimizer step.

The receive buffers (one per micro-batch for the activations, one per micro-batch for the
gradients, made once as torch's stage makes them) and the input gradients sent back are the part
"communication buffers" of the breakdown. What a real run adds and this does not: the P2P
transfers' own buffers of the backend (NCCL's, gloo's), and the last stage's outputs kept by
``step(return_outputs=True)`` (torchtitan steps with ``return_outputs=False``, as here).

Zero bubble (``zb``, ``zbv``): each backward is two actions, I and W, run with torch's own
``stage_backward_input`` and ``stage_backward_weight`` (the first stage's W: ``stage_backward``), what I
keeps (the retained graph, the detached outputs, the parameter groups, the checkpointed blocks' generator
states) held until W; the input's gradient stays on the receive buffer to the next step (with TP on the
DTensor torch wraps the buffer in, let go of at W). Under the V (``zbv``) the two stages on one rank hand
activations and gradients over on it (torch's ``set_local_fwd_input`` / ``set_local_bwd_input``).
torch's runtime schedules (interleaved and zero bubble) all-gather an FSDP stage ahead of its actions,
reshard it after, and reduce each stage's gradients right after its last backward, in the order torch's
own lowering gives (``_compat.runtime_lowered``). Measured on the fake backend: 16 zero-bubble stage ranks
within -0.52% .. +0.08% (docs/benchmarks.md); on an H100, 8 within -2.23% .. -0.21%.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ... import _compat
from ...capture.inputs import map_tensors
from ...capture.simulation import eager_paths
from ...capture.state import empty_like_on
from ...errors import InputError
from ..config import ParallelConfig, schedule_of
from ..steptime.schedule import rank_orders
from ..blocks import canonical_name, local_tensor as _local, no_kv_cache
from .sharded_rank import (RankRun, RankStep, RankTracker, fake_world, meta_copy, param_layouts, prepare_offload, simulation_warnings, train_fake, watch_checkpoint_rng, watch_fsdp)
from .stage_run import _StageRun, _Tp, _rank_pass
from .uniform_stages import as_module, parallelize_stage, rank_stages, split_micro, stage_coords, stage_module, stage_ties

__all__ = ["simulate_stage_rank"]


def _value_reads(model: nn.Module, fakes, reals):
    """The recording forward's recorder: a simulated session whose known values are the real
    micro-batch's (token ids, masks), so that what a fake forward reads (transformers' mask checks,
    ``.item()``) is answered as the simulated step answers it."""
    from ...capture.inputs import iter_tensors
    from ...capture.known import KnownValues
    from ...capture.recorder import OpRecorder
    from ...capture.session import Session
    from ...costs import CostOptions
    known = KnownValues()
    known.seed_pairs(iter_tensors(fakes), iter_tensors(reals))
    return OpRecorder(Session(model, CostOptions(), track_seq=False, simulated=True, known=known))


def _rank_actions(config: ParallelConfig, coord: int) -> list:
    """The actions of the rank on pipeline coordinate ``coord``, lowered for torch's runtime schedules."""
    per_rank = schedule_of(config.schedule).per_rank(config.stages_per_rank)
    actions = rank_orders(config.schedule, config.stages, config.microbatches, per_rank)[coord]
    if schedule_of(config.schedule).multi:
        # torch's runtime schedules all-gather an FSDP stage's parameters ahead (UNSHARD), reshard it after
        # (RESHARD) and reduce each stage's gradients right after its last backward (REDUCE_GRAD)
        actions = _compat.runtime_lowered(actions, config.microbatches)
    return actions


def _tie_reduces(held, mine: list[int], config: ParallelConfig) -> list[tuple]:
    """One all-reduce per tie over the ranks holding a copy (the copies on this rank summed on it first:
    zbv's V puts the first and the last stage on one rank); none where this rank holds them all."""
    coords = stage_coords(config)
    ties = []
    for h in held:
        here, ranks = [s for s in mine if s in h], len({coords[s] for s in h})
        if here and ranks > 1:
            ties.append((h[here[0]], ranks, here[0]))
    return ties


def _stage_modules(model: nn.Module, args: tuple, kwargs: dict, config: ParallelConfig, privates: dict,
                   dtype: torch.dtype, device: torch.device):
    """The rank's stage modules, recorded on a fake probe of the whole model with the real micro-batch's
    values, each parallelized on the mesh; returns them (stage -> (module, owned)), the mesh and the fake
    mode they live in."""
    from ..apply import build_mesh
    probe_model = meta_copy(model, dtype)
    no_kv_cache(probe_model)
    ra, rk = split_micro(tuple(args), dict(kwargs), 0, config.microbatches)   # the real values
    mesh = build_mesh(config, device.type)
    fake_mode = _compat.new_fake_mode(allow_non_fake_inputs=True)
    built = {}
    with fake_mode, eager_paths(fake_mode):
        probe_model.to_empty(device=device)
        fa, fk = map_tensors((tuple(args), dict(kwargs)), lambda t: empty_like_on(t, device))
        ma, mk = split_micro(fa, fk, 0, config.microbatches)
        probe_model.train()
        for stage in privates:
            built[stage] = stage_module(privates[stage], config, stage, ma, mk, record_on=probe_model,
                                        record_context=functools.partial(_value_reads, probe_model, (ma, mk),
                                                                         (ra, rk)))
        del probe_model, fa, fk, ma, mk
    for mod, own in built.values():
        parallelize_stage(mod, own, config, mesh)
    return built, mesh, fake_mode


def simulate_stage_rank(model: nn.Module, args: tuple, kwargs: dict, config: ParallelConfig, rank: int,
                        step: RankStep) -> RankRun:
    """Simulate global rank ``rank`` of ``config`` (``pp`` > 1) training ``model``: its stages (one, or
    under a schedule with several per rank those ``stage_coords`` places on the rank's ``pp`` coordinate)
    on ``args``/``kwargs``, the rank's LOCAL batch (all micro-batches; split
    into ``config.microbatches`` along dim 0 here). ``loss_fn(output)`` on the last stage's output of
    each micro-batch (default: its ``loss``, or the sum of its outputs); with ``target`` (a tensor of
    the local batch, split alike) ``loss_fn(output, target_m)``, as torch's schedule calls it.
    Returns the RankRun rank_memory() reads (the receive buffers and the gradients sent back in the
    part "communication buffers"). ``device_type``: as simulate_rank's (CPU offload). Each stage is a
    module of its own, parallelized on its own (FSDP2 roots apart, as torchtitan shards each model part),
    all trained by one optimizer in the order torch's schedule runs their actions. ``step``: how the rank's
    step runs (RankStep; its ``loss_fn``, ``target`` and ``device_type`` as above)."""
    loss_fn, target, block_size, gloo, workspace, rng_state, device_type = (
        step.loss_fn, step.target, step.block_size, step.gloo, step.workspace, step.rng_state, step.device_type)
    import torch.distributed.fsdp  # noqa: F401  (registers FSDP2's ops before the registry is copied)
    if config.pp < 2:
        raise InputError("simulate_stage_rank simulates a pipeline stage: pp must be 2 or more (simulate_rank "
                         "does pp = 1)")
    if not 0 <= rank < config.world:
        raise InputError(f"rank {rank} is not in the configuration's {config.world} ranks")
    coord = rank // (config.world // config.pp)
    actions = _rank_actions(config, coord)
    mine = rank_stages(config, coord)
    dtype = torch.float32 if config.mixed_precision == "bf16" else config.model_dtype
    device = torch.device("cpu")
    tracker = RankTracker(block_size, gloo=gloo, workspace=workspace, cuda=device_type == "cuda")
    with fake_world(rank, config.world), simulation_warnings():
        privates = {}
        for stage in mine:
            privates[stage] = meta_copy(model, dtype)
            no_kv_cache(privates[stage])
        ties = _tie_reduces(stage_ties(privates[mine[0]], config), mine, config)
        built, mesh, fake_mode = _stage_modules(model, args, kwargs, config, privates, dtype, device)
        host = config.offload and device_type != "cpu"
        mods = {stage: mod for stage, (mod, _) in built.items()}
        whole = as_module([mods[s] for s in mine])
        if config.offload:
            prepare_offload(whole, tracker, host=host)
        with fake_mode, eager_paths(fake_mode):
            whole.to_empty(device=device)
            watch_fsdp(whole, tracker, host=host)
            watch_checkpoint_rng(whole, tracker, rng_state)
            tp = _Tp(config, mesh) if config.tp > 1 else None
            runners = {stage: _StageRun(mods[stage], stage, config, tracker, loss_fn, target, tp) for stage in mine}
            for stage, r in runners.items():
                r.local_prev, r.local_next = stage - 1 in runners, stage + 1 in runners
            run = train_fake(whole, args, kwargs, config, tracker, device, step, pipeline=_rank_pass(runners, actions))
            layouts = param_layouts(whole)
            tied = []
            for name, n, stage in ties:
                params = {canonical_name(k): v for k, v in mods[stage].named_parameters()}
                tied.append((_local_nbytes(params[f"model.{name}"]), n))
    p2p = [r.p2p() for r in runners.values()]
    return RankRun(rank, run, tracker, layouts=layouts, p2p=tuple(map(sum, zip(*p2p))), ties=tuple(tied),
                   offload=host)


def _local_nbytes(t: torch.Tensor) -> int:
    """Bytes of this rank's shard of a (DTensor) parameter: its gradient's, which has its dtype."""
    local = _local(t)
    return local.numel() * local.element_size()
