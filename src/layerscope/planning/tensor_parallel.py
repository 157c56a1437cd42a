"""Tensor parallel applied with torch's ``parallelize_module``, as torchtitan's ``apply_tp`` does it
(planning/apply.py's docstring): the plan derived from the model's config's ``base_model_tp_plan``
(planning/tp_plans.py) where transformers ships one that names the blocks, else a hand-written one, and the
one-line refusal of any module no plan covers.

The hand-written plans are kept where a derived one cannot do their work: GPT-2 (no ``base_model_tp_plan``;
its ``Conv1D`` layers, which torch's styles refuse, and its fused ``c_attn``, whose column-wise split would
give one rank all of q's heads and none of v's: ``_FusedQKV`` re-lays it per head) and Llama-shaped blocks
whose config ships no plan (``q/k/v/o_proj``, ``gate/up/down_proj``: StableLM, a user's own modules named
as Llama's)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import nn

from ..errors import InputError
from .config import ParallelConfig
from .blocks import find_blocks
from .tp_plans import DerivedPlan, block_plan, derive_plan

__all__ = ["tp_family", "tp_plan_label"]


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


def _root_paths(model: nn.Module, family: str, blocks: list) -> dict[str, str]:
    """Paths of the embeddings, final norm and output head TP shards outside the blocks."""
    if family == "derived":
        want = _derived_root(model, blocks)
    elif family == "llama":
        want = {"embed": "model.embed_tokens", "norm": "model.norm", "head": "lm_head"}
    else:
        want = {"embed": "transformer.wte", "pos": "transformer.wpe", "norm": "transformer.ln_f", "head": "lm_head"}
    # a module without parameters is left alone: a pipeline stage's stub for what another stage owns
    return {k: p for k, p in want.items()
            if _has(model, p, nn.Module) and any(True for _ in model.get_submodule(p).parameters())}


def _derived_root(model: nn.Module, blocks: list[tuple[str, nn.Module]]) -> dict[str, str]:
    """A derived plan's paths outside the blocks: the input embeddings, the output head (transformers'
    get_input/output_embeddings) and the final norm (the one module of 1-D parameters outside the blocks)."""
    paths = {id(m): p for p, m in model.named_modules()}
    want = {}
    for key, get in (("embed", "get_input_embeddings"), ("head", "get_output_embeddings")):
        try:
            m = getattr(model, get)()
        except (AttributeError, NotImplementedError):
            m = None
        if m is not None and id(m) in paths:
            want[key] = paths[id(m)]
    inside = {p for p, _ in blocks}
    norms = [p for p, m in model.named_modules()
             if p and not any(p == b or p.startswith(b + ".") for b in inside) and p not in want.values()
             and list(m.parameters(recurse=False)) and all(x.ndim == 1 for x in m.parameters())]
    if len(norms) == 1:
        want["norm"] = norms[0]
    return want


def tp_plan_label(model: nn.Module, ep: int = 1) -> str | None:
    """Which TP plan ``model`` gets (what the plan says it applied): "derived from <Config>.base_model_tp_plan",
    "hand-written for Llama-like blocks", "hand-written for GPT-2", or None (no plan: TP refused)."""
    try:
        blocks = find_blocks(model)
        derived = derive_plan(model, blocks, ep)
    except InputError:
        return None
    if derived is not None:
        return derived.label
    family = tp_family(model, blocks)
    return {"llama": "hand-written for Llama-like blocks", "gpt2": "hand-written for GPT-2"}.get(family)


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


@dataclass(frozen=True)
class _TpLayout:
    """What every part of one model's TP plan shares: the model's family, the mesh, the degree, the
    switches and the placement classes (torch's styles; the family's column/row-wise ones)."""

    family: str               # "derived", "llama" or "gpt2"
    mesh: object
    tp: int
    sp: bool                  # sequence parallel
    lp: bool                  # loss parallel
    styles: tuple             # _styles()
    seq: object               # the hidden states' placement between the blocks
    col: type
    row: type
    derived: DerivedPlan | None = None


def _refuse_unplanned(model: nn.Module, blocks: list[tuple[str, nn.Module]]) -> None:
    """No TP plan for the model: name the first module of the first block that holds parameters (what a
    plan would shard)."""
    first, block = blocks[0]
    what = _uncovered(block, set())
    where = f"{first}.{what}" if what else first
    raise InputError(f"tensor parallel has no plan for {where} ({type(model).__name__}): TP plans come from the "
                     "config's base_model_tp_plan (transformers), or are the hand-written Llama-like and GPT-2 ones; "
                     "use tp=1 (FSDP and checkpointing work on any model with repeated blocks)")


def _check_widths(model: nn.Module, tp: int) -> None:
    """``tp`` divides the heads, key/value heads, MLP width and vocabulary the model's config states."""
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
    moe = getattr(cfg, "moe_intermediate_size", None)
    if isinstance(moe, int) and moe:
        _check_divisible("experts' MLP width", moe, tp)
    vocab = getattr(cfg, "vocab_size", None)
    if vocab:
        # the head's output is sharded on the vocabulary: uneven shards do not fit the model's own
        # reshape of the logits ([B, S, V / tp] per rank)
        _check_divisible("vocabulary", vocab, tp)


