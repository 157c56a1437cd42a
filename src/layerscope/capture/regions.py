"""Where the blocks of a composed pass ran, and where each of their times and calls lands in the whole
model's pass (capture/compose.py's module docstring has the argument): ``Regions`` finds the kept blocks'
forward and backward regions in one pass of the shorter model, ``Widen`` maps a pass-local op time or call
index (seen from a block, or from outside them) to the widened pass, and the helpers below write a
block's record in relative terms (``ref``, ``far``, ``masked``) and place the copies (``copy_places``,
``renote``). ``NotComposable`` is raised wherever the run cannot stand for the whole model's."""

from __future__ import annotations

import torch

from ..trace import BACKWARD
from .blocks import KEPT, REP, Truncated

__all__ = ["NotComposable", "Regions", "Widen", "FWD", "BWD", "ref", "far", "masked", "full_block_of", "kept_of",
           "runs_of", "copy_places", "renote", "block_at"]


class NotComposable(Exception):
    """The shorter model's run cannot stand for the whole model's (the reason is the message)."""


FWD, BWD = "F", "B"


class Regions:
    """Where the kept blocks ran in one pass (pass-local op indices and call indices)."""

    def __init__(self, cap, tr: Truncated, n_ops: int) -> None:
        run = tr.run
        pre = run.path + "." if run.path else ""
        tops = [f"{pre}{run.start + b}" for b in range(KEPT)]
        where = {}
        for i, c in enumerate(cap.calls):
            if c.path in tops:
                if c.path in where:
                    raise NotComposable(f"{c.path} was called more than once in a pass")
                where[c.path] = i
        if len(where) != KEPT:
            raise NotComposable("the blocks were not all called")
        self.top = [where[t] for t in tops]
        if self.top != sorted(self.top):
            raise NotComposable("the blocks were not called in order")
        calls = cap.calls
        self.end = []                       # one past each block's last call
        for i in self.top:
            j = i + 1
            while j < len(calls) and calls[j].depth > calls[i].depth:
                j += 1
            self.end.append(j)
        self.size = [e - s for s, e in zip(self.top, self.end)]
        # forward regions
        fs = [calls[i].span[0] for i in self.top]
        fe = [calls[i].span[1] for i in self.top]
        if any(fe[b] >= fs[b + 1] for b in range(KEPT - 1)):
            raise NotComposable("the blocks' forwards overlap")
        self.f = [(fs[b], fs[b + 1]) for b in range(KEPT - 1)] + [(fs[-1], fe[-1] + 1)]
        # backward regions: the ops autograd attributed to each block's calls
        owner = {}
        for b in range(KEPT):
            for i in range(self.top[b], self.end[b]):
                owner[i] = b
        lo, hi = [None] * KEPT, [None] * KEPT
        for op in cap.ops:
            if op.phase == BACKWARD:
                b = owner.get(op.layer)
                if b is not None:
                    lo[b] = op.index if lo[b] is None else min(lo[b], op.index)
                    hi[b] = op.index if hi[b] is None else max(hi[b], op.index)
        self.backward = lo[0] is not None
        if self.backward:
            if any(x is None for x in lo) or any(lo[b] >= lo[b - 1] for b in range(1, KEPT)):
                raise NotComposable("the blocks' backwards did not run in reverse order")
            self.b = [(lo[0], hi[0] + 1)] + [(lo[b], lo[b - 1]) for b in range(1, KEPT)]
            if any(hi[b] >= lo[b - 1] for b in range(1, KEPT)):
                raise NotComposable("the blocks' backwards overlap")
            for op in cap.ops:
                b = owner.get(op.layer)
                if b is not None and op.phase == BACKWARD and not self.b[b][0] <= op.index < self.b[b][1]:
                    raise NotComposable("a block's backward ops are not contiguous")
        else:
            if any(owner.get(op.layer) is not None and op.phase == BACKWARD for op in cap.ops):
                raise NotComposable("a block's backward ran without a forward record")
            self.b = [(0, 0)] * KEPT
        self.owner = owner
        self.n_ops = n_ops
        self.edges = getattr(tr, "edges", False)
        if self.edges:
            self._edges(cap, n_ops)
        self._at = None
        self.lf = self.f[REP][1] - self.f[REP][0]
        self.lb = self.b[REP][1] - self.b[REP][0]
        for b in (REP - 1, REP + 1):
            if self.f[b][1] - self.f[b][0] != self.lf or self.b[b][1] - self.b[b][0] != self.lb:
                raise NotComposable("the middle blocks ran different numbers of ops")

    def _edges(self, cap, n_ops: int) -> None:
        """Blocks whose calls carry hooks of their own (FSDP2's: planning/simulate/composed_rank.py): the
        last block's forward region goes on to the end of the forward, and the first block's backward region
        to the end of the backward. FSDP2 lets go of a block's gathered all-gather output when the next
        block's all-gather is waited on (in the next block's region), and of its reduce-scatter input when
        the next one is issued; the last block's go at the root's post-forward, the first block's at the
        end of the backward, which a middle block's neighbour would hold in its own region. Only where a
        pointer lands changes: an edge block is not copied, and its region and what follows it are shifted
        alike. t3's pointers past the last block, and t1's past the first, become pointers to a neighbour,
        which the pattern check masks as it masks t2's; t1's and t2's there become pointers two blocks
        away, which it refuses."""
        ops = cap.ops
        a, z = self.f[-1]
        phase = ops[a].phase
        while z < n_ops and ops[z].phase == phase:
            z += 1
        self.f[-1] = (a, z)
        if self.backward:
            a, z = self.b[0]
            while z < n_ops and ops[z].phase == BACKWARD:
                z += 1
            self.b[0] = (a, z)

    # ---- where a time is ---------------------------------------------------------------------------------
    def region(self, t: int):
        """(block, kind, offset) of pass-local op ``t``, or None outside the blocks."""
        at = self._at
        if at is None:
            at = self._at = [None] * self.n_ops
            for b in range(KEPT):
                for kind, (a, z) in ((FWD, self.f[b]), (BWD, self.b[b])):
                    for u in range(a, min(z, self.n_ops)):
                        at[u] = (b, kind, u - a)
        return at[t] if 0 <= t < len(at) else None


