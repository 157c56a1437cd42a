"""torchscan 0.2's report contract: ``AnalysisReport`` (a versioned, JSON-serializable dict), its
``LayerReport`` per module call, ``MetricResult`` per measurement and ``Diagnostic`` per gap.

A metric is "complete" (``value`` is the whole count), "partial" (``value`` is None and ``known_value``
a lower bound: something ran that has no formula) or "unavailable" (both None). This is layerscope's
own rule for uncounted ops (never a silent zero) in torchscan's words.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

__all__ = ["AnalysisReport", "Diagnostic", "IncompleteAnalysisError", "LayerReport", "MetricResult",
           "metric_result"]

MetricStatus = Literal["complete", "partial", "unavailable"]


class MetricResult(TypedDict):
    status: MetricStatus
    value: float | None
    known_value: float | None
    unit: str
    scope: str
    method: str


class Diagnostic(TypedDict):
    code: str
    severity: Literal["warning", "error"]
    metric: str
    message: str
    path: NotRequired[str]
    operator: NotRequired[str]


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


class LayerReport(TypedDict):
    path: str
    call_index: int
    name: str
    depth: int
    type: str
    input: dict[str, Any]
    output: dict[str, Any]
    parameters: dict[str, int | bool]
    buffers: dict[str, int | bool]
    metrics: dict[str, MetricResult]


class AnalysisReport(TypedDict):
    schema_version: int
    context: dict[str, Any]
    inputs: dict[str, Any]
    layers: list[LayerReport]
    operator_flops: FlopReport
    totals: dict[str, MetricResult]
    diagnostics: list[Diagnostic]


def metric_result(*, status: MetricStatus, unit: str, scope: str, method: str, value: float | None = None,
                  known_value: float | None = None) -> MetricResult:
    """One measurement; a complete one needs its value (its known value is the value), a partial one its
    known lower bound (its value is None), an unavailable one has neither."""
    if status == "complete":
        if value is None:
            raise ValueError("A complete metric requires a value.")
        known_value = value
    elif status == "partial":
        if known_value is None:
            raise ValueError("A partial metric requires a known_value lower bound.")
        value = None
    elif status == "unavailable":
        value = known_value = None
    else:
        raise ValueError("status must be 'complete', 'partial', or 'unavailable'.")
    return dict(status=status, value=value, known_value=known_value, unit=unit, scope=scope, method=method)


class IncompleteAnalysisError(RuntimeError):
    """``strict=True`` and a total is not complete or something was diagnosed; ``.report`` holds it all."""

    def __init__(self, report: AnalysisReport) -> None:
        self.report = report
        names = {k for k, r in report["totals"].items() if r["status"] != "complete"}
        names |= {d["metric"] for d in report["diagnostics"]}
        super().__init__(f"Analysis is incomplete for: {', '.join(sorted(names)) or 'unknown metrics'}.")
