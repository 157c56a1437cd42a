"""The walk through the space: family after family, each member simulated unless a bound or a dominance
rules it out, within the search's limit (planning/search/space.py's docstring argues each rule)."""

from __future__ import annotations

from typing import Callable

import torch

from ...errors import ForwardError, InputError
from ...options import iec
from ..config import ParallelConfig
from ...progress import ProgressBar
from .bounds import PipelineBounds
from ..simulate.results import ParallelPlan
from .candidates import Candidate, _AC_MEMORY, _mbs, _passes, family_of, label

__all__ = ["walk_space"]


def _mem_ge(v: ParallelConfig, u: ParallelConfig) -> bool:
    """v holds at least what u holds (same family): as much or less checkpointing, as large or larger
    micro-batches, as much or more resharding off; and accumulating if u accumulates (from its second
    micro-step on a rank holds the gradients the first left while it runs the next forward, which one
    micro-step never does: a tiny Llama's 2 x 1 peaked 89,088 B under its 1 x 2)."""
    return (_AC_MEMORY[v.ac] >= _AC_MEMORY[u.ac] and _mbs(v) >= _mbs(u)
            and (not v.reshard_after_forward or u.reshard_after_forward)
            and (v.accumulation > 1 or u.accumulation == 1))


def _time_ge(v: ParallelConfig, u: ParallelConfig) -> bool:
    """v's predicted step is no shorter than u's (same family; module docstring)."""
    mbs_ok = _mbs(v) <= _mbs(u) if v.pp == 1 else _mbs(v) == _mbs(u)
    return (_AC_MEMORY[v.ac] <= _AC_MEMORY[u.ac] and mbs_ok
            and (v.reshard_after_forward or not u.reshard_after_forward))


def _seconds(c: Candidate) -> float | None:
    """A candidate's predicted step, or else its lower bound (a pipeline not simulated whole)."""
    return c.plan.step_time if c.plan is not None else c.bound


def _rules_out(b: PipelineBounds | None, limit: int, best: float | None) -> bool:
    """Whether bounds ``b`` rule their candidate out: over the memory limit, or no faster than ``best``."""
    return b is not None and (b.peak_bytes > limit or best is not None and b.step_time is not None
                              and b.step_time >= best)


def _state_bound(params: int, c: ParallelConfig) -> int:
    """Bytes the average rank holds in parameter and gradient shards alone (bound 1)."""
    per = 8 if c.mixed_precision == "bf16" else 2 * torch.empty((), dtype=c.model_dtype).element_size()
    return params * per // c.world


def _why(plan: ParallelPlan, best: ParallelPlan) -> str:
    t = getattr(plan, "timing", None) or {}
    slower = plan.step_time / best.step_time - 1 if best.step_time else 0.0
    parts = {"communication-bound (TP collectives on the critical path)": t.get("tp_comm", 0.0),
             "communication-bound (exposed data-parallel/pipeline communication)": t.get("exposed_comm", 0.0),
             "pipeline bubble": (t.get("bubble", 0.0) or 0.0) * plan.step_time,
             "host-bound (the GPU waits for eager dispatch)": t.get("host_wait", 0.0),
             "compute (recompute included)":
                 t.get("compute", 0.0) - (getattr(best, "timing", None) or {}).get("compute", 0.0)}
    reason = max(parts, key=parts.get)
    return f"{slower:+.0%} step time; {reason}"


