"""Where a model's routed experts are, found from its structure alone (no class or attribute names): the
expert dimension the search (planning/search/) enumerates and expert parallel (planning/expert_parallel.py)
shards.

A mixture-of-experts block holds a router and its routed experts side by side:

* the experts as 3-D weights, one slice an expert (transformers 5's ``...Experts`` modules: Mixtral,
  Qwen3-MoE, DeepSeek-V3, gpt-oss store ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``): a module
  with at least two 3-D parameters sharing their first dimension ``E``;
* or as a ``ModuleList`` of ``E`` modules alike (the same type, the same parameter names and shapes), each
  one expert (the layout of transformers 4's Mixtral and of most hand-written MoEs);

and the router: a parameter of the block outside the experts whose first dimension is ``E`` and that is
2-D (a ``Linear(H, E)``'s weight, or a bare ``[E, H]`` weight as DeepSeek-V3's ``TopkRouter`` holds). The
router is what tells experts from look-alikes: a 1-D convolution's 3-D weight, or a ModuleList of
transformer blocks, has no sibling ``[E, H]`` weight. Shared experts (DeepSeek-V3's ``shared_experts``)
are a plain MLP beside the routed ones: they are not routed and not counted.

The number of experts each token goes to (top-k) is not in the structure: ``experts_per_token`` reads it
from the model's config where transformers names it, and says None where it cannot."""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from torch import nn

__all__ = ["ExpertGroup", "find_experts", "routed_experts", "experts_per_token", "expert_numel"]

# the names transformers' configs give the top-k (DeepSeek-V3, Qwen3-MoE, Mixtral: num_experts_per_tok;
# gpt-oss: num_experts_per_tok as well, experts_per_token in its original config; Switch: none, top-1)
_TOP_K = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk", "top_k")


@dataclass(frozen=True)
class ExpertGroup:
    """One MoE block's routed experts."""

    path: str          # the module holding the experts (3-D weights, or the ModuleList)
    block: str         # the MoE block holding them and the router (their parent)
    router: str        # the router's [E, H] weight, by its full name
    experts: int       # routed experts E
    numel: int         # elements of the routed experts' parameters (all E of them)


def _router(block: nn.Module, block_path: str, experts: nn.Module, count: int) -> str | None:
    """The name of a 2-D parameter of ``block`` outside ``experts`` whose first dimension is ``count``."""
    inside = {id(p) for p in experts.parameters()}
    for name, p in block.named_parameters():
        if id(p) not in inside and p.dim() == 2 and p.shape[0] == count:
            return f"{block_path}.{name}" if block_path else name
    return None


def _three_d(module: nn.Module) -> int | None:
    """E where ``module``'s own parameters hold at least two 3-D weights of first dimension E."""
    firsts = [p.shape[0] for p in module.parameters(recurse=False) if p.dim() == 3]
    if len(firsts) >= 2 and len(set(firsts)) == 1 and firsts[0] > 1:
        return int(firsts[0])
    return None


def _alike_list(module: nn.Module) -> int | None:
    """E where ``module`` is a ModuleList of E > 1 modules alike (type, parameter names and shapes)."""
    if not isinstance(module, nn.ModuleList) or len(module) < 2:
        return None
    first = [(n, tuple(p.shape)) for n, p in module[0].named_parameters()]
    if not first:
        return None
    for m in module:
        if type(m) is not type(module[0]) or [(n, tuple(p.shape)) for n, p in m.named_parameters()] != first:
            return None
    return len(module)


def find_experts(model: nn.Module) -> list[ExpertGroup]:
    """Every MoE block's routed experts (module docstring), in module order; [] for a dense model."""
    out: list[ExpertGroup] = []
    taken: list[str] = []
    for block_path, block in model.named_modules():
        for name, child in block.named_children():
            path = f"{block_path}.{name}" if block_path else name
            if any(path == t or path.startswith(t + ".") for t in taken):
                continue
            count = _three_d(child) or _alike_list(child)
            if count is None:
                continue
            router = _router(block, block_path, child, count)
            if router is None:
                continue
            numel = sum(p.numel() for p in {id(p): p for p in child.parameters()}.values())
            out.append(ExpertGroup(path, block_path, router, count, numel))
            taken.append(path)
    return out


def routed_experts(model: nn.Module) -> int | None:
    """The routed-expert count every MoE block's experts divide into: their greatest common divisor (the
    one count where every MoE block has the same, as in every model transformers ships); None for a dense
    model. Expert parallel's degree must divide it."""
    counts = [g.experts for g in find_experts(model)]
    if not counts:
        return None
    out = 0
    for c in counts:
        out = gcd(out, c)
    return out


def expert_numel(model: nn.Module) -> int:
    """Elements of every routed expert's parameters (a parameter shared between groups once)."""
    seen: dict[int, int] = {}
    for g in find_experts(model):
        for p in model.get_submodule(g.path).parameters():
            seen[id(p)] = p.numel()
    return sum(seen.values())


def experts_per_token(model: nn.Module) -> int | None:
    """The experts each token is routed to (top-k), from the model's config where transformers names it;
    None where it does not (the structure does not say)."""
    cfg = getattr(model, "config", None)
    for name in _TOP_K:
        v = getattr(cfg, name, None) if cfg is not None else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None
