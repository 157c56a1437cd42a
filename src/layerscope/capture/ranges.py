"""Bounds of values too large to carry beside a run without values (issue 58, item 1).

capture/known.py carries the values of tensors up to ``LIMIT`` elements, so an index op checks its
bounds as the real kernel does. Past the limit (GPT-2 given 4,194,305 tokens: its ``arange``
positions) the values were dropped, and an index out of range passed silently: the summary priced
positions 1,024 .. 4,194,304 of a 1,024-row table. Here such tensors keep a range instead, two
numbers ``(lo, hi)`` that hold every element: ``arange``'s ends, the min and max of the ids given,
fills, and what ops that preserve or transform values (views, copies, gathers, ``cat``,
``+``/``-``/``*``, ``cumsum``, ``clamp``, ``where``...) make of them, conservatively (an interval
that may be wider than the values, never narrower), with whether it is exact (both bounds held by
some element). An index op whose indices have a range checks it as it checks values: within the
bounds, the indices are; past them with an exact range, the real run fails there (the same error);
past them with an inexact range, or where the range is not known here (``TAINTED``: an op without a
rule), the bounds could not be checked, and the report says so (``unchecked``): a run that would
succeed is never failed on a guess.
Tensors that never had values (meta placeholders given as inputs) stay as before: not checked, not
noted, the same as a meta run of any size.
"""

from __future__ import annotations

import collections
import functools
import math
import weakref

import torch

from .._compat import no_dispatch

__all__ = ["ValueRanges", "TAINTED", "ABSENT"]

aten = torch.ops.aten
_Tensor = torch.Tensor
TAINTED = None          # derived from values too large to carry, the range unknown: bounds not checked
ABSENT = ()             # never had values (a placeholder): nothing to check, nothing to note


class _NoRange(Exception):
    pass


def _gone(table_ref, key: int, ref) -> None:
    table = table_ref()
    if table is not None:
        e = table.table.get(key)
        if e is not None and e[0] is ref:
            table.drop(key)


def _own_storage(t):
    try:
        return t.untyped_storage()._cdata
    except Exception:    # noqa: BLE001 - a subclass without a storage (DTensor, nested): no views to track
        return None


def _fits(r, dtype):
    """``r`` for an output of ``dtype``: an integer one holds its bounds truncated (a float cast to
    an integer truncates each element, which keeps the order, so an exact range stays exact), where
    the dtype holds them (a cast that wraps has no range here: TAINTED)."""
    if r is TAINTED or dtype.is_floating_point or dtype.is_complex:
        return r
    if dtype is torch.bool:
        return (0, 1, False)
    if not (math.isfinite(r[0]) and math.isfinite(r[1])):
        return TAINTED
    lo, hi = math.trunc(r[0]), math.trunc(r[1])
    info = torch.iinfo(dtype)
    return (lo, hi, r[2]) if info.min <= lo and hi <= info.max else TAINTED


# ---- rules: the range of an op's outputs from its inputs' ranges (``r(x)``: (lo, hi, exact)) --------
# ``exact``: both bounds are values some element holds (the ids' min and max, arange's ends, and
# whatever keeps every element or moves them all alike: views, copies, repeats, + or * a constant,
# clamp, cat of exact parts). Only an exact bound out of range proves the real run fails there; an
# inexact one (a slice, a gather, the sum of two ranges, cumsum) may be wider than the values.
def _whole(r, args, kwargs):
    return r(args[0])


def _part(r, args, kwargs):
    lo, hi, _ = r(args[0])
    return (lo, hi, False)


def _union(rs, exact=True):
    rs = list(rs)
    if not rs:
        raise _NoRange
    return (min(x[0] for x in rs), max(x[1] for x in rs), exact and all(x[2] for x in rs))


def _cat(r, args, kwargs):
    return _union(r(x) for x in args[0])


def _const(x) -> bool:
    return x[2] and x[0] == x[1]


def _add(sign):
    def rule(r, args, kwargs):
        a, b = r(args[0]), r(args[1])
        alpha = args[2] if len(args) > 2 else kwargs.get("alpha", 1)
        if isinstance(alpha, _Tensor):
            raise _NoRange
        lo_b, hi_b = sorted((b[0] * alpha * sign, b[1] * alpha * sign))
        # a constant added to every element moves the extremes with them
        exact = a[2] and b[2] and (_const(a) or _const(b))
        return (a[0] + lo_b, a[1] + hi_b, exact)
    return rule


