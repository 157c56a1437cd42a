"""The stages a simulated or real pipeline rank runs: the uniform split of the model's repeated blocks
into contiguous stages (planning/simulate/pipeline_rank.py's docstring), where each stage sits on the
ranks, the weights tied across stages, and a stage's module cut from the model and parallelized."""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

from ...capture.inputs import map_tensors
from ...errors import InputError
from ..config import ParallelConfig, default_schedule, schedule_of
from ..steptime.schedule import stage_ranks
from ..split.plan import PlanResult, outline_plan
from ..split.runnable import build_stage_module
from ..split.units import SplitUnits, Unit, owner_of
from ..apply import checkpoint_blocks, parallelize
from ..blocks import find_blocks

__all__ = ["stage_coords", "rank_stages", "as_module", "model_name", "stage_blocks", "stage_plan", "stage_params", "stage_ties",
           "stage_config", "split_micro", "stage_module", "parallelize_stage"]


def stage_coords(config: ParallelConfig) -> list[int]:
    """The pp coordinate of each pipeline stage (several stages per rank: stage s on s % pp under interleaved
    and zb, in a V under zbv: rank r holds stages r and 2 pp - 1 - r)."""
    return stage_ranks(config.schedule, config.stages, schedule_of(config.schedule).per_rank(config.stages_per_rank))


def rank_stages(config: ParallelConfig, coord: int) -> list[int]:
    """The pipeline stages of the ranks at pp coordinate ``coord``, in order."""
    return [s for s, c in enumerate(stage_coords(config)) if c == coord]


def as_module(mods: list[nn.Module]) -> nn.Module:
    """A rank's stage modules as one module: its one stage's, or a list of them (trained together)."""
    return mods[0] if len(mods) == 1 else nn.ModuleList(mods)


_STAGE_PREFIX = re.compile(r"^(\d+\.)?model\.")


def model_name(name: str) -> str:
    """A name inside a rank's stage module (or list of them: "0.model.") as in the model the stages cut."""
    return _STAGE_PREFIX.sub("", name)


def stage_blocks(n: int, pp: int) -> list[range]:
    """Block indices per stage: ``n`` blocks in ``pp`` contiguous groups, the first ``n % pp`` one larger."""
    if n < pp:
        raise InputError(f"{pp} pipeline stages need at least {pp} blocks, the model has {n}")
    size, extra = divmod(n, pp)
    out, at = [], 0
    for s in range(pp):
        k = size + (1 if s < extra else 0)
        out.append(range(at, at + k))
        at += k
    return out


def _outer_paths(model: nn.Module, list_path: str) -> tuple[list[str], list[str]]:
    """Modules with parameters outside the block list: those registered before it, and after it."""
    before: list[str] = []
    after: list[str] = []
    seen = False

    def walk(mod: nn.Module, prefix: str) -> None:
        nonlocal seen
        if any(True for _ in mod.parameters(recurse=False)):
            raise InputError(f"{prefix.rstrip('.') or type(model).__name__} holds parameters of its own beside the "
                             "block list: the pipeline's uniform split cannot give them to one stage")
        for name, child in mod.named_children():
            p = prefix + name
            if p == list_path:
                seen = True
            elif list_path.startswith(p + "."):
                walk(child, p + ".")
            elif any(True for _ in child.parameters()):
                (after if seen else before).append(p)
    walk(model, "")
    return before, after


def stage_plan(model: nn.Module, stages: int, schedule: str | None = None, stages_per_rank: int = 2) -> PlanResult:
    """The uniform split (module doc) as a plan of the split (``PlanResult``, its units known by their
    modules alone): units [modules before the blocks], block 0, ..., block n-1, [modules after], each
    stage on the rank ``schedule`` (default: a configuration's) places it."""
    schedule = schedule or default_schedule()
    blocks = find_blocks(model)
    list_path = blocks[0][0].rpartition(".")[0]
    before, after = _outer_paths(model, list_path)
    paths = ([tuple(before)] if before else []) + [(path,) for path, _ in blocks] + ([tuple(after)] if after else [])
    units = SplitUnits(type(model).__name__, tuple(Unit.outline(i, p) for i, p in enumerate(paths)))
    first_block = 1 if before else 0
    bounds = []
    for s, r in enumerate(stage_blocks(len(blocks), stages)):
        first = 0 if s == 0 else first_block + r.start
        last = len(paths) - 1 if s == stages - 1 else first_block + r.stop - 1
        bounds.append((first, last))
    per_rank = schedule_of(schedule).per_rank(stages_per_rank)
    return outline_plan(units, bounds, schedule, stage_ranks(schedule, stages, per_rank), stages_per_rank=per_rank)


