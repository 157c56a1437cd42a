"""torchscan 0.2's ``compare_reports``: what changed between two analysis reports.

Both reports must have the same schema version (1). Totals are compared metric by metric (every metric
named in either report); layers are matched by their identity, the module path and the call index (a
module called twice is two layers), and sorted by it: a layer call only in ``after`` is ``added``, only
in ``before`` ``removed``, in both with some metric that differs ``changed`` (with only the metrics
that differ). A numeric ``delta`` (after - before) is given only when both sides are complete; a
metric missing on one side, or unavailable on either, is ``unavailable``, else partial on either is
``partial``. Two results of one metric must measure the same thing (same unit, scope and method),
or a ``ValueError`` says which field differs. The result is plain JSON data, copied: the reports
passed in are never changed, and changing the result does not change them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TypedDict

from .report import AnalysisReport, LayerReport, MetricResult, MetricStatus

__all__ = ["ReportDiff", "compare_reports"]

_SCHEMA_VERSION = 1
_SAME_MEANING = ("unit", "scope", "method")   # fields two results of one metric must share


class MetricDiff(TypedDict):
    status: MetricStatus
    delta: float | None
    before: MetricResult | None
    after: MetricResult | None


class LayerSnapshot(TypedDict):
    path: str
    call_index: int
    metrics: dict[str, MetricResult]


class LayerDiff(TypedDict):
    path: str
    call_index: int
    metrics: dict[str, MetricDiff]


class LayerChanges(TypedDict):
    added: list[LayerSnapshot]
    removed: list[LayerSnapshot]
    changed: list[LayerDiff]


class ReportDiff(TypedDict):
    """What ``compare_reports`` returns (JSON-serializable)."""

    schema_version: int
    totals: dict[str, MetricDiff]
    layers: LayerChanges


def _status_of(before: MetricResult | None, after: MetricResult | None) -> MetricStatus:
    if before is None or after is None:
        return "unavailable"
    statuses = {before["status"], after["status"]}
    for weakest in ("unavailable", "partial"):
        if weakest in statuses:
            return weakest
    return "complete"


def _metric_diff(name: str, before: MetricResult | None, after: MetricResult | None) -> MetricDiff:
    if before is not None and after is not None:
        for field in _SAME_MEANING:
            if before.get(field) != after.get(field):
                raise ValueError(f"metric {name!r} has incompatible {field}")
    status = _status_of(before, after)
    delta = None
    if status == "complete":
        old, new = before["value"], after["value"]     # type: ignore[index]
        if old is None or new is None:
            raise ValueError(f"metric {name!r} is complete but has no value")
        delta = new - old
    return {"status": status, "delta": delta, "before": copy.deepcopy(before), "after": copy.deepcopy(after)}


def _metric_diffs(before: Mapping[str, MetricResult], after: Mapping[str, MetricResult],
                  only_changed: bool) -> dict[str, MetricDiff]:
    out: dict[str, MetricDiff] = {}
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if only_changed and old == new:
            continue
        out[name] = _metric_diff(name, old, new)
    return out


def _by_call(report: AnalysisReport, side: str) -> dict[tuple[str, int], LayerReport]:
    calls: dict[tuple[str, int], LayerReport] = {}
    for layer in report["layers"]:
        identity = (layer["path"], layer["call_index"])
        if identity in calls:
            raise ValueError(f"{side} contains duplicate layer call {identity!r}")
        calls[identity] = layer
    return calls


def _snapshot(layer: LayerReport) -> LayerSnapshot:
    return {"path": layer["path"], "call_index": layer["call_index"],
            "metrics": copy.deepcopy(layer["metrics"])}


def compare_reports(before: AnalysisReport, after: AnalysisReport) -> ReportDiff:
    """Differences of totals and of each layer call's metrics from ``before`` to ``after``.

    Raises ``ValueError`` when the schema versions differ or are not 1, a report lists one layer call
    twice, or a metric's unit, scope or method differs between the two."""
    old_version, new_version = before["schema_version"], after["schema_version"]
    if old_version != new_version:
        raise ValueError(f"schema versions differ: {old_version} != {new_version}")
    if old_version != _SCHEMA_VERSION:
        raise ValueError(f"unsupported schema version: {old_version}")

    old_calls, new_calls = _by_call(before, "before"), _by_call(after, "after")
    changed: list[LayerDiff] = []
    for identity in sorted(old_calls.keys() & new_calls.keys()):
        metrics = _metric_diffs(old_calls[identity]["metrics"], new_calls[identity]["metrics"], True)
        if metrics:
            changed.append({"path": identity[0], "call_index": identity[1], "metrics": metrics})
    return {
        "schema_version": old_version,
        "totals": _metric_diffs(before["totals"], after["totals"], False),
        "layers": {
            "added": [_snapshot(new_calls[i]) for i in sorted(new_calls.keys() - old_calls.keys())],
            "removed": [_snapshot(old_calls[i]) for i in sorted(old_calls.keys() - new_calls.keys())],
            "changed": changed,
        },
    }
