"""Split units: the places where a model can be cut into pipeline stages, and what each piece costs.

A model is expanded top-down into the finest modules it can be cut between: a module is opened up
when it has child calls, holds no parameters of its own (its own glue would use them) and no module
below it is called from two of its children (a reused module cannot live in two stages). A cut
before unit j is *valid* when everything computed after unit j starts needs, from the parameterised
units before the cut, only unit j's own arguments: found from the trace's data-flow graph (each op
knows the ops that produced its inputs), so residual connections across the cut, an encoder output
consumed by every decoder layer, or a model output that returns an earlier hidden state make the cut
invalid and the units on both sides are merged. This is exactly the condition the module-ownership
stages of ``stages.py`` need: a later stage re-runs the model's glue with placeholders for the units
it does not own and injects unit j's received arguments.

Ops that run in a parent between its children ("glue": the add of token and position embeddings,
mask building) belong to no unit; their forward costs go to the unit that follows them, their
backward costs and saved activations to the unit that received most of that parent's forward glue,
so the units' numbers add up to the model's totals.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ...trace import BACKWARD, FORWARD, PRODUCER_STATE, Costs, Trace
from .opening import _Flow, _units

__all__ = ["Unit", "Tie", "SplitUnits", "owner_of", "split_units", "units_from_memory", "with_work",
           "with_latencies", "with_weight_shares", "roofline_times"]


_FLOAT = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True, slots=True)
class Unit:
    """One piece of the model a stage can own. Byte counts are per micro-batch where they scale."""

    index: int
    name: str                      # module path, or "a+b" for units merged across an invalid cut
    paths: tuple[str, ...]         # the modules it owns (maximal: no path is inside another)
    type: str
    params: int                    # distinct parameters (numel); tied ones count in every holder
    param_bytes: int
    grad_bytes: int                # trainable parameters' gradients
    optimizer_bytes: int
    saved_bytes: int               # activations saved for backward, per micro-batch
    input_bytes: int               # floating-point tensors it receives: the boundary when a stage starts here
    output_bytes: int
    forward: Costs
    backward: Costs
    latency: float | None = None   # forward + backward seconds, when measured or predicted
    forward_time: float | None = None    # of latency: the forward's seconds per micro-batch
    backward_time: float | None = None   # and the backward's
    needs_inputs: bool = False     # a stage starting here also needs the model's inputs
    work_bytes: int = 0            # transient bytes while it runs, above what it keeps (largest of
                                   # its calls' backward peak - entry and forward peak - exit), per micro-batch
    received_saved_bytes: int = 0  # of saved_bytes: storages that existed before the unit began (its
                                   # inputs), which a stage starting here holds as receive buffers
    output_saved_bytes: int = 0    # of saved_bytes: its own outputs, which a stage ending here holds
                                   # as its output anyway
    weight_flops: int = 0          # of backward.flops, an estimate of the weights' gradients: the
                                   # forward FLOPs of its ops that read a parameter or buffer (a
                                   # matmul's or convolution's weight gradient costs what its forward
                                   # did); zero bubble runs them apart from the input gradient
    deferred_bytes: int = 0        # zero bubble: the gradients of those ops' outputs, which the
                                   # backward for the input (I) computes and keeps for the weights'
                                   # (W), per micro-batch (the bytes the ops wrote)
    measured_weight_share: float | None = None   # W's share of the backward, timed (unit_timing.py)

    @classmethod
    def outline(cls, index: int, paths: tuple[str, ...]) -> "Unit":
        """A unit known by its modules alone, nothing counted (a split of a model that was not captured:
        the uniform split, planning/simulate/uniform_stages.py)."""
        return cls(index=index, name="+".join(paths), paths=paths, type="", params=0, param_bytes=0, grad_bytes=0,
                   optimizer_bytes=0, saved_bytes=0, input_bytes=0, output_bytes=0, forward=Costs(), backward=Costs())

    @property
    def weight_share(self) -> float:
        """The share of the backward that computes the weights' gradients (zero bubble's W): measured
        where the units were timed for zero bubble, else their FLOPs' share."""
        if self.measured_weight_share is not None:
            return self.measured_weight_share
        if self.backward.flops <= 0:
            return 0.0
        return min(1.0, self.weight_flops / self.backward.flops)

    @property
    def flops(self) -> int:
        return self.forward.flops + self.backward.flops

    @property
    def macs(self) -> int:
        return self.forward.macs + self.backward.macs

    @property
    def state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


@dataclass(frozen=True, slots=True)
class Tie:
    """A parameter held by more than one unit (tied weights): each stage holding it keeps a copy."""

    names: tuple[str, ...]
    units: tuple[int, ...]
    state_bytes: int               # parameter + gradient + optimizer state of one copy


