"""Sharded training applied to a model with torch's own code: tensor parallel (``parallelize_module``),
activation checkpointing (``checkpoint_wrapper``, selective checkpointing contexts) and FSDP2
(``fully_shard``), in torchtitan's order.

Used alike by the simulation (a model on the meta device, a fake process group) and by real runs
under torchrun (``planning/real/sharded_run.py``). What torchtitan does is followed from its commit
1e8f9acd194a896efeb5f417894c305783c7b138 (2026-01-20; ``torchtitan/models/llama3/infra/parallelize.py``
``parallelize_llama``/``apply_tp``/``apply_fsdp`` and ``torchtitan/distributed/activation_checkpoint.py``),
the last one with per-model TP plans and the op save list ``_op_sac_save_list`` before torchtitan
moved both into its own module protocol. Where this departs from it, the comment says why.

TP plans exist for transformers' Llama, Mistral and Qwen2 (``q/k/v/o_proj``, ``gate/up/down_proj``)
and for GPT-2 (``Conv1D``, fused ``c_attn``: see ``_FusedQKV``); any other model with ``tp > 1`` is
refused with one line naming the module no plan covers. FSDP and checkpointing work on any model
whose repeated blocks ``find_blocks`` finds. Pipeline stages are not applied here (pipeline/).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from functools import partial
from typing import Callable

import torch
from torch import nn

from .. import _compat
from ..errors import InputError
from .config import ParallelConfig

__all__ = ["build_mesh", "find_blocks", "parallelize", "loss_context", "amp_context", "canonical_name",
           "canonical_tensors", "data_parallel_rank", "tp_family", "no_kv_cache", "checkpoint_blocks",
           "local_tensor"]


# ---- mesh --------------------------------------------------------------------------------------------

def build_mesh(config: ParallelConfig, device_type: str):
    """The device mesh of ``config`` over the default process group (already initialised: gloo,
    nccl or torch's ``fake`` backend), its dimensions named and ordered as ``config.mesh_shape``
    (``pp``, ``dp_replicate``, ``dp_shard``, ``tp``: torchtitan's order, tensor parallel innermost).
    None when the configuration is one rank. One exception to "sizes > 1 only": HSDP without
    sharding (``replicate`` > 1, ``fsdp`` 1) keeps a ``dp_shard`` dimension of size 1, so that
    ``fully_shard`` gets its 2-D (replicate, shard) mesh and replicates, as DDP would."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if config.world == 1:
        return None
    if not dist.is_initialized():
        raise InputError("build_mesh needs the default process group initialised first "
                         "(torch.distributed.init_process_group)")
    if dist.get_world_size() != config.world:
        raise InputError(f"the process group has {dist.get_world_size()} ranks, the configuration "
                         f"{config.world} ({config.label()})")
    dims = list(config.mesh_shape)
    if config.replicate > 1 and config.fsdp == 1:
        at = [n for n, _ in dims].index("dp_replicate") + 1
        dims.insert(at, ("dp_shard", 1))
    return init_device_mesh(device_type, tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))


def data_parallel_rank(config: ParallelConfig, mesh) -> int:
    """This rank's index among the data-parallel ranks (which slice of the global batch it takes):
    its coordinate on (dp_replicate, dp_shard), row-major; 0 without a mesh."""
    if mesh is None:
        return 0
    names = mesh.mesh_dim_names or ()
    index = 0
    for name in ("dp_replicate", "dp_shard"):
        if name in names:
            index = index * mesh.size(names.index(name)) + mesh.get_local_rank(name)
    return index


def _dp_mesh(mesh):
    names = mesh.mesh_dim_names or ()
    dp = tuple(n for n in ("dp_replicate", "dp_shard") if n in names)
    return mesh[dp] if dp else None


# ---- blocks ------------------------------------------------------------------------------------------

def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks, as (path, module), in module order: the children of every
    ``nn.ModuleList`` of two or more children of one class that hold parameters, outermost lists only
    (``model.model.layers`` in Llama, ``transformer.h`` in GPT-2, both of T5's stacks; not the experts
    inside a block). FSDP2 and checkpointing wrap each block; tensor parallel plans name them."""
    lists: list[tuple[str, nn.ModuleList]] = []
    for path, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > 1 and len({type(c) for c in m}) == 1 and \
                any(True for _ in m.parameters()) and \
                not any(path.startswith(f"{q}." if q else "") for q, _ in lists):
            lists.append((path, m))
    if not lists:
        raise InputError(f"{type(model).__name__} has no nn.ModuleList of repeated blocks (same class): "
                         "sharding and checkpointing apply per block")
    return [(f"{q}.{i}" if q else str(i), c) for q, m in lists for i, c in enumerate(m)]


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    head, _, leaf = path.rpartition(".")
    return (model.get_submodule(head) if head else model), leaf


# ---- tensor parallel ---------------------------------------------------------------------------------

def _styles():
    from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    return (Replicate, Shard, distribute_module, distribute_tensor, ColwiseParallel, PrepareModuleInput,
            RowwiseParallel, SequenceParallel)


def _conv1d_class():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:       # no transformers: no model here has its Conv1D
        return None
    return Conv1D


def _conv1d_styles():
    """ColwiseParallel / RowwiseParallel for transformers' ``Conv1D`` (GPT-2), which torch's styles
    refuse (nn.Linear and nn.Embedding only). Conv1D computes ``x @ weight + bias`` with ``weight``
    stored as [in, out]: column-wise shards ``weight`` on dim 1 and ``bias`` on dim 0; row-wise
    shards ``weight`` on dim 0 and replicates ``bias``; the inputs and outputs are prepared exactly as
    torch's styles prepare a Linear's."""
    Replicate, Shard, distribute_module, distribute_tensor, Colwise, _, Rowwise, _ = _styles()

    def shard(module, mesh, placements: dict, src):
        for name, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(name, nn.Parameter(
                distribute_tensor(param, mesh, [placements[name]], src_data_rank=src),
                requires_grad=param.requires_grad))

    class Conv1DColwise(Colwise):
        def _apply(self, module, device_mesh):
            return distribute_module(
                module, device_mesh,
                lambda _n, m, mesh: shard(m, mesh, {"weight": Shard(1), "bias": Shard(0)}, self.src_data_rank),
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))

    class Conv1DRowwise(Rowwise):
        def _apply(self, module, device_mesh):
            self.desired_input_layouts = (Shard(-1),)
            return distribute_module(
                module, device_mesh,
                lambda _n, m, mesh: shard(m, mesh, {"weight": Shard(0), "bias": Replicate()}, self.src_data_rank),
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))

    return Conv1DColwise, Conv1DRowwise


class _FusedQKV(nn.Module):
    """GPT-2's fused ``c_attn`` (one Conv1D [E, 3E], output split into q, k, v of E columns each)
    re-laid as three Conv1D of [E, E] whose local outputs are concatenated: column-wise sharding of
    the fused weight would give rank 0 the first 3E/tp columns (all of q's heads and none of v's);
    sharding q, k and v each gives every rank its q, k and v heads, and the attention's
    ``split(split_size)`` (set to E / tp) splits the local [.., 3E/tp] output back into them. The
    model's function is unchanged; the parameters are named ``c_attn.q/k/v.weight|bias``
    (``canonical_tensors`` fuses them back for comparison with the unsplit model)."""

    def __init__(self, fused: nn.Module, width: int) -> None:
        super().__init__()
        conv1d = type(fused)
        for i, name in enumerate(("q", "k", "v")):
            part = conv1d(width, fused.weight.shape[0])
            with torch.no_grad():
                part.weight = nn.Parameter(fused.weight[:, i * width:(i + 1) * width].clone(),
                                           requires_grad=fused.weight.requires_grad)
                part.bias = nn.Parameter(fused.bias[i * width:(i + 1) * width].clone(),
                                         requires_grad=fused.bias.requires_grad)
            self.add_module(name, part)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)


_LLAMA_LINEARS = {"self_attn.q_proj": "col", "self_attn.k_proj": "col", "self_attn.v_proj": "col",
                  "self_attn.o_proj": "row", "mlp.gate_proj": "col", "mlp.up_proj": "col", "mlp.down_proj": "row"}
_LLAMA_NORMS = ("input_layernorm", "post_attention_layernorm")
_GPT2_CONVS = {"attn.c_attn": "col", "attn.c_proj": "row", "mlp.c_fc": "col", "mlp.c_proj": "row"}
_GPT2_NORMS = ("ln_1", "ln_2")


def _has(module: nn.Module, path: str, cls) -> bool:
    try:
        return isinstance(module.get_submodule(path), cls)
    except AttributeError:
        return False


def tp_family(model: nn.Module, blocks: list[tuple[str, nn.Module]] | None = None) -> str | None:
    """Which TP plan fits the model: "llama" (transformers' Llama, Mistral, Qwen2: nn.Linear
    q/k/v/o_proj and gate/up/down_proj in every block), "gpt2" (Conv1D c_attn/c_proj/c_fc), or None."""
    blocks = find_blocks(model) if blocks is None else blocks
    conv1d = _conv1d_class()
    if all(all(_has(b, p, nn.Linear) for p in _LLAMA_LINEARS) for _, b in blocks):
        return "llama"
    if conv1d is not None and all(all(_has(b, p, (conv1d, _FusedQKV)) for p in _GPT2_CONVS) for _, b in blocks):
        return "gpt2"
    return None


def _root_paths(model: nn.Module, family: str) -> dict[str, str]:
    """Paths of the embeddings, final norm and output head TP shards outside the blocks."""
    if family == "llama":
        want = {"embed": "model.embed_tokens", "norm": "model.norm", "head": "lm_head"}
    else:
        want = {"embed": "transformer.wte", "pos": "transformer.wpe", "norm": "transformer.ln_f", "head": "lm_head"}
    # a module without parameters is left alone: a pipeline stage's stub for what another stage owns
    return {k: p for k, p in want.items()
            if _has(model, p, nn.Module) and any(True for _ in model.get_submodule(p).parameters())}


def _uncovered(model: nn.Module, covered: set[str]) -> str | None:
    """The first module with parameters of its own that the plan does not shard (a plan that left it
    alone would compute with the whole weight on every rank: TP of a model it does not fit)."""
    for path, m in model.named_modules():
        if any(True for _ in m.parameters(recurse=False)) and path not in covered:
            return path
    return None


def _check_divisible(what: str, n: int, tp: int) -> None:
    if n % tp:
        raise InputError(f"tensor parallel {tp} must divide the {what} ({n})")


def _apply_tp(model: nn.Module, blocks: list[tuple[str, nn.Module]], tp_mesh, config: ParallelConfig) -> None:
    """torchtitan's apply_tp for transformers' module names: per block q/k/v (gate/up) column-wise,
    o (down) row-wise with the output sharded on the sequence, the norms SequenceParallel; the
    embeddings row-wise, the final norm SequenceParallel, the head column-wise with its output
    sharded on the vocabulary (``Shard(-1)``) and left a DTensor for loss parallel."""
    from torch.distributed.tensor.parallel import parallelize_module

    Replicate, Shard, _, _, Colwise, PrepareInput, Rowwise, SeqPar = _styles()
    tp, sp, lp = config.tp, config.sequence_parallel, config.loss_parallel
    family = tp_family(model, blocks)
    if family is None:
        # name the first module of the first block that holds parameters (what a plan would shard)
        first, block = blocks[0]
        what = _uncovered(block, set())
        where = f"{first}.{what}" if what else first
        raise InputError(f"tensor parallel has no plan for {where} ({type(model).__name__}): TP plans cover "
                         "transformers' Llama, Mistral, Qwen2 and GPT-2; use tp=1 (FSDP and checkpointing work "
                         "on any model with repeated blocks)")
    cfg = getattr(model, "config", None)
    heads = getattr(cfg, "num_attention_heads", None)
    if heads:
        _check_divisible("attention heads", heads, tp)
    kv = getattr(cfg, "num_key_value_heads", None)
    if kv:
        _check_divisible("key/value heads", kv, tp)
    inner = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None)
    if inner:
        _check_divisible("MLP width", inner, tp)
    vocab = getattr(cfg, "vocab_size", None)
    if vocab:
        # the head's output is sharded on the vocabulary: uneven shards do not fit the model's own
        # reshape of the logits ([B, S, V / tp] per rank)
        _check_divisible("vocabulary", vocab, tp)

    # between the blocks the hidden states are a DTensor sharded on the sequence (sequence parallel)
    # or replicated. Departure from torchtitan: the embeddings, o_proj and down_proj keep their
    # output a DTensor (use_local_output=False) where torchtitan hands on local shards: transformers'
    # models build the positions and the causal mask from the embeddings' shape (a local shard has
    # seq / tp positions) and add the residual, a DTensor, to the attention's and MLP's outputs
    seq = Shard(1) if sp else Replicate()
    root = _root_paths(model, family)
    plan: dict = {}
    covered: set[str] = set()
    for key in ("embed", "pos"):
        if key in root:
            plan[root[key]] = Rowwise(input_layouts=Replicate(), output_layouts=seq, use_local_output=False)
    if "norm" in root and sp:
        plan[root["norm"]] = SeqPar()
    if "head" in root:
        plan[root["head"]] = Colwise(input_layouts=seq, output_layouts=Shard(-1) if lp else Replicate(),
                                     use_local_output=not lp)
    covered |= set(plan) | ({root["norm"]} if "norm" in root else set())

    # tied embeddings and head (GPT-2): both become Shard(0) on the vocabulary (row-wise embedding,
    # column-wise Linear head), so the tie is restored on the one DTensor after sharding
    tied = "embed" in root and "head" in root and \
        model.get_submodule(root["embed"]).weight is getattr(model.get_submodule(root["head"]), "weight", None)
    if plan:
        parallelize_module(model, tp_mesh, plan)
    if tied:
        model.get_submodule(root["head"]).weight = model.get_submodule(root["embed"]).weight

    if family == "llama":
        norms, attn, mlp = _LLAMA_NORMS, "self_attn", "mlp"
        layers = _LLAMA_LINEARS
        col, row = Colwise, Rowwise
    else:
        norms, attn, mlp = _GPT2_NORMS, "attn", "mlp"
        layers = dict(_GPT2_CONVS)
        col, row = _conv1d_styles()
    for path, block in blocks:
        bplan: dict = {}
        if family == "gpt2":
            a = block.get_submodule(attn)
            if not isinstance(a.c_attn, _FusedQKV):
                width = a.c_attn.weight.shape[1] // 3
                a.c_attn = _FusedQKV(a.c_attn, width)
            # the attention splits c_attn's output in three of split_size columns and views q, k, v
            # with -1 heads of head_dim (transformers 5.x): per rank E / tp columns, heads / tp heads
            a.split_size = a.split_size // tp
            a.num_heads = a.num_heads // tp
            layers = {k: v for k, v in _GPT2_CONVS.items() if k != "attn.c_attn"}
            for part in ("q", "k", "v"):
                layers[f"attn.c_attn.{part}"] = "col"
        for name, kind in layers.items():
            if kind == "col":
                bplan[name] = col()
            else:
                bplan[name] = row(output_layouts=seq, use_local_output=False)
        if sp:
            for n in norms:
                bplan[n] = SeqPar()
            # transformers call the attention with hidden_states as a keyword (Llama) or first
            # argument (GPT-2), the MLP with it first: gathered from the sequence shards here
            if family == "llama":
                bplan[attn] = PrepareInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                           desired_input_kwarg_layouts={"hidden_states": Replicate()})
            else:
                bplan[attn] = PrepareInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            bplan[mlp] = PrepareInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        gap = _uncovered(block, set(bplan) | set(norms))
        if gap is not None:
            raise InputError(f"tensor parallel has no plan for {path}.{gap} "
                             f"({type(block.get_submodule(gap)).__name__}): the {family} plan covers "
                             f"{', '.join(sorted(set(layers) | set(norms)))}")
        if family == "llama":
            a = block.get_submodule(attn)
            # transformers 5.x views q, k, v as (*input_shape, -1, head_dim): the head count follows
            # from the local width, nothing to change; kept consistent where a model stores them
            for name in ("num_heads", "num_key_value_heads"):
                if isinstance(getattr(a, name, None), int):
                    setattr(a, name, getattr(a, name) // tp)
        parallelize_module(block, tp_mesh, bplan)
    gap = _uncovered(model, covered | {p for p, _ in model.named_modules()
                                       if any(p == b or p.startswith(b + ".") for b, _ in blocks)})
    if gap is not None:
        raise InputError(f"tensor parallel has no plan for {gap} ({type(model.get_submodule(gap)).__name__}), "
                         f"outside the blocks of {type(model).__name__}")


# ---- activation checkpointing ------------------------------------------------------------------------

def _sac_context_fn(save_ops: set) -> Callable:
    """torchtitan's ``_apply_op_sac`` policy: the outputs of the ops in ``save_ops`` are saved, except
    every second ``mm`` (counted separately in the forward and the recompute, so both choose the same
    ones), and a CUDA-to-CPU copy; everything else is recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    mm = torch.ops.aten.mm.default
    to_copy = torch.ops.aten._to_copy.default

    def context_fn():
        meta: dict = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            if func == to_copy and args and "cuda" in str(args[0].device) and str(kwargs.get("device")) == "cpu":
                return CheckpointPolicy.MUST_SAVE
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == mm:
                meta[key] += 1
            save = func in save_ops and not (func == mm and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


def _apply_ac(model: nn.Module, blocks: list[tuple[str, nn.Module]], config: ParallelConfig) -> list:
    """Each chosen block replaced by torch's checkpoint_wrapper of it (non-reentrant, as torchtitan:
    preserve_rng_state True, early_stop False). ``selective-layer``: torchtitan counts blocks from 1
    and wraps those whose count is a multiple of ``ac_every`` (blocks K-1, 2K-1, ... from 0)."""
    out = []
    if config.ac == "selective-layer" and config.ac_every > len(blocks):
        raise InputError(f"selective-layer:{config.ac_every} checkpoints every {config.ac_every}th block, and the "
                         f"model has {len(blocks)}: none would be (use a smaller K, or full)")
    save_ops = _compat.sac_save_ops() if config.ac == "selective-op" else None
    for i, (path, block) in enumerate(blocks):
        wrap = config.ac in ("full", "selective-op") or (config.ac == "selective-layer" and (i + 1) % config.ac_every == 0)
        if wrap:
            kwargs = {"preserve_rng_state": True, "early_stop": False}
            if save_ops is not None:
                kwargs["context_fn"] = _sac_context_fn(save_ops)
            wrapped = _compat.checkpoint_wrapper(block, **kwargs)
            parent, leaf = _parent(model, path)
            parent.register_module(leaf, wrapped)
            block = wrapped
        out.append((path, block))
    return out


# ---- FSDP2 -------------------------------------------------------------------------------------------

def _apply_fsdp(model: nn.Module, blocks: list[tuple[str, nn.Module]], dp_mesh, config: ParallelConfig) -> None:
    """fully_shard on every block, then on the root (torchtitan's apply_fsdp without its separate
    groups for the embeddings and for norm + head: those stay in the root's group, which also holds
    tied embeddings, as FSDP2 allows a parameter in one group only). The root is not resharded after
    the forward (torchtitan: its parameters are needed first in the backward)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    kwargs: dict = {"mesh": dp_mesh}
    if config.mixed_precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    # pinned host memory needs an accelerator: a CPU rank's offload (a no-op there) pins nothing
    kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=dp_mesh.device_type != "cpu") if config.offload \
        else OffloadPolicy()
    for _, block in blocks:
        fully_shard(block, reshard_after_forward=config.reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)


# ---- the entry point ---------------------------------------------------------------------------------

def parallelize(model: nn.Module, config: ParallelConfig, mesh, *, blocks: list | None = None,
                tp_root: str = "") -> nn.Module:
    """Apply ``config`` to ``model`` in place, in torchtitan's order: 1) tensor parallel on the
    ``tp`` mesh dimension, 2) activation checkpointing per block, 3) FSDP2 on the data-parallel
    dimensions (``dp_shard``, or ``(dp_replicate, dp_shard)`` for HSDP). With one rank
    (``config.world == 1``) nothing is done. Returns the model.

    A pipeline stage (planning/simulate/pipeline_rank.py) is parallelized with a configuration whose ``pp`` is 1 on
    the mesh without its ``pp`` dimension: ``blocks`` are then the stage's own (path, module) pairs
    (default: ``find_blocks(model)``), and ``tp_root`` the path, inside ``model``, of the model the
    TP plans name (a stage module wraps it); FSDP's root is ``model`` itself."""
    if not isinstance(config, ParallelConfig):
        raise InputError(f"parallelize takes a ParallelConfig, got {type(config).__name__}")
    if config.world == 1:
        return model
    if mesh is None:
        raise InputError(f"{config.label()} needs a device mesh (build_mesh)")
    if config.pp > 1:
        raise InputError("parallelize does not split pipeline stages (pp > 1): the stages come from "
                         "layerscope's pipeline split, each parallelized on its own mesh without pp")
    blocks = find_blocks(model) if blocks is None else list(blocks)
    names = mesh.mesh_dim_names or ()
    if config.tp > 1:
        inner, cut = (model.get_submodule(tp_root), len(tp_root) + 1) if tp_root else (model, 0)
        _apply_tp(inner, [(p[cut:], m) for p, m in blocks], mesh["tp"], config)
    if config.ac != "none":
        blocks = _apply_ac(model, blocks, config)
    dp_mesh = _dp_mesh(mesh) if any(n in names for n in ("dp_replicate", "dp_shard")) else None
    if dp_mesh is not None:
        _apply_fsdp(model, blocks, dp_mesh, config)
    return model


