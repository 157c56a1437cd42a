"""Tensor-parallel plans derived from a transformers config's ``base_model_tp_plan`` (transformers 5.24: 166
config classes have one), each entry mapped onto a torch ParallelStyle applied by ``parallelize_module``:

=============================================  ==============================================================
transformers' style                            torch style here
=============================================  ==============================================================
``colwise`` (nn.Linear)                        ``ColwiseParallel()``: local output sharded on its features
``colwise_gather_output``, ``colwise_rep``     ``ColwiseParallel(output_layouts=Replicate())``
``rowwise`` (nn.Linear)                        ``RowwiseParallel(output_layouts=<the residual stream's>)``
``rowwise_split_input``, ``rowwise_rep``       the same with ``input_layouts=Replicate()``
``replicated_with_grad_allreduce``             ``LocalParams(partial_grad=True)`` (tp_styles.py)
``moe_tp_experts`` + ``packed_colwise`` /      ``ExpertsTP`` on the experts, ``LocalBlock`` on the MoE block,
``rowwise`` on its 3-D parameters              ``LocalParams()`` on its router
``embedding_rowwise``                          the embeddings row-wise, as every plan here shards them
=============================================  ==============================================================

What a plan does not name is what transformers leaves replicated: here the block's norms on the residual
stream (``SequenceParallel`` under sequence parallel, as torchtitan's Llama plan), a MoE block's router
and the 1-D-parameter modules (norms) inside an attention whose projections gather their output (Olmo2's
``q_norm``): ``LocalParams``. Any other module with parameters the plan leaves whole (a Linear: what TP
exists to shard; a norm reading heads a ``colwise`` projection split) is refused in one line naming it."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..errors import InputError

__all__ = ["DerivedPlan", "derive_plan", "tp_plan_of", "block_plan"]

_COL = ("colwise", "colwise_gather_output", "colwise_rep")
_ROW = ("rowwise", "rowwise_split_input", "rowwise_rep")
_EXPERT_PARAMS = ("packed_colwise", "rowwise")
_STYLES = (*_COL, *_ROW, "replicated_with_grad_allreduce", "moe_tp_experts", "packed_colwise")


@dataclass(frozen=True)
class DerivedPlan:
    """One model's plan: ``source`` (``"Qwen3Config.base_model_tp_plan"``), the entries inside a block
    (path in the block, transformers' style) in the plan's order, and the experts left to expert
    parallel (``ep`` > 1: their paths in a block)."""

    source: str
    block: tuple[tuple[str, str], ...]
    left_to_ep: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"derived from {self.source}"


def tp_plan_of(model: nn.Module) -> tuple[str, dict] | None:
    """(where it comes from, the plan) of the model's config, or of its text config (a multimodal
    model's language part); None without one."""
    cfg = getattr(model, "config", None)
    for c in (cfg, getattr(cfg, "get_text_config", lambda: None)()):
        plan = getattr(c, "base_model_tp_plan", None)
        if plan:
            return f"{type(c).__name__}.base_model_tp_plan", dict(plan)
    return None


def derive_plan(model: nn.Module, blocks: list[tuple[str, nn.Module]], ep: int = 1) -> DerivedPlan | None:
    """The plan of ``model``'s config that names its ``blocks`` (``"layers.*.X"`` where the blocks are
    ``...layers.N``), or None (no plan, or none of its entries names the blocks). A style this mapping
    does not know -> InputError naming the entry."""
    found = tp_plan_of(model)
    if found is None or not blocks:
        return None
    source, plan = found
    # the blocks may sit in several lists (HRM's L_module.layers and H_module.layers): each list's entries
    per = {c: _entries(source, plan, c) for c in dict.fromkeys(p.rsplit(".", 1)[0] if "." in p else "" for p, _ in blocks)}
    entries = next(iter(per.values()))
    if any(e != entries for e in per.values()):
        if not all(per.values()):
            return None
        raise InputError(f"tensor parallel: {source} gives the repeated blocks of {', '.join(per)} different plans, "
                         "which layerscope's derived plans do not apply")
    if not entries:
        return None
    left: tuple[str, ...] = ()
    if ep > 1:
        # expert parallel owns the routed experts (planning/expert_parallel.py): their TP entries (the
        # experts module and its parameters) are left out here, and the experts are not refused as uncovered
        left = tuple(p for p, s in entries if s == "moe_tp_experts")
        entries = [(p, s) for p, s in entries if not any(p == e or p.startswith(e + ".") for e in left)]
    return DerivedPlan(source, tuple(entries), left)


def _entries(source: str, plan: dict, container: str) -> list[tuple[str, str]]:
    """The plan's entries that name the blocks of ``container`` (``"layers.*.X"`` where the blocks are
    ``...layers.N``): (X, style) in the plan's order."""
    entries: list[tuple[str, str]] = []
    for key, style in plan.items():
        if ".*." not in key:
            if style == "embedding_rowwise":
                continue          # the embeddings are sharded on the vocabulary by every plan here
            raise InputError(f"tensor parallel: {source} names {key!r} ({style}) outside the repeated blocks, which "
                             "layerscope's derived plans do not shard")
        prefix, rest = key.split(".*.", 1)
        if container != prefix and not container.endswith("." + prefix):
            continue
        if style not in _STYLES:
            raise InputError(f"tensor parallel: {source} gives {key!r} the style {style!r}, which layerscope does not "
                             f"map onto torch's parallel styles (it maps {', '.join(_STYLES)})")
        entries.append((rest, style))
    return entries


def _kind(block: nn.Module, path: str) -> str | None:
    """"module", "param" (a parameter of a module in the block) or None (not in this block)."""
    try:
        block.get_submodule(path)
        return "module"
    except AttributeError:
        pass
    owner, _, name = path.rpartition(".")
    try:
        return "param" if name in block.get_submodule(owner)._parameters else None
    except AttributeError:
        return None


def _own_params(m: nn.Module) -> list:
    return [p for p in m.parameters(recurse=False)]


def _is_router(m: nn.Module, experts: nn.Module) -> bool:
    """A MoE block's router: one weight of [experts, hidden] (a bias or score correction beside it)."""
    n = next((p.shape[0] for name, p in experts.named_parameters(recurse=False) if p.ndim == 3), None)
    w = getattr(m, "weight", None)
    return n is not None and w is not None and w.ndim == 2 and w.shape[0] == n


@dataclass
class _BlockPlan:
    """A block's torch plan as it is built: ``styles`` (path -> torch style) and what the plan covers."""

    styles: dict
    covered: set
    split_parents: set = field(default_factory=set)    # modules holding a colwise projection (split heads)


def _entry_styles(block: nn.Module, derived: DerivedPlan, lay, where: str) -> _BlockPlan:
    Replicate, _, _, _, Colwise, _, Rowwise, _ = lay.styles
    from .tp_styles import tp_styles
    _, Local, Experts, _ = tp_styles()
    bp = _BlockPlan({}, set())
    params = [(p, s) for p, s in derived.block if _kind(block, p) == "param"]
    for path, style in derived.block:
        kind = _kind(block, path)
        if kind != "module":
            continue
        mod = block.get_submodule(path)
        if style in _COL + _ROW and not isinstance(mod, nn.Linear):
            raise InputError(f"tensor parallel: {derived.source} makes {where}.{path} ({type(mod).__name__}) {style}, "
                             "which torch's styles apply to nn.Linear only")
        if style == "colwise":
            bp.styles[path] = Colwise()
            bp.split_parents.add(path.rpartition(".")[0])
        elif style in _COL:
            bp.styles[path] = Colwise(output_layouts=Replicate())
        elif style == "rowwise":
            bp.styles[path] = Rowwise(output_layouts=lay.seq, use_local_output=False)
        elif style in _ROW:
            bp.styles[path] = Rowwise(input_layouts=Replicate(), output_layouts=lay.seq, use_local_output=False)
        elif style == "replicated_with_grad_allreduce":
            bp.styles[path] = Local(partial_grad=True)
        else:     # moe_tp_experts: its parameters' entries say how each is split
            mine = {p[len(path) + 1:]: s for p, s in params if p.startswith(path + ".")}
            bad = [n for n, _ in mod.named_parameters(recurse=False) if mine.get(n) not in _EXPERT_PARAMS]
            if bad:
                raise InputError(f"tensor parallel: {derived.source} gives {where}.{path}.{bad[0]} no packed_colwise "
                                 "or rowwise entry, which its experts' tensor parallel needs")
            bp.styles[path] = Experts(mine)
        bp.covered.add(path)
    return bp


def _leftovers(block: nn.Module, bp: _BlockPlan, derived: DerivedPlan, lay, where: str) -> list[str]:
    """What the plan leaves whole: the block's own norms (returned), a MoE block's router and the norms
    of a gathering attention (replicated, LocalParams); anything else -> InputError naming it."""
    from .tp_styles import tp_styles
    Gather, Local, _, LocalBlock = tp_styles()
    covered = bp.covered | set(derived.left_to_ep)
    experts = {p.rpartition(".")[0]: p for p, s in derived.block if s == "moe_tp_experts" and p in bp.covered}
    experts.update({p.rpartition(".")[0]: p for p in derived.left_to_ep if _kind(block, p) == "module"})
    norms: list[str] = []
    for path, m in block.named_modules():
        if not path or not _own_params(m) or any(path == c or path.startswith(c + ".") for c in covered):
            continue
        parent = path.rpartition(".")[0]
        # a norm-like module: 1-D parameters only, none below it (a module holding projections as well, as
        # Qwen3.5's linear attention, is not one: its own parameters would be replicated beside sharded ones)
        leaf_1d = all(p.ndim == 1 for p in m.parameters())
        if "." not in path and leaf_1d:
            norms.append(path)           # on the residual stream: SequenceParallel, or left as is
        elif parent in experts and _is_router(m, block.get_submodule(experts[parent])):
            bp.styles[path] = Local()
        elif leaf_1d and parent not in bp.split_parents:
            bp.styles[path] = Local()
        else:
            raise InputError(f"tensor parallel: {derived.source} leaves the parameters of {where}.{path} "
                             f"({type(m).__name__}) unsharded, and layerscope does not replicate them (they would be "
                             "computed whole on every rank, or normalise heads a colwise projection split); use tp=1 "
                             "for this model")
        covered.add(path)
    for parent in experts:
        bp.styles[parent] = LocalBlock(lay.seq)
    if lay.sp:
        for top in sorted({p.split(".", 1)[0] for p in bp.styles} - set(norms)):
            if top not in bp.styles:
                bp.styles[top] = Gather(lay.seq)
    return norms


def block_plan(path: str, block: nn.Module, derived: DerivedPlan, lay) -> tuple[dict, list[str], list[str]]:
    """The torch plan of one block (path in the block -> style), its residual-stream norms (SequenceParallel
    under sequence parallel, else left as the hand-written plans leave them), and the modules whose colwise
    projections split their heads (the caller divides the head counts an attention stores)."""
    bp = _entry_styles(block, derived, lay, path)
    norms = _leftovers(block, bp, derived, lay, path)
    if lay.sp:
        SeqPar = lay.styles[7]
        for n in norms:
            bp.styles[n] = SeqPar()
    return bp.styles, norms, sorted(bp.split_parents)
