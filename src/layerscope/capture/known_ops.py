"""What each op does to the values known beside a run (capture/known.py holds them): the recorder calls
``carry_values`` after every op that ran on meta/fake tensors and ``shaped_outputs`` for an op whose
output shape depends on values (the real shape where the values read are known); ``check_bounds``
raises the real kernel's error where a known index is out of bounds.

An op's outputs are computed on the CPU from its inputs' values when every input is known (``_compute``);
factories (``arange``, ``zeros``, ``full`` and the ``*_like`` forms) from their sizes alone; a fill or a
copy writes in place into the value it writes (a view's base sees the write); a write from something
unknown forgets the tensor written (unknown, never stale); a choice over scores without values (an MoE
router's top-k) is assumed to spread evenly (``_spread``).
"""

from __future__ import annotations

import math

import torch

from .._compat import no_dispatch
from .known import LIMIT, KnownIndexError, is_small
from .ranges import ABSENT, TAINTED

__all__ = ["carry_values", "shaped_outputs", "check_bounds", "SHAPED_OPS"]

aten = torch.ops.aten
_CPU = torch.device("cpu")
_Tensor = torch.Tensor

# made from sizes and constants alone
_FACTORIES = frozenset(getattr(aten, n).default for n in ("zeros", "ones", "scalar_tensor")) | frozenset(
    (aten.arange.default, aten.arange.start, aten.arange.start_step, aten.full.default, aten.eye.default,
     aten.eye.m))
# made from another tensor's size alone: the value they fill with
_FACTORY_FILL = {aten.zeros.default: lambda a: 0, aten.ones.default: lambda a: 1, aten.full.default: lambda a: a[1]}
_LIKE = {aten.zeros_like.default: lambda a: 0, aten.ones_like.default: lambda a: 1,
         aten.full_like.default: lambda a: a[1], aten.new_zeros.default: lambda a: 0,
         aten.new_ones.default: lambda a: 1, aten.new_full.default: lambda a: a[2]}
_CHECKED = frozenset((aten.embedding.default, aten.index_select.default, aten.gather.default, aten.scatter.src,
                      aten.scatter.value, aten.scatter_.src, aten.scatter_.value, aten.scatter_add.default,
                      aten.scatter_add_.default, aten.index.Tensor))
_FILL = frozenset((aten.fill_.Scalar, aten.zero_.default))
_COPY = aten.copy_.default
_LOCAL_SCALAR = aten._local_scalar_dense.default
# outputs whose shape depends on the values read
_SHAPED = frozenset((aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
                     aten.repeat_interleave.Tensor, aten.unique_consecutive.default, aten.unique_dim.default,
                     aten.bincount.default, aten.argwhere.default))
_INDEX = aten.index.Tensor
_CTC = frozenset((aten._ctc_loss.default, aten._ctc_loss.Tensor))
_TO_COPY = aten._to_copy.default
# every op ``shaped_outputs`` may answer (the recorder routes them to it)
SHAPED_OPS = _SHAPED | _CTC | frozenset((_INDEX, aten.index_put.default, aten.index_put_.default, _TO_COPY))
_SEEDED = torch.Tag.nondeterministic_seeded
_NEVER = frozenset((aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                    aten.new_empty.default, aten.new_empty_strided.default))



class _Unknown(Exception):
    """A tensor without known values (internal to ``_reals``)."""


# what ``carry_values`` does for an op, decided once per op (keyed by id, holding the op: an OpOverload's
# __hash__ is a Python method)
_COMPUTE, _CHECK, _SKIP, _FILLING, _COPYING, _LIKE_KIND, _FACTORY, _ROUTE = range(8)
# choices made from float values (an MoE router's top-k or argmax over its experts' scores): where
# those values are unknown, the stated assumption is that the choices spread evenly
_ROUTING = frozenset((aten.topk.default, aten.argmax.default, aten.max.dim))
_INFO: dict = {}



def _targets(args, kwargs, pairs):
    """The arguments at ``pairs`` ((position, name): see ``_info``), given by position or by name."""
    for i, name in pairs:
        if i < len(args):
            yield args[i]
        elif kwargs and name in kwargs:
            yield kwargs[name]


