"""parallel(..., search=True): the search (planning/search/space.py) run from parallel()'s validated inputs, and
its report: the chosen plan as parallel() shows one, the ranked candidates and why each family lost."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from torch import nn

from ..capture.inputs import iter_tensors
from ..capture.notes import Note
from ..errors import InputError
from ..planning.expert_parallel import ep_notes
from ..planning.search.candidates import BLOCKS, SearchResult, family_of, label
from ..planning.search.space import SearchTask, search
from ..reports.parallel import ParallelReport

__all__ = ["search_report", "SEARCHED"]

# the fields the search varies unless held; every other ParallelConfig field is the same for all candidates
SEARCHED = ("tp", "pp", "cp", "ep", "fsdp", "replicate", "ac", "reshard_after_forward", "schedule", "microbatches",
            "accumulation")
# why options.SEARCH_LIMIT (the search's limit, planning/search/space.py _passes) is 40: the simulation work
# after which no new candidate is simulated. The 70B Llama on 64 H100s (README) with a limit of 60 found its answer (tp 4 x fsdp 16, full, 4,953
# ms) at 30 passes and had searched every configuration without a pipeline at 37, then spent 16 of the rest
# on two pipelines (8 passes each, both out of memory) that the 150 s budget this replaced never reached. 40 is
# that walk up to 39 passes (11 candidates, 23 two-block copies; what is left then are pipelines of 4 passes
# or more): the same answer, with less work than the old budget did on a quiet machine (13 and 33), on any machine
_NOT_BASE = SEARCHED + ("global_batch", "gpus_per_node", "local_batch", "gpus")


def _row(c) -> dict[str, Any]:
    p = c.plan
    return {"label": label(c.config), "family": family_of(c.config), "status": c.status, "why": c.why,
            "by": c.by, "peak_bytes": c.peak_bytes, "over_bytes": c.over_bytes,
            "step_time": p.step_time if p is not None else None, "step_time_at_least": c.bound,
            "tokens_per_s": p.tokens_per_s if p is not None else None, "mfu": p.mfu if p is not None else None,
            "config": {"tp": c.config.tp, "pp": c.config.pp, "cp": c.config.cp, "ep": c.config.ep, "fsdp": c.config.fsdp, "replicate": c.config.replicate,
                       "ac": c.config.ac, "reshard_after_forward": c.config.reshard_after_forward,
                       "schedule": c.config.schedule, "microbatches": c.config.microbatches,
                       "accumulation": c.config.accumulation, "local_batch": c.config.local_batch}}


def search_dict(res: SearchResult) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for c in res.candidates:
        counts[c.status] = counts.get(c.status, 0) + 1
    return {"global_batch": res.global_batch, "limit_bytes": res.limit_bytes, "simulated": res.simulated,
            "simulated_for_bounds": res.for_bounds, "passes": res.passes, "search_limit": res.max_passes,
            "proven": res.proven, "unsearched_step_time_at_least": res.least_bound,
            "seconds": res.seconds, "counts": counts, "blocks_simulated": list(BLOCKS),
            "candidates": [_row(c) for c in res.candidates],
            "families": [{"family": f, "why": w} for f, w in res.families]}


def command_line(c) -> str:
    """The chosen configuration as `layerscope parallel` options."""
    cfg = c.config
    out = [f"--tp {cfg.tp}", f"--pp {cfg.pp}", f"--fsdp {cfg.fsdp}", f"--ac {cfg.ac}"]
    out += [f"--{k} {v}" for k, v in (("cp", cfg.cp), ("ep", cfg.ep)) if v > 1]
    if cfg.replicate > 1:
        out.append(f"--replicate {cfg.replicate}")
    if not cfg.reshard_after_forward:
        out.append("--no-reshard-after-forward")
    if cfg.pp > 1:
        out += [f"--schedule {cfg.schedule}", f"--microbatches {cfg.microbatches}"]
    else:
        out.append(f"--accumulation {cfg.accumulation}")
    out.append(f"--global-batch {cfg.global_batch}")
    return " ".join(out)


def search_report(model: nn.Module, args: tuple, kwargs: dict, *, gpus: int, held: Mapping[str, Any], gpu,
                  limit: int, simulate: Callable, fracs, options: dict, run: Mapping[str, Any]) -> ParallelReport:
    """The search's report; ``run``: parallel()'s run options (``progress``, ``search_limit``, ``jobs``)."""
    first = next(iter(iter_tensors((args, kwargs))), None)
    if first is None or not first.dim():
        raise InputError("the search needs an input with a batch dimension (token ids [B, S], images [B, C, H, W])")
    batch0 = int(first.shape[0])
    global_batch = held.get("global_batch") or batch0 * gpus
    tokens = int(first.shape[1]) if first.dim() == 2 and not first.is_floating_point() else None
    fixed = {k: held[k] for k in SEARCHED if k in held}
    base = {k: v for k, v in held.items() if k not in _NOT_BASE}
    task = SearchTask(gpus=gpus, global_batch=global_batch, limit=limit, gpu=gpu, fixed=fixed, base=base,
                      gpus_per_node=held.get("gpus_per_node", 8), fractions=fracs, tokens_per_sample=tokens,
                      max_passes=run["search_limit"], jobs=run["jobs"])
    res = search(model, args, kwargs, task, simulate, progress=run["progress"])
    best = res.best
    shown = best or next((c for c in res.candidates if c.plan is not None), None)
    if shown is None:
        why = next((c.why for c in res.candidates if c.status in ("error", "oom-bound")), "nothing could be simulated")
        raise InputError(f"no configuration of {gpus} GPUs could be simulated: {why}")
    counts = search_dict(res)["counts"]
    notes = [Note("search-searched", {
        "candidates": len(res.candidates), "gpus": gpus, "global_batch": global_batch, "seconds": res.seconds,
        "simulated": res.simulated, "blocks": tuple(BLOCKS[:2]), "for_bounds": res.for_bounds,
        "passes": res.passes, "max_passes": res.max_passes, "counts": tuple(sorted(counts.items()))})]
    used = dict(res.used)
    if used.get("composed") or used.get("copies"):     # how the candidates were simulated (copies.py _Evaluator)
        notes.append(Note("search-composed", {k: used.get(k, 0) for k in ("composed", "copies", "whole")}))
    if best is None:
        notes.append(Note("search-none-fits", {}))
    else:
        notes.append(Note("search-chosen", {"label": label(best.config), "gpus": gpus,
                                            "command": command_line(best)}))
    # the plan shown with expert parallel: its routing assumption stated and echoed, as parallel() does for one
    # configuration (api/_parallel.py)
    cfg = shown.config
    notes += ep_notes(cfg)
    if cfg.ep > 1:
        options = {**options, "ep": cfg.ep, "routing": cfg.routing}
    return ParallelReport(model_name=type(model).__name__, options=options, plans=(shown.plan,), notes=tuple(notes),
                          search=search_dict(res))
