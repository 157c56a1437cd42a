"""Thin public entry points, one job per module: analyze() and activations() (analyze.py, with the
routing of exported, compiled and scripted models), the graph entry points (exported.py, onnx.py),
memory() (memory.py), max_batch_size() (batch.py), profile() (profile.py) and partition()
(partition.py). Each builds its options object once (layerscope.options) and passes it down.

The modules are named after the functions they hold; the package's attribute of each name is the
function (``layerscope.api.memory`` is ``memory()``): reach a module with ``importlib.import_module``."""

from .analyze import activations, analyze
from .batch import BatchFit, max_batch_size
from .exported import analyze_exported, analyze_torchscript
from .memory import memory
from .onnx import analyze_onnx, onnx_tile
from .partition import partition
from .profile import profile

__all__ = ["BatchFit", "activations", "analyze", "analyze_exported", "analyze_onnx", "analyze_torchscript",
           "max_batch_size", "memory", "onnx_tile", "partition", "profile"]