def _mul(r, args, kwargs):
    a, b = r(args[0]), r(args[1])
    p = [x * y for x in a[:2] for y in b[:2]]
    return (min(p), max(p), a[2] and b[2] and (_const(a) or _const(b)))


def _neg(r, args, kwargs):
    a = r(args[0])
    return (-a[1], -a[0], a[2])


def _rsub(r, args, kwargs):
    # rsub(x, other, alpha): other - alpha * x
    a, b = r(args[0]), r(args[1])
    alpha = args[2] if len(args) > 2 else kwargs.get("alpha", 1)
    lo_a, hi_a = sorted((a[0] * alpha, a[1] * alpha))
    return (b[0] - hi_a, b[1] - lo_a, a[2] and b[2] and (_const(a) or _const(b)))


def _clamp_to(a, lo, hi):
    """clamp of every element to [lo, hi] (None: no bound; constants): the extremes clamp alike."""
    out_lo = a[0] if lo is None else max(a[0], lo)
    out_hi = a[1] if hi is None else min(a[1], hi)
    if lo is not None:
        out_hi = max(out_hi, lo)
    if hi is not None:
        out_lo = min(out_lo, hi)
    if lo is not None and hi is not None and lo > hi:
        return (hi, hi, True)             # clamp(min > max) gives max everywhere
    return (out_lo, out_hi, a[2])


def _bound(r, x):
    """A clamp bound: a number or a constant tensor; None where absent."""
    if x is None:
        return None
    b = r(x)
    if not _const(b):
        raise _NoRange
    return b[0]


def _clamp(r, args, kwargs):
    lo = args[1] if len(args) > 1 else kwargs.get("min")
    hi = args[2] if len(args) > 2 else kwargs.get("max")
    return _clamp_to(r(args[0]), _bound(r, lo), _bound(r, hi))


def _clamp_min(r, args, kwargs):
    return _clamp_to(r(args[0]), _bound(r, args[1]), None)


def _clamp_max(r, args, kwargs):
    return _clamp_to(r(args[0]), None, _bound(r, args[1]))


def _where(r, args, kwargs):
    return _union((r(args[1]), r(args[2])), exact=False)


def _masked_fill(r, args, kwargs):
    return _union((r(args[0]), r(args[2])), exact=False)


def _cumsum(r, args, kwargs):
    # a partial sum of k elements lies in [k*lo, k*hi], k = 1 .. n (n the length along dim)
    a = r(args[0])
    x = args[0]
    n = x.shape[args[1] % x.dim()] if x.dim() else 1
    return (min(a[0], n * a[0]), max(a[1], n * a[1]), False)


def _remainder(r, args, kwargs):
    a, b = r(args[0]), r(args[1])
    if b[0] > 0 and a[0] >= 0:
        return (0, min(a[1], b[1]), False)     # x % d of x >= 0, d > 0: in [0, d) and never above x
    raise _NoRange


def _arange(out, args, kwargs):
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) > 2 else 1)
    step = kwargs.get("step", step)
    n = out.numel()
    if n == 0:
        raise _NoRange
    last = start + step * (n - 1)
    return (min(start, last), max(start, last), True)


def _filled(pos, default=None):
    return lambda out, args, kwargs: (lambda v: (v, v, True))(args[pos] if default is None else default)


# ops that keep every element (and repeat some): exact stays exact
_WHOLE = ("view.default", "_unsafe_view.default", "reshape.default", "expand.default", "unsqueeze.default",
          "squeeze.default", "squeeze.dim", "squeeze.dims", "permute.default", "transpose.int", "t.default",
          "clone.default", "alias.default", "detach.default", "lift_fresh.default", "lift_fresh_copy.default",
          "repeat.default", "flip.default", "roll.default", "expand_copy.default", "_to_copy.default",
          "view_as.default", "copy.default", "contiguous.default", "movedim.int", "flatten.using_ints",
          "tile.default", "repeat_interleave.self_int")
# ops whose values are some of their input's: the range holds, not exactly
_PART = ("slice.Tensor", "select.int", "index_select.default", "gather.default", "index.Tensor", "narrow.default",
         "unfold.default", "split.Tensor", "split_with_sizes.default", "unbind.int", "chunk.default",
         "masked_select.default")
_RULES = {}
for _names, _rule in ((_WHOLE, _whole), (_PART, _part)):
    for _name in _names:
        _op, _, _ov = _name.partition(".")
        _RULES[getattr(getattr(aten, _op), _ov)] = _rule
