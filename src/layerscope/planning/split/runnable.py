"""Runnable stages from a plan of the split (``PlanResult``, or the StagePlan users see), two ways, and a
check that the chain reproduces the model.

(a) ``torch.distributed.pipelining.pipeline()`` with a SplitPoint at the start of each stage, when
    torch.export can trace the model (wrapped so that it returns one tensor).
(b) Module ownership, for models export cannot trace (as torchtitan does): each stage keeps the
    model's structure but only its own units' modules; every other parameterised unit is replaced by
    a stub returning zeros of the right shape, parameter-free units (dropout, rotary embeddings) are
    kept everywhere. A stage runs the model's own forward: at its first unit a pre-hook swaps in the
    received arguments (the ones that depend on earlier units' parameters, found once at build time by
    making every unit's output require grad), and at the next stage's first unit a pre-hook takes that
    unit's arguments and stops the forward. The cut is valid by construction (``units.py``), so the
    glue the stage re-runs on placeholders only produces values it does not use.

Tied weights held by two stages are kept in both; ``TieSync`` sums their gradients across the ranks
after each backward, which is exactly the gradient of the single tied parameter.
"""

from __future__ import annotations

import contextlib
import copy
import traceback
from typing import Any

import torch
from torch import nn

from ... import _compat
from ...capture import hooks
from ...capture.state import StateGuard
from ...errors import InputError
from ..config import schedule_of
from .plan import PlanResult   # what a stage needs of a plan (reports' StagePlan has it too)

__all__ = ["pipeline_stage", "StageModule", "build_stage_module", "main_tensor", "verify_chain", "TieSync", "ExportedStages",
           "export_stages", "flat_inputs"]


def main_tensor(out: Any) -> torch.Tensor:
    """The tensor a pipeline's last stage hands to the loss: the model's output if it is one, else its
    ``logits``, ``last_hidden_state`` or first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        v = out.get(key) if isinstance(out, dict) else getattr(out, key, None)
        if isinstance(v, torch.Tensor):
            return v
    leaves = [x for x in _compat.tree_leaves(out) if isinstance(x, torch.Tensor)]
    if not leaves:
        raise InputError("the model's output holds no tensor a pipeline could hand to a loss")
    return leaves[0]


def flat_inputs(args: tuple, kwargs: dict):
    """(tensors, rebuild): the input tensors in order, and a function tensors -> (args, kwargs)."""
    leaves, spec = _compat.tree_flatten((tuple(args), dict(kwargs)))
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def rebuild(tensors):
        out = list(leaves)
        for i, t in zip(where, tensors):
            out[i] = t
        return _compat.tree_unflatten(out, spec)

    return tuple(leaves[i] for i in where), rebuild


class _Stop(Exception):
    pass


class _Stub(nn.Module):
    """Stands in for a unit another stage owns: zeros shaped like the unit's recorded output."""

    def __init__(self, name: str, metas, spec, batch: int) -> None:
        super().__init__()
        self.name = name
        self.metas = metas
        self.spec = spec
        self.batch = batch

    def forward(self, *args, **kwargs):
        dev = next((t.device for t in _compat.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)),
                   torch.device("cpu"))
        out = [torch.zeros(m[0], dtype=m[1], device=dev) if isinstance(m, tuple) else m for m in self.metas]
        return _compat.tree_unflatten(out, self.spec)

    def extra_repr(self) -> str:
        return f"stub for {self.name}"