class _Walk:
    """The search through one family after another, sharing the best plan found (module docstring)."""

    def __init__(self, ev: Callable[[ParallelConfig], ParallelPlan], limit: int, params: int,
                 max_passes: int | None, result: dict[int, Candidate],
                 bounds: Callable[[ParallelConfig, bool], PipelineBounds | None] | None = None,
                 for_bounds: Callable[[], int] | None = None) -> None:
        self.ev, self.limit, self.params, self.max_passes, self.result = ev, limit, params, max_passes, result
        self.bounds, self.for_bounds = bounds, for_bounds
        self.best: Candidate | None = None
        self.timed: list[Candidate] = []        # every simulated candidate (a predicted step time)
        self.passes = 0                         # _passes of each candidate simulated
        self.fits: dict[str, list[Candidate]] = {}
        self.ooms: dict[str, list[Candidate]] = {}
        self.families: dict[str, list[ParallelConfig]] = {}     # _walk_all's: what planning/search/ahead.py reads
        self.order: list[str] = []
        self.after: Callable[[], None] | None = None   # told after each candidate decided (the progress, the pool)

    @property
    def spent(self) -> int:
        """The limit's work done: the candidates' passes and a pass for each copy simulated for the bounds."""
        return self.passes + (self.for_bounds() if self.for_bounds is not None else 0)

    def _left(self) -> int | None:
        return None if self.max_passes is None else self.max_passes - self.spent

    def _judge(self, c: ParallelConfig, fits: list, ooms: list) -> Candidate:
        """Bound 1, then the family's dominance, then a simulation (within the search's limit)."""
        bound = _state_bound(self.params, c)
        if bound > self.limit:
            return Candidate(c, "oom-bound", f"its parameter and gradient shards alone take {iec(bound)} on the "
                             "average rank", over_bytes=bound - self.limit)
        dom = next((o for o in ooms if _mem_ge(c, o.config)), None)
        if dom is not None:
            return Candidate(c, "dominated", f"holds at least what {label(dom.config)} holds, which does not fit",
                             by=label(dom.config), over_bytes=dom.over_bytes)
        slow = next((x for x in fits if _time_ge(c, x.config)), None)
        if slow is not None:
            return Candidate(c, "slower", f"no faster than {label(slow.config)}, which fits", by=label(slow.config))
        best = self.best.plan.step_time if self.best is not None else None
        left = self._left()      # a bound may simulate two copies (micro-batches 1 and 2): only with room for both
        # the bounds from what is known first (without figures: the state and FSDP's collectives), then, where
        # they rule nothing out, from the stand-ins' figures, made now
        b = self.bounds(c, False) if self.bounds is not None else None
        if not _rules_out(b, self.limit, best) and (left is None or left >= 2) and self.bounds is not None:
            b = self.bounds(c, True)
        if b is not None:         # bounds 3 and 4 (planning/search/bounds.py): a candidate not simulated
            if b.peak_bytes > self.limit:
                where = f"a rank at pipeline coordinate {b.rank}" if c.pp > 1 else "a rank"
                held = ("gradients and the activations of the micro-batches in flight" if c.pp > 1 else
                        "and the activations of one micro-batch")
                if c.ep > 1:        # planning/search/sparse.py: the state alone
                    held = "activations not counted under expert parallel"
                elif not b.activations:     # copies._Evaluator._no_figures: before any block's figures
                    held = ("gradients; " if c.pp > 1 else "") + "activations not counted: no block's figures yet"
                return Candidate(c, "oom-bound", f"{where} holds at least {iec(b.peak_bytes)} (parameter shards, "
                                 f"optimizer state, gathered parameters, {held})",
                                 over_bytes=b.peak_bytes - self.limit, bound=b.step_time)
            if best is not None and b.step_time is not None and b.step_time >= best:
                return Candidate(c, "slower", f"its step takes at least {b.step_time * 1e3:,.1f} ms (its blocks' "
                                 "compute through the schedule, the host's issue of their kernels, or FSDP's "
                                 "collectives), no faster than the best found", by=label(self.best.config),
                                 bound=b.step_time)
        fam = family_of(c)
        slow = next((x for x in self.timed if best is not None and x.plan.step_time >= best
                     and family_of(x.config) == fam and _time_ge(c, x.config)), None)
        if slow is not None:          # bound 2: no faster than a member that is no faster than the best
            return Candidate(c, "slower", f"no faster than {label(slow.config)}, which predicts "
                             f"{slow.plan.step_time * 1e3:,.1f} ms, no faster than the best found",
                             by=label(self.best.config))
        left = self._left()
        if left is not None:
            if _passes(c) > left:
                at_least = f"; its step takes at least {b.step_time * 1e3:,.1f} ms" if b and b.step_time else ""
                return Candidate(c, "unsearched", ("the search's limit was spent before it" if left <= 0 else
                                 f"its simulation takes {_passes(c):,} passes, more than the {left:,} left of the "
                                 "search's limit") + at_least, bound=b.step_time if b else None)
        return self.simulate(c)

    def simulate(self, c: ParallelConfig) -> Candidate:
        self.passes += _passes(c)
        try:
            plan = self.ev(c)
        except (InputError, ForwardError) as e:
            return Candidate(c, "error", str(e).splitlines()[0])
        if plan.fits:
            return Candidate(c, "fits", "", plan=plan)
        return Candidate(c, "oom", f"over the limit by {iec(plan.over_bytes)}", plan=plan, over_bytes=plan.over_bytes)

    def _take(self, c: ParallelConfig, fits: list, ooms: list) -> Candidate:
        if id(c) in self.result:
            return self.result[id(c)]
        cand = self._judge(c, fits, ooms)
        self.result[id(c)] = cand
        if cand.plan is not None:
            self.timed.append(cand)
        if cand.status == "fits":
            fits.append(cand)
            if self.best is None or cand.plan.step_time < self.best.plan.step_time:
                self.best = cand
        elif cand.status in ("oom", "oom-bound"):
            ooms.append(cand)
        if self.after is not None:
            self.after()
        return cand

    def simulate_anyway(self) -> None:
        """Nothing simulated: the best-bounded candidate the limit left (the least step bound, else the
        least work) simulated past it, or, all ruled out by bounds, the nearest miss, to show it with its
        own figures and excess."""
        left = [c for c in self.result.values() if c.status == "unsearched"]
        pick = min(left, key=lambda c: (c.bound is None, c.bound or 0.0, _passes(c.config)), default=None)
        if pick is None:
            pick = min((c for c in self.result.values() if c.status == "oom-bound"), key=lambda c: c.over_bytes,
                       default=None)
        if pick is None:
            return
        got = self.simulate(pick.config)
        if got.plan is None and pick.status != "unsearched":
            return
        self.result[id(pick.config)] = got
        if got.plan is not None:
            self.timed.append(got)
        if got.status == "fits":
            self.best = got

    def lists(self, fam: list[ParallelConfig]) -> tuple[list, list]:
        key = family_of(fam[0])
        return self.fits.setdefault(key, []), self.ooms.setdefault(key, [])

    def head(self, fam: list[ParallelConfig]) -> Candidate:
        """The family's fastest member (no checkpointing, no resharding, the largest micro-batch)."""
        return self._take(fam[0], *self.lists(fam))

    def family(self, fam: list[ParallelConfig]) -> None:
        """After its head: bound 2 on the head (without a pipeline), its leanest member (does anything
        fit?), then per checkpointing mode and resharding, fastest first, the largest micro-batch that fits,
        found by bisection (memory grows with the micro-batch); with a pipeline every smaller micro-batch
        that fits too (its bubble shrinks)."""
        fits, ooms = self.lists(fam)
        first = self.result[id(fam[0])]
        if first.status == "error":
            for c in fam[1:]:
                self.result[id(c)] = Candidate(c, "error", first.why)
            return
        head = _seconds(first)
        if head is not None and self.best is not None and self.best is not first and fam[0].pp == 1 and \
                head >= self.best.plan.step_time:
            # bound 2: nothing in the family is faster than its fastest member (without a pipeline: with one,
            # more micro-batches may shrink the bubble more than they cost, so the head bounds nothing); the
            # head's predicted step, or else its lower bound
            what = "predicts" if first.plan is not None else "takes at least"
            for c in fam[1:]:
                self.result.setdefault(id(c), Candidate(
                    c, "slower", f"its family's fastest member ({label(fam[0])}) {what} "
                    f"{head * 1e3:,.1f} ms, no faster than the best found", by=label(self.best.config)))
            return
        lean = min(fam, key=lambda c: (_AC_MEMORY[c.ac], not c.reshard_after_forward, _mbs(c)))
        if self._take(lean, fits, ooms).status in ("oom", "oom-bound"):
            for c in fam:           # every member holds at least what the leanest holds
                self._take(c, fits, ooms)
            return
        combos: dict[tuple, list[ParallelConfig]] = {}
        for c in fam:               # fam is fastest first: so are the combinations and their members
            combos.setdefault((c.ac, c.reshard_after_forward), []).append(c)
        for members in combos.values():
            head = self._take(members[0], fits, ooms)
            if head.status in ("fits", "slower") or len(members) == 1:
                continue
            lo, hi = 1, len(members) - 1          # members[hi] is the smallest micro-batch
            while lo < hi:                        # the first (largest micro-batch) that fits
                mid = (lo + hi) // 2
                st = self._take(members[mid], fits, ooms).status
                if st == "fits":
                    hi = mid
                elif st in ("oom", "oom-bound", "dominated"):
                    lo = mid + 1
                else:
                    break
            got = self._take(members[lo], fits, ooms)
            if got.status == "fits" and members[lo].pp > 1:
                for c in members[lo + 1:]:        # a smaller micro-batch: a smaller bubble, maybe faster
                    self._take(c, fits, ooms)
        for c in fam:
            self._take(c, fits, ooms)