def stage_params(model: nn.Module, stages: int) -> list[dict[int, nn.Parameter]]:
    """Per stage of the uniform split, the parameters it owns by id (one shared within a stage once; one
    tied across stages in each stage that holds a copy)."""
    plan = stage_plan(model, stages)
    units = plan.units.units
    return [{id(p): p for u in units[st.first:st.last + 1] for path in u.paths
             for p in model.get_submodule(path).parameters()} for st in plan.stages]


def stage_ties(model: nn.Module, config: ParallelConfig) -> list[dict[int, str]]:
    """Weights tied across stages of the uniform split (one parameter under several names, e.g. GPT-2's
    embedding and head): for each, {stage: its name there} over the stages that hold a copy, when
    they are two or more. Each such stage keeps its own copy, whose gradients torch's pipelining does
    not sum; a run sums them (planning/real/torch_stages.py ``sum_tied_grads``, as Megatron-LM sums its embedding's
    gradients between the first and last stage), and the simulation lists that all-reduce."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    ties = [ns for ns in names.values() if len(ns) > 1]
    if not ties:
        return []
    plan = stage_plan(model, config.stages, config.schedule, config.stages_per_rank)
    units = plan.units.units
    stage_at = {p: st.index for st in plan.stages for u in units[st.first:st.last + 1] for p in u.paths}
    out = []
    for tie in ties:
        held: dict[int, str] = {}
        for n in tie:
            stage = owner_of(n, stage_at)
            if stage is None:
                raise InputError(f"{n} belongs to no pipeline stage")
            held.setdefault(stage, n)
        if len(held) > 1:
            out.append(held)
    return out


def stage_config(config: ParallelConfig) -> ParallelConfig:
    """The configuration a stage is parallelized with: the same, its ``pp`` 1 (the mesh without ``pp``)."""
    return dataclasses.replace(config, pp=1, gpus=config.world // config.pp, global_batch=None)


def _sub_mesh(mesh):
    """The mesh without its ``pp`` dimension (None when nothing is left)."""
    if mesh is None:
        return None
    names = tuple(n for n in (mesh.mesh_dim_names or ()) if n != "pp")
    return mesh[names] if names else None


def split_micro(args: tuple, kwargs: dict, m: int, microbatches: int) -> tuple[tuple, dict]:
    """Micro-batch ``m`` of ``microbatches``: every tensor with a dimension split along dim 0 (views,
    as torch's schedule splits the batch), everything else as it is."""
    def one(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:
            return t
        if t.shape[0] % microbatches:
            raise InputError(f"the local batch ({t.shape[0]}) does not split into {microbatches} micro-batches evenly")
        return t.tensor_split(microbatches)[m]
    return map_tensors((tuple(args), dict(kwargs)), one)


def stage_module(model: nn.Module, config: ParallelConfig, stage: int, micro_args: tuple, micro_kwargs: dict,
                 record_on: nn.Module | None = None, record_context=None):
    """``model`` cut down in place to ``stage`` of the uniform split (a StageModule wrapping it whose
    last stage returns the model's whole output), the recording forward run on ``record_on`` (default
    ``model``) with one micro-batch ``micro_args``/``micro_kwargs``. Returns (stage module, its own
    blocks as (path in the stage module, module)): ``parallelize_stage`` takes both."""
    plan = stage_plan(model, config.stages, config.schedule, config.stages_per_rank)
    blocks = find_blocks(model)
    own = [blocks[i] for i in stage_blocks(len(blocks), config.stages)[stage]]
    mod = build_stage_module(model, plan, stage, micro_args, micro_kwargs, copy_model=False, record_on=record_on,
                             record_context=record_context)
    mod.full_output = True
    return mod, [(f"model.{p}", m) for p, m in own]


def parallelize_stage(mod: nn.Module, own: list, config: ParallelConfig, mesh) -> nn.Module:
    """The stage module parallelized with ``stage_config(config)`` on ``mesh`` (the whole mesh, from
    ``build_mesh(config)``) without its pp dimension; only checkpointing when that leaves one rank."""
    sub = stage_config(config)
    if sub.world == 1:
        checkpoint_blocks(mod, sub, blocks=own)
    else:
        parallelize(mod, sub, _sub_mesh(mesh), blocks=own, tp_root="model")
    return mod