def _info(func) -> tuple[int, tuple, tuple]:
    # (position, name) of the arguments written in place or through ``out=`` (a keyword: by its name)
    writes = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write)
    if func in _NEVER or _SEEDED in func.tags:        # a draw (its value is not known), an empty tensor
        kind = _SKIP
    elif func in _FILL:
        kind = _FILLING
    elif func is _COPY:
        kind = _COPYING
    elif func in _LIKE:
        kind = _LIKE_KIND
    elif func in _FACTORIES:
        kind = _FACTORY
    elif func in _CHECKED:
        kind = _CHECK
    elif func in _ROUTING:
        kind = _ROUTE
    else:
        kind = _COMPUTE
    # the inputs an output aliases or that are written (views and in-place ops): a fill held as one
    # element is made whole before it is viewed or written (KnownValues.writable)
    aliased = tuple((i, a.name) for i, a in enumerate(func._schema.arguments) if a.alias_info is not None)
    _INFO[id(func)] = (func, (kind, writes, aliased))
    return kind, writes, aliased



def _cpu_kwargs(kwargs: dict) -> dict:
    if "device" in kwargs:
        kwargs = {**kwargs, "device": _CPU}
    kwargs.pop("pin_memory", None)
    return kwargs


def _index_error(bounds: tuple, size: int, dim: int) -> "KnownIndexError | None":
    lo, hi = bounds
    bad = hi if hi >= size else lo if lo < -size else None
    if bad is None:
        return None
    return KnownIndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")



def check_bounds(known, func, args) -> None:
    """Raise the real kernel's error where a known index is out of bounds."""
    with no_dispatch():      # real reads, also inside a FakeTensorMode
        _check(known, func, args)


def _outside(known, t, op: str, lo_ok: int, size: int):
    """``(lo, hi)``, the least and greatest index in ``t``, where they certainly reach outside
    ``[lo_ok, size)``: from its value, or from its exact range where it is too large to carry
    (capture/ranges.py); else None. An inexact range past the bounds, or none where ``t`` came from
    values too large to carry, proves nothing: the report says ``op``'s bounds were not checked."""
    v = known.stored(t)
    if v is not None:
        if not v.numel():
            return None
        b = (int(v.min()), int(v.max()), True)
    else:
        b = known.ranges.entry(t)
        if b is ABSENT:
            return None
        if b is TAINTED:
            known.ranges.unchecked[op] += 1
            return None
    if lo_ok <= b[0] and b[1] < size:
        return None
    if not b[2]:
        known.ranges.unchecked[op] += 1
        return None
    return (b[0], b[1])


def _check(known, func, args) -> None:
    if func is aten.embedding.default:
        if _outside(known, args[1], "embedding", 0, args[0].shape[0]) is not None:
            raise KnownIndexError("index out of range in self")
    elif func is aten.index_select.default:
        dim = args[1] % max(args[0].dim(), 1)
        size = args[0].shape[dim] if args[0].dim() else 1
        if _outside(known, args[2], "index_select", 0, size) is not None:
            raise KnownIndexError(f"index out of range in self (index_select, dimension {dim} of size "
                                  f"{size})")
    elif func in (aten.gather.default, aten.scatter.src, aten.scatter.value, aten.scatter_.src,
                  aten.scatter_.value, aten.scatter_add.default, aten.scatter_add_.default):
        if args[0].dim():
            dim = args[1] % args[0].dim()
            size = args[0].shape[dim]
            b = _outside(known, args[2], func._opname, 0, size)
            if b is not None:
                bad = b[1] if b[1] >= size else b[0]
                raise KnownIndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")
    elif func is _INDEX:
        x, dim = args[0], 0
        for i in args[1]:
            if i is None:
                dim += 1
                continue
            if not i.is_floating_point() and i.dtype not in (torch.bool, torch.uint8):
                size = x.shape[dim]
                b = _outside(known, i, "index", -size, size)
                if b is not None:
                    raise _index_error(b, size, dim)
            dim += i.dim() if i.dtype in (torch.bool, torch.uint8) else 1