def checkpoint_blocks(model: nn.Module, config: ParallelConfig, blocks: list | None = None) -> nn.Module:
    """Only the activation checkpointing of ``config`` (its ``ac``), in place: what one device runs when
    every degree is 1 (or a pipeline stage's ``blocks`` when only ``pp`` > 1)."""
    if config.ac != "none":
        _apply_ac(model, find_blocks(model) if blocks is None else list(blocks), config)
    return model


def loss_context(config: ParallelConfig):
    """torch's ``loss_parallel()`` (cross-entropy on logits sharded on the vocabulary, no gather)
    when tensor parallel shards the head's output (``tp > 1`` and ``loss_parallel``), else a
    context that does nothing. The loss and its backward both run inside it."""
    if config.tp > 1 and config.loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel
        return loss_parallel()
    return contextlib.nullcontext()


def amp_context(config: ParallelConfig, device_type: str):
    """bf16 compute without FSDP (no data parallelism to carry a MixedPrecisionPolicy): torch.autocast,
    as torchtitan's ``maybe_enable_amp`` does; with FSDP (or ``mixed_precision="off"``) nothing."""
    if config.mixed_precision == "bf16" and config.dp == 1 and config.world > 1:
        return torch.autocast(device_type, dtype=config.param_dtype)
    return contextlib.nullcontext()


