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

ONNX op types have a namespace of their own in the same registry, ``reg.onnx`` (op type -> formula of
a ``NodeCall``: the node's input and output shapes and attributes), filled by ``costs/onnx.py`` with
the same shape-level functions the aten formulas use, so a convention is written once. It is kept
apart from the aten table because torch has ops named ``onnx::*`` of its own (``torch.onnx.ops``).
``analyze_onnx(path, costs=reg)`` prices nodes with ``reg.onnx``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from .. import _compat
from ..errors import RegistryError
from ..trace import AttentionShape, Window

__all__ = ["OpCost", "OpCall", "CostOptions", "CostRegistry", "default_registry", "register",
           "register_free", "lookup", "FREE", "registered_names", "NodeCall", "OnnxOps", "ShapeUnknown",
           "register_onnx", "register_onnx_free"]


class OpCost(NamedTuple):
    macs: int = 0
    flops: int = 0
    bytes_read: int | None = None      # None: every tensor input, read once
    bytes_written: int | None = None   # None: every tensor output, written once
    window: Window | None = None
    # the share of ``flops`` a kernel that skips masked work runs: a causal or windowed attention counted
    # dense (the convention) is timed by its kept scores (planning/steptime/sharded_time.py); 1 for every other op
    executed: float = 1.0
    # a fused attention kernel's rows, head dims, mask and dropout, which its speed depends on beyond its
    # FLOPs (trace.AttentionShape, priced by planning/steptime/sharded_time.py)
    attention: AttentionShape | None = None


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


_ARG_POSITIONS: dict[Any, dict[str, int]] = {}   # per op: each argument name's position in its schema


class OpCall:
    """What a cost function sees of one op call."""

    __slots__ = ("func", "args", "kwargs", "out", "options", "values")

    def __init__(self, func: Any, args: tuple, kwargs: dict, out: Any, options: CostOptions,
                 values: Any = None) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.out = out
        self.options = options
        # where tensors have no values (meta, fake): tensor -> its values known beside the run as a
        # list (capture/known.py), or None
        self.values = values

    def value_list(self, t: Any) -> list | None:
        """``t``'s values as a (nested) list: its own where it holds values, else those known beside
        a meta or fake run, else None."""
        if not isinstance(t, torch.Tensor):
            return None
        if t.device.type != "meta" and getattr(t, "fake_mode", None) is None:
            return t.tolist()
        return self.values(t) if self.values is not None else None

    def arg(self, name: str, default: Any = None) -> Any:
        """An argument by its schema name, positional or keyword."""
        if name in self.kwargs:
            return self.kwargs[name]
        func = self.func
        where = _ARG_POSITIONS.get(func)
        if where is None:
            # the schema's argument list is built anew on every ._schema.arguments: read it once per op
            where = {}
            for i, a in enumerate(func._schema.arguments):
                where.setdefault(a.name, i)
            _ARG_POSITIONS[func] = where
        i = where.get(name)
        if i is None:
            return default
        return self.args[i] if i < len(self.args) else default

    @property
    def outs(self) -> tuple:
        return self.out if isinstance(self.out, (tuple, list)) else (self.out,)


CostFn = Callable[[OpCall], OpCost]


def FREE(call: OpCall) -> OpCost:  # noqa: N802 - a sentinel that is also a valid cost function
    """Views and metadata-only ops: no arithmetic, no traffic."""
    return OpCost(0, 0, 0, 0)


class ShapeUnknown(Exception):
    """Raised by an ONNX formula that needs a shape shape inference left unknown (or symbolic): the
    node is reported "unknown shape" in coverage, never counted as 0."""


class NodeCall:
    """What an ONNX formula sees of one node.

    ``inputs``/``outputs``: one shape per value (a tuple of ints, or of ints and strings for symbolic
    dims), None where the value is absent or its shape unknown; ``attrs``: the node's attributes with
    the schema's defaults filled in (a conv's ``kernel_shape`` from its weight, ``pads`` resolved).
    ``shape``/``numel`` raise ``ShapeUnknown`` for a value whose shape is not known in ints.
    """

    __slots__ = ("op_type", "domain", "inputs", "outputs", "attrs")

    def __init__(self, op_type: str, inputs, outputs, attrs: dict | None = None, domain: str = "") -> None:
        self.op_type = op_type
        self.domain = domain
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.attrs = dict(attrs or {})

    def has(self, i: int) -> bool:
        """Input ``i`` is given and its shape known (an optional bias, scale or mask)."""
        return i < len(self.inputs) and self.inputs[i] is not None

    def shape(self, i: int = 0) -> tuple[int, ...]:
        return _known(self.inputs, i, "input")

    def numel(self, i: int = 0) -> int:
        return math.prod(self.shape(i))

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        return _known(self.outputs, i, "output")

    def out_numel(self, i: int = 0) -> int:
        return math.prod(self.out_shape(i))

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


def _known(shapes: tuple, i: int, what: str) -> tuple[int, ...]:
    s = shapes[i] if i < len(shapes) else None
    if s is None or any(not isinstance(d, int) for d in s):
        raise ShapeUnknown(f"{what} {i} has no known shape")
    return s


OnnxCostFn = Callable[[NodeCall], "OpCost | None"]


def _onnx_key(op_type: Any) -> str:
    """The key of an ONNX op type: "Softmax" for the default domain (also "ai.onnx.Softmax"), and
    "<domain>.<OpType>" for another one ("com.microsoft.FusedMatMul"), as coverage names the node
    after its "onnx." prefix."""
    if not isinstance(op_type, str):
        raise RegistryError(f"an ONNX op type is a string such as 'Softmax' or 'com.example.MyOp', got "
                            f"{type(op_type).__name__}")
    domain, _, name = op_type.rpartition(".")
    if not name.isidentifier() or (domain and not all(domain.split("."))):
        raise RegistryError(f"{op_type!r} is not an ONNX op type: 'OpType' (default domain) or "
                            f"'<domain>.<OpType>'")
    return name if domain in ("", "ai.onnx") else op_type


def onnx_key(op_type: str, domain: str = "") -> str:
    """The registry key of a node's op type in its domain."""
    return op_type if domain in ("", "ai.onnx") else f"{domain}.{op_type}"


class OnnxOps:
    """The ONNX op types of a CostRegistry: op type -> ``fn(NodeCall) -> OpCost`` (or ``FREE``).

    A formula returns an ``OpCost`` (bytes default to every input read and every output written
    once), or None where it cannot count this node (it is then uncounted), and raises
    ``ShapeUnknown`` (as ``NodeCall.shape`` does) where a shape it needs is unknown. An op type with
    no formula is uncounted in coverage, never 0.
    """

    __slots__ = ("_owner",)

    def __init__(self, owner: CostRegistry) -> None:
        self._owner = owner

    def _set(self, op_type: Any, fn: OnnxCostFn, replace: bool) -> None:
        self._owner._check_writable()
        if not callable(fn):
            raise RegistryError(f"an ONNX cost formula is a function of a NodeCall returning an OpCost, got "
                                f"{type(fn).__name__}")
        key = _onnx_key(op_type)
        table = self._owner._onnx
        if not replace and key in table:
            raise RegistryError(f"ONNX op type {key} already has a cost formula; use override() to replace it")
        table[key] = fn

    def register(self, op_type: Any, fn: OnnxCostFn | None = None):
        """Add the formula of an op type that has none (raises if it has one: see ``override``).
        Usable as a decorator: ``@reg.onnx.register("com.example.MyOp")``."""
        if fn is None:
            def deco(f: OnnxCostFn) -> OnnxCostFn:
                self._set(op_type, f, False)
                return f
            return deco
        self._set(op_type, fn, False)
        return fn

    def override(self, op_type: Any, fn: OnnxCostFn) -> OnnxCostFn:
        """Set the formula of an op type, replacing the one it has (or adding one)."""
        self._set(op_type, fn, True)
        return fn

    def remove(self, op_type: Any) -> None:
        """Drop an op type's formula: its nodes become uncounted in coverage."""
        self._owner._check_writable()
        self._owner._onnx.pop(_onnx_key(op_type), None)

    def get(self, op_type: Any) -> OnnxCostFn | None:
        """The formula of an op type, or None."""
        return self._owner._onnx.get(_onnx_key(op_type))

    def lookup(self, op_type: str, domain: str = "") -> OnnxCostFn | None:
        """The formula of a node's op type in its domain, or None when no formula covers it."""
        return self._owner._onnx.get(onnx_key(op_type, domain))

    def names(self) -> tuple[str, ...]:
        return tuple(self._owner._onnx)

    def __contains__(self, op_type: Any) -> bool:
        return _onnx_key(op_type) in self._owner._onnx

    def __len__(self) -> int:
        return len(self._owner._onnx)

    def __repr__(self) -> str:
        return f"OnnxOps({self._owner.name!r}, {len(self)} op types)"


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

    __slots__ = ("_table", "_onnx", "_frozen", "name")

    def __init__(self, table: dict[str, CostFn] | None = None, *, name: str = "custom",
                 onnx: dict[str, OnnxCostFn] | None = None) -> None:
        self._table: dict[str, CostFn] = dict(table or {})
        self._onnx: dict[str, OnnxCostFn] = dict(onnx or {})
        self._frozen = False
        self.name = name

    @property
    def onnx(self) -> OnnxOps:
        """The ONNX op types' formulas (``register``/``override``/``remove``/``get`` as for aten ops)."""
        return OnnxOps(self)

    def copy(self, name: str = "custom") -> CostRegistry:
        """A modifiable copy, ONNX op types included (the formulas are shared, the tables are not)."""
        return CostRegistry(self._table, name=name, onnx=self._onnx)

    def _check_writable(self) -> None:
        if self._frozen:
            raise RegistryError("the default cost registry is shared and read-only: change a copy "
                                "(default_registry().copy())")

    def _set(self, op: Any, fn: CostFn, replace: bool) -> None:
        self._check_writable()
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
        self._check_writable()
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
        return f"CostRegistry({self.name!r}, {len(self._table)} ops, {len(self._onnx)} ONNX op types)"


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


def register_onnx(*op_types: str) -> Callable[[OnnxCostFn], OnnxCostFn]:
    """Register ``fn`` as the cost formula of each named ONNX op type in the default registry (used by
    ``costs/onnx.py``)."""

    def deco(fn: OnnxCostFn) -> OnnxCostFn:
        for t in op_types:
            key = _onnx_key(t)
            if key in _DEFAULT._onnx:
                raise RegistryError(f"ONNX op type {key} is registered twice; each has exactly one cost formula")
            _DEFAULT._onnx[key] = fn
        return fn

    return deco


def register_onnx_free(*op_types: str) -> None:
    register_onnx(*op_types)(FREE)


def lookup(func: Any) -> CostFn | None:
    """The default registry's cost function of an OpOverload, or None when no formula covers it."""
    return _REGISTRY.get(func._schema.name)


def registered_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


# namespaces of ops that a module of torch defines in Python (torch.library.custom_op) when it is imported,
# not when torch is: varlen_attn's torch_attn::* (torch 2.10+). Importing it here would import
# torch._dynamo with it (seconds); a model that calls the op has imported it by then
_DEFINED_ON_IMPORT = {"torch_attn": "torch.nn.attention.varlen"}


def op_exists(key: str) -> bool:
    """Whether this torch has the op ``key`` ("ns::name"), or the module of torch that defines it."""
    ns, _, name = key.partition("::")
    if hasattr(getattr(torch.ops, ns), name):
        return True
    module = _DEFINED_ON_IMPORT.get(ns)
    if module is None:
        return False
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