def _parallelize_root(model: nn.Module, lay: _TpLayout, blocks: list) -> set[str]:
    """The embeddings row-wise, the final norm SequenceParallel, the head column-wise (its tie to the
    embeddings restored); returns the paths the plan covers outside the blocks."""
    from torch.distributed.tensor.parallel import parallelize_module

    Replicate, Shard, _, _, Colwise, _, Rowwise, SeqPar = lay.styles
    seq = lay.seq
    root = _root_paths(model, lay.family, blocks)
    plan: dict = {}
    for key in ("embed", "pos"):
        if key in root:
            plan[root[key]] = Rowwise(input_layouts=Replicate(), output_layouts=seq, use_local_output=False)
    if "norm" in root and lay.sp:
        plan[root["norm"]] = SeqPar()
    if "head" in root:
        plan[root["head"]] = Colwise(input_layouts=seq, output_layouts=Shard(-1) if lay.lp else Replicate(),
                                     use_local_output=not lay.lp)
    covered = set(plan) | ({root["norm"]} if "norm" in root else set())

    # tied embeddings and head (GPT-2): both become Shard(0) on the vocabulary (row-wise embedding,
    # column-wise Linear head), so the tie is restored on the one DTensor after sharding
    tied = "embed" in root and "head" in root and \
        model.get_submodule(root["embed"]).weight is getattr(model.get_submodule(root["head"]), "weight", None)
    if plan:
        parallelize_module(model, lay.mesh, plan)
    if tied:
        model.get_submodule(root["head"]).weight = model.get_submodule(root["embed"]).weight
    return covered


def _gpt2_layers(attn: nn.Module, tp: int) -> dict[str, str]:
    """GPT-2's attention re-laid for TP (c_attn split into q, k, v; the split and heads per rank); its
    block's layers and their styles."""
    if not isinstance(attn.c_attn, _FusedQKV):
        width = attn.c_attn.weight.shape[1] // 3
        attn.c_attn = _FusedQKV(attn.c_attn, width)
    # the attention splits c_attn's output in three of split_size columns and views q, k, v
    # with -1 heads of head_dim (transformers 5.x): per rank E / tp columns, heads / tp heads
    attn.split_size = attn.split_size // tp
    attn.num_heads = attn.num_heads // tp
    layers = {k: v for k, v in _GPT2_CONVS.items() if k != "attn.c_attn"}
    for part in ("q", "k", "v"):
        layers[f"attn.c_attn.{part}"] = "col"
    return layers


