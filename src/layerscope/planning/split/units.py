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

from ...trace import BACKWARD, FORWARD, PRODUCER_INPUT, PRODUCER_STATE, Costs, Trace
# measured on the device (api.py imports them from here)

__all__ = ["Unit", "Tie", "SplitUnits", "owner_of", "split_units", "units_from_memory", "with_work", "with_latencies",
           "with_weight_shares", "roofline_times"]

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


class _Flow:
    """The forward data-flow graph of a trace, and which cuts between candidate units are valid."""

    def __init__(self, trace: Trace) -> None:
        self.recs = trace.layers
        self.fops = [op for op in trace.ops if op.phase == FORWARD]
        self.pos = {op.index: n for n, op in enumerate(self.fops)}
        self.outputs = [self.pos[p] for p in (trace.layer_outputs[0] if trace.layer_outputs else ())
                        if p in self.pos]

    def member(self, units: list[list[int]], params: list[bool] | None = None) -> list[int]:
        """Record -> unit holding it (-1: glue of a record that contains units). With ``params``,
        also fills it: whether the record lies in one of the unit's modules that holds parameters
        (a stage that does not own the unit stubs those; parameter-free ones run everywhere)."""
        out = [-1] * len(self.recs)
        for u, idx in enumerate(units):
            for top in idx:
                p = self.recs[top].subtree_params > 0
                for j in _subtree(self.recs, top):
                    out[j] = u
                    if params is not None:
                        params[j] = p
        return out

    def check(self, units: list[list[int]]):
        """(bad, need, first): per unit j, whether the cut before it is invalid, whether a stage
        starting there needs the model's inputs, and where its ops start (glue belongs to none)."""
        in_params = [False] * len(self.recs)
        member = self.member(units, in_params)
        n = len(units)
        first, last = [None] * n, [None] * n
        for k, op in enumerate(self.fops):
            u = member[op.layer]
            if u >= 0:
                first[u] = k if first[u] is None else first[u]
                last[u] = k
        span_f, span_e = _spans(first, last, -0.5)
        invalid, needs = [0] * (n + 1), [0] * (n + 1)

        def mark(diff, p, o, inclusive=False):
            """Every unit after producer p and before consumer o (or holding o, when inclusive)."""
            lo = bisect.bisect_right(span_f, p)
            hi = bisect.bisect_right(span_f, o) - 1 if inclusive else bisect.bisect_left(span_e, o) - 1
            if lo <= hi:
                diff[lo] += 1
                diff[hi + 1] -= 1

        tainted = [False] * len(self.fops)      # depends on a parameterised unit
        from_input = [False] * len(self.fops)   # depends on input data, through no such unit
        for k, op in enumerate(self.fops):
            src = in_params[op.layer]
            t = src
            f = False
            for p in op.producers:
                if p == PRODUCER_INPUT:
                    f = f or not src
                    continue
                q = self.pos.get(p)
                if q is None:
                    continue
                if tainted[q]:
                    t = True
                    mark(invalid, q, k)
                if from_input[q]:
                    f = f or not src
                    mark(needs, q, k, inclusive=True)
            tainted[k] = t
            from_input[k] = f
        end = float(len(self.fops)) + 1
        for q in self.outputs:
            if tainted[q]:
                mark(invalid, q, end)
        bad, need, a, b = [], [], 0, 0
        for j in range(n):
            a += invalid[j]
            b += needs[j]
            bad.append(a > 0)
            need.append(b > 0)
        return bad, need, span_f


def _subtree(recs, top: int):
    """The record ``top`` and every record below it."""
    stack = [top]
    while stack:
        j = stack.pop()
        yield j
        stack.extend(recs[j].children)


def _spans(first: list, last: list, prev: float) -> tuple[list[float], list[float]]:
    """Each unit's first and last op position (``check``'s spans); a unit without ops sits right after the
    previous one's last op (``prev``: the span end before the first unit)."""
    span_f, span_e = [], []
    for f, e in zip(first, last):
        if f is None:
            prev += 0.25
            span_f.append(prev)
            span_e.append(prev)
        else:
            span_f.append(float(f))
            span_e.append(float(e))
            prev = float(e)
    return span_f, span_e


