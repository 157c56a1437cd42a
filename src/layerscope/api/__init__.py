"""Thin public entry points, one job per private module: analyze() and activations() (_analyze.py,
with the routing of exported, compiled and scripted models), the graph entry points (_exported.py,
_onnx.py), memory() (_memory.py), max_batch_size() (_batch.py), profile() (_profile.py) and
partition() (_partition.py). Each builds its options object once (layerscope.options) and passes it
down. The modules are private (httpx's pattern), so that ``layerscope.api.memory`` is the function
and no module hides behind a function of the same name."""

from ._analyze import activations, analyze
from ._batch import BatchFit, max_batch_size
from ._exported import analyze_exported, analyze_torchscript
from ._memory import memory
from ._onnx import analyze_onnx, onnx_tile
from ._parallel import parallel
from ._partition import partition
from ._profile import profile

__all__ = ["BatchFit", "activations", "analyze", "analyze_exported", "analyze_onnx", "analyze_torchscript",
           "max_batch_size", "memory", "onnx_tile", "parallel", "partition", "profile"]
