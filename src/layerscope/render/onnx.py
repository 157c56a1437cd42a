"""An ONNX graph as ``Report.graph`` holds it, with its views: the per-node table (from
layerscope.reports.onnx's columns), CSV and JSON."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..formats.onnx import NodeRecord, OnnxGraph
from ..reports.onnx import nodes_table
from .csv import render_csv
from .text import render_text

__all__ = ["OnnxNodes", "node_dict"]


@dataclass(frozen=True)
class OnnxNodes(OnnxGraph):
    """The records formats/onnx.py made, with their views (formats/ turns graphs into records and
    renders nothing, and reports/ sits below render/, so the views live here)."""

    @classmethod
    def of(cls, graph: OnnxGraph) -> "OnnxNodes":
        return graph if isinstance(graph, cls) else cls(**{f.name: getattr(graph, f.name)
                                                           for f in dataclasses.fields(graph)})

    def table(self, sort: str = "order", top: int | None = None) -> str:
        """The per-node table (bytes read, written and moved, MACs, FLOPs, params) with the model
        total; ``sort``: order, read, write, bytes, macs, flops or params; ``top``: first rows only."""
        return render_text(nodes_table(self, sort, top), False, None)

    def print(self, sort: str = "order", top: int | None = None, file=None) -> None:
        """The per-node table on a terminal, fitted to its width (low-priority columns drop and node
        names lose their middle before any number is cut); plain text to a file or a pipe."""
        from .views import print_table
        print_table(nodes_table(self, sort, top), file, False)

    def to_csv(self, sort: str = "order", top: int | None = None) -> str:
        return render_csv(nodes_table(self, sort, top))

    def to_dict(self) -> dict:
        return {"opset": self.opset, "histogram": dict(self.histogram),
                "peak_activation_bytes": self.peak_activation_bytes, "unknown_shapes": list(self.unknown_shapes),
                "symbolic_dims": list(self.symbolic_dims), "nodes": [node_dict(n) for n in self.nodes]}


def node_dict(n: NodeRecord) -> dict[str, Any]:
    def io(vals):
        return [{"name": name, "shape": list(s) if s is not None else None, "dtype": dt} for name, s, dt in vals]
    return {"index": n.index, "name": n.name, "op_type": n.op_type, "domain": n.domain, "module": n.module,
            "inputs": io(n.inputs), "outputs": io(n.outputs),
            "attributes": {k: v for k, v in n.attributes.items() if isinstance(v, (int, float, str, list))},
            "params": n.params, "param_bytes": n.param_bytes, "macs": n.costs.macs, "flops": n.costs.flops,
            "bytes_read": n.costs.bytes_read, "bytes_written": n.costs.bytes_written, "status": n.status}