_RULES.update({aten.cat.default: _cat, aten.stack.default: _cat, aten.add.Tensor: _add(1), aten.add.Scalar: _add(1),
               aten.sub.Tensor: _add(-1), aten.sub.Scalar: _add(-1), aten.mul.Tensor: _mul, aten.mul.Scalar: _mul,
               aten.neg.default: _neg, aten.rsub.Scalar: _rsub, aten.rsub.Tensor: _rsub,
               aten.clamp.default: _clamp, aten.clamp.Tensor: _clamp, aten.clamp_min.default: _clamp_min,
               aten.clamp_max.default: _clamp_max, aten.minimum.default: _clamp_max,
               aten.maximum.default: _clamp_min, aten.where.self: _where, aten.masked_fill.Scalar: _masked_fill,
               aten.masked_fill.Tensor: _masked_fill, aten.cumsum.default: _cumsum,
               aten.remainder.Scalar: _remainder, aten.remainder.Tensor: _remainder})
# in place: the same rule as the op it writes in place of (the written tensor is its first input)
_INPLACE = {aten.add_.Tensor: _add(1), aten.add_.Scalar: _add(1), aten.sub_.Tensor: _add(-1),
            aten.sub_.Scalar: _add(-1), aten.mul_.Tensor: _mul, aten.mul_.Scalar: _mul,
            aten.clamp_.default: _clamp, aten.clamp_min_.default: _clamp_min,
            aten.clamp_max_.default: _clamp_max, aten.masked_fill_.Scalar: _masked_fill,
            aten.masked_fill_.Tensor: _masked_fill, aten.cumsum_.default: _cumsum,
            aten.neg_.default: _neg,
            # a copy into part of a tensor leaves the rest: only a whole copy is the source's range
            aten.copy_.default: lambda r, a, k: r(a[1]) if a[0].numel() == a[1].numel() else _part(r, a[1:], k)}
_RULES.update(_INPLACE)
_ARANGE = (aten.arange.default, aten.arange.start, aten.arange.start_step)
# made from sizes and constants alone: ranges from the arguments and the output's size
_SIZED = {aten.arange.default: _arange, aten.arange.start: _arange, aten.arange.start_step: _arange,
          aten.full.default: _filled(1), aten.zeros.default: _filled(0, 0), aten.ones.default: _filled(0, 1),
          aten.zeros_like.default: _filled(0, 0), aten.ones_like.default: _filled(0, 1),
          aten.full_like.default: _filled(1), aten.new_zeros.default: _filled(0, 0),
          aten.new_ones.default: _filled(0, 1), aten.new_full.default: _filled(2),
          aten.fill_.Scalar: _filled(1), aten.zero_.default: _filled(0, 0),
          aten.eye.default: lambda out, args, kwargs: (0, 1, False), aten.eye.m: lambda out, args, kwargs: (0, 1, False)}