def _families(cands: list[ParallelConfig]) -> tuple[dict[str, list[ParallelConfig]], list[str]]:
    """The candidates by family, each fastest first, and the families in the limit's order."""
    families: dict[str, list[ParallelConfig]] = {}
    for c in cands:
        families.setdefault(family_of(c), []).append(c)
    # each family fastest first (no checkpointing, no resharding, the largest micro-batch): its first is its bound
    for fam in families.values():
        fam.sort(key=lambda c: (-_AC_MEMORY[c.ac], c.reshard_after_forward, -_mbs(c)))
    # without a pipeline first, then the pipelines cheapest to simulate first (the limit's order)
    order = sorted(families, key=lambda k: (families[k][0].pp > 1, _passes(families[k][0]), families[k][0].tp,
                                            families[k][0].replicate))
    return families, order


def _tally(walk: _Walk, total: int) -> str:
    """The progress line: candidates simulated, ruled out and left, and the best so far."""
    done = len(walk.result)
    best = (f"; best {walk.best.plan.step_time * 1e3:,.1f} ms ({label(walk.best.config)})"
            if walk.best is not None else "")
    return (f"searching configurations: {len(walk.timed)} simulated, {done - len(walk.timed)} ruled out, "
            f"{total - done} left{best}")


def walk_groups(families: dict[str, list[ParallelConfig]], order: list[str]) -> list[list[str]]:
    """The families in the groups the walk takes one after the other, each group's heads first: without
    a pipeline or context parallel; then with context parallel (each of its degrees' bounds needs stand-ins
    of its own, and its simulation a rank for each place in the ring: walked among the first, their heads
    would spend the search's limit before the families that cost least; context parallel pays where the
    activations of the whole sequence do not fit, that is where the first group finds nothing that fits,
    and the limit is then theirs); then the pipelines (their simulations cost the most, so the limit
    reaches them last).
    Llama-2-70B on 64 H100s at 4,096 tokens (2026-11-29): with the context-parallel families among the
    first, 23 candidates simulated within the default limit, 5 of them context parallel, and the answer
    fsdp 64, selective-op, 5,164.8 ms, where the old space's walk had found tp 4 x fsdp 16, full,
    4,957.8 ms."""
    first = [k for k in order if families[k][0].pp == 1 and families[k][0].cp == 1]
    cp = [k for k in order if families[k][0].pp == 1 and families[k][0].cp > 1]
    return [first, cp, [k for k in order if families[k][0].pp > 1]]


