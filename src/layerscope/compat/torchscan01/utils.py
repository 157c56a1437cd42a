"""torchscan 0.1's ``torchscan.utils``: the name helpers of its printed table, its unit scaling,
``format_info`` (drawn by ``render.torchscan``) and ``aggregate_info``."""

from __future__ import annotations

from typing import Any

from ...errors import InputError
from ...render.torchscan import Row, Totals, summary_text
from ..torchscan.utils import format_name, unit_scale, wrap_string  # noqa: F401 (0.1's and 0.2's are the same)

__all__ = ["aggregate_info", "format_info", "format_name", "unit_scale", "wrap_string"]


def aggregate_info(info: dict[str, Any], max_depth: int) -> dict[str, Any]:
    """Rows deeper than ``max_depth`` folded into their ancestor at ``max_depth`` (torchscan's)."""
    if not any(layer["depth"] == max_depth for layer in info["layers"]):
        raise InputError("The `max_depth` argument cannot be higher than module depth.")
    keys = ("flops", "macs", "dmas", "grad_params", "nograd_params", "param_size", "num_buffers", "buffer_size")
    rows = info["layers"]
    for i, layer in enumerate(rows):
        if layer["depth"] == max_depth and not layer["is_leaf"]:
            for child in rows[i + 1:]:
                if child["depth"] <= max_depth:
                    break
                for k in keys:       # the container's own ops and params stay (layerscope counts them)
                    layer[k] += child[k]
                layer["rf"], layer["s"], layer["p"] = child["rf"], child["s"], child["p"]
    info["layers"] = [layer for layer in rows if layer["depth"] <= max_depth]
    return info


def format_info(module_info: dict[str, Any], wrap_mode: str = "mid", receptive_field: bool = False,
                effective_rf_stats: bool = False) -> str:
    """torchscan's printed summary of a ``crawl_module`` dict (drawn by ``render.torchscan``)."""
    layers = module_info["layers"]
    rows = [Row(name=layer["name"], depth=layer["depth"], type=layer["type"], output_shape=layer["output_shape"],
                count=layer["grad_params"] + layer["nograd_params"] + layer["num_buffers"],
                rf=layer["rf"], stride=layer["s"], padding=layer["p"]) for layer in layers]
    o, over = module_info["overall"], module_info["overheads"]
    totals = Totals(trainable=o["grad_params"], frozen=o["nograd_params"],
                    model_mb=(o["param_size"] + o["buffer_size"]) / 1024**2,
                    overhead_mb=over["framework"]["fwd"] + over["cuda"]["fwd"],
                    flops=sum(layer["flops"] for layer in layers), macs=sum(layer["macs"] for layer in layers),
                    dmas=sum(layer["dmas"] for layer in layers))
    return summary_text(rows, totals, wrap_mode, receptive_field, effective_rf_stats)
