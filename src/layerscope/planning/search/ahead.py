"""What the walk (planning/search/walk.py) may ask to simulate next, most likely first: the search's worker
processes (planning/search/pool.py) simulate these ahead of it. A guess, never a decision: the walk alone
decides, in its own order, from the results it asks for, so the answer is the serial one whatever this
guesses; a good guess only keeps the workers on candidates the walk then asks for.

The guess follows the walk's order (its docstring) and leaves out what the walk would rule out now
without a simulation (its rules as they stand: a rule that rules a candidate out stays true as the walk
learns more, since the best only gets faster and the lists of what fits and what does not only grow)."""

from __future__ import annotations

from typing import Iterator

from ..config import ParallelConfig
from .candidates import _AC_MEMORY, _mbs, _passes, family_of
from .walk import _mem_ge, _seconds, _state_bound, _time_ge, walk_groups

__all__ = ["upcoming"]


def upcoming(walk) -> Iterator[ParallelConfig]:
    """The candidates ``walk`` (a walk._Walk, its families set) has not decided and may simulate, in the
    order it may ask for them: each group's heads (``walk.walk_groups``), then its
    families by their heads' step times, each family's leanest member, the fastest of each checkpointing
    mode and resharding, then the rest fastest first."""
    fams, order = walk.families, walk.order
    of = {id(c): k for k, fam in fams.items() for c in fam}
    best = walk.best.plan.step_time if walk.best is not None else None
    slow: dict[str, list] = {}          # per family, its simulated members no faster than the best (bound 2)
    for x in walk.timed:
        if best is not None and x.plan.step_time >= best:
            slow.setdefault(of.get(id(x.config), family_of(x.config)), []).append(x.config)
    left = walk._left()

    def is_open(c: ParallelConfig) -> bool:
        """``c`` not decided, and none of the walk's rules that need no simulation rules it out now: the
        sharded state's bound, the family's dominance both ways, bound 2 within the family, the limit."""
        if id(c) in walk.result or _state_bound(walk.params, c) > walk.limit:
            return False
        fam = of[id(c)]
        return not (any(_mem_ge(c, o.config) for o in walk.ooms.get(fam, ()))
                    or any(_time_ge(c, x.config) for x in walk.fits.get(fam, ()))
                    or any(_time_ge(c, x) for x in slow.get(fam, ()))
                    or left is not None and _passes(c) > left)
    for group in walk_groups(fams, order):
        yield from (fams[k][0] for k in group if is_open(fams[k][0]))

        def head_time(k):
            r = walk.result.get(id(fams[k][0]))
            return _seconds(r) if r is not None else None
        for k in sorted(group, key=lambda k: (head_time(k) is None, head_time(k) or 0.0)):
            fam = fams[k]
            first = walk.result.get(id(fam[0]))
            if first is not None and first.status == "error":
                continue
            h = head_time(k)
            if h is not None and best is not None and walk.best is not first and fam[0].pp == 1 and h >= best:
                continue          # the walk's bound 2 on the family's head
            lean = min(fam, key=lambda c: (_AC_MEMORY[c.ac], not c.reshard_after_forward, _mbs(c)))
            got = walk.result.get(id(lean))
            if got is not None and got.status in ("oom", "oom-bound"):
                continue          # every member holds at least what the leanest holds
            combos: dict[tuple, ParallelConfig] = {}
            for c in fam:
                combos.setdefault((c.ac, c.reshard_after_forward), c)
            seen = set()
            for c in [lean, *combos.values(), *fam]:
                if id(c) not in seen:
                    seen.add(id(c))
                    if is_open(c):
                        yield c

