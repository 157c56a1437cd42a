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
                  max_batch_size, memory, onnx_tile, parallel, partition, profile)
from .costs import CostOptions
from .costs.gpus import GPU, GPUS, gpu
from .options import AnalyzeOptions, MemoryOptions, OnnxOptions, ParallelOptions, ProfileOptions, TileOptions
from .planning.config import ParallelConfig, PartitionOptions
from .errors import ForwardError, InputError, LayerscopeError, PlanError, RegistryError, SpecError
from .planning.split import SplitUnits, Unit
from .reports.plan import Stage, StagePlan
from .reports.memory import CallMemory, MemoryLayer, MemoryReport, MemoryTotals, StepMemory
from .reports.latency import LatencyLayer, LatencyReport, LatencyTotals
from .reports.compare import Comparison, compare
from .reports.parallel import ParallelReport
from .reports.summary import Report
# the reports' views draw through render's functions, which importing render registers
# (reports.base.RENDERERS): imported here, before any report can reach a user
from . import render as _render  # noqa: F401
from .profiler import Profiler
from .analyses.roofline import Roofline, measure_roofline
from .specs import presets
from . import compat   # front ends with other tools' names (torchinfo, torchscan, deepspeed, modelsummary)
from .compat.torchinfo import layerscope_summary as summary
from .trace import (Costs, Coverage, LayerRecord, OpEvent, ParamSpec, ReceptiveField, TensorSpec, Totals,
                    Trace)

from ._version import __version__

__all__ = [   # sorted (tests/test_public_api.py)
    "AnalyzeOptions", "BatchFit", "CallMemory", "Comparison", "CostOptions", "Costs", "Coverage",
    "ForwardError", "GPU", "GPUS", "InputError", "LatencyLayer", "LatencyReport", "LatencyTotals", "LayerRecord",
    "LayerscopeError", "MemoryLayer", "MemoryOptions", "MemoryReport", "MemoryTotals", "OnnxOptions",
    "OpEvent", "ParallelConfig", "ParallelOptions", "ParallelReport", "ParamSpec", "PartitionOptions", "PlanError", "ProfileOptions", "Profiler", "ReceptiveField",
    "RegistryError", "Report", "Roofline", "SpecError", "SplitUnits", "Stage", "StagePlan", "StepMemory", "TensorSpec",
    "TileOptions", "Totals", "Trace", "Unit", "__version__", "activations", "analyze", "analyze_exported",
    "analyze_onnx", "analyze_torchscript", "compare", "compat", "gpu", "max_batch_size", "measure_roofline", "memory",
    "onnx_tile", "parallel", "partition", "presets", "profile", "summary",
]
