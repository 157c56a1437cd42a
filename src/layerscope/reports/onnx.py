"""The per-node table of an ONNX model: its columns and footer (the seed's bandwidth table, sortable,
with the model total), and ``OnnxNodes``, the graph a Report holds (``report.graph``) with its views."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..formats.onnx import NodeRecord, OnnxGraph
from .base import rendered
from .table import Column, Fact, Table, flat_table

__all__ = ["SORT_KEYS", "NODE_COLUMNS", "sorted_nodes", "nodes_table", "onnx_notes", "OnnxNodes", "node_dict"]

SORT_KEYS = {
    "order": None,
    "read": lambda n: n.costs.bytes_read,
    "write": lambda n: n.costs.bytes_written,
    "bytes": lambda n: n.costs.bytes_moved,
    "macs": lambda n: n.costs.macs,
    "flops": lambda n: n.costs.flops,
    "params": lambda n: n.params,
}

NODE_COLUMNS: tuple[Column, ...] = (
    Column("index", "#", "index", lambda n, g: n.index),
    Column("op_type", "Op", "text", lambda n, g: n.op_type),
    Column("module", "Module", "text", lambda n, g: None if n.module is None else (n.module or "(root)"), drop=2),
    Column("output_shape", "Output shape", "shape",
           lambda n, g: (n.outputs[0][1],) if n.outputs and n.outputs[0][1] is not None else None, drop=1),
    Column("params", "Params", "params", lambda n, g: n.params, drop=1),
    Column("macs", "MACs", "count", lambda n, g: n.costs.macs),
    Column("flops", "FLOPs", "count", lambda n, g: n.costs.flops),
    Column("bytes_read", "Read", "bytes", lambda n, g: n.costs.bytes_read),
    Column("bytes_written", "Written", "bytes", lambda n, g: n.costs.bytes_written),
    Column("bytes_moved", "Total", "bytes", lambda n, g: n.costs.bytes_moved, drop=1),
    Column("status", "Status", "text", lambda n, g: n.status, drop=1),
)


def sorted_nodes(graph: OnnxGraph, sort: str = "order", top: int | None = None) -> list[NodeRecord]:
    if sort not in SORT_KEYS:
        raise InputError(f"sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
    key = SORT_KEYS[sort]
    nodes = list(graph.nodes) if key is None else sorted(graph.nodes, key=key, reverse=True)
    return nodes[:top] if top else nodes


def nodes_footer(graph: OnnxGraph) -> tuple[Fact, ...]:
    read = sum(n.costs.bytes_read for n in graph.nodes)
    written = sum(n.costs.bytes_written for n in graph.nodes)
    macs = sum(n.costs.macs for n in graph.nodes)
    flops = sum(n.costs.flops for n in graph.nodes)
    lines = [Fact("Nodes", f"{len(graph.nodes)} (opset {graph.opset}): " +
                  ", ".join(f"{k} {v}" for k, v in graph.histogram.items())),
             Fact("Model total", ("MACs ", (macs, "count"), ", FLOPs ", (flops, "count"), ", read ", (read, "bytes"),
                                  ", written ", (written, "bytes"), ", moved ", (read + written, "bytes")))]
    peak = graph.peak_activation_bytes
    lines.append(Fact("Peak activations", peak, "bytes") if peak is not None
                 else Fact("Peak activations", "unknown (a shape is not known)"))
    if graph.unknown_shapes:
        lines.append(Fact("Unknown shapes", f"{len(graph.unknown_shapes)} values, e.g. " +
                          ", ".join(graph.unknown_shapes[:5])))
    if graph.symbolic_dims:
        lines.append(Fact("Symbolic dims", ", ".join(graph.symbolic_dims) + " (give values with input_shapes / --input)"))
    return tuple(lines)


def nodes_table(graph: OnnxGraph, sort: str = "order", top: int | None = None) -> Table:
    return flat_table("onnx_nodes", "ONNX nodes", graph, sorted_nodes(graph, sort, top), NODE_COLUMNS,
                      name=lambda n: n.name, first_header="Node", footer=nodes_footer(graph))


def onnx_notes(options: dict) -> tuple[str, ...]:
    """What the summary of an ONNX file says about how its counts can differ from the PyTorch model's:
    initializers the exporter may have merged for being equal (formats.onnx: DEDUP_LIMIT), which the
    file shares between layers where the model has one parameter per module."""
    merged = options.get("merged_initializers")
    if not merged:
        return ()
    from ..formats.onnx import DEDUP_LIMIT
    name, reader = merged["example"]
    n = merged["initializers"]
    return (f"{merged['params']:,} of the shared params are {n} initializer{'s' if n != 1 else ''} of at most "
            f"{DEDUP_LIMIT:,} elements read by other layers than the one named ({name!r} by {reader!r}): "
            "torch.onnx's dynamo export merges initializers of equal values (e.g. norm weights still at "
            "their initial 1s), so the PyTorch model may hold them as separate parameters (more params, "
            "fewer shared than here)",)


@dataclass(frozen=True)
class OnnxNodes(OnnxGraph):
    """The records formats/onnx.py made (formats/ turns graphs into records and renders nothing),
    with their views: the per-node table, its CSV, and the dict the summary's JSON holds."""

    @classmethod
    def of(cls, graph: OnnxGraph) -> "OnnxNodes":
        return graph if isinstance(graph, cls) else cls(**{f.name: getattr(graph, f.name)
                                                           for f in dataclasses.fields(graph)})

    def table(self, sort: str = "order", top: int | None = None) -> str:
        """The per-node table (bytes read, written and moved, MACs, FLOPs, params) with the model
        total; ``sort``: order, read, write, bytes, macs, flops or params; ``top``: first rows only."""
        return rendered("text")(nodes_table(self, sort, top), False, None)

    def print(self, sort: str = "order", top: int | None = None, file=None) -> None:
        """The per-node table on a terminal, fitted to its width (low-priority columns drop and node
        names lose their middle before any number is cut); plain text to a file or a pipe."""
        rendered("print")(nodes_table(self, sort, top), file, False)

    def to_csv(self, sort: str = "order", top: int | None = None) -> str:
        return rendered("csv")(nodes_table(self, sort, top))

    def to_dict(self) -> dict:
        return {"opset": self.opset, "histogram": dict(self.histogram),
                "peak_activation_bytes": self.peak_activation_bytes, "unknown_shapes": list(self.unknown_shapes),
                "symbolic_dims": list(self.symbolic_dims), "nodes": [node_dict(n) for n in self.nodes]}


def node_dict(n: NodeRecord) -> dict[str, Any]:
    """One node as the summary's JSON holds it (docs/json.md: ``graph.nodes``)."""
    def io(vals):
        return [{"name": name, "shape": list(s) if s is not None else None, "dtype": dt} for name, s, dt in vals]
    return {"index": n.index, "name": n.name, "op_type": n.op_type, "domain": n.domain, "module": n.module,
            "inputs": io(n.inputs), "outputs": io(n.outputs),
            "attributes": {k: v for k, v in n.attributes.items() if isinstance(v, (int, float, str, list))},
            "params": n.params, "param_bytes": n.param_bytes, "macs": n.costs.macs, "flops": n.costs.flops,
            "bytes_read": n.costs.bytes_read, "bytes_written": n.costs.bytes_written, "status": n.status}
