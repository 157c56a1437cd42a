"""A simulated step composed from one block: the shorter model of capture/blocks.py runs (the first
three blocks of a run of ``n`` identical ones and the last), and each pass's record is widened to the
whole model's, as if the third block had run ``n - 3`` times in a row.

Why this is the whole model's record. Call the four blocks t0..t3 and the whole model's blocks
0..n-1 (t0, t1 are blocks 0 and 1, t3 is block n-1, the copies c0..c(R-1), R = n - 3, are blocks
2..n-2). A block's *region* in the forward is the ops from its first one to the next block's first
(so the loop's own ops between two blocks belong to the block before them), in the backward from its
first backward op to the previous block's first. Everything the run records is anchored in one
region or in none (ops, module calls, the storages' births, the simulation's notes) and may point
into another (an op's producers, a storage's allocation and death, a call's span and outputs). A
pointer from block i into block j is kept as (j - i, the kind of region, the offset in it); a pointer
to or from no block as its time. ``_Regions.pattern`` writes t1's and t2's records in those terms;
they must be equal, element for element, and every pointer in either must reach at most one block
ahead or back from where t0..t3 exist. Blocks that are identical (blocks.py) and receive the same
input specs run the same ops; equal patterns show that the code around them (the loop, what it
keeps) treats the second and third alike, and that what each block's storages and ops point to is a
fixed distance away. By induction every middle block of the whole model leaves that same pattern:
block 2 + k's record is t2's with each pointer (d, kind, offset) sent to block 2 + k + d's region of
that kind, at that offset; blocks 0, 1 and n-1 and everything outside the blocks keep their records,
shifted by the (R - 1) copies of t2's regions inserted before them. ``widen`` does this to the
session's ops and calls and to the storage tracker's blocks, and the report is built from them as from
a run of the whole model (byte for byte the same; tests/capture/test_compose.py). A storage of t2's that
is still alive when the pass ends is, in each copy, the gradient of the copy's own parameter (made
as a tensor, so the optimizer finds it), or a Block that dies with t2's (``StorageTracker.followers``).
Where anything differs, ``NotComposable`` says what, and the caller simulates the whole model.
"""

from __future__ import annotations

import copy

import torch

from ..trace import BACKWARD, OpEvent
from .blocks import KEPT, REP, Truncated

__all__ = ["NotComposable", "Composer"]


class NotComposable(Exception):
    """The shorter model's run cannot stand for the whole model's (the reason is the message)."""


_F, _B = "F", "B"


class _Regions:
    """Where t0..t3 ran in one pass (pass-local op indices and call indices)."""

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
        self.lf = self.f[REP][1] - self.f[REP][0]
        self.lb = self.b[REP][1] - self.b[REP][0]
        for b in (REP - 1, REP + 1):
            if self.f[b][1] - self.f[b][0] != self.lf or self.b[b][1] - self.b[b][0] != self.lb:
                raise NotComposable("the middle blocks ran different numbers of ops")

    # ---- where a time is ---------------------------------------------------------------------------------
    def region(self, t: int):
        """(block, kind, offset) of pass-local op ``t``, or None outside the blocks."""
        for b in range(KEPT):
            a, z = self.f[b]
            if a <= t < z:
                return b, _F, t - a
            a, z = self.b[b]
            if a <= t < z:
                return b, _B, t - a
        return None

    def block_of_call(self, i: int):
        return self.owner.get(i)


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
        """The whole model's block (counted from the run's start) of t_b, or of copy k where b is REP."""
        return b if b < REP else (REP + k if b == REP else b + self.R - 1)

    def kept(self, j: int):
        """(kept block, copy) of the whole model's block ``j`` (copy None: not a copy)."""
        if j < REP:
            return j, None
        if j < REP + self.R:
            return REP, j - REP
        b = j - self.R + 1
        if b >= KEPT:
            raise NotComposable("a pointer reaches past the blocks that ran")
        return b, None

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
                            tuple(t_rel(p) if p >= 0 else p for p in op.producers), op.window))
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
            for k in range(R if src == REP else 1):
                t = w.time(op.index, src, k)
                ops[t] = OpEvent(t, op.op, w.call(op.layer, src, k), op.phase, op.status, op.costs,
                                 tuple(w.time(p, src, k) if p >= 0 else p for p in op.producers), op.window)
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
        grads = self._grads(tracker)
        here = len(self._passes)
        made = []
        for order, blk in enumerate(seg):
            born_local = blk.born - offset
            src = _src_of_time(reg, born_local) if born_local >= 0 else None
            layer_src = src
            originals = [blk]
            if src == REP:
                originals += [copy.copy(blk) for _ in range(w.R - 1)]   # times set below
            born, alloc, free, layer, saved_by = blk.born, blk.alloc, blk.free, blk.layer, blk.saved_by
            alive = free is None
            for k, b in enumerate(originals):
                b.born = g(born, src, k) if born_local >= 0 else born
                b.alloc = g(alloc, src, k) if alloc >= offset else alloc
                if not alive:
                    b.free = g(free, src, k)
                if blk.pass_index == here and layer is not None:
                    b.layer = w.call(layer, layer_src, k)
                if saved_by is not None and saved_by[0] == here:
                    b.saved_by = (here, w.call(saved_by[1], layer_src, k))
                made.append((b.born, order, k, b))
            if src == REP and alive:
                rel = grads.get(id(blk))
                if rel is None:
                    tracker.followers.setdefault(id(blk), []).extend(originals[1:])
                else:
                    for k, b in enumerate(originals[1:], start=1):
                        self._grad_copy(tracker, rel, k, blk, b)
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

    def _grads(self, tracker) -> dict[int, str]:
        """id(Block) of each gradient of t2's parameters -> the parameter's name inside the block."""
        out = {}
        head = f"{self.pre}{self.tr.run.start + REP}."
        tracker_live = tracker.live
        for name, p in self.params.items():
            if name.startswith(head) and p.grad is not None:
                st = p.grad.untyped_storage()
                b = tracker_live.get(id(st))
                if b is not None:
                    out[id(b)] = name[len(head):]
        return out

    def _grad_copy(self, tracker, rel: str, k: int, orig, blk) -> None:
        """The copy ``k``'s parameter gets a gradient tensor; its storage is the Block ``blk``."""
        name = f"{self.pre}{self.tr.run.start + REP + k}.{rel}"
        p = self.params[name]
        g0 = self.params[f"{self.pre}{self.tr.run.start + REP}.{rel}"].grad
        g = torch.empty_strided(tuple(g0.shape), tuple(g0.stride()), dtype=g0.dtype, device=g0.device)
        p.grad = g
        tracker.adopt(g, blk)

    def _notes(self, log, reg: _Regions, w: _Widen, offset: int) -> None:
        keep = [(e, t) for e, t in zip(log.events, log.ticks) if t < offset]
        new = []
        for order, ((kind, what, where), t) in enumerate(zip(log.events[len(keep):], log.ticks[len(keep):])):
            local = t - offset
            src = _src_of_time(reg, local) if local >= 0 else None
            for k in range(w.R if src == REP else 1):
                tt = offset + w.time(local, src, k) if local >= 0 else t
                place = where
                if src == REP:
                    path, sep, rest = where.partition(" ")
                    place = self.copy_path(path, k) + sep + rest
                else:
                    place = self.rename(where)
                new.append((tt, order, k, (kind, what, place)))
        new.sort(key=lambda x: (x[0], x[1], x[2]))
        log.events[:] = [e for e, _ in keep] + [x[3] for x in new]
        log.ticks[:] = [t for _, t in keep] + [x[0] for x in new]


