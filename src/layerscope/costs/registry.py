"""One registry: aten op name -> small pure cost function of shapes.

A cost function takes an ``OpCall`` (the op's args, kwargs, outputs and the analysis options) and
returns an ``OpCost``. Bytes read and written default to "every tensor input read once, every output
written once" (no cache reuse); a function overrides them only where that default is wrong (a gather
reads the rows it picks, not the whole table). Ops known to be free (views, metadata) are registered
with ``register_free``. Registering an op twice raises, so each op has exactly one formula.

The formulas registered here form the default ``CostRegistry``, shared and read-only. An analysis
that counts differently (an FMA as 1 FLOP, a custom op's formula) brings its own registry:
``reg = default_registry().copy()``, then ``reg.register(op, fn)`` / ``reg.override(op, fn)``, passed
as ``analyze(model, x, costs=reg)``. It travels in the analysis's ``CostOptions``, never through a
global, so two threads analysing with different registries each get their own numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from .. import _compat
from ..errors import RegistryError
from ..trace import Window

__all__ = ["OpCost", "OpCall", "CostOptions", "CostRegistry", "default_registry", "register",
           "register_free", "lookup", "FREE", "registered_names"]


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
    registry: CostRegistry | None = None   # None: the default registry

    def lookup(self, func: Any) -> CostFn | None:
        """The cost function of ``func`` in the registry this analysis uses."""
        return (_DEFAULT if self.registry is None else self.registry).lookup(func)


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


def _key(name: str) -> str:
    return name if "::" in name else "aten::" + name


def _op_key(op: Any) -> str:
    """The registry key of an op given as a name ("addmm", "mylib::scale_add"), an OpOverloadPacket
    (``torch.ops.aten.addmm``) or an OpOverload (``torch.ops.aten.addmm.default``). Formulas are per
    op name: one formula covers all of an op's overloads (as the default registry's do)."""
    if isinstance(op, str):
        key = _key(op)
        if not op_exists(key):
            raise RegistryError(f"no op named {key}: give an existing op (torch.ops.<ns>.<name>) or its "
                                f"'ns::name'")
        return key
    if _compat.is_op_overload(op):
        return op._schema.name
    if _compat.is_op_packet(op):
        return op._qualified_op_name
    raise RegistryError(f"an op is a torch.ops.<ns>.<name>[.<overload>] or its 'ns::name', got "
                        f"{type(op).__name__}")


class CostRegistry:
    """A table of cost formulas: op name -> ``fn(OpCall) -> OpCost`` (or ``FREE``).

    The default registry (``default_registry()``) is shared and read-only; ``copy()`` it and change
    the copy. An op the registry in use has no formula for is uncounted in coverage, never 0.
    """

    __slots__ = ("_table", "_frozen", "name")

    def __init__(self, table: dict[str, CostFn] | None = None, *, name: str = "custom") -> None:
        self._table: dict[str, CostFn] = dict(table or {})
        self._frozen = False
        self.name = name

    def copy(self, name: str = "custom") -> CostRegistry:
        """A modifiable copy (the formulas are shared, the table is not)."""
        return CostRegistry(self._table, name=name)

    def _set(self, op: Any, fn: CostFn, replace: bool) -> None:
        if self._frozen:
            raise RegistryError("the default cost registry is shared and read-only: change a copy "
                                "(default_registry().copy())")
        if not callable(fn):
            raise RegistryError(f"a cost formula is a function of an OpCall returning an OpCost, got "
                                f"{type(fn).__name__}")
        key = _op_key(op)
        if not replace and key in self._table:
            raise RegistryError(f"op {key} already has a cost formula; use override() to replace it")
        self._table[key] = fn

    def register(self, op: Any, fn: CostFn | None = None):
        """Add the formula of an op that has none (raises if it has one: see ``override``). Usable
        as a decorator: ``@reg.register(torch.ops.mylib.op)``."""
        if fn is None:
            def deco(f: CostFn) -> CostFn:
                self._set(op, f, False)
                return f
            return deco
        self._set(op, fn, False)
        return fn

    def override(self, op: Any, fn: CostFn) -> CostFn:
        """Set the formula of an op, replacing the one it has (or adding one)."""
        self._set(op, fn, True)
        return fn

    def remove(self, op: Any) -> None:
        """Drop an op's formula: it becomes uncounted in coverage."""
        if self._frozen:
            raise RegistryError("the default cost registry is shared and read-only: change a copy "
                                "(default_registry().copy())")
        self._table.pop(_op_key(op), None)

    def get(self, op: Any) -> CostFn | None:
        """The formula of an op (a name, packet or overload), or None."""
        return self._table.get(_op_key(op))

    def lookup(self, func: Any) -> CostFn | None:
        """The cost function of an OpOverload, or None when no formula covers it."""
        return self._table.get(func._schema.name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._table)

    def __contains__(self, op: Any) -> bool:
        return _op_key(op) in self._table

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"CostRegistry({self.name!r}, {len(self._table)} ops)"


_DEFAULT = CostRegistry(name="default")
_DEFAULT._frozen = True
_REGISTRY: dict[str, CostFn] = _DEFAULT._table   # the formula modules register into the default


def default_registry() -> CostRegistry:
    """The shared, read-only registry of the built-in formulas; ``.copy()`` it to change one."""
    return _DEFAULT


def _add(name: str, fn: CostFn) -> None:
    key = _key(name)
    if key in _REGISTRY:
        raise RegistryError(f"op {key} is registered twice; each op has exactly one cost formula")
    _REGISTRY[key] = fn


def register(*names: str) -> Callable[[CostFn], CostFn]:
    """Register ``fn`` as the cost formula of each named aten op (``"addmm"``, ``"add_"``, ...) in the
    default registry (used by the built-in formula modules). An op the running torch does not have
    (``_grouped_mm`` before torch 2.8) is not registered: no model can run it."""

    def deco(fn: CostFn) -> CostFn:
        for n in names:
            if op_exists(_key(n)):
                _add(n, fn)
        return fn

    return deco


def register_free(*names: str) -> None:
    for n in names:
        if op_exists(_key(n)):
            _add(n, FREE)


def lookup(func: Any) -> CostFn | None:
    """The default registry's cost function of an OpOverload, or None when no formula covers it."""
    return _REGISTRY.get(func._schema.name)


def registered_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def op_exists(key: str) -> bool:
    ns, _, name = key.partition("::")
    return hasattr(getattr(torch.ops, ns), name)
