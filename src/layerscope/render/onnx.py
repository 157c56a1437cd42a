"""The ONNX graph a Report holds (``OnnxNodes``) lives in ``layerscope.reports.onnx`` (complete, with
its views); re-exported here for code that imported it from this module."""

from __future__ import annotations

from ..reports.onnx import OnnxNodes, node_dict

__all__ = ["OnnxNodes", "node_dict"]