def _walk_all(walk: _Walk, families: dict[str, list[ParallelConfig]], order: list[str], progress: bool,
              ahead=None) -> None:
    """Every family walked: each group's heads first, then its families by their heads' step times;
    ``ahead`` (planning/search/pool.py) told after each candidate decided."""
    total = sum(len(f) for f in families.values())
    walk.families, walk.order = families, order
    bar = ProgressBar(total, _tally(walk, total)) if progress else None

    def after():
        if ahead is not None:
            ahead.follow(walk)
        if bar is not None:
            bar.update(len(walk.result), _tally(walk, total))
    walk.after = after
    try:
        # every family's head first (its lower bound, memory aside), then the families in the order of
        # their heads' step times: the best plan is found early and bound 2 cuts the rest
        # (in the groups of ``walk_groups``)
        for group in walk_groups(families, order):
            heads = {key: walk.head(families[key]) for key in group}
            timed = sorted(group, key=lambda k: (_seconds(heads[k]) is None, _seconds(heads[k]) or 0.0))
            for key in timed:
                walk.family(families[key])
                after()
        if not walk.timed:
            walk.simulate_anyway()
    finally:
        if bar is not None:
            bar.close()


def _bounded_out(result: dict[int, Candidate], best: Candidate | None) -> None:
    """The candidates the limit left whose bounds are no faster than the best found: slower."""
    if best is None:
        return
    for k, c in list(result.items()):
        if c.status == "unsearched" and c.bound is not None and c.bound >= best.plan.step_time:
            result[k] = Candidate(c.config, "slower", f"its step takes at least {c.bound * 1e3:,.1f} ms, no "
                                  "faster than the best found", by=label(best.config), bound=c.bound)


