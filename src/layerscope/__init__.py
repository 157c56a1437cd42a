"""layerscope: what is inside any PyTorch model, layer by layer, with numbers you can trust."""

import warnings as _warnings

with _warnings.catch_warnings():
    # torch warns while it is imported when numpy is not installed ("Failed to initialize NumPy: No module
    # named 'numpy'"); layerscope does not need numpy, so in a torch + layerscope install every command
    # would print a warning the user did not cause. Only that message is ignored, only during this import
    # (where torch was imported before layerscope, it has already warned and nothing changes).
    _warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch as _torch  # noqa: F401

from .api import (BatchFit, activations, analyze, analyze_exported, analyze_onnx, analyze_torchscript,
                  max_batch_size, memory, onnx_tile, partition, profile)
from .costs import CostOptions
from .options import AnalyzeOptions, MemoryOptions, ProfileOptions
from .errors import ForwardError, InputError, LayerscopeError, PlanError, RegistryError, SpecError
from .pipeline import SplitUnits, Stage, Unit
from .render.views import StagePlan
from .memory_report import CallMemory, MemoryLayer, MemoryReport, StepMemory
from .latency_report import LatencyLayer, LatencyReport
from .reports.latency import LatencyTotals
from .reports.memory import MemoryTotals
from .profiler import Profiler
from .analyses.roofline import Roofline, measure_roofline
from .report import Report
from .compare import Comparison, compare
from .specs import presets
from . import compat   # front ends with other tools' names (torchinfo, torchscan, deepspeed, modelsummary)
from .compat.torchinfo import layerscope_summary as summary
from .trace import (Costs, Coverage, LayerRecord, OpEvent, ParamSpec, ReceptiveField, TensorSpec, Totals,
                    Trace)

__version__ = "0.1.0"

__all__ = [
    "analyze", "summary", "activations", "memory", "max_batch_size", "BatchFit", "MemoryReport",
    "MemoryLayer", "StepMemory", "CallMemory", "Report", "Trace", "LayerRecord", "OpEvent", "Costs",
    "Totals", "Coverage", "TensorSpec", "ParamSpec", "ReceptiveField", "CostOptions",
    "LayerscopeError", "InputError", "ForwardError", "SpecError", "RegistryError", "__version__",
    "partition", "StagePlan", "Stage", "Unit", "SplitUnits", "PlanError",
    "analyze_exported", "analyze_onnx", "analyze_torchscript", "onnx_tile", "profile", "LatencyReport", "LatencyLayer", "Profiler", "Roofline", "measure_roofline",
    "compare", "Comparison", "presets", "compat", "MemoryTotals", "LatencyTotals",
    "AnalyzeOptions", "MemoryOptions", "ProfileOptions",
]