class ValueRanges:
    """The ranges of one run's tensors too large to carry (see the module): ``id -> (weak reference,
    range or TAINTED, own storage)``, and the index ops that could not check their bounds."""

    __slots__ = ("table", "storages", "unchecked", "__weakref__")

    def __init__(self) -> None:
        self.table: dict[int, tuple] = {}
        self.storages: dict[int, set[int]] = {}      # own storage -> ids with an entry (views of it)
        self.unchecked: collections.Counter = collections.Counter()   # index op -> calls not checked

    def set(self, t, r) -> None:
        key = id(t)
        self.drop(key)
        own = _own_storage(t)
        self.table[key] = (weakref.ref(t, functools.partial(_gone, weakref.ref(self), key)), r, own)
        if own is not None:
            self.storages.setdefault(own, set()).add(key)

    def drop(self, key: int) -> None:
        e = self.table.pop(key, None)
        if e is not None and e[2] is not None:
            ids = self.storages.get(e[2])
            if ids is not None:
                ids.discard(key)
                if not ids:
                    del self.storages[e[2]]

    def entry(self, t):
        """``t``'s range, TAINTED, or ABSENT (no entry)."""
        e = self.table.get(id(t))
        if e is None:
            return ABSENT
        if e[0]() is t:
            return e[1]
        self.drop(id(t))
        return ABSENT

    def seed(self, t, real) -> None:
        """``t`` stands for the real integer tensor ``real``, too large to carry: its min and max."""
        if real.numel() and not real.is_floating_point() and not real.is_complex():
            with no_dispatch():
                self.set(t, (int(real.min()), int(real.max()), True))

    # ---- the recorder's calls (through known_ops.carry_values) -----------------------------------
    def before(self, known, func, args, kwargs, out, writes) -> list | None:
        """Before ``known`` carries ``func``'s values: the ranges its outputs (and the tensors it writes)
        take, as ``[(tensor, range or TAINTED)]``; None where no input has a range and the op has no
        rule of its own (every output then has a value, or never had one). The entries of the tensors
        written (and their views) go: their old ranges may no longer hold."""
        sized = _SIZED.get(func)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, _Tensor)]
        targets = [t for t in writes if isinstance(t, _Tensor)]
        if sized is not None and func not in _INPLACE:
            made = outs or targets
            if made and made[0].is_floating_point() and func not in _ARANGE:
                # a float fill (an optimizer's zeros_like state, a mask of -inf) is never an index:
                # no entry (a table kept empty keeps the recorder's common path free of this one)
                self._drop_written(targets)
                return None
            try:
                r = sized(outs[0] if outs else (targets[0] if targets else None), args, kwargs)
            except (_NoRange, IndexError, TypeError):
                r = TAINTED
            if isinstance(r, tuple) and any(isinstance(x, _Tensor) for x in r):
                r = TAINTED
            self._drop_written(targets)
            return [(o, _fits(r, o.dtype)) for o in (outs or targets)]
        ins = list(_tensors((args, kwargs)))
        if not any(id(a) in self.table for a in ins):
            self._drop_written(targets)
            return None
        for a in ins:
            if self.entry(a) is ABSENT and known.stored(a) is None:
                self._drop_written(targets)
                return None              # an input that never had values: its outputs neither
        rule = _RULES.get(func)
        r = TAINTED
        if rule is not None:
            try:
                r = rule(functools.partial(self._range, known), args, kwargs)
            except (_NoRange, IndexError, TypeError):
                r = TAINTED
        self._drop_written(targets)
        done = {id(o) for o in outs}
        return [(o, (0, 1, False) if o.dtype is torch.bool else _fits(r, o.dtype))
                for o in outs + [t for t in targets if id(t) not in done]]

    def after(self, known, pairs) -> None:
        for t, r in pairs:
            if known.stored(t) is None and t.numel():     # an empty index is never out of range
                self.set(t, r)

    def _drop_written(self, targets) -> None:
        """Tensors written in place, and those sharing their storage (views), had values too large to
        carry: their old ranges may not hold any more, and they stay TAINTED (not dropped: an index
        read from them later is noted as not checked, never passed silently) until the op's outputs
        get theirs (``after``)."""
        for t in targets:
            own = _own_storage(t)
            for k in list(self.storages.get(own, ())) if own is not None else ():
                e = self.table.get(k)
                if e is not None and e[1] is not TAINTED:
                    self.table[k] = (e[0], TAINTED, e[2])
            if id(t) in self.table and self.table[id(t)][1] is not TAINTED:
                e = self.table[id(t)]
                self.table[id(t)] = (e[0], TAINTED, e[2])

    def _range(self, known, x):
        """The range of ``x``: a number, a tensor with a range or a value; raises _NoRange otherwise."""
        if isinstance(x, bool):
            return (int(x), int(x), True)
        if isinstance(x, (int, float)):
            return (x, x, True)
        if not isinstance(x, _Tensor):
            raise _NoRange
        r = self.entry(x)
        if r is TAINTED:
            raise _NoRange
        if r is not ABSENT:
            return r
        v = known.stored(x)
        if v is None or v.numel() == 0 or v.is_complex():
            raise _NoRange
        with no_dispatch():
            lo, hi = v.min().item(), v.max().item()
        return (lo, hi, True)

    def note(self) -> list[str]:
        if not self.unchecked:
            return []
        n = sum(self.unchecked.values())
        ops = ", ".join(f"{k} ×{v:,}" if v > 1 else k for k, v in sorted(self.unchecked.items()))
        return [f"index bounds not checked: {n:,} index op call(s) ({ops}) read indices made from values too "
                f"large to carry beside the meta/fake run, with no range known for them; an index out of "
                f"range there fails the real run but not this one"]


def _tensors(x):
    if isinstance(x, _Tensor):
        yield x
    elif type(x) in (list, tuple):
        for y in x:
            yield from _tensors(y)
    elif type(x) is dict:
        for y in x.values():
            yield from _tensors(y)
