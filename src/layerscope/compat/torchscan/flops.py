"""torchscan 0.2's ``measure_flops(workload, *, modules=None, custom_mapping=None)`` with layerscope's
op counts: the workload runs once, as written (gradients as the caller has them, its random draws and
state changes its own), under a dispatch mode of this front end that prices every aten op it runs,
forward and backward, by layerscope's formulas (its conventions: a bias add or an activation is
arithmetic too, where torch's FlopCounterMode, which torchscan uses, counts contractions only). An op
with no formula makes the total partial, with one diagnostic per op; an op that does no arithmetic (a
view, a copy, a creation) is listed in ``ignored_operators``. ``by_module`` has the modules given in
``modules`` (their class name, then their submodules' paths), each the FLOPs of the forward ops that
ran inside its calls, all calls added up; modules the workload runs but ``modules`` does not name are
not seen (layerscope hooks only modules it is given, never every module of the process), and backward
ops count in the total only. ``custom_mapping`` takes FlopCounterMode's formulas (``f(*input_shapes,
out_shape=..., **kwargs) -> flops``) per op packet; a formula's error is the caller's to see.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ...capture import hooks
from ...capture.counter import OpCounter
from .report import Diagnostic, FlopReport, metric_result

__all__ = ["FlopReport", "measure_flops"]

METHOD = "layerscope"


class Op:
    """One op as flop_report reads it (the fields of layerscope's OpEvent it uses)."""

    __slots__ = ("op", "status", "flops")

    def __init__(self, op: str, status: str, flops: int) -> None:
        self.op, self.status, self.flops = op, status, flops


class _Tally:
    """The ops of one workload and the FLOPs of the forward ops run inside each tracked module's calls."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.open: list[str] = []             # the names of the module calls running, outermost first
        self.by_module: Counter[str] = Counter()

    def on_op(self, name: str, status: str, macs: int, flops: int) -> None:
        self.ops.append(Op(name, status, flops))
        for m in set(self.open):              # a module called inside itself counts the op once
            self.by_module[m] += flops


def _track(counter: _Tally, modules: list[nn.Module]) -> list:
    """Hooks that keep ``counter.open`` the module calls running in this thread (each module named as
    FlopCounterMode names it: its class, then its submodules' paths)."""
    owner = threading.get_ident()
    handles = []
    seen: set[int] = set()
    for root in modules:
        for path, m in root.named_modules():
            if id(m) in seen or isinstance(m, torch.jit.ScriptModule):
                continue
            seen.add(id(m))
            name = ".".join(filter(None, (type(root).__name__, path)))

            def pre(mod, args, name=name):
                if threading.get_ident() == owner:
                    counter.open.append(name)

            def post(mod, args, out, name=name):
                if threading.get_ident() == owner and counter.open and counter.open[-1] == name:
                    counter.open.pop()

            handles.append(hooks.forward_pre_hook(m, pre))
            handles.append(hooks.forward_hook(m, post, always_call=True))
    return handles


def _why_free(name: str) -> str:
    """Why an op that ran has no FLOPs: from its schema, a view (its result aliases an input), a creation
    (no tensor argument) or data movement (torchscan's three reasons)."""
    ns, _, op = name.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        schema = getattr(packet, packet.overloads()[0])._schema
    except (AttributeError, RuntimeError, IndexError):
        return "No arithmetic: layerscope's formula for it gives 0 FLOPs."
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return "Metadata-only tensor view."
    made = ("new_", "empty", "full", "zeros", "ones", "arange", "rand", "scalar_tensor")
    if op.endswith("_like") or op.startswith(made) or not any("Tensor" in str(a.type) for a in schema.arguments):
        return "Tensor allocation and workload setup are not model arithmetic."
    return "Data movement is excluded from FLOPs."


def _custom(mapping: Mapping[Any, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The formulas by op name ("aten.sin"); keys must be op packets (``torch.ops.aten.sin``)."""
    out = {}
    for op, formula in mapping.items():
        if getattr(op, "_overloadpacket", op) is not op:
            raise TypeError("custom_mapping keys must be operator packets such as torch.ops.aten.sin, "
                            "not overloads such as torch.ops.aten.sin.default.")
        name = getattr(op, "_qualified_op_name", None)
        if not isinstance(name, str) or not callable(formula):
            raise TypeError(f"custom_mapping maps an operator packet (torch.ops.aten.sin) to a formula, got "
                            f"{op!r}: {type(formula).__name__}")
        out[name.replace("::", ".")] = formula
    return out


def flop_report(ops, by_module: Mapping[str, int], scope: str, custom: frozenset[str] = frozenset()) -> FlopReport:
    """A FlopReport of ops (each with ``op``, ``status`` and ``flops``)."""
    by_operator: Counter[str] = Counter()
    free: Counter[str] = Counter()
    uncounted: Counter[str] = Counter()
    for e in ops:
        if e.status == "uncounted":
            uncounted[e.op] += 1
        elif (e.status == "free" or e.flops == 0) and e.op not in custom:
            free[e.op] += 1
        else:
            by_operator[e.op] += e.flops
    for op in list(free):
        if op in by_operator:          # some calls did arithmetic, others none: it is counted
            del free[op]
    diagnostics: list[Diagnostic] = [
        dict(code="uncounted_operator", severity="warning", metric="flops", operator=op,
             message=f"{op} was observed {n} time(s), but no FLOP formula is registered.")
        for op, n in sorted(uncounted.items())]
    known = int(sum(by_operator.values()))
    total = (metric_result(status="partial", known_value=known, unit="FLOPs", scope=scope, method=METHOD)
             if diagnostics else metric_result(status="complete", value=known, unit="FLOPs", scope=scope,
                                               method=METHOD))
    return dict(
        schema_version=1,
        context=dict(torch_version=torch.__version__, method=METHOD),
        total=total,
        by_module=dict(sorted((k, int(v)) for k, v in by_module.items())),
        by_operator=dict(sorted(by_operator.items())),
        ignored_operators={op: dict(calls=n, reason=_why_free(op)) for op, n in sorted(free.items())},
        diagnostics=diagnostics)


def measure_flops(workload: Callable[[], Any], *, modules: nn.Module | list[nn.Module] | None = None,
                  custom_mapping: Mapping[Any, Callable[..., int | float]] | None = None) -> FlopReport:
    """The FLOPs of one call of ``workload`` (a function of no arguments), op by op, by layerscope's
    formulas; the workload runs as written and its own exception propagates unchanged."""
    custom = _custom(custom_mapping or {})
    tracked = [] if modules is None else [modules] if isinstance(modules, nn.Module) else list(modules)
    if any(not isinstance(m, nn.Module) for m in tracked):
        raise TypeError("modules must be a torch.nn.Module or a list of them.")
    tally = _Tally()
    handles = _track(tally, tracked)
    try:
        with OpCounter(tally.on_op, custom):
            workload()
    finally:
        hooks.remove_all(handles)
    return flop_report(tally.ops, dict(tally.by_module), "workload", frozenset(custom))
