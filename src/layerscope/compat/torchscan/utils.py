"""torchscan 0.2's ``utils``: the printed summary of a report (``format_info``), a depth-limited view
(``aggregate_info``) and the formatting helpers torchscan exports (``format_name``, ``wrap_string``,
``unit_scale``, ``format_s``, ``format_line_str``). The layout is torchscan 0.2's; a partial total
prints as "known <lower bound>", an unavailable one as "unavailable".
"""

from __future__ import annotations

import copy
from typing import Any

from ...render.torchscan import tree_name, wrap_name
from ...render.units import torchscan_scale
from .report import AnalysisReport, LayerReport, MetricResult

__all__ = ["aggregate_info", "format_info", "format_line_str", "format_name", "format_s", "unit_scale",
           "wrap_string"]

HEADERS = ("Layer", "Type", "Output Shape", "Param #", "Trainable", "Receptive field", "Effective stride",
           "Effective padding")
MAX_WIDTHS = (27, 20, 25, 15, 9, 15, 16, 17)
MARGIN = 4


def format_name(name: str, depth: int = 0) -> str:
    """A layer's name with its tree prefix."""
    return tree_name(name, depth)


def wrap_string(s: str, max_len: int, delimiter: str = ".", wrap: str = "[...]", mode: str | None = "end") -> str:
    """``s`` cut to ``max_len``: at its end ("end") or before its last ``delimiter`` part ("mid"); as it
    is when it fits or ``mode`` is None (a ValueError for any other mode)."""
    return wrap_name(s, max_len, mode, delimiter, wrap)


def unit_scale(val: float) -> tuple[float, str]:
    """``val`` in T, G, M or k, or as it is."""
    return torchscan_scale(val)


def format_s(f_string: str, min_w: int | None = None, max_w: int | None = None) -> str:
    """Padded to ``min_w``, cut at ``max_w``."""
    if isinstance(min_w, int):
        f_string = f_string.ljust(min_w)
    if isinstance(max_w, int):
        f_string = f_string[:max_w]
    return f_string


def _shape(meta: dict[str, Any]) -> str:
    kind = meta.get("kind")
    if kind == "tensor":
        return str(tuple(meta["shape"]))
    if kind in ("tuple", "list"):
        inner = ", ".join(_shape(i) for i in meta["items"])
        return f"({inner})" if kind == "tuple" else f"[{inner}]"
    if kind == "mapping":
        return "{" + ", ".join(_shape(i["value"]) for i in meta["items"]) + "}"
    return str(kind)


def _value(result: MetricResult | None):
    if result is None:
        return None
    return result["value"] if result["status"] == "complete" else result["known_value"]


def format_line_str(layer: LayerReport, col_w: list[int | None] | None = None, wrap_mode: str = "mid",
                    receptive_field: bool = False, effective_rf_stats: bool = False) -> list[str]:
    """One layer's cells."""
    w = list(col_w) if col_w is not None else [None] * len(HEADERS)
    name_len = w[0] + 3 if isinstance(w[0], int) else 100
    params = int(layer["parameters"]["trainable"]) + int(layer["parameters"]["frozen"])
    cells = [wrap_string(format_name(layer["name"], layer["depth"]), name_len, mode=wrap_mode),
             layer["type"],
             wrap_string(_shape(layer["output"]), w[2] if isinstance(w[2], int) else 100, mode="end"),
             f"{params + int(layer['buffers']['elements']):,}",
             "-" if params == 0 else str(layer["parameters"]["trainable"] > 0)]
    if receptive_field:
        names = ("receptive_field", "effective_stride", "effective_padding")[:3 if effective_rf_stats else 1]
        for name in names:
            v = _value(layer["metrics"].get(name))
            cells.append("?" if v is None else f"{v:.0f}")
    return [format_s(c, w[i], w[i]) for i, c in enumerate(cells)]


def _total_line(name: str, result: MetricResult) -> str:
    v = _value(result)
    if v is None:
        return f"{name}: unavailable"
    scaled, prefix = unit_scale(float(v))
    return f"{name}: {'' if result['status'] == 'complete' else 'known '}{scaled:.2f} {prefix}{result['unit']}"


def format_info(module_info: AnalysisReport, wrap_mode: str = "mid", receptive_field: bool = False,
                effective_rf_stats: bool = False) -> str:
    """The report as torchscan 0.2 prints it: widths measured over every column, shown or not."""
    widths = [len(h) for h in HEADERS]
    for layer in module_info["layers"]:
        widths = [max(w, len(c)) for w, c in zip(widths, format_line_str(layer, None, "mid", True, True))]
    widths = [min(w, cap) for w, cap in zip(widths, MAX_WIDTHS)]
    shown = 5 if not receptive_field else 6 if not effective_rf_stats else 8
    widths, headers = widths[:shown], HEADERS[:shown]
    length = sum(widths) + (shown - 1) * MARGIN
    sep = " " * MARGIN
    t = module_info["totals"]
    model_mb = (float(t["parameter_bytes"]["value"] or 0) + float(t["buffer_bytes"]["value"] or 0)) / 1024**2
    lines = ["_" * length, sep.join(h.ljust(w) for h, w in zip(headers, widths)), "=" * length]
    lines += [sep.join(format_line_str(layer, widths, wrap_mode, receptive_field, effective_rf_stats))
              for layer in module_info["layers"]]
    lines += ["=" * length,
              f"Trainable params: {int(t['trainable_parameters']['value'] or 0):,}",
              f"Non-trainable params: {int(t['frozen_parameters']['value'] or 0):,}",
              f"Total params: {int(t['parameters']['value'] or 0):,}",
              "-" * length,
              f"Model size (params + buffers): {model_mb:.2f} Mb",
              "-" * length,
              _total_line("Module-formula forward FLOPs", t["module_flops"]),
              _total_line("Multiply-Accumulations", t["macs"]),
              _total_line("Direct memory accesses", t["dmas"])]
    if "operator_flops" in t:
        lines.append(_total_line("Operator forward FLOPs", t["operator_flops"]))
    if module_info["diagnostics"]:
        lines.append(f"Diagnostics: {len(module_info['diagnostics'])} (inspect report['diagnostics'])")
    lines.append("_" * length)
    return "\n".join(lines)


def aggregate_info(info: AnalysisReport, max_depth: int) -> AnalysisReport:
    """A copy of the report with the layers down to ``max_depth`` (the totals are the whole model's)."""
    if max_depth < 0:
        raise ValueError("max_depth must be non-negative.")
    if info["layers"] and not any(layer["depth"] == max_depth for layer in info["layers"]):
        raise ValueError("The `max_depth` argument cannot be higher than module depth.")
    out = copy.deepcopy(info)
    out["layers"] = [layer for layer in out["layers"] if layer["depth"] <= max_depth]
    return out
