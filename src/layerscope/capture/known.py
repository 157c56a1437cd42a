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

This module is the table of values (``KnownValues``: put, read, forget, seed from the inputs);
capture/known_ops.py says what each op does to them (the recorder's calls).
"""

from __future__ import annotations

import collections
import functools
import weakref

import torch

from .._compat import no_dispatch
from .notes import Note
from .ranges import ValueRanges

__all__ = ["KnownValues", "KnownIndexError", "LIMIT", "FILL_WHOLE", "is_small"]

LIMIT = 1 << 22            # elements of a value carried (a [1, 1, 2048, 2048] mask: 4,194,304)

_Tensor = torch.Tensor
_ref = weakref.ref


def _gone(table_ref, key: int, ref) -> None:
    """A tensor with a known value died: its entry leaves the table (if the entry is still its)."""
    table = table_ref()
    if table is not None:
        e = table.values.get(key)
        if e is not None and e[0] is ref:
            table._drop(key)


class KnownIndexError(IndexError):
    """An index out of bounds, seen in values known beside a run without them: the real run fails
    here too (with this message; CPU's gather and scatter raise it as a RuntimeError)."""


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


def is_small(t) -> bool:
    """Whether ``t`` is a strided tensor of at most LIMIT elements (a value this table carries)."""
    return isinstance(t, _Tensor) and t.numel() <= LIMIT and t.layout is torch.strided


# a fill (zeros, ones, full and their _like forms, fill_) of more elements than this is held as one
# element expanded to its shape: the optimizer's zeros_like state of Llama-2-70B's shards on 64 ranks
# held 8.6 GB of real zeros as known values (peak RSS 8.9 GB for `layerscope parallel hf:llama-2-70b
# --gpus 64 --tp 8`); smaller fills stay whole, so a write into one element of a view goes through
FILL_WHOLE = 1 << 16


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
        # value's storage (and whose elements it may touch) is forgotten (``unlink``)
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
        if is_small(value) and tuple(value.shape) == tuple(t.shape):
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

    def unlink(self, t) -> None:
        """``t`` has just been written in place: every other known tensor on ``t``'s own storage (its
        views, the tensor it is a view of) whose value does not share ``t``'s value's storage did not see
        the write, and is forgotten where its elements may overlap ``t``'s (unknown, never stale:
        ``v = m[:, :3]`` taken while ``m`` had no values, ``m.fill_(1)``, then ``v.fill_(0)``). The views
        that share ``t``'s value saw the write: they are not walked (a loop writing each of K live rows
        stays linear)."""
        if type(t) in (list, tuple):
            for x in t:
                self.unlink(x)
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

    def fill(self, t: torch.Tensor, fill) -> None:
        """``t`` holds ``fill`` in every element: a whole tensor up to FILL_WHOLE elements, one element
        expanded to ``t``'s shape above (no memory however large)."""
        if not is_small(t):
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
                not real.is_complex() and is_small(real) and getattr(real, "fake_mode", None) is None:
            with no_dispatch():     # a real copy, also inside a FakeTensorMode
                copy = storages.get(real.untyped_storage()._cdata) if storages else None
                if copy is not None:
                    self.put(t, torch.empty(0, dtype=real.dtype).set_(copy, real.storage_offset(), real.size(),
                                                                      real.stride()))
                else:
                    self.put(t, real.detach().to("cpu", copy=True))
        elif isinstance(real, _Tensor) and real.device.type != "meta" and getattr(real, "fake_mode", None) is None \
                and real.layout is torch.strided and not is_small(real):
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
        if type(t) is _Tensor and not t.is_meta and t.device.type == "cpu" and is_small(t) and \
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















    def notes(self) -> list[Note]:
        """What a report says of the values this run had to assume (records; reports/notes.py words them)."""
        out = []
        if self.assumed:
            out.append(Note("known-assumed-spread", {"count": self.assumed}))
        if self.cast_ones:
            out.append(Note("known-cast-ones", {"count": self.cast_ones}))
        if self.ranges.unchecked:
            out.append(Note("known-index-bounds", {"ops": tuple(sorted(self.ranges.unchecked.items()))}))
        return out

    def has(self, t) -> bool:
        return self.value(t) is not None
