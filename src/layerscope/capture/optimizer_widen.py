"""The optimizer's step of a composed run widened to the whole model's (capture/compose.py's module
docstring, its last paragraph): the optimizer steps the shorter model's parameters only; its ops are
watched (``OptimizerWiden.begins``), each given to the parameter whose tensors it reads, and ``ends``
repeats the repeated block's stretch of each of the optimizer's loops over parameters once per other
copy, and makes again what an op over several parameters at once (foreach) made for the repeated
block's parameters, at the same op. ``Composer`` (compose.py) holds one."""

from __future__ import annotations

import copy

from .blocks import KEPT, REP, Truncated
from .regions import NotComposable, far, inner, full_block_of, kept_of, masked, ref, renote, runs_of

__all__ = ["OptimizerWiden"]


class _Stretches:
    """Where the kept blocks' parameters were stepped in the optimizer's phase (``segs``: per kept block,
    its stretches of ops (first, last), phase-local, one per loop of the optimizer over the parameters)
    and where each global op time lands in the widened phase, for ``R`` copies of the repeated block."""

    def __init__(self, segs: dict, start: int, R: int) -> None:
        self.segs, self.start, self.R = segs, start, R
        self.lens = [z - a + 1 for a, z in segs[REP]]

    def where(self, t: int):
        """(kept block, its stretch, offset) of global op ``t`` of the phase, None elsewhere."""
        u = t - self.start
        for b, ss in self.segs.items():
            for i, (a, z) in enumerate(ss):
                if a <= u <= z:
                    return b, i, u - a
        return None

    def at(self, t: int, k: int = 0) -> int:
        """Global op ``t`` widened (copy ``k`` of a repeated stretch where it is in one)."""
        if t < self.start:
            return t
        u, extra = t - self.start, 0
        for (a, z), n in zip(self.segs[REP], self.lens):
            if u > z:
                extra += (self.R - 1) * n
            elif a <= u:
                return t + extra + k * n
        return t + extra

    def seen_from(self, t, src, k: int = 0) -> int:
        """Global op ``t`` as what block ``src`` (copy ``k``) made points to it, widened."""
        r = self.where(t) if t is not None and t >= self.start else None
        if r is None:
            return t if t is None else self.at(t)
        b, i, off = r
        if src is None:
            if b == REP:
                raise NotComposable("something outside the blocks' steps points into the repeated one's")
            return self.at(t)
        kb, kc = kept_of(full_block_of(src, k, self.R) + (b - src), self.R)
        ss = self.segs[REP if kc is not None else kb]
        if i >= len(ss) or ss[i][0] + off > ss[i][1]:
            raise NotComposable("the optimizer's stretches of the blocks differ in length")
        return self.at(self.start + ss[i][0] + off, kc or 0)

    def in_repeated(self, t: int) -> bool:
        r = self.where(t) if t >= self.start else None
        return r is not None and r[0] == REP