class _Opening:
    """``_Flow.check``'s answer to the one question ``_units`` asks of each module it tries to open (are
    the cuts before its pieces valid?) without a pass over the whole trace per try: linear in the ops of
    the unit being opened, where ``check`` is linear in the whole model (a deep MLP of 1,000 blocks asked
    1,003 times).

    Why it is the same answer: a cut before unit j is invalid when a tensor that depends on a
    parameterised unit, made by op q, is used by op k with unit j lying wholly between them (``check``'s
    ``mark``: span_f[j] > q and span_e[j] < k, the spans sorted). Sibling module calls do not interleave
    (checked once here: each record's children own disjoint op ranges in call order; otherwise None and
    the caller asks ``check``), so the units ``_units`` keeps are in op order, the units before the one
    being opened are final (it never reopens them) and own every op up to its last one, and the units
    after it start after its ops. A piece's cut then depends on (a) the producers before the unit, whose
    taint is final and whose pieces-marking reduces to their farthest consumer (kept as a running
    maximum), and (b) the producers within the unit's op range, whose taint depends only on the ops up to
    them: the ones before (final) and the unit's own, membership decided by the pieces tried. The later
    units' granularity changes neither. ``tests/planning/pipeline/test_units_opening.py`` checks the units against
    the whole-trace ``check`` on every model the suite splits."""

    def __init__(self, flow: "_Flow") -> None:
        recs, fops = flow.recs, flow.fops
        n = len(fops)
        self.flow = flow
        self.layer = [op.layer for op in fops]
        self.prods: list[list[int]] = []
        self.reach = [-1.0] * n            # an op's farthest consumer (layer outputs: past the end)
        for k, op in enumerate(fops):
            ps = [q for q in (flow.pos.get(p) for p in op.producers if p != PRODUCER_INPUT) if q is not None]
            for q in ps:
                self.reach[q] = max(self.reach[q], float(k))
            self.prods.append(ps)
        for q in flow.outputs:
            self.reach[q] = float(n) + 1
        # each record's subtree op range; the check that siblings do not interleave
        lo, hi = [n] * len(recs), [-1] * len(recs)
        for k, layer in enumerate(self.layer):
            lo[layer], hi[layer] = min(lo[layer], k), max(hi[layer], k)
        for r in sorted(range(len(recs)), key=lambda r: -recs[r].depth):
            par = recs[r].parent
            if par is not None:
                lo[par], hi[par] = min(lo[par], lo[r]), max(hi[par], hi[r])
        self.lo, self.hi = lo, hi
        self.ok = True
        for rec in recs:
            ranged = [c for c in rec.children if hi[c] >= 0]
            self.ok = self.ok and all(hi[a] < lo[b] for a, b in zip(ranged, ranged[1:]))
        self.tainted = [False] * n         # final for the ops before ``done``
        self.src = [False] * len(recs)     # final: the record lies in a unit whose top holds parameters
        self.done, self.final = 0, 0       # ops and units that are final
        self.mpre = -1.0                   # the farthest consumer of a tainted final op
        self.last = -1                     # the last op of the final units
        self.prev = -0.5                   # the last final unit's span end (check's spans)

    def _finalize(self, units: list[list[int]], upto: int) -> None:
        recs = self.flow.recs
        for u in units[self.final:upto]:
            for top in u:
                p = recs[top].subtree_params > 0
                for j in _subtree(recs, top):
                    self.src[j] = p
            last = max(self.hi[t] for t in u)
            if last >= 0:
                self.last, self.prev = last, float(last)
            else:
                self.prev += 0.25
        self.final = max(self.final, upto)
        for k in range(self.done, self.last + 1):
            t = self.src[self.layer[k]] or any(self.tainted[q] for q in self.prods[k])
            self.tainted[k] = t
            if t and self.reach[k] > self.mpre:
                self.mpre = self.reach[k]
        self.done = max(self.done, self.last + 1)

    def cuts(self, units: list[list[int]], i: int, pieces: list[list[int]]) -> list[bool] | None:
        """``check(units[:i] + pieces + units[i + 1:])[0][i:i + len(pieces)]``, or None where it cannot
        tell (siblings interleave)."""
        if not self.ok:
            return None
        recs = self.flow.recs
        self._finalize(units, i)
        member: dict[int, int] = {}
        params: dict[int, bool] = {}
        for u, piece in enumerate(pieces):
            for top in piece:
                p = recs[top].subtree_params > 0
                for j in _subtree(recs, top):
                    member[j], params[j] = u, p
        n = len(pieces)
        first, last = [None] * n, [None] * n
        end = max(self.hi[t] for piece in pieces for t in piece)
        base = self.last + 1
        tainted = self.tainted
        mine = [False] * max(0, end - base + 1)     # the taint of the ops base .. end
        marks = []
        for k in range(base, end + 1):
            layer = self.layer[k]
            u = member.get(layer)
            if u is not None:
                first[u] = k if first[u] is None else first[u]
                last[u] = k
            t = params.get(layer, False) or any(mine[q - base] if q >= base else tainted[q] for q in self.prods[k])
            mine[k - base] = t
            if t:
                marks.append((k, self.reach[k]))
        span_f, span_e = _spans(first, last, self.prev)
        diff = [0] * (n + 1)
        # the producers before the unit mark every piece that ends before their farthest consumer
        hi = bisect.bisect_left(span_e, self.mpre) - 1
        if hi >= 0:
            diff[0] += 1
            diff[hi + 1] -= 1
        for q, o in marks:
            lo = bisect.bisect_right(span_f, q)
            hi = bisect.bisect_left(span_e, o) - 1
            if lo <= hi:
                diff[lo] += 1
                diff[hi + 1] -= 1
        out, a = [], 0
        for j in range(n):
            a += diff[j]
            out.append(a > 0)
        return out


