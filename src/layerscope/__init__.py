"""layerscope: what is inside any PyTorch model, layer by layer, with numbers you can trust."""

from .api import (BatchFit, activations, analyze, analyze_exported, analyze_onnx, analyze_torchscript, max_batch_size, memory,
                  onnx_tile, partition, profile, summary)
from .costs import CostOptions
from .errors import ForwardError, InputError, LayerscopeError, PlanError, RegistryError, SpecError
from .pipeline import SplitUnits, Stage, StagePlan, Unit
from .memory_report import CallMemory, MemoryLayer, MemoryReport, StepMemory
from .latency_report import LatencyLayer, LatencyReport
from .profiler import Profiler
from .analyses.roofline import Roofline, measure_roofline
from .report import Report
from .compare import Comparison, compare
from .specs import presets
from . import compat   # front ends with other tools' names (torchinfo, torchscan, deepspeed, modelsummary)
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
    "compare", "Comparison", "presets", "compat",
]