@dataclass(frozen=True)
class SplitUnits:
    model_name: str
    units: tuple[Unit, ...]
    ties: tuple[Tie, ...] = ()
    micro_batch: int | None = None
    loss_bytes: int = 0            # the loss's transient working memory (forward and backward) per
                                   # micro-batch, above the output and what it saves: on the last stage
    loss_saved_bytes: int = 0      # what the loss saves for its backward, per micro-batch in flight
    # what the caller of schedule.step() keeps alive during the step (torch.distributed.pipelining):
    kept_outputs: bool = False     # step(..., return_outputs=True), torch's default: the last stage keeps
                                   # every micro-batch's output and returns them merged
    input_batch_bytes: int = 0     # the whole batch's inputs, handed to step() on the first stage's rank
    target_bytes: int = 0          # the whole batch's targets, handed to step() on the last stage's rank
    workspace_bytes: int = 0       # what every rank's process holds for its libraries (cuBLAS's two
                                   # workspaces on a CUDA target): once per rank, not a unit's work
    notes: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.units)

    def __getitem__(self, i: int) -> Unit:
        return self.units[i]


@dataclass
class _Tally:
    """What split_units counts per unit (index g of ``groups``), filled in by its steps in order."""

    recs: list
    groups: list[list[int]]
    member: list[int]              # record -> its unit, -1 for glue
    fwd_t: list                    # per record: forward costs of its subtree
    bwd_t: list                    # and backward
    memory_layers: list | None
    glue_fwd: list[Costs]
    weight_flops: list[int]
    deferred: list[int]
    glue_owner: dict[int, int] = field(default_factory=dict)   # glue record -> the unit its backward goes to
    glue_bwd: list[Costs] = field(default_factory=list)
    glue_saved: list[int] = field(default_factory=list)
    received: list[int] = field(default_factory=list)   # saved storages that existed before the unit began: its inputs
    out_saved: list[int] = field(default_factory=list)  # saved storages the unit made and returns: its outputs
    params_of: list[dict] = field(default_factory=list)  # unit -> id -> parameter (from the live model)


def _forward_glue(flow: _Flow, t: _Tally, g_first: list[int]) -> None:
    """Each op's forward: the glue's costs to the unit that follows it, the weight-reading ops' FLOPs and
    written bytes to their unit; each glue record's owner, the unit that received most of its forward."""
    n_units = len(t.groups)
    of_state: set[int] = set()              # free ops (views) of parameters and buffers
    share: dict[int, dict[int, int]] = {}   # glue record -> unit -> forward flops it got
    for n, op in enumerate(flow.fops):
        g = t.member[op.layer]
        if g < 0:
            g = min(bisect.bisect_left(g_first, n), n_units - 1)
        # reads a parameter directly or through free ops (nn.Linear's transpose, a tied weight's view)
        if any(q == PRODUCER_STATE or q in of_state for q in op.producers):
            if op.status == "free":
                of_state.add(op.index)
            else:
                t.weight_flops[g] += op.costs.flops
                t.deferred[g] += op.costs.bytes_written
        if t.member[op.layer] >= 0:
            continue
        t.glue_fwd[g] = t.glue_fwd[g] + op.costs
        d = share.setdefault(op.layer, {})
        d[g] = d.get(g, 0) + op.costs.flops + 1
    t.glue_owner = {r: max(d, key=d.get) for r, d in share.items()}


def _backward_glue(t: _Tally, bwd_self: list) -> None:
    """The glue's backward and saved activations to its owner; each unit's saved storages that are its
    inputs (made before it began) and its outputs."""
    n_units = len(t.groups)
    t.glue_bwd = [Costs() for _ in t.groups]
    t.glue_saved = [0] * n_units
    t.received = [0] * n_units
    t.out_saved = [0] * n_units
    recs, memory_layers = t.recs, t.memory_layers
    for i, r in enumerate(recs):
        g = t.member[i]
        if g < 0:
            g = t.glue_owner.get(i, n_units - 1 if i == 0 else t.glue_owner.get(recs[i].parent, 0))
            t.glue_bwd[g] = t.glue_bwd[g] + bwd_self[i]
            if memory_layers is not None:
                t.glue_saved[g] += memory_layers[i].saved_bytes
        if memory_layers is not None:
            start = memory_layers[t.groups[g][0]].first_op
            outs = set(memory_layers[t.groups[g][-1]].output_allocs)
            for at, nb in memory_layers[i].saved_blocks:
                if at < start:
                    t.received[g] += nb
                elif (at, nb) in outs:   # made by the op that returned the output, and its size
                    t.out_saved[g] += nb


