"""Real values beside a run that has none: small tensors whose values are known.

On meta and fake tensors nothing is computed, and a value read back used to be invented (read as
1). Yet many small integer and boolean tensors of a forward come from what the run was given or
from nothing at all: token ids, labels, lengths and masks passed in, ``arange`` positions, a
``cu_seqlens`` built by ``cumsum``, the comparisons and reductions made of them. Their values are
carried here, computed on the CPU beside the meta/fake tensors, so that

* a value read back (``.item()``, ``bool(t)``, ``int(t)``) is the real one, and a data-dependent
  branch takes the side the real run takes (transformers' all-ones attention-mask checks, CTC's
  "label values must be <= vocab_size");
* an op whose output shape depends on values (``nonzero``, boolean-mask indexing, ``masked_select``,
  ``unique``, ``repeat_interleave``) gets the real shape;
* the ops that check index bounds in real kernels (embedding, index_select, gather, scatter,
  indexing) check them, so a forward that cannot run (position 1024 of a 1024-row table) fails as
  the real one does instead of being priced.

A value is known when every tensor the op reads is known (a real tensor is its own value), or the
op makes it from sizes alone (``arange``, ``zeros``, ``ones``, ``full``, ``*_like`` of those), and
the output has at most ``LIMIT`` elements. An op that writes into a known tensor from something
unknown makes it (and every known view of the same values) unknown again. Values live only as long
as their tensors (weak references), in one object per run: nothing process-wide.
"""

from __future__ import annotations

import collections
import functools
import math
import weakref

import torch

from .._compat import no_dispatch
from .ranges import ABSENT, TAINTED, ValueRanges

__all__ = ["KnownValues", "KnownIndexError", "LIMIT", "SHAPED_OPS"]

LIMIT = 1 << 22            # elements of a value carried (a [1, 1, 2048, 2048] mask: 4,194,304)

aten = torch.ops.aten
_CPU = torch.device("cpu")
_Tensor = torch.Tensor
_ref = weakref.ref


def _gone(table_ref, key: int, ref) -> None:
    """A tensor with a known value died: its entry leaves the table (if the entry is still its)."""
    table = table_ref()
    if table is not None:
        e = table.values.get(key)
        if e is not None and e[0] is ref:
            table._drop(key)

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
# every op ``shaped`` may answer (the recorder routes them to it)
SHAPED_OPS = _SHAPED | _CTC | frozenset((_INDEX, aten.index_put.default, aten.index_put_.default, _TO_COPY))
_SEEDED = torch.Tag.nondeterministic_seeded
_NEVER = frozenset((aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                    aten.new_empty.default, aten.new_empty_strided.default))


class _Unknown(Exception):
    """A tensor without known values (internal to KnownValues._reals)."""


class KnownIndexError(IndexError):
    """An index out of bounds, seen in values known beside a run without them: the real run fails
    here too (with this message; CPU's gather and scatter raise it as a RuntimeError)."""


# what ``after`` does for an op, decided once per op (keyed by id, holding the op: an OpOverload's
# __hash__ is a Python method)
_COMPUTE, _CHECK, _SKIP, _FILLING, _COPYING, _LIKE_KIND, _FACTORY, _ROUTE = range(8)
# choices made from float values (an MoE router's top-k or argmax over its experts' scores): where
# those values are unknown, the stated assumption is that the choices spread evenly
_ROUTING = frozenset((aten.topk.default, aten.argmax.default, aten.max.dim))
_INFO: dict = {}


def _storage_key(t):
    """The storage of a meta or fake tensor (views share it), or None (a real tensor, a subclass without
    one)."""
    if isinstance(t, _Tensor) and (t.is_meta or getattr(t, "fake_mode", None) is not None):
        try:
            return t.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):
            return None
    return None


def _span(t):
    """The first and last element ``t`` reaches in its storage (None if it cannot be told)."""
    try:
        off = t.storage_offset()
        if t.numel() == 0:
            return (off, off - 1)
        return (off, off + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())))
    except (RuntimeError, NotImplementedError):
        return None