class Widen:
    """The time and call maps of one pass, for ``R`` copies of t2."""

    def __init__(self, reg: Regions, copies: int) -> None:
        self.reg, self.R = reg, copies
        self.extra_f = (copies - 1) * reg.lf
        self.extra = (copies - 1) * (reg.lf + reg.lb)

    # ---- op times (pass-local) -------------------------------------------------------------------------
    def shift(self, t: int) -> int:
        reg = self.reg
        f, b = reg.f[REP], reg.b[REP]
        if t < f[0]:
            return t
        if f[1] <= t and (not reg.backward or t < b[0]):
            return t + self.extra_f
        if reg.backward and t >= b[1]:
            return t + self.extra
        raise NotComposable("a time inside the repeated block was read as one outside it")

    def copy_time(self, kind: str, offset: int, k: int) -> int:
        reg = self.reg
        if kind == FWD:
            return reg.f[REP][0] + k * reg.lf + offset
        return reg.b[REP][0] + self.extra_f + (self.R - 1 - k) * reg.lb + offset

    def full_block(self, b: int, k: int) -> int:
        return full_block_of(b, k, self.R)

    def kept(self, j: int):
        return kept_of(j, self.R)

    def time(self, t: int, src, k: int = 0) -> int:
        """Pass-local op ``t`` as seen from ``src`` (the block of what points to it: 0..KEPT-1, None
        outside the blocks; ``k`` the copy where src is REP), in the widened pass."""
        if t < 0:
            return t
        r = self.reg.region(t)
        if r is None:
            return self.shift(t)
        b, kind, off = r
        if src is None:
            if b == REP:
                raise NotComposable("something outside the blocks points into the repeated block")
            return self.shift(t)
        if self.reg.edges and src != REP and b != REP:
            # a kept block pointing into a kept block: that block itself (an edge region reaches the other
            # end of the run: the loss after the last block, freed at the first block's end of backward)
            return self.block_time(self.full_block(b, 0), kind, off)
        return self.block_time(self.full_block(src, k) + (b - src), kind, off)

    def block_time(self, j: int, kind: str, off: int) -> int:
        reg = self.reg
        b, copy_k = self.kept(j)
        if copy_k is not None:
            if off >= (reg.lf if kind == FWD else reg.lb):
                raise NotComposable("an offset runs past the repeated block's region")
            return self.copy_time(kind, off, copy_k)
        a, z = (reg.f if kind == FWD else reg.b)[b]
        if a + off >= z:
            raise NotComposable("an offset runs past a block's region")
        return self.shift(a + off)

    # ---- calls -----------------------------------------------------------------------------------------
    def call(self, i: int, src, k: int = 0) -> int:
        reg = self.reg
        b = reg.owner.get(i)
        m = reg.size[REP]
        if b is None:
            return i if i < reg.top[REP] else i + (self.R - 1) * m
        if src is None and b == REP:
            raise NotComposable("a call outside the blocks points into the repeated block")
        j = self.full_block(b, 0) if src is None else self.full_block(src, k) + (b - src)
        kb, copy_k = self.kept(j)
        off = i - reg.top[b]
        if copy_k is not None:
            return reg.top[REP] + copy_k * m + off
        return reg.top[kb] + (0 if kb < REP else (self.R - 1) * m) + off


