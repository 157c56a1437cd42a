"""A simulated step composed from one block: the shorter model of capture/blocks.py runs (the first
three blocks of a run of ``n`` identical ones and the last two), and each pass's record, and each
optimizer step's, is widened to the whole model's, as if the third block had run ``n - 4`` times in a
row.

Why this is the whole model's record. Call the five blocks t0..t4 and the whole model's blocks
0..n-1: t0, t1 are blocks 0 and 1, t3, t4 are blocks n-2 and n-1, and the copies c0..c(R-1) of t2
(R = n - 4, c0 is t2 itself) are blocks 2..n-3. A block's *region* in the forward is the ops from its
first one to the next block's first (so the loop's own ops between two blocks belong to the block
before them), in the backward from its first backward op to the previous block's first. Everything
the run records is anchored in one region or in none (ops, module calls, the storages' births, the
simulation's notes) and may point into another (an op's producers, a storage's allocation and death,
a call's span, parent, children and outputs). A pointer from block i into block j is kept as
(j - i, the kind of region, the offset in it); a pointer to or from no block as its time.
``Composer._pattern`` writes t1's, t2's and t3's records in those terms, and they must agree: towards
the next block t1's and t2's (whose next blocks, t2 and t3, are middle ones), towards the previous
block t2's and t3's (t1 and t2), in their own regions all three; no pointer may reach two blocks
away. Blocks that are identical (blocks.py) and receive the same input specs run the same ops; the
agreement shows that the code around them treats the middle ones alike and that what a block's
storages and ops point to is a fixed distance away, so by induction every middle block of the whole
model leaves the same record: block 2 + k's is t2's with each pointer (d, kind, offset) sent to block
2 + k + d's region of that kind, at that offset (``_Widen``; the places of the copies lie on a line,
``_copies``, computed for the first two and checked at the last). Blocks 0, 1, n-2, n-1 and everything
outside the blocks keep their records, shifted by the (R - 1) copies of t2's regions inserted before
them. ``widen`` does this to the session's ops and calls and to the storage tracker's Blocks, and the
report is built from them as from a run of the whole model. A storage of t2's that is still alive
when the pass ends has in each copy a Block that dies with t2's (``StorageTracker.followers``: a
gradient at zero_grad, an output the loop keeps).

The optimizer steps the shorter model's parameters only. Its ops are watched (``optimizer_begins``)
and each is given to the parameter whose tensors it reads (an op that reads none, as Adam's
``torch.tensor(0.0)`` for a new ``step``, to the next op's); ops over several parameters at once
(foreach) make one tensor per parameter, in the parameters' order. ``optimizer_ends`` finds, in each of
the optimizer's loops over parameters, the stretch of t2's parameters (between t1's and t3's, which
must agree with it in the same sense as above), repeats it once per other copy right after it, and
makes again what a foreach op made for t2's parameters, at the same op, after t2's. An op of no
parameter (other than record_function's markers) refuses: it could be one per parameter.

Where anything differs, ``NotComposable`` says what, and the caller simulates the whole model; the
loop around the blocks is checked by capture/composed.py. The report is the same byte for byte as the
whole model's simulation (tests/capture/test_compose.py).
"""

from __future__ import annotations

import copy

from ..trace import BACKWARD, OpEvent
from .blocks import KEPT, REP, Truncated

__all__ = ["NotComposable", "Composer"]


class NotComposable(Exception):
    """The shorter model's run cannot stand for the whole model's (the reason is the message)."""


_F, _B = "F", "B"