def shaped_outputs(known, func, args, kwargs):
    """For an op whose output shape depends on values, the outputs at the real shape (meta or
    fake tensors, their values known) when every tensor it reads is known; else None."""
    if func not in SHAPED_OPS:
        return None
    if func in (_INDEX, aten.index_put.default, aten.index_put_.default):
        return _masked_index(known, func, args, kwargs)
    if func in _CTC:
        return _ctc(known, args)
    if func is _TO_COPY:
        # a meta tensor with known values copied to the CPU (``.tolist()``, ``.cpu()``): the values
        dev = kwargs.get("device")
        v = known.value(args[0]) if args[0].is_meta and dev is not None and torch.device(dev).type == "cpu" \
            else None
        if v is None:
            return None
        with no_dispatch():
            return v.to(dtype=kwargs.get("dtype") or v.dtype, copy=True)
    reals = _reals(known, args, kwargs)
    if reals is None:
        return None
    with no_dispatch():
        real = func(*reals[0], **_cpu_kwargs(dict(reals[1])))
    like = args[0]
    many = isinstance(real, (tuple, list))
    if not like.is_meta and getattr(like, "fake_mode", None) is None or \
            like.is_meta and not like.is_floating_point():
        # real inputs give real outputs; on meta, integer positions, counts and unique values
        # come back as the real CPU tensors they are (as a CPU index beside a meta tensor is, the
        # way it is on CUDA): code that formats or iterates them (``f"expert_{idx}"``) sees values
        return real
    outs = []
    for r in (real if many else (real,)):
        o = torch.empty_strided(tuple(r.shape), tuple(r.stride()), dtype=r.dtype, device=like.device)
        known.put(o, r)
        outs.append(o)
    return tuple(outs) if many else outs[0]


def _ctc(known, args):
    """CTC's forward on CPU: the loss per sequence [B] and log_alpha [B, T, 2 * max target length + 1]
    (its fake kernel cannot size it without the target lengths' values)."""
    log_probs, target_lengths = args[0], args[3]
    lengths = known.values_list(target_lengths) if isinstance(target_lengths, _Tensor) else list(target_lengths)
    if lengths is None:
        return None
    t, b = (log_probs.shape[0], log_probs.shape[1]) if log_probs.dim() == 3 else (log_probs.shape[0], 1)
    longest = max(lengths, default=0)
    like = dict(dtype=log_probs.dtype, device=log_probs.device)
    return (torch.empty((b,) if log_probs.dim() == 3 else (), **like),
            torch.empty((b, t, 2 * longest + 1) if log_probs.dim() == 3 else (t, 2 * longest + 1), **like))


