"""torch's pipelining, FSDP2 and checkpointing internals that planning drives, each reached through
``_compat`` (its table names the private API and the torch release that has it): the per-rank action
orders of torch's runtime pipeline schedules and the actions its lowering adds, FSDP2's parameter groups
and its deferred gradient reduction, a PipelineStage's static metadata, the fake process group's store,
and the activation-checkpoint wrapper with torchtitan's selective-op save list. They came from
``_compat`` (issue 59: planning's parts of it live in the planning package); the attributes they read
on torch's objects (``_ComputationType``, an FSDP state's ``_state_ctx``, a stage's
``_warmup_backward_result``) are as private as the names in ``_compat``'s table."""

from __future__ import annotations

import importlib
import types

import torch

from .._compat import get, need
from ..errors import InputError

__all__ = ["schedule_order", "runtime_lowered", "fsdp_param_groups", "fsdp_reduce_grads", "pipeline_stage_static",
           "fake_store", "checkpoint_wrapper", "checkpoint_prefix", "sac_save_ops"]


# ---- pipeline schedules ------------------------------------------------------------------------------

def schedule_order(kind, rank: int, stages_per_rank: int, ranks: int,
                   microbatches: int) -> list[tuple[int, str, int]]:
    """The (stage, kind, micro-batch) actions rank ``rank`` runs, in order, under one of torch's runtime
    schedules (``kind``: a planning.config.PipelineSchedule whose ``rank_ops`` names torch's order builder:
    ScheduleInterleaved1F1B's, ScheduleInterleavedZeroBubble's or ScheduleZBVZeroBubble's), from torch's own
    order builders (called on the attributes they read, without process groups or stages; padding no-ops
    dropped). Kinds: "F" forward, "B" full backward, "I" the backward for the stage's input only, "W" the
    backward for its weights."""
    m, p, v = microbatches, ranks, stages_per_rank
    rounds = max(1, m // p)
    if kind.rounds and m % rounds:
        raise InputError(f"{kind.label} needs the micro-batches ({m}) to be a multiple of the rounds ({rounds} = "
                         "micro-batches // ranks), as torch requires")
    me = types.SimpleNamespace(n_local_stages=v, pp_group_size=p, _n_microbatches=m,
                               microbatches_per_round=m // rounds, num_stages=v * p)
    ops = _RANK_ORDERS[kind.rank_ops](me, rank)
    kinds = {"F": "F", "B": "B", "I": "I", "W": "W"}
    out = []
    for a in ops:
        if a is None:
            continue
        kind = str(getattr(a.computation_type, "value", a.computation_type))
        if kind not in kinds:
            continue              # communication or reduce actions: not compute
        out.append((int(a.stage_index), kinds[kind], int(a.microbatch_index)))
    return out


def _interleaved_ops(me, rank: int):
    return need("interleaved_rank_ops", "the interleaved 1F1B step-time prediction")(me, rank)


def _zb_ops(me, rank: int):
    cls = need("zb_rank_ops", "the zero-bubble step-time prediction")
    me.pipeline_order = {r: cls._calculate_single_rank_operations(me, r) for r in range(me.pp_group_size)}
    return cls._add_bubbles_to_actions(me, me.num_stages)[rank]


def _zbv_ops(me, rank: int):
    return need("zbv_rank_ops", "the ZBV zero-bubble step-time prediction")(me, rank)


# torch's per-rank order builders, by the key a runtime schedule's entry names (planning.config.SCHEDULES)
_RANK_ORDERS = {"interleaved_rank_ops": _interleaved_ops, "zb_rank_ops": _zb_ops, "zbv_rank_ops": _zbv_ops}


def runtime_lowered(actions: list, microbatches: int) -> list:
    """A rank's compute actions (objects with ``stage``, ``kind``) under one of torch's runtime schedules
    (interleaved, zero bubble) with the actions torch's own lowering adds (``_add_unshard_reshard``, then
    ``_add_reduce_grad``, as ``_PipelineScheduleRuntime._load_actions`` runs them): UNSHARD (a stage's FSDP
    modules all-gathered before its first action, up to three stages at once), RESHARD (when it drops out of
    that window, and at the step's end) and REDUCE_GRAD (a stage's gradients reduced and scaled right after
    its last backward). Returns the compute actions themselves and ("UNSHARD" | "RESHARD" | "REDUCE_GRAD",
    stage) pairs, in torch's order."""
    schedules = importlib.import_module("torch.distributed.pipelining.schedules")
    lower = need("add_unshard_reshard", "torch's runtime pipeline schedules")
    reduce = need("add_reduce_grad", "torch's runtime pipeline schedules")
    kinds = {"F": "FORWARD", "B": "FULL_BACKWARD", "I": "BACKWARD_INPUT", "W": "BACKWARD_WEIGHT"}
    ct = schedules._ComputationType
    mine = {}
    ins = []
    for a in actions:
        t = types.SimpleNamespace(stage_index=a.stage, computation_type=getattr(ct, kinds[a.kind]), sub_actions=None)
        mine[id(t)] = a
        ins.append(t)
    out = []
    for t in reduce(lower(ins), microbatches):
        a = mine.get(id(t))
        out.append(a if a is not None else (str(getattr(t.computation_type, "value", t.computation_type)),
                                            int(t.stage_index)))
    return out



# ---- FSDP2 ----------------------------------------------------------------------------------------

def fsdp_param_groups(model) -> list:
    """FSDP2's parameter groups of ``model``'s modules (one per ``fully_shard`` call that owns
    parameters): each holds ``fsdp_params``, whose gathered storages FSDP2 resizes in place."""
    fsdp_module = importlib.import_module("torch.distributed.fsdp").FSDPModule
    state_of = need("fsdp_state", "simulating FSDP2's gathered parameters")
    groups = []
    for m in model.modules():
        if isinstance(m, fsdp_module):
            group = getattr(state_of(m), "_fsdp_param_group", None)
            if group is not None:
                groups.append(group)
    return groups


def fsdp_reduce_grads(module) -> None:
    """What torch's pipeline schedule does after a step's last backward on an FSDP2 stage
    (``_PipelineStageBase.perform_reduce_grad``, torch 2.13): gradient sync and resharding back on,
    every parameter group's post-backward (the reduce-scatter of the gradients accumulated over the
    micro-batches, the parameters resharded), then the root's final callback."""
    fsdp = importlib.import_module("torch.distributed.fsdp")
    if not isinstance(module, fsdp.FSDPModule):
        return
    module.set_is_last_backward(True)
    module.set_reshard_after_backward(True)
    module.set_requires_gradient_sync(True)
    state = need("fsdp_state", "FSDP2's deferred gradient reduction under a pipeline schedule")(module)
    for st in state._state_ctx.all_states:
        groups = getattr(st, "_fsdp_param_groups", None)
        if groups is None:
            groups = [g for g in (getattr(st, "_fsdp_param_group", None),) if g is not None]
        for group in groups:
            group.post_backward()
    state._root_post_backward_final_callback()


# ---- parallel (apply) --------------------------------------------------------------------------------

def pipeline_stage_static(stage) -> None:
    """A ``PipelineStage`` given every stage's metadata (``input_args``, ``output_args``) takes torch's
    static metadata mode without the stages' P2P vote (``PipelineStage._warmup_backward_result``,
    torch 2.12+: a vote a fake process group cannot carry). Only this stage object is changed."""
    if hasattr(stage, "_warmup_backward_result"):
        stage._warmup_backward_result = lambda received_result=None: torch.ones(1, dtype=torch.int32)


def fake_store():
    """A FakeStore for ``init_process_group("fake", ...)``; importing it registers the fake backend."""
    return need("FakeStore", "a simulated process group (the 'fake' backend)")()


def checkpoint_wrapper(module, **kwargs):
    """torch's activation-checkpoint wrapper (what torchtitan applies per block)."""
    return need("checkpoint_wrapper", "activation checkpointing of the blocks")(module, **kwargs)


def checkpoint_prefix() -> str:
    """The name part checkpoint_wrapper adds to the parameters it wraps (``_checkpoint_wrapped_module.``)."""
    return get("checkpoint_prefix", "_checkpoint_wrapped_module.")


def sac_save_ops() -> set:
    """torchtitan's selective-op checkpointing save list (``_op_sac_save_list``), as far as this
    torch has the ops: matmuls, the SDPA kernels, the functional reduce-scatter, ``max``, and
    flex attention."""
    aten = torch.ops.aten
    names = ("mm", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
             "_scaled_dot_product_fused_attention_overrideable",
             # the CPU's flash kernel: what the flash entry is on a CPU run (not in torchtitan's list,
             # which is written for CUDA)
             "_scaled_dot_product_flash_attention_for_cpu", "max")
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    for name in ("c10d_reduce_scatter", "flex_attention_hop"):
        op = get(name)
        if op is not None:
            ops.add(op)
    return ops