def _whole_like(t, fill=None, src=None):
    """A CPU tensor of ``t``'s shape and dtype with ``t``'s strides where ``t`` is dense (zeros_like of a
    transposed tensor keeps its strides: ``as_strided`` and ``view`` then read the elements they read on
    ``t``), else contiguous; filled with ``fill`` or copied from ``src``."""
    shape, stride = tuple(t.shape), tuple(t.stride())
    span = _span(t) if t.numel() else None
    dense = span is not None and span[1] - span[0] + 1 == t.numel() and \
        all(st != 0 for n, st in zip(shape, stride) if n > 1)
    out = torch.empty_strided(shape, stride, dtype=t.dtype) if dense else torch.empty(shape, dtype=t.dtype)
    return out.fill_(fill) if src is None else out.copy_(src)


def _overlaps(a, b) -> bool:
    return a is None or b is None or (a[0] <= b[1] and b[0] <= a[1])


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


def _small(t) -> bool:
    return isinstance(t, _Tensor) and t.numel() <= LIMIT and t.layout is torch.strided


# a fill (zeros, ones, full and their _like forms, fill_) of more elements than this is held as one
# element expanded to its shape: the optimizer's zeros_like state of Llama-2-70B's shards on 64 ranks
# held 8.6 GB of real zeros as known values (peak RSS 8.9 GB for `layerscope parallel hf:llama-2-70b
# --gpus 64 --tp 8`); smaller fills stay whole, so a write into one element of a view goes through
FILL_WHOLE = 1 << 16


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