class _Regions:
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
        self._at = None
        self.lf = self.f[REP][1] - self.f[REP][0]
        self.lb = self.b[REP][1] - self.b[REP][0]
        for b in (REP - 1, REP + 1):
            if self.f[b][1] - self.f[b][0] != self.lf or self.b[b][1] - self.b[b][0] != self.lb:
                raise NotComposable("the middle blocks ran different numbers of ops")

    # ---- where a time is ---------------------------------------------------------------------------------
    def region(self, t: int):
        """(block, kind, offset) of pass-local op ``t``, or None outside the blocks."""
        at = self._at
        if at is None:
            at = self._at = [None] * self.n_ops
            for b in range(KEPT):
                for kind, (a, z) in ((_F, self.f[b]), (_B, self.b[b])):
                    for u in range(a, min(z, self.n_ops)):
                        at[u] = (b, kind, u - a)
        return at[t] if 0 <= t < len(at) else None


class _Widen:
    """The time and call maps of one pass, for ``R`` copies of t2."""

    def __init__(self, reg: _Regions, copies: int) -> None:
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
        if kind == _F:
            return reg.f[REP][0] + k * reg.lf + offset
        return reg.b[REP][0] + self.extra_f + (self.R - 1 - k) * reg.lb + offset

    def full_block(self, b: int, k: int) -> int:
        return _full_block(b, k, self.R)

    def kept(self, j: int):
        return _kept(j, self.R)

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
        return self.block_time(self.full_block(src, k) + (b - src), kind, off)

    def block_time(self, j: int, kind: str, off: int) -> int:
        reg = self.reg
        b, copy_k = self.kept(j)
        if copy_k is not None:
            if off >= (reg.lf if kind == _F else reg.lb):
                raise NotComposable("an offset runs past the repeated block's region")
            return self.copy_time(kind, off, copy_k)
        a, z = (reg.f if kind == _F else reg.b)[b]
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


def _ref(d: int, *where):
    """A pointer d blocks away (see the module's docstring)."""
    return ("@", d, *where)


def _far(x) -> bool:
    """Whether ``x`` holds a pointer further than the next block or the previous one."""
    if isinstance(x, tuple):
        if x[:1] == ("@",):
            return abs(x[1]) > 1
        return any(_far(y) for y in x)
    if isinstance(x, list):
        return any(_far(y) for y in x)
    return False


def _masked(x, sign: int):
    """``x`` with every pointer towards ``sign`` (-1: earlier blocks, 1: later ones) made alike."""
    if isinstance(x, tuple):
        if x[:1] == ("@",) and x[1] * sign > 0:
            return "*"
        return tuple(_masked(y, sign) for y in x)
    if isinstance(x, list):
        return [_masked(y, sign) for y in x]
    return x


def _full_block(b: int, k: int, R: int) -> int:
    """The whole model's block (counted from the run's start) of kept block ``b``, or of copy ``k`` where
    ``b`` is REP (R copies)."""
    return b if b < REP else (REP + k if b == REP else b + R - 1)


def _kept(j: int, R: int):
    """(kept block, copy) of the whole model's block ``j`` (copy None: not a copy)."""
    if j < REP:
        return j, None
    if j < REP + R:
        return REP, j - REP
    b = j - R + 1
    if b >= KEPT:
        raise NotComposable("a pointer reaches past the blocks that ran")
    return b, None


def _runs(labels: list, b) -> list[tuple[int, int]]:
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


def _copies(fields, n: int):
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


def _renote(log, start: int, placed) -> None:
    """The simulation's notes from op ``start`` on, each at its widened place: ``placed(event, tick)``
    gives its copies as (tick, event), in order."""
    keep = sum(1 for t in log.ticks if t < start)
    new = [(tick, order, k, e) for order, (event, t) in enumerate(zip(log.events[keep:], log.ticks[keep:]))
           for k, (tick, e) in enumerate(placed(event, t))]
    new.sort(key=lambda x: x[:3])
    log.events[keep:] = [x[3] for x in new]
    log.ticks[keep:] = [x[0] for x in new]


def _src_of_time(reg: _Regions, t: int):
    """(block, offset kind) of the region op ``t`` is in, block None outside them."""
    r = reg.region(t)
    return None if r is None else r[0]


