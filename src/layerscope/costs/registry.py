"""One registry: aten op name -> small pure cost function of shapes.

A cost function takes an ``OpCall`` (the op's args, kwargs, outputs and the analysis options) and
returns an ``OpCost``. Bytes read and written default to "every tensor input read once, every output
written once" (no cache reuse); a function overrides them only where that default is wrong (a gather
reads the rows it picks, not the whole table). Ops known to be free (views, metadata) are registered
with ``register_free``. Registering an op twice raises, so each op has exactly one formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from ..errors import RegistryError
from ..trace import Window

__all__ = ["OpCost", "OpCall", "CostOptions", "register", "register_free", "lookup", "FREE",
           "registered_names"]


class OpCost(NamedTuple):
    macs: int = 0
    flops: int = 0
    bytes_read: int | None = None      # None: every tensor input, read once
    bytes_written: int | None = None   # None: every tensor output, written once
    window: Window | None = None


@dataclass(frozen=True, slots=True)
class CostOptions:
    """Options that change how ops are counted.

    causal: "dense" counts causal attention as the dense kernel computes it (every score);
    "unmasked" counts only the scores the causal mask keeps.
    """

    causal: str = "dense"


class OpCall:
    """What a cost function sees of one op call."""

    __slots__ = ("func", "args", "kwargs", "out", "options")

    def __init__(self, func: Any, args: tuple, kwargs: dict, out: Any, options: CostOptions) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.out = out
        self.options = options

    def arg(self, name: str, default: Any = None) -> Any:
        """An argument by its schema name, positional or keyword."""
        if name in self.kwargs:
            return self.kwargs[name]
        for i, a in enumerate(self.func._schema.arguments):
            if a.name == name:
                return self.args[i] if i < len(self.args) else default
        return default

    @property
    def outs(self) -> tuple:
        return self.out if isinstance(self.out, (tuple, list)) else (self.out,)


CostFn = Callable[[OpCall], OpCost]


def FREE(call: OpCall) -> OpCost:  # noqa: N802 - a sentinel that is also a valid cost function
    """Views and metadata-only ops: no arithmetic, no traffic."""
    return OpCost(0, 0, 0, 0)


_REGISTRY: dict[str, CostFn] = {}


def _key(name: str) -> str:
    return name if "::" in name else "aten::" + name


def _add(name: str, fn: CostFn) -> None:
    key = _key(name)
    if key in _REGISTRY:
        raise RegistryError(f"op {key} is registered twice; each op has exactly one cost formula")
    _REGISTRY[key] = fn


def register(*names: str) -> Callable[[CostFn], CostFn]:
    """Register ``fn`` as the cost formula of each named aten op (``"addmm"``, ``"add_"``, ...)."""

    def deco(fn: CostFn) -> CostFn:
        for n in names:
            _add(n, fn)
        return fn

    return deco


def register_free(*names: str) -> None:
    for n in names:
        _add(n, FREE)


def lookup(func: Any) -> CostFn | None:
    """The cost function of an OpOverload, or None when no formula covers it."""
    return _REGISTRY.get(func._schema.name)


def registered_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def op_exists(key: str) -> bool:
    ns, _, name = key.partition("::")
    return hasattr(getattr(torch.ops, ns), name)