def _record(model: nn.Module, plan: PlanResult, tensors: tuple, rebuild, context=None):
    """One forward in which every parameterised unit's output is a fresh leaf requiring grad: gives
    the units' output templates and, at each stage's first unit, which arguments depend on earlier
    units (the boundary). ``context``: a factory of what the forward runs in (a simulation's
    recorder, which answers the values a fake forward reads)."""
    units = plan.units.units
    templates: dict[int, tuple] = {}
    boundary: dict[int, list[int]] = {}
    metas: dict[int, list[tuple]] = {}      # the boundary tensors' (shape, dtype), per stage's first unit
    firsts = {plan.stages[s].first: s for s in range(1, plan.num_stages)}
    handles = []
    guard = StateGuard(model, inputs=tensors)

    def post(u):
        def hook(mod, a, out):
            leaves, spec = _compat.tree_flatten(out)
            templates[u] = ([(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in leaves],
                            spec)
            return _compat.tree_unflatten(
                [x.detach().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
                 for x in leaves], spec)
        return hook

    def pre(u):
        def hook(mod, a, kw):
            leaves = _compat.tree_leaves((a, kw))
            boundary[u] = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.requires_grad]
            metas[u] = [(tuple(leaves[i].shape), leaves[i].dtype) for i in boundary[u]]
        return hook

    try:
        for u in units:
            for p in _stubbed(model, u):
                handles.append(hooks.forward_hook(model.get_submodule(p), post(p)))
        for u in firsts:
            handles.append(hooks.forward_pre_hook(model.get_submodule(units[u].paths[0]), pre(u),
                                                  with_kwargs=True))
        with torch.enable_grad(), context() if context is not None else contextlib.nullcontext():
            a, k = rebuild(tensors)
            model(*a, **k)
    finally:
        hooks.remove_all(handles)
        guard.restore()
    return templates, boundary, metas


def _stubbed(model: nn.Module, unit) -> list[str]:
    """The unit's modules a stage that does not own it replaces by stubs: those with parameters."""
    return [p for p in unit.paths if any(True for _ in model.get_submodule(p).parameters())]


class StageModule(nn.Module):
    """One stage of a module-ownership split (path b). Its parameters are its own units' only."""

    def __init__(self, model: nn.Module, plan: PlanResult, stage: int, tensors: tuple, rebuild,
                 templates: dict, boundary: dict, metas: dict | None = None) -> None:
        super().__init__()
        st = plan.stages[stage]
        units = plan.units.units
        self.stage, self.num_stages = stage, plan.num_stages
        self.rebuild = rebuild
        self.input_metas = [(tuple(t.shape), t.dtype) for t in tensors]
        self.first_boundary = boundary.get(st.first, []) if stage > 0 else []
        self.needs_inputs = stage == 0 or units[st.first].needs_inputs
        self.next_boundary = boundary.get(st.last + 1, []) if stage < plan.num_stages - 1 else []
        # (shape, dtype) of what the stage receives and of what it sends (one micro-batch, as recorded)
        metas = metas or {}
        self.received_metas = metas.get(st.first, []) if stage > 0 else []
        self.sent_metas = metas.get(st.last + 1, []) if stage < plan.num_stages - 1 else []
        # the last stage returns the model's whole output (for a loss that reads its fields) instead of
        # main_tensor(output)
        self.full_output = False
        self.pass_inputs = stage < plan.num_stages - 1 and any(
            units[plan.stages[t].first].needs_inputs for t in range(stage + 1, plan.num_stages))
        # zero bubble's backward for the input detaches the stage's outputs in place (torch's
        # stage_backward_input), which a view refuses: such outputs are sent as copies (and the
        # last stage returns a copy of a view: see forward)
        self.own_outputs = schedule_of(plan.schedule).zero_bubble
        for u in units:
            if st.first <= u.index <= st.last:
                continue
            for p in _stubbed(model, u):
                metas, spec = templates.get(p, ([], _compat.tree_flatten(None)[1]))
                parent, _, name = p.rpartition(".")
                model.get_submodule(parent)._modules[name] = _Stub(p, metas, spec, 0)
        self.model = model
        self._received: tuple = ()
        self._sent: list = []
        # where the received activations go in: the stage's first unit, found at each forward (a
        # checkpoint wrapper put around it after the stage was built takes them as its arguments, so
        # that its recomputation in the backward runs on them, not on the stub's zeros before it)
        self._inject_at = units[st.first].paths[0] if stage > 0 else None
        if stage < plan.num_stages - 1:
            hooks.forward_pre_hook(model.get_submodule(units[st.last + 1].paths[0]), self._stop, with_kwargs=True)

    def _inject(self, mod, args, kwargs):
        leaves, spec = _compat.tree_flatten((args, kwargs))
        for i, t in zip(self.first_boundary, self._received):
            leaves[i] = t
        return _compat.tree_unflatten(leaves, spec)

    def _stop(self, mod, args, kwargs):
        leaves = _compat.tree_leaves((args, kwargs))
        self._sent = [leaves[i] for i in self.next_boundary]
        raise _Stop

    def forward(self, *flat):
        nb = len(self.first_boundary)
        self._received = flat[:nb]
        if self.needs_inputs:
            inputs = flat[nb:]
        else:
            dev = flat[0].device if flat else torch.device("cpu")
            inputs = [torch.zeros(s, dtype=d, device=dev) for s, d in self.input_metas]
        args, kwargs = self.rebuild(inputs)
        inject = None
        if self._inject_at is not None:
            inject = hooks.forward_pre_hook(self.model.get_submodule(self._inject_at), self._inject, with_kwargs=True)
        try:
            out = self.model(*args, **kwargs)
        except _Stop as stop:
            # the unwound frames (the model's forward, with its activations in its locals) stay
            # referenced from the traceback, in a cycle only the garbage collector frees: clear them,
            # and cut the exception from its traceback (a hook that keeps the exception it saw, as a
            # module tracker's always-called hook does, would keep this frame, and what it sends, alive)
            traceback.clear_frames(stop.__traceback__)
            stop.__traceback__ = None
            sent = tuple(self._sent)
            self._sent = []
            if self.own_outputs:
                sent = tuple(t.clone() if isinstance(t, torch.Tensor) and t._is_view() else t for t in sent)
            return sent + (tuple(inputs) if self.pass_inputs else ())
        finally:
            self._received = ()
            if inject is not None:
                inject.remove()
        if self.full_output:
            return out
        out = main_tensor(out)
        if self.own_outputs and out._is_view():
            # the last stage's output, kept by step(return_outputs=True): torch detaches it after the
            # I to free the graph, but not a view; its graph, with whatever the W did not free (the
            # saved tensors of the ops that lead to no weight), would then live to the end of the step
            out = out.clone()
        return out