def _unit_params(model, t: _Tally, optimizer_ratio: float) -> list[Tie]:
    """Parameters per unit from the live model (tied weights in every holder); the ties."""
    ties: list[Tie] = []
    named: dict[int, list[str]] = {}
    owner_paths = {}
    for g, idx in enumerate(t.groups):
        for i in idx:
            owner_paths[t.recs[i].path] = g
    for name, p in model.named_parameters(remove_duplicate=False):
        mod = name.rpartition(".")[0]
        g = owner_of(mod, owner_paths)
        if g is None:
            continue
        t.params_of[g][id(p)] = p
        named.setdefault(id(p), []).append(name)
    holders: dict[int, list[int]] = {}
    for g, d in enumerate(t.params_of):
        for pid in d:
            holders.setdefault(pid, []).append(g)
    for pid, gs in holders.items():
        if len(gs) > 1:
            p = t.params_of[gs[0]][pid]
            nb = p.numel() * p.element_size()
            ties.append(Tie(names=tuple(named[pid]), units=tuple(gs),
                            state_bytes=nb * (1 + p.requires_grad + (optimizer_ratio if p.requires_grad else 0))))
    return ties


def _unit(t: _Tally, g: int, model, optimizer_ratio: float, latencies: dict | None, need: list) -> Unit:
    """Unit g: its records' costs and the glue's it got, its parameters, state, saved and working bytes."""
    recs, memory_layers, idx = t.recs, t.memory_layers, t.groups[g]
    name, paths, typ = _name(recs, idx)
    f = t.glue_fwd[g]
    b = t.glue_bwd[g]
    for i in idx:
        f = f + t.fwd_t[i]
        b = b + t.bwd_t[i]
    if model is not None:
        ps = list(t.params_of[g].values())
        numel = sum(p.numel() for p in ps)
        pbytes = sum(p.numel() * p.element_size() for p in ps)
        gbytes = sum(p.numel() * p.element_size() for p in ps if p.requires_grad)
    else:
        numel = sum(recs[i].subtree_params for i in idx)
        pbytes = gbytes = 0
    saved = t.glue_saved[g]
    obytes = 0
    if memory_layers is not None:
        saved += sum(memory_layers[i].saved_total for i in idx)
        if model is None:
            pbytes = sum(memory_layers[i].param_total for i in idx)
            gbytes = sum(memory_layers[i].grad_total for i in idx)
        obytes = sum(memory_layers[i].optimizer_total for i in idx)
        if model is not None:   # state of tied copies counted at another owner in the report
            obytes = max(obytes, int(round(gbytes * optimizer_ratio)))
    work = 0
    if memory_layers is not None:
        for i in idx:
            fw, bw = memory_layers[i].forward, memory_layers[i].backward
            if fw is not None:
                work = max(work, fw.peak - fw.exit)
            if bw is not None:
                work = max(work, bw.peak - bw.entry)
    in_rec, out_rec = recs[idx[0]], recs[idx[-1]]
    return Unit(
        index=g, name=name, paths=paths, type=typ, params=numel, param_bytes=pbytes,
        grad_bytes=gbytes, optimizer_bytes=obytes, saved_bytes=saved,
        input_bytes=sum(s.nbytes for s in in_rec.inputs if s.dtype in _FLOAT),
        output_bytes=sum(s.nbytes for s in out_rec.outputs if s.dtype in _FLOAT),
        forward=f, backward=b, latency=(latencies or {}).get(name),
        needs_inputs=need[g] and g > 0, work_bytes=int(work), received_saved_bytes=int(t.received[g]),
        output_saved_bytes=int(t.out_saved[g]), weight_flops=int(t.weight_flops[g]),
        deferred_bytes=int(t.deferred[g]))


def split_units(trace: Trace, *, memory_layers=None, model=None, optimizer_ratio: float = 0.0,
                latencies: dict | None = None, micro_batch: int | None = None,
                loss_bytes: int = 0, loss_saved_bytes: int = 0, workspace_bytes: int = 0) -> SplitUnits:
    """Units of ``trace`` (a forward, or the last pass of a training step). ``memory_layers``
    (MemoryReport.layers of the same pass) adds saved activations, gradients and optimizer state;
    ``model`` finds tied parameters; ``latencies`` maps unit names to measured seconds."""
    from ...analyses.flops import layer_costs

    _, bwd_self, fwd_t, bwd_t, _ = layer_costs(trace)
    flow = _Flow(trace)
    groups = _units(flow)
    _, need, g_first = flow.check(groups)
    # glue: ops of records inside no unit
    t = _Tally(recs=trace.layers, groups=groups, member=flow.member(groups), fwd_t=fwd_t, bwd_t=bwd_t,
               memory_layers=memory_layers, glue_fwd=[Costs() for _ in groups], weight_flops=[0] * len(groups),
               deferred=[0] * len(groups))
    _forward_glue(flow, t, g_first)
    _backward_glue(t, bwd_self)
    # parameters per unit, from the live model when there is one (tied weights in every holder)
    t.params_of = [dict() for _ in groups]
    ties = _unit_params(model, t, optimizer_ratio) if model is not None else []
    units = [_unit(t, g, model, optimizer_ratio, latencies, need) for g in range(len(groups))]
    return SplitUnits(model_name=trace.model_name, units=tuple(units), ties=tuple(ties),
                      micro_batch=micro_batch, loss_bytes=int(loss_bytes),
                      loss_saved_bytes=int(loss_saved_bytes), workspace_bytes=int(workspace_bytes))