def _parallelize_block(path: str, block: nn.Module, lay: _TpLayout) -> None:
    """One block: its linears column- or row-wise, with sequence parallel its norms SequenceParallel and
    the attention's and MLP's inputs gathered; refused where the plan leaves a module with parameters."""
    from torch.distributed.tensor.parallel import parallelize_module

    Replicate, Shard, _, _, _, PrepareInput, _, SeqPar = lay.styles
    if lay.family == "derived":
        bplan, _norms, split = block_plan(path, block, lay.derived, lay)
        for parent in split:
            _split_heads(block.get_submodule(parent) if parent else block, lay.tp)
        parallelize_module(block, lay.mesh, bplan)
        return
    if lay.family == "llama":
        norms, attn, mlp = _LLAMA_NORMS, "self_attn", "mlp"
        layers = _LLAMA_LINEARS
    else:
        norms, attn, mlp = _GPT2_NORMS, "attn", "mlp"
        layers = _gpt2_layers(block.get_submodule(attn), lay.tp)
    bplan: dict = {}
    for name, kind in layers.items():
        if kind == "col":
            bplan[name] = lay.col()
        else:
            bplan[name] = lay.row(output_layouts=lay.seq, use_local_output=False)
    if lay.sp:
        for n in norms:
            bplan[n] = SeqPar()
        # transformers call the attention with hidden_states as a keyword (Llama) or first
        # argument (GPT-2), the MLP with it first: gathered from the sequence shards here
        if lay.family == "llama":
            bplan[attn] = PrepareInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                       desired_input_kwarg_layouts={"hidden_states": Replicate()})
        else:
            bplan[attn] = PrepareInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        bplan[mlp] = PrepareInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    gap = _uncovered(block, set(bplan) | set(norms))
    if gap is not None:
        raise InputError(f"tensor parallel has no plan for {path}.{gap} "
                         f"({type(block.get_submodule(gap)).__name__}): the {lay.family} plan covers "
                         f"{', '.join(sorted(set(layers) | set(norms)))}")
    if lay.family == "llama":
        _split_heads(block.get_submodule(attn), lay.tp)
    parallelize_module(block, lay.mesh, bplan)


def _split_heads(module: nn.Module, tp: int) -> None:
    """transformers 5.x views q, k, v as (*input_shape, -1, head_dim): the head count follows from the
    local width, nothing to change; kept consistent where an attention stores them."""
    for m in module.modules():
        for name in ("num_heads", "num_key_value_heads"):
            if isinstance(getattr(m, name, None), int):
                setattr(m, name, getattr(m, name) // tp)


def _apply_tp(model: nn.Module, blocks: list[tuple[str, nn.Module]], tp_mesh, config: ParallelConfig) -> None:
    """torchtitan's apply_tp for transformers' module names: per block q/k/v (gate/up) column-wise,
    o (down) row-wise with the output sharded on the sequence, the norms SequenceParallel; the
    embeddings row-wise, the final norm SequenceParallel, the head column-wise with its output
    sharded on the vocabulary (``Shard(-1)``) and left a DTensor for loss parallel."""
    styles = _styles()
    Replicate, Shard, _, _, Colwise, _, Rowwise, _ = styles
    tp, sp, lp = config.tp, config.sequence_parallel, config.loss_parallel
    derived = derive_plan(model, blocks, config.ep)
    family = "derived" if derived is not None else tp_family(model, blocks)
    if family is None:
        _refuse_unplanned(model, blocks)
    _check_widths(model, tp)

    # between the blocks the hidden states are a DTensor sharded on the sequence (sequence parallel)
    # or replicated. Departure from torchtitan: the embeddings, o_proj and down_proj keep their
    # output a DTensor (use_local_output=False) where torchtitan hands on local shards: transformers'
    # models build the positions and the causal mask from the embeddings' shape (a local shard has
    # seq / tp positions) and add the residual, a DTensor, to the attention's and MLP's outputs
    seq = Shard(1) if sp else Replicate()
    lay = _TpLayout(family, tp_mesh, tp, sp, lp, styles, seq, Colwise, Rowwise, derived)
    covered = _parallelize_root(model, lay, blocks)
    if family == "gpt2":      # transformers' Conv1D: torch's styles take nn.Linear and nn.Embedding only
        col, row = _conv1d_styles()
        lay = replace(lay, col=col, row=row)
    for path, block in blocks:
        _parallelize_block(path, block, lay)
    gap = _uncovered(model, covered | {p for p, _ in model.named_modules()
                                       if any(p == b or p.startswith(b + ".") for b, _ in blocks)})
    if gap is not None:
        raise InputError(f"tensor parallel has no plan for {gap} ({type(model.get_submodule(gap)).__name__}), "
                         f"outside the blocks of {type(model).__name__}")