def build_stage_module(model: nn.Module, plan: PlanResult, stage: int, args: tuple, kwargs: dict,
                       copy_model: bool = True, record_on: nn.Module | None = None,
                       record_context=None) -> StageModule:
    """The module of ``stage`` for path (b). ``args``/``kwargs`` are one micro-batch of inputs.
    With ``copy_model=False`` the model itself is cut down (other stages' modules replaced by stubs),
    as on a rank that holds only its stage. ``record_on``: a model of the same structure that runs
    the recording forward instead of ``model`` (``model`` on the meta device, to be sharded before
    it is materialised; ``record_on`` the same model as fake tensors); ``record_context`` a factory of
    the context the recording forward runs in."""
    tensors, rebuild = flat_inputs(args, kwargs)
    templates, boundary, metas = _record(record_on if record_on is not None else model, plan, tensors, rebuild,
                                         record_context)
    target = copy.deepcopy(model) if copy_model else model
    return StageModule(target, plan, stage, tensors, rebuild, templates, boundary, metas)


class ExportedStages:
    """Path (a): the traced pipeline and its stage submodules."""

    def __init__(self, pipe, names: list[list[str]]) -> None:
        self.pipe = pipe
        self.names = names


class _Main(nn.Module):
    def __init__(self, model: nn.Module, rebuild) -> None:
        super().__init__()
        self.model = model
        self.rebuild = rebuild

    def forward(self, *tensors):
        a, k = self.rebuild(tensors)
        return main_tensor(self.model(*a, **k))