class Composer:
    """Widens each pass of a run of the shorter model (``tr``) to the whole model's."""

    def __init__(self, tr: Truncated, full_model, params: dict, buffers: dict, router=None) -> None:
        self.tr = tr
        self.full = full_model
        self.params = params
        self.state = {**params, **buffers}
        self.router = router
        self._passes: list[int] = []
        self._twins: list = []              # (Block, its copies' Blocks): roles marked later go to the copies
        self._opt = None
        self._owner: dict[int, str] = {}    # id(Block) -> the parameter whose step made it (or it is)
        run = tr.run
        self.R = run.count - KEPT + 1         # copies of the repeated block (itself the first)
        self.full_container = full_model.get_submodule(run.path) if run.path else full_model
        self.pre = run.path + "." if run.path else ""

    # ---- names -------------------------------------------------------------------------------------------
    def copy_path(self, path: str, k: int) -> str:
        """t2's ``path`` (or a path inside it) in copy ``k``."""
        head = f"{self.pre}{self.tr.run.start + REP}"
        return f"{self.pre}{self.tr.run.start + REP + k}{path[len(head):]}"

    def rename(self, where: str) -> str:
        """A note's place (a module path, perhaps with " (backward)") in the whole model's names."""
        path, sep, rest = where.partition(" ")
        return self.tr.full_path(path) + sep + rest

    # ---- the pattern check -------------------------------------------------------------------------------
    def _pattern(self, b: int, reg: _Regions, cap, blocks, log, router, offset: int) -> list:
        """Block ``b``'s record with every pointer relative to it (see the module's docstring)."""
        def t_rel(t: int):
            if t is None or t < 0:
                return ("abs", t)
            r = reg.region(t)
            return ("abs", t) if r is None else _ref(r[0] - b, r[1], r[2])

        def g_rel(t):
            return t_rel(t - offset) if t is not None and t >= offset else ("abs", t)

        def c_rel(i):
            if i is None:
                return None
            o = reg.owner.get(i)
            return ("abs", i) if o is None else _ref(o - b, i - reg.top[o])

        out = []
        for kind, (a, z) in ((_F, reg.f[b]), (_B, reg.b[b])):
            for op in cap.ops[a:z]:
                out.append(("op", kind, op.index - a, op.op, c_rel(op.layer), op.phase, op.status, op.costs,
                            tuple(t_rel(p) if p >= 0 else p for p in op.producers), op.window, op.executed,
                            op.attention))
        head = cap.calls[reg.top[b]].path
        for i in range(reg.top[b], reg.end[b]):
            c = cap.calls[i]
            out.append(("call", c.path[len(head):], c.type, c.depth, c.call_index, c_rel(c.parent),
                        tuple(c_rel(x) for x in c.children), c.inputs, c.outputs,
                        tuple(t_rel(p) if p >= 0 else p for p in c.output_producers),
                        t_rel(c.span[0]), t_rel(c.span[1]), type(c.module)))
        for blk in blocks:
            born = g_rel(blk.born)
            dies = g_rel(blk.free) if blk.free is not None else None
            if not (born[:2] == ("@", 0) or dies is not None and dies[:2] == ("@", 0)):
                continue
            out.append(("storage", born, g_rel(blk.alloc), dies, blk.nbytes, blk.roles, blk.phase, blk.op, blk.tag,
                        blk.pass_index, c_rel(blk.layer) if blk.pass_index == len(self._passes) else blk.layer,
                        None if blk.saved_by is None else (blk.saved_by[0], c_rel(blk.saved_by[1]))))
        if log is not None:
            for (kind, what, where), tick in zip(log.events, log.ticks):
                r = g_rel(tick)
                if r[:2] == ("@", 0):
                    out.append(("note", kind, what, where.replace(head, "", 1), r))
        if router is not None:
            for tick, kernel in router.ticks:
                r = g_rel(tick)
                if r[:2] == ("@", 0):
                    out.append(("sdpa", kernel, r))
        if _far(out):
            raise NotComposable("a block's record points two blocks away")
        return out

    # ---- one pass ----------------------------------------------------------------------------------------
    def widen(self, cap, tracker, run, offset: int, first_block: int, known_before) -> None:
        """Make the pass that started at global op ``offset`` (its Blocks from ``tracker.blocks
        [first_block]`` on) the whole model's: the session's ops and calls, the tracker's blocks and
        clock, the run's phase ranges, the log's notes and the router's counts."""
        log, router = run.log, self.router
        n_ops = tracker.clock + 1 - offset
        if len(cap.ops) != n_ops:
            raise NotComposable("the session's ops and the tracker's clock disagree")
        if run.known is not None and known_before != (run.known.assumed, run.known.cast_ones):
            raise NotComposable("the simulation assumed values (an MoE router's choices)")
        if self.tr.reads:
            raise NotComposable(f"the forward read {self.tr.reads[0]!r}, which differs between the blocks")
        reg = _Regions(cap, self.tr, n_ops)
        seg = tracker.blocks[first_block:]
        # the middle blocks' records: alike towards the next block (REP - 1 and REP, whose next ones are
        # middle blocks too) and towards the previous one (REP and REP + 1)
        pats = {b: self._pattern(b, reg, cap, seg, log, router, offset) for b in (REP - 1, REP, REP + 1)}
        if _masked(pats[REP - 1], -1) != _masked(pats[REP], -1) or _masked(pats[REP], 1) != _masked(pats[REP + 1], 1):
            raise NotComposable("the middle blocks left different records")
        w = _Widen(reg, self.R)
        R = self.R
        # the Blocks made before the pass that die in it
        here = len(self._passes)
        for blk in tracker.blocks[:first_block]:
            if blk.free is not None and blk.free >= offset:
                blk.free = offset + w.time(blk.free - offset, None)
            if blk.saved_by is not None and blk.saved_by[0] == here:
                # saved by a layer of this pass (a parameter, by its own block's layer)
                owner = reg.owner.get(blk.saved_by[1])
                blk.saved_by = (here, w.call(blk.saved_by[1], owner, 0))
        # ops
        ops: list = [None] * (n_ops + w.extra)
        for op in cap.ops:
            src = _src_of_time(reg, op.index)

            def fields(k, op=op, src=src):
                return (w.time(op.index, src, k), w.call(op.layer, src, k),
                        *(w.time(p, src, k) if p >= 0 else p for p in op.producers))
            for k, (t, layer, *producers) in _copies(fields, R if src == REP else 1):
                ops[t] = OpEvent(t, op.op, layer, op.phase, op.status, op.costs, tuple(producers), op.window,
                                 op.executed, op.attention)
        if any(o is None for o in ops):
            raise NotComposable("the widened pass has gaps")
        # calls
        calls = self._calls(cap, reg, w)
        # storages
        self._storages(tracker, reg, w, seg, first_block, offset)
        self._state_marks(tracker, w)
        # notes and counts
        if log is not None:
            self._notes(log, reg, w, offset)
        if router is not None:
            for tick, kernel in list(router.ticks):
                if tick >= offset and _src_of_time(reg, tick - offset) == REP:
                    router.picked[kernel] += R - 1
        # phases of this pass (appended by the pass after ``offset``)
        run.phase_ranges[:] = [(s, ph, a if a < offset else offset + w.time(a - offset, None),
                                z if z < offset else offset + w.time(z - offset, None))
                               for s, ph, a, z in run.phase_ranges]
        cap.ops[:] = ops
        cap.calls[:] = calls
        originals = self.tr.originals
        ncalls = {id(originals[key]) if key in originals else key: v for key, v in cap.ncalls.items()}
        for c in calls[reg.top[REP] + reg.size[REP]: reg.top[REP] + R * reg.size[REP]]:
            ncalls[id(c.module)] = ncalls.get(id(c.module), 0) + 1
        cap.ncalls.clear()
        cap.ncalls.update(ncalls)
        tracker.clock = offset + n_ops + w.extra - 1
        self._passes.append(offset)

    def _module(self, c, k: int):
        if k == 0:
            m = c.module
            return self.tr.originals.get(id(m), m)
        return self.full.get_submodule(self.copy_path(c.path, k))

    def _calls(self, cap, reg: _Regions, w: _Widen) -> list:
        old = cap.calls
        out = []
        for i, c in enumerate(old):
            src = reg.owner.get(i)
            for k in range(w.R if src == REP else 1):
                n = copy.copy(c)
                n.index = w.call(i, src, k)
                n.module = self._module(c, k) if src == REP else self.tr.originals.get(id(c.module), c.module)
                n.path = self.copy_path(c.path, k) if src == REP else self.tr.full_path(c.path)
                n.parent = None if c.parent is None else w.call(c.parent, src, k)
                kids = []
                for x in c.children:
                    if src is None and reg.owner.get(x) == REP:
                        kids += [w.call(x, REP, j) for j in range(w.R)]
                    else:
                        kids.append(w.call(x, src, k))
                n.children = kids if isinstance(c.children, list) else tuple(kids)
                n.output_producers = tuple(w.time(p, src, k) if p >= 0 else p for p in c.output_producers)
                a, z = c.span
                na = w.time(a, src, k)
                n.span = (na, w.time(z, src, k) if z >= a else na - 1)
                out.append(n)
        out.sort(key=lambda x: x.index)
        if [x.index for x in out] != list(range(len(out))):
            raise NotComposable("the widened calls are not numbered in order")
        return out

    def _storages(self, tracker, reg: _Regions, w: _Widen, seg: list, first_block: int, offset: int) -> None:
        g = lambda t, src, k=0: t if t is None or t < offset else offset + w.time(t - offset, src, k)  # noqa: E731
        here = len(self._passes)
        made = []
        for order, blk in enumerate(seg):
            born_local = blk.born - offset
            src = _src_of_time(reg, born_local) if born_local >= 0 else None
            born, alloc, free, layer, saved_by = blk.born, blk.alloc, blk.free, blk.layer, blk.saved_by
            alive = free is None
            ours = blk.pass_index == here and layer is not None
            saved = saved_by is not None and saved_by[0] == here

            def fields(k, src=src, born=born, alloc=alloc, free=free, layer=layer, saved_by=saved_by,
                       born_local=born_local, alive=alive, ours=ours, saved=saved):
                return (g(born, src, k) if born_local >= 0 else born, g(alloc, src, k) if alloc >= offset else alloc,
                        -1 if alive else g(free, src, k), w.call(layer, src, k) if ours else -1,
                        w.call(saved_by[1], src, k) if saved else -1)
            copies = []
            for k, (b_, a_, f_, l_, s_) in _copies(fields, w.R if src == REP else 1):
                c = blk if k == 0 else copy.copy(blk)
                c.born, c.alloc = b_, a_
                if not alive:
                    c.free = f_
                if ours:
                    c.layer = l_
                if saved:
                    c.saved_by = (here, s_)
                made.append((b_, order, k, c))
                if k:
                    copies.append(c)
            if src == REP:
                self._twins.append((blk, copies))
                if alive:      # dies with the block's own (a gradient at zero_grad, a kept output ...)
                    tracker.followers.setdefault(id(blk), []).extend(copies)
        made.sort(key=lambda x: (x[0], x[1], x[2]))
        tracker.blocks[first_block:] = [x[3] for x in made]

    def _state_marks(self, tracker, w: _Widen) -> None:
        """What t2's run did to its parameters' and buffers' Blocks (saved for backward by a layer of it),
        done to each copy's."""
        head = f"{self.pre}{self.tr.run.start + REP}."
        here = len(self._passes)
        live = tracker.live
        for name, t in self.state.items():
            if not name.startswith(head):
                continue
            b = live.get(id(t.untyped_storage()))
            if b is None or b.saved_by is None or b.saved_by[0] != here:
                continue
            for k in range(1, w.R):
                c = live.get(id(self.state[self.copy_path(name, k)].untyped_storage()))
                if c is not None:
                    c.roles |= b.roles
                    if c.saved_by is None:
                        c.saved_by = (here, w.call(b.saved_by[1], REP, k))

    # ---- the optimizer's step ---------------------------------------------------------------------------
    def block_of_name(self, name: str):
        """The kept block (0..KEPT-1) a parameter of the whole model is in, None outside them."""
        run = self.tr.run
        if not name.startswith(self.pre):
            return None
        head = name[len(self.pre):].partition(".")[0]
        if not head.isdigit():
            return None
        i = int(head) - run.start
        if 0 <= i <= REP:
            return i
        if run.count - (KEPT - REP - 1) <= i < run.count:
            return i - run.count + KEPT
        return None

    def trim_optimizer(self, opt, names: dict[int, str]) -> None:
        """Take the copies' parameters out of the optimizer, built as the user's factory builds it for
        the whole model's (``names``: id(parameter) -> name): it steps the shorter model's, and the
        copies' steps are composed (``optimizer_ends``). Refused where the copies' parameters are not
        in the groups of the repeated block's own, in the blocks' order, or fill a group alone."""
        run = self.tr.run
        group_of: dict[str, int] = {}
        for g, group in enumerate(opt.param_groups):
            last = -1
            keep = []
            for p in group["params"]:
                name = names.get(id(p), "")
                j = self._place(name)
                if j is not None:
                    if j < last:
                        raise NotComposable("the optimizer does not hold the blocks' parameters in the blocks' order")
                    last = j
                    group_of[name] = g
                if j is None or not REP < j < run.count - (KEPT - REP - 1):
                    keep.append(p)
                else:
                    opt.state.pop(p, None)      # state an optimizer makes when built (Adagrad's sum)
            if not keep:
                raise NotComposable("the optimizer has a group of the left-out blocks' parameters alone")
            group["params"] = keep
        head = f"{self.pre}{run.start + REP}."
        for name, g in group_of.items():
            j = self._place(name)
            if REP < j < run.count - (KEPT - REP - 1):
                if group_of.get(head + name[len(self.pre):].partition(".")[2]) != g:
                    raise NotComposable("the optimizer treats the left-out blocks' parameters apart")

    def _place(self, name: str):
        """The place in the run (0..n-1) of a parameter's block, None outside the run."""
        if not name.startswith(self.pre):
            return None
        head = name[len(self.pre):].partition(".")[0]
        if not head.isdigit():
            return None
        i = int(head) - self.tr.run.start
        return i if 0 <= i < self.tr.run.count else None

    def optimizer_begins(self, tracker, opt) -> None:
        """Watch the optimizer's ops (each op's inputs and outputs) from the next op on: which parameter
        each tensor belongs to, by the Block of its storage, or the storage itself where it is no Block
        (a CUDA target's host tensors: Adam's ``step``)."""
        live = tracker.live

        def key(t):
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                return None
            b = live.get(id(st))
            return (id(b), b) if b is not None else (("storage", id(st)), None)
        names = {id(p): n for n, p in self.params.items()}
        for p, state in [(p, None) for p in self.params.values()] + list(opt.state.items()):
            name = names.get(id(p))
            for t in [p, p.grad] if state is None else [v for v in state.values() if hasattr(v, "untyped_storage")]:
                k = key(t) if t is not None else None
                if k is not None and name is not None:
                    self._owner[k[0]] = name
        start = tracker.clock + 1
        ops: list = []
        self._opt = (start, ops, len(tracker.blocks))
        tracker.observer = lambda name, ins, outs: ops.append((name, [key(t) for t in ins], [key(t) for t in outs]))

    def optimizer_ends(self, tracker, run) -> None:
        """The step the optimizer made on the shorter model's parameters widened to the whole model's:
        the ops of the repeated block's parameters (in each of the optimizer's loops over parameters)
        repeated after them once per other copy, and what its ops over all parameters at once (foreach)
        made for them made again at the same op (see the module's docstring)."""
        tracker.observer = None
        start, ops, first_block = self._opt
        self._opt = None
        if len(ops) != tracker.clock + 1 - start:
            raise NotComposable("the optimizer's ops and the tracker's clock disagree")
        owner = self._owner
        label: list = [None] * len(ops)        # per op: the parameter it steps, "*" several at once
        pending: list[int] = []
        multi_outs: dict[int, str] = {}        # id(Block) made by an op over several -> its parameter
        for i, (op_name, ins, outs) in enumerate(ops):
            names = list(dict.fromkeys(owner[k[0]] for k in ins if k is not None and k[0] in owner))
            if len(names) == 1:
                label[i] = names[0]
                for j in pending + [i]:
                    label[j] = names[0]
                    for k in ops[j][2]:
                        if k is not None:
                            owner[k[0]] = names[0]
                pending.clear()
            elif not names:
                if not op_name.startswith("profiler."):     # record_function's markers: not a parameter's
                    pending.append(i)
            else:
                label[i] = "*"
                for j, k in enumerate(outs):
                    src = ins[j] if j < len(ins) else None
                    name = owner.get(src[0]) if src is not None else None
                    if k is None or name is None:
                        raise NotComposable(f"an optimizer op over several parameters ({op_name}) made a tensor "
                                            "of none of them")
                    owner[k[0]] = name
                    if k[1] is not None:
                        multi_outs[id(k[1])] = name
        if pending:
            raise NotComposable(f"the optimizer ran ops of no parameter ({ops[pending[0]][0]})")
        block = [None if x is None or x == "*" else self.block_of_name(x) for x in label]
        segs = {b: _runs(block, b) for b in range(KEPT)}
        if not (len(segs[REP - 1]) == len(segs[REP]) == len(segs[REP + 1])):
            raise NotComposable("the optimizer's loops over the middle blocks' parameters differ")
        R = self.R
        lens = [z - a + 1 for a, z in segs[REP]]

        def where(t: int):
            """(kept block, its stretch, offset) of global op ``t`` of the phase, None elsewhere."""
            u = t - start
            for b, ss in segs.items():
                for i, (a, z) in enumerate(ss):
                    if a <= u <= z:
                        return b, i, u - a
            return None

        def at(t: int, k: int = 0) -> int:
            """Global op ``t`` widened (copy ``k`` of a repeated stretch where it is in one)."""
            if t < start:
                return t
            u, extra = t - start, 0
            for (a, z), n in zip(segs[REP], lens):
                if u > z:
                    extra += (R - 1) * n
                elif a <= u:
                    return t + extra + k * n
            return t + extra

        def seen_from(t, src, k: int = 0) -> int:
            """Global op ``t`` as what block ``src`` (copy ``k``) made points to it, widened."""
            r = where(t) if t is not None and t >= start else None
            if r is None:
                return t if t is None else at(t)
            b, i, off = r
            if src is None:
                if b == REP:
                    raise NotComposable("something outside the blocks' steps points into the repeated one's")
                return at(t)
            kb, kc = _kept(_full_block(src, k, R) + (b - src), R)
            ss = segs[REP if kc is not None else kb]
            if i >= len(ss) or ss[i][0] + off > ss[i][1]:
                raise NotComposable("the optimizer's stretches of the blocks differ in length")
            return at(start + ss[i][0] + off, kc or 0)
        made = tracker.blocks[first_block:]

        def pattern(b: int) -> list:
            def rel(t):
                r = where(t) if t is not None and t >= start else None
                return ("abs", t) if r is None else _ref(r[0] - b, r[1], r[2])
            out = [tuple(ops[u][0] for u in range(a, z + 1)) for a, z in segs[b]]
            for blk in made:
                born, dies = rel(blk.born), rel(blk.free)
                if born[:2] == ("@", 0) or dies[:2] == ("@", 0):
                    out.append((born, rel(blk.alloc), dies, blk.nbytes, blk.roles, blk.tag, id(blk) in multi_outs))
                elif id(blk) in multi_outs and self.block_of_name(multi_outs[id(blk)]) == b:
                    out.append(("*", blk.born, blk.alloc, dies, blk.nbytes, blk.roles, blk.tag))
            if _far(out):
                raise NotComposable("an optimizer step points two blocks away")
            return out
        pats = {b: pattern(b) for b in (REP - 1, REP, REP + 1)}
        if _masked(pats[REP - 1], -1) != _masked(pats[REP], -1) or _masked(pats[REP], 1) != _masked(pats[REP + 1], 1):
            raise NotComposable("the optimizer's steps of the middle blocks' parameters differ")
        # what died in the phase, at its widened time (made before the phase: seen from no block)
        for blk in tracker.blocks[:first_block]:
            if blk.free is not None and blk.free >= start:
                blk.free = seen_from(blk.free, None)
        clones = []

        def for_rep(blk) -> bool:
            return id(blk) in multi_outs and self.block_of_name(multi_outs[id(blk)]) == REP
        # an op over several parameters makes the copies' tensors after the repeated block's, in the order
        # of the parameters: after its last one
        last = {blk.born: order for order, blk in enumerate(made) if for_rep(blk)}
        for order, blk in enumerate(made):
            born, alloc, free = blk.born, blk.alloc, blk.free
            r = where(born)
            src = None if r is None else r[0]
            blk.born, blk.alloc, blk.free = at(born), at(alloc) if alloc >= start else alloc, seen_from(free, src)
            copies = []
            if src == REP:
                for k in range(1, R):
                    c = copy.copy(blk)
                    c.born, c.alloc, c.free = at(born, k), at(alloc, k), seen_from(free, REP, k)
                    copies.append(c)
            elif for_rep(blk):
                copies = [copy.copy(blk) for _ in range(1, R)]     # made at the same op, for each copy
            if copies:
                self._twins.append((blk, copies))
                if blk.free is None:
                    tracker.followers.setdefault(id(blk), []).extend(copies)
            clones.append(((blk.born, order, 0, 0), blk))
            major = last[born] if for_rep(blk) else order
            clones += [((c.born, major, k, order), c) for k, c in enumerate(copies, start=1)]
        clones.sort(key=lambda x: x[0])
        tracker.blocks[first_block:] = [x[1] for x in clones]

        def in_seg(t):
            r = where(t) if t >= start else None
            return r is not None and r[0] == REP
        if run.log is not None:
            _renote(run.log, start, lambda e, t: [(at(t, k), e) for k in range(R if in_seg(t) else 1)])
        tracker.clock += (R - 1) * sum(lens)

    def finish(self, run) -> None:
        """After the run: the copies' Blocks take the roles their block's got later (a gradient, optimizer
        state), and the copies' parameters their gradients' and optimizer state's bytes."""
        for blk, copies in self._twins:
            for c in copies:
                c.roles |= blk.roles
        head = f"{self.pre}{self.tr.run.start + REP}."
        for table in (run.grad_bytes, run.optimizer_bytes):
            for name, v in list(table.items()):
                if name.startswith(head):
                    for k in range(1, self.R):
                        table[self.copy_path(name, k)] = v
        # the whole model's order of names (the report lists parameters as the model does)
        order = list(self.params)
        for attr in ("grad_bytes", "optimizer_bytes"):
            table = getattr(run, attr)
            setattr(run, attr, {n: table[n] for n in order if n in table})

    def _notes(self, log, reg: _Regions, w: _Widen, offset: int) -> None:
        def placed(event, t):
            kind, what, where = event
            local = t - offset
            src = _src_of_time(reg, local) if local >= 0 else None
            if src != REP:
                return [(offset + w.time(local, src) if local >= 0 else t, (kind, what, self.rename(where)))]
            path, sep, rest = where.partition(" ")
            return [(offset + w.time(local, src, k), (kind, what, self.copy_path(path, k) + sep + rest))
                    for k in range(w.R)]
        _renote(log, offset, placed)


