"""The per-node table of an ONNX model: the seed's bandwidth table, sortable, with the model total."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .units import iec, si

if TYPE_CHECKING:
    from ..formats.onnx import NodeRecord, OnnxGraph

__all__ = ["SORT_KEYS", "sorted_nodes", "node_rows", "render_nodes_text", "node_dict", "render_nodes_csv"]

SORT_KEYS = {
    "order": None,
    "read": lambda n: n.costs.bytes_read,
    "write": lambda n: n.costs.bytes_written,
    "bytes": lambda n: n.costs.bytes_moved,
    "macs": lambda n: n.costs.macs,
    "flops": lambda n: n.costs.flops,
    "params": lambda n: n.params,
}


def sorted_nodes(graph: "OnnxGraph", sort: str = "order", top: int | None = None) -> list["NodeRecord"]:
    from ..errors import InputError
    if sort not in SORT_KEYS:
        raise InputError(f"sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
    key = SORT_KEYS[sort]
    nodes = list(graph.nodes) if key is None else sorted(graph.nodes, key=key, reverse=True)
    return nodes[:top] if top else nodes


def _shape(s) -> str:
    return "?" if s is None else "[" + ", ".join(str(d) for d in s) + "]"


def node_rows(graph: "OnnxGraph", sort: str = "order", top: int | None = None):
    header = ["#", "Node", "Op", "Module", "Output shape", "Params", "MACs", "FLOPs", "Read", "Written",
              "Total", "Status"]
    body = []
    for n in sorted_nodes(graph, sort, top):
        body.append([str(n.index), n.name, n.op_type, "--" if n.module is None else (n.module or "(root)"),
                     _shape(n.outputs[0][1]) if n.outputs else "--", f"{n.params:,}" if n.params else "--",
                     si(n.costs.macs) if n.costs.macs else "--", si(n.costs.flops) if n.costs.flops else "--",
                     iec(n.costs.bytes_read), iec(n.costs.bytes_written), iec(n.costs.bytes_moved),
                     n.status])
    return header, body


def _totals(graph: "OnnxGraph") -> list[tuple[str, str]]:
    read = sum(n.costs.bytes_read for n in graph.nodes)
    written = sum(n.costs.bytes_written for n in graph.nodes)
    macs = sum(n.costs.macs for n in graph.nodes)
    flops = sum(n.costs.flops for n in graph.nodes)
    lines = [("Nodes", f"{len(graph.nodes)} (opset {graph.opset}): " +
              ", ".join(f"{k} {v}" for k, v in graph.histogram.items())),
             ("Model total", f"MACs {si(macs)}, FLOPs {si(flops)}, read {iec(read)}, written {iec(written)}, "
                             f"moved {iec(read + written)}")]
    peak = graph.peak_activation_bytes
    lines.append(("Peak activations", iec(peak) if peak is not None else "unknown (a shape is not known)"))
    if graph.unknown_shapes:
        lines.append(("Unknown shapes", f"{len(graph.unknown_shapes)} values, e.g. " +
                      ", ".join(graph.unknown_shapes[:5])))
    if graph.symbolic_dims:
        lines.append(("Symbolic dims", ", ".join(graph.symbolic_dims) + " (give values with input_shapes / --input)"))
    return lines


def render_nodes_text(graph: "OnnxGraph", sort: str = "order", top: int | None = None) -> str:
    from .text import text_table
    header, body = node_rows(graph, sort, top)
    return text_table(header, body, _totals(graph))


def node_dict(n: "NodeRecord") -> dict[str, Any]:
    def io(vals):
        return [{"name": name, "shape": list(s) if s is not None else None, "dtype": dt} for name, s, dt in vals]
    return {"index": n.index, "name": n.name, "op_type": n.op_type, "domain": n.domain, "module": n.module,
            "inputs": io(n.inputs), "outputs": io(n.outputs),
            "attributes": {k: v for k, v in n.attributes.items() if isinstance(v, (int, float, str, list))},
            "params": n.params, "param_bytes": n.param_bytes, "macs": n.costs.macs, "flops": n.costs.flops,
            "bytes_read": n.costs.bytes_read, "bytes_written": n.costs.bytes_written, "status": n.status}


_CSV = ("index", "name", "op_type", "module", "output_shape", "params", "macs", "flops", "bytes_read",
        "bytes_written", "status")


def render_nodes_csv(graph: "OnnxGraph", sort: str = "order", top: int | None = None) -> str:
    from .csv import csv_text
    rows = ({"index": n.index, "name": n.name, "op_type": n.op_type, "module": n.module or "",
             "output_shape": _shape(n.outputs[0][1]) if n.outputs else "", "params": n.params,
             "macs": n.costs.macs, "flops": n.costs.flops, "bytes_read": n.costs.bytes_read,
             "bytes_written": n.costs.bytes_written, "status": n.status} for n in sorted_nodes(graph, sort, top))
    return csv_text(_CSV, rows)