def no_kv_cache(model: nn.Module) -> bool:
    """No KV cache in training (transformers' models build one when ``config.use_cache``; a checkpointed
    block's recompute would then find the forward's keys in it and run other ops). True if it was on."""
    cfg = getattr(model, "config", None)
    if cfg is not None and getattr(cfg, "use_cache", False):
        cfg.use_cache = False
        return True
    return False


# ---- names -------------------------------------------------------------------------------------------

def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (torch's ``to_local_if_dtensor``), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def canonical_name(name: str) -> str:
    """A parameter's (or module's) name in the unwrapped model (checkpoint_wrapper's level removed)."""
    prefix = _compat.checkpoint_prefix()
    return name.replace(prefix, "").removesuffix("." + prefix.rstrip("."))


def canonical_tensors(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full tensors named as in the unparallelized model: checkpoint_wrapper's prefix removed, GPT-2's
    split ``c_attn.q/k/v`` fused back (weight on dim 1, bias on dim 0, q k v order)."""
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict] = defaultdict(dict)
    for name, t in named.items():
        name = canonical_name(name)
        head, _, leaf = name.rpartition(".")
        base, _, part = head.rpartition(".")
        if part in ("q", "k", "v") and base.endswith("c_attn"):
            parts[f"{base}.{leaf}"][part] = t
        else:
            out[name] = t
    for name, p in parts.items():
        out[name] = torch.cat([p["q"], p["k"], p["v"]], dim=1 if name.endswith("weight") else 0)
    return out
