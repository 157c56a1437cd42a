"""A block's layer index read while its step is composed (capture/blocks.py, capture/compose.py).

transformers' attention modules hold their block's place in ``layer_idx`` and, with the KV cache on
(``use_cache=True``, every config's default, also in a training call), read it in each forward to pick
the cache's slot: ``past_key_values.update(key, value, self.layer_idx)``. The attribute differs from
block to block, and a composition may stand for the whole model only where what differs is never read
(capture/blocks.py): a block that does ``if self.layer_idx == 5`` runs other code at that place, which
the five blocks simulated never show. A read of an int attribute therefore hands the block a
``LayerIndex`` (only under the name ``layer_idx``, ``INDEX_NAMES``: another int attribute that
differs and is read voids the composition as before): an int that notes every use Python makes of it (comparison, arithmetic, hashing,
formatting, truth, conversion) with the module of the code that made it, and the cache object it was
used on. The read is harmless, and the composition stands, when

* every use was made by transformers' cache code (``CACHE_MODULES``): the index picked a slot and
  nothing else; a use anywhere else (the block's own code, a config lookup made by arithmetic on it)
  voids the composition;
* every cache it was used on holds slots of one class at every block's index of the run, or grows
  its slots on demand from one class (``layer_class_to_replicate``): each block's slot behaves as the
  repeated block's does;
* every per-layer list of the model's configs (``layer_types``, ``no_rope_layers``, ..., any list or
  tuple attribute long enough) holds one value at the indices of every block of the run, the blocks
  left out included: indexing a list with
  an int subclass calls nothing Python can see, so a block that looks its own kind up by its index
  (``config.layer_types[self.layer_idx]``) is caught by the list, not by the use.

Not seen: a block indexing some other sequence of its own by its layer index (a list kept on the
model, not in a config); no transformers model does so in its forward as of 5.24.
"""

from __future__ import annotations

import sys

from torch import nn

__all__ = ["LayerIndex", "IndexReads", "CACHE_MODULES", "INDEX_NAMES"]

CACHE_MODULES = frozenset(("transformers.cache_utils",))
# the attributes read this way: transformers' name for a block's place; any other attribute that differs
# between the blocks voids the composition when read, whatever it holds (capture/blocks.py)
INDEX_NAMES = frozenset(("layer_idx",))


class IndexReads:
    """The layer indices a composed run handed out and how they were used."""

    def __init__(self) -> None:
        self.values: set[int] = set()                   # handed out by the blocks that ran
        self.places: set[int] = set()                   # every block's of the run, ran or left out
        self.uses: list[tuple[str, str]] = []          # (module of the code, what it did)
        self.caches: dict[int, object] = {}             # id -> a cache object an index was used on

    def hand(self, value: int) -> "LayerIndex":
        self.values.add(value)
        return LayerIndex(value, self)

    def problem(self, model: nn.Module) -> str | None:
        """Why the indices read may make a block behave otherwise at places the run did not show
        (module docstring), or None."""
        for module, what in self.uses:
            if module not in CACHE_MODULES:
                return f"the forward used 'layer_idx', which differs between the blocks, in {module} ({what})"
        if not self.values:
            return None
        idx = sorted(self.values | self.places)
        for cache in self.caches.values():
            layers = getattr(cache, "layers", None)
            if not isinstance(layers, list):
                return f"the layer index picked a slot of {type(cache).__name__}, whose slots are not a list"
            have = [layers[i] for i in idx if i < len(layers)]
            if len(have) < len(idx) and getattr(cache, "layer_class_to_replicate", None) is None:
                return f"{type(cache).__name__} has no slot at some layer index the blocks read"
            if len({type(x) for x in have}) > 1:
                return f"{type(cache).__name__}'s slots differ in class between the blocks"
        for cfg in _configs(model):
            for key, val in vars(cfg).items():
                if isinstance(val, (list, tuple)) and len(val) > idx[-1] and \
                        len({repr(val[i]) for i in idx}) > 1:
                    return f"the config's per-layer {key!r} differs between the blocks"
        return None


def _configs(model: nn.Module) -> list:
    """The model's configs (transformers' ``config`` attributes) and their sub-configs."""
    out, seen = [], set()
    todo = [getattr(m, "config", None) for m in model.modules()]
    while todo:
        cfg = todo.pop()
        if cfg is None or id(cfg) in seen or not hasattr(cfg, "to_dict"):
            continue
        seen.add(id(cfg))
        out.append(cfg)
        todo.extend(v for v in vars(cfg).values() if hasattr(v, "to_dict") and hasattr(v, "model_type"))
    return out


def _noting(name: str):
    base = getattr(int, name)

    def method(self, *args):
        frame = sys._getframe(1)
        reads = self.__dict__["_ls_index"]
        reads.uses.append((frame.f_globals.get("__name__", "?"), name))
        owner = frame.f_locals.get("self")
        if owner is not None and type(owner).__module__ in CACHE_MODULES:
            reads.caches.setdefault(id(owner), owner)
        return base(self, *args)
    method.__name__ = name
    return method


_NOTED = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__", "__add__",
          "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__", "__rfloordiv__", "__mod__",
          "__rmod__", "__truediv__", "__rtruediv__", "__pow__", "__rpow__", "__divmod__", "__rdivmod__",
          "__neg__", "__pos__", "__abs__", "__invert__", "__and__", "__rand__", "__or__", "__ror__", "__xor__",
          "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__", "__int__", "__index__",
          "__float__", "__round__", "__trunc__", "__floor__", "__ceil__", "__format__", "__str__", "__repr__")


class LayerIndex(int):
    """An int that notes its uses in an ``IndexReads`` (module docstring)."""

    def __new__(cls, value: int, reads: IndexReads):
        self = super().__new__(cls, value)
        self.__dict__["_ls_index"] = reads
        return self

    def __reduce__(self):          # copies and pickles are plain ints
        return int, (int.__int__(self),)

    def __deepcopy__(self, memo):
        return int.__int__(self)

    def __copy__(self):
        return int.__int__(self)


for _name in _NOTED:
    setattr(LayerIndex, _name, _noting(_name))
del _name