def _masked_index(known, func, args, kwargs):
    """Boolean masks among the indices, known: replaced by the positions they select (known too),
    so the op runs with the real number of elements."""
    indices = args[1]
    if not any(isinstance(i, _Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return None
    new = []
    for i in indices:
        if isinstance(i, _Tensor) and i.dtype in (torch.bool, torch.uint8):
            v = known.value(i)
            if v is None:
                return None
            with no_dispatch():
                where = v.nonzero(as_tuple=True)
            for w in where:
                if getattr(i, "fake_mode", None) is None:
                    new.append(w)        # a real or meta mask: its positions as a CPU index
                    continue
                o = torch.empty(tuple(w.shape), dtype=torch.long, device=i.device)
                known.put(o, w)
                new.append(o)
        else:
            new.append(i)
    out = func(args[0], new, *args[2:], **kwargs)
    if func is not _INDEX:
        _carry_put(known, func, args, kwargs, new, out)
    return out


def _carry_put(known, func, args, kwargs, indices, out) -> None:
    """What ``index_put``/``index_put_`` wrote (``x[mask] = v`` on a tensor with known values): the
    result's values, written in place into the stored value for ``index_put_`` (its views see the
    write), or, where the written values or an index are unknown, none (the tensor written in place,
    and its views, are forgotten rather than left at their old values)."""
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    # aten's own index_put_: it takes None among the indices (``m[:, mask] = 0``), Tensor.index_put_ not
    if func is aten.index_put_.default:
        base = known.writable(args[0])
        reals = _reals(known, (args[0], list(indices), args[2]), {}) if base is not None else None
        if reals is None:
            known.forget(args[0])
        else:
            (_, idx, vals), _ = reals
            with no_dispatch():
                aten.index_put_.default(base, list(idx), vals, accumulate)
        if known.tensors:
            known.unlink(args[0])
        return
    reals = _reals(known, (args[0], list(indices), args[2]), {})    # None where one is unknown
    if reals is None:
        return
    (base, idx, vals), _ = reals
    with no_dispatch():
        known.put(out, aten.index_put.default(base, list(idx), vals, accumulate))


def _reals(known, args, kwargs):
    """``(args, kwargs)`` with every tensor replaced by its value; None if one is unknown. (No
    closure here: a recursive one is a reference cycle, and a cycle holding a fake tensor keeps
    its storage alive until the garbage collector runs, which a simulation pauses.)"""
    try:
        return (tuple(_real(known, a) for a in args), {k: _real(known, v) for k, v in kwargs.items()})
    except _Unknown:
        return None


def _real(known, a):
    if isinstance(a, _Tensor):
        v = known.value(a)
        if v is None:
            raise _Unknown
        return v
    if type(a) in (list, tuple):
        return type(a)(_real(known, x) for x in a)
    return a


def carry_values(known, func, args, kwargs, out) -> None:
    """Carry the values of ``func``'s outputs (it ran on meta/fake tensors and gave ``out``), and
    raise the real kernel's error where a known index is out of bounds (``check_bounds``)."""
    e = _INFO.get(id(func))
    info = e[1] if e is not None and e[0] is func else _info(func)
    ranged = None
    if known.ranges.table or isinstance(out, _Tensor) and out.numel() > LIMIT:
        # values too large to carry, or made from them: their ranges (capture/ranges.py)
        ranged = known.ranges.before(known, func, args, kwargs, out, list(_targets(args, kwargs, info[1])))
    try:
        _after(known, func, args, kwargs, out, info)
        if ranged:
            known.ranges.after(known, ranged)
    finally:
        # once the write is carried (or forgotten), what shares the tensor but not its value did not
        # see it (``set_`` has moved the tensor onto its source's storage by now: nothing to forget)
        if info[1] and known.tensors:
            for t in _targets(args, kwargs, info[1]):
                known.unlink(t)


def _after(known, func, args, kwargs, out, info) -> None:
    kind, writes, aliased = info
    if kind == _CHECK:
        check_bounds(known, func, args)
        kind = _COMPUTE
    if kind == _COMPUTE:
        # the common op: an output too large to carry, or an input without values, ends it
        if type(out) is _Tensor or type(out) is not tuple and isinstance(out, _Tensor):
            if out.numel() > LIMIT:
                if writes:
                    _forget_written(known, args, kwargs, writes)
                return
        for a in args:
            if isinstance(a, _Tensor) and known.value(a) is None:
                if writes:
                    _forget_written(known, args, kwargs, writes)
                elif func is _TO_COPY and a.is_floating_point() and isinstance(out, _Tensor) and \
                        is_small(out) and not out.is_floating_point() and out.dtype is not torch.bool:
                    # integers made from floats without values (durations, counts a model
                    # predicts): all ones, as every other value without one reads
                    with no_dispatch():
                        known.put(out, torch.ones(tuple(out.shape), dtype=out.dtype))
                    known.cast_ones += 1
                return
        _compute(known, func, args, kwargs, out, writes, aliased)
    elif kind == _SKIP:
        if writes:
            _forget_written(known, args, kwargs, writes)
    elif kind == _ROUTE:
        if known.value(args[0]) is not None:
            _compute(known, func, args, kwargs, out, writes, aliased)
        else:
            _spread(known, func, args, kwargs, out)
    elif kind == _FILLING:
        if is_small(args[0]) and not isinstance(args[1] if len(args) > 1 else None, _Tensor):
            fill = 0 if func is aten.zero_.default else args[1]
            # in place where the value is known: a view's base sees the write (``x[:, :3] = 0``)
            v = known.writable(args[0])
            if v is not None:
                with no_dispatch():
                    v.fill_(fill)
            else:
                known.fill(args[0], fill)
        else:
            known.forget(args[0])
    elif kind == _COPYING:
        src = known.value(args[1])
        if src is None or not is_small(args[0]):
            known.forget(args[0])
        else:
            v = known.writable(args[0])
            with no_dispatch():
                if v is not None:
                    v.copy_(src)        # in place: a view's base sees the write
                else:
                    known.put(args[0], src.to(args[0].dtype).expand(tuple(args[0].shape)).clone())
    elif kind == _LIKE_KIND:
        o = out
        fill = _LIKE[func](args)
        if isinstance(o, _Tensor) and is_small(o) and not isinstance(fill, _Tensor):
            known.fill(o, fill)
    elif kind == _FACTORY:
        if isinstance(out, _Tensor) and is_small(out):
            fill = _FACTORY_FILL[func](args) if func in _FACTORY_FILL else None
            if fill is not None and not isinstance(fill, _Tensor):
                known.fill(out, fill)
                return
            with no_dispatch():
                real = func(*args, **_cpu_kwargs(dict(kwargs)))
            known.put(out, real)


def _spread(known, func, args, kwargs, out) -> None:
    """The indices of a choice over unknown scores (an MoE router), as the stated assumption: the
    choices spread evenly. Element i of the batch (in row-major order over the other dims) picks
    (i * k + j) mod n for its j-th of k choices among n, so every option is chosen equally often
    (within one of each other) and no row picks one twice."""
    x = args[0]
    if x.dim() == 0:
        return
    if func is aten.topk.default:
        k = args[1]
        dim = (args[2] if len(args) > 2 else kwargs.get("dim", -1)) % x.dim()
        idx = out[1]
    else:
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if dim is None:
            return
        dim, k = dim % x.dim(), 1
        idx = out[1] if func is aten.max.dim else out
    n = x.shape[dim]
    if not is_small(idx) or n == 0:
        return
    shape = list(idx.shape)
    dropped = idx.dim() != x.dim()     # argmax / max without keepdim: the one choice's dim is gone
    if dropped:
        shape.insert(dim, 1)
    moved = shape[:dim] + shape[dim + 1:] + [shape[dim]]    # the choices last
    with no_dispatch():
        picks = (torch.arange(math.prod(moved[:-1])).unsqueeze(1) * k + torch.arange(moved[-1]).unsqueeze(0)) % n
        value = picks.reshape(moved).movedim(-1, dim)
        value = (value.squeeze(dim) if dropped else value).to(idx.dtype).contiguous()
    known.put(idx, value)
    known.assumed += 1


def _forget_written(known, args, kwargs, writes) -> None:
    for t in _targets(args, kwargs, writes):
        known.forget(t)


def _compute(known, func, args, kwargs, out, writes, aliased=()) -> None:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    o0 = outs[0] if outs else None
    if isinstance(o0, _Tensor) and not o0.is_meta and getattr(o0, "fake_mode", None) is None:
        return                   # a real op on real tensors: its outputs are their own values
    if not all(is_small(o) or not isinstance(o, _Tensor) for o in outs):
        _forget_written(known, args, kwargs, writes)
        return
    for t in _targets(args, kwargs, aliased):
        if isinstance(t, _Tensor):
            known.writable(t)             # a fill viewed or written in place made whole first
    reals = _reals(known, args, kwargs)
    if reals is None:
        _forget_written(known, args, kwargs, writes)
        return
    try:
        with no_dispatch():
            real = func(*reals[0], **_cpu_kwargs(dict(reals[1])))
    except Exception:        # the real op refuses what the fake one took: leave it unknown
        _forget_written(known, args, kwargs, writes)
        return
    reals_out = real if isinstance(real, (tuple, list)) else (real,)
    for o, r in zip(outs, reals_out):
        if isinstance(o, _Tensor) and isinstance(r, _Tensor):
            known.put(o, r)