def _closed(recs) -> set[int]:
    """Records that cannot be opened: the lowest one holding every call of a reused module."""
    calls: dict[str, list[int]] = {}
    for r in recs:
        calls.setdefault(r.path, []).append(r.index)

    def ancestors(i):
        out = []
        while i is not None:
            out.append(i)
            i = recs[i].parent
        return out

    closed: set[int] = set()
    for idx in calls.values():
        if len(idx) > 1:
            common = set(ancestors(idx[0]))
            for c in idx[1:]:
                common &= set(ancestors(c))
            closed.add(max(common, key=lambda i: recs[i].depth) if common else 0)
            closed.update(idx)
    return closed


def _units(flow: _Flow) -> list[list[int]]:
    """Open modules top-down while the cuts between their children are valid; pieces between
    invalid cuts stay together as one unit (whose members may still be opened)."""
    recs = flow.recs
    closed = _closed(recs)
    units: list[list[int]] = [[0]]
    failed: set[int] = set()
    opening = _Opening(flow)
    i = 0
    while i < len(units):
        for r in units[i]:
            rec = recs[r]
            if r in failed or not rec.children or rec.params or r in closed:
                continue
            pieces = [[c] for x in units[i] for c in (rec.children if x == r else (x,))]
            bad = opening.cuts(units, i, pieces)
            if bad is None:
                bad = flow.check(units[:i] + pieces + units[i + 1:])[0][i:i + len(pieces)]
            groups: list[list[int]] = []
            if not (i > 0 and bad[0]):
                for k, piece in enumerate(pieces):
                    if groups and bad[k]:
                        groups[-1].extend(piece)
                    else:
                        groups.append(list(piece))
            if len(groups) >= 2 or (len(pieces) == 1 and groups):
                units = units[:i] + groups + units[i + 1:]
                break
            failed.add(r)
        else:
            i += 1
    while True:   # opening later modules can only shrink the taint, but check the final cuts once more
        bad, _, _ = flow.check(units)
        j = next((j for j in range(1, len(units)) if bad[j]), None)
        if j is None:
            return units
        units = units[:j - 1] + [units[j - 1] + units[j]] + units[j + 1:]


