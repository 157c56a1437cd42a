"""How a model opens up into split units (planning/split/units.py's docstring): the trace's data flow
(``_Flow``), which modules open up and where a cut between them is valid (``_Opening``), and the units
that result (``_units``: lists of record indices, merged across invalid cuts)."""

from __future__ import annotations

import bisect

from ...trace import FORWARD, PRODUCER_INPUT, Trace

__all__ = []


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
