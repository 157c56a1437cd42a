"""The JSON of an ONNX graph's nodes (their table comes from layerscope.reports.onnx's columns)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..formats.onnx import NodeRecord

__all__ = ["node_dict"]


def node_dict(n: "NodeRecord") -> dict[str, Any]:
    def io(vals):
        return [{"name": name, "shape": list(s) if s is not None else None, "dtype": dt} for name, s, dt in vals]
    return {"index": n.index, "name": n.name, "op_type": n.op_type, "domain": n.domain, "module": n.module,
            "inputs": io(n.inputs), "outputs": io(n.outputs),
            "attributes": {k: v for k, v in n.attributes.items() if isinstance(v, (int, float, str, list))},
            "params": n.params, "param_bytes": n.param_bytes, "macs": n.costs.macs, "flops": n.costs.flops,
            "bytes_read": n.costs.bytes_read, "bytes_written": n.costs.bytes_written, "status": n.status}