def _ranked(out: list[Candidate]) -> list[Candidate]:
    """Fitting by step time, the misses by excess, the rest in their order."""
    fitting = sorted((c for c in out if c.status == "fits"), key=lambda c: c.plan.step_time)
    misses = sorted((c for c in out if c.status in ("oom", "oom-bound", "dominated")),
                    key=lambda c: (c.over_bytes is None, c.over_bytes or 0))
    rest = [c for c in out if c.status not in ("fits", "oom", "oom-bound", "dominated")]
    return fitting + misses + rest


def _family_why(fam: list[ParallelConfig], result: dict[int, Candidate], best: Candidate | None) -> str:
    """Why a family other than the best's lost, in one line."""
    mine = [result.get(id(c)) or Candidate(c, "unsearched", "not reached") for c in fam]
    fit = [c for c in mine if c.status == "fits"]
    if fit and best is not None:
        return _why(min(fit, key=lambda c: c.plan.step_time).plan, best.plan)
    if mine and all(c.status in ("oom", "oom-bound", "dominated") for c in mine):
        least = min((c for c in mine if c.status == "oom"), key=lambda c: c.over_bytes, default=None)
        bound = min((c for c in mine if c.status == "oom-bound"), key=lambda c: c.over_bytes, default=None)
        return (f"out of memory: its leanest simulated member ({label(least.config)}) is over by "
                f"{iec(least.over_bytes)}" if least is not None else
                f"out of memory: every member over by at least {iec(bound.over_bytes)} (the lower "
                f"bound of {label(bound.config)})" if bound is not None else "out of memory")
    if any(c.status == "unsearched" for c in mine):
        left = [c for c in mine if c.status == "unsearched"]
        least = min((c.bound for c in left if c.bound is not None), default=None)
        return (f"{len(left)} of its {len(fam)} members not simulated within the search's limit"
                + (f" (the least of their lower bounds: {least * 1e3:,.1f} ms)" if least is not None else ""))
    if any(c.status == "slower" for c in mine) and best is not None:
        head = result.get(id(fam[0]))
        if head is not None and head.plan is not None and head.plan.step_time >= best.plan.step_time:
            return "its fastest member, memory aside: " + _why(head.plan, best.plan)
        if fam[0].pp == 1 and head is not None and head.status == "slower" and head.bound is not None and \
                not any(c.status in ("oom", "oom-bound", "dominated") for c in mine):
            return (f"no faster than the best: its fastest member's step takes at least "
                    f"{head.bound * 1e3:,.1f} ms (a lower bound)")
        over = (f" (its fastest over by {'at least ' if head.status == 'oom-bound' else ''}"
                f"{iec(head.over_bytes)})" if head is not None and head.over_bytes else "")
        return f"its members faster than the best do not fit{over}; the rest are no faster"
    if any(c.status == "error" for c in mine):
        return next(c.why for c in mine if c.status == "error")
    return "not searched (the search's limit)"


def walk_space(cands: list[ParallelConfig], evaluate: Callable[[ParallelConfig], ParallelPlan], *, limit: int,
               params: int, max_passes: int | None = None, progress: bool = False,
               bounds: Callable[[ParallelConfig, bool], PipelineBounds | None] | None = None,
               for_bounds: Callable[[], int] | None = None, ahead=None):
    """The search over ``cands`` with ``evaluate(config) -> plan`` (fits, over_bytes, step_time) and
    ``bounds(config, may_simulate)``, a pipeline's lower bounds or None (``for_bounds()``: how many
    configurations it simulated so far), simulating at most ``max_passes`` (module docstring; None: no
    limit): the candidates ranked (fitting by step time, the misses by excess, the rest), each family's line
    why it lost, how many were evaluated and the limit's work done. ``ahead.follow(walk)``, where given, is
    told after each candidate decided (planning/search/pool.py: workers simulate what the walk may ask for
    next); it changes nothing the walk decides."""
    count = [0]

    def ev(c):
        count[0] += 1
        return evaluate(c)
    families, order = _families(cands)
    result: dict[int, Candidate] = {}
    walk = _Walk(ev, limit, params, max_passes, result, bounds, for_bounds)
    _walk_all(walk, families, order, progress, ahead)
    best = walk.best
    _bounded_out(result, best)
    out = [result.get(id(c)) or Candidate(c, "unsearched", "not reached") for c in cands]
    fam_why = {key: _family_why(fam, result, best) for key, fam in families.items()
               if best is None or family_of(best.config) != key}
    return tuple(_ranked(out)), tuple(fam_why.items()), count[0], walk.spent