class KnownValues:
    """The known values of one run (see the module). ``value(t)``: the CPU tensor holding ``t``'s
    values, or None."""

    __slots__ = ("values", "shared", "fills", "tensors", "assumed", "cast_ones", "ranges", "__weakref__")

    def __init__(self) -> None:
        # id(tensor) -> (weak reference, CPU value, the value's storage, the tensor's own storage or None)
        self.values: dict[int, tuple] = {}
        # the values' storages -> ids whose value lies in it (views of one storage): forget() finds them
        # without a pass over the table (an optimizer step forgets one value per parameter: quadratic)
        self.shared: dict[int, set[int]] = {}
        self.fills: set[int] = set()             # the storages of fills held as one element (FILL_WHOLE)
        # the meta/fake tensors' own storages -> {their values' storage -> ids}: a write into one of them
        # reaches every view of it in the run, and each known one whose value does not share the written
        # value's storage (and whose elements it may touch) is forgotten (``_unlink``)
        self.tensors: dict[int, dict[int, set[int]]] = {}
        self.assumed = 0                         # choices over unknown scores spread evenly (_spread)
        self.cast_ones = 0                       # integer tensors cast from unknown floats: all ones
        # the ranges of integer tensors too large to carry (capture/ranges.py): index bounds past LIMIT
        self.ranges = ValueRanges()

    # ---- the table -----------------------------------------------------------------------------
    def put(self, t: torch.Tensor, value: torch.Tensor) -> None:
        if type(t) is _Tensor and not t.is_meta:
            # a real tensor is its own value (``value``): an entry would go stale at its next in-place
            # write (a forward on meta making ``torch.zeros(2, 8)`` on the CPU and writing into it read
            # its nonzero() from the zeros: 0 rows, not 1)
            return
        if _small(value) and tuple(value.shape) == tuple(t.shape):
            self._set(t, value)

    def _set(self, t: torch.Tensor, value: torch.Tensor) -> None:
        key = id(t)
        self._drop(key)
        # the entry goes when ``t`` dies: a value nobody can ask for any more holds no memory (a
        # causal mask made in each of a 70B model's 80 layers held 1.5 GB to the end of the run)
        own = _storage_key(t)
        self.values[key] = (_ref(t, functools.partial(_gone, _ref(self), key)), value,
                            value.untyped_storage()._cdata, own)
        self.shared.setdefault(self.values[key][2], set()).add(key)
        if own is not None:
            self.tensors.setdefault(own, {}).setdefault(self.values[key][2], set()).add(key)

    def _drop(self, key: int):
        """The table's entry for ``key`` out (and out of its storage's set); the entry, or None."""
        e = self.values.pop(key, None)
        if e is not None:
            ids = self.shared.get(e[2])
            if ids is not None:
                ids.discard(key)
                if not ids:
                    del self.shared[e[2]]
                    self.fills.discard(e[2])
            if e[3] is not None:
                groups = self.tensors.get(e[3])
                ids = groups.get(e[2]) if groups is not None else None
                if ids is not None:
                    ids.discard(key)
                    if not ids:
                        del groups[e[2]]
                        if not groups:
                            del self.tensors[e[3]]
        return e

    def _unlink(self, t) -> None:
        """``t`` has just been written in place: every other known tensor on ``t``'s own storage (its
        views, the tensor it is a view of) whose value does not share ``t``'s value's storage did not see
        the write, and is forgotten where its elements may overlap ``t``'s (unknown, never stale:
        ``v = m[:, :3]`` taken while ``m`` had no values, ``m.fill_(1)``, then ``v.fill_(0)``). The views
        that share ``t``'s value saw the write: they are not walked (a loop writing each of K live rows
        stays linear)."""
        if type(t) in (list, tuple):
            for x in t:
                self._unlink(x)
            return
        own = _storage_key(t)
        groups = self.tensors.get(own) if own is not None else None
        if not groups:
            return
        e = self.values.get(id(t))
        mine = e[2] if e is not None and e[0]() is t else None
        if len(groups) == 1 and mine in groups:
            return
        span = _span(t)
        for vs in [g for g in groups if g != mine]:
            for k in list(groups.get(vs, ())):
                other = self.values.get(k)
                if other is None:
                    continue
                o = other[0]()
                if o is None or span is None or _overlaps(span, _span(o)):
                    self._drop(k)

    def _fill(self, t: torch.Tensor, fill) -> None:
        """``t`` holds ``fill`` in every element: a whole tensor up to FILL_WHOLE elements, one element
        expanded to ``t``'s shape above (no memory however large)."""
        if not _small(t):
            return
        shape = tuple(t.shape)
        with no_dispatch():
            if t.numel() <= FILL_WHOLE:
                self.put(t, _whole_like(t, fill))
                return
            value = torch.full((), fill, dtype=t.dtype).expand(shape)
        self.put(t, value)
        if self.value(t) is value:
            self.fills.add(value.untyped_storage()._cdata)

    def writable(self, t) -> torch.Tensor | None:
        """The value of ``t`` to be written in place or viewed (where views of it, or the tensor it is a
        view of, see a write), or None if unknown. A fill held as one element is made whole first (the
        recorder makes it whole before its first view, so only the fill itself holds it); anything else
        sharing one is forgotten with every tensor sharing it (unknown, never stale). A tensor without an
        entry (a real one is its own value) has none to write: None."""
        if id(t) not in self.values:
            return None
        v = self.value(t)
        if v is None:
            return None
        cdata = self.values[id(t)][2]
        if cdata not in self.fills:
            return v
        if self.shared.get(cdata) == {id(t)} and v.dim() > 0 and all(x == 0 for x in v.stride()):
            with no_dispatch():
                # t's strides where its shape is the value's still (an in-place op that changes the shape
                # has changed t's already: the op then runs on the value as it was)
                whole = _whole_like(t, src=v) if tuple(t.shape) == tuple(v.shape) else v.contiguous()
            # the entry itself, not put(): an in-place op that changes the shape (``t_``, ``squeeze_``,
            # ``resize_``) has changed ``t``'s already, and its value follows when the op runs on it
            self._set(t, whole)
            return whole
        self.forget(t)
        return None

    def seed(self, t: torch.Tensor, real: torch.Tensor, storages: dict | None = None) -> None:
        """``t`` (a meta or fake tensor) stands for ``real``: carry its values if it is a small
        integer or boolean tensor with values (on the CPU or a GPU: a copy on the CPU). ``storages``
        (real storage -> its CPU copy): where given for ``real``'s storage, the value is a view of that
        copy, as ``real`` is of its storage."""
        if isinstance(real, _Tensor) and real.device.type != "meta" and not real.is_floating_point() and \
                not real.is_complex() and _small(real) and getattr(real, "fake_mode", None) is None:
            with no_dispatch():     # a real copy, also inside a FakeTensorMode
                copy = storages.get(real.untyped_storage()._cdata) if storages else None
                if copy is not None:
                    self.put(t, torch.empty(0, dtype=real.dtype).set_(copy, real.storage_offset(), real.size(),
                                                                      real.stride()))
                else:
                    self.put(t, real.detach().to("cpu", copy=True))
        elif isinstance(real, _Tensor) and real.device.type != "meta" and getattr(real, "fake_mode", None) is None \
                and real.layout is torch.strided and not _small(real):
            self.ranges.seed(t, real)       # too large to carry: its min and max (index bounds)

    def seed_pairs(self, fakes, reals) -> None:
        """``seed`` each pair. Inputs that share a real storage (``model(ids, labels=ids)``, a tensor and
        a view of it) get views of one CPU copy of it: a write into one reaches the others, as in the real
        run (each had a copy of its own, and a write into ``a`` left ``b`` at its old values)."""
        fakes, reals = list(fakes), list(reals)
        if len(fakes) != len(reals):
            return
        held = [r for f, r in zip(fakes, reals) if f is not r and isinstance(r, _Tensor) and
                r.device.type != "meta" and getattr(r, "fake_mode", None) is None and r.layout is torch.strided]
        seen = collections.Counter(r.untyped_storage()._cdata for r in held)
        storages = {}
        for r in held:
            key = r.untyped_storage()._cdata
            if seen[key] > 1 and key not in storages and \
                    r.untyped_storage().nbytes() <= LIMIT * r.element_size():
                with no_dispatch():
                    src = r.untyped_storage()
                    copy = torch.UntypedStorage(src.nbytes())
                    copy.copy_(src.cpu() if src.device.type != "cpu" else src)
                storages[key] = copy
        for f, r in zip(fakes, reals):
            if f is not r:
                self.seed(f, r, storages)

    def value(self, t) -> torch.Tensor | None:
        e = self.values.get(id(t))
        if e is not None:
            if e[0]() is t:
                return e[1]
            self._drop(id(t))
        if type(t) is _Tensor and not t.is_meta and t.device.type == "cpu" and _small(t) and \
                getattr(t, "fake_mode", None) is None:
            with no_dispatch():        # a real tensor is its own value: a private copy (ops computed
                return t.detach().clone()   # on values may write into it)
        return None

    def stored(self, t) -> torch.Tensor | None:
        """``t``'s value as held (not a copy: never to be written), a real tensor itself, or None."""
        e = self.values.get(id(t))
        if e is not None and e[0]() is t:
            return e[1]
        if type(t) is _Tensor and not t.is_meta:
            return t
        return None

    def values_list(self, t) -> list | None:
        """``t``'s values as a list (read outside any dispatch mode), or None."""
        v = self.value(t)
        if v is None:
            return None
        with no_dispatch():
            return v.tolist()

    def forget(self, t) -> None:
        """``t`` was written from something unknown: it, and every known tensor sharing its values
        (views of one CPU storage), are unknown now. A list of tensors (``_foreach_*_``): each."""
        if type(t) in (list, tuple):
            for x in t:
                self.forget(x)
            return
        e = self._drop(id(t))
        if e is None:
            return
        for k in list(self.shared.get(e[2], ())):
            self._drop(k)

    # ---- the recorder's calls --------------------------------------------------------------------
    def item(self, t):
        """The real value behind ``.item()`` of ``t``, or None."""
        v = self.value(t)
        if v is None or v.numel() != 1:
            return None
        with no_dispatch():      # a real read, also inside a FakeTensorMode
            return v.item()

    def check(self, func, args) -> None:
        """Raise the real kernel's error where a known index is out of bounds."""
        with no_dispatch():      # real reads, also inside a FakeTensorMode
            self._check(func, args)

    def _outside(self, t, op: str, lo_ok: int, size: int):
        """``(lo, hi)``, the least and greatest index in ``t``, where they certainly reach outside
        ``[lo_ok, size)``: from its value, or from its exact range where it is too large to carry
        (capture/ranges.py); else None. An inexact range past the bounds, or none where ``t`` came from
        values too large to carry, proves nothing: the report says ``op``'s bounds were not checked."""
        v = self.stored(t)
        if v is not None:
            if not v.numel():
                return None
            b = (int(v.min()), int(v.max()), True)
        else:
            b = self.ranges.entry(t)
            if b is ABSENT:
                return None
            if b is TAINTED:
                self.ranges.unchecked[op] += 1
                return None
        if lo_ok <= b[0] and b[1] < size:
            return None
        if not b[2]:
            self.ranges.unchecked[op] += 1
            return None
        return (b[0], b[1])

    def _check(self, func, args) -> None:
        if func is aten.embedding.default:
            if self._outside(args[1], "embedding", 0, args[0].shape[0]) is not None:
                raise KnownIndexError("index out of range in self")
        elif func is aten.index_select.default:
            dim = args[1] % max(args[0].dim(), 1)
            size = args[0].shape[dim] if args[0].dim() else 1
            if self._outside(args[2], "index_select", 0, size) is not None:
                raise KnownIndexError(f"index out of range in self (index_select, dimension {dim} of size "
                                      f"{size})")
        elif func in (aten.gather.default, aten.scatter.src, aten.scatter.value, aten.scatter_.src,
                      aten.scatter_.value, aten.scatter_add.default, aten.scatter_add_.default):
            if args[0].dim():
                dim = args[1] % args[0].dim()
                size = args[0].shape[dim]
                b = self._outside(args[2], func._opname, 0, size)
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
                    b = self._outside(i, "index", -size, size)
                    if b is not None:
                        raise _index_error(b, size, dim)
                dim += i.dim() if i.dtype in (torch.bool, torch.uint8) else 1

    def shaped(self, func, args, kwargs):
        """For an op whose output shape depends on values, the outputs at the real shape (meta or
        fake tensors, their values known) when every tensor it reads is known; else None."""
        if func not in SHAPED_OPS:
            return None
        if func in (_INDEX, aten.index_put.default, aten.index_put_.default):
            return self._masked_index(func, args, kwargs)
        if func in _CTC:
            return self._ctc(args)
        if func is _TO_COPY:
            # a meta tensor with known values copied to the CPU (``.tolist()``, ``.cpu()``): the values
            dev = kwargs.get("device")
            v = self.value(args[0]) if args[0].is_meta and dev is not None and torch.device(dev).type == "cpu" \
                else None
            if v is None:
                return None
            with no_dispatch():
                return v.to(dtype=kwargs.get("dtype") or v.dtype, copy=True)
        reals = self._reals(args, kwargs)
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
            self.put(o, r)
            outs.append(o)
        return tuple(outs) if many else outs[0]

    def _ctc(self, args):
        """CTC's forward on CPU: the loss per sequence [B] and log_alpha [B, T, 2 * max target length + 1]
        (its fake kernel cannot size it without the target lengths' values)."""
        log_probs, target_lengths = args[0], args[3]
        lengths = self.values_list(target_lengths) if isinstance(target_lengths, _Tensor) else list(target_lengths)
        if lengths is None:
            return None
        t, b = (log_probs.shape[0], log_probs.shape[1]) if log_probs.dim() == 3 else (log_probs.shape[0], 1)
        longest = max(lengths, default=0)
        like = dict(dtype=log_probs.dtype, device=log_probs.device)
        return (torch.empty((b,) if log_probs.dim() == 3 else (), **like),
                torch.empty((b, t, 2 * longest + 1) if log_probs.dim() == 3 else (t, 2 * longest + 1), **like))

    def _masked_index(self, func, args, kwargs):
        """Boolean masks among the indices, known: replaced by the positions they select (known too),
        so the op runs with the real number of elements."""
        indices = args[1]
        if not any(isinstance(i, _Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return None
        new = []
        for i in indices:
            if isinstance(i, _Tensor) and i.dtype in (torch.bool, torch.uint8):
                v = self.value(i)
                if v is None:
                    return None
                with no_dispatch():
                    where = v.nonzero(as_tuple=True)
                for w in where:
                    if getattr(i, "fake_mode", None) is None:
                        new.append(w)        # a real or meta mask: its positions as a CPU index
                        continue
                    o = torch.empty(tuple(w.shape), dtype=torch.long, device=i.device)
                    self.put(o, w)
                    new.append(o)
            else:
                new.append(i)
        out = func(args[0], new, *args[2:], **kwargs)
        if func is not _INDEX:
            self._carry_put(func, args, kwargs, new, out)
        return out

    def _carry_put(self, func, args, kwargs, indices, out) -> None:
        """What ``index_put``/``index_put_`` wrote (``x[mask] = v`` on a tensor with known values): the
        result's values, written in place into the stored value for ``index_put_`` (its views see the
        write), or, where the written values or an index are unknown, none (the tensor written in place,
        and its views, are forgotten rather than left at their old values)."""
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        # aten's own index_put_: it takes None among the indices (``m[:, mask] = 0``), Tensor.index_put_ not
        if func is aten.index_put_.default:
            base = self.writable(args[0])
            reals = self._reals((args[0], list(indices), args[2]), {}) if base is not None else None
            if reals is None:
                self.forget(args[0])
            else:
                (_, idx, vals), _ = reals
                with no_dispatch():
                    aten.index_put_.default(base, list(idx), vals, accumulate)
            if self.tensors:
                self._unlink(args[0])
            return
        reals = self._reals((args[0], list(indices), args[2]), {})    # None where one is unknown
        if reals is None:
            return
        (base, idx, vals), _ = reals
        with no_dispatch():
            self.put(out, aten.index_put.default(base, list(idx), vals, accumulate))

    def _reals(self, args, kwargs):
        """``(args, kwargs)`` with every tensor replaced by its value; None if one is unknown. (No
        closure here: a recursive one is a reference cycle, and a cycle holding a fake tensor keeps
        its storage alive until the garbage collector runs, which a simulation pauses.)"""
        try:
            return (tuple(self._real(a) for a in args), {k: self._real(v) for k, v in kwargs.items()})
        except _Unknown:
            return None

    def _real(self, a):
        if isinstance(a, _Tensor):
            v = self.value(a)
            if v is None:
                raise _Unknown
            return v
        if type(a) in (list, tuple):
            return type(a)(self._real(x) for x in a)
        return a

    def after(self, func, args, kwargs, out) -> None:
        """Carry the values of ``func``'s outputs (it ran on meta/fake tensors and gave ``out``), and
        raise the real kernel's error where a known index is out of bounds (``check``)."""
        e = _INFO.get(id(func))
        info = e[1] if e is not None and e[0] is func else _info(func)
        ranged = None
        if self.ranges.table or isinstance(out, _Tensor) and out.numel() > LIMIT:
            # values too large to carry, or made from them: their ranges (capture/ranges.py)
            ranged = self.ranges.before(self, func, args, kwargs, out, list(_targets(args, kwargs, info[1])))
        try:
            self._after(func, args, kwargs, out, info)
            if ranged:
                self.ranges.after(self, ranged)
        finally:
            # once the write is carried (or forgotten), what shares the tensor but not its value did not
            # see it (``set_`` has moved the tensor onto its source's storage by now: nothing to forget)
            if info[1] and self.tensors:
                for t in _targets(args, kwargs, info[1]):
                    self._unlink(t)

    def _after(self, func, args, kwargs, out, info) -> None:
        kind, writes, aliased = info
        if kind == _CHECK:
            self.check(func, args)
            kind = _COMPUTE
        if kind == _COMPUTE:
            # the common op: an output too large to carry, or an input without values, ends it
            if type(out) is _Tensor or type(out) is not tuple and isinstance(out, _Tensor):
                if out.numel() > LIMIT:
                    if writes:
                        self._forget_written(args, kwargs, writes)
                    return
            for a in args:
                if isinstance(a, _Tensor) and self.value(a) is None:
                    if writes:
                        self._forget_written(args, kwargs, writes)
                    elif func is _TO_COPY and a.is_floating_point() and isinstance(out, _Tensor) and \
                            _small(out) and not out.is_floating_point() and out.dtype is not torch.bool:
                        # integers made from floats without values (durations, counts a model
                        # predicts): all ones, as every other value without one reads
                        with no_dispatch():
                            self.put(out, torch.ones(tuple(out.shape), dtype=out.dtype))
                        self.cast_ones += 1
                    return
            self._compute(func, args, kwargs, out, writes, aliased)
        elif kind == _SKIP:
            if writes:
                self._forget_written(args, kwargs, writes)
        elif kind == _ROUTE:
            if self.value(args[0]) is not None:
                self._compute(func, args, kwargs, out, writes, aliased)
            else:
                self._spread(func, args, kwargs, out)
        elif kind == _FILLING:
            if _small(args[0]) and not isinstance(args[1] if len(args) > 1 else None, _Tensor):
                fill = 0 if func is aten.zero_.default else args[1]
                # in place where the value is known: a view's base sees the write (``x[:, :3] = 0``)
                v = self.writable(args[0])
                if v is not None:
                    with no_dispatch():
                        v.fill_(fill)
                else:
                    self._fill(args[0], fill)
            else:
                self.forget(args[0])
        elif kind == _COPYING:
            src = self.value(args[1])
            if src is None or not _small(args[0]):
                self.forget(args[0])
            else:
                v = self.writable(args[0])
                with no_dispatch():
                    if v is not None:
                        v.copy_(src)        # in place: a view's base sees the write
                    else:
                        self.put(args[0], src.to(args[0].dtype).expand(tuple(args[0].shape)).clone())
        elif kind == _LIKE_KIND:
            o = out
            fill = _LIKE[func](args)
            if isinstance(o, _Tensor) and _small(o) and not isinstance(fill, _Tensor):
                self._fill(o, fill)
        elif kind == _FACTORY:
            if isinstance(out, _Tensor) and _small(out):
                fill = _FACTORY_FILL[func](args) if func in _FACTORY_FILL else None
                if fill is not None and not isinstance(fill, _Tensor):
                    self._fill(out, fill)
                    return
                with no_dispatch():
                    real = func(*args, **_cpu_kwargs(dict(kwargs)))
                self.put(out, real)

    def _spread(self, func, args, kwargs, out) -> None:
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
        if not _small(idx) or n == 0:
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
        self.put(idx, value)
        self.assumed += 1

    def _forget_written(self, args, kwargs, writes) -> None:
        for t in _targets(args, kwargs, writes):
            self.forget(t)

    def _compute(self, func, args, kwargs, out, writes, aliased=()) -> None:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        o0 = outs[0] if outs else None
        if isinstance(o0, _Tensor) and not o0.is_meta and getattr(o0, "fake_mode", None) is None:
            return                   # a real op on real tensors: its outputs are their own values
        if not all(_small(o) or not isinstance(o, _Tensor) for o in outs):
            self._forget_written(args, kwargs, writes)
            return
        for t in _targets(args, kwargs, aliased):
            if isinstance(t, _Tensor):
                self.writable(t)             # a fill viewed or written in place made whole first
        reals = self._reals(args, kwargs)
        if reals is None:
            self._forget_written(args, kwargs, writes)
            return
        try:
            with no_dispatch():
                real = func(*reals[0], **_cpu_kwargs(dict(reals[1])))
        except Exception:        # the real op refuses what the fake one took: leave it unknown
            self._forget_written(args, kwargs, writes)
            return
        reals_out = real if isinstance(real, (tuple, list)) else (real,)
        for o, r in zip(outs, reals_out):
            if isinstance(o, _Tensor) and isinstance(r, _Tensor):
                self.put(o, r)

    def notes(self) -> list[str]:
        """What a report says of the values this run had to assume."""
        out = []
        if self.assumed:
            out.append(f"{self.assumed} choice(s) made from scores without values (an MoE router's top-k or "
                       "argmax, on meta/fake tensors) were assumed to spread evenly over the options: every "
                       "expert gets the same number of tokens (within one), so none is over its capacity")
        if self.cast_ones:
            out.append(f"{self.cast_ones} integer tensor(s) cast from floats without values (durations or "
                       "counts the model predicts, on meta/fake tensors) were read as all ones")
        return out + self.ranges.note()

    def has(self, t) -> bool:
        return self.value(t) is not None
