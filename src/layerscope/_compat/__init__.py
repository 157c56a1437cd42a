"""Every private torch API layerscope uses, in one place, each resolved when first used.

torch's private names (``torch._C``, ``torch._subclasses``, the profiler's kineto event tree, ``torch.utils._python_dispatch`` / ``_pytree``, ``torch._dynamo``,
ops such as ``aten._grouped_mm``) come and go between releases without notice. Resolving them while
layerscope is imported made ``import layerscope`` fail on any torch that lacked one, even for a
user who never reached the feature. Here each is looked up on first use and cached:

* where layerscope can do without it, the caller gets a fallback (an op this torch does not have
  is simply not priced, since no model can run it; without autograd sequence numbers the latency
  timer times forward passes only);
* where a feature needs it, ``need`` raises ``TorchFeatureError`` naming the feature, the missing
  name, and the torch version that has it.

``_API`` (apis.py) says, per name, what it is and the first torch release known to have it (checked against
the 2.4.1, 2.5.1, 2.6.0, 2.7.1 and 2.8.0 wheels' own sources; "2.4" means 2.4 or earlier). The
suite runs on torch ``TESTED_TORCH`` (pyproject's floor): older releases are not tested.

This package sits below everything else: it imports only torch and layerscope.errors. apis.py holds the
table of private APIs; this module resolves them and wraps the ones callers use.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

import torch

from ..errors import LayerscopeError
from .apis import _API

__all__ = ["TESTED_TORCH", "TorchFeatureError", "get", "need", "has", "forget",
           "dispatch_mode", "sequence_nr", "current_autograd_node", "engine_backward", "fsdp_param_groups", "in_recompute", "composite_implicit_key",
           "has_composite_kernel", "profiler_event_tree", "profiler_enabled",
           "reparametrize_module", "parse_schema", "jit_inline", "is_op_overload", "is_op_packet",
           "is_higher_order_op", "is_fake_tensor", "active_fake_mode", "new_fake_mode",
           "disable_current_modes", "no_dispatch", "queue_backward_callback", "compiled_original",
           "tree_leaves", "tree_flatten", "tree_unflatten", "tree_map_only",
           "engine_grad", "runtime_lowered"]

# the torch release the whole suite is run on; pyproject's floor says the same
TESTED_TORCH = "2.13"


class TorchFeatureError(LayerscopeError, RuntimeError):
    """A feature needs a private torch API that the running torch does not have."""


_NOT_YET = object()
_MISSING = object()
_cache: dict[str, Any] = {}


def _resolved(name: str) -> Any:
    value = _cache.get(name, _NOT_YET)
    if value is _NOT_YET:
        try:
            value = _API[name][2]()
        except (AttributeError, ImportError, RuntimeError):
            value = _MISSING
        _cache[name] = value
    return value


def forget() -> None:
    """Drop what was resolved (tests that play another torch resolve again)."""
    _cache.clear()


def has(name: str) -> bool:
    """Whether the running torch has the private API ``name`` (a key of ``_API``)."""
    return _resolved(name) is not _MISSING


def get(name: str, default: Any = None) -> Any:
    """The private API ``name``, or ``default`` where this torch has none (the caller's fallback)."""
    value = _resolved(name)
    return default if value is _MISSING else value


def need(name: str, feature: str) -> Any:
    """The private API ``name``; where this torch has none, a TorchFeatureError that names the
    feature, the missing API and the torch release that has it."""
    value = _resolved(name)
    if value is _MISSING:
        what, since, _ = _API[name]
        raise TorchFeatureError(f"{feature} needs {what}, which torch {torch.__version__} does not have: "
                                f"it needs torch >= {since} (layerscope is tested on torch {TESTED_TORCH})")
    return value


# ---- ops ---------------------------------------------------------------------------------------------

def is_op_overload(op: Any) -> bool:
    return isinstance(op, get("OpOverload", ()))


def is_op_packet(op: Any) -> bool:
    return isinstance(op, get("OpOverloadPacket", ()))


def is_higher_order_op(op: Any) -> bool:
    return isinstance(op, get("HigherOrderOperator", ()))


def parse_schema(text: str):
    return need("parse_schema", "reading a TorchScript graph")(text)


def jit_inline(graph) -> None:
    """Inline every call in a TorchScript graph (in place)."""
    need("jit_pass_inline", "reading a TorchScript graph")(graph)


# ---- dispatch modes ----------------------------------------------------------------------------------

def dispatch_mode(body: type) -> Callable[..., Any]:
    """Decorator: ``body``'s methods on a TorchDispatchMode subclass, made on first call, so that
    defining it does not touch torch's private dispatch module at import. The decorated name
    builds instances (``Mode(args)``), and instances are ``body`` instances."""
    made: list[type] = []

    @functools.wraps(body, updated=())
    def make(*args, **kwargs):
        if not made:
            base = need("TorchDispatchMode", f"layerscope's op recorder ({body.__name__})")
            made.append(type(body.__name__, (body, base),
                             {"__module__": body.__module__, "__qualname__": body.__qualname__}))
        return made[0](*args, **kwargs)

    return make


def disable_current_modes():
    return need("disable_current_modes", "running a kernel for real inside a simulation")()


def no_dispatch():
    return need("no_dispatch", "making a constant inside a simulation")()


def is_fake_tensor(t: Any) -> bool:
    return isinstance(t, get("FakeTensor", ()))


def active_fake_mode():
    """The innermost FakeTensorMode on the current dispatch mode stack (the user's), or None."""
    mode_type = need("FakeTensorMode", "a simulated run (fake tensors)")
    stack = need("dispatch_mode_stack", "a simulated run (fake tensors)")
    return next((m for m in reversed(stack()) if isinstance(m, mode_type)), None)


def new_fake_mode(**kwargs):
    return need("FakeTensorMode", "a simulated run (fake tensors)")(**kwargs)


# ---- autograd ----------------------------------------------------------------------------------------

def sequence_nr(feature: str) -> Callable[[], int]:
    """The function giving this thread's next autograd sequence number."""
    return need("sequence_nr", feature)


def current_autograd_node(feature: str) -> Callable[[], Any]:
    """The function giving the autograd node being run (None outside backward)."""
    return need("current_autograd_node", feature)


def engine_backward(feature: str) -> Callable[..., Any]:
    """The autograd engine's own entry (what torch.autograd.backward calls after its argument checks):
    called directly, a TorchFunctionMode that is active stays active in the backward, where
    torch.autograd.backward, itself overridable, pops it while it runs."""
    return need("engine_run_backward", feature)


def engine_grad(feature: str, outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
                allow_unused=None) -> tuple:
    """``torch.autograd.grad`` (its tensor or GradientEdge outputs and inputs, the gradients given or
    ones) by the autograd engine's own entry, as ``engine_backward``: a TorchFunctionMode that is active
    stays active in the backward, which torch.autograd.grad, itself overridable, would pop."""
    from torch.autograd.graph import GradientEdge
    one = (torch.Tensor, GradientEdge)
    outs = (outputs,) if isinstance(outputs, one) else tuple(outputs)
    ins = (inputs,) if isinstance(inputs, one) else tuple(inputs)
    if grad_outputs is None:
        grad_outputs = (None,) * len(outs)
    seeds = (grad_outputs,) if isinstance(grad_outputs, torch.Tensor) else tuple(grad_outputs)
    seeds = need("make_grads", feature)(outs, seeds, is_grads_batched=False)
    if retain_graph is None:
        retain_graph = create_graph
    return need("engine_run_backward", feature)(outs, seeds, retain_graph, create_graph, ins, bool(allow_unused),
                                                accumulate_grad=False)


def saved_hooks_name() -> str:
    """The qualified name of the innermost saved-tensor pack hook in force ("" where none is, or where
    this torch cannot say): torch.utils.checkpoint's own hooks name themselves."""
    top = get("top_saved_tensors_hooks")
    hooks = top(False) if top is not None else None
    return "" if hooks is None else getattr(hooks[0], "__qualname__", type(hooks[0]).__name__)


def in_recompute() -> bool:
    """Whether the op running now is part of a checkpointed region's recompute (torch.utils.checkpoint's
    non-reentrant recompute runs under its ``_recomputation_hook`` saved-tensor hooks)."""
    top = get("top_saved_tensors_hooks")
    if top is None:
        return False
    hooks = top(False)
    return hooks is not None and "_recomputation_hook" in getattr(hooks[0], "__qualname__", "")


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


def composite_implicit_key():
    return need("composite_implicit_key", "decomposing a composite op in inference mode")


def has_composite_kernel(op_name: str) -> bool:
    """Whether the op has a CompositeImplicitAutograd kernel (it decomposes above autograd).
    RuntimeError where the C++ dispatcher does not know the op, as torch raises it."""
    return need("dispatch_has_kernel", "decomposing a composite op in inference mode")(op_name,
                                                                                      composite_implicit_key())


def queue_backward_callback(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the current backward pass ends."""
    need("queue_callback", "timing backward passes")(fn)


def reparametrize_module(model, state: dict, *, tie_weights: bool, strict: bool):
    return need("reparametrize_module", "running a model with swapped parameters")(
        model, state, tie_weights=tie_weights, strict=strict)


# ---- profiler, dynamo --------------------------------------------------------------------------------

def profiler_enabled() -> bool:
    """Whether a profiler is running in this process (one cannot nest)."""
    return need("profiler_enabled", "sizing a kernel's scratch memory")()


def profiler_event_tree(prof) -> list:
    """The event tree (allocations included) of a finished ``torch.profiler.profile``."""
    tree = need("event_tree", "the profiler's allocation events")
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:     # a profiler that kept no kineto results (built without kineto)
        raise TorchFeatureError(f"the profiler's allocation events need kineto's results, which the profiler "
                                f"of torch {torch.__version__} did not keep")
    return tree(results)


def compiled_original(model) -> Any:
    """A torch.compile'd module's original module, else None. torch._dynamo is not imported here:
    a model can only be a compiled one when the user has imported it already."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None) if eval_frame is not None else None
    if optimized is not None and isinstance(model, optimized):
        return model._orig_mod
    return None


# ---- pytree ------------------------------------------------------------------------------------------

def _pytree():
    return need("pytree", "walking nested inputs and outputs")


def tree_leaves(tree, *args, **kwargs) -> list:
    return _pytree().tree_leaves(tree, *args, **kwargs)


def tree_flatten(tree, *args, **kwargs):
    return _pytree().tree_flatten(tree, *args, **kwargs)


def tree_unflatten(leaves, spec):
    return _pytree().tree_unflatten(leaves, spec)


def tree_map_only(types, fn, tree, *args, **kwargs):
    return _pytree().tree_map_only(types, fn, tree, *args, **kwargs)


def schedule_order(kind, rank: int, stages_per_rank: int, ranks: int,
                   microbatches: int) -> list[tuple[int, str, int]]:
    """The (stage, kind, micro-batch) actions rank ``rank`` runs, in order, under one of torch's runtime
    schedules (``kind``: a planning.config.PipelineSchedule whose ``rank_ops`` names torch's order builder:
    ScheduleInterleaved1F1B's, ScheduleInterleavedZeroBubble's or ScheduleZBVZeroBubble's), from torch's own
    order builders (called on the attributes they read, without process groups or stages; padding no-ops
    dropped). Kinds: "F" forward, "B" full backward, "I" the backward for the stage's input only, "W" the
    backward for its weights."""
    import types

    from ..errors import InputError
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
    import types
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


def context_parallel(feature: str):
    """torch's context-parallel module (its ring attention, options and SDPA handlers)."""
    return need("context_parallel", feature)


def wrap_cp_handlers(wrap: Callable) -> Callable[[], None]:
    """DTensor's custom op handlers with context parallel's SDPA handlers (enabled already) each replaced by
    ``wrap(handler)``; returns what puts torch's back."""
    from torch.distributed.tensor import DTensor
    dispatcher = DTensor._op_dispatcher
    before = dispatcher._custom_op_handlers
    ops = context_parallel("context parallel's ring attention").custom_ops
    dispatcher._custom_op_handlers = {op: wrap(h) if op in ops else h for op, h in before.items()}

    def restore() -> None:
        dispatcher._custom_op_handlers = before
    return restore


def head_tail_balancer(seq_len: int, world: int, device):
    """torch's head-tail load balancer of a causal sequence over ``world`` context-parallel ranks."""
    return need("head_tail_balancer", "context parallel's load balancing")(seq_len, world, device)


def process_group_backend() -> str | None:
    """The default process group's backend ("gloo", "nccl", "fake"), None without one."""
    import torch.distributed as dist
    return dist.get_backend() if dist.is_available() and dist.is_initialized() else None


def mesh_flatten(mesh, name: str):
    """``mesh`` (a sub-mesh of several dimensions) flattened into one dimension called ``name``."""
    return need("mesh_flatten", "FSDP over the data-parallel and context-parallel ranks")(mesh, name)


def checkpoint_wrapper(module, **kwargs):
    """torch's activation-checkpoint wrapper (what torchtitan applies per block)."""
    return need("checkpoint_wrapper", "activation checkpointing of the blocks")(module, **kwargs)


def checkpoint_prefix() -> str:
    """The name part checkpoint_wrapper adds to the parameters it wraps (``_checkpoint_wrapped_module.``)."""
    return get("checkpoint_prefix", "_checkpoint_wrapped_module.")


def sac_save_ops() -> set:
    """torchtitan's selective-op checkpointing save list (``_op_sac_save_list``), as far as this
    torch has the ops: matmuls, the SDPA kernels, the functional reduce-scatter and all-to-all, ``max``,
    and flex attention."""
    aten = torch.ops.aten
    names = ("mm", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
             "_scaled_dot_product_fused_attention_overrideable",
             # the CPU's flash kernel: what the flash entry is on a CPU run (not in torchtitan's list,
             # which is written for CUDA)
             "_scaled_dot_product_flash_attention_for_cpu", "max")
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    # the all-to-all of expert parallel: torchtitan b5bcd76c66d0acb1a08b176d9639425bc55e0b2a saves it too
    # (torchtitan/distributed/activation_checkpoint.py, its communication ops): a recompute dispatches nothing
    for name in ("c10d_reduce_scatter", "c10d_all_to_all", "flex_attention_hop"):
        op = get(name)
        if op is not None:
            ops.add(op)
    return ops