def inner(t):
    """``t``, or the one tensor a wrapper subclass (DTensor) holds: the storage the tracker knows it by
    (capture/storage.py ``StorageTracker._storage``)."""
    while hasattr(type(t), "__tensor_flatten__"):
        held = [x for x in (getattr(t, n) for n in t.__tensor_flatten__()[0]) if isinstance(x, torch.Tensor)]
        if len(held) != 1:
            break
        t = held[0]
    return t


def ref(d: int, *where):
    """A pointer d blocks away (see the module's docstring)."""
    return ("@", d, *where)


def far(x) -> bool:
    """Whether ``x`` holds a pointer further than the next block or the previous one."""
    if isinstance(x, tuple):
        if x[:1] == ("@",):
            return abs(x[1]) > 1
        return any(far(y) for y in x)
    if isinstance(x, list):
        return any(far(y) for y in x)
    return False


def masked(x, sign: int):
    """``x`` with every pointer towards ``sign`` (-1: earlier blocks, 1: later ones) made alike."""
    if isinstance(x, tuple):
        if x[:1] == ("@",) and x[1] * sign > 0:
            return "*"
        return tuple(masked(y, sign) for y in x)
    if isinstance(x, list):
        return [masked(y, sign) for y in x]
    return x


def full_block_of(b: int, k: int, R: int) -> int:
    """The whole model's block (counted from the run's start) of kept block ``b``, or of copy ``k`` where
    ``b`` is REP (R copies)."""
    return b if b < REP else (REP + k if b == REP else b + R - 1)


def kept_of(j: int, R: int):
    """(kept block, copy) of the whole model's block ``j`` (copy None: not a copy)."""
    if j < REP:
        return j, None
    if j < REP + R:
        return REP, j - REP
    b = j - R + 1
    if b >= KEPT:
        raise NotComposable("a pointer reaches past the blocks that ran")
    return b, None


def runs_of(labels: list, b) -> list[tuple[int, int]]:
    """The maximal stretches (first, last) of ``labels`` equal to ``b``."""
    out, i = [], 0
    while i < len(labels):
        if labels[i] == b:
            j = i
            while j + 1 < len(labels) and labels[j + 1] == b:
                j += 1
            out.append((i, j))
            i = j + 1
        else:
            i += 1
    return out


def copy_places(fields, n: int):
    """(k, fields(k)) for k in 0..n-1, where ``fields(k)`` is a tuple of numbers that grows by the same
    step from one copy to the next (each copy's regions are one region's length from the last's, in the
    forward onwards, in the backward back): ``fields`` is called for the first two copies and the last,
    which must lie on their line; the others are computed."""
    first = fields(0)
    yield 0, first
    if n < 2:
        return
    second = fields(1)
    step = tuple(b - a for a, b in zip(first, second))
    if n > 2 and fields(n - 1) != tuple(a + (n - 1) * d for a, d in zip(first, step)):
        raise NotComposable("the copies' places are not evenly spaced")
    yield 1, second
    for k in range(2, n):
        yield k, tuple(a + k * d for a, d in zip(first, step))


def renote(log, start: int, placed) -> None:
    """The simulation's notes from op ``start`` on, each at its widened place: ``placed(event, tick)``
    gives its copies as (tick, event), in order."""
    keep = sum(1 for t in log.ticks if t < start)
    new = [(tick, order, k, e) for order, (event, t) in enumerate(zip(log.events[keep:], log.ticks[keep:]))
           for k, (tick, e) in enumerate(placed(event, t))]
    new.sort(key=lambda x: x[:3])
    log.events[keep:] = [x[3] for x in new]
    log.ticks[keep:] = [x[0] for x in new]


def block_at(reg: Regions, t: int):
    """(block, offset kind) of the region op ``t`` is in, block None outside them."""
    r = reg.region(t)
    return None if r is None else r[0]
