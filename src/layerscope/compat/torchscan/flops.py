"""torchscan 0.2's ``measure_flops(workload, *, modules=None, custom_mapping=None)`` with layerscope's
op counts: the workload runs once under layerscope's op recorder; every aten op it ran is counted by
layerscope's formulas (its conventions: a bias add or an activation is arithmetic too, where torch's
FlopCounterMode, which torchscan uses, counts contractions only). An op with no formula makes the total
partial, with one diagnostic per op; an op that does no arithmetic (a view, a copy, a creation) is
listed in ``ignored_operators``. ``by_module`` has the modules given in ``modules`` (their class name,
then their submodules' paths), inclusive of their children, as FlopCounterMode names them; modules the
workload runs but ``modules`` does not name are not seen (layerscope hooks only the modules it is
given, never every module of the process). ``custom_mapping`` takes FlopCounterMode's formulas
(``f(*input_shapes, out_shape=..., **kwargs) -> flops``) per op packet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import torch
from torch import nn

from .report import Diagnostic, MetricResult, metric_result

__all__ = ["FlopReport", "measure_flops"]

METHOD = "layerscope"


class IgnoredOperator(TypedDict):
    calls: int
    reason: str


class FlopReport(TypedDict):
    schema_version: int
    context: dict[str, str]
    total: MetricResult
    by_module: dict[str, int]
    by_operator: dict[str, int]
    ignored_operators: dict[str, IgnoredOperator]
    diagnostics: list[Diagnostic]


class WorkloadFailed(Exception):
    """The workload raised: ``.error`` is its exception, re-raised unchanged by the caller."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Workload(nn.Module):
    def __init__(self, workload: Callable[[], Any], modules: list[nn.Module]) -> None:
        super().__init__()
        self.workload = workload
        self.tracked = nn.ModuleList(modules)

    def forward(self, _unused):
        try:
            return self.workload()
        except BaseException as e:    # the workload's own error, handed back as it was raised
            raise WorkloadFailed(e) from None


def _shapes(x):
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    if isinstance(x, (list, tuple)):
        return type(x)(_shapes(v) for v in x)
    return x


def _registry(mapping: Mapping[Any, Callable[..., int | float]]):
    """layerscope's default cost table with FlopCounterMode-style formulas put over the ops named."""
    from ...costs.registry import OpCost, default_registry
    reg = default_registry().copy("torchscan custom_mapping")
    for packet, formula in mapping.items():
        def cost(call, formula=formula):
            with torch._C._DisableTorchDispatch():      # a formula's own tensor ops are not the workload's
                flops = formula(*_shapes(call.args), out_shape=_shapes(call.out),
                                **{k: _shapes(v) for k, v in call.kwargs.items()})
            return OpCost(flops=int(flops))
        reg.override(packet, cost)
    return reg


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
    if (op.endswith("_like") or op.startswith(("new_", "empty", "full", "zeros", "ones", "arange", "rand", "scalar_tensor"))
            or not any("Tensor" in str(a.type) for a in schema.arguments)):
        return "Tensor allocation and workload setup are not model arithmetic."
    return "Data movement is excluded from FLOPs."


def check_mapping(mapping: Mapping[Any, Any]) -> None:
    if any(getattr(op, "_overloadpacket", op) is not op for op in mapping):
        raise TypeError("custom_mapping keys must be operator packets such as torch.ops.aten.sin, "
                        "not overloads such as torch.ops.aten.sin.default.")


def flop_report(ops, names: Mapping[int, str] | None, inclusive: Mapping[int, int] | None,
                scope: str, custom: frozenset[str] = frozenset()) -> FlopReport:
    """A FlopReport of a trace's forward ops; ``names``: layer index -> by_module name, with ``inclusive``
    its flops (the layer's and its children's)."""
    by_operator: Counter[str] = Counter()
    free: Counter[str] = Counter()
    uncounted: Counter[str] = Counter()
    for e in ops:
        if e.status == "uncounted":
            uncounted[e.op] += 1
        elif (e.status == "free" or e.costs.flops == 0) and e.op not in custom:
            free[e.op] += 1
        else:
            by_operator[e.op] += e.costs.flops
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
        by_module=dict(sorted((names[i], int(inclusive[i])) for i in names)) if names else {},
        by_operator=dict(sorted(by_operator.items())),
        ignored_operators={op: dict(calls=n, reason=_why_free(op)) for op, n in sorted(free.items())},
        diagnostics=diagnostics)


def inclusive_flops(trace) -> dict[int, int]:
    """Each layer's forward FLOPs with its children's (every op counted once, in the layer it ran in
    and in each layer above)."""
    own: Counter[int] = Counter()
    for e in trace.ops:
        if e.phase == "forward":
            own[e.layer] += e.costs.flops
    total = {r.index: own[r.index] for r in trace.layers}
    for r in sorted(trace.layers, key=lambda r: -r.depth):
        if r.parent is not None:
            total[r.parent] += total[r.index]
    return total


def measure_flops(workload: Callable[[], Any], *, modules: nn.Module | list[nn.Module] | None = None,
                  custom_mapping: Mapping[Any, Callable[..., int | float]] | None = None) -> FlopReport:
    """The FLOPs of one call of ``workload`` (a function of no arguments), op by op, by layerscope's
    formulas; the workload's own exception propagates unchanged."""
    from ...api import analyze
    mapping = dict(custom_mapping or {})
    check_mapping(mapping)
    tracked = [] if modules is None else [modules] if isinstance(modules, nn.Module) else list(modules)
    wrapper = _Workload(workload, tracked)
    extra = {"costs": _registry(mapping)} if mapping else {}
    try:
        rep = analyze(wrapper, torch.zeros(()), mode="same", **extra)
    except Exception as e:
        cause = e
        while cause is not None and not isinstance(cause, WorkloadFailed):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause.error from None
        raise
    trace = rep.trace
    inclusive = inclusive_flops(trace)
    names: dict[int, str] = {}
    for r in trace.layers:
        parts = r.path.split(".")
        if len(parts) >= 2 and parts[0] == "tracked":       # tracked.<i>[.sub...]
            root = type(tracked[int(parts[1])]).__name__
            names[r.index] = ".".join([root, *parts[2:]])
    custom = frozenset(getattr(op, "_qualified_op_name", str(op)).replace("::", ".") for op in mapping)
    return flop_report([e for e in trace.ops if e.phase == "forward"], names, inclusive, "workload", custom)