def loss_working_bytes(rep) -> int:
    """The loss's transient working memory in a simulated training step (MemoryReport ``rep``): the
    most live bytes from the end of the last forward through the loss and its backward (ops at the
    model's root, before any module's backward), minus the live bytes when the forward ended and
    minus what the loss saved for its backward (counted per micro-batch in flight)."""
    if not rep.steps:
        return 0
    total = [sum(col) for col in zip(*rep.timeline.bytes)]
    fwd = next((p for p in rep.steps[-1].phases if p.phase == FORWARD), None)
    if fwd is None:
        return 0
    off, end = fwd.first_op, fwd.last_op
    peak = total[end]
    for j, op in enumerate(rep.trace.ops):
        t = off + j
        if t <= end:
            continue
        if t >= len(total) or (op.phase == BACKWARD and op.layer != 0):
            break
        peak = max(peak, total[t])
    return max(0, peak - total[end] - int(rep.totals.get("loss_saved_bytes") or 0))


def owner_of(path: str, owner_paths: dict) -> int | None:
    """The value of the nearest of ``path`` and its enclosing module paths in ``owner_paths`` (None: none)."""
    while True:
        if path in owner_paths:
            return owner_paths[path]
        if not path:
            return None
        path = path.rpartition(".")[0]


def _name(recs, idx: list[int]) -> tuple[str, tuple[str, ...], str]:
    """Name a run of leaf records by the largest modules it covers whole."""
    if len(idx) == 1:
        r = recs[idx[0]]
        return r.path or "(root)", (r.path,), r.type
    covered = set(idx)
    # climb: a parent is covered when all its children are
    changed = True
    while changed:
        changed = False
        for i in list(covered):
            p = recs[i].parent
            if p is not None and p not in covered and all(c in covered for c in recs[p].children):
                covered.add(p)
                changed = True
    top = [i for i in sorted(covered) if recs[i].parent not in covered]
    if len(top) == 1:
        r = recs[top[0]]
        return r.path or "(root)", (r.path,), r.type
    paths = tuple(recs[i].path for i in top)
    return "+".join(paths), paths, "+".join(dict.fromkeys(recs[i].type for i in top))


def units_from_memory(rep, model, micro=None):
    """Split units from a MemoryReport: its trace, per-layer memory and optimizer state ratio."""
    grads = rep.totals.get("gradient_bytes") or 0
    ratio = (rep.totals.get("optimizer_bytes") or 0) / grads if grads else 0.0
    return split_units(rep.trace, memory_layers=rep.layers, model=model, optimizer_ratio=ratio,
                       micro_batch=micro, loss_bytes=loss_working_bytes(rep) if grads else 0,
                       loss_saved_bytes=(rep.totals.get("loss_saved_bytes") or 0) if grads else 0,
                       workspace_bytes=max((s.breakdown.get("workspace", 0) for s in rep.steps), default=0))


def with_work(units, work: dict):
    """The units with each one's working memory the larger of simulated and measured (``work``)."""
    import dataclasses
    return dataclasses.replace(units, units=tuple(
        dataclasses.replace(u, work_bytes=max(u.work_bytes, work.get(u.name, 0))) for u in units.units))


def with_latencies(units, latencies: dict):
    """The units with their times (``latencies``: unit name -> (forward, backward) seconds)."""
    import dataclasses

    def timed(u):
        f, b = latencies.get(u.name, (None, None))
        return dataclasses.replace(u, latency=None if f is None else f + b, forward_time=f, backward_time=b)
    return dataclasses.replace(units, units=tuple(timed(u) for u in units.units))


def with_weight_shares(units, shares: dict):
    """The units with their measured weight-gradient shares (``shares``: unit name -> fraction)."""
    import dataclasses
    return dataclasses.replace(units, units=tuple(
        dataclasses.replace(u, measured_weight_share=shares.get(u.name)) for u in units.units))


def roofline_times(units, roof) -> dict[str, tuple[float, float]]:
    """Each unit's (forward, backward) seconds predicted by a Roofline: a pass takes as long as the
    larger of its FLOPs at the peak FLOP/s and its bytes moved at the peak bandwidth."""
    def t(c):
        return max(c.flops / roof.peak_flops, c.bytes_moved / roof.peak_bandwidth)
    return {u.name: (t(u.forward), t(u.backward)) for u in units.units}