def export_stages(model: nn.Module, plan: PlanResult, args: tuple, kwargs: dict):
    """Path (a): torch.distributed.pipelining.pipeline() with a SplitPoint before each stage."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    tensors, rebuild = flat_inputs(args, kwargs)
    spec = {"model." + p: SplitPoint.BEGINNING for p in plan.split_points}
    pipe = pipeline(_Main(model, rebuild), mb_args=tensors, split_spec=spec)
    if pipe.num_stages != plan.num_stages:
        raise InputError(f"torch.export produced {pipe.num_stages} stages for {plan.num_stages} split points")
    for s in range(1, pipe.num_stages):
        for node in pipe.get_stage_module(s).graph.nodes:
            val = node.meta.get("val") if node.op == "placeholder" else None
            if isinstance(val, torch.Tensor) and not val.is_contiguous():
                # the receive buffer would be as strided as the value, and gloo/NCCL send and
                # receive contiguous tensors only (GPT-2's causal mask, expanded over the batch)
                raise RuntimeError(f"stage {s} receives {node.name} {tuple(val.shape)} with strides "
                                   f"{val.stride()}: not contiguous, which send/recv cannot carry")
    return pipe, tensors


def _used_names(gm: nn.Module, prefix: str = "") -> set[str] | None:
    """Qualified names of what the graph module's code reaches (get_attr targets, and called
    submodules, looked into when they are graph modules themselves); None for a module without a graph."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        return None
    used: set[str] = set()
    for node in graph.nodes:
        if node.op == "get_attr":
            used.add(prefix + node.target)
        elif node.op == "call_module":
            inner = _used_names(gm.get_submodule(node.target), prefix + node.target + ".")
            used |= inner if inner is not None else {prefix + node.target}
    return used


def drop_unused_params(gm: nn.Module) -> list[str]:
    """pipeline() copies a weight tied across stages into every stage module, also where the stage's
    code never reads it (GPT's output head on the embedding's stage): remove those, so the stage
    does not hold (and the optimizer does not keep state for) a weight it does not use."""
    used = _used_names(gm)
    if used is None:
        return []
    gone = []
    for name, _ in list(gm.named_parameters(remove_duplicate=False)):
        if name in used or any(name.startswith(u + ".") for u in used):
            continue
        owner, _, leaf = name.rpartition(".")
        mod = gm.get_submodule(owner) if owner else gm
        if leaf in mod._parameters:
            del mod._parameters[leaf]
            gone.append(name)
    return gone


def verify_chain(model: nn.Module, plan: PlanResult, args: tuple, kwargs: dict, path: str = "auto"):
    """Run the stages one after another on one micro-batch and compare with the whole model.
    Returns (path used, max abs diff, reason export was not used or None). The global RNG state is
    put back (a training-mode model draws dropout masks in every run)."""
    rng = torch.get_rng_state()
    try:
        return _verify_chain(model, plan, args, kwargs, path)
    finally:
        torch.set_rng_state(rng)


