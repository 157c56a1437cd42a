"""Exported models (ONNX, TorchScript) as Traces: the same records, costs and renderers."""