class OptimizerWiden:
    """The optimizer's step of a run of the shorter model (``tr``) widened to the whole model's.
    ``params``: the whole model's parameters by name; ``twins``: the Composer's list of (Block, its
    copies' Blocks), to which the copies made here are added (they take their block's later roles)."""

    def __init__(self, tr: Truncated, params: dict, twins: list) -> None:
        self.tr, self.params, self.twins = tr, params, twins
        run = tr.run
        self.R = run.count - KEPT + 1         # copies of the repeated block (itself the first)
        self.pre = run.path + "." if run.path else ""
        self._opt = None
        self._owner: dict[int, str] = {}    # id(Block) -> the parameter whose step made it (or it is)

    def block_of_name(self, name: str):
        """The kept block (0..KEPT-1) a parameter of the whole model is in, None outside them."""
        run = self.tr.run
        i = self._place(name)
        if i is None:
            return None
        if i <= REP:
            return i
        if run.count - (KEPT - REP - 1) <= i:
            return i - run.count + KEPT
        return None

    def _place(self, name: str):
        """The place in the run (0..n-1) of a parameter's block, None outside the run."""
        if not name.startswith(self.pre):
            return None
        head = name[len(self.pre):].partition(".")[0]
        if not head.isdigit():
            return None
        i = int(head) - self.tr.run.start
        return i if 0 <= i < self.tr.run.count else None

    def trim(self, opt, names: dict[int, str]) -> None:
        """Take the copies' parameters out of the optimizer, built as the user's factory builds it for
        the whole model's (``names``: id(parameter) -> name): it steps the shorter model's, and the
        copies' steps are composed (``ends``). Refused where the copies' parameters are not in the
        groups of the repeated block's own, in the blocks' order, or fill a group alone."""
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

    def begins(self, tracker, opt) -> None:
        """Watch the optimizer's ops (each op's inputs and outputs) from the next op on: which parameter
        each tensor belongs to, by the Block of its storage, or the storage itself where it is no Block
        (a CUDA target's host tensors: Adam's ``step``)."""
        live = tracker.live

        def key(t):
            try:
                st = inner(t).untyped_storage()     # a DTensor's: its local shard's (a sharded rank's step)
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

    def ends(self, tracker, run) -> None:
        """The step the optimizer made on the shorter model's parameters widened to the whole model's:
        the ops of the repeated block's parameters (in each of the optimizer's loops over parameters)
        repeated after them once per other copy, and what its ops over all parameters at once (foreach)
        made for them made again at the same op (see compose.py's module docstring)."""
        tracker.observer = None
        start, ops, first_block = self._opt
        self._opt = None
        if len(ops) != tracker.clock + 1 - start:
            raise NotComposable("the optimizer's ops and the tracker's clock disagree")
        label, multi_outs = self._labels(ops)
        block = [None if x is None or x == "*" else self.block_of_name(x) for x in label]
        segs = {b: runs_of(block, b) for b in range(KEPT)}
        if not (len(segs[REP - 1]) == len(segs[REP]) == len(segs[REP + 1])):
            raise NotComposable("the optimizer's loops over the middle blocks' parameters differ")
        st = _Stretches(segs, start, self.R)
        made = tracker.blocks[first_block:]
        pats = {b: self._pattern(b, st, ops, made, multi_outs) for b in (REP - 1, REP, REP + 1)}
        if masked(pats[REP - 1], -1) != masked(pats[REP], -1) or masked(pats[REP], 1) != masked(pats[REP + 1], 1):
            raise NotComposable("the optimizer's steps of the middle blocks' parameters differ")
        # what died in the phase, at its widened time (made before the phase: seen from no block)
        for blk in tracker.blocks[:first_block]:
            if blk.free is not None and blk.free >= start:
                blk.free = st.seen_from(blk.free, None)
        tracker.blocks[first_block:] = self._widened(tracker, st, made, multi_outs)
        if run.log is not None:
            renote(run.log, start, lambda e, t: [(st.at(t, k), e) for k in range(self.R if st.in_repeated(t) else 1)])
        tracker.clock += (self.R - 1) * sum(st.lens)

    def _labels(self, ops: list) -> tuple[list, dict[int, str]]:
        """Per op of the phase, the parameter it steps ("*": several at once, None: a marker of
        record_function's); and the Blocks made by an op over several parameters (id -> its parameter).
        An op that reads no parameter's tensor goes to the next op's parameter."""
        owner = self._owner
        label: list = [None] * len(ops)
        pending: list[int] = []
        multi_outs: dict[int, str] = {}
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
        return label, multi_outs

    def _pattern(self, b: int, st: _Stretches, ops: list, made: list, multi_outs: dict) -> list:
        """Kept block ``b``'s step with every pointer relative to it (compose.py's pattern check)."""
        def rel(t):
            r = st.where(t) if t is not None and t >= st.start else None
            return ("abs", t) if r is None else ref(r[0] - b, r[1], r[2])
        out = [tuple(ops[u][0] for u in range(a, z + 1)) for a, z in st.segs[b]]
        for blk in made:
            born, dies = rel(blk.born), rel(blk.free)
            if born[:2] == ("@", 0) or dies[:2] == ("@", 0):
                out.append((born, rel(blk.alloc), dies, blk.nbytes, blk.roles, blk.tag, id(blk) in multi_outs))
            elif id(blk) in multi_outs and self.block_of_name(multi_outs[id(blk)]) == b:
                out.append(("*", blk.born, blk.alloc, dies, blk.nbytes, blk.roles, blk.tag))
        if far(out):
            raise NotComposable("an optimizer step points two blocks away")
        return out

    def _widened(self, tracker, st: _Stretches, made: list, multi_outs: dict) -> list:
        """The Blocks the phase made, each at its widened time, with the copies' Blocks: a copy's stretch
        makes its own; an op over several parameters makes the copies' tensors at the same op, after the
        repeated block's, in the order of the parameters (after its last one)."""
        R, start = self.R, st.start

        def for_rep(blk) -> bool:
            return id(blk) in multi_outs and self.block_of_name(multi_outs[id(blk)]) == REP
        last = {blk.born: order for order, blk in enumerate(made) if for_rep(blk)}
        clones = []
        for order, blk in enumerate(made):
            born, alloc, free = blk.born, blk.alloc, blk.free
            r = st.where(born)
            src = None if r is None else r[0]
            blk.born, blk.alloc, blk.free = st.at(born), st.at(alloc) if alloc >= start else alloc, st.seen_from(free, src)
            copies = []
            if src == REP:
                for k in range(1, R):
                    c = copy.copy(blk)
                    c.born, c.alloc, c.free = st.at(born, k), st.at(alloc, k), st.seen_from(free, REP, k)
                    copies.append(c)
            elif for_rep(blk):
                copies = [copy.copy(blk) for _ in range(1, R)]     # made at the same op, for each copy
            if copies:
                self.twins.append((blk, copies))
                if blk.free is None:
                    tracker.followers.setdefault(id(blk), []).extend(copies)
            clones.append(((blk.born, order, 0, 0), blk))
            major = last[born] if for_rep(blk) else order
            clones += [((c.born, major, k, order), c) for k, c in enumerate(copies, start=1)]
        clones.sort(key=lambda x: x[0])
        return [x[1] for x in clones]