def _verify_chain(model: nn.Module, plan: PlanResult, args: tuple, kwargs: dict, path: str):
    tensors, rebuild = flat_inputs(args, kwargs)
    guard = StateGuard(model, inputs=tensors)
    try:
        with torch.no_grad():
            ref = main_tensor(model(*args, **kwargs)).detach()
    finally:
        guard.restore()
    why = None
    if path in ("auto", "export"):
        try:
            m2 = copy.deepcopy(model)
            pipe, _ = export_stages(m2, plan, args, kwargs)
            with torch.no_grad():
                out = pipe(*tensors)
            out = out[0] if isinstance(out, tuple) else out
            return "export", float((out.detach().float() - ref.float()).abs().max()), None
        except Exception as e:  # noqa: BLE001 - any trace failure means: use module ownership
            if path == "export":
                raise InputError(f"torch.export could not trace {type(model).__name__} for pipeline(): "
                                 f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
            why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    templates, boundary, _ = _record(model, plan, tensors, rebuild)
    x: tuple = tensors
    with torch.no_grad():
        for s in range(plan.num_stages):
            mod = StageModule(copy.deepcopy(model), plan, s, tensors, rebuild, templates, boundary)
            mod.eval() if not model.training else mod.train()
            out = mod(*x)
            x = out if isinstance(out, tuple) else (out,)
            del mod
    return "ownership", float((x[0].detach().float() - ref.float()).abs().max()), why


class TieSync:
    """Sums the gradients of tied weights held by several stages: locally over the rank's own stages
    (each holds its own copy), then one all-reduce per tie across the ranks that hold it."""

    def __init__(self, plan: PlanResult, module, rank: int, prefix: str = "") -> None:
        import torch.distributed as dist
        modules = list(module) if isinstance(module, (list, tuple)) else [module]
        self.pairs = []
        for tie in plan.units.ties:
            ranks = sorted({plan.stages[plan.stage_of(u)].rank for u in tie.units})
            # every rank creates every group, in the same order
            group = dist.new_group(ranks) if len(ranks) >= 2 else None
            if rank not in ranks:
                continue
            params: list = []
            for m in modules:
                p = _find(m, tie.names, prefix)
                if p is not None and not any(p is q for q in params):
                    params.append(p)
            if params and (group is not None or len(params) >= 2):
                self.pairs.append((params, group))

    def __call__(self) -> None:
        import torch.distributed as dist
        for params, group in self.pairs:
            first = params[0]
            if first.grad is None:
                first.grad = torch.zeros_like(first)
            for p in params[1:]:
                if p.grad is not None:
                    first.grad += p.grad
            if group is not None:
                dist.all_reduce(first.grad, group=group)
            for p in params[1:]:
                p.grad = first.grad.clone()


def _find(module: nn.Module, names, prefix: str):
    for n in names:
        try:
            return module.get_parameter(prefix + n)
        except AttributeError:
            continue
    return None


def pipeline_stage(plan, model: torch.nn.Module, rank: int, args: tuple, kwargs: dict | None = None,
                   device=None, path: str = "auto", group=None, all_local: bool = False):
    """(PipelineStage, TieSync, path) for ``rank``'s stage. ``args``/``kwargs``: one micro-batch of
    example inputs. The model is cut down in place on the ownership path (other stages' modules
    become stubs), so pass the rank's own copy. Call the TieSync after backward, before the step.

    ``all_local=True`` gives ([PipelineStage, ...], TieSync, path) with every stage the plan puts on
    ``rank`` (``Stage.rank``: the interleaved schedule's stages r, r + P, ...), for
    ``ScheduleInterleaved1F1B``; on the ownership path each but the last is cut from its own copy
    of the model."""
    from torch.distributed.pipelining import PipelineStage

    kwargs = kwargs or {}
    device = torch.device(device) if device is not None else torch.device("cpu")
    mine = [s.index for s in plan.stages if s.rank == rank]
    if not mine:
        raise InputError(f"the plan puts no stage on rank {rank}")
    if len(mine) > 1 and not all_local:
        raise InputError(f"the plan puts stages {mine} on rank {rank}: pipeline_stage(..., all_local=True) "
                         "builds them all (a list, for ScheduleInterleaved1F1B)")
    done = (lambda st, sync, p: (st, sync, p)) if all_local else (lambda st, sync, p: (st[0], sync, p))
    if path in ("auto", "export"):
        try:
            pipe, _ = export_stages(model, plan, args, kwargs)
            built = []
            for s in mine:
                drop_unused_params(pipe.get_stage_module(s))
                built.append(pipe.build_stage(s, device, group))
            return done(built, TieSync(plan, [b.submod for b in built], rank, prefix="model."), "export")
        except InputError:
            raise
        except Exception:  # noqa: BLE001 - export failed: module ownership
            if path == "export":
                raise
    mods = [build_stage_module(model, plan, s, args, kwargs, copy_model=i < len(mine) - 1).to(device)
            for i, s in enumerate(mine)]
    built = [PipelineStage(mod, s, plan.num_stages, device, group=group) for mod, s in zip(mods, mine)]
    return done(built, TieSync(plan, mods, rank, prefix="model."), "ownership")
