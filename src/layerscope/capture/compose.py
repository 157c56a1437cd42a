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
2 + k + d's region of that kind, at that offset (``Widen``; the places of the copies lie on a line,
``copy_places``, computed for the first two and checked at the last). Blocks 0, 1, n-2, n-1 and everything
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
parameter (other than record_function's markers) refuses: it could be one per parameter. That is
capture/optimizer_widen.py; capture/regions.py holds the regions, the maps of times and calls and the
pattern helpers.

Where anything differs, ``NotComposable`` says what, and the caller simulates the whole model; the
loop around the blocks is checked by capture/composed.py. The report is the same byte for byte as the
whole model's simulation (tests/capture/test_compose.py).
"""

from __future__ import annotations

import copy

from ..trace import OpEvent
from .blocks import KEPT, REP, Truncated
from .optimizer_widen import OptimizerWiden
from .regions import BWD, FWD, NotComposable, Regions, Widen, block_at, copy_places, far, inner, masked, ref, renote

__all__ = ["Composer"]


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
        run = tr.run
        self.R = run.count - KEPT + 1         # copies of the repeated block (itself the first)
        self.full_container = full_model.get_submodule(run.path) if run.path else full_model
        self.pre = run.path + "." if run.path else ""
        self.optimizer = OptimizerWiden(tr, params, self._twins)    # the optimizer's step, widened

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
    def _pattern(self, b: int, reg: Regions, cap, blocks, log, router, offset: int) -> list:
        """Block ``b``'s record with every pointer relative to it (see the module's docstring)."""
        def t_rel(t: int):
            if t is None or t < 0:
                return ("abs", t)
            r = reg.region(t)
            return ("abs", t) if r is None else ref(r[0] - b, r[1], r[2])

        def g_rel(t):
            return t_rel(t - offset) if t is not None and t >= offset else ("abs", t)

        def c_rel(i):
            if i is None:
                return None
            o = reg.owner.get(i)
            return ("abs", i) if o is None else ref(o - b, i - reg.top[o])

        def p_rel(p: int):
            r = t_rel(p)
            # an op's producers outside the blocks (FSDP2's lazy init views every block's shard before the
            # first block runs) are not compared where the run says so (Truncated.loose_producers)
            return "outside" if loose and r[0] == "abs" else r
        loose = self.tr.loose_producers
        out = []
        for kind, (a, z) in ((FWD, reg.f[b]), (BWD, reg.b[b])):
            for op in cap.ops[a:z]:
                out.append(("op", kind, op.index - a, op.op, c_rel(op.layer), op.phase, op.status, op.costs,
                            tuple(p_rel(p) if p >= 0 else p for p in op.producers), op.window, op.executed,
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
        if far(out):
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
        why = self.tr.read_problem()
        if why is not None:
            raise NotComposable(why)
        reg = Regions(cap, self.tr, n_ops)
        seg = tracker.blocks[first_block:]
        # the middle blocks' records: alike towards the next block (REP - 1 and REP, whose next ones are
        # middle blocks too) and towards the previous one (REP and REP + 1)
        pats = {b: self._pattern(b, reg, cap, seg, log, router, offset) for b in (REP - 1, REP, REP + 1)}
        if masked(pats[REP - 1], -1) != masked(pats[REP], -1) or masked(pats[REP], 1) != masked(pats[REP + 1], 1):
            raise NotComposable("the middle blocks left different records")
        w = Widen(reg, self.R)
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
            src = block_at(reg, op.index)

            def fields(k, op=op, src=src):
                return (w.time(op.index, src, k), w.call(op.layer, src, k),
                        *(w.time(p, src, k) if p >= 0 else p for p in op.producers))
            for k, (t, layer, *producers) in copy_places(fields, R if src == REP else 1):
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
                if tick >= offset and block_at(reg, tick - offset) == REP:
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

    def _calls(self, cap, reg: Regions, w: Widen) -> list:
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

    def _storages(self, tracker, reg: Regions, w: Widen, seg: list, first_block: int, offset: int) -> None:
        g = lambda t, src, k=0: t if t is None or t < offset else offset + w.time(t - offset, src, k)  # noqa: E731
        here = len(self._passes)
        made = []
        for order, blk in enumerate(seg):
            born_local = blk.born - offset
            src = block_at(reg, born_local) if born_local >= 0 else None
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
            for k, (b_, a_, f_, l_, s_) in copy_places(fields, w.R if src == REP else 1):
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

    def _state_marks(self, tracker, w: Widen) -> None:
        """What t2's run did to its parameters' and buffers' Blocks (saved for backward by a layer of it),
        done to each copy's."""
        head = f"{self.pre}{self.tr.run.start + REP}."
        here = len(self._passes)
        live = tracker.live
        for name, t in self.state.items():
            if not name.startswith(head):
                continue
            b = live.get(id(inner(t).untyped_storage()))
            if b is None or b.saved_by is None or b.saved_by[0] != here:
                continue
            for k in range(1, w.R):
                c = live.get(id(inner(self.state[self.copy_path(name, k)]).untyped_storage()))
                if c is not None:
                    c.roles |= b.roles
                    if c.saved_by is None:
                        c.saved_by = (here, w.call(b.saved_by[1], REP, k))

    # ---- the optimizer's step (optimizer_widen.py) ----------------------------------------------------------
    def trim_optimizer(self, opt, names: dict[int, str]) -> None:
        """The copies' parameters taken out of the optimizer built for the whole model (OptimizerWiden.trim)."""
        self.optimizer.trim(opt, names)

    def optimizer_begins(self, tracker, opt) -> None:
        self.optimizer.begins(tracker, opt)

    def optimizer_ends(self, tracker, run) -> None:
        self.optimizer.ends(tracker, run)

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

    def _notes(self, log, reg: Regions, w: Widen, offset: int) -> None:
        def placed(event, t):
            kind, what, where = event
            local = t - offset
            src = block_at(reg, local) if local >= 0 else None
            if src != REP:
                return [(offset + w.time(local, src) if local >= 0 else t, (kind, what, self.rename(where)))]
            path, sep, rest = where.partition(" ")
            return [(offset + w.time(local, src, k), (kind, what, self.copy_path(path, k) + sep + rest))
                    for k in range(w.R)]
        renote(log, offset, placed)


