"""Expert parallel: a mixture-of-experts block's routed experts sharded across an ``ep`` mesh dimension,
each token's hidden state dispatched to the ranks holding its experts and combined back with
``all_to_all_single`` (torch's functional collective, differentiable), as torchtitan does at commit
b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (``torchtitan/models/common/token_dispatcher.py``
``AllToAllTokenDispatcher``: the token counts exchanged first, then the tokens with those split sizes;
``torchtitan/distributed/parallel_dims.py``: the sparse mesh ``(pp, dp_replicate, efsdp, ep)`` over the
same ranks as the dense one, ``ep`` innermost, ``efsdp = dp_shard x cp x tp / ep``).

The experts are transformers' own (5.x: one module holding 3-D ``gate_up_proj``/``down_proj``, or
``up_proj``, with optional biases, dim 0 the experts: Qwen3-MoE, Mixtral, DeepSeek-V3, gpt-oss, ...;
``use_experts_implementation``). Their expert-indexed parameters become DTensors ``Shard(0)`` on the
``ep`` mesh; the router, shared experts and the rest of the block are left as they are (FSDP over the
dense mesh). The local experts compute with transformers' ``grouped_mm`` implementation, whose shapes
do not depend on the routing (a rank's received tokens, one expert id each, a routing weight of one:
the weights are applied after the combine, on the token's own rank, as transformers applies them after
the down projection).

Split sizes. In a real run they are the router's counts. In a simulation (fake tensors: no values)
they come from the routing assumption (``ParallelConfig.routing``, ``routing_counts``): every rank
routes its ``S = tokens x top_k`` choices the same way; the hottest expert receives ``ceil(F x S / E)``
of them (F = 1: even), capped at one per token, the rest spread evenly over the other experts (the
first ones one more); the simulated rank is the one holding the hottest expert (its first local
expert), so it receives the most: the worst rank's figures, shown for every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .. import _compat
from ..capture.notes import Note
from ..errors import InputError
from .config import ParallelConfig

__all__ = ["ep_notes", "expert_modules", "check_experts", "sparse_mesh", "apply_ep", "routing_counts", "EpSplits",
           "shard_experts_fsdp"]

# the expert-indexed parameters transformers' experts modules hold (dim 0: the experts)
_EXPERT_PARAMS = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias", "down_proj_bias")


def expert_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """transformers' routed-experts modules in ``model`` (path, module): those its
    ``use_experts_implementation`` decorated (``_is_expert_parallel``), with ``num_experts`` and a 3-D
    ``down_proj`` whose dim 0 is that count."""
    out = []
    for path, mod in model.named_modules():
        n = getattr(mod, "num_experts", None)
        down = getattr(mod, "down_proj", None)
        if hasattr(mod, "_is_expert_parallel") and isinstance(n, int) and isinstance(down, torch.Tensor) \
                and down.dim() == 3 and down.shape[0] == n:
            out.append((path, mod))
    return out


def check_experts(model: nn.Module, config: ParallelConfig) -> list[tuple[str, nn.Module]]:
    """The experts ``config.ep`` shards, or one line saying why it cannot."""
    found = expert_modules(model)
    if not found:
        raise InputError(f"expert parallel (ep {config.ep}) needs a mixture-of-experts model: {type(model).__name__} "
                         f"has no routed experts (transformers' experts modules with 3-D gate_up_proj/down_proj)")
    for path, mod in found:
        if mod.num_experts % config.ep:
            raise InputError(f"ep ({config.ep}) must divide the number of experts: {path} has {mod.num_experts}")
    if config.tp > 1 or config.cp > 1:
        # each tp / cp rank would dispatch the same (or a shard of the) tokens: torchtitan's sequence-parallel
        # split of the MoE input is not applied here yet
        raise InputError(f"expert parallel is applied with data parallel (and pipeline stages) only for now: "
                         f"ep {config.ep} with tp {config.tp}, cp {config.cp} (leave tp and cp at 1)")
    return found


def sparse_mesh(config: ParallelConfig, device_type: str):
    """torchtitan's sparse mesh, this rank's part of it: ``(dp_replicate, efsdp, ep)`` (``dp_replicate``
    only with HSDP), row-major over the same rank numbers as the dense mesh, so an ep group is ``ep``
    consecutive ranks. Built over the whole world with a ``pp`` dimension outermost (``config`` is a
    pipeline stage's, its pp 1, where the world has stages: every rank builds the same mesh, as torch's
    process groups need), with DeviceMesh's public constructor, then sliced to this rank's stage."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    world = dist.get_world_size()
    dims = [("pp", world // config.world)] + ([("dp_replicate", config.replicate)] if config.replicate > 1 else []) \
        + [("efsdp", config.efsdp), ("ep", config.ep)]
    ranks = torch.arange(world).reshape(tuple(s for _, s in dims))
    full = DeviceMesh(device_type, ranks, mesh_dim_names=tuple(n for n, _ in dims))
    return full[tuple(n for n, _ in dims[1:])]


@dataclass(frozen=True)
class EpSplits:
    """One rank's dispatch under the routing assumption: ``send[d]`` choices to ep rank ``d``,
    ``receive[s]`` from ep rank ``s``, ``local[j]`` for its local expert ``j`` (from every rank)."""

    send: tuple[int, ...]
    receive: tuple[int, ...]
    local: tuple[int, ...]


def routing_counts(tokens: int, top_k: int, experts: int, ep: int, skew: float) -> EpSplits:
    """The split sizes of the rank holding the hottest expert (the module docstring's assumption), each
    rank routing ``tokens x top_k`` choices: the hottest expert (this rank's first local expert) gets
    ``min(tokens, ceil(skew x S / E))``, the other ``E - 1`` the rest evenly, the ones after it in expert
    order one more where it does not divide."""
    s = tokens * top_k
    if skew > experts / top_k:
        raise InputError(f"routing skew:{skew:g} cannot be: an expert receives at most one of each token's {top_k} "
                         f"choices, {experts / top_k:g} times its even share with {experts} experts")
    hot = min(tokens, math.ceil(skew * s / experts - 1e-9))    # (less a hair: 2.0 x 64 / 4 is 32, not 33)
    rest = s - hot
    others = experts - 1
    per = [hot] + ([rest // others + (1 if j < rest % others else 0) for j in range(others)] if others else [])
    if not others:
        per = [s]
    n_local = experts // ep
    # per[i]: the i-th expert counted from the hottest (this rank's first local expert); ep rank d holds
    # experts [d x n_local, (d + 1) x n_local) counted from there
    send = tuple(sum(per[d * n_local:(d + 1) * n_local]) for d in range(ep))
    mine = send[0]
    return EpSplits(send=send, receive=(mine,) * ep, local=tuple(ep * c for c in per[:n_local]))


class _LocalExperts:
    """The experts module seen with its local shard only (``num_experts`` the local count, the
    expert-indexed parameters their local tensors), for transformers' grouped_mm forward."""

    def __init__(self, module: nn.Module, n_local: int, params: dict) -> None:
        self.__dict__["_m"] = module
        self.__dict__.update(params, num_experts=n_local, _is_expert_parallel=False)

    def __getattr__(self, name):
        return getattr(self.__dict__["_m"], name)


def _local_params(module: nn.Module) -> dict:
    out = {}
    for name in _EXPERT_PARAMS:
        p = getattr(module, name, None)
        if isinstance(p, torch.Tensor):
            out[name] = p.to_local() if hasattr(p, "to_local") else p
    return out


def _grouped_forward():
    # transformers' own grouped_mm experts forward: routing-independent shapes (the tokens sorted by expert,
    # one grouped matmul over offsets), so a simulation without the router's values has the real shapes
    from transformers.integrations.moe import grouped_mm_experts_forward
    return grouped_mm_experts_forward


def _a2a(x: torch.Tensor, out_splits: list, in_splits: list, group) -> torch.Tensor:
    fn = _compat.need("all_to_all_single_autograd", "expert parallel's token dispatch")
    y = fn(x, out_splits, in_splits, group)
    return _compat.need("wait_tensor", "expert parallel's token dispatch")(y)


def _exchange_counts(counts: torch.Tensor, group) -> torch.Tensor:
    """The count exchange before the dispatch (torchtitan's ``_token_count_exchange``): every rank's
    count per expert, so each knows how many tokens it receives from each other."""
    fn = _compat.need("all_to_all_single", "expert parallel's token count exchange")
    y = fn(counts, None, None, group)
    return _compat.need("wait_tensor", "expert parallel's token count exchange")(y)


def _ep_forward(module: nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                *, mesh, skew: float) -> torch.Tensor:
    ep = mesh.size()
    group = mesh.get_group()
    n_exp = module.num_experts
    n_local = n_exp // ep
    tokens, k, h = hidden.size(0), top_k_index.size(-1), hidden.size(-1)
    ids = top_k_index.reshape(-1)
    ids_sorted, perm = torch.sort(ids, stable=True)
    routed = hidden[perm // k]                                  # (S, H), grouped by expert
    fake = _compat.is_fake_tensor(hidden)
    with torch.no_grad():
        counts = torch.zeros(n_exp, dtype=torch.int64, device=hidden.device).index_add_(
            0, ids_sorted, torch.ones_like(ids_sorted))
        received = _exchange_counts(counts, group)              # (ep x n_local): from each rank, its counts for mine
    if fake:
        # no values: the routing assumption (module docstring)
        splits = routing_counts(tokens, k, n_exp, ep, skew)
        send, receive, local = list(splits.send), list(splits.receive), list(splits.local)
    else:
        send = counts.view(ep, n_local).sum(1).tolist()
        grid = received.view(ep, n_local)
        receive = grid.sum(1).tolist()
        by_src = grid.tolist()
        local = grid.sum(0).tolist()
    x = _a2a(routed, receive, send, group)                      # (R, H): by source rank, then local expert
    r = sum(receive)
    if fake:
        order = torch.arange(r, device=hidden.device)
        local_ids = torch.zeros(r, 1, dtype=torch.int64, device=hidden.device)
    else:
        # regroup by local expert (from every source), as the grouped matmul wants its rows
        starts, at = [], 0
        for row in by_src:
            starts.append([])
            for c in row:
                starts[-1].append(at)
                at += c
        order = torch.cat([torch.arange(starts[s][j], starts[s][j] + by_src[s][j]) for j in range(n_local)
                           for s in range(ep)] or [torch.zeros(0, dtype=torch.int64)]).to(hidden.device)
        local_ids = torch.repeat_interleave(torch.arange(n_local), torch.tensor(local)).unsqueeze(1).to(hidden.device)
    view = _LocalExperts(module, n_local, _local_params(module))
    ones = torch.ones(r, 1, dtype=hidden.dtype, device=hidden.device)
    out = _grouped_forward()(view, x[order], local_ids, ones)   # (R, H) by local expert
    inv = torch.empty_like(order)
    inv[order] = torch.arange(r, device=hidden.device)
    back = _a2a(out[inv], send, receive, group)                 # (S, H): grouped by expert, as sent
    unsort = torch.empty_like(perm)
    unsort[perm] = torch.arange(perm.size(0), device=hidden.device)
    weighted = back[unsort] * top_k_weights.reshape(-1, 1).to(back.dtype)
    return weighted.view(tokens, k, h).sum(dim=1).to(hidden.dtype)


def apply_ep(model: nn.Module, config: ParallelConfig, smesh) -> list[nn.Module]:
    """Shard every routed-experts module of ``model`` on ``smesh["ep"]`` (dim 0, the experts) and give it
    the dispatch/combine forward; returns the modules (their FSDP comes later, ``shard_experts_fsdp``)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    found = check_experts(model, config)
    ep_mesh = smesh["ep"]
    skew = config.routing_skew
    for _, mod in found:
        for name in _EXPERT_PARAMS:
            p = getattr(mod, name, None)
            if isinstance(p, nn.Parameter):
                # every rank holds the whole tensor (same seed, or meta): its own chunk, no communication
                d = distribute_tensor(p.detach(), ep_mesh, [Shard(0)], src_data_rank=None)
                mod.register_parameter(name, nn.Parameter(d, requires_grad=p.requires_grad))

        def forward(hidden, top_k_index, top_k_weights, _mod=mod):
            return _ep_forward(_mod, hidden, top_k_index, top_k_weights, mesh=ep_mesh, skew=skew)
        mod.forward = forward
        mod._is_expert_parallel = True
    return [m for _, m in found]


def shard_experts_fsdp(experts: list, smesh, config: ParallelConfig, kwargs: dict) -> None:
    """FSDP2 on each experts module over the sparse mesh's data-parallel part (``efsdp``, with
    ``dp_replicate`` for HSDP), before the blocks' own (which then leave its parameters alone). Its
    gradients are averaged over the dense data-parallel degree, not efsdp's (torchtitan's
    ``set_gradient_divide_factor``): each expert's gradient already sums the tokens of every ep rank."""
    from torch.distributed.fsdp import fully_shard

    names = smesh.mesh_dim_names
    dp = smesh[tuple(n for n in ("dp_replicate", "efsdp") if n in names)]
    import torch.distributed as dist
    # gloo has no PREMUL_SUM, the reduce op FSDP2 takes for a divide factor other than its group's size:
    # there, a sum with FSDP2's own division after it (NCCL keeps PREMUL_SUM). Not on an efsdp group of one:
    # FSDP2 (torch 2.13 foreach_reduce) skips the reduce-scatter and divides by the factor itself, then again
    # when the sum is forced (measured on gloo, 2 ranks, ep 2: the experts' gradients half of one process's)
    gloo = config.efsdp > 1 and dist.get_backend(dp.get_group(dp.ndim - 1)) == "gloo"
    for mod in experts:
        fully_shard(mod, reshard_after_forward=config.reshard_after_forward, **{**kwargs, "mesh": dp})
        mod.set_gradient_divide_factor(float(config.replicate * config.fsdp * config.cp))
        if gloo:
            mod.set_force_sum_reduction_for_comms(True)


def ep_notes(config: ParallelConfig) -> list:
    """The routing assumption the figures follow, stated (reports/notes.py words it): with ``ep`` > 1 how
    the simulated ranks' split sizes were made; without, that the routing changes no figure (transformers'
    grouped_mm experts have shapes the routing does not change)."""
    if config.ep > 1:
        return [Note("ep-routing", {"ep": config.ep, "routing": config.routing, "skew": config.routing_skew})]
    if config.routing != "even":
        return [Note("ep-routing-unused", {"routing": config.routing})]
    return []