def split_units(trace: Trace, *, memory_layers=None, model=None, optimizer_ratio: float = 0.0,
                latencies: dict | None = None, micro_batch: int | None = None,
                loss_bytes: int = 0, loss_saved_bytes: int = 0, workspace_bytes: int = 0) -> SplitUnits:
    """Units of ``trace`` (a forward, or the last pass of a training step). ``memory_layers``
    (MemoryReport.layers of the same pass) adds saved activations, gradients and optimizer state;
    ``model`` finds tied parameters; ``latencies`` maps unit names to measured seconds."""
    from ...analyses.flops import layer_costs

    recs = trace.layers
    _, bwd_self, fwd_t, bwd_t, _ = layer_costs(trace)
    flow = _Flow(trace)
    groups = _units(flow)
    _, need, g_first = flow.check(groups)
    fops = flow.fops
    member = flow.member(groups)
    # glue: ops of records inside no unit
    glue_fwd = [Costs() for _ in groups]
    weight_flops = [0] * len(groups)
    deferred = [0] * len(groups)
    of_state: set[int] = set()              # free ops (views) of parameters and buffers
    share: dict[int, dict[int, int]] = {}   # glue record -> unit -> forward flops it got
    for n, op in enumerate(fops):
        g = member[op.layer]
        if g < 0:
            g = min(bisect.bisect_left(g_first, n), len(groups) - 1)
        # reads a parameter directly or through free ops (nn.Linear's transpose, a tied weight's view)
        if any(q == PRODUCER_STATE or q in of_state for q in op.producers):
            if op.status == "free":
                of_state.add(op.index)
            else:
                weight_flops[g] += op.costs.flops
                deferred[g] += op.costs.bytes_written
        if member[op.layer] >= 0:
            continue
        glue_fwd[g] = glue_fwd[g] + op.costs
        d = share.setdefault(op.layer, {})
        d[g] = d.get(g, 0) + op.costs.flops + 1
    glue_owner = {r: max(d, key=d.get) for r, d in share.items()}
    glue_bwd = [Costs() for _ in groups]
    glue_saved = [0] * len(groups)
    received = [0] * len(groups)   # saved storages that existed before the unit began: its inputs
    out_saved = [0] * len(groups)  # saved storages the unit made and returns: its outputs
    for i, r in enumerate(recs):
        g = member[i]
        if g < 0:
            g = glue_owner.get(i, len(groups) - 1 if i == 0 else glue_owner.get(recs[i].parent, 0))
            glue_bwd[g] = glue_bwd[g] + bwd_self[i]
            if memory_layers is not None:
                glue_saved[g] += memory_layers[i].saved_bytes
        if memory_layers is not None:
            start = memory_layers[groups[g][0]].first_op
            outs = set(memory_layers[groups[g][-1]].output_allocs)
            for at, nb in memory_layers[i].saved_blocks:
                if at < start:
                    received[g] += nb
                elif (at, nb) in outs:   # made by the op that returned the output, and its size
                    out_saved[g] += nb
    # parameters per unit, from the live model when there is one (tied weights in every holder)
    params_of: list[dict] = [dict() for _ in groups]
    ties: list[Tie] = []
    named: dict[int, list[str]] = {}
    if model is not None:
        owner_paths = {}
        for g, idx in enumerate(groups):
            for i in idx:
                owner_paths[recs[i].path] = g
        for name, p in model.named_parameters(remove_duplicate=False):
            mod = name.rpartition(".")[0]
            g = owner_of(mod, owner_paths)
            if g is None:
                continue
            params_of[g][id(p)] = p
            named.setdefault(id(p), []).append(name)
        holders: dict[int, list[int]] = {}
        for g, d in enumerate(params_of):
            for pid in d:
                holders.setdefault(pid, []).append(g)
        for pid, gs in holders.items():
            if len(gs) > 1:
                p = params_of[gs[0]][pid]
                nb = p.numel() * p.element_size()
                ties.append(Tie(names=tuple(named[pid]), units=tuple(gs),
                                state_bytes=nb * (1 + p.requires_grad + (optimizer_ratio if p.requires_grad else 0))))
    units = []
    for g, idx in enumerate(groups):
        name, paths, typ = _name(recs, idx)
        f = glue_fwd[g]
        b = glue_bwd[g]
        for i in idx:
            f = f + fwd_t[i]
            b = b + bwd_t[i]
        if model is not None:
            ps = list(params_of[g].values())
            numel = sum(p.numel() for p in ps)
            pbytes = sum(p.numel() * p.element_size() for p in ps)
            gbytes = sum(p.numel() * p.element_size() for p in ps if p.requires_grad)
        else:
            numel = sum(recs[i].subtree_params for i in idx)
            pbytes = gbytes = 0
        saved = glue_saved[g]
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
        units.append(Unit(
            index=g, name=name, paths=paths, type=typ, params=numel, param_bytes=pbytes,
            grad_bytes=gbytes, optimizer_bytes=obytes, saved_bytes=saved,
            input_bytes=sum(s.nbytes for s in in_rec.inputs if s.dtype in _FLOAT),
            output_bytes=sum(s.nbytes for s in out_rec.outputs if s.dtype in _FLOAT),
            forward=f, backward=b, latency=(latencies or {}).get(name),
            needs_inputs=need[g] and g > 0, work_bytes=int(work), received_saved_bytes=int(received[g]),
            output_saved_bytes=int(out_saved[g]), weight_flops=int(weight_flops[g]),
            deferred_bytes=int(deferred[g])))
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

